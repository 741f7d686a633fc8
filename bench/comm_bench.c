/* comm_bench.c — comm-bench: all-reduce (or all-to-all) bandwidth of the socket backend,
 * nccl-tests style (size, time, algbw, busbw), for N ranks forked on this
 * machine that meet through a store server in the parent. Not a test: it
 * asserts nothing but that results are right. bench/comm_bench.sh runs it
 * beside Open MPI's MPI_Allreduce and prints the ratio.
 *
 *   comm-bench [--ranks N] [--min-bytes B] [--max-bytes B] [--factor F]
 *              [--transport auto|tcp] [--algorithm auto|bandwidth|latency]
 *              [--small-bytes B] [--spin-us US] [--op allreduce|alltoall]
 *
 * --op alltoall: the uneven all-to-all (comm_alltoall_v) with every rank
 * sending size/N bytes to each rank (MPI_Alltoallv's even case), size being
 * what one rank sends in all; busbw = algbw * (N-1)/N, as nccl-tests.
 *
 * Each size: warm-up, then 5 trials of k iterations (k so a trial lasts about
 * 50 ms, the same k on every rank; from 16 MiB: one warm-up, 3 trials of one);
 * a trial's time is the slowest rank's; the line shows the median trial.
 * busbw = algbw * 2(N-1)/N, as nccl-tests. */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/store/store.h"
#include "runtime/comm/comm.h"

#define SECRET_BYTES STORE_SECRET_HEX_BYTES
#define TRIAL_S 0.05
#define MAX_TRIALS 5
#define LARGE_BYTES ((size_t)16 << 20)

struct config {
    int ranks;
    size_t min_bytes, max_bytes, factor, small_bytes;
    int spin_us;
    enum comm_transport transport;
    enum comm_algorithm algorithm;
    bool alltoall; /* --op alltoall */
};

