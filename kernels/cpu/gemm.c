/* gemm.c — the CPU matrix products behind gemm.h, and the bf16 conversions.
 * fp32: oneDNN's matmul primitive for large NT products (X·Wᵀ, where dnnl_sgemm
 * is slowest), dnnl_sgemm for the rest; bf16: the matmul primitive, or without
 * bf16 instructions gemm_f32 on widened copies; fp64: CBLAS (tests only). The
 * primitives are cached for all threads; bench/gemm_bench.c chose among them.
 * The oneDNN engine, the primitive cache and the per-thread state stay
 * process-wide (not in kernels/ops.h's struct ops_ctx): shared by every
 * context, thread-safe, and holding no context's data. */
#include "kernels/cpu/gemm.h"

#include "kernels/cpu/bf16.h"

#include <cblas.h>        /* cblas_dgemm */
#include <dnnl.h>         /* dnnl_sgemm, the matmul primitive */
#include <dnnl_debug.h>   /* dnnl_status2str */
#include <dnnl_version.h> /* DNNL_VERSION_* */
#include <omp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A large NT product goes to the matmul primitive (oneDNN's brgemm): measured
 * 1.05-1.6x dnnl_sgemm's rate on the GPT-2 shapes. For NN and TN dnnl_sgemm is
 * as fast or faster, and on attention's 64³ products the two are even, so small
 * products skip the cache. Threshold in multiply-adds. */
#define GEMM_PRIM_MIN_MACS ((int64_t)1 << 24)

/* A training run needs a few dozen primitives. A product that finds the cache
 * full still runs, with a primitive made for it and destroyed after. */
#define GEMM_CACHE_ENTRIES 128

#define STR_(x) #x
#define STR(x) STR_(x)

/* One call, for error messages (formatted only when something fails). */
struct call {
    const char *fn;
    bool ta, tb;
    int M, N, K;
    char *errbuf;
    size_t errbuf_bytes;
};

