/* gang.c — a launcher's ranks on this machine (gang_run_ranks, for plait train
 * and plait launch in a pod): one process per rank with its env contract and
 * CPUs, signals passed on, a failure ending the others, one exit code; and
 * plait train's whole gang, its store in a thread of this process. What the
 * ranks do together is the runtime's. */
#include "launcher/gang.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

/* In the child: the rank's environment, its CPUs, then plait-train. */
static void exec_rank(char **env, const char *addr, const char *secret, int threads)
{
    for (char **e = env; *e; e++) {
        char *eq = strchr(*e, '=');
        *eq = '\0';
        setenv(*e, eq + 1, 1);
    }
    setenv(PLAIT_ENV_STORE_ADDR, addr, 1);
    setenv(PLAIT_ENV_STORE_SECRET, secret, 1);
    if (threads > 0) {
        char n[16];
        snprintf(n, sizeof n, "%d", threads);
        setenv("OMP_NUM_THREADS", n, 0);
    }
    if (launcher_bind_cpus() == 0) launcher_exec_runtime();
    _exit(PLAIT_EXIT_ERROR);
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

static void describe_failure(const struct gang_ranks *g, int r, pid_t pid, int status)
{
    log_error("rank %d (pid %d) %s %d; stopping the other ranks", g->global_rank[r], (int)pid,
              WIFEXITED(status) ? "exited with" : "was killed by signal",
              WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
}

void gang_run_ranks(const struct gang_ranks *g, struct gang_outcome *out)
{
    *out = (struct gang_outcome){.code = PLAIT_EXIT_OK, .failed_rank = -1};
    int n = g->n, alive = 0;
    pid_t *pids = calloc((size_t)n, sizeof *pids);
    if (!pids) {
        log_error("out of memory starting %d ranks", n);
        out->code = PLAIT_EXIT_ERROR;
        return;
    }
    struct sigaction sa = {.sa_handler = on_signal}, old[4];
    const int sigs[4] = {SIGINT, SIGTERM, SIGUSR1, SIGHUP};
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < 4; i++) { /* what is ignored (nohup) stays ignored */
        sigaction(sigs[i], &sa, &old[i]);
        if (old[i].sa_handler == SIG_IGN) sigaction(sigs[i], &old[i], NULL);
    }
    fflush(NULL);
    for (int r = 0; r < n; r++) {
        pid_t pid = fork();
        if (pid == 0) {
            /* its own process group: a terminal's Ctrl-C reaches only the
             * launcher, which passes it on once to every rank (a rank that got
             * it twice would take it for the second Ctrl-C and stop at once) */
            setpgid(0, 0);
            for (int i = 0; i < 4; i++) sigaction(sigs[i], &old[i], NULL);
            exec_rank(g->envs[r], g->store_addr, g->secret, g->threads);
        }
        if (pid < 0) {
            log_error("cannot start rank %d: %s", g->global_rank[r], strerror(errno));
            if (out->failed_rank < 0 && g->failed) g->failed(g->ctx, g->global_rank[r], true, 1);
            out->failed_rank = g->global_rank[r];
            break;
        }
        pids[r] = pid;
        alive++;
    }
    /* wait for the ranks; a failure ends the others within the grace */
    int code = alive == n ? PLAIT_EXIT_OK : PLAIT_EXIT_ERROR;
    double kill_at = alive == n ? 0 : now_s() + g->grace_s;
    bool terminated = alive != n;
    if (terminated)
        for (int r = 0; r < n; r++)
            if (pids[r] > 0) kill(pids[r], SIGTERM);
    while (alive > 0) {
        if (pending_signal) {
            int sig = pending_signal;
            pending_signal = 0;
            for (int r = 0; r < n; r++)
                if (pids[r] > 0) kill(pids[r], sig);
        }
        if (kill_at > 0 && now_s() > kill_at) {
            for (int r = 0; r < n; r++)
                if (pids[r] > 0) kill(pids[r], SIGKILL);
            kill_at = 0;
        }
        int status;
        bool watch = kill_at > 0 || (g->poll && !terminated);
        pid_t pid = waitpid(-1, &status, watch ? WNOHANG : 0);
        if (pid == 0 || (pid < 0 && errno == EINTR)) {
            /* nothing (more) ended here: only now ask about the peers, so that a rank of ours
             * that died is named as the failure rather than the abort its peers then sent */
            if (pid == 0 && !terminated && g->poll && g->poll(g->ctx)) {
                out->stopped = true;
                terminated = true;
                kill_at = now_s() + g->grace_s;
                for (int r = 0; r < n; r++)
                    if (pids[r] > 0) kill(pids[r], SIGTERM);
                continue;
            }
            if (pid == 0) usleep(50 * 1000);
            continue;
        }
        if (pid < 0) break;
        int r = 0;
        while (r < n && pids[r] != pid) r++;
        if (r == n) continue; /* not ours (a pod's launcher reaps orphans as process 1) */
        pids[r] = 0;
        alive--;
        int rank_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (rank_code != PLAIT_EXIT_OK && rank_code != PLAIT_EXIT_PREEMPTED) {
            if (out->failed_rank < 0 && !out->stopped) {
                describe_failure(g, r, pid, status);
                out->failed_rank = g->global_rank[r];
                if (g->failed)
                    g->failed(g->ctx, g->global_rank[r], WIFEXITED(status),
                              WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
            }
            if (!terminated) {
                terminated = true;
                kill_at = now_s() + g->grace_s;
                for (int q = 0; q < n; q++)
                    if (pids[q] > 0) kill(pids[q], SIGTERM);
            }
        }
        if (!terminated || rank_code != 128 + SIGTERM) merge_status(&code, rank_code);
    }
    for (int i = 0; i < 4; i++) sigaction(sigs[i], &old[i], NULL);
    free(pids);
    out->code = code;
}

int gang_run_local(const struct plan *plan, const struct gang_spec *g, struct plait_error *err)
{
    int world = g->tp * g->pp * g->dp, rc = -1;
    struct topo topo = {0};
    struct rank_map map = {0};
    struct store_server *srv = NULL;
    char ***envs = calloc((size_t)world, sizeof *envs);
    int *ranks = calloc((size_t)world, sizeof *ranks);
    char host[256] = "localhost", secret[STORE_SECRET_HEX_BYTES], addr[64];
    if (!envs || !ranks) {
        error_set(err, "out of memory starting %d ranks", world);
        goto out;
    }
    gethostname(host, sizeof host - 1);
    if (topo_load(&topo, NULL, err)) goto out;
    struct place_node node = {.name = host, .topo = &topo, .slots = world, .cpu_ranks = true};
    struct place_bandwidth bw = {.pcie_gbps = 25, .network_gbps = 50, .memory_gbps = 100};
    if (place_ranks(plan, g->tp, g->pp, g->dp, &node, 1, &bw, &map, err) ||
        store_secret_generate(secret, err) ||
        store_server_start(&srv, "127.0.0.1", 0, secret, err) ||
        store_addr_format(addr, sizeof addr, "127.0.0.1", store_server_port(srv), err))
        goto out;
    char shared[256];
    place_shared_cores_text(&map, &node, shared, sizeof shared);
    if (*shared) log_warn("%s", shared);
    for (int r = 0; r < world; r++) {
        ranks[r] = r;
        if (!(envs[r] = place_rank_env(&map, &node, r))) {
            error_set(err, "out of memory starting rank %d", r);
            goto out;
        }
    }
    /* more ranks than cores: they share them, one thread each */
    struct gang_ranks procs = {.n = world,
                               .envs = envs,
                               .global_rank = ranks,
                               .store_addr = addr,
                               .secret = secret,
                               .threads = topo.n_cores > 0 && world >= topo.n_cores ? 1 : 0,
                               .grace_s = g->timeout_s + 5};
    struct gang_outcome outcome;
    gang_run_ranks(&procs, &outcome);
    rc = outcome.code;
out:
    for (int r = 0; envs && r < world; r++) place_env_free(envs[r]);
    free(envs);
    free(ranks);
    store_server_stop(srv);
    rank_map_free(&map);
    topo_free(&topo);
    return rc;
}
