/* ops_cpu.c — the CPU backend of kernels/ops.h: instantiates the generic
 * kernels for float and double, adds what only the float path has (bf16
 * matrix products, AdamW, memory), its context (the sticky error and the
 * scratch of the bf16 and fp8 products) and fills the ops table. The
 * kernels' maths lives in ops_generic.inc; the matrix products in gemm.c,
 * whose oneDNN engine and primitive cache are process-wide and thread-safe,
 * shared by every context (gemm.h). */
#include "kernels/cpu/ops_cpu.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/bf16.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/vmath.h"
#include "kernels/fp8.h"
#include "kernels/ops.h"
#include "kernels/ops_error.h"

/* ---- the context -------------------------------------------------------------- */

/* fp8 operand slots (see the fp8 products below): input, weight, gradient, again */
enum { Q_X, Q_W, Q_D, Q_DT, Q_SLOTS };

/* What a CPU context owns: the sticky error and scratch grown on demand
 * (bf16 copies of activations, two slots; fp8 operands), used by one thread
 * at a time, as ops.h says. */
struct ops_ctx {
    struct ops_error error;
    uint16_t *scratch16[2];
    size_t scratch16_elems[2];
    float *scratch32; /* a block of a bf16 activation's fp32 values, before rounding */
    size_t scratch32_elems;
    struct fp8_slot {
        uint8_t *q;
        float *f, *scales;
        size_t q_elems, f_elems, n_scales;
    } fp8[Q_SLOTS];
};

static struct ops_ctx *cpu_open(int device, char *errbuf, size_t errbuf_bytes)
{
    (void)device; /* one CPU */
    struct ops_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx || ops_error_init(&ctx->error)) {
        free(ctx);
        if (errbuf && errbuf_bytes)
            snprintf(errbuf, errbuf_bytes, "out of memory for the cpu backend's context");
        return NULL;
    }
    return ctx;
}

static void cpu_close(struct ops_ctx *ctx)
{
    if (!ctx) return;
    for (int i = 0; i < 2; i++) free(ctx->scratch16[i]);
    free(ctx->scratch32);
    for (int i = 0; i < Q_SLOTS; i++) {
        free(ctx->fp8[i].q);
        free(ctx->fp8[i].f);
        free(ctx->fp8[i].scales);
    }
    ops_error_destroy(&ctx->error);
    free(ctx);
}

void cpu_set_error(struct ops_ctx *ctx, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ops_error_vset(&ctx->error, fmt, ap);
    va_end(ap);
}

static int cpu_take_error(struct ops_ctx *ctx, char *buf, size_t bytes)
{
    return ops_error_take(&ctx->error, buf, bytes);
}

/* ---- the generic kernels, twice -------------------------------------------- */

#define CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

#define real float
#define SFX _f32
#define EXP vexpf
#define TANH vtanhf
#define SQRT sqrtf
#define LOG logf
#define GEMM gemm_f32
#define PAR_ATTN 1
#include "kernels/cpu/ops_generic.inc"

#define real double
#define SFX _f64
#define EXP exp
#define TANH tanh
#define SQRT sqrt
#define LOG log
#define GEMM gemm_f64
#define PAR_ATTN 0 /* CBLAS from several threads at once is not guaranteed safe */
#include "kernels/cpu/ops_generic.inc"

/* ---- memory ---------------------------------------------------------------- */

static void *cpu_alloc(struct ops_ctx *ctx, size_t bytes)
{
    /* large buffers page-aligned (an offloaded moment's window moves with O_DIRECT), the
     * size a multiple of the alignment as aligned_alloc wants */
    size_t align = bytes >= 65536 ? 4096 : 64, rounded = (bytes + align - 1) / align * align;
    void *p = aligned_alloc(align, rounded ? rounded : align);
    if (!p) {
        cpu_set_error(ctx, "out of memory allocating %zu bytes", bytes);
        return NULL;
    }
    memset(p, 0, rounded ? rounded : 64);
    return p;
}

static void cpu_free(struct ops_ctx *ctx, void *p)
{
    (void)ctx;
    free(p);
}

