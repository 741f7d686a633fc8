/* gemm_bench.c — GFLOP/s of every matrix product in a GPT-2 124M training step
 * (B·T = 256, C = 768, Vp = 50304) for gemm_f32/gemm_bf16 and for the candidates
 * they were chosen from: dnnl_sgemm, oneDNN's matmul primitive (fp32, bf16) and
 * OpenBLAS; and gemm_bf16 emulated in fp32, as on CPUs without native bf16
 * (there the bf16 primitive's column shows "-"; PLAIT_BF16_EMULATE=0 keeps it
 * where oneDNN has one). Medians of interleaved repetitions, so that the
 * machine's slow spells hit every backend alike. Not a test: it checks no results.
 *
 *   gemm-bench [--reps N] [--omp-between]   the table
 *   gemm-bench --json                        {"sgemm_gflops": ..., "bf16_gflops": ...}
 *
 * sgemm_gflops (bf16_gflops) is gemm_f32's (gemm_bf16's) rate over the step's
 * big products weighted by FLOPs: their total FLOPs over the sum of their
 * median times. --omp-between runs an empty OpenMP region before each product,
 * as the runtime's own kernels do, to show thread-pool contention. */
#include "kernels/cpu/gemm.h"

#include <cblas.h>
#include <dnnl.h>
#include <dnnl_debug.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DIE(...)                                                                                   \
    do {                                                                                           \
        fprintf(stderr, "gemm-bench: " __VA_ARGS__);                                               \
        fputc('\n', stderr);                                                                       \
        exit(1);                                                                                   \
    } while (0)

