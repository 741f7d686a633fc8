/* test_comm.c — the collectives layer (runtime/comm) with real processes:
 * each case forks 2..8 ranks that meet through a store server in the parent,
 * and checks them against a serial reference in double: all-reduce,
 * reduce-scatter, all-gather, broadcast, barrier, send/recv, 3D splits,
 * bitwise determinism, bytes on the wire against the ring formulas, overlap
 * of asynchronous work, and failure (a killed rank, a rank that never joins,
 * a stranger without the secret, a job abort). Shared memory, TCP, and both
 * mixed (pretend nodes) are exercised. */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/lsan_interface.h>
#endif

#include "check.h"
#include "common/sha256.h"
#include "common/store/store.h"
#include "runtime/comm/comm.h"
#include "runtime/comm/sock_connect.h"

#define SECRET "comm-test-secret-0123456789abcdef"
#define MAX_RANKS 8
#define WORLD_LIMIT_S 60 /* a world that has not finished by then is killed: a hang */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

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

static uint64_t fnv1a(const void *data, size_t n)
{
    const uint8_t *p = data;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* Rank r's element i: a float in [-1, 1] that no short sum represents exactly. */
static float input(int r, size_t i, uint32_t salt)
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
static int wait_port(void)
{
    for (double t0 = now_s(); now_s() - t0 < 10; sleep_s(0.001))
        if (atomic_load(&sh->port)) return atomic_load(&sh->port);
    return 0;
}

static void child(const struct world_opts *o, int rank, rank_fn fn, void *arg)
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
static struct store_server *serve(void)
{
    struct plait_error err;
    struct store_server *srv = NULL;
    if (store_server_start(&srv, "127.0.0.1", 0, SECRET, &err))
        CHECK(0, "store server: %s", err.text);
    else
        atomic_store(&sh->port, store_server_port(srv));
    return srv;
}

static void world_start(struct world *w, const struct world_opts *o, rank_fn fn, void *arg)
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
static int world_wait(struct world *w, int *status)
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
static void run_world(const struct world_opts *o, rank_fn fn, void *arg)
{
    struct world w;
    world_start(&w, o, fn, arg);
    int ok = world_wait(&w, NULL);
    CHECK(ok == o->n, "%d of %d ranks passed (%s)", ok, o->n, o->name ? o->name : "world");
}

static bool all_hashes_equal(int n, int slot)
{
    for (int r = 1; r < n; r++)
        if (sh->hash[r][slot] != sh->hash[0][slot]) return false;
    return true;
}

/* ---- all-reduce ---------------------------------------------------------- */

struct allreduce_case {
    const size_t *counts;
    int n_counts;
    bool in_place;
};

/* Checks an all-reduce result against sum (or max) in double over all ranks. */
static void check_allreduce(const float *got, size_t count, int n, enum comm_reduce_op op,
                            uint32_t salt, const char *what)
{
    int bad = 0;
    for (size_t i = 0; i < count && bad < 3; i++) {
        double ref = op == COMM_SUM ? 0 : -INFINITY, mag = 0;
        for (int r = 0; r < n; r++) {
            double x = input(r, i, salt);
            ref = op == COMM_SUM ? ref + x : (x > ref ? x : ref);
            mag += fabs(x);
        }
        double tol = op == COMM_SUM ? 2.0 * n * FLT_EPSILON * mag + 1e-30 : 0;
        if (!(fabs(got[i] - ref) <= tol)) {
            CHECK(0, "%s: n=%d count=%zu [%zu] = %.9g, reference %.9g", what, n, count, i, got[i],
                  ref);
            bad++;
        }
    }
}

static void allreduce_rank(struct comm *c, struct store *st, int rank, int n, void *arg)
{
    (void)st;
    const struct allreduce_case *ac = arg;
    struct plait_error err;
    int slot = 0;
    for (int k = 0; k < ac->n_counts; k++) {
        size_t count = ac->counts[k];
        float *in = malloc(sizeof(float) * (count + 1)), *out = malloc(sizeof(float) * (count + 1));
        for (int opi = 0; opi < 2; opi++) {
            enum comm_reduce_op op = opi ? COMM_MAX : COMM_SUM;
            uint32_t salt = (uint32_t)(k * 2 + opi);
            for (size_t i = 0; i < count; i++) in[i] = input(rank, i, salt);
            float *dst = ac->in_place ? in : out;
            int rc = comm_allreduce(c, in, dst, count, COMM_FLOAT32, op, &err);
            CHECK(rc == 0, "rank %d count %zu: %s", rank, count, err.text);
            if (rc) break;
            if (!ac->in_place)
                for (size_t i = 0; i < count; i++)
                    if (in[i] != input(rank, i, salt)) {
                        CHECK(0, "rank %d: all-reduce wrote into its send buffer", rank);
                        break;
                    }
            check_allreduce(dst, count, n, op, salt, op == COMM_SUM ? "sum" : "max");
            sh->hash[rank][slot++ % 16] = fnv1a(dst, count * sizeof(float));
        }
        free(in);
        free(out);
    }
}

static void test_allreduce_sum_and_max_match_double_reference(void)
{
    static const size_t counts[] = {0, 1, 7, 1000, 1001, 4099, 1 << 20};
    static const size_t counts8[] = {0, 1, 7, 1000, 4099, 1 << 20};
    static const int ns[] = {2, 3, 4, 8};
    for (size_t i = 0; i < 4; i++) {
        int n = ns[i];
        struct allreduce_case ac = {n == 8 ? counts8 : counts, n == 8 ? 6 : 7, false};
        struct world_opts o = {.n = n, .absent_rank = -1, .name = "ar"};
        run_world(&o, allreduce_rank, &ac);
        for (int s = 0; s < 2 * ac.n_counts && s < 16; s++)
            CHECK(all_hashes_equal(n, s), "n=%d: ranks disagree in result %d", n, s);
    }
}

/* Every size through each algorithm, out of place and in place, over TCP
 * and over two pretend nodes (shared memory inside each, TCP between). */
static void test_allreduce_every_algorithm_and_transport(void)
{
    static const size_t counts[] = {1, 2, 3, 5, 7, 33, 1000, 65537};
    struct {
        enum comm_algorithm alg;
        enum comm_transport tr;
        int nodes, n;
        bool in_place;
    } cases[] = {
        {COMM_ALGORITHM_BANDWIDTH, COMM_TRANSPORT_AUTO, 0, 5, false},
        {COMM_ALGORITHM_LATENCY, COMM_TRANSPORT_AUTO, 0, 5, true},
        {COMM_ALGORITHM_LATENCY, COMM_TRANSPORT_AUTO, 0, 4, false},
        {COMM_ALGORITHM_BANDWIDTH, COMM_TRANSPORT_TCP, 0, 3, true},
        {COMM_ALGORITHM_LATENCY, COMM_TRANSPORT_TCP, 0, 3, false},
        {COMM_ALGORITHM_AUTO, COMM_TRANSPORT_AUTO, 2, 4, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct allreduce_case ac = {counts, 8, cases[i].in_place};
        struct world_opts o = {.n = cases[i].n,
                               .absent_rank = -1,
                               .algorithm = cases[i].alg,
                               .transport = cases[i].tr,
                               .nodes = cases[i].nodes,
                               .name = "alg"};
        run_world(&o, allreduce_rank, &ac);
        for (int s = 0; s < 16; s++)
            CHECK(all_hashes_equal(cases[i].n, s), "case %zu: ranks disagree in result %d", i, s);
    }
}

static void typed_rank(struct comm *c, struct store *st, int rank, int n, void *arg)
{
    (void)st;
    (void)arg;
    struct plait_error err;
    enum { COUNT = 3001 };
    double *d = malloc(sizeof(double) * COUNT);
    int64_t *v = malloc(sizeof(int64_t) * COUNT);
    for (int alg = 0; alg < 2; alg++) {
        size_t count = alg ? COUNT : 5; /* small: recursive doubling; large: ring */
        for (size_t i = 0; i < count; i++) {
            d[i] = (double)input(rank, i, 7) * 1e10;
            v[i] = (int64_t)(rank + 1) * 1000000007LL * (int64_t)(i + 1) * (i % 2 ? -1 : 1);
        }
        CHECK(comm_allreduce(c, d, d, count, COMM_FLOAT64, COMM_SUM, &err) == 0, "%s", err.text);
        CHECK(comm_allreduce(c, v, v, count, COMM_INT64, COMM_SUM, &err) == 0, "%s", err.text);
        for (size_t i = 0; i < count; i++) {
            double ref = 0;
            int64_t iref = 0;
            for (int r = 0; r < n; r++) {
                ref += (double)input(r, i, 7) * 1e10;
                iref += (int64_t)(r + 1) * 1000000007LL * (int64_t)(i + 1) * (i % 2 ? -1 : 1);
            }
            if (fabs(d[i] - ref) > 1e-12 * 1e10 * n || v[i] != iref) {
                CHECK(0, "rank %d [%zu]: f64 %.17g (ref %.17g), i64 %lld (ref %lld)", rank, i, d[i],
                      ref, (long long)v[i], (long long)iref);
                break;
            }
        }
        for (size_t i = 0; i < count; i++) v[i] = (int64_t)i * (rank == 1 ? 3 : -1);
        CHECK(comm_allreduce(c, v, v, count, COMM_INT64, COMM_MAX, &err) == 0, "%s", err.text);
        for (size_t i = 0; i < count; i++)
            if (v[i] != (int64_t)i * 3) {
                CHECK(0, "int64 max [%zu] = %lld", i, (long long)v[i]);
                break;
            }
    }
    free(d);
    free(v);
}

static void test_allreduce_float64_and_int64(void)
{
    struct world_opts o = {.n = 3, .absent_rank = -1, .name = "typed"};
    run_world(&o, typed_rank, NULL);
}

/* ---- reduce-scatter, all-gather, broadcast, barrier ---------------------- */

static void rs_ag_rank(struct comm *c, struct store *st, int rank, int n, void *arg)
{
    (void)st;
    (void)arg;
    struct plait_error err;
    static const size_t counts[] = {1, 7, 1000, 65539};
    for (int k = 0; k < 4; k++) {
        size_t count = counts[k], total = count * (size_t)n;
        float *in = malloc(sizeof(float) * total), *out = malloc(sizeof(float) * total);
        for (size_t i = 0; i < total; i++) in[i] = input(rank, i, 100 + (uint32_t)k);
        CHECK(comm_reduce_scatter(c, in, out, count, COMM_FLOAT32, COMM_SUM, &err) == 0, "%s",
              err.text);
        int bad = 0;
        for (size_t i = 0; i < count && bad < 3; i++) {
            size_t at = (size_t)rank * count + i;
            double ref = 0, mag = 0;
            for (int r = 0; r < n; r++) {
                ref += input(r, at, 100 + (uint32_t)k);
                mag += fabs(input(r, at, 100 + (uint32_t)k));
            }
            if (!(fabs(out[i] - ref) <= 2.0 * n * FLT_EPSILON * mag)) {
                CHECK(0, "reduce-scatter n=%d count=%zu rank %d [%zu] = %.9g, ref %.9g", n, count,
                      rank, i, out[i], ref);
                bad++;
            }
        }
        /* all-gather, out of place and in place */
        for (size_t i = 0; i < count; i++) in[i] = input(rank, i, 200 + (uint32_t)k);
        CHECK(comm_allgather(c, in, out, count, COMM_FLOAT32, &err) == 0, "%s", err.text);
        memcpy(in + (size_t)rank * count, in, sizeof(float) * count);
        float *inplace = in;
        if (rank != 0) memset(inplace, 0, sizeof(float) * (size_t)rank * count);
        CHECK(comm_allgather(c, inplace + (size_t)rank * count, inplace, count, COMM_FLOAT32,
                             &err) == 0,
              "%s", err.text);
        for (int r = 0; r < n; r++)
            for (size_t i = 0; i < count; i++)
                if (out[(size_t)r * count + i] != input(r, i, 200 + (uint32_t)k) ||
                    inplace[(size_t)r * count + i] != input(r, i, 200 + (uint32_t)k)) {
                    CHECK(0, "all-gather n=%d count=%zu: block %d [%zu] wrong", n, count, r, i);
                    r = n;
                    break;
                }
        free(in);
        free(out);
    }
}

static void test_reduce_scatter_and_allgather_match_reference(void)
{
    static const int ns[] = {2, 3, 4, 8};
    for (int i = 0; i < 4; i++) {
        struct world_opts o = {.n = ns[i], .absent_rank = -1, .name = "rsag"};
        run_world(&o, rs_ag_rank, NULL);
    }
    struct world_opts tcp = {.n = 3, .absent_rank = -1, .transport = COMM_TRANSPORT_TCP};
    run_world(&tcp, rs_ag_rank, NULL);
}

/* Per-rank counts of pattern k for n ranks: uneven, zeros between, a
 * zero for rank 0 alone, one rank owning it all, nothing at all. */
static size_t rsv_count(int k, int r, int n)
{
    switch (k) {
    case 0:
        return 1000 + 37 * (size_t)r;
    case 1:
        return r % 2 ? 0 : 5000 + (size_t)r;
    case 2:
        return r == 0 ? 0 : 3;
    case 3:
        return r == n - 1 ? 70001 : 0;
    default:
        return 0;
    }
}

/* Pattern k's counts for n ranks, their total, and where rank's block
 * starts in it. */
static void uneven_counts(int k, int rank, int n, size_t *counts, size_t *total, size_t *before)
{
    *total = *before = 0;
    for (int r = 0; r < n; r++) {
        counts[r] = rsv_count(k, r, n);
        if (r == rank) *before = *total;
        *total += counts[r];
    }
}

/* The payload this rank sent since s0 is what its ring sends. */
static void check_ring_payload(struct comm *c, const struct comm_stats *s0, uint64_t want,
                               const char *what, int n, int rank)
{
    struct comm_stats s1;
    comm_stats(c, &s1);
    CHECK(s1.payload_bytes_sent - s0->payload_bytes_sent == want,
          "%s n=%d rank %d: sent %llu payload bytes, the ring sends %llu", what, n, rank,
          (unsigned long long)(s1.payload_bytes_sent - s0->payload_bytes_sent),
          (unsigned long long)want);
}

/* Every pattern posted at once (asynchronous, waited in order), each rank's
 * block against a double reference, the floats after it untouched, and the
 * payload the ring's: every block but its own. */
static void rsv_rank(struct comm *c, struct store *st, int rank, int n, void *arg)
{
    (void)st;
    (void)arg;
    enum { K = 5 };
    struct plait_error err;
    size_t counts[K][8], total[K], before[K];
    float *in[K], *out[K];
    struct comm_request *req[K];
    struct comm_stats s0;
    comm_stats(c, &s0);
    uint64_t want_sent = 0;
    for (int k = 0; k < K; k++) {
        uneven_counts(k, rank, n, counts[k], &total[k], &before[k]);
        want_sent += (total[k] - counts[k][rank]) * sizeof(float);
        in[k] = malloc(sizeof(float) * (total[k] + 1));
        out[k] = malloc(sizeof(float) * (counts[k][rank] + 1));
        for (size_t i = 0; i < total[k]; i++) in[k][i] = input(rank, i, 500 + (uint32_t)k);
        for (size_t i = 0; i <= counts[k][rank]; i++) out[k][i] = -3.0f;
        CHECK(comm_ireduce_scatter_v(c, in[k], out[k], counts[k], COMM_FLOAT32, COMM_SUM, &req[k],
                                     &err) == 0,
              "%s", err.text);
    }
    for (int k = 0; k < K; k++) {
        CHECK(comm_wait(req[k], &err) == 0, "%s", err.text);
        size_t mine = counts[k][rank];
        int bad = 0;
        for (size_t i = 0; i < mine && bad < 3; i++) {
            double ref = 0, mag = 0;
            for (int r = 0; r < n; r++) {
                ref += input(r, before[k] + i, 500 + (uint32_t)k);
                mag += fabs(input(r, before[k] + i, 500 + (uint32_t)k));
            }
            if (!(fabs(out[k][i] - ref) <= 2.0 * n * FLT_EPSILON * mag)) {
                CHECK(0, "reduce-scatter-v n=%d pattern %d rank %d [%zu] = %.9g, ref %.9g", n, k,
                      rank, i, out[k][i], ref);
                bad++;
            }
        }
        CHECK(out[k][mine] == -3.0f, "reduce-scatter-v n=%d pattern %d rank %d: wrote past %zu", n,
              k, rank, mine);
        free(in[k]);
        free(out[k]);
    }
    check_ring_payload(c, &s0, want_sent, "reduce-scatter-v", n, rank);
}

/* An uneven collective's ranks at 2 to 5 ranks over shared memory, and at 3
 * over TCP. */
static void run_uneven_worlds(rank_fn fn, const char *name)
{
    static const int ns[] = {2, 3, 4, 5};
    for (int i = 0; i < 4; i++) {
        struct world_opts o = {.n = ns[i], .absent_rank = -1, .name = name};
        run_world(&o, fn, NULL);
    }
    struct world_opts tcp = {.n = 3, .absent_rank = -1, .transport = COMM_TRANSPORT_TCP};
    run_world(&tcp, fn, NULL);
}

static void test_uneven_reduce_scatter_matches_reference(void)
{
    run_uneven_worlds(rsv_rank, "rsv");
}

/* The uneven all-gather of rsv_count's patterns, every one posted at once
 * (asynchronous, waited in order), out of place and in place: every rank's
 * block exact, the float after the whole untouched, and the payload the
 * ring's: every block but the next rank's. */
static void agv_rank(struct comm *c, struct store *st, int rank, int n, void *arg)
{
    (void)st;
    (void)arg;
    enum { K = 5 };
    struct plait_error err;
    size_t counts[K][8], total[K], before[K];
    float *in[K], *out[K], *inplace[K];
    struct comm_request *req[2 * K];
    struct comm_stats s0;
    comm_stats(c, &s0);
    uint64_t want_sent = 0;
    for (int k = 0; k < K; k++) {
        uneven_counts(k, rank, n, counts[k], &total[k], &before[k]);
        want_sent += 2 * (total[k] - counts[k][(rank + 1) % n]) * sizeof(float);
        in[k] = malloc(sizeof(float) * (counts[k][rank] + 1));
        out[k] = malloc(sizeof(float) * (total[k] + 1));
        inplace[k] = malloc(sizeof(float) * (total[k] + 1));
        for (size_t i = 0; i <= total[k]; i++) out[k][i] = inplace[k][i] = -3.0f;
        for (size_t i = 0; i < counts[k][rank]; i++)
            in[k][i] = inplace[k][before[k] + i] = input(rank, i, 700 + (uint32_t)k);
        CHECK(comm_iallgather_v(c, in[k], out[k], counts[k], COMM_FLOAT32, &req[2 * k], &err) == 0,
              "%s", err.text);
        CHECK(comm_iallgather_v(c, inplace[k] + before[k], inplace[k], counts[k], COMM_FLOAT32,
                                &req[2 * k + 1], &err) == 0,
              "%s", err.text);
    }
    for (int k = 0; k < K; k++) {
        CHECK(comm_wait(req[2 * k], &err) == 0 && comm_wait(req[2 * k + 1], &err) == 0, "%s",
              err.text);
        size_t at = 0;
        int bad = 0;
        for (int r = 0; r < n; r++)
            for (size_t i = 0; i < counts[k][r]; i++, at++) {
                float want = input(r, i, 700 + (uint32_t)k);
                if (bad < 3 && (out[k][at] != want || inplace[k][at] != want)) {
                    CHECK(0, "all-gather-v n=%d pattern %d rank %d: block %d [%zu] = %.9g, %.9g "
                             "in place, sent %.9g",
                          n, k, rank, r, i, out[k][at], inplace[k][at], want);
                    bad++;
                }
            }
        CHECK(out[k][at] == -3.0f && inplace[k][at] == -3.0f,
              "all-gather-v n=%d pattern %d rank %d: wrote past %zu", n, k, rank, at);
        free(in[k]);
        free(out[k]);
        free(inplace[k]);
    }
    check_ring_payload(c, &s0, want_sent, "all-gather-v", n, rank);
}

static void test_uneven_allgather_matches_every_block(void)
{
    run_uneven_worlds(agv_rank, "agv");
}

/* The same uneven all-gather of 2-byte bf16 values (ZeRO 3's weights in the
 * compute precision): every block exact, nothing written past them; a bf16
 * sum is refused, naming the data type. */
static void agv16_rank(struct comm *c, struct store *st, int rank, int n, void *arg)
{
    (void)st;
    (void)arg;
    struct plait_error err = {.text = ""};
    size_t counts[8], total, before;
    uneven_counts(3, rank, n, counts, &total, &before);
    uint16_t *in = malloc(sizeof(uint16_t) * (counts[rank] + 1));
    uint16_t *out = malloc(sizeof(uint16_t) * (total + 1));
    for (size_t i = 0; i <= total; i++) out[i] = 0xdead;
    for (size_t i = 0; i < counts[rank]; i++) in[i] = (uint16_t)(rank * 1000 + i);
    struct comm_request *req;
    CHECK(comm_iallgather_v(c, in, out, counts, COMM_BFLOAT16, &req, &err) == 0 &&
              comm_wait(req, &err) == 0,
          "%s", err.text);
    size_t at = 0;
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < counts[r]; i++, at++)
            if (out[at] != (uint16_t)(r * 1000 + i)) {
                CHECK(0, "bf16 all-gather-v n=%d rank %d: block %d [%zu] = %u", n, rank, r, i,
                      out[at]);
                r = n;
                break;
            }
    CHECK(out[total] == 0xdead, "bf16 all-gather-v n=%d rank %d: wrote past the blocks", n, rank);
    CHECK(comm_iallreduce(c, in, in, 1, COMM_BFLOAT16, COMM_SUM, &req, &err) == -1 &&
              strstr(err.text, "bf16 is gathered, never summed"),
          "a bf16 sum: %s", err.text);
    free(in);
    free(out);
}

static void test_uneven_bf16_allgather_matches_every_block(void)
{
    run_uneven_worlds(agv16_rank, "agv16");
}

/* Elements rank `from` sends rank `to` in all-to-all pattern k: uneven in
 * both directions, zeros between, everything to one rank (as a router may
 * send every token to one expert), nothing at all. */
static size_t a2a_count(int k, int from, int to, int n)
{
    switch (k) {
    case 0:
        return 100 + 31 * (size_t)from + 7 * (size_t)to;
    case 1:
        return (from + to) % 2 ? 0 : 4000 + (size_t)(from * n + to);
    case 2:
        return to == n - 1 ? 50001 : 0;
    default:
        return 0;
    }
}

/* Every pattern posted at once, each received block checked element by
 * element against what its sender wrote (the bits: nothing is added), the
 * float after the last untouched, and the payload every block but the own. */
static void a2a_rank(struct comm *c, struct store *st, int rank, int n, void *arg)
{
    (void)st;
    (void)arg;
    enum { K = 4 };
    struct plait_error err;
    size_t sc[K][8], rc[K][8], out_n[K], in_n[K];
    float *in[K], *out[K];
    struct comm_request *req[K];
    struct comm_stats s0, s1;
    comm_stats(c, &s0);
    uint64_t want_sent = 0;
    for (int k = 0; k < K; k++) {
        out_n[k] = in_n[k] = 0;
        for (int r = 0; r < n; r++) {
            sc[k][r] = a2a_count(k, rank, r, n);
            rc[k][r] = a2a_count(k, r, rank, n);
            out_n[k] += sc[k][r];
            in_n[k] += rc[k][r];
            want_sent += r == rank ? 0 : sc[k][r] * sizeof(float);
        }
        in[k] = malloc(sizeof(float) * (out_n[k] + 1));
        out[k] = malloc(sizeof(float) * (in_n[k] + 1));
        for (size_t i = 0; i < out_n[k]; i++) in[k][i] = input(rank, i, 700 + (uint32_t)k);
        for (size_t i = 0; i <= in_n[k]; i++) out[k][i] = -5.0f;
        CHECK(comm_ialltoall_v(c, in[k], sc[k], out[k], rc[k], COMM_FLOAT32, &req[k], &err) == 0,
              "%s", err.text);
    }
    for (int k = 0; k < K; k++) {
        CHECK(comm_wait(req[k], &err) == 0, "%s", err.text);
        size_t at = 0;
        for (int r = 0; r < n; r++) {
            size_t from_at = 0; /* where rank r's block for this rank starts in r's send */
            for (int q = 0; q < rank; q++) from_at += a2a_count(k, r, q, n);
            for (size_t i = 0; i < rc[k][r]; i++)
                if (out[k][at + i] != input(r, from_at + i, 700 + (uint32_t)k)) {
                    CHECK(0, "all-to-all n=%d pattern %d: rank %d's block from %d [%zu] wrong", n,
                          k, rank, r, i);
                    break;
                }
            at += rc[k][r];
        }
        CHECK(out[k][in_n[k]] == -5.0f, "all-to-all n=%d pattern %d rank %d: wrote past %zu", n, k,
              rank, in_n[k]);
        free(in[k]);
        free(out[k]);
    }
    comm_stats(c, &s1);
    CHECK(s1.payload_bytes_sent - s0.payload_bytes_sent == want_sent,
          "all-to-all n=%d rank %d: sent %llu payload bytes, every block but its own is %llu", n,
          rank, (unsigned long long)(s1.payload_bytes_sent - s0.payload_bytes_sent),
          (unsigned long long)want_sent);
}

static void test_uneven_alltoall_delivers_every_block(void)
{
    static const int ns[] = {2, 3, 4, 8};
    for (int i = 0; i < 4; i++) {
        struct world_opts o = {.n = ns[i], .absent_rank = -1, .name = "a2a"};
        run_world(&o, a2a_rank, NULL);
    }
    struct world_opts tcp = {.n = 3, .absent_rank = -1, .transport = COMM_TRANSPORT_TCP};
    run_world(&tcp, a2a_rank, NULL);
}

static void broadcast_rank(struct comm *c, struct store *st, int rank, int n, void *arg)
{
    (void)st;
    (void)arg;
    struct plait_error err;
    static const size_t counts[] = {1, 1000, 300001};
    float *buf = malloc(sizeof(float) * 300001);
    for (int k = 0; k < 3; k++)
        for (int root = 0; root < n; root++) {
            size_t count = counts[k];
            for (size_t i = 0; i < count; i++) buf[i] = rank == root ? input(root, i, 300) : -7.0f;
            CHECK(comm_broadcast(c, buf, count, COMM_FLOAT32, root, &err) == 0, "%s", err.text);
            for (size_t i = 0; i < count; i++)
                if (buf[i] != input(root, i, 300)) {
                    CHECK(0, "broadcast n=%d root %d count %zu: rank %d [%zu] wrong", n, root,
                          count, rank, i);
                    break;
                }
        }
    free(buf);
}

static void test_broadcast_from_every_root(void)
{
    static const int ns[] = {2, 3, 5, 8};
    for (int i = 0; i < 4; i++) {
        struct world_opts o = {.n = ns[i], .absent_rank = -1, .name = "bcast"};
        run_world(&o, broadcast_rank, NULL);
    }
    struct world_opts chain = {
        .n = 4, .absent_rank = -1, .algorithm = COMM_ALGORITHM_BANDWIDTH, .name = "chain"};
    run_world(&chain, broadcast_rank, NULL);
    struct world_opts tree = {.n = 6,
                              .absent_rank = -1,
                              .algorithm = COMM_ALGORITHM_LATENCY,
                              .transport = COMM_TRANSPORT_TCP};
    run_world(&tree, broadcast_rank, NULL);
}

static void barrier_rank(struct comm *c, struct store *st, int rank, int n, void *arg)
{
    (void)st;
    (void)n;
    (void)arg;
    struct plait_error err;
    for (int round = 0; round < 3; round++) {
        sleep_s(0.01 * ((rank + round) % 4));
        sh->t[rank][round] = now_s(); /* arrival */
        CHECK(comm_barrier(c, &err) == 0, "%s", err.text);
        double left = now_s();
        for (int r = 0; r < n; r++)
            if (sh->t[r][round] == 0 || sh->t[r][round] > left) {
                CHECK(0, "round %d: rank %d left the barrier before rank %d arrived", round, rank,
                      r);
                break;
            }
        CHECK(comm_barrier(c, &err) == 0, "%s", err.text); /* nobody overwrites early */
    }
}

static void test_barrier_waits_for_the_last_rank(void)
{
    static const int ns[] = {2, 3, 8};
    for (int i = 0; i < 3; i++) {
        struct world_opts o = {.n = ns[i], .absent_rank = -1, .name = "barrier"};
        run_world(&o, barrier_rank, NULL);
    }
    struct world_opts tcp = {.n = 5, .absent_rank = -1, .transport = COMM_TRANSPORT_TCP};
    run_world(&tcp, barrier_rank, NULL);
}

/* ---- point to point ------------------------------------------------------ */

/* A ring of blocking sends first (each completes before its receive is
 * posted), then a pipeline: micro-batches forward stage by stage and their
 * gradients back, every send asynchronous, beside a collective on the same
 * communicator. */
static void p2p_rank(struct comm *c, struct store *st, int rank, int n, void *arg)
{
    (void)st;
    (void)arg;
    struct plait_error err;
    enum { BIG = 300000, MICRO = 4 };
    float *a = malloc(sizeof(float) * BIG), *b = malloc(sizeof(float) * BIG);
    for (size_t i = 0; i < BIG; i++) a[i] = input(rank, i, 400);
    int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    CHECK(comm_send(c, a, sizeof(float) * BIG, next, 5, &err) == 0, "%s", err.text);
    CHECK(comm_recv(c, b, sizeof(float) * BIG, prev, 5, &err) == 0, "%s", err.text);
    CHECK(!memcmp(b, (float[]){input(prev, 0, 400)}, sizeof(float)) &&
              b[BIG - 1] == input(prev, BIG - 1, 400),
          "ring: rank %d got the wrong data", rank);
    /* zero-byte messages and tags out of order */
    struct comm_request *r1, *r2;
    CHECK(comm_isend(c, NULL, 0, next, 9, &r1, &err) == 0, "%s", err.text);
    CHECK(comm_isend(c, a, 4, next, 8, &r2, &err) == 0, "%s", err.text);
    float one = 0;
    CHECK(comm_recv(c, &one, 4, prev, 8, &err) == 0 && one == input(prev, 0, 400), "tag 8");
    CHECK(comm_recv(c, NULL, 0, prev, 9, &err) == 0, "%s", err.text);
    CHECK(comm_wait(r1, &err) == 0 && comm_wait(r2, &err) == 0, "%s", err.text);

    /* the pipeline: stage s forwards micro-batch m (value s*100+m) and later sends back its
       gradient; an all-reduce runs on the same communicator meanwhile */
    size_t act = 70000;
    float *acts = malloc(sizeof(float) * act * MICRO), *grads = malloc(sizeof(float) * act * MICRO);
    struct comm_request *sends[2 * MICRO], *recvs[2 * MICRO], *coll;
    int ns = 0, nr = 0;
    float v = (float)rank, sum = 0;
    CHECK(comm_iallreduce(c, &v, &sum, 1, COMM_FLOAT32, COMM_SUM, &coll, &err) == 0, "%s",
          err.text);
    for (int m = 0; m < MICRO; m++) {
        float *x = acts + (size_t)m * act;
        if (rank > 0) {
            CHECK(comm_irecv(c, x, sizeof(float) * act, rank - 1, (uint32_t)m, &recvs[nr], &err) ==
                      0,
                  "%s", err.text);
            CHECK(comm_wait(recvs[nr], &err) == 0, "%s", err.text);
            CHECK(x[0] == (float)((rank - 1) * 100 + m) && x[act - 1] == x[0],
                  "stage %d micro %d: activation %g", rank, m, x[0]);
        }
        for (size_t i = 0; i < act; i++) x[i] = (float)(rank * 100 + m);
        if (rank < n - 1)
            CHECK(comm_isend(c, x, sizeof(float) * act, rank + 1, (uint32_t)m, &sends[ns++],
                             &err) == 0,
                  "%s", err.text);
    }
    for (int m = MICRO - 1; m >= 0; m--) {
        float *g = grads + (size_t)m * act;
        if (rank < n - 1) {
            CHECK(comm_recv(c, g, sizeof(float) * act, rank + 1, 1000u + (uint32_t)m, &err) == 0,
                  "%s", err.text);
            CHECK(g[0] == (float)(-(rank + 1) * 100 - m), "stage %d grad %d: %g", rank, m, g[0]);
        }
        for (size_t i = 0; i < act; i++) g[i] = (float)(-rank * 100 - m);
        if (rank > 0)
            CHECK(comm_isend(c, g, sizeof(float) * act, rank - 1, 1000u + (uint32_t)m, &sends[ns++],
                             &err) == 0,
                  "%s", err.text);
    }
    for (int i = 0; i < ns; i++) CHECK(comm_wait(sends[i], &err) == 0, "%s", err.text);
    CHECK(comm_wait(coll, &err) == 0, "%s", err.text);
    CHECK(sum == (float)(n * (n - 1) / 2), "all-reduce beside the pipeline: %g", sum);
    free(acts);
    free(grads);
    free(a);
    free(b);
}

static void test_send_recv_rings_and_pipelines(void)
{
    static const int ns[] = {2, 3, 4, 8};
    for (int i = 0; i < 4; i++) {
        struct world_opts o = {.n = ns[i], .absent_rank = -1, .name = "p2p"};
        run_world(&o, p2p_rank, NULL);
    }
    struct world_opts tcp = {.n = 4, .absent_rank = -1, .transport = COMM_TRANSPORT_TCP};
    run_world(&tcp, p2p_rank, NULL);
    struct world_opts mixed = {.n = 4, .absent_rank = -1, .nodes = 2, .name = "mixed"};
    run_world(&mixed, p2p_rank, NULL);
}

/* ---- splits ---------------------------------------------------------------- */

/* 2x2x2: tp fastest, then dp, then pp. Each group all-reduces the global ranks
 * of its members, all three at once. */
static void split_rank(struct comm *c, struct store *st, int rank, int n, void *arg)
{
    (void)st;
    (void)n;
    (void)arg;
    struct plait_error err;
    struct comm *tp, *pp, *dp;
    if (comm_split_3d(c, 2, 2, 2, rank_coords_of(comm_rank(c), 2, 2), NULL, &tp, &pp, &dp, &err)) {
        CHECK(0, "rank %d: %s", rank, err.text);
        return;
    }
    int tpr = rank % 2, dpr = rank / 2 % 2, ppr = rank / 4;
    CHECK(comm_rank(tp) == tpr && comm_rank(dp) == dpr && comm_rank(pp) == ppr,
          "rank %d: tp %d dp %d pp %d", rank, comm_rank(tp), comm_rank(dp), comm_rank(pp));
    CHECK(comm_size(tp) == 2 && comm_size(dp) == 2 && comm_size(pp) == 2, "sizes");
    enum { COUNT = 50000 };
    int64_t *x[3];
    struct comm_request *req[3];
    struct comm *g[3] = {tp, dp, pp};
    for (int k = 0; k < 3; k++) {
        x[k] = malloc(sizeof(int64_t) * COUNT);
        for (size_t i = 0; i < COUNT; i++) x[k][i] = (int64_t)rank << (8 * k);
        CHECK(comm_iallreduce(g[k], x[k], x[k], COUNT, COMM_INT64, COMM_SUM, &req[k], &err) == 0,
              "%s", err.text);
    }
    int64_t want[3] = {(int64_t)(rank - tpr) * 2 + 1, (int64_t)(rank - 2 * dpr) * 2 + 2,
                       (int64_t)(rank - 4 * ppr) * 2 + 4};
    for (int k = 0; k < 3; k++) {
        CHECK(comm_wait(req[k], &err) == 0, "%s", err.text);
        CHECK(x[k][0] == want[k] << (8 * k) && x[k][COUNT - 1] == x[k][0],
              "rank %d group %d: %lld, want %lld", rank, k, (long long)x[k][0],
              (long long)(want[k] << (8 * k)));
        free(x[k]);
    }
    CHECK(!strcmp(comm_name(tp), "world.tp.0") || !strncmp(comm_name(tp), "world.tp.", 9),
          "name %s", comm_name(tp));
    /* a split that leaves some ranks out */
    struct comm *even = NULL;
    CHECK(comm_split(c, rank % 2 ? COMM_SPLIT_NONE : 0, -rank, "even", &even, &err) == 0, "%s",
          err.text);
    CHECK((rank % 2) == (even == NULL), "rank %d: even %p", rank, (void *)even);
    if (even) {
        CHECK(comm_size(even) == 4 && comm_rank(even) == 3 - rank / 2, "key orders the group");
        float v = 1;
        CHECK(comm_allreduce(even, &v, &v, 1, COMM_FLOAT32, COMM_SUM, &err) == 0 && v == 4,
              "even group sum %g", v);
    }
    comm_destroy(even);
    /* a name used before is refused at once, not after a timeout */
    struct comm *again = NULL;
    double t0 = now_s();
    int rc = comm_split(c, rank % 2 ? COMM_SPLIT_NONE : 0, 0, "even", &again, &err);
    if (rank % 2 == 0)
        CHECK(rc != 0 && strstr(err.text, "in use") && now_s() - t0 < 2, "reused name: %s",
              rc ? err.text : "accepted");
    comm_destroy(again);
    comm_destroy(tp);
    comm_destroy(dp);
    comm_destroy(pp);
}

static void test_split_into_tp_pp_dp_groups_reducing_concurrently(void)
{
    struct world_opts o = {.n = 8, .absent_rank = -1};
    run_world(&o, split_rank, NULL);
}

/* ---- determinism ----------------------------------------------------------- */

static void determinism_rank(struct comm *c, struct store *st, int rank, int n, void *arg)
{
    (void)st;
    (void)n;
    (void)arg;
    struct plait_error err;
    static const size_t counts[] = {3, 999, 200003};
    float *x = malloc(sizeof(float) * 200003);
    for (int k = 0; k < 3; k++) {
        /* wide magnitudes, so the order of additions shows in the bits */
        for (size_t i = 0; i < counts[k]; i++)
            x[i] = input(rank, i, 500) * powf(10.0f, (float)((rank * 7 + (int)i) % 9) - 4);
        CHECK(comm_allreduce(c, x, x, counts[k], COMM_FLOAT32, COMM_SUM, &err) == 0, "%s",
              err.text);
        sh->hash[rank][k] = fnv1a(x, sizeof(float) * counts[k]);
    }
    free(x);
}

static void test_results_bitwise_identical_on_all_ranks_and_across_runs(void)
{
    uint64_t first[3];
    for (int run = 0; run < 2; run++) {
        struct world_opts o = {.n = 5, .absent_rank = -1, .name = "det"};
        run_world(&o, determinism_rank, NULL);
        for (int k = 0; k < 3; k++) {
            CHECK(all_hashes_equal(5, k), "run %d size %d: ranks disagree", run, k);
            if (run == 0)
                first[k] = sh->hash[0][k];
            else
                CHECK(sh->hash[0][k] == first[k], "size %d: the second run differs", k);
        }
    }
    /* TCP gives the same bits as shared memory */
    struct world_opts tcp = {
        .n = 5, .absent_rank = -1, .transport = COMM_TRANSPORT_TCP, .name = "det"};
    run_world(&tcp, determinism_rank, NULL);
    for (int k = 0; k < 3; k++) CHECK(sh->hash[0][k] == first[k], "TCP differs at size %d", k);
}

/* ---- bytes on the wire ------------------------------------------------------- */

static void bytes_rank(struct comm *c, struct store *st, int rank, int n, void *arg)
{
    (void)st;
    (void)arg;
    struct plait_error err;
    size_t count = (size_t)1 << 20;
    float *in = calloc(count * (size_t)n, sizeof(float)), *out = calloc(count * (size_t)n, 4);
    comm_stats(c, &sh->stats[rank][0]);
    CHECK(comm_allreduce(c, in, out, count, COMM_FLOAT32, COMM_SUM, &err) == 0, "%s", err.text);
    comm_stats(c, &sh->stats[rank][1]);
    CHECK(comm_reduce_scatter(c, in, out, count, COMM_FLOAT32, COMM_SUM, &err) == 0, "%s",
          err.text);
    comm_stats(c, &sh->stats[rank][2]);
    CHECK(comm_allgather(c, in, out, count, COMM_FLOAT32, &err) == 0, "%s", err.text);
    comm_stats(c, &sh->stats[rank][3]);
    free(in);
    free(out);
}

/* Ring all-reduce sends 2(N-1)/N of the buffer from each rank; reduce-scatter
 * and all-gather (N-1)/N of the whole. The payload must match exactly (for
 * an all-reduce, the N-1 chunks a rank forwards, chunks differing by an
 * element when N does not divide the count); on the wire, frame headers (40
 * bytes per fragment of 32..256 KiB) and padding may add at most 1%. */
static void test_bytes_sent_match_ring_formulas(void)
{
    static const int ns[] = {2, 3, 4, 8};
    for (int t = 0; t < 4; t++) {
        int n = ns[t];
        double bytes = 4.0 * (1 << 20);
        struct world_opts o = {.n = n, .absent_rank = -1, .name = "bytes"};
        run_world(&o, bytes_rank, NULL);
        for (int r = 0; r < n; r++) {
            struct comm_stats *s = sh->stats[r];
            double want[3] = {2.0 * (n - 1) / n * bytes, (n - 1) * bytes, (n - 1) * bytes};
            const char *what[3] = {"all-reduce", "reduce-scatter", "all-gather"};
            for (int k = 0; k < 3; k++) {
                double payload = (double)(s[k + 1].payload_bytes_sent - s[k].payload_bytes_sent);
                double wire = (double)(s[k + 1].bytes_sent - s[k].bytes_sent);
                double slack = k == 0 ? 8.0 * (n - 1) : 0; /* uneven chunks: 1 element each */
                CHECK(fabs(payload - want[k]) <= slack, "n=%d rank %d %s: payload %.0f, want %.0f",
                      n, r, what[k], payload, want[k]);
                CHECK(wire >= payload && wire <= payload * 1.01,
                      "n=%d rank %d %s: wire %.0f vs %.0f", n, r, what[k], wire, payload);
            }
            /* a faster peer's next operation may arrive before a snapshot: compare
               everything since the communicator was made */
            double sent = (double)s[3].bytes_sent, got = (double)s[3].bytes_received;
            CHECK(fabs(got - sent) <= 0.01 * sent, "n=%d rank %d: received %.0f, sent %.0f", n, r,
                  got, sent);
            CHECK(s[3].operations == 3, "operations %llu", (unsigned long long)s[3].operations);
            CHECK(s[3].wait_s > 0, "wait time counted");
        }
    }
}

/* ---- overlap --------------------------------------------------------------- */

static double busy_until(double end)
{
    volatile double x = 1;
    while (now_s() < end)
        for (int i = 0; i < 1000; i++) x = x * 1.0000001 + 1e-9;
    return x;
}

/* An all-reduce posted before a busy loop proceeds during it: the progress
 * thread moves its bytes while the caller computes, so compute + wait takes
 * about as long as the longer of the two, not their sum. (With two ranks on
 * two cores the busy loops take the CPUs the progress threads need, so the
 * all-reduce takes longer than alone: the loop lasts five times as long, and
 * a machine busy with other work gets three tries.) */
static void overlap_rank(struct comm *c, struct store *st, int rank, int n, void *arg)
{
    (void)st;
    (void)n;
    (void)arg;
    struct plait_error err;
    size_t count = (size_t)4 << 20;
    float *x = calloc(count, sizeof(float));
    CHECK(comm_allreduce(c, x, x, count, COMM_FLOAT32, COMM_SUM, &err) == 0, "%s", err.text);
    double t0 = now_s();
    for (int i = 0; i < 3; i++)
        CHECK(comm_allreduce(c, x, x, count, COMM_FLOAT32, COMM_SUM, &err) == 0, "%s", err.text);
    double comm_s = (now_s() - t0) / 3;
    /* agree on one busy time: 3 times the slower rank's all-reduce */
    double busy = comm_s;
    CHECK(comm_allreduce(c, &busy, &busy, 1, COMM_FLOAT64, COMM_MAX, &err) == 0, "%s", err.text);
    busy *= 5;
    struct comm_request *req;
    t0 = now_s();
    CHECK(comm_iallreduce(c, x, x, count, COMM_FLOAT32, COMM_SUM, &req, &err) == 0, "%s", err.text);
    busy_until(t0 + busy);
    bool done = false;
    CHECK(comm_test(req, &done, &err) == 0, "%s", err.text);
    if (!done) CHECK(comm_wait(req, &err) == 0, "%s", err.text);
    double total = now_s() - t0;
    sh->t[rank][0] = comm_s;
    sh->t[rank][1] = busy;
    sh->t[rank][2] = total;
    sh->flag[rank] = done;
    free(x);
}

static bool overlapped(void)
{
    bool ok = true;
    for (int r = 0; r < 2; r++) ok &= sh->t[r][2] < sh->t[r][1] + 0.5 * sh->t[r][0];
    return ok;
}

static void test_async_allreduce_overlaps_a_busy_loop(void)
{
    struct world_opts o = {.n = 2, .absent_rank = -1, .name = "overlap"};
    for (int attempt = 0; attempt < 3; attempt++) {
        run_world(&o, overlap_rank, NULL);
        if (overlapped()) break;
        printf("  attempt %d: rank 0 %.1f ms, rank 1 %.1f ms for a %.1f ms loop; again\n",
               attempt + 1, sh->t[0][2] * 1e3, sh->t[1][2] * 1e3, sh->t[0][1] * 1e3);
    }
    for (int r = 0; r < 2; r++) {
        double comm_s = sh->t[r][0], busy = sh->t[r][1], total = sh->t[r][2];
        printf("  rank %d: all-reduce %.1f ms alone, busy loop %.1f ms, both %.1f ms (sum %.1f); "
               "done %s the loop\n",
               r, comm_s * 1e3, busy * 1e3, total * 1e3, (comm_s + busy) * 1e3,
               sh->flag[r] ? "within" : "just after");
        CHECK(total < busy + 0.5 * comm_s, "rank %d: %.1f ms is not about max(%.1f, %.1f)", r,
              total * 1e3, busy * 1e3, comm_s * 1e3);
    }
}

/* ---- failure ----------------------------------------------------------------- */

/* Rank `victim` is killed (SIGKILL, by the parent) during a stream of large
 * all-reduces; every other rank must fail naming it within timeout_s. */
static void kill_rank(struct comm *c, struct store *st, int rank, int n, void *arg)
{
    (void)st;
    (void)n;
    (void)arg;
    struct plait_error err;
    size_t count = (size_t)4 << 20;
    float *x = calloc(count, sizeof(float));
    for (int i = 0; i < 1000; i++) {
        atomic_store(&sh->flag[rank], i + 1);
        if (comm_allreduce(c, x, x, count, COMM_FLOAT32, COMM_SUM, &err) != 0) {
            sh->t[rank][0] = now_s();
            snprintf(sh->text[rank], sizeof sh->text[rank], "%s", err.text);
            sh->peer_lost[rank] = err.peer_lost;
            /* later operations fail at once, with the same text */
            double t0 = now_s();
            CHECK(comm_barrier(c, &err) != 0 && now_s() - t0 < 0.5,
                  "a later barrier fails at once");
            break;
        }
    }
    free(x);
}

static void killed_rank_case(int n, int victim, enum comm_transport tr, double timeout_s)
{
    struct world w;
    struct world_opts o = {
        .n = n, .absent_rank = -1, .timeout_s = timeout_s, .transport = tr, .name = "kill"};
    world_start(&w, &o, kill_rank, NULL);
    /* wait until everyone is a few all-reduces in, then kill the victim mid-stream */
    double t0 = now_s();
    for (bool ready = false; !ready && now_s() - t0 < 20; sleep_s(0.001)) {
        ready = true;
        for (int r = 0; r < n; r++) ready &= atomic_load(&sh->flag[r]) >= 3;
    }
    sleep_s(0.003);
    sh->kill_time = now_s();
    kill(w.pid[victim], SIGKILL);
    int status[MAX_RANKS];
    int ok = world_wait(&w, status);
    CHECK(ok == n - 1, "%d ranks passed", ok);
    char name[32];
    snprintf(name, sizeof name, "rank %d (", victim);
    for (int r = 0; r < n; r++) {
        if (r == victim) continue;
        double after = sh->t[r][0] - sh->kill_time;
        CHECK(sh->t[r][0] > 0 && after < timeout_s, "rank %d failed %.2f s after the kill", r,
              after);
        CHECK(strstr(sh->text[r], name) != NULL, "rank %d's error does not name rank %d: %s", r,
              victim, sh->text[r]);
        CHECK(sh->peer_lost[r], "rank %d's error is not marked peer_lost: %s", r, sh->text[r]);
    }
    printf("  n=%d %s: rank 0 after %.3f s: %s\n", n, tr == COMM_TRANSPORT_TCP ? "tcp" : "shm",
           sh->t[victim ? 0 : 1][0] - sh->kill_time, sh->text[victim ? 0 : 1]);
}

static void test_killed_rank_fails_the_others_naming_it(void)
{
    killed_rank_case(4, 2, COMM_TRANSPORT_AUTO, 3);
    killed_rank_case(3, 0, COMM_TRANSPORT_TCP, 3);
}

static void never_called(struct comm *c, struct store *st, int rank, int n, void *arg)
{
    (void)c, (void)st, (void)n, (void)arg;
    CHECK(0, "rank %d joined a world that should not form", rank);
}

static void test_rank_that_never_joins_is_named_at_the_deadline(void)
{
    struct world w;
    double timeout = 1.5;
    struct world_opts o = {
        .n = 3, .absent_rank = 2, .timeout_s = timeout, .init_may_fail = true, .name = "absent"};
    world_start(&w, &o, never_called, NULL);
    CHECK(world_wait(&w, NULL) == 3, "every rank exits cleanly");
    for (int r = 0; r < 2; r++) {
        CHECK(sh->t[r][0] >= timeout - 0.1 && sh->t[r][0] < timeout + 2,
              "rank %d gave up after %.2f s", r, sh->t[r][0]);
        CHECK(strstr(sh->text[r], "rank 2 did not join") != NULL, "rank %d: %s", r, sh->text[r]);
        CHECK(sh->peer_lost[r], "rank %d's error is not marked peer_lost", r);
    }
    printf("  %s\n", sh->text[0]);
}

/* Someone who knows where rank 0 listens, but not the secret. */
static int stranger_connect(const struct sock_endpoint *e, bool unix_socket)
{
    int fd;
    if (unix_socket) {
        struct sockaddr_un un = {.sun_family = AF_UNIX};
        size_t n = strlen(e->unix_name);
        memcpy(un.sun_path + 1, e->unix_name, n);
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (connect(fd, (struct sockaddr *)&un,
                    (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n)) != 0) {
            close(fd);
            return -1;
        }
    } else { /* where it listens: the address it published, and only there */
        char port[16];
        snprintf(port, sizeof port, "%d", e->port);
        struct addrinfo hints = {.ai_socktype = SOCK_STREAM,
                                 .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV},
                        *ai = NULL;
        if (getaddrinfo(e->host, port, &hints, &ai) != 0) return -1;
        fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
        freeaddrinfo(ai);
        if (rc != 0) {
            close(fd);
            return -1;
        }
    }
    struct timeval tv = {3, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

/* Plays the connector's side with a wrong secret: true if rank 0 hung up
 * instead of acknowledging. */
static bool stranger_is_refused(const struct sock_endpoint *e, bool unix_socket, bool garbage)
{
    int fd = stranger_connect(e, unix_socket);
    if (fd < 0) return false;
    uint8_t hello[56] = "PLCM", buf[64];
    if (garbage) {
        if (getrandom(hello, sizeof hello, 0) != (ssize_t)sizeof hello) return false;
    } else {
        hello[4] = 1;
        hello[8] = 1;                    /* from rank 1 */
        hello[16] = unix_socket ? 1 : 0; /* kind */
        if (getrandom(hello + 24, 32, 0) != 32) return false;
    }
    bool refused = false;
    if (write(fd, hello, sizeof hello) == (ssize_t)sizeof hello) {
        ssize_t k = read(fd, buf, 64); /* the challenge, or a hang-up */
        if (k <= 0) {
            refused = true;
        } else {
            uint8_t proof[32];
            sha256_hmac("not-the-secret", 14, buf, 32, proof);
            if (write(fd, proof, sizeof proof) == (ssize_t)sizeof proof) {
                k = read(fd, buf, 8);
                refused = k <= 0; /* no "PLOK" */
            }
        }
    }
    close(fd);
    return refused;
}

static void late_rank(struct comm *c, struct store *st, int rank, int n, void *arg)
{
    (void)st, (void)arg;
    struct plait_error err;
    float v = (float)rank + 1;
    CHECK(comm_allreduce(c, &v, &v, 1, COMM_FLOAT32, COMM_SUM, &err) == 0 &&
              v == (float)(n * (n + 1) / 2),
          "the world works after strangers knocked: %s", err.text);
    comm_stats(c, &sh->stats[rank][0]);
}

struct stranger {
    pthread_t thread;
    const struct sock_endpoint *e;
    bool unix_socket, garbage, refused;
};

static void *stranger_main(void *arg)
{
    struct stranger *s = arg;
    s->refused = stranger_is_refused(s->e, s->unix_socket, s->garbage);
    return NULL;
}

/* Rank 1 joins only after the strangers are done, so rank 0 waits with its
 * listeners open while strangers that read its address from the store knock,
 * all at once (a pipe holds rank 1 back: no race with a loaded machine). */
static void strangers_case(enum comm_transport tr)
{
    struct plait_error err;
    memset(sh, 0, sizeof *sh);
    struct world_opts o = {
        .n = 2, .absent_rank = -1, .timeout_s = 10, .transport = tr, .name = "guarded"};
    fflush(stdout);
    int hold[2];
    if (pipe(hold) != 0) {
        CHECK(0, "pipe");
        return;
    }
    pid_t pid[2];
    for (int r = 0; r < 2; r++) {
        pid[r] = fork();
        if (pid[r] == 0) {
            close(hold[1]);
            char go;
            if (r == 1 && read(hold[0], &go, 1) != 1) _exit(2);
            close(hold[0]);
            child(&o, r, late_rank, NULL);
        }
    }
    close(hold[0]);
    struct store_server *srv = serve();
    int port = atomic_load(&sh->port);
    struct store *st = NULL;
    CHECK(store_connect(&st, "127.0.0.1", port, SECRET, 99, 5, &err) == 0, "%s", err.text);
    void *value = NULL;
    size_t bytes;
    struct sock_endpoint e;
    CHECK(store_get(st, "comm/guarded/addr/0", &value, &bytes, 5, &err) == 0, "%s", err.text);
    CHECK(value && sock_endpoint_parse(value, &e) == 0, "endpoint %s", (char *)value);
    free(value);
    bool shm = tr == COMM_TRANSPORT_AUTO;
    struct stranger s[3] = {{.e = &e, .unix_socket = shm},
                            {.e = &e, .unix_socket = shm, .garbage = true},
                            {.e = &e, .unix_socket = false}};
    int count = shm ? 3 : 2;
    for (int i = 0; i < count; i++) pthread_create(&s[i].thread, NULL, stranger_main, &s[i]);
    for (int i = 0; i < count; i++) {
        pthread_join(s[i].thread, NULL);
        CHECK(s[i].refused, "%s stranger %d (%s) was not refused", shm ? "shm" : "tcp", i,
              s[i].garbage ? "garbage" : "a wrong proof");
    }
    /* let rank 1 join now; rank 0 has seen every stranger by the time the mesh is up */
    if (write(hold[1], "g", 1) != 1) CHECK(0, "releasing rank 1");
    close(hold[1]);
    int status[2];
    for (int r = 0; r < 2; r++)
        CHECK(waitpid(pid[r], &status[r], 0) == pid[r] && WIFEXITED(status[r]) &&
                  WEXITSTATUS(status[r]) == 0,
              "rank %d", r);
    CHECK(sh->stats[0][0].connections_refused == (uint64_t)count, "rank 0 refused %llu, not %d",
          (unsigned long long)sh->stats[0][0].connections_refused, count);
    /* once the mesh is up the listeners are gone */
    int fd = stranger_connect(&e, false);
    CHECK(fd < 0, "the TCP listener closed after set-up");
    if (fd >= 0) close(fd);
    store_close(st);
    store_server_stop(srv);
}

static void test_connection_without_the_secret_is_refused(void)
{
    strangers_case(COMM_TRANSPORT_TCP);
    strangers_case(COMM_TRANSPORT_AUTO);
}

/* A rank blocked in a receive learns at once that the job was aborted
 * elsewhere (here: by another rank, through the store). */
static void abort_rank(struct comm *c, struct store *st, int rank, int n, void *arg)
{
    (void)n, (void)arg;
    struct plait_error err;
    if (rank == 1) {
        sleep_s(0.3);
        sh->kill_time = now_s();
        CHECK(store_abort(st, "rank 1: the optimizer found a NaN", &err) == 0, "%s", err.text);
        return;
    }
    float x;
    CHECK(comm_recv(c, &x, sizeof x, 1, 0, &err) != 0, "the receive fails");
    sh->t[rank][0] = now_s();
    snprintf(sh->text[rank], sizeof sh->text[rank], "%s", err.text);
    sh->peer_lost[rank] = err.peer_lost;
}

static void test_job_abort_fails_blocked_operations_at_once(void)
{
    struct world_opts o = {.n = 2, .absent_rank = -1, .timeout_s = 20, .name = "abort"};
    run_world(&o, abort_rank, NULL);
    double after = sh->t[0][0] - sh->kill_time;
    CHECK(after >= 0 && after < 1.0, "rank 0 heard of the abort after %.2f s", after);
    CHECK(strstr(sh->text[0], "aborted") && strstr(sh->text[0], "found a NaN"), "%s", sh->text[0]);
    CHECK(sh->peer_lost[0], "the abort is not marked peer_lost");
}

/* ---- requests never waited for ------------------------------------------------ */

/* Requests the caller never reaps are freed with their communicator (comm.h's
 * comm_destroy; each rank's LeakSanitizer check, under ASan): done ones
 * (a collective, a send, a receive), failed ones (rank 0's, once rank 1
 * leaves) and one in flight (rank 1's receive); requests waited for before
 * destroy work as ever. */
static void unreaped_rank(struct comm *c, struct store *st, int rank, int n, void *arg)
{
    (void)st, (void)n, (void)arg;
    struct plait_error err;
    int peer = 1 - rank;
    double sum_a = rank + 1, sum_w = 10 * (rank + 1), sent[2] = {rank, rank + 0.5}, got[2];
    float stray;
    struct comm_request *coll_a, *send_a, *recv_a, *w, *send_b, *recv_b, *left;
    CHECK(comm_iallreduce(c, &sum_a, &sum_a, 1, COMM_FLOAT64, COMM_SUM, &coll_a, &err) == 0 &&
              comm_isend(c, &sent[0], sizeof(double), peer, 1, &send_a, &err) == 0 &&
              comm_irecv(c, &got[0], sizeof(double), peer, 1, &recv_a, &err) == 0,
          "%s", err.text);
    /* collectives complete in order, sends and receives to one peer too: once
     * these are waited for, the first three are done, never reaped */
    CHECK(comm_iallreduce(c, &sum_w, &sum_w, 1, COMM_FLOAT64, COMM_SUM, &w, &err) == 0 &&
              comm_wait(w, &err) == 0 && sum_w == 30,
          "a waited all-reduce: %g (%s)", sum_w, err.text);
    CHECK(comm_isend(c, &sent[1], sizeof(double), peer, 1, &send_b, &err) == 0 &&
              comm_irecv(c, &got[1], sizeof(double), peer, 1, &recv_b, &err) == 0 &&
              comm_wait(send_b, &err) == 0 && comm_wait(recv_b, &err) == 0,
          "%s", err.text);
    CHECK(sum_a == 3 && got[0] == peer && got[1] == peer + 0.5,
          "the unreaped requests did their work: %g %g %g", sum_a, got[0], got[1]);
    if (rank == 1) { /* leaves with a receive in flight (rank 0 never sends tag 2) */
        CHECK(comm_irecv(c, &stray, sizeof stray, peer, 2, &left, &err) == 0, "%s", err.text);
        return;
    }
    /* rank 0: two requests that fail as rank 1 leaves, found out by a third */
    CHECK(comm_irecv(c, &stray, sizeof stray, peer, 3, &left, &err) == 0 &&
              comm_iallreduce(c, &sum_a, &sum_a, 1, COMM_FLOAT64, COMM_SUM, &w, &err) == 0,
          "%s", err.text);
    CHECK(comm_recv(c, &stray, sizeof stray, peer, 3, &err) != 0 && err.peer_lost,
          "a receive from a rank that left: %s", err.text);
}

static void test_requests_never_waited_for_are_freed_with_their_communicator(void)
{
    struct world_opts tcp = {
        .n = 2, .absent_rank = -1, .transport = COMM_TRANSPORT_TCP, .name = "unreaped"};
    run_world(&tcp, unreaped_rank, NULL);
    struct world_opts shm = {.n = 2, .absent_rank = -1, .name = "unreaped-shm"};
    run_world(&shm, unreaped_rank, NULL);
}

/* ---- arguments ----------------------------------------------------------------- */

static void args_rank(struct comm *c, struct store *st, int rank, int n, void *arg)
{
    (void)st, (void)rank, (void)n, (void)arg;
    struct plait_error err;
    float x[4] = {1, 2, 3, 4};
    CHECK(comm_send(c, x, 4, 0, 0, &err) != 0 && strstr(err.text, "itself"), "%s", err.text);
    CHECK(!err.peer_lost, "a bad argument is this rank's own error, not a lost peer");
    CHECK(comm_send(c, x, 4, 3, 0, &err) != 0 && strstr(err.text, "peer 3"), "%s", err.text);
    CHECK(comm_broadcast(c, x, 1, COMM_FLOAT32, 1, &err) != 0 && strstr(err.text, "root"), "%s",
          err.text);
    CHECK(comm_allreduce(c, x, x, 4, COMM_FLOAT32, (enum comm_reduce_op)9, &err) != 0, "op");
    CHECK(comm_allreduce(c, x, x, 4, COMM_FLOAT32, COMM_SUM, &err) == 0 && x[3] == 4, "n=1");
    float y[4];
    CHECK(comm_allgather(c, x, y, 4, COMM_FLOAT32, &err) == 0 && !memcmp(x, y, sizeof x), "ag");
    CHECK(comm_reduce_scatter(c, x, y, 4, COMM_FLOAT32, COMM_SUM, &err) == 0 && y[2] == 3, "rs");
    size_t one[1] = {4}, other[1] = {3};
    CHECK(comm_alltoall_v(c, x, one, y, one, COMM_FLOAT32, &err) == 0 && !memcmp(x, y, sizeof x),
          "a2a");
    CHECK(comm_alltoall_v(c, x, one, y, other, COMM_FLOAT32, &err) != 0 &&
              strstr(err.text, "sends itself 4 elements but expects 3"),
          "%s", err.text);
    CHECK(comm_alltoall_v(c, x, one, x, one, COMM_FLOAT32, &err) != 0 &&
              strstr(err.text, "overlap"),
          "%s", err.text);
    CHECK(comm_barrier(c, &err) == 0, "%s", err.text);
    CHECK(comm_group_start(c, &err) == 0 && comm_group_end(c, &err) == 0, "%s", err.text);
    struct comm *sub;
    CHECK(comm_split(c, 0, 0, "bad/name", &sub, &err) != 0, "a name with a slash");
    /* without NCCL in the build, or without a GPU, nccl is refused saying
     * why (test_comm_nccl); with both, a world of one works (tests/gpu) */
    struct comm_options o = {.timeout_s = 30, .secret = SECRET, .backend = COMM_BACKEND_NCCL};
    if (comm_world_init(&sub, st, 0, 1, &o, &err) == 0)
        comm_destroy(sub);
    else
        CHECK(strstr(err.text, "nccl") || strstr(err.text, "CUDA"), "%s", err.text);
}

static void test_bad_arguments_are_errors_not_crashes(void)
{
    struct world_opts o = {.n = 1, .absent_rank = -1, .name = "args"};
    run_world(&o, args_rank, NULL);
}

static const char *only; /* test_comm NAME: only the cases whose name contains NAME */

#undef RUN
#define RUN(fn) (!only || strstr(#fn, only) ? check_run(#fn, fn) : (void)0)

int main(int argc, char **argv)
{
    only = argc > 1 ? argv[1] : NULL;
    signal(SIGPIPE, SIG_IGN);
    sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) return 1;
    double t0 = now_s();
    RUN(test_bad_arguments_are_errors_not_crashes);
    RUN(test_allreduce_sum_and_max_match_double_reference);
    RUN(test_allreduce_every_algorithm_and_transport);
    RUN(test_allreduce_float64_and_int64);
    RUN(test_reduce_scatter_and_allgather_match_reference);
    RUN(test_uneven_reduce_scatter_matches_reference);
    RUN(test_uneven_allgather_matches_every_block);
    RUN(test_uneven_bf16_allgather_matches_every_block);
    RUN(test_uneven_alltoall_delivers_every_block);
    RUN(test_broadcast_from_every_root);
    RUN(test_barrier_waits_for_the_last_rank);
    RUN(test_send_recv_rings_and_pipelines);
    RUN(test_split_into_tp_pp_dp_groups_reducing_concurrently);
    RUN(test_results_bitwise_identical_on_all_ranks_and_across_runs);
    RUN(test_bytes_sent_match_ring_formulas);
    RUN(test_async_allreduce_overlaps_a_busy_loop);
    RUN(test_killed_rank_fails_the_others_naming_it);
    RUN(test_rank_that_never_joins_is_named_at_the_deadline);
    RUN(test_connection_without_the_secret_is_refused);
    RUN(test_job_abort_fails_blocked_operations_at_once);
    RUN(test_requests_never_waited_for_are_freed_with_their_communicator);
    printf("# %.1f s\n", now_s() - t0);
    return check_exit_code();
}