static void cpu_copy(struct ops_ctx *ctx, void *dst, const void *src, size_t bytes)
{
    (void)ctx;
    /* large copies (checkpoints' host copies, whole buffers) in 1 MiB pieces on
     * every thread: one core's memcpy leaves memory bandwidth unused */
    enum { PIECE = 1 << 20 };
    if (bytes < 8 * (size_t)PIECE) {
        memcpy(dst, src, bytes);
        return;
    }
    long pieces = (long)((bytes + PIECE - 1) / PIECE);
#pragma omp parallel for schedule(static)
    for (long k = 0; k < pieces; k++) {
        size_t at = (size_t)k * PIECE, n = bytes - at < PIECE ? bytes - at : PIECE;
        memcpy((char *)dst + at, (const char *)src + at, n);
    }
}

static void cpu_copy_rows(struct ops_ctx *ctx, void *dst, size_t dst_pitch, const void *src,
                          size_t src_pitch, size_t row_bytes, size_t rows)
{
    (void)ctx;
#pragma omp parallel for schedule(static) if (rows * row_bytes >= ((size_t)1 << 20))
    for (size_t r = 0; r < rows; r++)
        memcpy((char *)dst + r * dst_pitch, (const char *)src + r * src_pitch, row_bytes);
}

static void cpu_zero(struct ops_ctx *ctx, void *p, size_t bytes)
{
    (void)ctx;
    memset(p, 0, bytes);
}

/* out (N,OC) rows = bias (OC): the start of a product that adds it (beta 1) */
static void fill_rows(float *out, const float *bias, int N, int OC)
{
#pragma omp parallel for
    for (int r = 0; r < N; r++) memcpy(out + (size_t)r * OC, bias, (size_t)OC * sizeof(float));
}

/* ---- bf16 matrix products -------------------------------------------------- */

/* Scratch buffer p holding *have elements, grown to want (its contents
 * lost); NULL, with the sticky error, when out of memory. */
static void *grow(struct ops_ctx *ctx, void *p, size_t *have, size_t want, size_t elem_bytes)
{
    if (*have >= want && p) return p;
    free(p);
    p = aligned_alloc(64, (want * elem_bytes + 63) / 64 * 64 + 64);
    *have = p ? want : 0;
    if (!p) cpu_set_error(ctx, "out of memory for a copy of %zu elements in bf16 or fp8", want);
    return p;
}

/* A bf16 copy of src in ctx's scratch slot (0 or 1), or NULL (the error set). */
static uint16_t *bf16_scratch(struct ops_ctx *ctx, int slot, const float *src, size_t n)
{
    uint16_t **p = &ctx->scratch16[slot];
    *p = grow(ctx, *p, &ctx->scratch16_elems[slot], n, sizeof(uint16_t));
    if (*p) bf16_from_f32(*p, src, n);
    return *p;
}

static void mm16(struct ops_ctx *ctx, bool ta, bool tb, int M, int N, int K, const uint16_t *A,
                 int lda, const uint16_t *B, int ldb, float beta, float *Cm, int ldc)
{
    char msg[256];
    if (gemm_bf16(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, Cm, ldc, msg, sizeof msg) != 0)
        cpu_set_error(ctx, "bf16 gemm %c%c %dx%dx%d: %s", ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K,
                      msg);
}

static void cpu_matmul_forward(struct ops_ctx *ctx, float *out, const float *inp, const float *w,
                               const uint16_t *w16, const float *bias, int N, int C, int OC)
{
    if (!w16) {
        cpu_matmul_forward_f32(ctx, out, inp, w, bias, N, C, OC);
        return;
    }
    const uint16_t *x16 = bf16_scratch(ctx, 0, inp, (size_t)N * C);
    if (!x16) return;
    if (bias) fill_rows(out, bias, N, OC);
    mm16(ctx, false, true, N, OC, C, x16, C, w16, C, bias ? 1.0f : 0.0f, out, OC);
}

