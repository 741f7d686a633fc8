/* selftest_gpt2.c — the self-test's cases of GPT-2's ops but attention: the
 * embedding, LayerNorm, the products in fp32, bf16 and fp8 (the quantiser, and
 * the products with tensor and block scaling), the GELU epilogue, the
 * elementwise ops and copies (download_after's too), the classifier and the
 * optimizer. Each makes its inputs, runs the op(s) and keeps the outputs; the
 * harness is selftest.c's. */
#include "runtime/selftest_cases.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ops.h"

/* ---- the cases: each makes its inputs, runs the op(s), keeps the outputs -------- */

void selftest_encoder_forward(struct run *r)
{
    const struct shape *s = r->s;
    int v0 = 3, nv = s->V - 10; /* a shard: some tokens fall outside it */
    int32_t *tok = selftest_tokens(r, N_ROWS(s), s->V);
    float *wte = selftest_rnd(r, (size_t)nv * s->C, 0.1f, 0),
          *wpe = selftest_rnd(r, (size_t)s->T * s->C, 0.1f, 0);
    float *o1 = selftest_dev(r, N_ROWS(s) * s->C * 4), *o2 = selftest_dev(r, N_ROWS(s) * s->C * 4);
    if (r->broken) return;
    r->o->encoder_forward(r->ctx, o1, tok, wte, v0, nv, wpe, s->B, s->T, s->C);
    r->o->encoder_forward(r->ctx, o2, tok, wte, v0, nv, NULL, s->B, s->T, s->C);
    selftest_out(r, "out", o1, N_ROWS(s) * s->C);
    selftest_out(r, "out_nowpe", o2, N_ROWS(s) * s->C);
}

void selftest_encoder_backward(struct run *r)
{
    const struct shape *s = r->s;
    int v0 = 3, nv = s->V - 10;
    int32_t *tok = selftest_tokens(r, N_ROWS(s), s->V);
    float *dout = selftest_rnd(r, N_ROWS(s) * s->C, 1, 0);
    float *dwte = selftest_rnd(r, (size_t)nv * s->C, 1, 0),
          *dwpe = selftest_rnd(r, (size_t)s->T * s->C, 1, 0);
    float *dwte2 = selftest_dev(r, (size_t)s->Vp * s->C * 4),
          *dwpe2 = selftest_rnd(r, (size_t)s->T * s->C, 1, 0);
    if (r->broken) return;
    r->o->encoder_backward(r->ctx, dwte, v0, nv, dwpe, dout, tok, s->B, s->T, s->C, true);
    r->o->encoder_backward(r->ctx, dwte2, 0, s->Vp, dwpe2, dout, tok, s->B, s->T, s->C, false);
    selftest_out(r, "dwte_acc", dwte, (size_t)nv * s->C);
    selftest_out(r, "dwpe_acc", dwpe, (size_t)s->T * s->C);
    selftest_out(r, "dwte", dwte2, (size_t)s->Vp * s->C);
    selftest_out(r, "dwpe", dwpe2, (size_t)s->T * s->C);
}

void selftest_layernorm(struct run *r)
{
    const struct shape *s = r->s;
    size_t n = N_ROWS(s) * s->C;
    float *x = selftest_rnd(r, n, 2, 0.5f), *w = selftest_rnd(r, s->C, 0.5f, 1),
          *b = selftest_rnd(r, s->C, 0.2f, 0);
    float *y = selftest_dev(r, n * 4), *mean = selftest_dev(r, N_ROWS(s) * 4),
          *rstd = selftest_dev(r, N_ROWS(s) * 4);
    float *dy = selftest_rnd(r, n, 1, 0), *dx = selftest_rnd(r, n, 1, 0);
    float *dw = selftest_rnd(r, s->C, 1, 0), *db = selftest_rnd(r, s->C, 1, 0);
    if (r->broken) return;
    int N = (int)N_ROWS(s);
    r->o->layernorm_forward(r->ctx, y, mean, rstd, x, w, b, N, s->C);
    selftest_out(r, "out", y, n);
    selftest_out(r, "mean", mean, N_ROWS(s));
    selftest_out(r, "rstd", rstd, N_ROWS(s));
    r->o->layernorm_backward(r->ctx, dx, dw, db, dy, x, w, mean, rstd, N, s->C, true);
    selftest_out(r, "dinp+=", dx, n);
    selftest_out(r, "dw_acc", dw, s->C);
    selftest_out(r, "db_acc", db, s->C);
}

