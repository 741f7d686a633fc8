/* selftest.c — plait-train --selftest: each op of the CUDA backend run against
 * its CPU twin on the same random inputs, at several shapes (odd ones among
 * them), printed as a table of max relative errors (max |gpu - cpu| / max |cpu|
 * per output) with a verdict; every op also runs twice on the GPU and must give
 * the same bits (deterministic reductions). The fp8 ops run at GPT-2 124M's
 * real product shapes too, where cuBLASLt's block-scale layouts show (a grid
 * of one block cannot be laid out wrong). Only through kernels/ops.h. */
#include "runtime/selftest.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/place/env.h"
#include "common/rng.h"
#include "kernels/cpu/bf16.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/ops.h"

/* B batch, T time, C channels, NH heads, V vocab, Vp padded vocab, OC a
 * product's output width; a mixture of experts' routing (E > 0): E experts, k
 * choices a token, capacity (0: none) and the runs its tokens are cut into */
struct shape {
    int B, T, C, NH, V, Vp, OC;
    int E, k, capacity, runs;
};

static const struct shape shapes[] = {
    {2, 5, 12, 3, 37, 40, 20, 0, 0, 0, 0},
    {3, 37, 72, 6, 301, 320, 200, 0, 0, 0, 0},
    {4, 128, 256, 4, 1000, 1024, 768, 0, 0, 0, 0},
    /* GPT-2 124M: T 1024, C 768, 12 heads, its vocabulary and the padded one,
     * the MLP's 4·C; two sequences (left out with the CPU twin unless
     * PLAIT_SELFTEST_SHAPES=all: minutes of CPU against itself) */
    {2, 1024, 768, 12, 50257, 50304, 3072, 0, 0, 0, 0},
};
enum { SMALL_SHAPES = 3 };

/* GPT-2 124M's four products of a block on 1024 rows (C → OC): qkv, the
 * attention's projection, the MLP's two; the fp8 ops run at these too */
static const struct shape gpt2_shapes[] = {
    {1, 1024, 768, 12, 50257, 50304, 2304, 0, 0, 0, 0},
    {1, 1024, 768, 12, 50257, 50304, 768, 0, 0, 0, 0},
    {1, 1024, 768, 12, 50257, 50304, 3072, 0, 0, 0, 0},
    {1, 1024, 3072, 12, 50257, 50304, 768, 0, 0, 0, 0},
};

/* The limit of an fp8 product that runs on fp8 tensor cores, against the
 * CPU's fp32 sum of the same quantised values (max |gpu - cpu| / max |cpu|).
 * The fp8 products are exact (4 × 4 significant bits, or 4 × 3); the sum is
 * not. Hopper's fp8 MMA keeps about 14 significant bits in its accumulator
 * (DeepSeek-V3, arXiv:2412.19437 §3.3.2), so an addition errs by up to
 * u = 2^-13 of the running sum; cuBLASLt without
 * CUBLASLT_MATMUL_DESC_FAST_ACCUM (matmul_fp8.cu keeps it 0) promotes the
 * partial sums to fp32 every so often: with block scaling at every 128-deep
 * block at least (each has its own scales), with tensor scaling assumed as
 * often (DeepSeek's N_C = 128; CUTLASS's sm90 fp8 kernels promote every four
 * k32 MMAs). In a chunk of L = 128 products of zero mean and variance σ², the
 * i-th addition errs by at most u·|S_i|, E S_i² = i·σ²: a chunk's error
 * variance is at most u²σ²·L(L+1)/2, K/L chunks' u²σ²·K(L+1)/2, against the
 * sum's K·σ²: an rms relative error of at most u·√((L+1)/2) = 9.8e-4 at any K
 * (256 to 3072 here). The ratio of maxima over the same 10^5 to 3·10^6 entries
 * follows the rms ratio within a small factor (emulating a truncating 14-bit
 * accumulator promoted every 128 on these inputs gives 6e-4 to 7e-4 at K =
 * 256 to 3072); the limit is twice the bound, 2.0e-3. Without the promotion
 * the error would grow as u·√((K+1)/2) and faster with a truncating
 * accumulator's drift (the same emulation: 3.7e-2 at K = 3072), which this
 * limit catches. (A product that cannot run on fp8 tensor cores runs the
 * CPU's own emulation in fp32, within the fp32 limit.) */
static double fp8_tensor_core_limit(void)
{
    const double u = 0x1p-13, L = 128;
    return 2 * u * sqrt((L + 1) / 2);
}

enum { MAX_OUTS = 6, MAX_HELD = 32 };

/* One run of one op on one backend: its device buffers and its outputs,
 * downloaded to the host. */
struct run {
    const struct ops *o;
    struct ops_ctx *ctx; /* o's */
    const struct shape *s;
    struct rng rng; /* the same seed on both backends: the same inputs */
    void *held[MAX_HELD];
    int n_held;
    bool broken; /* an allocation failed */
    int n_out;
    const char *out_name[MAX_OUTS];
    float *out[MAX_OUTS];
    size_t out_len[MAX_OUTS];
    bool out_fp32[MAX_OUTS];  /* an fp32 sum beside an fp8 product's outputs */
    bool out_exact[MAX_OUTS]; /* integers: equal, whatever the case's tolerance */
};

static void *dev(struct run *r, size_t bytes)
{
    void *p = r->n_held < MAX_HELD ? r->o->alloc(r->ctx, bytes) : NULL;
    if (!p) {
        r->broken = true;
        return NULL;
    }
    r->held[r->n_held++] = p;
    return p;
}

/* n random floats, normal·scale (+ shift), uploaded */
static float *rnd(struct run *r, size_t n, float scale, float shift)
{
    float *h = malloc(n * sizeof *h), *d = dev(r, n * sizeof *h);
    for (size_t i = 0; h && i < n; i++) h[i] = (float)rng_normal(&r->rng) * scale + shift;
    if (h && d)
        r->o->upload(r->ctx, d, h, n * sizeof *h);
    else
        r->broken = true;
    free(h);
    return d;
}

/* n tokens in [0, below) */
/* host's n ints uploaded (and freed) */
static int32_t *upload_ints(struct run *r, int32_t *host, size_t n)
{
    int32_t *d = dev(r, n * sizeof *host);
    if (host && d)
        r->o->upload(r->ctx, d, host, n * sizeof *host);
    else
        r->broken = true;
    free(host);
    return d;
}

static int32_t *tokens(struct run *r, size_t n, int below)
{
    int32_t *h = malloc(n * sizeof *h);
    for (size_t i = 0; h && i < n; i++) h[i] = (int32_t)rng_below(&r->rng, (uint64_t)below);
    return upload_ints(r, h, n);
}

/* h (n floats, malloc'd, now the run's) kept as output `name` */
static void keep(struct run *r, const char *name, float *h, size_t n)
{
    r->out_name[r->n_out] = name;
    r->out_len[r->n_out] = n;
    r->out[r->n_out++] = h;
}

static void out(struct run *r, const char *name, const void *d, size_t n)
{
    if (r->broken || r->n_out == MAX_OUTS) return;
    float *h = malloc(n * sizeof *h);
    if (!h) {
        r->broken = true;
        return;
    }
    r->o->download(r->ctx, h, d, n * sizeof *h);
    keep(r, name, h, n);
}

/* host values (integers, or doubles the op hands back on the host), as floats: exact
 * up to 2^24, which every count here is */
static void out_host(struct run *r, const char *name, const double *v, size_t n, bool exact)
{
    if (r->broken || r->n_out == MAX_OUTS) return;
    float *h = malloc(n * sizeof *h);
    if (!h) {
        r->broken = true;
        return;
    }
    for (size_t i = 0; i < n; i++) h[i] = (float)v[i];
    r->out_exact[r->n_out] = exact;
    keep(r, name, h, n);
}

/* n int32s of the device, which must be equal */
static void out_ints(struct run *r, const char *name, const int32_t *d, size_t n)
{
    int32_t *h = r->broken ? NULL : malloc(n * sizeof *h);
    double *v = h ? malloc(n * sizeof *v) : NULL;
    if (v) {
        r->o->download(r->ctx, h, d, n * sizeof *h);
        for (size_t i = 0; i < n; i++) v[i] = h[i];
        out_host(r, name, v, n, true);
    } else {
        r->broken = true;
    }
    free(h);
    free(v);
}

/* an output summed in fp32 by an fp8 op (its bias gradient): the fp32 limit */
static void out_fp32(struct run *r, const char *name, const void *d, size_t n)
{
    int k = r->n_out;
    out(r, name, d, n);
    if (r->n_out > k) r->out_fp32[k] = true;
}

/* a bf16 output, widened exactly to floats for the comparison */
static void out16(struct run *r, const char *name, const uint16_t *d, size_t n)
{
    if (r->broken || r->n_out == MAX_OUTS) return;
    uint16_t *h16 = malloc(n * sizeof *h16);
    float *h = malloc(n * sizeof *h);
    if (!h || !h16) {
        free(h);
        free(h16);
        r->broken = true;
        return;
    }
    r->o->download(r->ctx, h16, d, n * sizeof *h16);
    for (size_t i = 0; i < n; i++) {
        uint32_t bits = (uint32_t)h16[i] << 16;
        memcpy(&h[i], &bits, sizeof bits);
    }
    free(h16);
    keep(r, name, h, n);
}