static void cpu_matmul_backward(struct ops_ctx *ctx, float *dinp, float *dw, float *dbias,
                                const float *dout, const float *inp, const float *w,
                                const uint16_t *w16, int N, int C, int OC, bool accumulate)
{
    if (!w16) {
        cpu_matmul_backward_f32(ctx, dinp, dw, dbias, dout, inp, w, N, C, OC, accumulate);
        return;
    }
    const uint16_t *d16 = bf16_scratch(ctx, 0, dout, (size_t)N * OC);
    const uint16_t *x16 = dw ? bf16_scratch(ctx, 1, inp, (size_t)N * C) : NULL;
    if (!d16 || (dw && !x16)) return;
    if (dinp) mm16(ctx, false, false, N, C, OC, d16, OC, w16, C, 0.0f, dinp, C);
    if (!dw) return;
    mm16(ctx, true, false, OC, C, N, d16, OC, x16, C, accumulate ? 1.0f : 0.0f, dw, C);
    if (dbias) bias_backward_f32(dbias, dout, N, OC, accumulate);
}

/* ---- bf16 activations (kernels/ops.h): the fp32 op, then rounded; products on the
 * bf16 input as it is -------------------------------------------------------------- */

/* Values computed a block at a time: the fp32 scratch stays a few MiB, not an activation */
enum { BLOCK_FLOATS = 1 << 20 };

/* Rows of `cols` floats a block holds (at least one). */
static int block_rows(int cols)
{
    return cols >= BLOCK_FLOATS ? 1 : BLOCK_FLOATS / (cols > 0 ? cols : 1);
}

/* The fp32 scratch of n floats, or NULL (the error set). */
static float *f32_block(struct ops_ctx *ctx, size_t n)
{
    ctx->scratch32 = grow(ctx, ctx->scratch32, &ctx->scratch32_elems, n, sizeof(float));
    return ctx->scratch32;
}

static void cpu_layernorm_forward16(struct ops_ctx *ctx, uint16_t *out, float *mean, float *rstd,
                                    const float *inp, const float *w, const float *b, int N, int C)
{
    int rows = block_rows(C);
    float *y = f32_block(ctx, (size_t)(rows < N ? rows : N) * C);
    for (int r = 0; y && r < N; r += rows) {
        int n = N - r < rows ? N - r : rows;
        size_t at = (size_t)r * C;
        cpu_layernorm_forward_f32(ctx, y, mean + r, rstd + r, inp + at, w, b, n, C);
        bf16_from_f32(out + at, y, (size_t)n * C);
    }
}

static void cpu_rmsnorm_forward16(struct ops_ctx *ctx, uint16_t *out, float *rstd, const float *inp,
                                  const float *w, int N, int C, float eps)
{
    int rows = block_rows(C);
    float *y = f32_block(ctx, (size_t)(rows < N ? rows : N) * C);
    for (int r = 0; y && r < N; r += rows) {
        int n = N - r < rows ? N - r : rows;
        size_t at = (size_t)r * C;
        cpu_rmsnorm_forward_f32(ctx, y, rstd + r, inp + at, w, n, C, eps);
        bf16_from_f32(out + at, y, (size_t)n * C);
    }
}

static void cpu_gelu_forward16(struct ops_ctx *ctx, uint16_t *out, const float *inp, size_t n)
{
    float *y = f32_block(ctx, n < BLOCK_FLOATS ? n : BLOCK_FLOATS);
    for (size_t i = 0; y && i < n; i += BLOCK_FLOATS) {
        size_t k = n - i < BLOCK_FLOATS ? n - i : BLOCK_FLOATS;
        cpu_gelu_forward_f32(ctx, y, inp + i, k);
        bf16_from_f32(out + i, y, k);
    }
}

static void cpu_swiglu_forward16(struct ops_ctx *ctx, uint16_t *out, const float *inp, int N, int F)
{
    int rows = block_rows(F);
    float *y = f32_block(ctx, (size_t)(rows < N ? rows : N) * F);
    for (int r = 0; y && r < N; r += rows) {
        int n = N - r < rows ? N - r : rows;
        cpu_swiglu_forward_f32(ctx, y, inp + (size_t)r * 2 * F, n, F);
        bf16_from_f32(out + (size_t)r * F, y, (size_t)n * F);
    }
}

