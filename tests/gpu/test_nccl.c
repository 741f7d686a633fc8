/* test_nccl.c — the nccl collective backend on real GPUs: forks one rank per
 * GPU (NCCL takes one device per rank) that meet through a store server in
 * the parent, and checks every collective on device buffers against sums
 * computed on the host, splits, asynchronous requests, host buffers (staged),
 * byte counts, operations ordered after a compute stream's work, and that
 * nothing hangs: a rank that never joins is named at
 * the deadline, an operation one rank skips fails the others at theirs, a
 * rank whose process ends is named by the others. With
 * one GPU, the cases that need a peer are skipped (and said so). Not part of
 * make test: tests/gpu/run.sh, on a GPU machine. */
#include <cuda_runtime.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../unit/check.h"
#include "common/store/store.h"
#include "runtime/comm/comm.h"

#define SECRET "nccl-gpu-test-secret-0123456789abcdef"
#define MAX_RANKS 8
#define WORLD_LIMIT_S 120 /* a world still running then is killed: a hang */

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
    _Atomic int port;
    double seconds[MAX_RANKS];
    char text[MAX_RANKS][1024];
    _Atomic int done[MAX_RANKS];
};
static struct shared *sh;

typedef void (*rank_fn)(struct comm *c, int rank, int n);

struct world_opts {
    const char *name;
    int n;
    int absent_rank;    /* never joins (-1: none) */
    double timeout_s;   /* 0: 30 */
    bool init_may_fail; /* the case checks the failure itself */
    bool compute;       /* the world gets a compute stream (comm_options.stream) */
};

static cudaStream_t compute_stream; /* the rank's, when its world has one */

/* ---- device buffers --------------------------------------------------------- */

#define CUDA_OK(call)                                                                              \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            printf("  %s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));        \
            fflush(stdout);                                                                        \
            _exit(3);                                                                              \
        }                                                                                          \
    } while (0)

static void *dev_alloc(size_t bytes)
{
    void *p = NULL;
    CUDA_OK(cudaMalloc(&p, bytes ? bytes : 1));
    return p;
}

static void to_dev(void *dev, const void *host, size_t bytes)
{
    CUDA_OK(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice));
}

static void to_host(void *host, const void *dev, size_t bytes)
{
    CUDA_OK(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost));
}

/* The value rank r puts at element i: small integers, so float sums are exact. */
static double value_at(int r, size_t i)
{
    return (double)((int64_t)((i * 7 + (size_t)r * 13) % 101) - 50);
}

/* ---- the world ------------------------------------------------------------ */

static int wait_port(void)
{
    for (double t0 = now_s(); now_s() - t0 < 10; sleep_s(0.001))
        if (atomic_load(&sh->port)) return atomic_load(&sh->port);
    return 0;
}

static void child(const struct world_opts *o, int rank, rank_fn fn)
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
    if (rank == o->absent_rank) { /* stays away until the others are done */
        for (double t0 = now_s(); now_s() - t0 < WORLD_LIMIT_S; sleep_s(0.01)) {
            int done = 0;
            for (int r = 0; r < o->n; r++) done += atomic_load(&sh->done[r]);
            if (done >= o->n - 1) break;
        }
        store_close(st);
        _exit(0);
    }
    CUDA_OK(cudaSetDevice(rank)); /* what the runtime does with PLAIT_DEVICE */
    if (o->compute) CUDA_OK(cudaStreamCreateWithFlags(&compute_stream, cudaStreamNonBlocking));
    struct comm_options opts = {.backend = COMM_BACKEND_NCCL,
                                .timeout_s = o->timeout_s > 0 ? o->timeout_s : 30,
                                .secret = SECRET,
                                .name = o->name,
                                .stream = o->compute ? compute_stream : NULL};
    struct comm *c = NULL;
    double t0 = now_s();
    if (comm_world_init(&c, st, rank, o->n, &opts, &err)) {
        sh->seconds[rank] = now_s() - t0;
        snprintf(sh->text[rank], sizeof sh->text[rank], "%s", err.text);
        if (!o->init_may_fail) CHECK(0, "rank %d: %s", rank, err.text);
    } else {
        CHECK(comm_rank(c) == rank && comm_size(c) == o->n, "rank %d of %d", comm_rank(c),
              comm_size(c));
        fn(c, rank, o->n);
        comm_destroy(c);
    }
    atomic_store(&sh->done[rank], 1);
    store_close(st);
    fflush(stdout);
    _exit(check_failures ? 1 : 0);
}

