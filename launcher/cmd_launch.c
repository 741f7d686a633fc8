/* cmd_launch.c — `plait launch`: what a Slurm task (`srun plait launch`) or a
 * pod runs. With a PLAN, one task per node of any Slurm step, no plugin
 * needed: slurm_nodes.c. Without, the env contract is already set by the SPANK
 * plugin: this binds the process to its CPUs, makes the run directory, and
 * runs plait-train as its child, supervised: when a rank of the step is lost,
 * every task restarts its rank together, through the step's store, up to
 * checkpoint.max_restarts times. It decides nothing about the layout. In a pod
 * (JOB_COMPLETION_INDEX set) the gang meets and places its ranks: pod.c. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/place/env.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/plan/plan.h"
#include "common/store/store.h"
#include "launcher/commands.h"
#include "launcher/gang.h"
#include "launcher/k8s/pod.h"
#include "launcher/restart.h"
#include "launcher/slurm_nodes.h"

enum { OPT_OUT };
const struct cli_command cmd_launch_cli = {
    .name = "launch",
    .operands = "[PLAN]",
    .max_operands = 1,
    .summary = "run plait-train in a Slurm task or a pod",
    .description = "With PLAN, in any Slurm allocation (no plugin needed): run as one task per\n"
                   "node (srun --ntasks-per-node=1 plait launch PLAN). Task 0 hosts the\n"
                   "rendezvous store on the first node of the step's node list (or\n"
                   "PLAIT_STORE_HOST) and publishes its port, with a secret it makes unless\n"
                   "PLAIT_STORE_SECRET is set, in a file of the run directory (0600; the\n"
                   "directory must be on a file system every node shares). Every task places\n"
                   "the plan's ranks on every node's topology and runs its node's: the plan's\n"
                   "tp x pp x dp shared by the nodes, or, with \"auto\" degrees, one rank per\n"
                   "GPU Slurm gave the task. A lost rank restarts every node's ranks together\n"
                   "from the newest complete checkpoint, up to checkpoint.max_restarts times.\n"
                   "Without PLAN, in a task whose environment holds the plait env contract\n"
                   "(sbatch --train-plan=PLAN sets it through the SPANK plugin, which adds the\n"
                   "site's policy and checks at submission): binds the task to PLAIT_CPUS,\n"
                   "creates the run directory and runs plait-train, one rank per task, with the\n"
                   "same restarts; a task that never reports (a node gone) ends the step with\n"
                   "76, for the batch script to requeue.\n"
                   "In a Kubernetes pod (JOB_COMPLETION_INDEX and the PLAIT_K8S_* variables that\n"
                   "plait k8s render writes): meets the other pods at pod 0's store, places the\n"
                   "job's ranks on every pod's topology and runs this pod's ranks.",
    .epilog = "exit codes: 0 done, 1 error, 75 preempted after a checkpoint, 76 restart the\n"
              "gang: restarts ran out, a task never reported, (in a pod) a pod never came,\n"
              "a peer was lost or a rank failed",
    .options =
        (const struct cli_option[]){
            [OPT_OUT] = {"--out", "DIR",
                         "with PLAN: the run directory (default $PLAIT_RUN_DIR, else\n"
                         "$SLURM_SUBMIT_DIR/runs/slurm-<job>, the same at every requeue)"},
            {0}},
};

static volatile sig_atomic_t signals_seen; /* bits: the stop signals this task got */

/* Slurm signals every process of the step, plait-train included: the
 * launcher only takes note (and passes on SIGTERM and SIGUSR1, which the
 * runtime takes twice as once, for a signal sent to this process alone). */
static void on_signal(int sig)
{
    signals_seen |= 1 << sig;
}

/* One start of this task's rank; its end, classified (gang.h). */
static enum gang_end run_rank(int rank, int restart_count, int *code, char *how, size_t how_bytes)
{
    pid_t launcher = getpid();
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != launcher) _exit(1);
        char n[16];
        snprintf(n, sizeof n, "%d", restart_count);
        setenv(PLAIT_ENV_RESTART_COUNT, n, 1);
        launcher_exec_runtime();
        _exit(PLAIT_EXIT_ERROR);
    }
    if (pid < 0) {
        *code = PLAIT_EXIT_ERROR;
        snprintf(how, how_bytes, "rank %d could not start: %s", rank, strerror(errno));
        return GANG_END_ERROR;
    }
    int status;
    unsigned passed = 0;
    for (;;) {
        unsigned seen = (unsigned)signals_seen;
        for (int sig = 1; sig < 32; sig++)
            if ((seen & 1u << sig) && !(passed & 1u << sig)) {
                passed |= 1u << sig;
                if (sig == SIGTERM || sig == SIGUSR1) kill(pid, sig);
            }
        pid_t w = waitpid(pid, &status, 0);
        if (w == pid) break;
        if (w < 0 && errno != EINTR) {
            *code = PLAIT_EXIT_ERROR;
            snprintf(how, how_bytes, "rank %d: waitpid: %s", rank, strerror(errno));
            return GANG_END_ERROR;
        }
    }
    return gang_end_of(status, 0, (unsigned)signals_seen, rank, (int)pid, code, how, how_bytes);
}

