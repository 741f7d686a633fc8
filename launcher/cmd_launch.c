/* cmd_launch.c — `plait launch`: what a Slurm task (`srun plait launch`) or a
 * pod runs. The env contract is already set (by the SPANK plugin, or the pod
 * spec); this binds the process to its CPUs, makes the run directory and
 * execs plait-train. It decides nothing about the layout. */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/env.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "launcher/commands.h"

/* "0-13,112-125" → a CPU set; -1 when malformed. */
static int parse_cpus(const char *list, cpu_set_t *set, int *count)
{
    CPU_ZERO(set);
    *count = 0;
    for (const char *s = list; *s;) {
        char *end;
        long lo = strtol(s, &end, 10), hi = lo;
        if (end == s || lo < 0) return -1;
        if (*end == '-') {
            const char *h = end + 1;
            hi = strtol(h, &end, 10);
            if (end == h || hi < lo) return -1;
        }
        for (long c = lo; c <= hi && c < CPU_SETSIZE; c++, (*count)++) CPU_SET((int)c, set);
        if (*end == ',')
            end++;
        else if (*end)
            return -1;
        s = end;
    }
    return 0;
}

int cmd_launch(int argc, char **argv)
{
    if (argc > 0 && (!strcmp(argv[0], "--help") || !strcmp(argv[0], "-h"))) {
        printf(
            "usage: plait launch   (in a task whose environment holds the plait env contract;\n"
            "                      sbatch --train-plan=PLAN sets it through the SPANK plugin)\n");
        return PLAIT_EXIT_OK;
    }
    if (argc > 0) {
        log_error("launch: unexpected argument '%s'", argv[0]);
        return PLAIT_EXIT_USAGE;
    }
    const char *run_dir = getenv(PLAIT_ENV_RUN_DIR);
    if (!run_dir || (!getenv(PLAIT_ENV_PLAN) && !getenv(PLAIT_ENV_PLAN_JSON))) {
        log_error("launch: no plan in the environment (%s/%s, %s): submit with sbatch "
                  "--train-plan=PLAN, where the plait SPANK plugin sets them, or train on one "
                  "machine with plait train PLAN",
                  PLAIT_ENV_PLAN, PLAIT_ENV_PLAN_JSON, PLAIT_ENV_RUN_DIR);
        return PLAIT_EXIT_ERROR;
    }
    struct plait_error err;
    if (fs_mkdir_p(run_dir, &err)) {
        log_error("launch: %s", err.text);
        return PLAIT_EXIT_ERROR;
    }
    const char *cpus = getenv(PLAIT_ENV_CPUS);
    cpu_set_t set;
    int count;
    if (cpus && *cpus) {
        if (parse_cpus(cpus, &set, &count)) {
            log_error("launch: %s=%s is not a CPU list", PLAIT_ENV_CPUS, cpus);
            return PLAIT_EXIT_ERROR;
        }
        cpu_set_t got;
        if (sched_setaffinity(0, sizeof set, &set) == 0 &&
            sched_getaffinity(0, sizeof got, &got) == 0) {
            /* one thread per CPU of its own that this machine has */
            char n[16];
            snprintf(n, sizeof n, "%d", CPU_COUNT(&got));
            setenv("OMP_NUM_THREADS", n, 0);
        } else {
            log_warn("launch: cannot bind to CPUs %s (%s); running unbound", cpus, strerror(errno));
        }
    }
    setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
    /* --fresh belongs to `plait train`: exported into a job, it would wipe the
     * run at every requeue */
    unsetenv(PLAIT_ENV_FRESH);
    launcher_exec_runtime();
    return PLAIT_EXIT_ERROR;
}