/* fp8 codes, each widened to its code number (equal floats: the same bits) */
static void out8(struct run *r, const char *name, const uint8_t *d, size_t n)
{
    if (r->broken || r->n_out == MAX_OUTS) return;
    uint8_t *h8 = malloc(n);
    float *h = malloc(n * sizeof *h);
    if (!h || !h8) {
        free(h);
        free(h8);
        r->broken = true;
        return;
    }
    r->o->download(r->ctx, h8, d, n);
    for (size_t i = 0; i < n; i++) h[i] = (float)h8[i];
    free(h8);
    keep(r, name, h, n);
}

static void run_free(struct run *r)
{
    for (int i = 0; i < r->n_held; i++) r->o->free(r->ctx, r->held[i]);
    for (int i = 0; i < r->n_out; i++) free(r->out[i]);
    memset(r, 0, sizeof *r);
}

/* ---- the cases: each makes its inputs, runs the op(s), keeps the outputs -------- */

#define N_ROWS(s) ((size_t)(s)->B * (s)->T)

static void t_encoder_forward(struct run *r)
{
    const struct shape *s = r->s;
    int v0 = 3, nv = s->V - 10; /* a shard: some tokens fall outside it */
    int32_t *tok = tokens(r, N_ROWS(s), s->V);
    float *wte = rnd(r, (size_t)nv * s->C, 0.1f, 0), *wpe = rnd(r, (size_t)s->T * s->C, 0.1f, 0);
    float *o1 = dev(r, N_ROWS(s) * s->C * 4), *o2 = dev(r, N_ROWS(s) * s->C * 4);
    if (r->broken) return;
    r->o->encoder_forward(r->ctx, o1, tok, wte, v0, nv, wpe, s->B, s->T, s->C);
    r->o->encoder_forward(r->ctx, o2, tok, wte, v0, nv, NULL, s->B, s->T, s->C);
    out(r, "out", o1, N_ROWS(s) * s->C);
    out(r, "out_nowpe", o2, N_ROWS(s) * s->C);
}

static void t_encoder_backward(struct run *r)
{
    const struct shape *s = r->s;
    int v0 = 3, nv = s->V - 10;
    int32_t *tok = tokens(r, N_ROWS(s), s->V);
    float *dout = rnd(r, N_ROWS(s) * s->C, 1, 0);
    float *dwte = rnd(r, (size_t)nv * s->C, 1, 0), *dwpe = rnd(r, (size_t)s->T * s->C, 1, 0);
    float *dwte2 = dev(r, (size_t)s->Vp * s->C * 4), *dwpe2 = rnd(r, (size_t)s->T * s->C, 1, 0);
    if (r->broken) return;
    r->o->encoder_backward(r->ctx, dwte, v0, nv, dwpe, dout, tok, s->B, s->T, s->C, true);
    r->o->encoder_backward(r->ctx, dwte2, 0, s->Vp, dwpe2, dout, tok, s->B, s->T, s->C, false);
    out(r, "dwte_acc", dwte, (size_t)nv * s->C);
    out(r, "dwpe_acc", dwpe, (size_t)s->T * s->C);
    out(r, "dwte", dwte2, (size_t)s->Vp * s->C);
    out(r, "dwpe", dwpe2, (size_t)s->T * s->C);
}

static void t_layernorm(struct run *r)
{
    const struct shape *s = r->s;
    size_t n = N_ROWS(s) * s->C;
    float *x = rnd(r, n, 2, 0.5f), *w = rnd(r, s->C, 0.5f, 1), *b = rnd(r, s->C, 0.2f, 0);
    float *y = dev(r, n * 4), *mean = dev(r, N_ROWS(s) * 4), *rstd = dev(r, N_ROWS(s) * 4);
    float *dy = rnd(r, n, 1, 0), *dx = rnd(r, n, 1, 0);
    float *dw = rnd(r, s->C, 1, 0), *db = rnd(r, s->C, 1, 0);
    if (r->broken) return;
    int N = (int)N_ROWS(s);
    r->o->layernorm_forward(r->ctx, y, mean, rstd, x, w, b, N, s->C);
    out(r, "out", y, n);
    out(r, "mean", mean, N_ROWS(s));
    out(r, "rstd", rstd, N_ROWS(s));
    r->o->layernorm_backward(r->ctx, dx, dw, db, dy, x, w, mean, rstd, N, s->C, true);
    out(r, "dinp+=", dx, n);
    out(r, "dw_acc", dw, s->C);
    out(r, "db_acc", db, s->C);
}

static void t_matmul_forward(struct run *r, bool bf16)
{
    const struct shape *s = r->s;
    int N = (int)N_ROWS(s);
    float *x = rnd(r, (size_t)N * s->C, 1, 0), *w = rnd(r, (size_t)s->OC * s->C, 0.1f, 0);
    float *bias = rnd(r, s->OC, 1, 0);
    uint16_t *w16 = bf16 ? dev(r, (size_t)s->OC * s->C * 2) : NULL;
    float *y1 = dev(r, (size_t)N * s->OC * 4), *y2 = dev(r, (size_t)N * s->OC * 4);
    if (r->broken) return;
    if (bf16) r->o->to_bf16(r->ctx, w16, w, (size_t)s->OC * s->C);
    r->o->matmul_forward(r->ctx, y1, x, w, w16, bias, N, s->C, s->OC);
    r->o->matmul_forward(r->ctx, y2, x, w, w16, NULL, N, s->C, s->OC);
    out(r, "out_bias", y1, (size_t)N * s->OC);
    out(r, "out", y2, (size_t)N * s->OC);
}

static void t_matmul_forward_f32(struct run *r)
{
    t_matmul_forward(r, false);
}

static void t_matmul_forward_bf16(struct run *r)
{
    t_matmul_forward(r, true);
}

/* The MLP's product with its GELU: the backend's fused op where it has one,
 * else (the CPU) the two ops it stands for. */
static void t_matmul_gelu(struct run *r, bool bf16)
{
    const struct shape *s = r->s;
    int N = (int)N_ROWS(s), OC = s->OC;
    float *x = rnd(r, (size_t)N * s->C, 1, 0), *w = rnd(r, (size_t)OC * s->C, 0.1f, 0);
    float *bias = rnd(r, OC, 1, 0);
    uint16_t *w16 = bf16 ? dev(r, (size_t)OC * s->C * 2) : NULL;
    float *y = dev(r, (size_t)N * OC * 4), *pre = dev(r, (size_t)N * OC * 4);
    if (r->broken) return;
    if (bf16) r->o->to_bf16(r->ctx, w16, w, (size_t)OC * s->C);
    if (r->o->matmul_forward_gelu) {
        r->o->matmul_forward_gelu(r->ctx, y, pre, x, w, w16, bias, N, s->C, OC);
    } else {
        r->o->matmul_forward(r->ctx, pre, x, w, w16, bias, N, s->C, OC);
        r->o->gelu_forward(r->ctx, y, pre, (size_t)N * OC);
    }
    out(r, "pre", pre, (size_t)N * OC);
    out(r, "gelu", y, (size_t)N * OC);
}

static void t_matmul_gelu_f32(struct run *r)
{
    t_matmul_gelu(r, false);
}

static void t_matmul_gelu_bf16(struct run *r)
{
    t_matmul_gelu(r, true);
}

static void t_matmul_backward(struct run *r, bool bf16)
{
    const struct shape *s = r->s;
    int N = (int)N_ROWS(s), C = s->C, OC = s->OC;
    float *x = rnd(r, (size_t)N * C, 1, 0), *w = rnd(r, (size_t)OC * C, 0.1f, 0);
    float *dy = rnd(r, (size_t)N * OC, 1, 0);
    float *dx = dev(r, (size_t)N * C * 4), *dx2 = dev(r, (size_t)N * C * 4);
    float *dw = rnd(r, (size_t)OC * C, 1, 0), *db = rnd(r, OC, 1, 0);
    float *dw2 = rnd(r, (size_t)OC * C, 1, 0), *db2 = rnd(r, OC, 1, 0);
    uint16_t *w16 = bf16 ? dev(r, (size_t)OC * C * 2) : NULL;
    if (r->broken) return;
    if (bf16) r->o->to_bf16(r->ctx, w16, w, (size_t)OC * C);
    r->o->matmul_backward(r->ctx, dx, dw, db, dy, x, w, w16, N, C, OC, true);
    out(r, "dinp", dx, (size_t)N * C);
    out(r, "dw_acc", dw, (size_t)OC * C);
    out_fp32(r, "dbias_acc", db, OC);
    /* split backward: the input gradient alone, then the weights' alone */
    r->o->matmul_backward(r->ctx, dx2, NULL, NULL, dy, x, w, w16, N, C, OC, false);
    r->o->matmul_backward(r->ctx, NULL, dw2, db2, dy, x, w, w16, N, C, OC, false);
    out(r, "dinp_only", dx2, (size_t)N * C);
    out(r, "dw_only", dw2, (size_t)OC * C);
    out_fp32(r, "dbias", db2, OC);
}