static void t_matmul_forward(struct run *r, bool bf16)
{
    const struct shape *s = r->s;
    int N = (int)N_ROWS(s);
    float *x = selftest_rnd(r, (size_t)N * s->C, 1, 0),
          *w = selftest_rnd(r, (size_t)s->OC * s->C, 0.1f, 0);
    float *bias = selftest_rnd(r, s->OC, 1, 0);
    uint16_t *w16 = bf16 ? selftest_dev(r, (size_t)s->OC * s->C * 2) : NULL;
    float *y1 = selftest_dev(r, (size_t)N * s->OC * 4),
          *y2 = selftest_dev(r, (size_t)N * s->OC * 4);
    if (r->broken) return;
    if (bf16) r->o->to_bf16(r->ctx, w16, w, (size_t)s->OC * s->C);
    r->o->matmul_forward(r->ctx, y1, x, w, w16, bias, N, s->C, s->OC);
    r->o->matmul_forward(r->ctx, y2, x, w, w16, NULL, N, s->C, s->OC);
    selftest_out(r, "out_bias", y1, (size_t)N * s->OC);
    selftest_out(r, "out", y2, (size_t)N * s->OC);
}

void selftest_matmul_forward_f32(struct run *r)
{
    t_matmul_forward(r, false);
}

void selftest_matmul_forward_bf16(struct run *r)
{
    t_matmul_forward(r, true);
}

/* The MLP's product with its GELU: the backend's fused op where it has one,
 * else (the CPU) the two ops it stands for. */
static void t_matmul_gelu(struct run *r, bool bf16)
{
    const struct shape *s = r->s;
    int N = (int)N_ROWS(s), OC = s->OC;
    float *x = selftest_rnd(r, (size_t)N * s->C, 1, 0),
          *w = selftest_rnd(r, (size_t)OC * s->C, 0.1f, 0);
    float *bias = selftest_rnd(r, OC, 1, 0);
    uint16_t *w16 = bf16 ? selftest_dev(r, (size_t)OC * s->C * 2) : NULL;
    float *y = selftest_dev(r, (size_t)N * OC * 4), *pre = selftest_dev(r, (size_t)N * OC * 4);
    if (r->broken) return;
    if (bf16) r->o->to_bf16(r->ctx, w16, w, (size_t)OC * s->C);
    if (r->o->matmul_forward_gelu) {
        r->o->matmul_forward_gelu(r->ctx, y, pre, x, w, w16, bias, N, s->C, OC);
    } else {
        r->o->matmul_forward(r->ctx, pre, x, w, w16, bias, N, s->C, OC);
        r->o->gelu_forward(r->ctx, y, pre, (size_t)N * OC);
    }
    selftest_out(r, "pre", pre, (size_t)N * OC);
    selftest_out(r, "gelu", y, (size_t)N * OC);
}

void selftest_matmul_gelu_f32(struct run *r)
{
    t_matmul_gelu(r, false);
}

void selftest_matmul_gelu_bf16(struct run *r)
{
    t_matmul_gelu(r, true);
}

static void t_matmul_backward(struct run *r, bool bf16)
{
    const struct shape *s = r->s;
    int N = (int)N_ROWS(s), C = s->C, OC = s->OC;
    float *x = selftest_rnd(r, (size_t)N * C, 1, 0), *w = selftest_rnd(r, (size_t)OC * C, 0.1f, 0);
    float *dy = selftest_rnd(r, (size_t)N * OC, 1, 0);
    float *dx = selftest_dev(r, (size_t)N * C * 4), *dx2 = selftest_dev(r, (size_t)N * C * 4);
    float *dw = selftest_rnd(r, (size_t)OC * C, 1, 0), *db = selftest_rnd(r, OC, 1, 0);
    float *dw2 = selftest_rnd(r, (size_t)OC * C, 1, 0), *db2 = selftest_rnd(r, OC, 1, 0);
    uint16_t *w16 = bf16 ? selftest_dev(r, (size_t)OC * C * 2) : NULL;
    if (r->broken) return;
    if (bf16) r->o->to_bf16(r->ctx, w16, w, (size_t)OC * C);
    r->o->matmul_backward(r->ctx, dx, dw, db, dy, x, w, w16, N, C, OC, true);
    selftest_out(r, "dinp", dx, (size_t)N * C);
    selftest_out(r, "dw_acc", dw, (size_t)OC * C);
    selftest_out_fp32(r, "dbias_acc", db, OC);
    /* split backward: the input gradient alone, then the weights' alone */
    r->o->matmul_backward(r->ctx, dx2, NULL, NULL, dy, x, w, w16, N, C, OC, false);
    r->o->matmul_backward(r->ctx, NULL, dw2, db2, dy, x, w, w16, N, C, OC, false);
    selftest_out(r, "dinp_only", dx2, (size_t)N * C);
    selftest_out(r, "dw_only", dw2, (size_t)OC * C);
    selftest_out_fp32(r, "dbias", db2, OC);
}

