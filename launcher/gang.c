/* gang.c — the ranks of one job on this machine (plait train with more than
 * one rank): the rendezvous store in a thread of this process, one process
 * per rank with its env contract and CPUs, signals passed on to every rank,
 * and the gang's exit code. What the ranks do together is the runtime's. */
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

int gang_run_local(const struct plan *plan, const struct gang_spec *g, struct plait_error *err)
{
    int world = g->tp * g->pp * g->dp, rc = -1, alive = 0;
    struct topo topo = {0};
    struct rank_map map = {0};
    struct store_server *srv = NULL;
    pid_t *pids = calloc((size_t)world, sizeof *pids);
    char host[256] = "localhost", secret[STORE_SECRET_HEX_BYTES], addr[64];
    if (!pids) return error_set(err, "out of memory");
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
    /* more ranks than cores: they share them, one thread each */
    int threads = topo.n_cores > 0 && world >= topo.n_cores ? 1 : 0;
    struct sigaction sa = {.sa_handler = on_signal}, old[4];
    const int sigs[4] = {SIGINT, SIGTERM, SIGUSR1, SIGHUP};
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < 4; i++) { /* what is ignored (nohup) stays ignored */
        sigaction(sigs[i], &sa, &old[i]);
        if (old[i].sa_handler == SIG_IGN) sigaction(sigs[i], &old[i], NULL);
    }
    fflush(NULL);
    for (int r = 0; r < world; r++) {
        char **env = place_rank_env(&map, &node, r);
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
            for (int i = 0; i < 4; i++) sigaction(sigs[i], &old[i], NULL);
            exec_rank(env, addr, secret, threads);
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
    int gang = alive == world ? PLAIT_EXIT_OK : PLAIT_EXIT_ERROR;
    double kill_at = alive == world ? 0 : now_s() + g->timeout_s + 5;
    bool terminated = alive != world;
    if (terminated)
        for (int r = 0; r < world; r++)
            if (pids[r] > 0) kill(pids[r], SIGTERM);
    while (alive > 0) {
        if (pending_signal) {
            int sig = pending_signal;
            pending_signal = 0;
            for (int r = 0; r < world; r++)
                if (pids[r] > 0) kill(pids[r], sig);
        }
        if (kill_at > 0 && now_s() > kill_at) {
            for (int r = 0; r < world; r++)
                if (pids[r] > 0) kill(pids[r], SIGKILL);
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
        int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (code != PLAIT_EXIT_OK && code != PLAIT_EXIT_PREEMPTED) {
            if (gang == PLAIT_EXIT_OK || gang == PLAIT_EXIT_PREEMPTED)
                log_error("rank %d (pid %d) %s %d; stopping the other ranks", r, (int)pid,
                          WIFEXITED(status) ? "exited with" : "was killed by signal",
                          WIFEXITED(status) ? code : WTERMSIG(status));
            if (!terminated) {
                terminated = true;
                kill_at = now_s() + g->timeout_s + 5;
                for (int q = 0; q < world; q++)
                    if (pids[q] > 0) kill(pids[q], SIGTERM);
            }
        }
        if (!terminated || code != 128 + SIGTERM) merge_status(&gang, code);
    }
    for (int i = 0; i < 4; i++) sigaction(sigs[i], &old[i], NULL);
    rc = gang;
out:
    store_server_stop(srv);
    rank_map_free(&map);
    topo_free(&topo);
    free(pids);
    return rc;
}