/* Runs fn on n ranks, one per GPU; returns how many exited cleanly. Kills a
 * world that hangs (and fails the case). */
static int run_world(const struct world_opts *o, rank_fn fn)
{
    memset(sh, 0, sizeof *sh);
    pid_t pid[MAX_RANKS];
    fflush(stdout);
    for (int r = 0; r < o->n; r++) {
        pid[r] = fork();
        if (pid[r] == 0) child(o, r, fn);
        CHECK(pid[r] > 0, "fork: %s", strerror(errno));
    }
    struct plait_error err;
    struct store_server *srv = NULL;
    if (store_server_start(&srv, "127.0.0.1", 0, SECRET, &err))
        CHECK(0, "store server: %s", err.text);
    else
        atomic_store(&sh->port, store_server_port(srv));
    int ok = 0, left = o->n;
    bool done[MAX_RANKS] = {false};
    for (double t0 = now_s(); left > 0; sleep_s(0.005)) {
        for (int r = 0; r < o->n; r++) {
            int status;
            if (done[r] || waitpid(pid[r], &status, WNOHANG) != pid[r]) continue;
            done[r] = true;
            left--;
            if (WIFEXITED(status) && WEXITSTATUS(status) == 0) ok++;
        }
        if (left > 0 && now_s() - t0 > WORLD_LIMIT_S) {
            CHECK(0, "world '%s' of %d ranks hung; killing it", o->name, o->n);
            for (int r = 0; r < o->n; r++)
                if (!done[r]) kill(pid[r], SIGKILL);
            t0 = now_s() + 1e9;
        }
    }
    store_server_stop(srv);
    return ok;
}

static void run_all(const struct world_opts *o, rank_fn fn)
{
    int ok = run_world(o, fn);
    CHECK(ok == o->n, "%d of %d ranks passed (%s)", ok, o->n, o->name);
}

/* ---- cases ------------------------------------------------------------------- */

static int gpus; /* probed in a child: CUDA in the parent would not survive fork */