static void cpu_residual_layernorm_forward16(struct ops_ctx *ctx, float *res, uint16_t *out,
                                             float *mean, float *rstd, const float *a,
                                             const float *b, const float *w, const float *bias,
                                             int N, int C)
{
    cpu_residual_forward_f32(ctx, res, a, b, (size_t)N * C);
    cpu_layernorm_forward16(ctx, out, mean, rstd, res, w, bias, N, C);
}

static void cpu_residual_rmsnorm_forward16(struct ops_ctx *ctx, float *res, uint16_t *out,
                                           float *rstd, const float *a, const float *b,
                                           const float *w, int N, int C, float eps)
{
    cpu_residual_forward_f32(ctx, res, a, b, (size_t)N * C);
    cpu_rmsnorm_forward16(ctx, out, rstd, res, w, N, C, eps);
}

static void cpu_matmul_forward16(struct ops_ctx *ctx, float *out, const uint16_t *inp,
                                 const uint16_t *w16, const float *bias, int N, int C, int OC)
{
    if (bias) fill_rows(out, bias, N, OC);
    mm16(ctx, false, true, N, OC, C, inp, C, w16, C, bias ? 1.0f : 0.0f, out, OC);
}

static void cpu_matmul_backward16(struct ops_ctx *ctx, float *dinp, float *dw, float *dbias,
                                  const float *dout, const uint16_t *inp, const uint16_t *w16,
                                  int N, int C, int OC, bool accumulate)
{
    const uint16_t *d16 = bf16_scratch(ctx, 0, dout, (size_t)N * OC);
    if (!d16) return;
    if (dinp) mm16(ctx, false, false, N, C, OC, d16, OC, w16, C, 0.0f, dinp, C);
    if (!dw) return;
    mm16(ctx, true, false, OC, C, N, d16, OC, inp, C, accumulate ? 1.0f : 0.0f, dw, C);
    if (dbias) bias_backward_f32(dbias, dout, N, OC, accumulate);
}

/* The classifier's, dlogits computed over the logits as the fp32 op does, then rounded */
static void cpu_classifier16(struct ops_ctx *ctx, uint16_t *dlogits16, float *logits, float *losses,
                             const int32_t *targets, int N, int V, int Vp, float grad_scale)
{
    cpu_classifier_f32(ctx, logits, losses, targets, N, V, Vp, grad_scale);
    bf16_from_f32(dlogits16, logits, (size_t)N * Vp);
}

static void cpu_classifier_finish16(struct ops_ctx *ctx, uint16_t *dlogits16, float *logits,
                                    float *losses, const int32_t *targets, const float *row_max,
                                    const float *row_sum, const float *target_logit, int v0, int nv,
                                    int Vp, int N, float grad_scale)
{
    cpu_classifier_finish_f32(ctx, logits, losses, targets, row_max, row_sum, target_logit, v0, nv,
                              Vp, N, grad_scale);
    bf16_from_f32(dlogits16, logits, (size_t)N * Vp);
}

static void cpu_matmul_backward_dout16(struct ops_ctx *ctx, float *dinp, float *dw,
                                       const uint16_t *dout, const uint16_t *inp,
                                       const uint16_t *w16, int N, int C, int OC, bool accumulate)
{
    if (dinp) mm16(ctx, false, false, N, C, OC, dout, OC, w16, C, 0.0f, dinp, C);
    if (dw) mm16(ctx, true, false, OC, C, N, dout, OC, inp, C, accumulate ? 1.0f : 0.0f, dw, C);
}

/* The line from gemm_bf16_emulated, when emulated. */
static const char *cpu_bf16_emulation(struct ops_ctx *ctx)
{
    (void)ctx;
    const char *how;
    return gemm_bf16_emulated(&how) ? how : NULL;
}

/* ---- fp8 matrix products ---------------------------------------------------- */