static void t_matmul_backward_f32(struct run *r)
{
    t_matmul_backward(r, false);
}

static void t_matmul_backward_bf16(struct run *r)
{
    t_matmul_backward(r, true);
}

/* x (N, C) quantised in three tilings (kernels/fp8.h): codes and scales */
static void t_quantize_fp8(struct run *r, enum fp8_format fmt, const int tiles[3][2])
{
    const struct shape *s = r->s;
    int N = (int)N_ROWS(s), C = s->C;
    float *x = rnd(r, (size_t)N * C, fmt == FP8_E5M2 ? 1e-3f : 3.0f, 0);
    for (int k = 0; k < 3; k++) {
        int tr = tiles[k][0], tc = tiles[k][1];
        uint8_t *q = dev(r, (size_t)N * C);
        float *sc = dev(r, fp8_scale_count(N, C, tr, tc) * sizeof(float));
        if (r->broken) return;
        r->o->quantize_fp8(r->ctx, q, sc, x, N, C, tr, tc, fmt);
        out8(r, k == 0 ? "codes_a" : k == 1 ? "codes_b" : "codes_c", q, (size_t)N * C);
        out(r,
            k == 0   ? "scales_a"
            : k == 1 ? "scales_b"
                     : "scales_c",
            sc, fp8_scale_count(N, C, tr, tc));
    }
}

static void t_quantize_e4m3(struct run *r)
{
    static const int tiles[3][2] = {{0, 0}, {1, FP8_TILE}, {FP8_TILE, FP8_TILE}};
    t_quantize_fp8(r, FP8_E4M3, tiles);
}

static void t_quantize_e5m2(struct run *r)
{
    static const int tiles[3][2] = {{0, 0}, {FP8_TILE, 1}, {1, FP8_TILE}};
    t_quantize_fp8(r, FP8_E5M2, tiles);
}

/* w (OC, C) and its fp8 copy, as the optimizer step writes it */
static uint8_t *fp8_weight(struct run *r, enum fp8_scaling scaling, float **scales)
{
    const struct shape *s = r->s;
    int e = fp8_weight_tile(scaling);
    float *w = rnd(r, (size_t)s->OC * s->C, 0.1f, 0);
    uint8_t *w8 = dev(r, (size_t)s->OC * s->C);
    *scales = dev(r, fp8_scale_count(s->OC, s->C, e, e) * sizeof(float));
    if (r->broken) return NULL;
    r->o->quantize_fp8(r->ctx, w8, *scales, w, s->OC, s->C, e, e, FP8_E4M3);
    return w8;
}

static void t_matmul_forward_fp8(struct run *r, enum fp8_scaling scaling)
{
    const struct shape *s = r->s;
    int N = (int)N_ROWS(s);
    float *x = rnd(r, (size_t)N * s->C, 1, 0), *bias = rnd(r, s->OC, 1, 0), *ws;
    uint8_t *w8 = fp8_weight(r, scaling, &ws);
    float *y1 = dev(r, (size_t)N * s->OC * 4), *y2 = dev(r, (size_t)N * s->OC * 4);
    if (r->broken) return;
    r->o->matmul_forward_fp8(r->ctx, y1, x, w8, ws, bias, N, s->C, s->OC, scaling);
    r->o->matmul_forward_fp8(r->ctx, y2, x, w8, ws, NULL, N, s->C, s->OC, scaling);
    out(r, "out_bias", y1, (size_t)N * s->OC);
    out(r, "out", y2, (size_t)N * s->OC);
}

static void t_matmul_forward_fp8_tensor(struct run *r)
{
    t_matmul_forward_fp8(r, FP8_SCALING_TENSOR);
}

static void t_matmul_forward_fp8_block(struct run *r)
{
    t_matmul_forward_fp8(r, FP8_SCALING_BLOCK);
}

static void t_matmul_backward_fp8(struct run *r, enum fp8_scaling scaling)
{
    const struct shape *s = r->s;
    int N = (int)N_ROWS(s), C = s->C, OC = s->OC;
    float *x = rnd(r, (size_t)N * C, 1, 0), *ws;
    uint8_t *w8 = fp8_weight(r, scaling, &ws);
    float *dy = rnd(r, (size_t)N * OC, 1, 0);
    float *dx = dev(r, (size_t)N * C * 4), *dx2 = dev(r, (size_t)N * C * 4);
    float *dw = rnd(r, (size_t)OC * C, 1, 0), *db = rnd(r, OC, 1, 0);
    float *dw2 = rnd(r, (size_t)OC * C, 1, 0), *db2 = rnd(r, OC, 1, 0);
    if (r->broken) return;
    r->o->matmul_backward_fp8(r->ctx, dx, dw, db, dy, x, w8, ws, N, C, OC, true, scaling);
    out(r, "dinp", dx, (size_t)N * C);
    out(r, "dw_acc", dw, (size_t)OC * C);
    out(r, "dbias_acc", db, OC);
    r->o->matmul_backward_fp8(r->ctx, dx2, NULL, NULL, dy, x, w8, ws, N, C, OC, false, scaling);
    r->o->matmul_backward_fp8(r->ctx, NULL, dw2, db2, dy, x, w8, ws, N, C, OC, false, scaling);
    out(r, "dinp_only", dx2, (size_t)N * C);
    out(r, "dw_only", dw2, (size_t)OC * C);
    out(r, "dbias", db2, OC);
}

static void t_matmul_backward_fp8_tensor(struct run *r)
{
    t_matmul_backward_fp8(r, FP8_SCALING_TENSOR);
}

static void t_matmul_backward_fp8_block(struct run *r)
{
    t_matmul_backward_fp8(r, FP8_SCALING_BLOCK);
}

static void t_attention(struct run *r)
{
    const struct shape *s = r->s;
    size_t N = N_ROWS(s), att_n = (size_t)s->B * s->NH * s->T * s->T;
    float *qkv = rnd(r, N * 3 * s->C, 1, 0), *dout = rnd(r, N * s->C, 1, 0);
    float *o = dev(r, N * s->C * 4), *att = dev(r, att_n * 4), *datt = dev(r, att_n * 4);
    float *dqkv = dev(r, N * 3 * s->C * 4);
    if (r->broken) return;
    r->o->attention_forward(r->ctx, o, att, qkv, s->B, s->T, s->C, s->NH);
    out(r, "out", o, N * s->C);
    out(r, "att", att, att_n);
    r->o->attention_backward(r->ctx, dqkv, datt, dout, qkv, att, s->B, s->T, s->C, s->NH);
    out(r, "dqkv", dqkv, N * 3 * s->C);
}

/* the fused attention (kernels/cuda/attention_fused.cu, not in ops.h yet) on
 * the GPU against the CPU's ops.h attention: the same out and dqkv */
static void t_attention_fused(struct run *r)
{
    const struct shape *s = r->s;
    bool fused = strcmp(r->o->name, "cuda") == 0;
    size_t N = N_ROWS(s), att_n = (size_t)s->B * s->NH * s->T * s->T;
    float *qkv = rnd(r, N * 3 * s->C, 1, 0), *dout = rnd(r, N * s->C, 1, 0);
    float *o = dev(r, N * s->C * 4), *dqkv = dev(r, N * 3 * s->C * 4);
    float *att = fused ? NULL : dev(r, att_n * 4), *datt = fused ? NULL : dev(r, att_n * 4);
    float *lse = fused ? dev(r, (size_t)s->B * s->NH * s->T * 4) : NULL;
    if (r->broken) return;
    if (fused) {
        ops_cuda_attention_fused_forward(r->ctx, o, lse, qkv, s->B, s->T, s->C, s->NH);
        ops_cuda_attention_fused_backward(r->ctx, dqkv, dout, qkv, o, lse, s->B, s->T, s->C, s->NH);
    } else {
        r->o->attention_forward(r->ctx, o, att, qkv, s->B, s->T, s->C, s->NH);
        r->o->attention_backward(r->ctx, dqkv, datt, dout, qkv, att, s->B, s->T, s->C, s->NH);
    }
    out(r, "out", o, N * s->C);
    out(r, "dqkv", dqkv, N * 3 * s->C);
}

/* n positions a·i + c, uploaded */
static int32_t *positions(struct run *r, size_t n, int a, int c)
{
    int32_t *h = malloc(n * sizeof *h);
    for (size_t i = 0; h && i < n; i++) h[i] = (int32_t)(a * (int)i + c);
    return upload_ints(r, h, n);
}

/* Context parallelism's block attention (the ring's; kernels/cuda/attention_block.cu
 * on the GPU): T query rows at odd positions (q inside a qkv buffer, as the ring
 * reads it) against two blocks of T keys, at even and at odd positions, merged one
 * after the other (the first written, the second merged through the log-sum-exp);
 * then both blocks' backward added into dq and each block's dkv. */