/* sum (and max) over ranks of value_at, for every dtype, odd sizes included */
static void allreduce_rank(struct comm *c, int rank, int n)
{
    struct plait_error err;
    static const size_t counts[] = {1, 1001, (size_t)1 << 20};
    for (int k = 0; k < 3; k++) {
        size_t count = counts[k];
        float *h = malloc(count * sizeof *h), *got = malloc(count * sizeof *got);
        double *hd = malloc(count * sizeof *hd);
        int64_t *hi = malloc(count * sizeof *hi);
        for (size_t i = 0; i < count; i++) {
            h[i] = (float)value_at(rank, i);
            hd[i] = value_at(rank, i) / 4;
            hi[i] = (int64_t)value_at(rank, i) << 33;
        }
        float *d = dev_alloc(count * sizeof *d), *dout = dev_alloc(count * sizeof *dout);
        to_dev(d, h, count * sizeof *h);
        CHECK(comm_allreduce(c, d, dout, count, COMM_FLOAT32, COMM_SUM, &err) == 0, "%s", err.text);
        to_host(got, dout, count * sizeof *got);
        size_t bad = 0;
        for (size_t i = 0; i < count; i++) {
            double want = 0;
            for (int r = 0; r < n; r++) want += value_at(r, i);
            bad += got[i] != (float)want;
        }
        CHECK(bad == 0, "f32 sum of %zu: %zu wrong", count, bad);
        CHECK(comm_allreduce(c, d, d, count, COMM_FLOAT32, COMM_MAX, &err) == 0, "%s", err.text);
        to_host(got, d, count * sizeof *got);
        bad = 0;
        for (size_t i = 0; i < count; i++) {
            double want = -1e9;
            for (int r = 0; r < n; r++) want = fmax(want, value_at(r, i));
            bad += got[i] != (float)want;
        }
        CHECK(bad == 0, "f32 max in place of %zu: %zu wrong", count, bad);
        double *dd = dev_alloc(count * sizeof *dd);
        to_dev(dd, hd, count * sizeof *hd);
        CHECK(comm_allreduce(c, dd, dd, count, COMM_FLOAT64, COMM_SUM, &err) == 0, "%s", err.text);
        to_host(hd, dd, count * sizeof *hd);
        int64_t *di = dev_alloc(count * sizeof *di);
        to_dev(di, hi, count * sizeof *hi);
        CHECK(comm_allreduce(c, di, di, count, COMM_INT64, COMM_SUM, &err) == 0, "%s", err.text);
        to_host(hi, di, count * sizeof *hi);
        bad = 0;
        for (size_t i = 0; i < count; i++) {
            double want = 0;
            int64_t want_i = 0;
            for (int r = 0; r < n; r++) {
                want += value_at(r, i) / 4;
                want_i += (int64_t)value_at(r, i) << 33;
            }
            bad += hd[i] != want || hi[i] != want_i;
        }
        CHECK(bad == 0, "f64/i64 sums of %zu: %zu wrong", count, bad);
        cudaFree(d);
        cudaFree(dout);
        cudaFree(dd);
        cudaFree(di);
        free(h);
        free(got);
        free(hd);
        free(hi);
    }
}

static void test_allreduce_sum_and_max_of_every_dtype_match_host_sums(void)
{
    run_all(&(struct world_opts){.name = "allreduce", .n = gpus, .absent_rank = -1},
            allreduce_rank);
}

/* reduce-scatter: block `rank` of the sum; all-gather, also in place */
static void scatter_gather_rank(struct comm *c, int rank, int n)
{
    struct plait_error err;
    size_t count = 4099, all = count * (size_t)n;
    float *h = malloc(all * sizeof *h), *got = malloc(all * sizeof *got);
    for (size_t i = 0; i < all; i++) h[i] = (float)value_at(rank, i);
    float *d = dev_alloc(all * sizeof *d), *block = dev_alloc(count * sizeof *block);
    to_dev(d, h, all * sizeof *h);
    CHECK(comm_reduce_scatter(c, d, block, count, COMM_FLOAT32, COMM_SUM, &err) == 0, "%s",
          err.text);
    to_host(got, block, count * sizeof *got);
    size_t bad = 0;
    for (size_t i = 0; i < count; i++) {
        double want = 0;
        for (int r = 0; r < n; r++) want += value_at(r, (size_t)rank * count + i);
        bad += got[i] != (float)want;
    }
    CHECK(bad == 0, "reduce-scatter: %zu wrong", bad);
    for (size_t i = 0; i < count; i++) h[i] = (float)(rank * 1000 + (int)(i % 997));
    for (int in_place = 0; in_place < 2; in_place++) {
        float *mine = in_place ? d + (size_t)rank * count : block;
        CUDA_OK(cudaMemset(d, 0, all * sizeof *d));
        to_dev(mine, h, count * sizeof *h);
        CHECK(comm_allgather(c, mine, d, count, COMM_FLOAT32, &err) == 0, "%s", err.text);
        to_host(got, d, all * sizeof *got);
        bad = 0;
        for (size_t i = 0; i < all; i++)
            bad += got[i] != (float)((int)(i / count) * 1000 + (int)(i % count % 997));
        CHECK(bad == 0, "all-gather%s: %zu wrong", in_place ? " in place" : "", bad);
    }
    cudaFree(d);
    cudaFree(block);
    free(h);
    free(got);
}

