/* comm_world.h — the harness the socket collectives' tests share (test_comm.c,
 * test_comm_properties.c, test_comm_failure.c): a world of 1..8 ranks forked
 * from the test, meeting through a store server in the parent, each running
 * a rank_fn on its world communicator and reporting through shared memory
 * (sh); the ranks' inputs and hashes; a program's main. Not
 * the cases themselves: each file holds its topic's. */
#ifndef PLAIT_TESTS_COMM_WORLD_H
#define PLAIT_TESTS_COMM_WORLD_H

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/lsan_interface.h>
#endif

#include "check.h"
#include "seconds.h" // defines: now_s, sleep_s
#include "common/store/store.h"
#include "runtime/comm/comm.h"

#define SECRET "comm-test-secret-0123456789abcdef"
#define MAX_RANKS 8
#define WORLD_LIMIT_S 60 /* a world that has not finished by then is killed: a hang */

/* What ranks report to the parent (mapped shared before fork). */
struct shared {
    uint64_t hash[MAX_RANKS][16];
    double t[MAX_RANKS][4];
    _Atomic int flag[MAX_RANKS];
    char text[MAX_RANKS][1024];
    bool peer_lost[MAX_RANKS]; /* the error's peer_lost, where text is one */
    struct comm_stats stats[MAX_RANKS][4];
    double value[MAX_RANKS][8];
    double kill_time;
    _Atomic int port; /* the store server's, once it listens */
};
static struct shared *sh;