static void t_attention_block(struct run *r)
{
    const struct shape *s = r->s;
    size_t N = N_ROWS(s), kv_n = N * 2 * s->C, rows = (size_t)s->B * s->NH * s->T;
    int hs = s->C / s->NH;
    float *qkv = rnd(r, N * 3 * s->C, 1, 0), *dout = rnd(r, N * s->C, 1, 0);
    float *kv1 = rnd(r, kv_n, 1, 0), *kv2 = rnd(r, kv_n, 1, 0);
    float *o = dev(r, N * s->C * 4), *lse = dev(r, rows * 4), *dqkv = dev(r, N * 3 * s->C * 4);
    float *dkv1 = dev(r, kv_n * 4), *dkv2 = dev(r, kv_n * 4);
    float *scratch = dev(r, ATTENTION_BLOCK_SCRATCH(s->B, s->NH, s->T, s->T, hs) * 4);
    int32_t *qpos = positions(r, (size_t)s->T, 2, 1), *even = positions(r, (size_t)s->T, 2, 0);
    int32_t *odd = positions(r, (size_t)s->T, 2, 1);
    if (r->broken) return;
    const struct ops *x = r->o;
    int B = s->B, T = s->T, C = s->C, NH = s->NH;
    x->attention_block_forward(r->ctx, o, lse, scratch, qkv, 3 * C, kv1, qpos, even, B, T, T, C,
                               NH, true);
    x->attention_block_forward(r->ctx, o, lse, scratch, qkv, 3 * C, kv2, qpos, odd, B, T, T, C, NH,
                               false);
    out(r, "out", o, N * C);
    out(r, "lse", lse, rows);
    x->zero(r->ctx, dqkv, N * 3 * C * 4);
    x->zero(r->ctx, dkv1, kv_n * 4);
    x->zero(r->ctx, dkv2, kv_n * 4);
    x->attention_block_backward(r->ctx, dqkv, dkv1, scratch, dout, qkv, 3 * C, kv1, o, lse, qpos,
                                even, B, T, T, C, NH);
    x->attention_block_backward(r->ctx, dqkv, dkv2, scratch, dout, qkv, 3 * C, kv2, o, lse, qpos,
                                odd, B, T, T, C, NH);
    out(r, "dq", dqkv, N * 3 * C);
    out(r, "dkv", dkv1, kv_n);
    out(r, "dkv 2", dkv2, kv_n);
}

static bool has_attention_block(const struct ops *o)
{
    return o->attention_block_forward && o->attention_block_backward;
}

/* the buffer's n floats rounded to bf16 (and widened back), in place */
static void round_to_bf16(struct run *r, float *d, size_t n)
{
    float *h = r->broken ? NULL : malloc(n * sizeof *h);
    if (!h) {
        r->broken = true;
        return;
    }
    r->o->download(r->ctx, h, d, n * sizeof *h);
    for (size_t i = 0; i < n; i++) {
        uint32_t bits = (uint32_t)bf16_round(h[i]) << 16;
        memcpy(&h[i], &bits, sizeof bits);
    }
    r->o->upload(r->ctx, d, h, n * sizeof *h);
    free(h);
}

/* The attention on bf16 tensor cores (the table's attention_*_bf16) against
 * the CPU's attention of the same inputs rounded to bf16. What differs is the
 * kernel's rounding of the probabilities and of dS to bf16 before their
 * products (kernels/cuda/attention_tc.cu): each ≤ 2^-9 relative, so out moves
 * by ≤ 2^-9·max|v| in the worst case (every rounding one way) and far less on
 * average; dqkv likewise through dS. The limit, 1e-2 of the output's largest
 * element, holds that worst case for outputs down to a fifth of max|v| and
 * sits two orders below what a wrong fragment or mask gives (O(1)). */
static void t_attention_bf16(struct run *r)
{
    const struct shape *s = r->s;
    bool tc = r->o->attention_forward_bf16 != NULL;
    size_t N = N_ROWS(s), att_n = (size_t)s->B * s->NH * s->T * s->T;
    float *qkv = rnd(r, N * 3 * s->C, 1, 0), *dout = rnd(r, N * s->C, 1, 0);
    float *o = dev(r, N * s->C * 4), *dqkv = dev(r, N * 3 * s->C * 4);
    float *att = tc ? NULL : dev(r, att_n * 4), *datt = tc ? NULL : dev(r, att_n * 4);
    float *lse = tc ? dev(r, (size_t)s->B * s->NH * s->T * 4) : NULL;
    if (r->broken) return;
    if (tc) {
        r->o->attention_forward_bf16(r->ctx, o, lse, qkv, s->B, s->T, s->C, s->NH);
        r->o->attention_backward_bf16(r->ctx, dqkv, dout, qkv, o, lse, s->B, s->T, s->C, s->NH);
    } else {
        round_to_bf16(r, qkv, N * 3 * s->C);
        round_to_bf16(r, dout, N * s->C);
        if (r->broken) return;
        r->o->attention_forward(r->ctx, o, att, qkv, s->B, s->T, s->C, s->NH);
        r->o->attention_backward(r->ctx, dqkv, datt, dout, qkv, att, s->B, s->T, s->C, s->NH);
    }
    out(r, "out", o, N * s->C);
    out(r, "dqkv", dqkv, N * 3 * s->C);
}

/* its head sizes (16, 32, 64), odd lengths that end inside a 64-row tile,
 * and GPT-2 124M's own (T 1024, C 768, 12 heads) */
static const struct shape attention_bf16_shapes[] = {
    {2, 37, 64, 4, 0, 0, 0, 0, 0, 0, 0},
    {3, 100, 96, 3, 0, 0, 0, 0, 0, 0, 0},
    {1, 200, 128, 2, 0, 0, 0, 0, 0, 0, 0},
    {2, 1024, 768, 12, 0, 0, 0, 0, 0, 0, 0},
};

static void t_elementwise(struct run *r)
{
    const struct shape *s = r->s;
    size_t n = N_ROWS(s) * s->C;
    float *x = rnd(r, n, 2, 0), *d = rnd(r, n, 1, 0), *b = rnd(r, s->C, 1, 0);
    float *y = dev(r, n * 4), *dx = dev(r, n * 4), *z = rnd(r, n, 1, 0);
    if (r->broken) return;
    r->o->gelu_forward(r->ctx, y, x, n);
    out(r, "gelu", y, n);
    r->o->gelu_backward(r->ctx, dx, x, d, n);
    out(r, "dgelu", dx, n);
    r->o->residual_forward(r->ctx, z, z, x, n); /* out aliasing an input, as the runtime does */
    out(r, "residual", z, n);
    r->o->add_bias(r->ctx, z, b, (int)N_ROWS(s), s->C);
    out(r, "add_bias", z, n);
    r->o->copy(r->ctx, y, z, n * sizeof(float)); /* the memory ops: a copy, then zero an odd tail */
    r->o->zero(r->ctx, y + n / 3, (n - n / 3) * sizeof(float));
    out(r, "copy/zero", y, n);
    /* the second and third thirds of each row of x (rows, C) packed into rows of 2C/3 of dx,
     * as the cp ring packs a row's key and value columns */
    size_t rows = N_ROWS(s), third = (size_t)s->C / 3 * sizeof(float);
    r->o->copy_rows(r->ctx, dx, 2 * third, (const char *)x + third, s->C * sizeof(float), 2 * third,
                    rows);
    out(r, "copy_rows", dx, rows * 2 * third / sizeof(float));
}

/* ---- the Llama ops: hs = C/NH (4, 12, 64), NKV = NH/2 where NH is even, else
 * 1 (multi-query at the first shape); kv_expand also at NKV = NH (a copy) ---- */

static int kv_heads(const struct shape *s)
{
    return s->NH % 2 == 0 ? s->NH / 2 : 1;
}

static void t_rmsnorm(struct run *r)
{
    const struct shape *s = r->s;
    size_t n = N_ROWS(s) * s->C;
    float *x = rnd(r, n, 2, 0.5f), *w = rnd(r, s->C, 0.5f, 1);
    float *y = dev(r, n * 4), *rstd = dev(r, N_ROWS(s) * 4);
    float *dy = rnd(r, n, 1, 0), *dx = rnd(r, n, 1, 0);
    float *dw = rnd(r, s->C, 1, 0), *dw2 = rnd(r, s->C, 1, 0);
    if (r->broken) return;
    int N = (int)N_ROWS(s);
    r->o->rmsnorm_forward(r->ctx, y, rstd, x, w, N, s->C, 1e-5f);
    out(r, "out", y, n);
    out(r, "rstd", rstd, N_ROWS(s));
    r->o->rmsnorm_backward(r->ctx, dx, dw, dy, x, w, rstd, N, s->C, true);
    out(r, "dinp+=", dx, n);
    out(r, "dw_acc", dw, s->C);
    r->o->rmsnorm_backward(r->ctx, dx, dw2, dy, x, w, rstd, N, s->C, false);
    out(r, "dw", dw2, s->C);
}

/* q and k rotated at positions from 7 (theta 10^4), then at 0 (Llama 3's
 * 5·10^5, another table); a gradient rotated back; then positions from 1000,
 * where angles taken in fp32 instead of double put the output 2e-5 (third
 * shape) to 5e-5 (GPT-2's) off, above the limit (numpy, these inputs) */