static void test_reduce_scatter_and_allgather_match_host_sums(void)
{
    run_all(&(struct world_opts){.name = "scatter", .n = gpus, .absent_rank = -1},
            scatter_gather_rank);
}

/* uneven all-to-all: rank s sends rank r (s + 2r) % 3 · 1001 elements (some
 * none), each block's values naming its sender and its place */
static size_t a2a_count(int from, int to)
{
    return (size_t)((from + 2 * to) % 3) * 1001;
}

static void alltoall_rank(struct comm *c, int rank, int n)
{
    struct plait_error err;
    size_t sc[64], rc[64], out_n = 0, in_n = 0;
    for (int r = 0; r < n; r++) {
        out_n += sc[r] = a2a_count(rank, r);
        in_n += rc[r] = a2a_count(r, rank);
    }
    float *h = malloc((out_n + 1) * sizeof *h), *got = malloc((in_n + 1) * sizeof *got);
    for (size_t i = 0; i < out_n; i++) h[i] = (float)(rank * 100000 + (int)i);
    float *d = dev_alloc((out_n + 1) * sizeof *d), *o = dev_alloc((in_n + 1) * sizeof *o);
    to_dev(d, h, (out_n + 1) * sizeof *h);
    CHECK(comm_alltoall_v(c, d, sc, o, rc, COMM_FLOAT32, &err) == 0, "%s", err.text);
    to_host(got, o, (in_n + 1) * sizeof *got);
    size_t bad = 0, at = 0;
    for (int r = 0; r < n; r++) {
        size_t from_at = 0;
        for (int q = 0; q < rank; q++) from_at += a2a_count(r, q);
        for (size_t i = 0; i < rc[r]; i++)
            bad += got[at + i] != (float)(r * 100000 + (int)(from_at + i));
        at += rc[r];
    }
    CHECK(bad == 0, "all-to-all: %zu wrong", bad);
    cudaFree(d);
    cudaFree(o);
    free(h);
    free(got);
}

static void test_uneven_alltoall_delivers_every_block(void)
{
    if (gpus > 64) return;
    run_all(&(struct world_opts){.name = "alltoall", .n = gpus, .absent_rank = -1},
            alltoall_rank);
}

/* broadcast from every root, barrier, send/recv around the ring, a grouped
 * exchange between partners */
static void broadcast_p2p_rank(struct comm *c, int rank, int n)
{
    struct plait_error err;
    size_t count = 70001;
    double *h = malloc(count * sizeof *h);
    double *d = dev_alloc(count * sizeof *d);
    for (int root = 0; root < n; root++) {
        for (size_t i = 0; i < count; i++) h[i] = rank == root ? value_at(root, i) : -1;
        to_dev(d, h, count * sizeof *h);
        CHECK(comm_broadcast(c, d, count, COMM_FLOAT64, root, &err) == 0, "%s", err.text);
        to_host(h, d, count * sizeof *h);
        size_t bad = 0;
        for (size_t i = 0; i < count; i++) bad += h[i] != value_at(root, i);
        CHECK(bad == 0, "broadcast from %d: %zu wrong", root, bad);
        CHECK(comm_barrier(c, &err) == 0, "%s", err.text);
    }
    if (n > 1) {
        /* a send completes when its receive runs (NCCL buffers nothing), and
         * both run in posting order: even ranks send first, odd ones receive */
        size_t bytes = 1 << 20;
        uint8_t *out = dev_alloc(bytes), *in = dev_alloc(bytes), *hb = malloc(bytes);
        memset(hb, rank + 1, bytes);
        to_dev(out, hb, bytes);
        int next = (rank + 1) % n, prev = (rank + n - 1) % n;
        struct comm_request *s = NULL, *r = NULL;
        if (rank % 2 == 0) {
            CHECK(comm_isend(c, out, bytes, next, 7, &s, &err) == 0, "%s", err.text);
            CHECK(comm_irecv(c, in, bytes, prev, 7, &r, &err) == 0, "%s", err.text);
        } else {
            CHECK(comm_irecv(c, in, bytes, prev, 7, &r, &err) == 0, "%s", err.text);
            CHECK(comm_isend(c, out, bytes, next, 7, &s, &err) == 0, "%s", err.text);
        }
        CHECK(comm_wait(s, &err) == 0, "%s", err.text);
        CHECK(comm_wait(r, &err) == 0, "%s", err.text);
        to_host(hb, in, bytes);
        size_t bad = 0;
        for (size_t i = 0; i < bytes; i++) bad += hb[i] != (uint8_t)(prev + 1);
        CHECK(bad == 0, "ring: %zu bytes wrong from rank %d", bad, prev);
        /* an exchange: both partners send first, which only a group allows */
        int partner = rank ^ 1;
        if (partner < n) {
            memset(hb, 100 + rank, bytes);
            to_dev(out, hb, bytes);
            CHECK(comm_group_start(c, &err) == 0, "%s", err.text);
            CHECK(comm_isend(c, out, bytes, partner, 8, &s, &err) == 0, "%s", err.text);
            CHECK(comm_irecv(c, in, bytes, partner, 8, &r, &err) == 0, "%s", err.text);
            CHECK(comm_group_end(c, &err) == 0, "%s", err.text);
            CHECK(comm_wait(s, &err) == 0, "%s", err.text);
            CHECK(comm_wait(r, &err) == 0, "%s", err.text);
            to_host(hb, in, bytes);
            bad = 0;
            for (size_t i = 0; i < bytes; i++) bad += hb[i] != (uint8_t)(100 + partner);
            CHECK(bad == 0, "grouped exchange: %zu bytes wrong from rank %d", bad, partner);
        }
        cudaFree(out);
        cudaFree(in);
        free(hb);
    }
    cudaFree(d);
    free(h);
}