static inline uint64_t fnv1a(const void *data, size_t n)
{
    const uint8_t *p = data;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* Rank r's element i: a float in [-1, 1] that no short sum represents exactly. */
static inline float input(int r, size_t i, uint32_t salt)
{
    uint64_t x = (uint64_t)r * 0x9e3779b97f4a7c15ull ^ (i + 1) * 0xbf58476d1ce4e5b9ull ^ salt;
    x ^= x >> 31;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 29;
    return (float)((double)(x % 2000001) / 1000000.0 - 1.0);
}

/* ---- running a world of ranks -------------------------------------------- */

struct world_opts {
    int n;
    double timeout_s;
    enum comm_transport transport;
    enum comm_algorithm algorithm;
    size_t small_bytes;
    int nodes;          /* 0: the real node identity; k: ranks spread over k pretend nodes */
    int absent_rank;    /* this rank never joins (-1: none) */
    bool init_may_fail; /* the rank reports init's error instead of failing */
    const char *name;
};

typedef void (*rank_fn)(struct comm *c, struct store *st, int rank, int n, void *arg);

struct world {
    struct store_server *srv;
    pid_t pid[MAX_RANKS];
    int n;
};

/* Ranks are forked while the parent has no other thread (sanitizer allocators
 * do not survive a fork taken while another thread holds their lock); the
 * store server starts after, and its port reaches them through sh. */
static inline int wait_port(void)
{
    for (double t0 = now_s(); now_s() - t0 < 10; sleep_s(0.001))
        if (atomic_load(&sh->port)) return atomic_load(&sh->port);
    return 0;
}

static inline void child(const struct world_opts *o, int rank, rank_fn fn, void *arg)
{
    check_failures = 0;
    struct plait_error err;
    struct store *st = NULL;
    int port = wait_port();
    if (store_connect(&st, "127.0.0.1", port, SECRET, rank, 10, &err)) {
        printf("  rank %d: %s\n", rank, err.text);
        fflush(stdout);
        _exit(2);
    }
    if (rank == o->absent_rank) {
        store_close(st);
        _exit(0);
    }
    char node[32];
    snprintf(node, sizeof node, "pretend-node-%d", o->nodes ? rank * o->nodes / o->n : 0);
    struct comm_options opts = {.backend = COMM_BACKEND_SOCKET,
                                .timeout_s = o->timeout_s > 0 ? o->timeout_s : 10,
                                .secret = SECRET,
                                .name = o->name,
                                .transport = o->transport,
                                .algorithm = o->algorithm,
                                .small_message_bytes = o->small_bytes,
                                .node_id = o->nodes ? node : NULL};
    struct comm *c = NULL;
    double t0 = now_s();
    if (comm_world_init(&c, st, rank, o->n, &opts, &err)) {
        sh->t[rank][0] = now_s() - t0;
        snprintf(sh->text[rank], sizeof sh->text[rank], "%s", err.text);
        sh->peer_lost[rank] = err.peer_lost;
        if (!o->init_may_fail) CHECK(0, "rank %d: %s", rank, err.text);
    } else {
        CHECK(comm_rank(c) == rank && comm_size(c) == o->n, "rank %d of %d", comm_rank(c),
              comm_size(c));
        fn(c, st, rank, o->n, arg);
        comm_destroy(c);
    }
    store_close(st);
#ifdef __SANITIZE_ADDRESS__
    /* _exit skips LeakSanitizer's check at exit: a rank's leaks are its case's */
    CHECK(__lsan_do_recoverable_leak_check() == 0, "rank %d leaked (LeakSanitizer above)", rank);
#endif
    fflush(stdout);
    _exit(check_failures ? 1 : 0);
}

/* A store server for a world whose ranks are forked already. */
static inline struct store_server *serve(void)
{
    struct plait_error err;
    struct store_server *srv = NULL;
    if (store_server_start(&srv, "127.0.0.1", 0, SECRET, &err))
        CHECK(0, "store server: %s", err.text);
    else
        atomic_store(&sh->port, store_server_port(srv));
    return srv;
}

static inline void world_start(struct world *w, const struct world_opts *o, rank_fn fn, void *arg)
{
    memset(sh, 0, sizeof *sh);
    w->n = o->n;
    fflush(stdout);
    for (int r = 0; r < o->n; r++) {
        w->pid[r] = fork();
        if (w->pid[r] == 0) child(o, r, fn, arg);
        CHECK(w->pid[r] > 0, "fork: %s", strerror(errno));
    }
    w->srv = serve();
}

/* Waits for every rank; statuses into status (may be NULL). Kills a world
 * that hangs. Returns how many ranks exited 0. */
static inline int world_wait(struct world *w, int *status)
{
    int ok = 0, left = w->n;
    int st[MAX_RANKS];
    bool done[MAX_RANKS] = {false};
    double t0 = now_s();
    while (left > 0) {
        for (int r = 0; r < w->n; r++) {
            if (done[r] || w->pid[r] <= 0) {
                if (!done[r]) done[r] = true, left--, st[r] = -1;
                continue;
            }
            pid_t k = waitpid(w->pid[r], &st[r], WNOHANG);
            if (k == w->pid[r]) {
                done[r] = true;
                left--;
                if (WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0) ok++;
            }
        }
        if (left > 0 && now_s() - t0 > WORLD_LIMIT_S) {
            CHECK(0, "a world of %d ranks hung; killing it", w->n);
            for (int r = 0; r < w->n; r++)
                if (!done[r]) kill(w->pid[r], SIGKILL);
            t0 = now_s() + 1e9;
        }
        if (left > 0) sleep_s(0.002);
    }
    if (status) memcpy(status, st, sizeof(int) * (size_t)w->n);
    store_server_stop(w->srv);
    return ok;
}

/* Runs fn on n ranks; every rank must exit cleanly. */
static inline void run_world(const struct world_opts *o, rank_fn fn, void *arg)
{
    struct world w;
    world_start(&w, o, fn, arg);
    int ok = world_wait(&w, NULL);
    CHECK(ok == o->n, "%d of %d ranks passed (%s)", ok, o->n, o->name ? o->name : "world");
}

static inline bool all_hashes_equal(int n, int slot)
{
    for (int r = 1; r < n; r++)
        if (sh->hash[r][slot] != sh->hash[0][slot]) return false;
    return true;
}

/* A case, for comm_world_main. */
struct comm_case {
    const char *name;
    void (*fn)(void);
};
#define COMM_CASE(fn)                                                                              \
    {                                                                                              \
#fn, fn                                                                                    \
    }

/* A test program's main: SIGPIPE ignored (a peer's closed socket is an
 * error, not a signal), sh mapped shared with the ranks, then each case in
 * turn (test_comm* NAME: only those whose name contains NAME). */
static inline int comm_world_main(int argc, char **argv, const struct comm_case *cases, int n)
{
    const char *only = argc > 1 ? argv[1] : NULL;
    signal(SIGPIPE, SIG_IGN);
    sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) return 1;
    double t0 = now_s();
    for (int i = 0; i < n; i++)
        if (!only || strstr(cases[i].name, only)) check_run(cases[i].name, cases[i].fn);
    printf("# %.1f s\n", now_s() - t0);
    return check_exit_code();
}

#endif