void selftest_matmul_backward_f32(struct run *r)
{
    t_matmul_backward(r, false);
}

void selftest_matmul_backward_bf16(struct run *r)
{
    t_matmul_backward(r, true);
}

/* x (N, C) quantised in three tilings (kernels/fp8.h): codes and scales */
static void t_quantize_fp8(struct run *r, enum fp8_format fmt, const int tiles[3][2])
{
    const struct shape *s = r->s;
    int N = (int)N_ROWS(s), C = s->C;
    float *x = selftest_rnd(r, (size_t)N * C, fmt == FP8_E5M2 ? 1e-3f : 3.0f, 0);
    for (int k = 0; k < 3; k++) {
        int tr = tiles[k][0], tc = tiles[k][1];
        uint8_t *q = selftest_dev(r, (size_t)N * C);
        float *sc = selftest_dev(r, fp8_scale_count(N, C, tr, tc) * sizeof(float));
        if (r->broken) return;
        r->o->quantize_fp8(r->ctx, q, sc, x, N, C, tr, tc, fmt);
        selftest_out8(r, k == 0 ? "codes_a" : k == 1 ? "codes_b" : "codes_c", q, (size_t)N * C);
        selftest_out(r,
                     k == 0   ? "scales_a"
                     : k == 1 ? "scales_b"
                              : "scales_c",
                     sc, fp8_scale_count(N, C, tr, tc));
    }
}

void selftest_quantize_e4m3(struct run *r)
{
    static const int tiles[3][2] = {{0, 0}, {1, FP8_TILE}, {FP8_TILE, FP8_TILE}};
    t_quantize_fp8(r, FP8_E4M3, tiles);
}

void selftest_quantize_e5m2(struct run *r)
{
    static const int tiles[3][2] = {{0, 0}, {FP8_TILE, 1}, {1, FP8_TILE}};
    t_quantize_fp8(r, FP8_E5M2, tiles);
}

/* w (OC, C) and its fp8 copy, as the optimizer step writes it */
static uint8_t *fp8_weight(struct run *r, enum fp8_scaling scaling, float **scales)
{
    const struct shape *s = r->s;
    int e = fp8_weight_tile(scaling);
    float *w = selftest_rnd(r, (size_t)s->OC * s->C, 0.1f, 0);
    uint8_t *w8 = selftest_dev(r, (size_t)s->OC * s->C);
    *scales = selftest_dev(r, fp8_scale_count(s->OC, s->C, e, e) * sizeof(float));
    if (r->broken) return NULL;
    r->o->quantize_fp8(r->ctx, w8, *scales, w, s->OC, s->C, e, e, FP8_E4M3);
    return w8;
}

static void t_matmul_forward_fp8(struct run *r, enum fp8_scaling scaling)
{
    const struct shape *s = r->s;
    int N = (int)N_ROWS(s);
    float *x = selftest_rnd(r, (size_t)N * s->C, 1, 0), *bias = selftest_rnd(r, s->OC, 1, 0), *ws;
    uint8_t *w8 = fp8_weight(r, scaling, &ws);
    float *y1 = selftest_dev(r, (size_t)N * s->OC * 4),
          *y2 = selftest_dev(r, (size_t)N * s->OC * 4);
    if (r->broken) return;
    r->o->matmul_forward_fp8(r->ctx, y1, x, w8, ws, bias, N, s->C, s->OC, scaling);
    r->o->matmul_forward_fp8(r->ctx, y2, x, w8, ws, NULL, N, s->C, s->OC, scaling);
    selftest_out(r, "out_bias", y1, (size_t)N * s->OC);
    selftest_out(r, "out", y2, (size_t)N * s->OC);
}

void selftest_matmul_forward_fp8_tensor(struct run *r)
{
    t_matmul_forward_fp8(r, FP8_SCALING_TENSOR);
}