static void test_broadcast_barrier_send_recv_and_a_grouped_exchange(void)
{
    run_all(&(struct world_opts){.name = "bcast", .n = gpus, .absent_rank = -1},
            broadcast_p2p_rank);
}

/* 3D groups (tp 2 where it divides), a split some ranks sit out, each group
 * reducing on its own communicator */
static void split_rank(struct comm *c, int rank, int n)
{
    struct plait_error err;
    int tp = n % 2 == 0 ? 2 : 1, dp = n / tp;
    struct comm *tpc = NULL, *ppc = NULL, *dpc = NULL;
    CHECK(comm_split_3d(c, tp, 1, dp, rank_coords_of(comm_rank(c), tp, dp), "g", &tpc, &ppc, &dpc,
                        &err) == 0,
          "%s", err.text);
    if (!tpc || !dpc || !ppc) return;
    float *d = dev_alloc(sizeof(float) * 2), h[2] = {(float)rank, 1};
    to_dev(d, h, sizeof h);
    CHECK(comm_allreduce(tpc, d, d, 2, COMM_FLOAT32, COMM_SUM, &err) == 0, "%s", err.text);
    to_host(h, d, sizeof h);
    int base = rank - rank % tp;
    CHECK(h[1] == (float)tp && h[0] == (float)(tp * base + tp * (tp - 1) / 2), "tp sum %g %g", h[0],
          h[1]);
    h[0] = (float)rank, h[1] = 1;
    to_dev(d, h, sizeof h);
    CHECK(comm_allreduce(dpc, d, d, 2, COMM_FLOAT32, COMM_SUM, &err) == 0, "%s", err.text);
    to_host(h, d, sizeof h);
    CHECK(h[1] == (float)dp, "dp size %g", h[1]);
    CHECK(comm_size(ppc) == 1, "pp of %d", comm_size(ppc));
    struct comm *some = NULL;
    CHECK(comm_split(c, rank == 0 ? COMM_SPLIT_NONE : 1, rank, "some", &some, &err) == 0, "%s",
          err.text);
    CHECK((rank == 0) == (some == NULL), "rank %d: joined %p", rank, (void *)some);
    if (some) {
        CHECK(comm_size(some) == n - 1 && comm_rank(some) == rank - 1, "rank %d of %d",
              comm_rank(some), comm_size(some));
        CHECK(comm_barrier(some, &err) == 0, "%s", err.text);
    }
    comm_destroy(some);
    comm_destroy(tpc);
    comm_destroy(ppc);
    comm_destroy(dpc);
    cudaFree(d);
}

