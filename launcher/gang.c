/* gang.c — a launcher's ranks on this machine (gang_run_ranks, for plait train
 * and plait launch in a pod): one process per rank with its env contract and
 * CPUs, signals passed on, a failure ending the others, one exit code; and
 * plait train's whole gang, its store in a thread of this process, supervised:
 * a lost rank restarts the whole gang from the newest checkpoint. What the
 * ranks do together is the runtime's. */
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

#include "common/place/env.h"
#include "common/log.h"
#include "common/place/place.h"
#include "common/store/store.h"
#include "common/place/topo.h"
#include "launcher/commands.h"
#include "launcher/plan_fit.h" // defines: fit_node_here

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
};

static const int passed_on[4] = {SIGINT, SIGTERM, SIGUSR1, SIGHUP};

/* Rank r's place as "NAME=value" strings (place_env_free frees them). One
 * rank alone is 1 × 1 × 1, unplaced and unbound: the runtime chooses its
 * device from the plan (plait train sets PLAIT_DEVICE "cpu" when the plan
 * says so), and needs no store. */
static char **rank_env(const struct gang *g, int r)
{
    if (g->world > 1) return place_rank_env(&g->map, &g->node, r);
    static const char *const one[] = {PLAIT_ENV_RANK "=0",       PLAIT_ENV_WORLD_SIZE "=1",
                                      PLAIT_ENV_TP "=1",         PLAIT_ENV_PP "=1",
                                      PLAIT_ENV_DP "=1",         PLAIT_ENV_TP_RANK "=0",
                                      PLAIT_ENV_PP_RANK "=0",    PLAIT_ENV_DP_RANK "=0",
                                      PLAIT_ENV_LOCAL_RANK "=0", PLAIT_ENV_LOCAL_WORLD_SIZE "=1",
                                      PLAIT_ENV_NODE_RANK "=0",  PLAIT_ENV_NODES "=1"};
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
static void exec_rank(const struct gang_ranks *g, int r, pid_t launcher)
{
    /* a launcher killed by SIGKILL cannot stop its ranks: the kernel does,
     * so their locks go and the same command can resume the run */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != launcher) _exit(PLAIT_EXIT_ERROR);
    for (char *const *e = g->envs[r]; *e; e++) {
        char *eq = strchr(*e, '=');
        *eq = '\0';
        setenv(*e, eq + 1, 1);
    }
    if (g->store_addr && *g->store_addr) {
        setenv(PLAIT_ENV_STORE_ADDR, g->store_addr, 1);
        setenv(PLAIT_ENV_STORE_SECRET, g->secret, 1);
    }
    char n[16];
    if (g->restart_count >= 0) {
        snprintf(n, sizeof n, "%d", g->restart_count);
        setenv(PLAIT_ENV_RESTART_COUNT, n, 1);
    }
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

static void signal_all(const pid_t *pids, int n, int sig)
{
    for (int r = 0; r < n; r++)
        if (pids[r] > 0) kill(pids[r], sig);
}

/* The ranks running, as gang_run_ranks waits for them. */
struct watch {
    const struct gang_ranks *g;
    struct gang_outcome *out;
    pid_t *pids; /* 0: ended (or never started) */
    int alive, code;
    double kill_at;          /* when the ranks still running get SIGKILL; 0: not set */
    bool terminated, killed; /* SIGTERM (SIGKILL) sent by us */
    unsigned passed;         /* the signals passed on from outside, as bits */
};

/* Forks rank r for each r, in its own process group, until one cannot be
 * started (that failure in w->out). */
static void start_ranks(struct watch *w, const struct sigaction *old)
{
    const struct gang_ranks *g = w->g;
    pid_t launcher = getpid();
    fflush(NULL);
    for (int r = 0; r < g->n; r++) {
        pid_t pid = fork();
        if (pid == 0) {
            /* its own process group: a terminal's Ctrl-C reaches only the
             * launcher, which passes it on once to every rank (a rank that got
             * it twice would take it for the second Ctrl-C and stop at once) */
            setpgid(0, 0);
            for (int i = 0; i < 4; i++) sigaction(passed_on[i], &old[i], NULL);
            exec_rank(g, r, launcher);
        }
        if (pid < 0) {
            log_error("cannot start rank %d: %s", g->global_rank[r], strerror(errno));
            if (w->out->failed_rank < 0 && g->failed) {
                char how[96];
                snprintf(how, sizeof how, "rank %d could not be started", g->global_rank[r]);
                g->failed(g->ctx, how);
            }
            w->out->failed_rank = g->global_rank[r];
            w->out->error = true;
            w->out->error_code = PLAIT_EXIT_ERROR;
            break;
        }
        w->pids[r] = pid;
        w->alive++;
    }
}

/* Ends the ranks: SIGTERM now, SIGKILL after the grace. */
static void stop_ranks(struct watch *w)
{
    w->terminated = true;
    w->kill_at = now_s() + w->g->grace_s;
    signal_all(w->pids, w->g->n, SIGTERM);
}

/* Rank r (pid) ended with status: its failure, the gang's code. */
static void rank_ended(struct watch *w, int r, pid_t pid, int status)
{
    const struct gang_ranks *g = w->g;
    struct gang_outcome *out = w->out;
    w->pids[r] = 0;
    w->alive--;
    unsigned ours = (w->terminated ? 1u << SIGTERM : 0) | (w->killed ? 1u << SIGKILL : 0);
    char how[sizeof out->lost_how];
    int rank_code;
    enum gang_end end = gang_end_of(status, ours, w->passed, g->global_rank[r], (int)pid,
                                    &rank_code, how, sizeof how);
    if (end == GANG_END_LOST || end == GANG_END_ERROR) {
        if (out->failed_rank < 0 && !out->stopped) {
            /* (a lone rank that exits non-zero has said why; it needs no more) */
            if (g->n > 1 || WIFSIGNALED(status))
                log_error("%s%s", how, g->n > 1 ? "; stopping the other ranks" : "");
            out->failed_rank = g->global_rank[r];
            if (g->failed) g->failed(g->ctx, how);
        }
        if (end == GANG_END_LOST && out->lost_rank < 0) {
            out->lost_rank = g->global_rank[r];
            memcpy(out->lost_how, how, sizeof how);
        }
        if (end == GANG_END_ERROR && !out->error) {
            out->error = true;
            out->error_code = rank_code;
        }
        if (!w->terminated) stop_ranks(w);
    }
    if (end != GANG_END_OURS) merge_status(&w->code, rank_code);
}

/* Waits for the ranks; a failure ends the others within the grace. */
static void wait_ranks(struct watch *w)
{
    const struct gang_ranks *g = w->g;
    while (w->alive > 0) {
        if (pending_signal) {
            int sig = pending_signal;
            pending_signal = 0;
            w->out->outside = true;
            w->passed |= 1u << sig;
            signal_all(w->pids, g->n, sig);
        }
        if (w->kill_at > 0 && now_s() > w->kill_at) {
            signal_all(w->pids, g->n, SIGKILL);
            w->killed = true;
            w->kill_at = 0;
        }
        int status;
        bool watch = w->kill_at > 0 || (g->poll && !w->terminated);
        pid_t pid = waitpid(-1, &status, watch ? WNOHANG : 0);
        if (pid == 0 || (pid < 0 && errno == EINTR)) {
            /* nothing (more) ended here: only now ask about the peers, so that a rank of ours
             * that died is named as the failure rather than the abort its peers then sent */
            if (pid == 0 && !w->terminated && g->poll && g->poll(g->ctx)) {
                w->out->stopped = true;
                stop_ranks(w);
                continue;
            }
            if (pid == 0) usleep(50 * 1000);
            continue;
        }
        if (pid < 0) break;
        int r = 0;
        while (r < g->n && w->pids[r] != pid) r++;
        if (r == g->n) continue; /* not ours (a pod's launcher reaps orphans as process 1) */
        rank_ended(w, r, pid, status);
    }
}

void gang_run_ranks(const struct gang_ranks *g, struct gang_outcome *out)
{
    *out = (struct gang_outcome){.code = PLAIT_EXIT_OK, .failed_rank = -1, .lost_rank = -1};
    struct watch w = {.g = g, .out = out, .pids = calloc((size_t)g->n, sizeof *w.pids)};
    if (!w.pids) {
        log_error("out of memory starting %d ranks", g->n);
        out->code = PLAIT_EXIT_ERROR;
        out->error = true;
        return;
    }
    struct sigaction sa = {.sa_handler = on_signal}, old[4];
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < 4; i++) { /* what is ignored (nohup) stays ignored */
        sigaction(passed_on[i], &sa, &old[i]);
        if (old[i].sa_handler == SIG_IGN) sigaction(passed_on[i], &old[i], NULL);
    }
    start_ranks(&w, old);
    w.code = w.alive == g->n ? PLAIT_EXIT_OK : PLAIT_EXIT_ERROR;
    if (w.alive != g->n) stop_ranks(&w);
    wait_ranks(&w);
    for (int i = 0; i < 4; i++) sigaction(passed_on[i], &old[i], NULL);
    free(w.pids);
    /* a rank's own failure says more than its peers' losing it (they may end first) */
    out->code = out->error ? out->error_code : w.code;
}