void selftest_matmul_forward_fp8_block(struct run *r)
{
    t_matmul_forward_fp8(r, FP8_SCALING_BLOCK);
}

static void t_matmul_backward_fp8(struct run *r, enum fp8_scaling scaling)
{
    const struct shape *s = r->s;
    int N = (int)N_ROWS(s), C = s->C, OC = s->OC;
    float *x = selftest_rnd(r, (size_t)N * C, 1, 0), *ws;
    uint8_t *w8 = fp8_weight(r, scaling, &ws);
    float *dy = selftest_rnd(r, (size_t)N * OC, 1, 0);
    float *dx = selftest_dev(r, (size_t)N * C * 4), *dx2 = selftest_dev(r, (size_t)N * C * 4);
    float *dw = selftest_rnd(r, (size_t)OC * C, 1, 0), *db = selftest_rnd(r, OC, 1, 0);
    float *dw2 = selftest_rnd(r, (size_t)OC * C, 1, 0), *db2 = selftest_rnd(r, OC, 1, 0);
    if (r->broken) return;
    r->o->matmul_backward_fp8(r->ctx, dx, dw, db, dy, x, w8, ws, N, C, OC, true, scaling);
    selftest_out(r, "dinp", dx, (size_t)N * C);
    selftest_out(r, "dw_acc", dw, (size_t)OC * C);
    selftest_out(r, "dbias_acc", db, OC);
    r->o->matmul_backward_fp8(r->ctx, dx2, NULL, NULL, dy, x, w8, ws, N, C, OC, false, scaling);
    r->o->matmul_backward_fp8(r->ctx, NULL, dw2, db2, dy, x, w8, ws, N, C, OC, false, scaling);
    selftest_out(r, "dinp_only", dx2, (size_t)N * C);
    selftest_out(r, "dw_only", dw2, (size_t)OC * C);
    selftest_out(r, "dbias", db2, OC);
}

void selftest_matmul_backward_fp8_tensor(struct run *r)
{
    t_matmul_backward_fp8(r, FP8_SCALING_TENSOR);
}

void selftest_matmul_backward_fp8_block(struct run *r)
{
    t_matmul_backward_fp8(r, FP8_SCALING_BLOCK);
}

void selftest_elementwise(struct run *r)
{
    const struct shape *s = r->s;
    size_t n = N_ROWS(s) * s->C;
    float *x = selftest_rnd(r, n, 2, 0), *d = selftest_rnd(r, n, 1, 0),
          *b = selftest_rnd(r, s->C, 1, 0);
    float *y = selftest_dev(r, n * 4), *dx = selftest_dev(r, n * 4), *z = selftest_rnd(r, n, 1, 0);
    if (r->broken) return;
    r->o->gelu_forward(r->ctx, y, x, n);
    selftest_out(r, "gelu", y, n);
    r->o->gelu_backward(r->ctx, dx, x, d, n);
    selftest_out(r, "dgelu", dx, n);
    r->o->residual_forward(r->ctx, z, z, x, n); /* out aliasing an input, as the runtime does */
    selftest_out(r, "residual", z, n);
    r->o->add_bias(r->ctx, z, b, (int)N_ROWS(s), s->C);
    /* z brought down behind add_bias (download_after, into page-locked memory) while the
     * ops below run, waited for at the end: add_bias's sums, not z before it */
    float *early = r->o->host_alloc ? r->o->host_alloc(r->ctx, n * 4) : calloc(n, 4);
    double *early_v = malloc(n * sizeof *early_v);
    if (!early || !early_v) r->broken = true;
    if (early)
        (r->o->download_after ? r->o->download_after : r->o->download)(r->ctx, early, z, n * 4);
    r->o->copy(r->ctx, y, z, n * sizeof(float)); /* the memory ops: a copy, then zero an odd tail */
    r->o->zero(r->ctx, y + n / 3, (n - n / 3) * sizeof(float));
    selftest_out(r, "copy/zero", y, n);
    /* the second and third thirds of each row of x (rows, C) packed into rows of 2C/3 of dx,
     * as the cp ring packs a row's key and value columns */
    size_t rows = N_ROWS(s), third = (size_t)s->C / 3 * sizeof(float);
    r->o->copy_rows(r->ctx, dx, 2 * third, (const char *)x + third, s->C * sizeof(float), 2 * third,
                    rows);
    selftest_out(r, "copy_rows", dx, rows * 2 * third / sizeof(float));
    if (r->o->copies_wait) r->o->copies_wait(r->ctx);
    for (size_t i = 0; early && early_v && i < n; i++) early_v[i] = early[i];
    if (early && early_v) selftest_out_host(r, "add_bias async", early_v, n, false);
    if (early && r->o->host_free)
        r->o->host_free(r->ctx, early);
    else
        free(early);
    free(early_v);
}