#define DNNL_OK(call)                                                                              \
    do {                                                                                           \
        dnnl_status_t st_ = (call);                                                                \
        if (st_ != dnnl_success)                                                                   \
            DIE("%s:%d: %s: %s", __FILE__, __LINE__, #call, dnnl_status2str(st_));                 \
    } while (0)

enum { C_ = 768, VP = 50304, ROWS = 256, T_ = 64, NH = 12, HS = 64, PAIRS = 48 };

struct shape {
    const char *what;
    bool ta, tb;
    int M, N, K, lda, ldb, ldc;
    float alpha, beta;
    int pairs; /* 0: one product; PAIRS: attention, one product per (batch, head) */
};

#define BIG(what, ta, tb, M, N, K, beta)                                                           \
    {                                                                                              \
        what, ta, tb, M, N, K, (ta) ? (M) : (K), (tb) ? (K) : (N), N, 1.0f, beta, 0                \
    }
#define ATT(what, ta, tb, lda, ldb, ldc, alpha)                                                    \
    {                                                                                              \
        what, ta, tb, HS, T_, HS, lda, ldb, ldc, alpha, 0.0f, PAIRS                                \
    }

/* (M, N, K) of op(A)·op(B); weights W are (out, in). dW accumulates (beta 1). */
static const struct shape shapes[] = {
    BIG("qkv fwd      X.W^T", 0, 1, ROWS, 3 * C_, C_, 0),
    BIG("attproj fwd  X.W^T", 0, 1, ROWS, C_, C_, 0),
    BIG("fc fwd       X.W^T", 0, 1, ROWS, 4 * C_, C_, 0),
    BIG("fcproj fwd   X.W^T", 0, 1, ROWS, C_, 4 * C_, 0),
    BIG("lm head fwd  X.W^T", 0, 1, ROWS, VP, C_, 0),
    BIG("qkv dX       dY.W", 0, 0, ROWS, C_, 3 * C_, 0),
    BIG("attproj dX   dY.W", 0, 0, ROWS, C_, C_, 0),
    BIG("fc dX        dY.W", 0, 0, ROWS, C_, 4 * C_, 0),
    BIG("fcproj dX    dY.W", 0, 0, ROWS, 4 * C_, C_, 0),
    BIG("lm head dX   dY.W", 0, 0, ROWS, C_, VP, 0),
    BIG("qkv dW      dY^T.X", 1, 0, 3 * C_, C_, ROWS, 1),
    BIG("attproj dW  dY^T.X", 1, 0, C_, C_, ROWS, 1),
    BIG("fc dW       dY^T.X", 1, 0, 4 * C_, C_, ROWS, 1),
    BIG("fcproj dW   dY^T.X", 1, 0, C_, 4 * C_, ROWS, 1),
    BIG("lm head dW  dY^T.X", 1, 0, VP, C_, ROWS, 1),
    /* attention, 48 (batch, head) pairs from inside an omp parallel for; q, k, v
     * and their gradients live in (B,T,3C) rows, att in (B,NH,T,T), out in (B,T,C) */
    ATT("att Q.K^T", 0, 1, 3 * C_, 3 * C_, T_, 0.125f),
    ATT("att P.V", 0, 0, T_, 3 * C_, C_, 1.0f),
    ATT("att dO.V^T", 0, 1, C_, 3 * C_, T_, 1.0f),
    ATT("att P^T.dO", 1, 0, T_, C_, 3 * C_, 1.0f),
    ATT("att dS.K", 0, 0, T_, 3 * C_, 3 * C_, 0.125f),
    ATT("att dS^T.Q", 1, 0, T_, 3 * C_, 3 * C_, 0.125f),
};
#define N_SHAPES (int)(sizeof shapes / sizeof shapes[0])

enum backend { GEMM_F32, SGEMM, PRIM_F32, OPENBLAS, GEMM_BF16, PRIM_BF16, BF16_EMUL, N_BACKENDS };
static const char *backend_names[N_BACKENDS] = {"gemm_f32",  "dnnl_sgemm", "prim f32", "OpenBLAS",
                                                "gemm_bf16", "prim bf16",  "bf16 emul"};

/* Where the operand with leading dimension ld starts for attention pair p:
 * (T,T) blocks are dense, the others are head slices of (B,T,·) rows. */
static size_t pair_offset(int ld, int p)
{
    if (ld == T_) return (size_t)p * T_ * T_;
    return (size_t)(p / NH) * T_ * ld + (size_t)(p % NH) * HS;
}

static float *A32, *B32, *C32;
static uint16_t *A16, *B16;

/* The "prim" candidates: a matmul primitive made for one shape and run as is
 * (library scratchpad, so run only by the thread that made it). */
static dnnl_engine_t engine;

struct prim {
    dnnl_primitive_t p;
    dnnl_stream_t stream;
    dnnl_memory_t a, b, c;
};

static void prim_make(struct prim *pr, dnnl_data_type_t dt, const struct shape *s)
{
    dnnl_memory_desc_t amd, bmd, cmd;
    dnnl_dims_t ad = {s->M, s->K}, as = {s->ta ? 1 : s->lda, s->ta ? s->lda : 1};
    dnnl_dims_t bd = {s->K, s->N}, bs = {s->tb ? 1 : s->ldb, s->tb ? s->ldb : 1};
    dnnl_dims_t cd = {s->M, s->N}, cs = {s->ldc, 1};
    DNNL_OK(dnnl_memory_desc_init_by_strides(&amd, 2, ad, dt, as));
    DNNL_OK(dnnl_memory_desc_init_by_strides(&bmd, 2, bd, dt, bs));
    DNNL_OK(dnnl_memory_desc_init_by_strides(&cmd, 2, cd, dnnl_f32, cs));
    dnnl_matmul_desc_t md;
    DNNL_OK(dnnl_matmul_desc_init(&md, &amd, &bmd, NULL, &cmd));
    dnnl_primitive_attr_t attr;
    DNNL_OK(dnnl_primitive_attr_create(&attr));
    if (s->alpha != 1.0f) DNNL_OK(dnnl_primitive_attr_set_output_scales(attr, 1, 0, &s->alpha));
    if (s->beta != 0.0f) {
        dnnl_post_ops_t po;
        DNNL_OK(dnnl_post_ops_create(&po));
        DNNL_OK(dnnl_post_ops_append_sum(po, s->beta));
        DNNL_OK(dnnl_primitive_attr_set_post_ops(attr, po));
        DNNL_OK(dnnl_post_ops_destroy(po));
    }
    dnnl_primitive_desc_t pd;
    DNNL_OK(dnnl_primitive_desc_create(&pd, &md, attr, engine, NULL));
    DNNL_OK(dnnl_primitive_create(&pr->p, pd));
    DNNL_OK(dnnl_primitive_desc_destroy(pd));
    DNNL_OK(dnnl_primitive_attr_destroy(attr));
    DNNL_OK(dnnl_stream_create(&pr->stream, engine, dnnl_stream_default_flags));
    DNNL_OK(dnnl_memory_create(&pr->a, &amd, engine, DNNL_MEMORY_NONE));
    DNNL_OK(dnnl_memory_create(&pr->b, &bmd, engine, DNNL_MEMORY_NONE));
    DNNL_OK(dnnl_memory_create(&pr->c, &cmd, engine, DNNL_MEMORY_NONE));
}

static void prim_free(struct prim *pr)
{
    if (!pr->p) return;
    dnnl_primitive_destroy(pr->p);
    dnnl_stream_destroy(pr->stream);
    dnnl_memory_destroy(pr->a);
    dnnl_memory_destroy(pr->b);
    dnnl_memory_destroy(pr->c);
    memset(pr, 0, sizeof *pr);
}

static void prim_run(struct prim *pr, const void *a, const void *b, float *c)
{
    DNNL_OK(dnnl_memory_set_data_handle(pr->a, (void *)a));
    DNNL_OK(dnnl_memory_set_data_handle(pr->b, (void *)b));
    DNNL_OK(dnnl_memory_set_data_handle(pr->c, c));
    dnnl_exec_arg_t args[] = {
        {DNNL_ARG_SRC, pr->a}, {DNNL_ARG_WEIGHTS, pr->b}, {DNNL_ARG_DST, pr->c}};
    DNNL_OK(dnnl_primitive_execute(pr->p, pr->stream, 3, args));
}

/* per backend and per OpenMP thread (attention runs on every thread) */
static struct prim prims[N_BACKENDS][64];

/* One product (or, for attention, pair p's) with one backend. */
static void product(enum backend b, const struct shape *s, int p)
{
    size_t ao = s->pairs ? pair_offset(s->lda, p) : 0, bo = s->pairs ? pair_offset(s->ldb, p) : 0;
    size_t co = s->pairs ? pair_offset(s->ldc, p) : 0;
    char err[512];
    int rc = 0;
    struct prim *pr = &prims[b][omp_get_thread_num() & 63];
    switch (b) {
    case GEMM_F32:
        rc = gemm_f32(s->ta, s->tb, s->M, s->N, s->K, s->alpha, A32 + ao, s->lda, B32 + bo, s->ldb,
                      s->beta, C32 + co, s->ldc, err, sizeof err);
        break;
    case GEMM_BF16:
    case BF16_EMUL: /* (time_once forces the emulation) */
        rc = gemm_bf16(s->ta, s->tb, s->M, s->N, s->K, s->alpha, A16 + ao, s->lda, B16 + bo, s->ldb,
                       s->beta, C32 + co, s->ldc, err, sizeof err);
        break;
    case SGEMM:
        DNNL_OK(dnnl_sgemm(s->ta ? 'T' : 'N', s->tb ? 'T' : 'N', s->M, s->N, s->K, s->alpha,
                           A32 + ao, s->lda, B32 + bo, s->ldb, s->beta, C32 + co, s->ldc));
        break;
    case OPENBLAS:
        cblas_sgemm(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans,
                    s->tb ? CblasTrans : CblasNoTrans, s->M, s->N, s->K, s->alpha, A32 + ao, s->lda,
                    B32 + bo, s->ldb, s->beta, C32 + co, s->ldc);
        break;
    case PRIM_F32:
    case PRIM_BF16:
        if (!pr->p) prim_make(pr, b == PRIM_BF16 ? dnnl_bf16 : dnnl_f32, s);
        if (b == PRIM_BF16)
            prim_run(pr, A16 + ao, B16 + bo, C32 + co);
        else
            prim_run(pr, A32 + ao, B32 + bo, C32 + co);
        break;
    default:
        break;
    }
    if (rc) DIE("%s", err);
}

static double seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static volatile int omp_sink;

static double time_once(enum backend b, const struct shape *s, bool omp_between)
{
    if (omp_between) {
#pragma omp parallel
        omp_sink = omp_get_thread_num();
    }
    if (b == BF16_EMUL) gemm_bf16_force_emulation(true, 0);
    double t0 = seconds();
    if (s->pairs) {
#pragma omp parallel for schedule(static)
        for (int p = 0; p < s->pairs; p++) product(b, s, p);
    } else {
        product(b, s, 0);
    }
    double dt = seconds() - t0;
    if (b == BF16_EMUL) gemm_bf16_force_emulation(false, 0);
    return dt;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double flops(const struct shape *s)
{
    return 2.0 * s->M * s->N * s->K * (s->pairs ? s->pairs : 1);
}

/* A, B, C large enough for every shape; values in [-1, 1] */
static void make_operands(void)
{
    size_t a_n = (size_t)ROWS * VP, b_n = (size_t)VP * C_, c_n = (size_t)VP * C_;
    A32 = malloc(a_n * sizeof *A32), B32 = malloc(b_n * sizeof *B32),
    C32 = malloc(c_n * sizeof *C32);
    A16 = malloc(a_n * sizeof *A16), B16 = malloc(b_n * sizeof *B16);
    if (!A32 || !B32 || !C32 || !A16 || !B16) DIE("out of memory");
    for (size_t i = 0; i < a_n; i++) A32[i] = (float)(i % 97) / 48.5f - 1.0f;
    for (size_t i = 0; i < b_n; i++) B32[i] = (float)(i % 89) / 44.5f - 1.0f;
    for (size_t i = 0; i < c_n; i++) C32[i] = 0.0f;
    bf16_from_f32(A16, A32, a_n);
    bf16_from_f32(B16, B32, b_n);
}

/* What the command line asks for. */
struct options {
    bool json, omp_between;
    int reps;
    bool run[N_BACKENDS]; /* the backends measured */
};

static void print_header(const struct options *o, const char *bf16_how, int threads)
{
    const char *wait = getenv("OMP_WAIT_POLICY");
    printf("gemm_f32: %s; %d threads, OMP_WAIT_POLICY=%s%s; median GFLOP/s of %d\n",
           gemm_backend_name(), threads, wait ? wait : "(unset)",
           o->omp_between ? ", OpenMP region before each product" : "", o->reps);
    printf("gemm_bf16: %s\n", bf16_how);
    printf("%-18s %2s %5s %5s %5s", "product", "op", "M", "N", "K");
    for (int b = 0; b < N_BACKENDS; b++) printf(" %10s", backend_names[b]);
    printf("\n");
}

/* Shape s with every backend measured: its row of the table, and each
 * backend's median seconds added to big_seconds for a big product. t: room
 * for reps times of each backend. */
static void measure_shape(const struct options *o, const struct shape *s, double *t,
                          double *big_seconds)
{
    int reps = o->reps;
    /* one warm-up (primitives, caches, pages); each repetition starts with
     * the next backend, so that none always follows the same one */
    for (int rep = -1; rep < reps; rep++)
        for (int i = 0; i < N_BACKENDS; i++) {
            int b = (i + rep + 1) % N_BACKENDS;
            if (!o->run[b]) continue;
            double dt = time_once(b, s, o->omp_between);
            if (rep >= 0) t[b * reps + rep] = dt;
        }
    if (!o->json)
        printf("%-18s %c%c %5d %5d %5d", s->what, s->ta ? 'T' : 'N', s->tb ? 'T' : 'N', s->M,
               s->N, s->K);
    for (int b = 0; b < N_BACKENDS; b++) {
        for (int i = 0; i < 64; i++) prim_free(&prims[b][i]);
        if (!o->run[b]) {
            if (!o->json) printf(" %10s", "-");
            continue;
        }
        qsort(t + b * reps, reps, sizeof *t, cmp_double);
        double median = reps % 2 ? t[b * reps + reps / 2]
                                 : 0.5 * (t[b * reps + reps / 2 - 1] + t[b * reps + reps / 2]);
        if (!s->pairs) big_seconds[b] += median;
        if (!o->json) printf(" %10.1f", flops(s) / median / 1e9);
    }
    if (!o->json) printf("\n");
    fflush(stdout);
}

static void print_big(const struct options *o, double big_flops, const double *big_seconds,
                      int threads)
{
    if (o->json) {
        printf("{\"sgemm_gflops\": %.1f, \"bf16_gflops\": %.1f, \"threads\": %d}\n",
               big_flops / big_seconds[GEMM_F32] / 1e9, big_flops / big_seconds[GEMM_BF16] / 1e9,
               threads);
        return;
    }
    printf("%-39s", "big products, FLOP-weighted");
    for (int b = 0; b < N_BACKENDS; b++)
        if (o->run[b])
            printf(" %10.1f", big_flops / big_seconds[b] / 1e9);
        else
            printf(" %10s", "-");
    printf("\n");
}

int main(int argc, char **argv)
{
    struct options o = {.reps = 11};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            o.json = true;
        else if (!strcmp(argv[i], "--omp-between"))
            o.omp_between = true;
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            o.reps = atoi(argv[++i]);
        else
            DIE("usage: gemm-bench [--json] [--reps N] [--omp-between]");
    }
    if (o.reps < 1) DIE("--reps must be at least 1");
    DNNL_OK(dnnl_engine_create(&engine, dnnl_cpu, 0));
    make_operands();
    for (int b = 0; b < N_BACKENDS; b++) o.run[b] = !o.json || b == GEMM_F32 || b == GEMM_BF16;
    const char *bf16_how;
    if (gemm_bf16_emulated(&bf16_how)) o.run[PRIM_BF16] = false; /* maybe none to make */
    int threads = omp_get_max_threads();
    if (!o.json) print_header(&o, bf16_how, threads);
    double big_flops = 0, big_seconds[N_BACKENDS] = {0};
    double *t = malloc(sizeof(double) * (size_t)o.reps * N_BACKENDS);
    if (!t) DIE("out of memory");
    for (int si = 0; si < N_SHAPES; si++) {
        const struct shape *s = &shapes[si];
        if (o.json && s->pairs) continue;
        measure_shape(&o, s, t, big_seconds);
        if (!s->pairs) big_flops += flops(s);
    }
    print_big(&o, big_flops, big_seconds, threads);
    free(t);
    free(A32), free(B32), free(C32), free(A16), free(B16);
    DNNL_OK(dnnl_engine_destroy(engine));
    return 0;
}