/* ---- plait train's gang --------------------------------------------------- */

/* Tells the ranks still running that the gang is over, through the store,
 * so that one waiting for the lost rank (to join, in a collective) fails at
 * once rather than at its deadline: gang_ranks' failed. */
struct store_at {
    const struct gang *g;
    int port;
};

static void abort_gang(void *ctx, const char *how)
{
    const struct store_at *at = ctx;
    struct store *st = NULL;
    struct plait_error err;
    if (store_connect(&st, "127.0.0.1", at->port, at->g->secret, -1, 5, &err) ||
        store_abort(st, how, &err))
        log_warn("cannot tell the ranks through the store: %s", err.text);
    store_close(st);
}

/* Starts the store and every rank with this restart count and waits for them
 * all. 0 with *out, or -1 with err when the store could not start. */
static int run_once(struct gang *g, int restart_count, struct gang_outcome *out,
                    struct plait_error *err)
{
    int world = g->world, rc = -1;
    struct store_server *srv = NULL;
    char addr[64] = "";
    char ***envs = calloc((size_t)world, sizeof *envs);
    int *ranks = calloc((size_t)world, sizeof *ranks);
    if (!envs || !ranks) {
        error_set(err, "out of memory starting %d ranks", world);
        goto out;
    }
    /* a store per start: the last one may hold the abort of the lost rank */
    if (world > 1 &&
        (store_server_start(&srv, "127.0.0.1", 0, g->secret, err) ||
         store_addr_format(addr, sizeof addr, "127.0.0.1", store_server_port(srv), err)))
        goto out;
    for (int r = 0; r < world; r++) {
        ranks[r] = r;
        if (!(envs[r] = rank_env(g, r))) {
            error_set(err, "out of memory starting rank %d", r);
            goto out;
        }
    }
    struct store_at at = {g, srv ? store_server_port(srv) : 0};
    struct gang_ranks procs = {.n = world,
                               .envs = envs,
                               .global_rank = ranks,
                               .store_addr = addr,
                               .secret = g->secret,
                               .restart_count = restart_count,
                               .threads = g->threads,
                               .grace_s = g->spec->timeout_s + 5,
                               .failed = srv ? abort_gang : NULL,
                               .ctx = &at};
    gang_run_ranks(&procs, out);
    rc = 0;
out:
    for (int r = 0; envs && r < world; r++) place_env_free(envs[r]);
    free(envs);
    free(ranks);
    store_server_stop(srv);
    return rc;
}