void selftest_classifier(struct run *r)
{
    const struct shape *s = r->s;
    size_t N = N_ROWS(s), n = N * s->Vp;
    int32_t *tgt = selftest_tokens(r, N, s->V);
    float *lg = selftest_rnd(r, n, 2, 0), *lg2 = selftest_rnd(r, n, 2, 0);
    float *loss = selftest_dev(r, N * 4), *loss2 = selftest_dev(r, N * 4);
    if (r->broken) return;
    r->o->classifier(r->ctx, lg, loss, tgt, (int)N, s->V, s->Vp, 1.0f / (float)N);
    selftest_out(r, "losses", loss, N);
    selftest_out(r, "dlogits", lg, n);
    r->o->classifier(r->ctx, lg2, loss2, tgt, (int)N, s->V, s->Vp, 0.0f);
    selftest_out(r, "losses_fwd", loss2, N);
    selftest_out(r, "logits_kept", lg2, n);
}

/* targets outside [0, V), as a corrupt token file would give if the loader
 * let it through (first row -1, the middle V, the last far past the row):
 * read nowhere, their losses NaN on both (rel_error: NaN on one side only
 * fails), their rows' dlogits without the one-hot term */
void selftest_classifier_bad_target(struct run *r)
{
    const struct shape *s = r->s;
    size_t N = N_ROWS(s), n = N * s->Vp;
    int32_t *tgt = selftest_dev(r, N * sizeof *tgt), *h = malloc(N * sizeof *h);
    float *lg = selftest_rnd(r, n, 2, 0), *loss = selftest_dev(r, N * 4);
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
    selftest_out(r, "losses", loss, N);
    selftest_out(r, "dlogits", lg, n);
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
    float *x = selftest_dev(r, n * 4), *w = selftest_dev(r, (size_t)C * C * 4),
          *bias = selftest_dev(r, C * 4);
    float *y = selftest_dev(r, n * 4), *pre = selftest_dev(r, n * 4);
    uint16_t *w16 = bf16 ? selftest_dev(r, (size_t)C * C * 2) : NULL;
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
    selftest_out(r, "pre", pre, n);
    selftest_out(r, "gelu", y, n);
}

void selftest_gelu_epilogue_f32(struct run *r)
{
    t_gelu_epilogue(r, false);
}

void selftest_gelu_epilogue_bf16(struct run *r)
{
    t_gelu_epilogue(r, true);
}

/* the vocabulary-parallel parts on one rank's shard: entries [v0, v0+nv) of a
 * (N, Vs) slice; targets fall inside and outside it */
void selftest_classifier_parts(struct run *r)
{
    const struct shape *s = r->s;
    size_t N = N_ROWS(s);
    int Vs = s->Vp / 2, nv = Vs - 3, v0 = s->V / 4;
    int32_t *tgt = selftest_tokens(r, N, s->V);
    float *lg = selftest_rnd(r, N * Vs, 2, 0), *mx = selftest_dev(r, N * 4),
          *sum = selftest_dev(r, N * 4);
    float *tl = selftest_dev(r, N * 4), *loss = selftest_dev(r, N * 4);
    if (r->broken) return;
    r->o->classifier_max(r->ctx, lg, mx, (int)N, nv, Vs);
    r->o->classifier_sumexp(r->ctx, lg, mx, tgt, v0, nv, Vs, sum, tl, (int)N);
    r->o->classifier_finish(r->ctx, lg, loss, tgt, mx, sum, tl, v0, nv, Vs, (int)N, 0.5f);
    selftest_out(r, "row_max", mx, N);
    selftest_out(r, "row_sum", sum, N);
    selftest_out(r, "target_logit", tl, N);
    selftest_out(r, "losses", loss, N);
    selftest_out(r, "dlogits", lg, N * Vs);
}