static void t_rope(struct run *r)
{
    const struct shape *s = r->s;
    int hs = s->C / s->NH, KV = kv_heads(s);
    size_t n = N_ROWS(s) * (size_t)(s->NH + 2 * KV) * hs;
    float *x = rnd(r, n, 1, 0), *x2 = rnd(r, n, 1, 0), *dx = rnd(r, n, 1, 0);
    float *far = rnd(r, n, 1, 0);
    if (r->broken) return;
    r->o->rope_forward(r->ctx, x, s->B, s->T, s->NH, KV, hs, 10000.0, 7);
    out(r, "rotated pos0=7", x, n);
    r->o->rope_forward(r->ctx, x2, s->B, s->T, s->NH, KV, hs, 500000.0, 0);
    out(r, "rotated", x2, n);
    r->o->rope_backward(r->ctx, dx, s->B, s->T, s->NH, KV, hs, 10000.0, 7);
    out(r, "drotated", dx, n);
    r->o->rope_forward(r->ctx, far, s->B, s->T, s->NH, KV, hs, 10000.0, 1000);
    out(r, "rot pos0=1000", far, n);
}

/* the expansion and its group sums: the same values, added in head order */
static void t_kv_expand(struct run *r)
{
    const struct shape *s = r->s;
    int hs = s->C / s->NH, N = (int)N_ROWS(s);
    const int kvs[2] = {kv_heads(s), s->NH};
    const char *names[2][2] = {{"out", "dpacked"}, {"out nkv=nh", "dpacked nkv=nh"}};
    size_t wide = N_ROWS(s) * 3 * s->C;
    float *d = rnd(r, wide, 1, 0), *o = dev(r, wide * 4);
    for (int k = 0; k < 2 && !r->broken; k++) {
        size_t n = N_ROWS(s) * (size_t)(s->NH + 2 * kvs[k]) * hs;
        float *packed = rnd(r, n, 1, 0), *dp = rnd(r, n, 1, 0); /* dp: overwritten */
        if (r->broken) return;
        r->o->kv_expand(r->ctx, o, packed, N, s->NH, kvs[k], hs);
        out(r, names[k][0], o, wide);
        r->o->kv_expand_backward(r->ctx, dp, d, N, s->NH, kvs[k], hs);
        out(r, names[k][1], dp, n);
    }
}

static void t_swiglu(struct run *r)
{
    const struct shape *s = r->s;
    size_t N = N_ROWS(s), F = (size_t)s->OC;
    float *x = rnd(r, N * 2 * F, 2, 0), *d = rnd(r, N * F, 1, 0);
    float *y = dev(r, N * F * 4), *dx = rnd(r, N * 2 * F, 1, 0); /* dx: overwritten */
    if (r->broken) return;
    r->o->swiglu_forward(r->ctx, y, x, (int)N, (int)F);
    out(r, "out", y, N * F);
    r->o->swiglu_backward(r->ctx, dx, x, d, (int)N, (int)F);
    out(r, "dinp", dx, N * 2 * F);
}

static void t_classifier(struct run *r)
{
    const struct shape *s = r->s;
    size_t N = N_ROWS(s), n = N * s->Vp;
    int32_t *tgt = tokens(r, N, s->V);
    float *lg = rnd(r, n, 2, 0), *lg2 = rnd(r, n, 2, 0);
    float *loss = dev(r, N * 4), *loss2 = dev(r, N * 4);
    if (r->broken) return;
    r->o->classifier(r->ctx, lg, loss, tgt, (int)N, s->V, s->Vp, 1.0f / (float)N);
    out(r, "losses", loss, N);
    out(r, "dlogits", lg, n);
    r->o->classifier(r->ctx, lg2, loss2, tgt, (int)N, s->V, s->Vp, 0.0f);
    out(r, "losses_fwd", loss2, N);
    out(r, "logits_kept", lg2, n);
}

/* targets outside [0, V), as a corrupt token file would give if the loader
 * let it through (first row -1, the middle V, the last far past the row):
 * read nowhere, their losses NaN on both (rel_error: NaN on one side only
 * fails), their rows' dlogits without the one-hot term */
static void t_classifier_bad_target(struct run *r)
{
    const struct shape *s = r->s;
    size_t N = N_ROWS(s), n = N * s->Vp;
    int32_t *tgt = dev(r, N * sizeof *tgt), *h = malloc(N * sizeof *h);
    float *lg = rnd(r, n, 2, 0), *loss = dev(r, N * 4);
    if (!h) r->broken = true;
    if (r->broken) {
        free(h);
        return;
    }
    for (size_t i = 0; i < N; i++) h[i] = (int32_t)rng_below(&r->rng, (uint64_t)s->V);
    h[0] = -1, h[N / 2] = s->V, h[N - 1] = s->Vp + (1 << 20);
    r->o->upload(r->ctx, tgt, h, N * sizeof *h);
    free(h);
    r->o->classifier(r->ctx, lg, loss, tgt, (int)N, s->V, s->Vp, 1.0f / (float)N);
    out(r, "losses", loss, N);
    out(r, "dlogits", lg, n);
}

/* The GELU of the MLP's fused product alone (matmul_forward_gelu: on the GPU
 * cuBLASLt's GELU_AUX_BIAS epilogue), on x over [-8, 8]: identity weights and
 * a zero bias make pre = x exactly (one nonzero term per sum), so "gelu" is
 * the epilogue's GELU against the CPU's tanh GELU (kernels/cpu: vmath.h's
 * tanh within 2e-7). bf16: x rounded to bf16 first, as the product rounds it.
 *
 * cuBLAS's documentation says only that the GELU epilogues "apply GELU
 * point-wise transform"; PyTorch takes them for the tanh approximation
 * (aten/src/ATen/native/cuda/Blas.cpp applies gelu(approximate="tanh") where
 * it cannot use the epilogue). The limit, 5e-6 of max |cpu| = gelu(8) = 8
 * (4e-5 absolute): the tanh formula evaluated in fp32, with tanhf's 2 ulp
 * (the CUDA C++ Programming Guide's math appendix) or with fast exp and
 * division, stays within about 1e-5 of the CPU's here (the first H100 run
 * measured 5e-6 to 7e-6 absolute through the fused op on random inputs);
 * the erf GELU differs from the tanh one by up to 4.7e-4 (at x = -2.70,
 * 5.9e-5 of 8), x·sigmoid(1.702x) by 2.1e-2, and tanh.approx.f32 (the PTX
 * ISA: 2^-11 relative) by as much as 2e-3: each fails it. The product's
 * own checks (matmul+gelu, 1e-5 at every shape) stay as they were. */
static void t_gelu_epilogue(struct run *r, bool bf16)
{
    enum { N = 4096, C = 256 }; /* 2^20 points */
    size_t n = (size_t)N * C;
    float *h = malloc(n * sizeof *h), *hw = calloc((size_t)C * C, sizeof *hw);
    float *x = dev(r, n * 4), *w = dev(r, (size_t)C * C * 4), *bias = dev(r, C * 4);
    float *y = dev(r, n * 4), *pre = dev(r, n * 4);
    uint16_t *w16 = bf16 ? dev(r, (size_t)C * C * 2) : NULL;
    if (!h || !hw) r->broken = true;
    if (r->broken) {
        free(h), free(hw);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        float v = -8.0f + 16.0f * (float)((double)i / (double)(n - 1));
        if (bf16) { /* round to nearest even on the 16 high bits */
            uint32_t bits;
            memcpy(&bits, &v, sizeof bits);
            bits = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
            memcpy(&v, &bits, sizeof v);
        }
        h[i] = v;
    }
    for (int i = 0; i < C; i++) hw[(size_t)i * C + i] = 1.0f;
    r->o->upload(r->ctx, x, h, n * sizeof *h);
    r->o->upload(r->ctx, w, hw, (size_t)C * C * sizeof *hw);
    free(h), free(hw);
    if (bf16) r->o->to_bf16(r->ctx, w16, w, (size_t)C * C);
    if (r->o->matmul_forward_gelu) {
        r->o->matmul_forward_gelu(r->ctx, y, pre, x, w, w16, bias, N, C, C);
    } else {
        r->o->matmul_forward(r->ctx, pre, x, w, w16, bias, N, C, C);
        r->o->gelu_forward(r->ctx, y, pre, n);
    }
    out(r, "pre", pre, n);
    out(r, "gelu", y, n);
}

static void t_gelu_epilogue_f32(struct run *r)
{
    t_gelu_epilogue(r, false);
}

static void t_gelu_epilogue_bf16(struct run *r)
{
    t_gelu_epilogue(r, true);
}

/* the vocabulary-parallel parts on one rank's shard: entries [v0, v0+nv) of a
 * (N, Vs) slice; targets fall inside and outside it */
static void t_classifier_parts(struct run *r)
{
    const struct shape *s = r->s;
    size_t N = N_ROWS(s);
    int Vs = s->Vp / 2, nv = Vs - 3, v0 = s->V / 4;
    int32_t *tgt = tokens(r, N, s->V);
    float *lg = rnd(r, N * Vs, 2, 0), *mx = dev(r, N * 4), *sum = dev(r, N * 4);
    float *tl = dev(r, N * 4), *loss = dev(r, N * 4);
    if (r->broken) return;
    r->o->classifier_max(r->ctx, lg, mx, (int)N, nv, Vs);
    r->o->classifier_sumexp(r->ctx, lg, mx, tgt, v0, nv, Vs, sum, tl, (int)N);
    r->o->classifier_finish(r->ctx, lg, loss, tgt, mx, sum, tl, v0, nv, Vs, (int)N, 0.5f);
    out(r, "row_max", mx, N);
    out(r, "row_sum", sum, N);
    out(r, "target_logit", tl, N);
    out(r, "losses", loss, N);
    out(r, "dlogits", lg, N * Vs);
}