struct shared {
    _Atomic int port;
    char secret[SECRET_BYTES];
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The slowest rank's value. */
static int max_over_ranks(struct comm *c, double *v, struct plait_error *err)
{
    return comm_allreduce(c, v, v, 1, COMM_FLOAT64, COMM_MAX, err);
}

/* One operation of the benchmark: an all-reduce of count floats, or an
 * all-to-all of count/N to each rank (counts: [N], each count/N). */
static int run_op(struct comm *c, const struct config *cfg, const float *send, float *recv,
                  size_t count, const size_t *counts, struct plait_error *err)
{
    if (cfg->alltoall) return comm_alltoall_v(c, send, counts, recv, counts, COMM_FLOAT32, err);
    return comm_allreduce(c, send, recv, count, COMM_FLOAT32, COMM_SUM, err);
}

/* Whether recv holds what the operation must give (sampled): the sums, or
 * block r from rank r. */
static int check_result(const struct config *cfg, const float *recv, size_t count, int n,
                        int rank, size_t bytes, struct plait_error *err)
{
    size_t block = count / (size_t)n;
    for (size_t i = 0; i < count; i += count / 97 + 1) { /* right, not just fast */
        float want = (float)(n * (n + 1) / 2 * (int)(i % 7 + 1));
        if (cfg->alltoall) { /* rank r's block for this rank: its elements rank·block + j */
            size_t r = i / block, j = i % block;
            want = (float)((int)(r + 1) * (int)(((size_t)rank * block + j) % 7 + 1));
        }
        if (recv[i] != want)
            return error_set(err, "%zu bytes: element %zu is %g, not %g", bytes, i, recv[i], want);
    }
    return 0;
}

static int bench_size(struct comm *c, const struct config *cfg, size_t bytes, float *send,
                      float *recv, struct plait_error *err)
{
    size_t count = bytes / sizeof(float);
    int n = comm_size(c), rank = comm_rank(c);
    size_t counts[256];
    for (int r = 0; r < n; r++) counts[r] = count / (size_t)n;
    if (cfg->alltoall) count = count / (size_t)n * (size_t)n;
    for (size_t i = 0; i < count; i++) send[i] = (float)((rank + 1) * (int)(i % 7 + 1));
    double t0 = now_s();
    if (run_op(c, cfg, send, recv, count, counts, err)) return -1;
    double warm = now_s() - t0;
    if (check_result(cfg, recv, count, n, rank, bytes, err)) return -1;
    bool large = bytes >= LARGE_BYTES; /* one warm-up (it faults the pages in), three trials */
    if (!large) {
        if (run_op(c, cfg, send, recv, count, counts, err)) return -1;
        warm = fmin(warm, now_s() - t0 - warm);
    }
    if (max_over_ranks(c, &warm, err)) return -1;
    int iters = warm > 0 ? (int)(TRIAL_S / warm) : 1000;
    iters = iters < 1 || large ? 1 : iters > 1000 ? 1000 : iters;
    int trials = large ? 3 : MAX_TRIALS;
    double t[MAX_TRIALS];
    for (int k = 0; k < trials; k++) {
        if (comm_barrier(c, err)) return -1;
        t0 = now_s();
        for (int i = 0; i < iters; i++)
            if (run_op(c, cfg, send, recv, count, counts, err)) return -1;
        t[k] = (now_s() - t0) / iters;
        if (max_over_ranks(c, &t[k], err)) return -1;
    }
    qsort(t, (size_t)trials, sizeof t[0], cmp_double);
    double med = t[trials / 2], algbw = (double)bytes / med / 1e9;
    double busbw = algbw * (cfg->alltoall ? 1.0 : 2.0) * (n - 1) / n;
    if (rank == 0) {
        printf("%12zu %12zu  float %6s %12.2f %10.3f %10.3f\n", bytes, count,
               cfg->alltoall ? "none" : "sum", med * 1e6, algbw, busbw);
        fflush(stdout);
    }
    return 0;
}

static int rank_main(const struct config *cfg, struct shared *sh, int rank)
{
    struct plait_error err;
    struct store *st = NULL;
    struct comm *c = NULL;
    float *send = NULL, *recv = NULL;
    int rc = 1, port = 0;
    for (double t0 = now_s(); !port && now_s() - t0 < 10; usleep(1000))
        port = atomic_load(&sh->port);
    if (store_connect(&st, "127.0.0.1", port, sh->secret, rank, 10, &err)) goto out;
    struct comm_options opts = {.backend = COMM_BACKEND_SOCKET,
                                .timeout_s = 60,
                                .secret = sh->secret,
                                .name = "bench",
                                .transport = cfg->transport,
                                .algorithm = cfg->algorithm,
                                .small_message_bytes = cfg->small_bytes,
                                .spin_us = cfg->spin_us};
    if (comm_world_init(&c, st, rank, cfg->ranks, &opts, &err)) goto out;
    send = malloc(cfg->max_bytes);
    recv = malloc(cfg->max_bytes);
    if (!send || !recv) {
        error_errno(&err, "allocating %zu bytes twice", cfg->max_bytes);
        goto out;
    }
    for (size_t bytes = cfg->min_bytes; bytes <= cfg->max_bytes; bytes *= cfg->factor)
        if (bench_size(c, cfg, bytes, send, recv, &err)) goto out;
    rc = 0;
out:
    if (rc) fprintf(stderr, "comm-bench: rank %d: %s\n", rank, err.text);
    free(send);
    free(recv);
    comm_destroy(c);
    store_close(st);
    return rc;
}

static size_t parse_bytes(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    if (*end == 'K' || *end == 'k') v *= 1024;
    if (*end == 'M' || *end == 'm') v *= 1024 * 1024;
    if (*end == 'G' || *end == 'g') v *= 1024 * 1024 * 1024;
    return v < 4 ? 4 : (size_t)v;
}

static int usage(void)
{
    fprintf(stderr, "usage: comm-bench [--ranks N] [--min-bytes B] [--max-bytes B] [--factor F] "
                    "[--transport auto|tcp] [--algorithm auto|bandwidth|latency] "
                    "[--small-bytes B] [--spin-us US] [--op allreduce|alltoall]\n");
    return 2;
}

int main(int argc, char **argv)
{
    struct config cfg = {
        .ranks = 4, .min_bytes = 1024, .max_bytes = (size_t)256 << 20, .factor = 4};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) return usage();
        i++;
        if (!strcmp(a, "--ranks"))
            cfg.ranks = atoi(v);
        else if (!strcmp(a, "--min-bytes"))
            cfg.min_bytes = parse_bytes(v);
        else if (!strcmp(a, "--max-bytes"))
            cfg.max_bytes = parse_bytes(v);
        else if (!strcmp(a, "--factor"))
            cfg.factor = (size_t)atoi(v);
        else if (!strcmp(a, "--op"))
            cfg.alltoall = !strcmp(v, "alltoall");
        else if (!strcmp(a, "--spin-us"))
            cfg.spin_us = atoi(v);
        else if (!strcmp(a, "--small-bytes"))
            cfg.small_bytes = parse_bytes(v);
        else if (!strcmp(a, "--transport"))
            cfg.transport = !strcmp(v, "tcp") ? COMM_TRANSPORT_TCP : COMM_TRANSPORT_AUTO;
        else if (!strcmp(a, "--algorithm"))
            cfg.algorithm = !strcmp(v, "bandwidth") ? COMM_ALGORITHM_BANDWIDTH
                            : !strcmp(v, "latency") ? COMM_ALGORITHM_LATENCY
                                                    : COMM_ALGORITHM_AUTO;
        else
            return usage();
    }
    if (cfg.ranks < 1 || cfg.ranks > 256 || cfg.factor < 2 || cfg.min_bytes > cfg.max_bytes)
        return usage();
    struct plait_error err;
    struct shared *sh =
        mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED || store_secret_generate(sh->secret, &err)) {
        fprintf(stderr, "comm-bench: set-up failed\n");
        return 1;
    }
    printf("# comm-bench: %s, socket backend, %d ranks, transport %s, algorithm %s, "
           "out of place\n",
           cfg.alltoall ? "all-to-all" : "all-reduce", cfg.ranks,
           cfg.transport == COMM_TRANSPORT_TCP ? "tcp" : "auto (shared memory)",
           cfg.algorithm == COMM_ALGORITHM_BANDWIDTH ? "ring"
           : cfg.algorithm == COMM_ALGORITHM_LATENCY ? "recursive doubling"
                                                     : "auto");
    printf("# %10s %12s %6s %6s %12s %10s %10s\n", "size(B)", "count", "type", "redop", "time(us)",
           "algbw(GB/s)", "busbw(GB/s)");
    fflush(stdout);
    /* fork before any thread exists, then serve the store */
    pid_t *pids = calloc((size_t)cfg.ranks, sizeof *pids);
    for (int r = 0; r < cfg.ranks; r++) {
        pids[r] = fork();
        if (pids[r] == 0) _exit(rank_main(&cfg, sh, r));
        if (pids[r] < 0) {
            perror("comm-bench: fork");
            return 1;
        }
    }
    struct store_server *srv = NULL;
    if (store_server_start(&srv, "127.0.0.1", 0, sh->secret, &err)) {
        fprintf(stderr, "comm-bench: %s\n", err.text);
        for (int r = 0; r < cfg.ranks; r++) kill(pids[r], SIGKILL);
    } else {
        atomic_store(&sh->port, store_server_port(srv));
    }
    int failed = 0;
    for (int r = 0; r < cfg.ranks; r++) {
        int status;
        while (waitpid(pids[r], &status, 0) < 0 && errno == EINTR) {
        }
        failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    store_server_stop(srv);
    free(pids);
    return failed ? 1 : 0;
}