static void test_split_3d_and_a_split_some_ranks_sit_out(void)
{
    run_all(&(struct world_opts){.name = "split", .n = gpus, .absent_rank = -1}, split_rank);
}

/* buckets in flight at once, tested then waited; host buffers staged; stats */
static void async_rank(struct comm *c, int rank, int n)
{
    struct plait_error err;
    enum { BUCKETS = 8 };
    size_t count = 1 << 18;
    float *d[BUCKETS], *h = malloc(count * sizeof *h);
    struct comm_request *req[BUCKETS];
    struct comm_stats s0, s1;
    comm_stats(c, &s0);
    for (int b = 0; b < BUCKETS; b++) {
        for (size_t i = 0; i < count; i++) h[i] = (float)(b + rank);
        d[b] = dev_alloc(count * sizeof *h);
        to_dev(d[b], h, count * sizeof *h);
        CHECK(comm_iallreduce(c, d[b], d[b], count, COMM_FLOAT32, COMM_SUM, &req[b], &err) == 0,
              "%s", err.text);
    }
    bool done = false;
    CHECK(comm_test(req[0], &done, &err) == 0, "%s", err.text);
    if (done) req[0] = NULL;
    for (int b = 0; b < BUCKETS; b++) {
        CHECK(comm_wait(req[b], &err) == 0, "%s", err.text);
        to_host(h, d[b], count * sizeof *h);
        float want = (float)(b * n + n * (n - 1) / 2);
        CHECK(h[0] == want && h[count - 1] == want, "bucket %d: %g, want %g", b, h[0], want);
        cudaFree(d[b]);
    }
    comm_stats(c, &s1);
    uint64_t want = BUCKETS * (2 * (uint64_t)(n - 1) * count * 4 / (uint64_t)n);
    CHECK(s1.payload_bytes_sent - s0.payload_bytes_sent == want &&
              s1.operations - s0.operations == BUCKETS,
          "payload %llu, want %llu",
          (unsigned long long)(s1.payload_bytes_sent - s0.payload_bytes_sent),
          (unsigned long long)want);
    /* host memory (what comm_split and flags agreed on use) goes through the device */
    int64_t flag[3] = {rank, 1, -rank}, sum[3];
    CHECK(comm_allreduce(c, flag, sum, 3, COMM_INT64, COMM_MAX, &err) == 0, "%s", err.text);
    CHECK(sum[0] == n - 1 && sum[1] == 1 && sum[2] == 0, "host max %lld %lld %lld",
          (long long)sum[0], (long long)sum[1], (long long)sum[2]);
    free(h);
}

static void test_async_buckets_host_buffers_and_byte_counts(void)
{
    run_all(&(struct world_opts){.name = "async", .n = gpus, .absent_rank = -1}, async_rank);
}

/* With a compute stream, an operation waits for what was enqueued there
 * before it was posted: each rank fills its buffer on the compute stream
 * behind a long copy (so the fill is still pending when the all-reduce is
 * posted, and an unordered all-reduce would sum the zeros before it) and
 * posts at once; the sum is of the filled values, in a split too. */