/* The products are emulated: each operand is quantised by kernels/fp8.h
 * (bytes and scales, what a GPU's fp8 GEMM takes) and decoded back to fp32,
 * exactly, and gemm_f32 multiplies; the weight comes quantised already (the
 * model's fp8 copy) and is only decoded. Tensor scaling decodes the codes
 * alone and divides the product by both scales (alpha = 1/sa · 1/sb, as
 * cuBLASLt's scale pointers do); block scaling divides each decoded value by
 * its tile's scale, which is the per-128-deep partial product scaling of
 * DeepSeek-V3 within fp32 rounding. dinp's product reads the decoded weight
 * (OC,C) as it is (a gemm takes either orientation): no transpose here.
 * (operand slots Q_X..Q_DT: the context's fp8 scratch) */

/* Tiles of an operand (0 × 0: the whole tensor, one scale). */
struct tile {
    int rows, cols;
};

/* An activation or gradient: with block scaling 1×128 tiles along the
 * reduction dimension, its columns, or (reduced along its rows) 128×1. */
static struct tile act_tile(bool block, bool reduced_along_rows)
{
    if (!block) return (struct tile){0, 0};
    return reduced_along_rows ? (struct tile){FP8_TILE, 1} : (struct tile){1, FP8_TILE};
}

/* q (rows, cols) in tiles t with its scales s decoded into ctx's slot's
 * floats, which it returns (NULL on failure); *scale: the tensor's scale, or
 * 1 when the tiles' scales were divided out in decoding. */
static const float *fp8_decoded(struct ops_ctx *ctx, int slot, const uint8_t *q, const float *s,
                                int rows, int cols, struct tile t, enum fp8_format fmt,
                                float *scale)
{
    size_t n = (size_t)rows * cols;
    bool tensor = t.rows == 0 && t.cols == 0;
    struct fp8_slot *sc = &ctx->fp8[slot];
    float *f = sc->f = grow(ctx, sc->f, &sc->f_elems, n, sizeof(float));
    if (!f) return NULL;
    fp8_dequantize(f, q, tensor ? NULL : s, rows, cols, t.rows, t.cols, fmt);
    *scale = tensor ? s[0] : 1.0f;
    return f;
}

/* x (rows, cols) quantised in tiles into ctx's slot's bytes and scales, then
 * decoded (fp8_decoded). */
static const float *fp8_operand(struct ops_ctx *ctx, int slot, const float *x, int rows, int cols,
                                struct tile t, enum fp8_format fmt, float *scale)
{
    size_t n = (size_t)rows * cols, ns = fp8_scale_count(rows, cols, t.rows, t.cols);
    struct fp8_slot *sc = &ctx->fp8[slot];
    uint8_t *q = sc->q = grow(ctx, sc->q, &sc->q_elems, n, 1);
    float *s = sc->scales = grow(ctx, sc->scales, &sc->n_scales, ns, sizeof(float));
    if (!q || !s) return NULL;
    fp8_quantize(q, s, x, rows, cols, t.rows, t.cols, fmt);
    return fp8_decoded(ctx, slot, q, s, rows, cols, t, fmt, scale);
}

/* The weight's copy w8 (OC,C) decoded (its tiles: fp8_weight_tile). */
static const float *fp8_weight(struct ops_ctx *ctx, const uint8_t *w8, const float *w_scales,
                               int OC, int C, enum fp8_scaling scaling, float *scale)
{
    int e = fp8_weight_tile(scaling);
    return fp8_decoded(ctx, Q_W, w8, w_scales, OC, C, (struct tile){e, e}, FP8_E4M3, scale);
}

static void cpu_matmul_forward_fp8(struct ops_ctx *ctx, float *out, const float *inp,
                                   const uint8_t *w8, const float *w_scales, const float *bias,
                                   int N, int C, int OC, enum fp8_scaling scaling)
{
    bool block = scaling == FP8_SCALING_BLOCK;
    float sx, sw;
    const float *x8 = fp8_operand(ctx, Q_X, inp, N, C, act_tile(block, false), FP8_E4M3, &sx);
    const float *w = fp8_weight(ctx, w8, w_scales, OC, C, scaling, &sw);
    if (!x8 || !w) return;
    if (bias) fill_rows(out, bias, N, OC);
    mm_f32(ctx, false, true, N, OC, C, 1.0f / sx * (1.0f / sw), x8, C, w, C, bias ? 1.0f : 0.0f,
           out, OC);
}

