/* cmd_launch.c — `plait launch`: what a Slurm task (`srun plait launch`) or a
 * pod runs. In a Slurm task the env contract is already set by the SPANK
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
#include <time.h>
#include <unistd.h>

#include "common/place/env.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/plan/plan.h"
#include "common/store/store.h"
#include "launcher/commands.h"
#include "launcher/gang.h"
#include "launcher/k8s/pod.h"

const struct cli_command cmd_launch_cli = {
    .name = "launch",
    .operands = "",
    .summary = "run plait-train in a Slurm task or a pod",
    .description = "Runs in a task whose environment holds the plait env contract (sbatch\n"
                   "--train-plan=PLAN sets it through the SPANK plugin): binds the task to\n"
                   "PLAIT_CPUS, creates the run directory and runs plait-train. When a rank of\n"
                   "the step is lost (killed, or exiting 76), every task restarts its rank\n"
                   "together from the newest complete checkpoint, up to checkpoint.max_restarts\n"
                   "times; a task that never reports (a node gone) ends the step with 76, for\n"
                   "the batch script to requeue.\n"
                   "In a Kubernetes pod (JOB_COMPLETION_INDEX and the PLAIT_K8S_* variables that\n"
                   "plait k8s render writes): meets the other pods at pod 0's store, places the\n"
                   "job's ranks on every pod's topology and runs this pod's ranks.",
    .epilog = "exit codes: 0 done, 1 error, 75 preempted after a checkpoint, 76 restart the\n"
              "gang: restarts ran out, a task never reported, (in a pod) a pod never came,\n"
              "a peer was lost or a rank failed",
    .options = (const struct cli_option[]){{0}},
};

static volatile sig_atomic_t signals_seen; /* bits: the stop signals this task got */

/* Slurm signals every process of the step, plait-train included: the
 * launcher only takes note (and passes on SIGTERM and SIGUSR1, which the
 * runtime takes twice as once, for a signal sent to this process alone). */
