/* gang.c — the ranks of one job on this machine (plait train): the
 * rendezvous store in a thread of this process, one process per rank with its
 * env contract and CPUs, signals passed on to every rank, the gang's exit
 * code, and supervision: a lost rank restarts the whole gang from the newest
 * checkpoint. What the ranks do together is the runtime's. */
#include "launcher/gang.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/env.h"
#include "common/log.h"
#include "common/place.h"
#include "common/store.h"
#include "common/topo.h"
#include "launcher/commands.h"

static volatile sig_atomic_t pending_signal;

static void on_signal(int sig)
{
    pending_signal = sig;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* What every start of the gang shares. */
struct gang {
    const struct gang_spec *spec;
    int world;
    struct rank_map map;
    struct place_node node;
    char secret[STORE_SECRET_HEX_BYTES];
    int threads; /* OMP_NUM_THREADS per rank, 0: the runtime's choice */
    int first_restart_count;
    struct sigaction old[4];
};

static const int passed_on[4] = {SIGINT, SIGTERM, SIGUSR1, SIGHUP};

/* How one start of the gang ended. */
struct attempt {
    int code;           /* a failing rank's first code, else 75 if any stopped, else 0 */
    int lost_rank;      /* the first rank lost (killed by a signal not ours, or exited 76), or -1 */
    char lost_how[128]; /* "rank 2 (pid 4711) was killed by signal 9" */
    bool error;         /* a rank failed by itself (any other code): no restart */
    bool stopped;       /* a signal from outside reached the gang: no restart */
};

/* Rank r's place as "NAME=value" strings (place_env_free frees them). One
 * rank alone is 1 × 1 × 1 on the CPU, unplaced and unbound: the runtime
 * chooses its device from the plan, and needs no store. */
static char **rank_env(const struct gang *g, int r)
{
    if (g->world > 1) return place_rank_env(&g->map, &g->node, r);
    static const char *const one[] = {PLAIT_ENV_RANK "=0",       PLAIT_ENV_WORLD_SIZE "=1",
                                      PLAIT_ENV_TP "=1",         PLAIT_ENV_PP "=1",
                                      PLAIT_ENV_DP "=1",         PLAIT_ENV_TP_RANK "=0",
                                      PLAIT_ENV_PP_RANK "=0",    PLAIT_ENV_DP_RANK "=0",
                                      PLAIT_ENV_LOCAL_RANK "=0", PLAIT_ENV_LOCAL_WORLD_SIZE "=1",
                                      PLAIT_ENV_NODE_RANK "=0",  PLAIT_ENV_NODES "=1",
                                      PLAIT_ENV_DEVICE "=cpu"};
    size_t n = sizeof one / sizeof *one;
    char **env = calloc(n + 1, sizeof *env);
    for (size_t k = 0; env && k < n; k++)
        if (!(env[k] = strdup(one[k]))) {
            place_env_free(env);
            return NULL;
        }
    return env;
}

/* In the child: dies with the launcher, its environment, its CPUs, then
 * plait-train. */
static void exec_rank(const struct gang *g, char **env, const char *addr, int restart_count,
                      pid_t launcher)
{
    /* a launcher killed by SIGKILL cannot stop its ranks: the kernel does,
     * so their locks go and the same command can resume the run */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != launcher) _exit(PLAIT_EXIT_ERROR);
    for (char **e = env; *e; e++) {
        char *eq = strchr(*e, '=');
        *eq = '\0';
        setenv(*e, eq + 1, 1);
    }
    if (*addr) {
        setenv(PLAIT_ENV_STORE_ADDR, addr, 1);
        setenv(PLAIT_ENV_STORE_SECRET, g->secret, 1);
    }
    char n[16];
    snprintf(n, sizeof n, "%d", restart_count);
    setenv(PLAIT_ENV_RESTART_COUNT, n, 1);
    if (g->threads > 0) {
        snprintf(n, sizeof n, "%d", g->threads);
        setenv("OMP_NUM_THREADS", n, 0);
    }
    if (launcher_bind_cpus() == 0) launcher_exec_runtime();
    _exit(PLAIT_EXIT_ERROR);
}