static void cpu_matmul_backward_fp8(struct ops_ctx *ctx, float *dinp, float *dw, float *dbias,
                                    const float *dout, const float *inp, const uint8_t *w8,
                                    const float *w_scales, int N, int C, int OC, bool accumulate,
                                    enum fp8_scaling scaling)
{
    bool block = scaling == FP8_SCALING_BLOCK;
    enum fp8_format grad = block ? FP8_E4M3 : FP8_E5M2;
    float sd = 1.0f, sw, sx;
    /* dinp (N,C) = dout (N,OC) · w (OC,C): reduced over OC, dout's columns
     * (a tensor's dout serves the weight gradient too) */
    const float *d8 = NULL;
    if (dinp || !block) {
        d8 = fp8_operand(ctx, Q_D, dout, N, OC, act_tile(block, false), grad, &sd);
        if (!d8) return;
    }
    if (dinp) {
        const float *w = fp8_weight(ctx, w8, w_scales, OC, C, scaling, &sw);
        if (!w) return;
        mm_f32(ctx, false, false, N, C, OC, 1.0f / sd * (1.0f / sw), d8, OC, w, C, 0.0f, dinp, C);
    }
    if (!dw) return;
    /* dw (OC,C) = doutᵀ · inp (N,C): reduced over N, both operands' rows */
    float sdt = sd;
    const float *dt8 =
        block ? fp8_operand(ctx, Q_DT, dout, N, OC, act_tile(block, true), grad, &sdt) : d8;
    const float *x8 =
        dt8 ? fp8_operand(ctx, Q_X, inp, N, C, act_tile(block, true), FP8_E4M3, &sx) : NULL;
    if (!x8) return;
    mm_f32(ctx, true, false, OC, C, N, 1.0f / sdt * (1.0f / sx), dt8, OC, x8, C,
           accumulate ? 1.0f : 0.0f, dw, C);
    if (dbias) bias_backward_f32(dbias, dout, N, OC, accumulate);
}

/* the fp8 copy of a weight matrix: kernels/fp8.h's quantiser as it is */
static void cpu_quantize_fp8(struct ops_ctx *ctx, uint8_t *q, float *scales, const float *x,
                             int rows, int cols, int tile_rows, int tile_cols, enum fp8_format fmt)
{
    (void)ctx;
    fp8_quantize(q, scales, x, rows, cols, tile_rows, tile_cols, fmt);
}

/* ---- optimizer -------------------------------------------------------------- */

/* torch.optim.AdamW (single-tensor path of PyTorch 1.13), step by step:
 *   p ← p·(1 − lr·wd);  m ← β1·m + (1−β1)·g;  v ← β2·v + (1−β2)·g²
 *   p ← p − (lr / (1−β1ᵗ)) · m / (√v / √(1−β2ᵗ) + eps)
 * One pass over the tensors; with p16 the bf16 copy is written in it too. */
CPU_CLONES static void adamw_loop(float *p, uint16_t *p16, const float *g, float *m, float *v,
                                  size_t n, float decay, float step_size, float bc2_sqrt,
                                  const float beta[4], float eps, float grad_scale, bool with16)
{
    float beta1 = beta[0], one_minus_beta1 = beta[1], beta2 = beta[2], one_minus_beta2 = beta[3];
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] * grad_scale;
        float mi = m[i] * beta1 + gi * one_minus_beta1;
        float vi = v[i] * beta2 + one_minus_beta2 * gi * gi;
        float denom = sqrtf(vi) / bc2_sqrt + eps;
        float pi = p[i] * decay - step_size * (mi / denom);
        m[i] = mi;
        v[i] = vi;
        p[i] = pi;
        if (with16) p16[i] = bf16_round(pi);
    }
}