static void ordered_rank(struct comm *c, int rank, int n)
{
    struct plait_error err;
    size_t count = (size_t)1 << 20, big = (size_t)256 << 20; /* 8 MiB of int64; 256 MiB copied */
    int64_t *buf = dev_alloc(count * sizeof *buf), *host = malloc(count * sizeof *host);
    char *from = dev_alloc(big), *to = dev_alloc(big);
    CUDA_OK(cudaMemset(buf, 0, count * sizeof *buf));
    struct comm *split = NULL;
    CHECK(comm_split(c, 0, rank, "ordered.split", &split, &err) == 0, "split: %s", err.text);
    struct comm *on[2] = {c, split}; /* the split inherits the stream */
    for (int k = 0; k < 2 && on[k]; k++) {
        for (int i = 0; i < 4; i++)
            CUDA_OK(cudaMemcpyAsync(to, from, big, cudaMemcpyDeviceToDevice, compute_stream));
        CUDA_OK(cudaMemsetAsync(buf, k + 1, count * sizeof *buf, compute_stream)); /* 0x0101... */
        CHECK(comm_allreduce(on[k], buf, buf, count, COMM_INT64, COMM_SUM, &err) == 0, "%s",
              err.text);
        to_host(host, buf, count * sizeof *host);
        int64_t want = (int64_t)n * (int64_t)(0x0101010101010101ULL * (uint64_t)(k + 1));
        size_t wrong = 0;
        for (size_t i = 0; i < count; i++) wrong += host[i] != want;
        CHECK(wrong == 0, "rank %d, %s: %zu of %zu elements are not the filled values' sum", rank,
              k ? "split" : "world", wrong, count);
        CUDA_OK(cudaMemset(buf, 0, count * sizeof *buf));
    }
    comm_destroy(split);
    cudaFree(buf), cudaFree(from), cudaFree(to);
    free(host);
}

static void test_operations_wait_for_the_compute_stream(void)
{
    run_all(&(struct world_opts){.name = "ordered", .n = gpus, .absent_rank = -1, .compute = true},
            ordered_rank);
}

/* ---- nothing hangs ------------------------------------------------------------ */

static void never_called(struct comm *c, int rank, int n)
{
    (void)c, (void)rank, (void)n;
    CHECK(0, "joined a world with an absent rank");
}

/* The last rank never comes: the others fail at the deadline naming it
 * (works on one GPU too: a world of 2 whose rank 1 stays away). */
static void test_rank_that_never_joins_is_named_at_the_deadline(void)
{
    int n = gpus > 1 ? gpus : 2, absent = n - 1;
    struct world_opts o = {
        .name = "late", .n = n, .absent_rank = absent, .timeout_s = 3, .init_may_fail = true};
    run_world(&o, never_called);
    char want[32];
    snprintf(want, sizeof want, "rank %d", absent);
    for (int r = 0; r < n; r++) {
        if (r == absent) continue;
        printf("  rank %d after %.2f s: %s\n", r, sh->seconds[r], sh->text[r]);
        CHECK(strstr(sh->text[r], want) && strstr(sh->text[r], "did not join"), "rank %d: %s", r,
              sh->text[r]);
        CHECK(sh->seconds[r] > 2 && sh->seconds[r] < 3 + 10, "rank %d failed after %.2f s", r,
              sh->seconds[r]);
    }
}

#define SKIP_TIMEOUT_S 10 /* NCCL's init must fit in it too */

/* The last rank skips an all-reduce: the others fail at their deadline with
 * ncclCommAbort, say what timed out, and abort the job, so the last rank's
 * next operation fails at once too. */
static void skip_rank(struct comm *c, int rank, int n)
{
    struct plait_error err;
    float *d = dev_alloc(1024 * sizeof(float));
    CUDA_OK(cudaMemset(d, 0, 1024 * sizeof(float)));
    CHECK(comm_allreduce(c, d, d, 1024, COMM_FLOAT32, COMM_SUM, &err) == 0, "%s", err.text);
    double t0 = now_s();
    if (rank == n - 1) {
        sleep_s(SKIP_TIMEOUT_S + 5); /* past the others' deadline */
        int rc = comm_allreduce(c, d, d, 1024, COMM_FLOAT32, COMM_SUM, &err);
        CHECK(rc != 0 && strstr(err.text, "aborted"), "the skipping rank: %s",
              rc ? err.text : "succeeded");
    } else {
        int rc = comm_allreduce(c, d, d, 1024, COMM_FLOAT32, COMM_SUM, &err);
        double took = now_s() - t0;
        printf("  rank %d after %.2f s: %s\n", rank, took, rc ? err.text : "succeeded");
        CHECK(rc != 0 && (strstr(err.text, "did not finish") || strstr(err.text, "aborted")), "%s",
              rc ? err.text : "succeeded");
        CHECK(took > SKIP_TIMEOUT_S - 1 && took < SKIP_TIMEOUT_S + 10, "failed after %.2f s", took);
    }
    cudaFree(d);
}