static void t_optimizer(struct run *r)
{
    const struct shape *s = r->s;
    size_t n = (size_t)s->OC * s->C + 7;
    float *p = rnd(r, n, 0.1f, 0), *g = rnd(r, n, 1, 0), *m = rnd(r, n, 0.1f, 0);
    float *v = rnd(r, n, 0.01f, 0.05f); /* positive second moments */
    uint16_t *p16 = dev(r, n * 2), *x16 = dev(r, n * 2);
    float *ss = dev(r, 3 * sizeof(float));
    if (r->broken) return;
    /* the whole gradient, none of it, and its first 7 elements, in one call */
    const float *xs[3] = {g, g, g};
    size_t ns[3] = {n, 0, 7};
    double sums[3];
    r->o->sum_squares(r->ctx, sums, xs, ns, 3);
    float sums32[3] = {(float)sums[0], (float)sums[1], (float)sums[2]};
    r->o->upload(r->ctx, ss, sums32, sizeof sums32);
    out(r, "sum_squares", ss, 3);
    r->o->to_bf16(r->ctx, x16, g, n);
    out16(r, "to_bf16", x16, n);
    r->o->adamw(r->ctx, p, p16, g, m, v, n, 1e-3f, 0.9, 0.95, 1e-8f, 0.1f, 0.5f, 3);
    out(r, "p", p, n);
    out(r, "m", m, n);
    out(r, "v", v, n);
    out16(r, "p16", p16, n);
}

/* ---- a mixture of experts' routing (model.moe): N = B·T tokens; every integer the
 * CPU's, every float within the case's tolerance ---- */

/* GPT-2 124M's width on 4096 tokens: 8 experts with 2 choices, with and without a
 * capacity of 1.25·k·N/E; 64 experts with 1 and 2 (the latter as cp's two runs of a
 * rank's chunks), and small odd ones */
static const struct shape moe_shapes[] = {
    {.B = 4, .T = 1024, .C = 768, .E = 8, .k = 2, .runs = 1},
    {.B = 4, .T = 1024, .C = 768, .E = 8, .k = 2, .capacity = 1280, .runs = 1},
    {.B = 4, .T = 1024, .C = 768, .E = 64, .k = 1, .capacity = 80, .runs = 1},
    {.B = 4, .T = 1024, .C = 768, .E = 64, .k = 2, .capacity = 160, .runs = 2},
    {.B = 2, .T = 19, .C = 72, .E = 5, .k = 3, .capacity = 9, .runs = 2},
};

/* choice (N,k): k distinct experts a token, the lower ones likelier (the smaller of two
 * draws), so that a capacity drops some; before (runs,E): each run's count of earlier
 * choices, never 0 (NULL with one run) */
static int32_t *moe_choices(struct run *r, int32_t **before)
{
    const struct shape *s = r->s;
    size_t N = N_ROWS(s);
    int32_t *h = malloc(N * s->k * sizeof *h), *b = malloc((size_t)s->runs * s->E * sizeof *b);
    for (size_t t = 0; h && t < N; t++)
        for (int j = 0; j < s->k; j++) {
            int32_t e, taken;
            do {
                uint64_t u = rng_below(&r->rng, (uint64_t)s->E),
                         v = rng_below(&r->rng, (uint64_t)s->E);
                e = (int32_t)(u < v ? u : v);
                taken = 0;
                for (int i = 0; i < j; i++) taken |= h[t * s->k + i] == e;
            } while (taken);
            h[t * s->k + j] = e;
        }
    for (int i = 0; b && i < s->runs * s->E; i++)
        b[i] = 1 + (int32_t)rng_below(&r->rng, (uint64_t)(s->capacity ? s->capacity : 50));
    *before = s->runs > 1 ? upload_ints(r, b, (size_t)s->runs * s->E) : (free(b), NULL);
    return upload_ints(r, h, N * s->k);
}

/* the backend's dispatch of moe_choices' choices; M on the host */
static void moe_dispatch_of(struct run *r, int32_t *pos, int32_t *rows, int32_t *counts, int *M)
{
    const struct shape *s = r->s;
    int32_t *before, *choice = moe_choices(r, &before);
    if (r->broken) return;
    *M = r->o->moe_dispatch(r->ctx, pos, rows, counts, counts + s->E, choice, before, s->runs,
                            (int)N_ROWS(s), s->E, s->k, s->capacity);
}

/* the router: softmax, top-k (ties to the lower expert), gates, logsumexp */
static void t_moe_route(struct run *r)
{
    const struct shape *s = r->s;
    size_t N = N_ROWS(s), NE = N * s->E, Nk = N * s->k;
    float *logits = rnd(r, NE, 2, 0), *probs = dev(r, NE * 4), *gate = dev(r, Nk * 4);
    float *lse = dev(r, N * 4);
    int32_t *choice = dev(r, Nk * 4);
    if (r->broken) return;
    r->o->moe_route(r->ctx, probs, choice, gate, lse, logits, (int)N, s->E, s->k);
    out(r, "probs", probs, NE);
    out_ints(r, "choice", choice, Nk);
    out(r, "gate", gate, Nk);
    out(r, "lse", lse, N);
}

/* the dispatch: each choice's packed row or -1, each row's token, the counts, M */
static void t_moe_dispatch(struct run *r)
{
    const struct shape *s = r->s;
    size_t Nk = N_ROWS(s) * s->k;
    int32_t *pos = dev(r, Nk * 4), *rows = dev(r, Nk * 4), *counts = dev(r, 2 * (size_t)s->E * 4);
    int M = 0;
    moe_dispatch_of(r, pos, rows, counts, &M);
    double kept = M;
    out_ints(r, "pos", pos, Nk);
    out_ints(r, "rows", rows, Nk); /* past M: the zeroed buffer on both */
    out_ints(r, "counts", counts, (size_t)s->E);
    out_ints(r, "routed", counts + s->E, (size_t)s->E);
    out_host(r, "kept", &kept, 1, true);
}

/* the rows to the experts and back: gather, combine (onto what out held), the
 * combine's backward, the gather's (accumulating) */
static void t_moe_rows(struct run *r)
{
    const struct shape *s = r->s;
    size_t N = N_ROWS(s), Nk = N * s->k, C = (size_t)s->C;
    int32_t *pos = dev(r, Nk * 4), *rows = dev(r, Nk * 4), *counts = dev(r, 2 * (size_t)s->E * 4);
    float *x = rnd(r, N * C, 1, 0), *y = rnd(r, Nk * C, 1, 0), *gate = rnd(r, Nk, 1, 0);
    float *dout = rnd(r, N * C, 1, 0), *o = rnd(r, N * C, 1, 0), *dx = rnd(r, N * C, 1, 0);
    float *packed = dev(r, Nk * C * 4), *dy = dev(r, Nk * C * 4), *dgate = dev(r, Nk * 4);
    int M = 0;
    moe_dispatch_of(r, pos, rows, counts, &M);
    if (r->broken) return;
    const struct ops *x_ = r->o;
    int n = (int)N, k = s->k;
    x_->moe_gather(r->ctx, packed, x, rows, M, s->C);
    out(r, "packed", packed, Nk * C);
    x_->moe_combine(r->ctx, o, y, gate, pos, n, k, s->C, true);
    out(r, "combine", o, N * C);
    x_->moe_combine_backward(r->ctx, dy, dgate, dout, y, gate, pos, n, k, s->C);
    out(r, "dy", dy, Nk * C);
    out(r, "dgate", dgate, Nk);
    x_->moe_gather_backward(r->ctx, dx, dy, pos, n, k, s->C, true);
    out(r, "dx", dx, N * C);
}

/* the router's backward, with the gates' gradients and without, and the losses (on
 * the host), from the backend's own route of random logits */
static void t_moe_route_backward(struct run *r)
{
    const struct shape *s = r->s;
    size_t N = N_ROWS(s), NE = N * s->E, Nk = N * s->k;
    float *logits = rnd(r, NE, 2, 0), *probs = dev(r, NE * 4), *gate = dev(r, Nk * 4);
    float *lse = dev(r, N * 4), *dgate = rnd(r, Nk, 1, 0), *dl = dev(r, NE * 4);
    float *dl_losses = dev(r, NE * 4);
    int32_t *choice = dev(r, Nk * 4), *routed = malloc((size_t)s->E * sizeof *routed);
    for (int e = 0; routed && e < s->E; e++) routed[e] = (int32_t)rng_below(&r->rng, Nk + 1);
    int32_t *routed_d = upload_ints(r, routed, (size_t)s->E);
    if (r->broken) return;
    int n = (int)N, E = s->E, k = s->k;
    r->o->moe_route(r->ctx, probs, choice, gate, lse, logits, n, E, k);
    r->o->moe_route_backward(r->ctx, dl, dgate, probs, choice, gate, lse, routed_d, n, E, k, 0.5f,
                             0.25f);
    out(r, "dlogits", dl, NE);
    r->o->moe_route_backward(r->ctx, dl_losses, NULL, probs, choice, gate, lse, routed_d, n, E, k,
                             0.5f, 0.25f);
    out(r, "dlogits losses", dl_losses, NE);
    double losses[2];
    r->o->moe_losses(r->ctx, losses, probs, lse, routed_d, n, E, k, 0.01, 0.001);
    out_host(r, "balance loss", &losses[0], 1, false);
    out_host(r, "z-loss", &losses[1], 1, false);
}