static int fail(const struct call *call, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* "plait: gemm_f32 NT 256x768x3072: <message>" into the caller's errbuf; -1. */
static int fail(const struct call *call, const char *fmt, ...)
{
    if (!call->errbuf || !call->errbuf_bytes) return -1;
    int n = snprintf(call->errbuf, call->errbuf_bytes, "plait: %s %c%c %dx%dx%d: ", call->fn,
                     call->ta ? 'T' : 'N', call->tb ? 'T' : 'N', call->M, call->N, call->K);
    if (n >= 0 && (size_t)n < call->errbuf_bytes) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(call->errbuf + n, call->errbuf_bytes - n, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* Checks one oneDNN call: on failure sets rc = -1 and the message, goes to out. */
#define DNNL_CHECK(expr)                                                                           \
    do {                                                                                           \
        dnnl_status_t st_ = (expr);                                                                \
        if (st_ != dnnl_success) {                                                                 \
            rc = fail(call, "oneDNN: %s (%s:%d)", dnnl_status2str(st_), __FILE__, __LINE__);       \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

/* Everything CBLAS or oneDNN would reject, checked up front so that all three
 * products fail alike (CBLAS has no status to return). */
static int check_args(const struct call *call, const void *A, int lda, const void *B, int ldb,
                      const void *C, int ldc)
{
    int M = call->M, N = call->N, K = call->K;
    if (M < 0 || N < 0 || K < 0) return fail(call, "negative dimension");
    int a_cols = call->ta ? M : K, b_cols = call->tb ? K : N;
    if (lda < (a_cols > 1 ? a_cols : 1) || ldb < (b_cols > 1 ? b_cols : 1) || ldc < (N > 1 ? N : 1))
        return fail(call,
                    "leading dimension too small (lda %d, ldb %d, ldc %d; need >= %d, %d, %d)", lda,
                    ldb, ldc, a_cols, b_cols, N);
    if ((M && N && !C) || (M && N && K && (!A || !B))) return fail(call, "NULL matrix");
    return 0;
}

/* C = beta·C, for K == 0 or alpha == 0. As in BLAS, beta == 0 writes zeros
 * without reading C (which may hold NaN). */
static void scale_c(int M, int N, float beta, float *C, int ldc)
{
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float *c = &C[(size_t)i * ldc + j];
            *c = beta == 0.0f ? 0.0f : beta * *c;
        }
}

/* ---- oneDNN state: one engine; per thread, a stream and a scratchpad ---- */

struct thread_ctx {
    dnnl_stream_t stream;
    void *scratch;
    size_t scratch_bytes;
    float *wide; /* the bf16 emulation's fp32 panels */
    size_t wide_floats;
};

static pthread_once_t dnnl_once = PTHREAD_ONCE_INIT;
static dnnl_status_t dnnl_init_status;
static dnnl_engine_t engine;
static pthread_key_t ctx_key;

static void thread_ctx_free(void *p)
{
    struct thread_ctx *ctx = p;
    if (!ctx) return;
    if (ctx->stream) dnnl_stream_destroy(ctx->stream);
    free(ctx->scratch);
    free(ctx->wide);
    free(ctx);
}

static void dnnl_init(void)
{
    if (pthread_key_create(&ctx_key, thread_ctx_free) != 0) {
        dnnl_init_status = dnnl_out_of_memory;
        return;
    }
    dnnl_init_status = dnnl_engine_create(&engine, dnnl_cpu, 0);
}

/* The calling thread's stream, and its scratchpad grown to scratch_bytes. The
 * primitives are shared between threads, so oneDNN's own scratchpads (tied to
 * the thread that made the primitive) cannot be used: the caller brings one. */
static int thread_ctx_get(struct thread_ctx **out, size_t scratch_bytes, const struct call *call)
{
    int rc = 0;
    struct thread_ctx *ctx = pthread_getspecific(ctx_key), *fresh = NULL;
    if (!ctx) {
        ctx = fresh = calloc(1, sizeof *ctx);
        if (!ctx) return fail(call, "out of memory");
        DNNL_CHECK(dnnl_stream_create(&ctx->stream, engine, dnnl_stream_default_flags));
        if (pthread_setspecific(ctx_key, ctx) != 0) {
            rc = fail(call, "pthread_setspecific failed");
            goto out;
        }
        fresh = NULL;
    }
    if (scratch_bytes > ctx->scratch_bytes) {
        size_t bytes = (scratch_bytes + 4095) & ~(size_t)4095;
        void *p = aligned_alloc(4096, bytes);
        if (!p) return fail(call, "out of memory (scratchpad of %zu bytes)", bytes);
        free(ctx->scratch);
        ctx->scratch = p;
        ctx->scratch_bytes = bytes;
    }
    *out = ctx;
out:
    thread_ctx_free(fresh);
    return rc;
}

/* ---- the matmul primitive cache ---- */

struct prim_key {
    dnnl_data_type_t dt; /* of A and B; C is f32 */
    int ta, tb, M, N, K, lda, ldb, ldc;
    float alpha, beta;
    /* the threads oneDNN plans for when making it: 1 inside a parallel region */
    int threads;
};

struct prim {
    struct prim_key key;
    dnnl_primitive_t primitive;
    dnnl_memory_desc_t a_md, b_md, c_md, scratch_md;
    size_t scratch_bytes;
};

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static struct prim *cache[GEMM_CACHE_ENTRIES]; /* never freed: live until exit */
static int cache_used;

static void prim_free(struct prim *p)
{
    if (!p) return;
    if (p->primitive) dnnl_primitive_destroy(p->primitive);
    free(p);
}

/* op(A) (M×K) and op(B) (K×N) are strided views of the row-major storage:
 * a transposed operand has unit stride down its rows. */
static int prim_create(struct prim **out, const struct prim_key *key, const struct call *call)
{
    int rc = 0;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t post_ops = NULL;
    dnnl_primitive_desc_t pd = NULL;
    struct prim *p = calloc(1, sizeof *p);
    if (!p) return fail(call, "out of memory");
    p->key = *key;

    dnnl_dims_t a_dims = {key->M, key->K}, b_dims = {key->K, key->N}, c_dims = {key->M, key->N};
    dnnl_dims_t a_strides = {key->ta ? 1 : key->lda, key->ta ? key->lda : 1};
    dnnl_dims_t b_strides = {key->tb ? 1 : key->ldb, key->tb ? key->ldb : 1};
    dnnl_dims_t c_strides = {key->ldc, 1};
    DNNL_CHECK(dnnl_memory_desc_init_by_strides(&p->a_md, 2, a_dims, key->dt, a_strides));
    DNNL_CHECK(dnnl_memory_desc_init_by_strides(&p->b_md, 2, b_dims, key->dt, b_strides));
    DNNL_CHECK(dnnl_memory_desc_init_by_strides(&p->c_md, 2, c_dims, dnnl_f32, c_strides));
    dnnl_matmul_desc_t desc;
    DNNL_CHECK(dnnl_matmul_desc_init(&desc, &p->a_md, &p->b_md, NULL, &p->c_md));

    /* C = alpha·AB + beta·C: output scale, then the "sum" post-op */
    DNNL_CHECK(dnnl_primitive_attr_create(&attr));
    DNNL_CHECK(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));
    if (key->alpha != 1.0f)
        DNNL_CHECK(dnnl_primitive_attr_set_output_scales(attr, 1, 0, &key->alpha));
    if (key->beta != 0.0f) {
        DNNL_CHECK(dnnl_post_ops_create(&post_ops));
        DNNL_CHECK(dnnl_post_ops_append_sum(post_ops, key->beta));
        DNNL_CHECK(dnnl_primitive_attr_set_post_ops(attr, post_ops));
    }
    DNNL_CHECK(dnnl_primitive_desc_create(&pd, &desc, attr, engine, NULL));
    const dnnl_memory_desc_t *scratch_md =
        dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    if (scratch_md) p->scratch_md = *scratch_md;
    p->scratch_bytes = dnnl_memory_desc_get_size(&p->scratch_md);
    DNNL_CHECK(dnnl_primitive_create(&p->primitive, pd));
out:
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (post_ops) dnnl_post_ops_destroy(post_ops);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (rc) {
        prim_free(p);
        p = NULL;
    }
    *out = p;
    return rc;
}

static struct prim *cache_find(const struct prim_key *key)
{
    for (int i = 0; i < cache_used; i++)
        if (memcmp(&cache[i]->key, key, sizeof *key) == 0) return cache[i];
    return NULL;
}

/* The primitive for key: cached, or made now (outside the lock: making one
 * compiles code). *owned is set when the cache was full; the caller frees it. */
static int prim_get(struct prim **out, bool *owned, const struct prim_key *key,
                    const struct call *call)
{
    *owned = false;
    pthread_mutex_lock(&cache_lock);
    struct prim *p = cache_find(key);
    pthread_mutex_unlock(&cache_lock);
    if (!p) {
        if (prim_create(&p, key, call) != 0) return -1;
        pthread_mutex_lock(&cache_lock);
        struct prim *other = cache_find(key);
        if (other) { /* another thread made the same one meanwhile */
            prim_free(p);
            p = other;
        } else if (cache_used < GEMM_CACHE_ENTRIES) {
            cache[cache_used++] = p;
        } else {
            *owned = true;
        }
        pthread_mutex_unlock(&cache_lock);
    }
    *out = p;
    return 0;
}

static int matmul(dnnl_data_type_t dt, const struct call *call, float alpha, const void *A, int lda,
                  const void *B, int ldb, float beta, float *C, int ldc)
{
    int rc = 0;
    struct prim *p = NULL;
    bool owned = false;
    struct thread_ctx *ctx = NULL;
    dnnl_memory_t mem[4] = {NULL, NULL, NULL, NULL};

    pthread_once(&dnnl_once, dnnl_init);
    DNNL_CHECK(dnnl_init_status);

    struct prim_key key;
    memset(&key, 0, sizeof key); /* compared with memcmp: no stray padding bytes */
    key.dt = dt;
    key.ta = call->ta, key.tb = call->tb, key.M = call->M, key.N = call->N, key.K = call->K;
    key.lda = lda, key.ldb = ldb, key.ldc = ldc;
    key.alpha = alpha, key.beta = beta;
    key.threads = omp_in_parallel() ? 1 : omp_get_max_threads(); /* as oneDNN counts them */

    if ((rc = prim_get(&p, &owned, &key, call)) != 0) goto out;
    if ((rc = thread_ctx_get(&ctx, p->scratch_bytes, call)) != 0) goto out;
    DNNL_CHECK(dnnl_memory_create(&mem[0], &p->a_md, engine, (void *)A));
    DNNL_CHECK(dnnl_memory_create(&mem[1], &p->b_md, engine, (void *)B));
    DNNL_CHECK(dnnl_memory_create(&mem[2], &p->c_md, engine, C));
    if (p->scratch_bytes)
        DNNL_CHECK(dnnl_memory_create(&mem[3], &p->scratch_md, engine, ctx->scratch));
    dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, mem[0]},
                              {DNNL_ARG_WEIGHTS, mem[1]},
                              {DNNL_ARG_DST, mem[2]},
                              {DNNL_ARG_SCRATCHPAD, mem[3]}};
    DNNL_CHECK(dnnl_primitive_execute(p->primitive, ctx->stream, mem[3] ? 4 : 3, args));
    DNNL_CHECK(dnnl_stream_wait(ctx->stream));
out:
    for (int i = 0; i < 4; i++)
        if (mem[i]) dnnl_memory_destroy(mem[i]);
    if (owned) prim_free(p);
    return rc;
}

/* ---- bf16: oneDNN's matmul, or emulated in fp32 ---- */

/* Decided once per process (bf16_decide): whether gemm_bf16 is emulated, and
 * the line that says so. Forcing is for tests and benchmarks. */
static pthread_once_t bf16_once = PTHREAD_ONCE_INIT;
static bool bf16_emulate;
static char bf16_how[256];
static atomic_bool bf16_forced;

/* The first product's shape, 64×64×64 NT with dense operands: oneDNN answers
 * dnnl_unimplemented where it has no bf16 matmul at all (no AVX-512, or
 * ONEDNN_MAX_CPU_ISA below it). Only the descriptor is made: no code is compiled. */
static dnnl_status_t bf16_probe(void)
{
    dnnl_memory_desc_t a, b, c;
    dnnl_matmul_desc_t desc;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_dims_t dims = {64, 64};
    dnnl_status_t st = dnnl_memory_desc_init_by_tag(&a, 2, dims, dnnl_bf16, dnnl_ab);
    if (st == dnnl_success) st = dnnl_memory_desc_init_by_tag(&b, 2, dims, dnnl_bf16, dnnl_ba);
    if (st == dnnl_success) st = dnnl_memory_desc_init_by_tag(&c, 2, dims, dnnl_f32, dnnl_ab);
    if (st == dnnl_success) st = dnnl_matmul_desc_init(&desc, &a, &b, NULL, &c);
    if (st == dnnl_success) st = dnnl_primitive_desc_create(&pd, &desc, NULL, engine, NULL);
    if (pd) dnnl_primitive_desc_destroy(pd);
    return st;
}

#define EMULATED "bf16 matrix products emulated in fp32"
#define EMULATED_COST ": same results as native bf16 within fp32 rounding, at about fp32 speed"

/* Emulated where oneDNN has no bf16 matmul, and also where it has one but the
 * CPU has no bf16 instructions (AVX-512 before Cooper Lake and Zen 4): there
 * oneDNN converts inside its kernels, and gemm-bench measured its rate at
 * 0.4-0.5× the emulation's (ONEDNN_MAX_CPU_ISA=AVX512_CORE and _VNNI on a Zen 5).
 * PLAIT_BF16_EMULATE=1 emulates anyway; =0 keeps oneDNN wherever it works. */
static void bf16_decide(void)
{
    pthread_once(&dnnl_once, dnnl_init);
    dnnl_cpu_isa_t isa = dnnl_cpu_isa_all;
    dnnl_status_t probe = dnnl_init_status;
    const char *isa_name = "unknown";
    if (dnnl_init_status == dnnl_success) {
        isa = dnnl_get_effective_cpu_isa();
        isa_name = dnnl_cpu_isa2str(isa);
        if (!strncmp(isa_name, "cpu_isa_", 8)) isa_name += 8;
        probe = bf16_probe();
    }
    const char *env = getenv("PLAIT_BF16_EMULATE");
    bool has_bf16_insns = (isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16;
    const char *why = NULL;
    char buf[128];
    if (env && !strcmp(env, "1")) {
        snprintf(buf, sizeof buf, "PLAIT_BF16_EMULATE=1; ISA %s", isa_name);
        why = buf;
    } else if (probe == dnnl_unimplemented) {
        snprintf(buf, sizeof buf,
                 "oneDNN " STR(DNNL_VERSION_MAJOR) "." STR(
                     DNNL_VERSION_MINOR) " has no bf16 matmul for ISA %s",
                 isa_name);
        why = buf;
    } else if (probe == dnnl_success && !has_bf16_insns && !(env && !strcmp(env, "0"))) {
        snprintf(buf, sizeof buf, "ISA %s has no bf16 instructions", isa_name);
        why = buf;
    } /* (any other failure is not the CPU's: the first product reports it) */
    bf16_emulate = why != NULL;
    if (why)
        snprintf(bf16_how, sizeof bf16_how, "%s (%s)%s", EMULATED, why, EMULATED_COST);
    else
        snprintf(bf16_how, sizeof bf16_how, "bf16 matrix products native (oneDNN, ISA %s)",
                 isa_name);
}

static bool bf16_emulating(void)
{
    pthread_once(&bf16_once, bf16_decide);
    return bf16_emulate || atomic_load_explicit(&bf16_forced, memory_order_relaxed);
}

/* Every bf16 value is an fp32 value, so widening is exact and the fp32 product
 * of the widened operands differs from oneDNN's bf16 product (fp32
 * accumulation) only in summation order. The widened copies live in the calling
 * thread's context, at most GEMM_WIDE_FLOATS (64 MiB) of them: a product whose
 * operands are larger is taken in panels of C (and, for K above 8192, in panels
 * of K that accumulate into C). Of GPT-2 124M's products at B·T = 4096 only the
 * LM head's need more than one panel. Tests lower the bound to make panels. */
#define GEMM_WIDE_FLOATS ((int64_t)1 << 24)
static _Atomic int64_t wide_max_floats = GEMM_WIDE_FLOATS;

/* Panel sizes: op(A) panels mb×kb, op(B) panels kb×nb, (mb + nb)·kb within
 * max_floats, the whole of whichever operand fits, splits at multiples of 64.
 * With the default bound a split panel is at least 1024 wide (8192 along K). */
struct panels {
    int mb, nb, kb;
};

static int64_t min64(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

/* x, or x rounded down to a multiple of 64 where it splits a dimension of `whole` */
static int64_t split64(int64_t x, int64_t whole)
{
    if (x < 1) return 1;
    return x < whole && x >= 128 ? x & ~(int64_t)63 : x;
}

static struct panels panels_plan(int M, int N, int K, int64_t E)
{
    int64_t m0 = min64(M, 1024), n0 = min64(N, 1024);
    int64_t kb = split64(min64(K, E / (m0 + n0)), K), mb, nb;
    if (M * kb <= E - n0 * kb) {
        mb = M;
        nb = min64(N, (E - M * kb) / kb);
    } else if (N * kb <= E - m0 * kb) {
        nb = N;
        mb = min64(M, (E - N * kb) / kb);
    } else {
        mb = min64(M, E / (2 * kb));
        nb = min64(N, (E - mb * kb) / kb);
    }
    return (struct panels){(int)split64(mb, M), (int)split64(nb, N), (int)kb};
}

/* ---- bf16 conversions: plain loops the compiler vectorizes, cloned per ISA ---- */

/* (bf16_round in bf16.h says how; large arrays are split over the threads) */
__attribute__((target_clones("avx512f", "avx2", "default"))) void
bf16_from_f32(uint16_t *dst, const float *src, size_t n)
{
#pragma omp parallel for simd schedule(static) if (n >= (1u << 18))
    for (size_t i = 0; i < n; i++) dst[i] = bf16_round(src[i]);
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void
bf16_to_f32(float *dst, const uint16_t *src, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t x = (uint32_t)src[i] << 16;
        memcpy(&dst[i], &x, sizeof x);
    }
}

/* rows×cols bf16 values at src (leading dimension ld) -> dense fp32 at dst */
static void widen(float *dst, const uint16_t *src, int rows, int cols, int ld)
{
    bool par = (int64_t)rows * cols >= (1 << 16) && !omp_in_parallel();
    (void)par; /* (used only by the pragma, which a build without OpenMP drops) */
#pragma omp parallel for schedule(static) if (par)
    for (int r = 0; r < rows; r++)
        bf16_to_f32(dst + (size_t)r * cols, src + (size_t)r * ld, (size_t)cols);
}

/* The calling thread's fp32 panels, grown to floats (contents not kept). */
static int wide_get(float **out, size_t floats, const struct call *call)
{
    struct thread_ctx *ctx;
    if (thread_ctx_get(&ctx, 0, call) != 0) return -1;
    if (floats > ctx->wide_floats) {
        size_t bytes = (floats * sizeof(float) + 4095) & ~(size_t)4095;
        float *p = aligned_alloc(4096, bytes);
        if (!p) return fail(call, "out of memory (fp32 panels of %zu bytes)", bytes);
        free(ctx->wide);
        ctx->wide = p;
        ctx->wide_floats = bytes / sizeof(float);
    }
    *out = ctx->wide;
    return 0;
}

/* gemm_bf16 in fp32, panel by panel. A panel of op(A) is kept across the
 * panels of C that share it when K is one panel; op(B) is widened once when it
 * fits whole. Widened panels keep their operand's orientation. */
static int emulated(const struct call *call, float alpha, const uint16_t *A, int lda,
                    const uint16_t *B, int ldb, float beta, float *C, int ldc)
{
    const bool ta = call->ta, tb = call->tb;
    const int M = call->M, N = call->N, K = call->K;
    if (dnnl_init_status != dnnl_success) /* (bf16_emulating() ran dnnl_init) */
        return fail(call, "oneDNN: %s", dnnl_status2str(dnnl_init_status));
    const struct panels p =
        panels_plan(M, N, K, atomic_load_explicit(&wide_max_floats, memory_order_relaxed));
    size_t a_floats = ((size_t)p.mb * p.kb + 15) & ~(size_t)15; /* B's panel 64-byte aligned */
    float *wa = NULL;
    if (wide_get(&wa, a_floats + (size_t)p.nb * p.kb, call) != 0) return -1;
    float *wb = wa + a_floats;
    const bool a_whole_k = p.kb == K, b_whole = p.nb == N && p.kb == K;
    char msg[256];
    for (int i0 = 0; i0 < M; i0 += p.mb) {
        int mb = p.mb < M - i0 ? p.mb : M - i0;
        for (int j0 = 0; j0 < N; j0 += p.nb) {
            int nb = p.nb < N - j0 ? p.nb : N - j0;
            for (int k0 = 0; k0 < K; k0 += p.kb) {
                int kb = p.kb < K - k0 ? p.kb : K - k0;
                if (j0 == 0 || !a_whole_k) {
                    if (ta) /* stored K×M: rows k0.., columns i0.. */
                        widen(wa, A + (size_t)k0 * lda + i0, kb, mb, lda);
                    else
                        widen(wa, A + (size_t)i0 * lda + k0, mb, kb, lda);
                }
                if (i0 == 0 || !b_whole) {
                    if (tb) /* stored N×K: rows j0.., columns k0.. */
                        widen(wb, B + (size_t)j0 * ldb + k0, nb, kb, ldb);
                    else
                        widen(wb, B + (size_t)k0 * ldb + j0, kb, nb, ldb);
                }
                if (gemm_f32(ta, tb, mb, nb, kb, alpha, wa, ta ? mb : kb, wb, tb ? kb : nb,
                             k0 ? 1.0f : beta, C + (size_t)i0 * ldc + j0, ldc, msg, sizeof msg))
                    return fail(call, "emulated in fp32: %s",
                                msg + (strncmp(msg, "plait: ", 7) ? 0 : 7));
            }
        }
    }
    return 0;
}

bool gemm_bf16_emulated(const char **how)
{
    pthread_once(&bf16_once, bf16_decide);
    bool forced = atomic_load_explicit(&bf16_forced, memory_order_relaxed);
    if (how) *how = forced && !bf16_emulate ? EMULATED " (forced)" EMULATED_COST : bf16_how;
    return forced || bf16_emulate;
}

void gemm_bf16_force_emulation(bool on, size_t panel_floats)
{
    int64_t max =
        panel_floats && panel_floats < GEMM_WIDE_FLOATS ? (int64_t)panel_floats : GEMM_WIDE_FLOATS;
    atomic_store_explicit(&wide_max_floats, max, memory_order_relaxed);
    atomic_store_explicit(&bf16_forced, on, memory_order_relaxed);
}

/* ---- the interface ---- */

int gemm_f32(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
             const float *B, int ldb, float beta, float *C, int ldc, char *errbuf,
             size_t errbuf_bytes)
{
    const struct call call_ = {"gemm_f32", ta, tb, M, N, K, errbuf, errbuf_bytes}, *call = &call_;
    int rc = 0;
    if (check_args(call, A, lda, B, ldb, C, ldc)) return -1;
    if (M == 0 || N == 0) return 0;
    if (K == 0 || alpha == 0.0f) {
        scale_c(M, N, beta, C, ldc);
        return 0;
    }
    if (!ta && tb && (int64_t)M * N * K >= GEMM_PRIM_MIN_MACS)
        return matmul(dnnl_f32, call, alpha, A, lda, B, ldb, beta, C, ldc);
    DNNL_CHECK(
        dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc));
out:
    return rc;
}

int gemm_bf16(bool ta, bool tb, int M, int N, int K, float alpha, const uint16_t *A, int lda,
              const uint16_t *B, int ldb, float beta, float *C, int ldc, char *errbuf,
              size_t errbuf_bytes)
{
    const struct call call = {"gemm_bf16", ta, tb, M, N, K, errbuf, errbuf_bytes};
    if (check_args(&call, A, lda, B, ldb, C, ldc)) return -1;
    if (M == 0 || N == 0) return 0;
    if (K == 0 || alpha == 0.0f) {
        scale_c(M, N, beta, C, ldc);
        return 0;
    }
    if (bf16_emulating()) return emulated(&call, alpha, A, lda, B, ldb, beta, C, ldc);
    return matmul(dnnl_bf16, &call, alpha, A, lda, B, ldb, beta, C, ldc);
}

int gemm_f64(bool ta, bool tb, int M, int N, int K, double alpha, const double *A, int lda,
             const double *B, int ldb, double beta, double *C, int ldc, char *errbuf,
             size_t errbuf_bytes)
{
    const struct call call = {"gemm_f64", ta, tb, M, N, K, errbuf, errbuf_bytes};
    if (check_args(&call, A, lda, B, ldb, C, ldc)) return -1;
    if (M == 0 || N == 0) return 0;
    cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
                K, alpha, A, lda, B, ldb, beta, C, ldc);
    return 0;
}

const char *gemm_backend_name(void)
{
    return "oneDNN " STR(DNNL_VERSION_MAJOR) "." STR(DNNL_VERSION_MINOR) "." STR(
        DNNL_VERSION_PATCH) " (dnnl_sgemm; matmul primitive for large NT)";
}