static void test_operation_a_rank_skips_fails_the_others_at_the_deadline(void)
{
    if (gpus < 2) {
        printf("  skipped: needs 2 GPUs, this machine has %d\n", gpus);
        return;
    }
    run_all(
        &(struct world_opts){
            .name = "skip", .n = gpus, .absent_rank = -1, .timeout_s = SKIP_TIMEOUT_S},
        skip_rank);
}

/* The last rank's process ends after the first all-reduce: the others fail
 * by their deadline naming it (it shared their node, so its end is seen). */
static void killed_rank(struct comm *c, int rank, int n)
{
    struct plait_error err;
    float *d = dev_alloc(1024 * sizeof(float));
    CUDA_OK(cudaMemset(d, 0, 1024 * sizeof(float)));
    CHECK(comm_allreduce(c, d, d, 1024, COMM_FLOAT32, COMM_SUM, &err) == 0, "%s", err.text);
    if (rank == n - 1) {
        fflush(stdout);
        _exit(0); /* no goodbye: as a crash would */
    }
    double t0 = now_s();
    int rc = comm_allreduce(c, d, d, 1024, COMM_FLOAT32, COMM_SUM, &err);
    double took = now_s() - t0;
    char want[32];
    snprintf(want, sizeof want, "rank %d (", n - 1);
    printf("  rank %d after %.2f s: %s\n", rank, took, rc ? err.text : "succeeded");
    CHECK(rc != 0 && strstr(err.text, want) && strstr(err.text, "gone"), "%s",
          rc ? err.text : "succeeded");
    CHECK(took < SKIP_TIMEOUT_S + 10, "failed after %.2f s", took);
    cudaFree(d);
}

static void test_killed_rank_is_named_by_the_others(void)
{
    if (gpus < 2) {
        printf("  skipped: needs 2 GPUs, this machine has %d\n", gpus);
        return;
    }
    run_all(
        &(struct world_opts){
            .name = "killed", .n = gpus, .absent_rank = -1, .timeout_s = SKIP_TIMEOUT_S},
        killed_rank);
}

static int probe_gpus(void)
{
    pid_t pid = fork();
    if (pid == 0) {
        int n = 0;
        if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
        _exit(n > MAX_RANKS ? MAX_RANKS : n);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return 0;
    return WEXITSTATUS(status);
}

int main(void)
{
    sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) return 2;
    gpus = probe_gpus();
    if (gpus < 1) {
        printf("skipped: no CUDA device (the nccl backend's tests need at least one GPU)\n");
        return 0;
    }
    printf("# %d GPU%s: worlds of %d rank%s\n", gpus, gpus > 1 ? "s" : "", gpus,
           gpus > 1 ? "s" : "");
    if (gpus < 2) printf("# one GPU: the collectives run on a world of one rank\n");
    RUN(test_allreduce_sum_and_max_of_every_dtype_match_host_sums);
    RUN(test_reduce_scatter_and_allgather_match_host_sums);
    RUN(test_uneven_alltoall_delivers_every_block);
    RUN(test_broadcast_barrier_send_recv_and_a_grouped_exchange);
    RUN(test_split_3d_and_a_split_some_ranks_sit_out);
    RUN(test_async_buckets_host_buffers_and_byte_counts);
    RUN(test_operations_wait_for_the_compute_stream);
    RUN(test_rank_that_never_joins_is_named_at_the_deadline);
    RUN(test_operation_a_rank_skips_fails_the_others_at_the_deadline);
    RUN(test_killed_rank_is_named_by_the_others);
    printf("# %d passed, %d failed\n", tests_passed, tests_failed);
    return check_exit_code();
}
