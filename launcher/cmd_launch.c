/* cmd_launch.c — `plait launch`: what a Slurm task (`srun plait launch`) or a
 * pod runs. In a Slurm task the env contract is already set by the SPANK
 * plugin: this binds the process to its CPUs, makes the run directory and
 * execs plait-train, deciding nothing about the layout. In a pod
 * (JOB_COMPLETION_INDEX set) the gang meets and places its ranks: pod.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/env.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "launcher/commands.h"
#include "launcher/pod.h"

const struct cli_command cmd_launch_cli = {
    .name = "launch",
    .operands = "",
    .summary = "run plait-train in a Slurm task or a pod",
    .description = "Runs in a task whose environment holds the plait env contract (sbatch\n"
                   "--train-plan=PLAN sets it through the SPANK plugin): binds the task to\n"
                   "PLAIT_CPUS, creates the run directory and execs plait-train.\n"
                   "In a Kubernetes pod (JOB_COMPLETION_INDEX and the PLAIT_K8S_* variables that\n"
                   "plait k8s render writes): meets the other pods at pod 0's store, places the\n"
                   "job's ranks on every pod's topology and runs this pod's ranks.",
    .epilog = "exit codes: 0 done, 1 error, 75 preempted after a checkpoint, 76 (in a pod)\n"
              "restart the gang: a pod never came, a peer was lost or a rank failed",
    .options = (const struct cli_option[]){{0}},
};

int cmd_launch(int argc, char **argv)
{
    struct cli_args a;
    int parsed = cli_parse(&cmd_launch_cli, argc, argv, &a);
    if (parsed != CLI_CONTINUE) return parsed;
    cli_args_free(&a);
    if (pod_is_kubernetes()) return pod_launch();
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
    if (launcher_bind_cpus()) return PLAIT_EXIT_ERROR;
    setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
    /* --fresh belongs to `plait train`: exported into a job, it would wipe the
     * run at every requeue */
    unsetenv(PLAIT_ENV_FRESH);
    launcher_exec_runtime();
    return PLAIT_EXIT_ERROR;
}