enum gang_end gang_end_of(int status, unsigned ours, unsigned outside, int rank, int pid, int *code,
                          char *how, size_t how_bytes)
{
    int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    *code = sig ? 128 + sig : WEXITSTATUS(status);
    snprintf(how, how_bytes, "rank %d (pid %d) %s %d", rank, pid,
             sig ? "was killed by signal" : "exited with", sig ? sig : *code);
    unsigned bit = sig > 0 && sig < 32 ? 1u << sig : 0;
    if (sig)
        return (ours & bit) ? GANG_END_OURS : (outside & bit) ? GANG_END_OUTSIDE : GANG_END_LOST;
    return *code == PLAIT_EXIT_OK          ? GANG_END_OK
           : *code == PLAIT_EXIT_PREEMPTED ? GANG_END_PREEMPTED
           : *code == PLAIT_EXIT_RESTART   ? GANG_END_LOST
                                           : GANG_END_ERROR;
}

/* What the gang as a whole exits with: a rank's failure over a stop (75) over
 * success; the first failure wins. */
static void merge_status(int *gang, int rank_code)
{
    bool failed = rank_code != PLAIT_EXIT_OK && rank_code != PLAIT_EXIT_PREEMPTED;
    bool gang_failed = *gang != PLAIT_EXIT_OK && *gang != PLAIT_EXIT_PREEMPTED;
    if (gang_failed) return;
    if (failed || rank_code == PLAIT_EXIT_PREEMPTED) *gang = rank_code;
}

/* Tells the ranks still running that the gang is over, through the store,
 * so that one waiting for the lost rank (to join, in a collective) fails at
 * once rather than at its deadline. */
static void abort_gang(const struct gang *g, int port, const char *reason)
{
    struct store *st = NULL;
    struct plait_error err;
    if (store_connect(&st, "127.0.0.1", port, g->secret, -1, 5, &err) ||
        store_abort(st, reason, &err))
        log_warn("cannot tell the ranks through the store: %s", err.text);
    store_close(st);
}

static void signal_all(const pid_t *pids, int world, int sig)
{
    for (int r = 0; r < world; r++)
        if (pids[r] > 0) kill(pids[r], sig);
}

/* Starts the store and every rank with this restart count and waits for them
 * all. 0 with *a, or -1 with err when the store could not start. */
static int run_once(struct gang *g, int restart_count, pid_t *pids, struct attempt *a,
                    struct plait_error *err)
{
    int world = g->world, alive = 0;
    struct store_server *srv = NULL;
    char addr[64] = "";
    *a = (struct attempt){.lost_rank = -1};
    /* a store per start: the last one may hold the abort of the lost rank */
    if (world > 1 &&
        (store_server_start(&srv, "127.0.0.1", 0, g->secret, err) ||
         store_addr_format(addr, sizeof addr, "127.0.0.1", store_server_port(srv), err))) {
        store_server_stop(srv);
        return -1;
    }
    pid_t launcher = getpid();
    fflush(NULL);
    for (int r = 0; r < world; r++) {
        pids[r] = 0;
        char **env = rank_env(g, r);
        if (!env) {
            log_error("out of memory starting rank %d", r);
            break;
        }
        pid_t pid = fork();
        if (pid == 0) {
            /* its own process group: a terminal's Ctrl-C reaches only the
             * launcher, which passes it on once to every rank (a rank that got
             * it twice would take it for the second Ctrl-C and stop at once) */
            setpgid(0, 0);
            for (int i = 0; i < 4; i++) sigaction(passed_on[i], &g->old[i], NULL);
            exec_rank(g, env, addr, restart_count, launcher);
        }
        place_env_free(env);
        if (pid < 0) {
            log_error("cannot start rank %d: %s", r, strerror(errno));
            break;
        }
        pids[r] = pid;
        alive++;
    }
    /* wait for the gang; a failed rank ends the others within the deadline */
    a->code = alive == world ? PLAIT_EXIT_OK : PLAIT_EXIT_ERROR;
    a->error = alive != world;
    double kill_at = alive == world ? 0 : now_s() + g->spec->timeout_s + 5;
    bool terminated = alive != world, killed = false;
    unsigned passed = 0; /* the signals passed on from outside, as bits */
    if (terminated) signal_all(pids, world, SIGTERM);
    while (alive > 0) {
        if (pending_signal) {
            int sig = pending_signal;
            pending_signal = 0;
            a->stopped = true;
            passed |= 1u << sig;
            signal_all(pids, world, sig);
        }
        if (kill_at > 0 && now_s() > kill_at) {
            signal_all(pids, world, SIGKILL);
            killed = true;
            kill_at = 0;
        }
        int status;
        pid_t pid = waitpid(-1, &status, kill_at > 0 ? WNOHANG : 0);
        if (pid == 0 || (pid < 0 && errno == EINTR)) {
            if (pid == 0) usleep(50 * 1000);
            continue;
        }
        if (pid < 0) break;
        int r = 0;
        while (r < world && pids[r] != pid) r++;
        if (r == world) continue;
        pids[r] = 0;
        alive--;
        unsigned ours = (terminated ? 1u << SIGTERM : 0) | (killed ? 1u << SIGKILL : 0);
        char how[sizeof a->lost_how];
        int code;
        enum gang_end end = gang_end_of(status, ours, passed, r, (int)pid, &code, how, sizeof how);
        if (end == GANG_END_LOST || end == GANG_END_ERROR) {
            /* (a rank that exits non-zero has said why; alone, it needs no more) */
            if (a->lost_rank < 0 && !a->error && (world > 1 || WIFSIGNALED(status)))
                log_error("%s%s", how, world > 1 ? "; stopping the other ranks" : "");
            if (end == GANG_END_LOST && a->lost_rank < 0) {
                a->lost_rank = r;
                memcpy(a->lost_how, how, sizeof how);
            }
            if (end == GANG_END_ERROR) a->error = true;
            if (!terminated) {
                if (srv) abort_gang(g, store_server_port(srv), how);
                terminated = true;
                kill_at = now_s() + g->spec->timeout_s + 5;
                signal_all(pids, world, SIGTERM);
            }
        }
        if (end != GANG_END_OURS) merge_status(&a->code, code);
    }
    store_server_stop(srv);
    return 0;
}