/* Several ranks: each its place on this machine (its CPUs, its coordinates, a
 * GPU when the plan says "cuda", shared by PLAIT_RANKS_PER_GPU ranks), and the
 * job's secret. */
static int place(struct gang *g, const struct plan *plan, struct topo *topo, char *host,
                 size_t host_bytes, struct plait_error *err)
{
    const struct gang_spec *spec = g->spec;
    gethostname(host, host_bytes - 1);
    if (topo_load(topo, NULL, err) || fit_node_here(plan, g->world, topo, host, &g->node, err))
        return -1;
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
    struct gang g = {.spec = spec, .world = spec->tp * spec->cp * spec->pp * spec->dp};
    int rc = -1;
    struct topo topo = {0};
    char host[256] = "localhost";
    if (g.world > 1 && place(&g, plan, &topo, host, sizeof host, err)) goto out;
    const char *count = getenv(PLAIT_ENV_RESTART_COUNT);
    g.first_restart_count = count ? atoi(count) : 0;
    /* caught between starts too: a stop then is no cause to restart */
    struct sigaction sa = {.sa_handler = on_signal}, old[4];
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < 4; i++) { /* what is ignored (nohup) stays ignored */
        sigaction(passed_on[i], &sa, &old[i]);
        if (old[i].sa_handler == SIG_IGN) sigaction(passed_on[i], &old[i], NULL);
    }
    int max = spec->max_restarts;
    for (int restarts = 0;; restarts++) {
        struct gang_outcome a;
        if (run_once(&g, g.first_restart_count + restarts, &a, err)) break;
        if (a.lost_rank < 0 || a.error || a.outside) {
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
    for (int i = 0; i < 4; i++) sigaction(passed_on[i], &old[i], NULL);
out:
    rank_map_free(&g.map);
    topo_free(&topo);
    return rc;
}