static void on_signal(int sig)
{
    signals_seen |= 1 << sig;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
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

/* ---- the step's tasks agree, through its store ----------------------------------------- */

/* The store's keys under "launch/<attempt>/": "ended" counts the tasks whose
 * rank ended, "ends" lists them ("<rank> <class> <code>;"), "cleared" says
 * task 0 cleared the abort for the next start. Counters (store_add), which the
 * server answers even when the ranks aborted the store, read by polling. */
static int wait_count(struct store *st, const char *key, int64_t want, double deadline_s,
                      int64_t *got, struct plait_error *err)
{
    for (;;) {
        if (store_add(st, key, 0, got, err)) return -1;
        if (*got >= want) return 0;
        if (now_s() > deadline_s) return 1;
        usleep(50 * 1000);
    }
}

enum verdict { V_DONE, V_RESTART, V_FAILED, V_GONE };

/* Reports this task's end and learns every task's: V_RESTART when a rank
 * was lost and none failed by itself, V_FAILED when one did (*code: this
 * task's code, or 1 for another's failure), V_GONE when a task never
 * reported within the deadline (or the store is gone), else V_DONE. */
static enum verdict agree(struct store *st, const struct env_rank *w, int attempt,
                          enum gang_end end, int *code, double timeout_s, char *why,
                          size_t why_bytes)
{
    struct plait_error err;
    char key[64], line[48];
    snprintf(line, sizeof line, "%d %d %d;", w->rank, (int)end, *code);
    snprintf(key, sizeof key, "launch/%d/ends", attempt);
    int64_t ended = 0;
    if (store_append(st, key, line, strlen(line), NULL, &err)) goto gone;
    snprintf(key, sizeof key, "launch/%d/ended", attempt);
    if (store_add(st, key, 1, NULL, &err)) goto gone;
    int rc = wait_count(st, key, w->world, now_s() + timeout_s + 10, &ended, &err);
    if (rc < 0) goto gone;
    snprintf(key, sizeof key, "launch/%d/ends", attempt);
    void *text = NULL;
    size_t bytes;
    if (store_get(st, key, &text, &bytes, timeout_s, &err)) goto gone;
    bool lost = false, failed = false;
    int reported = 0;
    for (char *p = text; p && *p;) {
        int r, e, c, n = 0;
        if (sscanf(p, "%d %d %d;%n", &r, &e, &c, &n) != 3 || n == 0) break;
        reported++;
        lost |= e == GANG_END_LOST;
        if (e == GANG_END_ERROR || e == GANG_END_OUTSIDE) {
            if (!failed) snprintf(why, why_bytes, "rank %d ended with %d", r, c);
            failed = true;
        }
        p += n;
    }
    free(text);
    if (rc == 1) {
        snprintf(why, why_bytes,
                 "%d of %d tasks did not report the end of their rank within %.0f s",
                 w->world - reported, w->world, timeout_s + 10);
        return V_GONE;
    }
    if (failed) {
        if (end != GANG_END_ERROR && end != GANG_END_OUTSIDE) *code = PLAIT_EXIT_ERROR;
        return V_FAILED;
    }
    return lost ? V_RESTART : V_DONE;
gone:
    snprintf(why, why_bytes, "the step's store: %.900s", err.text);
    return V_GONE;
}

/* Task 0 clears the abort the lost start left in the store; the others wait
 * for it, so that no new rank sees it. 0, or -1 (said). */
static int clear_for_next(struct store *st, const struct env_rank *w, int attempt, double timeout_s)
{
    struct plait_error err;
    char key[64];
    snprintf(key, sizeof key, "launch/%d/cleared", attempt);
    int64_t got = 0;
    int rc = w->rank == 0 ? (store_abort_clear(st, &err) || store_add(st, key, 1, NULL, &err))
                          : wait_count(st, key, 1, now_s() + timeout_s + 10, &got, &err);
    if (rc < 0 || (rc && w->rank == 0)) {
        log_error("launch: rank %d: the step's store: %s", w->rank, err.text);
        return -1;
    }
    if (rc) {
        log_error("launch: rank %d: task 0 did not prepare the restart within %.0f s", w->rank,
                  timeout_s + 10);
        return -1;
    }
    return 0;
}

/* The rank of this task, started again while the step's ranks are lost and
 * restarts are left. Returns the task's exit code. */
static int supervise(const struct env_rank *w, const struct plan *plan)
{
    int max = plan->checkpoint.max_restarts;
    double timeout_s = plan->parallel.timeout_s;
    struct store *st = NULL;
    struct plait_error err;
    if (w->world > 1) {
        char host[256];
        int port;
        if (store_addr_parse(w->store_addr, host, sizeof host, &port, &err) ||
            store_connect(&st, host, port, w->store_secret, w->rank, timeout_s, &err)) {
            log_error("launch: rank %d: the step's store: %s", w->rank, err.text);
            return PLAIT_EXIT_ERROR;
        }
    }
    int code = PLAIT_EXIT_ERROR;
    for (int k = 0;; k++) {
        char how[160], why[sizeof err.text + 32] = "";
        enum gang_end end = run_rank(w->rank, w->restart_count + k, &code, how, sizeof how);
        enum verdict v = st ? agree(st, w, k, end, &code, timeout_s, why, sizeof why)
                         : end == GANG_END_LOST ? V_RESTART
                                                : V_DONE;
        if (end == GANG_END_LOST && code != PLAIT_EXIT_RESTART) /* killed: it said nothing */
            log_error("launch: %s", how);
        if (v == V_GONE) {
            log_error("launch: rank %d: %s: exit %d (requeue the job to resume from the newest "
                      "complete checkpoint)",
                      w->rank, why, PLAIT_EXIT_RESTART);
            code = PLAIT_EXIT_RESTART;
            break;
        }
        if (v == V_FAILED && end != GANG_END_ERROR)
            log_error("launch: rank %d: not restarting: %s", w->rank, why);
        if (v != V_RESTART) break;
        if (signals_seen || k >= max) {
            log_error("launch: rank %d: a rank of the step was lost%s; the step was restarted %d "
                      "time%s (checkpoint.max_restarts %d): exit %d",
                      w->rank, signals_seen ? ", then a stop signal came" : "", k,
                      k == 1 ? "" : "s", max, PLAIT_EXIT_RESTART);
            code = PLAIT_EXIT_RESTART;
            break;
        }
        if (w->rank == 0)
            log_warn("launch: a rank of the step was lost: restarting every rank from the newest "
                     "complete checkpoint (restart %d of %d, checkpoint.max_restarts)",
                     k + 1, max);
        if (st && clear_for_next(st, w, k, timeout_s)) {
            code = PLAIT_EXIT_RESTART;
            break;
        }
    }
    store_close(st);
    return code;
}

int cmd_launch(int argc, char **argv)
{
    struct cli_args a;
    int parsed = cli_parse(&cmd_launch_cli, argc, argv, &a);
    if (parsed != CLI_CONTINUE) return parsed;
    cli_args_free(&a);
    if (pod_is_kubernetes()) return pod_launch();
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
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    const int stops[4] = {SIGINT, SIGTERM, SIGUSR1, SIGHUP};
    for (int i = 0; i < 4; i++) {
        struct sigaction old;
        if (sigaction(stops[i], NULL, &old) == 0 && old.sa_handler != SIG_IGN)
            sigaction(stops[i], &sa, NULL);
    }
    int rc = supervise(&where, plan);
    plan_free(plan);
    return rc;
}