static bool has_moe_ops(const struct ops *gpu)
{
    return gpu->moe_route && gpu->moe_dispatch && gpu->moe_gather && gpu->moe_gather_backward &&
           gpu->moe_combine && gpu->moe_combine_backward && gpu->moe_route_backward &&
           gpu->moe_losses;
}

static bool has_attention_bf16(const struct ops *gpu)
{
    return gpu->attention_forward_bf16 != NULL;
}

static bool has_llama_ops(const struct ops *gpu)
{
    return gpu->rmsnorm_forward && gpu->rmsnorm_backward && gpu->rope_forward &&
           gpu->rope_backward && gpu->kv_expand && gpu->kv_expand_backward && gpu->swiglu_forward &&
           gpu->swiglu_backward;
}

/* what of fp8 a case runs (all need fp8 tensor cores: sm_89 and later) */
enum case_fp8 { NO_FP8, FP8_QUANTISER, FP8_PRODUCTS_TENSOR, FP8_PRODUCTS_BLOCK };

static const struct selftest_case {
    const char *name;
    void (*run)(struct run *r);
    double tolerance; /* of max |gpu - cpu| / max |cpu| (fp8 products: see limit()) */
    enum case_fp8 fp8;
    const struct shape *shapes; /* its own shapes (n_shapes), or NULL: the common ones */
    size_t n_shapes;
    bool (*present)(const struct ops *gpu); /* NULL, or whether the GPU's table has the op */
    const char *once; /* run once, with inputs of its own (this in the shape column) */
} cases[] = {
    {.name = "encoder_forward", .run = t_encoder_forward, .tolerance = 1e-6},
    {.name = "encoder_backward", .run = t_encoder_backward, .tolerance = 1e-6},
    {.name = "layernorm", .run = t_layernorm, .tolerance = 1e-5},
    {.name = "matmul_forward fp32", .run = t_matmul_forward_f32, .tolerance = 1e-5},
    {.name = "matmul_forward bf16", .run = t_matmul_forward_bf16, .tolerance = 1e-5},
    {.name = "matmul+gelu fp32", .run = t_matmul_gelu_f32, .tolerance = 1e-5},
    {.name = "matmul+gelu bf16", .run = t_matmul_gelu_bf16, .tolerance = 1e-5},
    {.name = "gelu epilogue fp32",
     .run = t_gelu_epilogue_f32,
     .tolerance = 5e-6,
     .once = "x in [-8,8], 2^20"},
    {.name = "gelu epilogue bf16",
     .run = t_gelu_epilogue_bf16,
     .tolerance = 5e-6,
     .once = "x in [-8,8], 2^20"},
    {.name = "matmul_backward fp32", .run = t_matmul_backward_f32, .tolerance = 1e-5},
    {.name = "matmul_backward bf16", .run = t_matmul_backward_bf16, .tolerance = 1e-5},
    /* fp8: the quantiser the same bits; the products take the same codes and
     * scales, fp8_tensor_core_limit() on tensor cores */
    {.name = "quantize_fp8 e4m3", .run = t_quantize_e4m3, .tolerance = 0, .fp8 = FP8_QUANTISER},
    {.name = "quantize_fp8 e5m2", .run = t_quantize_e5m2, .tolerance = 0, .fp8 = FP8_QUANTISER},
    {.name = "matmul_fwd fp8 tensor",
     .run = t_matmul_forward_fp8_tensor,
     .tolerance = 1e-5,
     .fp8 = FP8_PRODUCTS_TENSOR},
    {.name = "matmul_fwd fp8 block",
     .run = t_matmul_forward_fp8_block,
     .tolerance = 1e-5,
     .fp8 = FP8_PRODUCTS_BLOCK},
    {.name = "matmul_bwd fp8 tensor",
     .run = t_matmul_backward_fp8_tensor,
     .tolerance = 1e-5,
     .fp8 = FP8_PRODUCTS_TENSOR},
    {.name = "matmul_bwd fp8 block",
     .run = t_matmul_backward_fp8_block,
     .tolerance = 1e-5,
     .fp8 = FP8_PRODUCTS_BLOCK},
    {.name = "attention", .run = t_attention, .tolerance = 1e-5},
    {.name = "attention fused", .run = t_attention_fused, .tolerance = 1e-5},
    {.name = "attention block (cp)",
     .run = t_attention_block,
     .tolerance = 1e-5,
     .present = has_attention_block},
    {.name = "attention bf16 tc",
     .run = t_attention_bf16,
     .tolerance = 1e-2,
     .shapes = attention_bf16_shapes,
     .n_shapes = sizeof attention_bf16_shapes / sizeof *attention_bf16_shapes,
     .present = has_attention_bf16},
    {.name = "gelu/residual/bias/copies", .run = t_elementwise, .tolerance = 1e-5},
    /* the Llama family's; kv_expand moves values and adds them in the CPU's
     * order: the same bits */
    {.name = "rmsnorm", .run = t_rmsnorm, .tolerance = 1e-5, .present = has_llama_ops},
    {.name = "rope", .run = t_rope, .tolerance = 1e-5, .present = has_llama_ops},
    {.name = "kv_expand", .run = t_kv_expand, .tolerance = 0, .present = has_llama_ops},
    {.name = "swiglu", .run = t_swiglu, .tolerance = 1e-5, .present = has_llama_ops},
    /* a mixture of experts' routing: the choices, rows and counts equal (tolerance 0 for
     * every integer output), the floats within 1e-5 */
#define MOE_CASE(n, f)                                                                             \
    {.name = n,                                                                                    \
     .run = f,                                                                                     \
     .tolerance = 1e-5,                                                                            \
     .shapes = moe_shapes,                                                                         \
     .n_shapes = sizeof moe_shapes / sizeof *moe_shapes,                                           \
     .present = has_moe_ops}
    MOE_CASE("moe route", t_moe_route),
    MOE_CASE("moe dispatch", t_moe_dispatch),
    MOE_CASE("moe gather/combine", t_moe_rows),
    MOE_CASE("moe route bwd/losses", t_moe_route_backward),
#undef MOE_CASE
    {.name = "classifier", .run = t_classifier, .tolerance = 1e-5},
    {.name = "classifier bad target", .run = t_classifier_bad_target, .tolerance = 1e-5},
    {.name = "classifier parts", .run = t_classifier_parts, .tolerance = 1e-5},
    /* adamw and to_bf16: the same bits */
    {.name = "adamw/bf16/sumsq", .run = t_optimizer, .tolerance = 1e-6},
};

static bool fp8_products(const struct selftest_case *c)
{
    return c->fp8 == FP8_PRODUCTS_TENSOR || c->fp8 == FP8_PRODUCTS_BLOCK;
}

/* The limit of output k of case c at shape s: an fp8 product's where cuBLASLt
 * can take it (every dimension a multiple of 16), else the case's own. */
static double limit(const struct selftest_case *c, const struct shape *s, const struct run *r,
                    int k)
{
    bool tensor_cores = N_ROWS(s) % 16 == 0 && s->C % 16 == 0 && s->OC % 16 == 0;
    if (r->out_exact[k]) return 0;
    if (fp8_products(c) && tensor_cores && !r->out_fp32[k]) return fp8_tensor_core_limit();
    return c->tolerance;
}

/* max |a - b| / max |b| (0 when both are all zero; inf on a NaN in one only) */
static double rel_error(const float *a, const float *b, size_t n)
{
    double diff = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) != isnan(b[i])) return INFINITY;
        if (isnan(a[i])) continue;
        double d = fabs((double)a[i] - (double)b[i]);
        diff = d > diff ? d : diff;
        scale = fabs((double)b[i]) > scale ? fabs((double)b[i]) : scale;
    }
    return diff == 0 ? 0 : scale == 0 ? INFINITY : diff / scale;
}

/* One case at one shape (the shape_no-th, which seeds its inputs) on one
 * backend; false with the backend's error. */
static bool run_case(struct run *r, const struct ops *o, struct ops_ctx *ctx, const struct shape *s,
                     int shape_no, const struct selftest_case *c, char *why, size_t why_bytes)
{
    memset(r, 0, sizeof *r);
    r->o = o;
    r->ctx = ctx;
    r->s = s;
    rng_seed(&r->rng, 20261123, (uint64_t)(c - cases) * 131 + (uint64_t)shape_no);
    c->run(r);
    if (o->take_error(ctx, why, why_bytes)) return false;
    if (r->broken) {
        snprintf(why, why_bytes, "%s: out of memory for the case's buffers", o->name);
        return false;
    }
    return true;
}