/* Several ranks: each its place on this machine (its CPUs, its coordinates),
 * and the job's secret. */
static int place(struct gang *g, const struct plan *plan, struct topo *topo, char *host,
                 size_t host_bytes, struct plait_error *err)
{
    const struct gang_spec *spec = g->spec;
    gethostname(host, host_bytes - 1);
    if (topo_load(topo, NULL, err)) return -1;
    g->node = (struct place_node){.name = host, .topo = topo, .slots = g->world, .cpu_ranks = true};
    struct place_bandwidth bw = {.pcie_gbps = 25, .network_gbps = 50, .memory_gbps = 100};
    if (place_ranks(plan, spec->tp, spec->pp, spec->dp, &g->node, 1, &bw, &g->map, err) ||
        store_secret_generate(g->secret, err))
        return -1;
    char shared[256];
    place_shared_cores_text(&g->map, &g->node, shared, sizeof shared);
    if (*shared) log_warn("%s", shared);
    /* more ranks than cores: they share them, one thread each */
    g->threads = topo->n_cores > 0 && g->world >= topo->n_cores ? 1 : 0;
    return 0;
}

int gang_run_local(const struct plan *plan, const struct gang_spec *spec, struct plait_error *err)
{
    struct gang g = {.spec = spec, .world = spec->tp * spec->pp * spec->dp};
    int rc = -1;
    struct topo topo = {0};
    pid_t *pids = calloc((size_t)g.world, sizeof *pids);
    char host[256] = "localhost";
    if (!pids) return error_set(err, "out of memory");
    if (g.world > 1 && place(&g, plan, &topo, host, sizeof host, err)) goto out;
    const char *count = getenv(PLAIT_ENV_RESTART_COUNT);
    g.first_restart_count = count ? atoi(count) : 0;
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < 4; i++) { /* what is ignored (nohup) stays ignored */
        sigaction(passed_on[i], &sa, &g.old[i]);
        if (g.old[i].sa_handler == SIG_IGN) sigaction(passed_on[i], &g.old[i], NULL);
    }
    int max = spec->max_restarts;
    for (int restarts = 0;; restarts++) {
        struct attempt a;
        if (run_once(&g, g.first_restart_count + restarts, pids, &a, err)) break;
        if (a.lost_rank < 0 || a.error || a.stopped) {
            rc = a.code;
            break;
        }
        if (restarts < max && !pending_signal) {
            log_warn("%s: restarting the gang from the newest complete checkpoint (restart %d "
                     "of %d, checkpoint.max_restarts)",
                     a.lost_how, restarts + 1, max);
            continue;
        }
        log_error("%s%s; the gang was restarted %d time%s (checkpoint.max_restarts %d): exit %d; "
                  "run the same command again to resume from the newest complete checkpoint",
                  a.lost_how, pending_signal ? ", then a stop signal came" : "", restarts,
                  restarts == 1 ? "" : "s", max, PLAIT_EXIT_RESTART);
        rc = PLAIT_EXIT_RESTART;
        break;
    }
    for (int i = 0; i < 4; i++) sigaction(passed_on[i], &g.old[i], NULL);
out:
    rank_map_free(&g.map);
    topo_free(&topo);
    free(pids);
    return rc;
}