static void cpu_adamw(struct ops_ctx *ctx, float *p, uint16_t *p16, const float *g, float *m,
                      float *v, size_t n, float lr, double beta1, double beta2, float eps,
                      float weight_decay, float grad_scale, int step)
{
    (void)ctx;
    float decay = 1.0f - lr * weight_decay;
    float step_size = (float)(lr / (1.0 - pow(beta1, step)));
    float bc2_sqrt = (float)sqrt(1.0 - pow(beta2, step));
    const float beta[4] = {(float)beta1, (float)(1.0 - beta1), (float)beta2, (float)(1.0 - beta2)};
    if (p16)
        adamw_loop(p, p16, g, m, v, n, decay, step_size, bc2_sqrt, beta, eps, grad_scale, true);
    else
        adamw_loop(p, NULL, g, m, v, n, decay, step_size, bc2_sqrt, beta, eps, grad_scale, false);
}

/* ---- the fused ops: on the CPU their composition (the same bits by construction;
 * a GPU fuses them to save passes over memory, kernels/ops.h) ---------------------- */

static void cpu_residual_layernorm_forward(struct ops_ctx *ctx, float *res, float *out, float *mean,
                                           float *rstd, const float *a, const float *b,
                                           const float *w, const float *bias, int N, int C)
{
    cpu_residual_forward_f32(ctx, res, a, b, (size_t)N * C);
    cpu_layernorm_forward_f32(ctx, out, mean, rstd, res, w, bias, N, C);
}

static void cpu_residual_rmsnorm_forward(struct ops_ctx *ctx, float *res, float *out, float *rstd,
                                         const float *a, const float *b, const float *w, int N,
                                         int C, float eps)
{
    cpu_residual_forward_f32(ctx, res, a, b, (size_t)N * C);
    cpu_rmsnorm_forward_f32(ctx, out, rstd, res, w, N, C, eps);
}

/* out (B·T, 3·NH·hs): the expansion, then its q and its NH repeated k heads rotated (the
 * same rotation of the same values as rotating packed's k heads before they are repeated) */
static void cpu_rope_kv_expand(struct ops_ctx *ctx, float *out, const float *packed, int B, int T,
                               int NH, int NKV, int hs, double theta, int pos0)
{
    cpu_kv_expand_f32(ctx, out, packed, B * T, NH, NKV, hs);
    cpu_rope_forward_f32(ctx, out, B, T, NH, NH, hs, theta, pos0);
}

static void cpu_rope_kv_expand_backward(struct ops_ctx *ctx, float *dpacked, const float *dout,
                                        int B, int T, int NH, int NKV, int hs, double theta,
                                        int pos0)
{
    cpu_kv_expand_backward_f32(ctx, dpacked, dout, B * T, NH, NKV, hs);
    cpu_rope_backward_f32(ctx, dpacked, B, T, NH, NKV, hs, theta, pos0);
}

/* Segment by segment, each over the threads: cpu_adamw's bits by construction. */
static void cpu_adamw_multi(struct ops_ctx *ctx, const struct adamw_segment *segs, int count,
                            float lr, double beta1, double beta2, float eps, float weight_decay,
                            float grad_scale, int step)
{
    for (int i = 0; i < count; i++)
        cpu_adamw(ctx, segs[i].p, segs[i].p16, segs[i].g, segs[i].m, segs[i].v, segs[i].n, lr,
                  beta1, beta2, eps, segs[i].decays ? weight_decay : 0.0f, grad_scale, step);
}

/* ---- the table --------------------------------------------------------------- */

static void cpu_sum_squares(struct ops_ctx *ctx, double *sums, const float *const *x,
                            const size_t *n, int count)
{
    for (int i = 0; i < count; i++) sums[i] = cpu_sum_squares_f32(ctx, x[i], n[i]);
}

static void cpu_to_bf16(struct ops_ctx *ctx, uint16_t *dst, const float *src, size_t n)
{
    (void)ctx;
    bf16_from_f32(dst, src, n);
}