/* The stop signals, noted in signals_seen (what is ignored stays ignored). */
static void catch_stop_signals(void)
{
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    const int stops[4] = {SIGINT, SIGTERM, SIGUSR1, SIGHUP};
    for (int i = 0; i < 4; i++) {
        struct sigaction old;
        if (sigaction(stops[i], NULL, &old) == 0 && old.sa_handler != SIG_IGN)
            sigaction(stops[i], &sa, NULL);
    }
}

/* One start of this task's rank (restart_supervise's start). */
struct task {
    const struct env_rank *w;
};

static enum gang_end start_rank(void *ctx, int k, int *code, char *how, size_t how_bytes)
{
    const struct task *t = ctx;
    return run_rank(t->w->rank, t->w->restart_count + k, code, how, how_bytes);
}

/* The rank of this task, started again while the step's ranks are lost and
 * restarts are left (restart.h). Returns the task's exit code. */
static int supervise(const struct env_rank *w, const struct plan *plan)
{
    struct restart_member m = {.noun = "rank",
                               .index = w->rank,
                               .members = w->world};
    struct plait_error err;
    if (w->world > 1) {
        char host[256];
        int port;
        if (store_addr_parse(w->store_addr, host, sizeof host, &port, &err) ||
            store_connect(&m.st, host, port, w->store_secret, w->rank, plan->parallel.timeout_s,
                          &err)) {
            log_error("launch: rank %d: the step's store: %s", w->rank, err.text);
            return PLAIT_EXIT_ERROR;
        }
    }
    struct task t = {w};
    int code = restart_supervise(&m, plan, start_rank, &t, &signals_seen);
    store_close(m.st);
    return code;
}

int cmd_launch(int argc, char **argv)
{
    struct cli_args a;
    int parsed = cli_parse(&cmd_launch_cli, argc, argv, &a);
    if (parsed != CLI_CONTINUE) return parsed;
    const char *plan_arg = NULL, *out = NULL;
    for (int k = 0; k < a.n; k++) *(a.v[k].opt == OPT_OUT ? &out : &plan_arg) = a.v[k].value;
    if (pod_is_kubernetes()) {
        cli_args_free(&a);
        return pod_launch();
    }
    if (plan_arg) {
        int rc = getenv(PLAIT_ENV_RANK)
                     ? (log_error("launch: this task already has its plan and rank from the plait "
                                  "plugin (--train-plan): run plait launch without PLAN"),
                        PLAIT_EXIT_USAGE)
                     : (catch_stop_signals(), slurm_nodes_launch(plan_arg, out, &signals_seen));
        cli_args_free(&a);
        return rc;
    }
    if (out) {
        cli_args_free(&a);
        return cli_usage_error(&cmd_launch_cli, "--out goes with PLAN");
    }
    cli_args_free(&a);
    const char *run_dir = getenv(PLAIT_ENV_RUN_DIR);
    const char *plan_text = getenv(PLAIT_ENV_PLAN_JSON), *plan_path = getenv(PLAIT_ENV_PLAN);
    if (!run_dir || (!plan_path && !plan_text)) {
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
    /* what the runtime would refuse, it says itself: plait-train, unsupervised */
    struct env_rank where;
    struct plan *plan = NULL;
    if (env_rank_read(&where, &err) ||
        !(plan = plan_text ? plan_load_text(plan_text, PLAIT_ENV_PLAN_JSON, NULL, NULL, 0, &err)
                           : plan_load(plan_path, NULL, 0, &err))) {
        launcher_exec_runtime();
        return PLAIT_EXIT_ERROR;
    }
    catch_stop_signals();
    int rc = supervise(&where, plan);
    plan_free(plan);
    return rc;
}