/* What selftest_run compares with what, and its counts. */
struct bench {
    FILE *f;
    const struct ops *gpu, *cpu;
    struct ops_ctx *cpu_ctx;
    int failures, checks;
};

/* Case c at shape s (the shape_no-th): the CPU once, the GPU (in gpu_ctx)
 * twice; a row an output. */
static void compare(struct bench *b, struct ops_ctx *gpu_ctx, const struct selftest_case *c,
                    const struct shape *s, int shape_no)
{
    char why[512] = "", sh[40];
    snprintf(sh, sizeof sh, "%d,%d,%d,%d,%d,%d,%d", s->B, s->T, s->C, s->NH, s->V, s->Vp, s->OC);
    if (c->once) snprintf(sh, sizeof sh, "%s", c->once);
    if (s->E)
        snprintf(sh, sizeof sh, "N%zu C%d E%d k%d cap%d runs%d", N_ROWS(s), s->C, s->E, s->k,
                 s->capacity, s->runs);
    struct run rc = {0}, rg = {0}, rg2 = {0};
    bool ok_c = run_case(&rc, b->cpu, b->cpu_ctx, s, shape_no, c, why, sizeof why);
    bool ok_g = ok_c && run_case(&rg, b->gpu, gpu_ctx, s, shape_no, c, why, sizeof why);
    bool ok_g2 = ok_g && run_case(&rg2, b->gpu, gpu_ctx, s, shape_no, c, why, sizeof why);
    if (!ok_g2) {
        fprintf(b->f, "%-22s %-30s %-14s %10s %8s %-7s FAIL: %s\n", c->name, sh, "-", "-", "-", "-",
                why);
        b->failures++;
    }
    for (int k = 0; ok_g2 && k < rc.n_out; k++) {
        bool same_n = rg.n_out == rc.n_out && rg2.n_out == rc.n_out;
        double e = same_n ? rel_error(rg.out[k], rc.out[k], rc.out_len[k]) : INFINITY;
        bool repeat = same_n && !memcmp(rg.out[k], rg2.out[k], rc.out_len[k] * 4);
        double lim = limit(c, s, &rc, k);
        bool pass = e <= lim && repeat;
        fprintf(b->f, "%-22s %-30s %-14s %10.2e %8.0e %-7s %s\n", c->name, sh, rc.out_name[k], e,
                lim, repeat ? "same" : "DIFFERS", pass ? "ok" : "FAIL");
        b->failures += !pass;
        b->checks++;
    }
    run_free(&rc);
    run_free(&rg);
    run_free(&rg2);
}

enum {
    N_SHAPES = sizeof shapes / sizeof *shapes,
    N_GPT2 = sizeof gpt2_shapes / sizeof *gpt2_shapes
};

/* The fp8 products of one scaling at GPT-2's shapes, in a GPU context of
 * their own, so that its fallback line (ops.h's fp8_fallback) speaks of
 * these shapes alone: every dimension is a multiple of 16, so a product that
 * still fell back to fp32 did not test the tensor cores. With tensor scaling
 * that fails a check; block scaling runs on sm_90 only (matmul_fp8.cu), so
 * its line is a note (on an H100 it means the block products went untested). */
static void compare_gpt2_fp8(struct bench *b, int device, enum case_fp8 scaling)
{
    char why[512] = "";
    const char *what = scaling == FP8_PRODUCTS_TENSOR ? "tensor" : "block";
    struct ops_ctx *ctx = b->gpu->open(device, why, sizeof why);
    if (!ctx) {
        fprintf(b->f, "plait-train --selftest: fp8 %s products: a context of their own: %s\n", what,
                why);
        b->failures++;
        b->checks++;
        return;
    }
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++)
        for (int si = 0; cases[ci].fp8 == scaling && si < N_GPT2; si++)
            compare(b, ctx, &cases[ci], &gpt2_shapes[si], N_SHAPES + si);
    if (b->gpu->fp8_fallback) { /* (the CPU has none: it emulates them all) */
        const char *line = b->gpu->fp8_fallback(ctx);
        bool fail = line && scaling == FP8_PRODUCTS_TENSOR;
        fprintf(b->f, "%-22s %-30s %-14s %10s %8s %-7s %s%s%s\n", "fp8 on tensor cores",
                "GPT-2 124M", what, "-", "-", "-",
                !line  ? "ok"
                : fail ? "FAIL"
                       : "note",
                line ? ": " : "", line ? line : "");
        b->failures += fail;
        b->checks += scaling == FP8_PRODUCTS_TENSOR;
    }
    b->gpu->close(ctx);
}

int selftest_run(FILE *f)
{
    char why[512] = "";
    const char *env = getenv(PLAIT_ENV_DEVICE), *twin = getenv("PLAIT_SELFTEST_TWIN");
    int device = env && *env >= '0' && *env <= '9' ? atoi(env) : 0;
    struct bench b = {.f = f, .cpu = ops_cpu()};
    struct ops_ctx *gpu_ctx = NULL;
    if (!(b.cpu_ctx = b.cpu->open(0, why, sizeof why))) {
        fprintf(f, "plait-train --selftest: the cpu backend: %s\n", why);
        return PLAIT_EXIT_ERROR;
    }
    if (twin && !strcmp(twin, "cpu")) { /* the harness itself, without a GPU (make test) */
        b.gpu = b.cpu;
        fprintf(f, "plait-train --selftest: PLAIT_SELFTEST_TWIN=cpu: the CPU against itself\n");
    } else if (ops_cuda_device_count(why, sizeof why) == 0) {
        fprintf(f, "plait-train --selftest: skipped: %s (exit %d)\n", why, PLAIT_EXIT_SKIPPED);
        b.cpu->close(b.cpu_ctx);
        return PLAIT_EXIT_SKIPPED;
    } else if (!(b.gpu = ops_cuda(why, sizeof why))) {
        fprintf(f, "plait-train --selftest: the CUDA backend: %s\n", why);
        b.cpu->close(b.cpu_ctx);
        return PLAIT_EXIT_ERROR;
    } else {
        fprintf(f, "plait-train --selftest: each CUDA op (device %d) against kernels/cpu\n",
                device);
    }
    if (!(gpu_ctx = b.gpu->open(device, why, sizeof why))) {
        fprintf(f, "plait-train --selftest: the %s backend on device %d: %s\n", b.gpu->name, device,
                why);
        b.cpu->close(b.cpu_ctx);
        return PLAIT_EXIT_ERROR;
    }
    fprintf(f,
            "error = max |gpu - cpu| / max |cpu|; repeat = a second GPU run gives the same bits\n");
    fprintf(f, "%-22s %-30s %-14s %10s %8s %-7s %s\n", "op", "shape B,T,C,NH,V,Vp,OC", "output",
            "error", "limit", "repeat", "verdict");
    /* GPT-2's shape with the CPU twin is the CPU against itself for minutes */
    const char *which = getenv("PLAIT_SELFTEST_SHAPES"); /* "all" or "small" */
    int n_shapes = N_SHAPES;
    if (which ? !strcmp(which, "small") : b.gpu == b.cpu) n_shapes = SMALL_SHAPES;
    bool fp8 = b.gpu->matmul_forward_fp8 && b.gpu->quantize_fp8;
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        const struct selftest_case *c = &cases[ci];
        if (c->fp8 != NO_FP8 && !fp8) {
            fprintf(f, "%-22s %-30s %-14s %10s %8s %-7s skipped: no fp8 tensor cores (sm_89+)\n",
                    c->name, "-", "-", "-", "-", "-");
            continue;
        }
        if (c->present && !c->present(b.gpu)) {
            fprintf(f, "%-22s %-30s %-14s %10s %8s %-7s skipped: not in the %s backend\n", c->name,
                    "-", "-", "-", "-", "-", b.gpu->name);
            continue;
        }
        const struct shape *own = c->shapes ? c->shapes : shapes;
        int n_own = c->shapes ? (int)c->n_shapes : c->once ? 1 : n_shapes;
        for (int si = 0; si < n_own; si++) compare(&b, gpu_ctx, c, &own[si], si);
        for (int si = 0; c->fp8 == FP8_QUANTISER && si < N_GPT2; si++)
            compare(&b, gpu_ctx, c, &gpt2_shapes[si], N_SHAPES + si);
    }
    if (fp8) {
        compare_gpt2_fp8(&b, device, FP8_PRODUCTS_TENSOR);
        compare_gpt2_fp8(&b, device, FP8_PRODUCTS_BLOCK);
    }
    fprintf(f, "plait-train --selftest: %s: %d of %d checks failed\n",
            b.failures ? "FAILED" : "passed", b.failures, b.checks);
    if (b.gpu->fp8_fallback && b.gpu->fp8_fallback(gpu_ctx)) /* the small shapes do, by design */
        fprintf(f, "plait-train --selftest: %s\n", b.gpu->fp8_fallback(gpu_ctx));
    b.gpu->close(gpu_ctx);
    b.cpu->close(b.cpu_ctx);
    return b.failures ? PLAIT_EXIT_ERROR : PLAIT_EXIT_OK;
}