static const struct ops cpu_ops = {
    .name = "cpu",
    .open = cpu_open,
    .close = cpu_close,
    .stream = NULL,      /* ops are done when they return */
    .synchronize = NULL, /* likewise */
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .download_after = cpu_copy, /* done at once: copies_wait has nothing to wait for */
    .copy = cpu_copy,
    .copy_rows = cpu_copy_rows,
    .zero = cpu_zero,
    .take_error = cpu_take_error,
    .encoder_forward = cpu_encoder_forward_f32,
    .encoder_backward = cpu_encoder_backward_f32,
    .add_bias = cpu_add_bias_f32,
    .layernorm_forward = cpu_layernorm_forward_f32,
    .layernorm_backward = cpu_layernorm_backward_f32,
    .matmul_forward = cpu_matmul_forward,
    .matmul_forward_gelu = NULL, /* the two ops: oneDNN's product, then the GELU */
    .matmul_backward = cpu_matmul_backward,
    .matmul_forward_fp8 = cpu_matmul_forward_fp8,
    .matmul_backward_fp8 = cpu_matmul_backward_fp8,
    .quantize_fp8 = cpu_quantize_fp8,
    .attention_forward = cpu_attention_forward_f32,
    .attention_backward = cpu_attention_backward_f32,
    .attention_block_forward = cpu_attention_block_forward_f32,
    .attention_block_backward = cpu_attention_block_backward_f32,
    .gelu_forward = cpu_gelu_forward_f32,
    .gelu_backward = cpu_gelu_backward_f32,
    .rmsnorm_forward = cpu_rmsnorm_forward_f32,
    .rmsnorm_backward = cpu_rmsnorm_backward_f32,
    .rope_forward = cpu_rope_forward_f32,
    .rope_backward = cpu_rope_backward_f32,
    .kv_expand = cpu_kv_expand_f32,
    .kv_expand_backward = cpu_kv_expand_backward_f32,
    .rope_kv_expand = cpu_rope_kv_expand,
    .rope_kv_expand_backward = cpu_rope_kv_expand_backward,
    .swiglu_forward = cpu_swiglu_forward_f32,
    .swiglu_backward = cpu_swiglu_backward_f32,
    .moe_route = cpu_moe_route_f32,
    .moe_dispatch = cpu_moe_dispatch,
    .moe_gather = cpu_moe_gather_f32,
    .moe_gather_backward = cpu_moe_gather_backward_f32,
    .moe_combine = cpu_moe_combine_f32,
    .moe_combine_backward = cpu_moe_combine_backward_f32,
    .moe_route_backward = cpu_moe_route_backward_f32,
    .moe_losses = cpu_moe_losses_f32,
    .residual_forward = cpu_residual_forward_f32,
    .residual_layernorm_forward = cpu_residual_layernorm_forward,
    .residual_rmsnorm_forward = cpu_residual_rmsnorm_forward,
    .classifier = cpu_classifier_f32,
    .classifier_max = cpu_classifier_max_f32,
    .classifier_sumexp = cpu_classifier_sumexp_f32,
    .classifier_finish = cpu_classifier_finish_f32,
    .sum_squares = cpu_sum_squares,
    .adamw = cpu_adamw,
    .adamw_multi = cpu_adamw_multi,
    .layernorm_forward16 = cpu_layernorm_forward16,
    .rmsnorm_forward16 = cpu_rmsnorm_forward16,
    .gelu_forward16 = cpu_gelu_forward16,
    .swiglu_forward16 = cpu_swiglu_forward16,
    .matmul_forward16 = cpu_matmul_forward16,
    .matmul_backward16 = cpu_matmul_backward16,
    .matmul_forward_gelu16 = NULL, /* the two ops, as matmul_forward_gelu */
    .residual_layernorm_forward16 = cpu_residual_layernorm_forward16,
    .residual_rmsnorm_forward16 = cpu_residual_rmsnorm_forward16,
    .classifier16 = cpu_classifier16,
    .classifier_finish16 = cpu_classifier_finish16,
    .matmul_backward_dout16 = cpu_matmul_backward_dout16,
    .to_bf16 = cpu_to_bf16,
    .bf16_emulation = cpu_bf16_emulation,
};

const struct ops *ops_cpu(void)
{
    return &cpu_ops;
}