void selftest_optimizer(struct run *r)
{
    const struct shape *s = r->s;
    size_t n = (size_t)s->OC * s->C + 7;
    float *p = selftest_rnd(r, n, 0.1f, 0), *g = selftest_rnd(r, n, 1, 0),
          *m = selftest_rnd(r, n, 0.1f, 0);
    float *v = selftest_rnd(r, n, 0.01f, 0.05f); /* positive second moments */
    uint16_t *p16 = selftest_dev(r, n * 2), *x16 = selftest_dev(r, n * 2);
    float *ss = selftest_dev(r, 3 * sizeof(float));
    if (r->broken) return;
    /* the whole gradient, none of it, and its first 7 elements, in one call */
    const float *xs[3] = {g, g, g};
    size_t ns[3] = {n, 0, 7};
    double sums[3];
    r->o->sum_squares(r->ctx, sums, xs, ns, 3);
    float sums32[3] = {(float)sums[0], (float)sums[1], (float)sums[2]};
    r->o->upload(r->ctx, ss, sums32, sizeof sums32);
    selftest_out(r, "sum_squares", ss, 3);
    r->o->to_bf16(r->ctx, x16, g, n);
    selftest_out16(r, "to_bf16", x16, n);
    r->o->adamw(r->ctx, p, p16, g, m, v, n, 1e-3f, 0.9, 0.95, 1e-8f, 0.1f, 0.5f, 3);
    selftest_out(r, "p", p, n);
    selftest_out(r, "m", m, n);
    selftest_out(r, "v", v, n);
    selftest_out16(r, "p16", p16, n);
}

/* adamw_multi over seven segments of one flat buffer (odd sizes, one empty, a
 * bf16 copy on every other, weight decay on two of three), two steps with the
 * same segments (a GPU's table kept), then one with others (a new table) */
void selftest_adamw_multi(struct run *r)
{
    const struct shape *s = r->s;
    size_t n = (size_t)s->OC * s->C + 7;
    size_t cut[8] = {0, 1, 4, 4, 4 + (size_t)s->C + 3, n / 2 + 1, n - 5, n};
    float *p = selftest_rnd(r, n, 0.1f, 0), *g = selftest_rnd(r, n, 1, 0),
          *m = selftest_rnd(r, n, 0.1f, 0);
    float *v = selftest_rnd(r, n, 0.01f, 0.05f); /* positive second moments */
    uint16_t *p16 = selftest_dev(r, n * 2);
    if (r->broken) return;
    r->o->zero(r->ctx, p16, n * 2);
    struct adamw_segment segs[7];
    for (int i = 0; i < 7; i++)
        segs[i] = (struct adamw_segment){.p = p + cut[i],
                                         .p16 = i % 2 ? NULL : p16 + cut[i],
                                         .g = g + cut[i],
                                         .m = m + cut[i],
                                         .v = v + cut[i],
                                         .n = cut[i + 1] - cut[i],
                                         .decays = i % 3 != 1};
    for (int t = 1; t <= 2; t++)
        r->o->adamw_multi(r->ctx, segs, 7, 1e-3f, 0.9, 0.95, 1e-8f, 0.1f, 0.5f, t);
    segs[3].n += segs[4].n; /* the fourth takes in the fifth; the last gets a copy */
    segs[4] = segs[6];
    segs[4].p16 = p16 + cut[6];
    r->o->adamw_multi(r->ctx, segs, 5, 2e-3f, 0.9, 0.95, 1e-8f, 0.1f, 0.25f, 3);
    selftest_out(r, "p", p, n);
    selftest_out(r, "m", m, n);
    selftest_out(r, "v", v, n);
    selftest_out16(r, "p16", p16, n);
}

/* sum_squares over 300 tensors (more than a GPU launch takes, some empty),
 * overlapping parts of one buffer */
void selftest_sum_squares_many(struct run *r)
{
    enum { COUNT = 300 };
    const struct shape *s = r->s;
    size_t n = (size_t)s->OC * s->C + 7;
    float *x = selftest_rnd(r, n, 1, 0);
    if (r->broken) return;
    const float *xs[COUNT];
    size_t ns[COUNT];
    for (size_t i = 0; i < COUNT; i++) {
        size_t at = i * 13 % n, k = i * 37 % 301;
        xs[i] = x + at, ns[i] = k < n - at ? k : n - at;
    }
    ns[COUNT - 1] = n - (size_t)(xs[COUNT - 1] - x); /* one to the end */
    double sums[COUNT];
    r->o->sum_squares(r->ctx, sums, xs, ns, COUNT);
    selftest_out_host(r, "sums", sums, COUNT, false);
}
