/* test_ops_grad.c — every CPU op's backward (GPT-2's and the Llama family's)
 * against central finite
 * differences of its forward, in double precision (the same kernel source
 * compiled for double), and every float op against its double twin. Each
 * check contracts the op's output with a fixed random tensor R, so the scalar
 * L = Σ out·R has gradient "backward with dout = R". */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/ops_cpu.h"
#include "kernels/ops.h"
#include "tests/unit/cpu_ctx.h"
#include "tests/unit/fd_check.h"

static struct ops_ctx *cx; /* the kernels' context (main opens it) */

/* ---- layernorm ------------------------------------------------------------- */

struct ln_ctx {
    int N, C;
    double *inp, *w, *b, *out, *mean, *rstd, *R;
};

static double ln_loss(void *p)
{
    struct ln_ctx *c = p;
    cpu_layernorm_forward_f64(cx, c->out, c->mean, c->rstd, c->inp, c->w, c->b, c->N, c->C);
    return dot(c->out, c->R, (size_t)c->N * c->C);
}

static void test_layernorm_backward_matches_finite_differences(void)
{
    int N = 5, C = 24;
    struct ln_ctx c = {N,        C,        rnd(N * C, 2), rnd(C, 1), rnd(C, 1), zeros(N * C),
                       zeros(N), zeros(N), rnd(N * C, 1)};
    for (int i = 0; i < C; i++) c.w[i] += 1.5;
    ln_loss(&c);
    double *dinp = rnd(N * C, 1), *dinp0 = malloc(N * C * sizeof(double));
    memcpy(dinp0, dinp, N * C * sizeof(double)); /* dinp accumulates */
    double *dw = rnd(C, 1), *db = rnd(C, 1);
    cpu_layernorm_backward_f64(cx, dinp, dw, db, c.R, c.inp, c.w, c.mean, c.rstd, N, C, false);
    for (int i = 0; i < N * C; i++) dinp[i] -= dinp0[i];
    check_fd("layernorm dinp", ln_loss, &c, c.inp, dinp, N * C, FD_TOL);
    check_fd("layernorm dw", ln_loss, &c, c.w, dw, C, FD_TOL);
    check_fd("layernorm db", ln_loss, &c, c.b, db, C, FD_TOL);
    /* accumulate adds to dw, db */
    double *dw2 = malloc(C * sizeof(double)), *db2 = malloc(C * sizeof(double));
    for (int i = 0; i < C; i++) dw2[i] = db2[i] = 1.0;
    ln_loss(&c);
    cpu_layernorm_backward_f64(cx, dinp0, dw2, db2, c.R, c.inp, c.w, c.mean, c.rstd, N, C, true);
    double worst = 0;
    for (int i = 0; i < C; i++)
        worst = fmax(worst, fabs(dw2[i] - 1.0 - dw[i]) + fabs(db2[i] - 1.0 - db[i]));
    CHECK(worst < 1e-12, "accumulate=true must add to dw/db (off by %g)", worst);
    /* float twin */
    float *fi = to_f32(c.inp, N * C), *fw = to_f32(c.w, C), *fb = to_f32(c.b, C);
    float *fo = malloc(N * C * sizeof(float)), *fm = malloc(N * sizeof(float)),
          *fr = malloc(N * sizeof(float));
    cpu_layernorm_forward_f32(cx, fo, fm, fr, fi, fw, fb, N, C);
    ln_loss(&c);
    check_close("layernorm forward", fo, c.out, N * C, F32_TOL);
    free(fi), free(fw), free(fb), free(fo), free(fm), free(fr), free(dw2), free(db2);
    free(c.inp), free(c.w), free(c.b), free(c.out), free(c.mean), free(c.rstd), free(c.R);
    free(dinp), free(dinp0), free(dw), free(db);
}

/* ---- matmul ---------------------------------------------------------------- */

struct mm_ctx {
    int N, C, OC;
    double *inp, *w, *bias, *out, *R;
};

static double mm_loss(void *p)
{
    struct mm_ctx *c = p;
    cpu_matmul_forward_f64(cx, c->out, c->inp, c->w, c->bias, c->N, c->C, c->OC);
    return dot(c->out, c->R, (size_t)c->N * c->OC);
}

static void test_matmul_backward_matches_finite_differences(void)
{
    int N = 7, C = 13, OC = 11;
    struct mm_ctx c = {
        N, C, OC, rnd(N * C, 1), rnd(OC * C, 1), rnd(OC, 1), zeros(N * OC), rnd(N * OC, 1)};
    double *dinp = rnd(N * C, 1), *dw = rnd(OC * C, 1), *db = rnd(OC, 1);
    cpu_matmul_backward_f64(cx, dinp, dw, db, c.R, c.inp, c.w, N, C, OC, false);
    check_fd("matmul dinp", mm_loss, &c, c.inp, dinp, N * C, FD_TOL);
    check_fd("matmul dw", mm_loss, &c, c.w, dw, OC * C, FD_TOL);
    check_fd("matmul dbias", mm_loss, &c, c.bias, db, OC, FD_TOL);
    /* accumulate: a second backward adds the same gradient again */
    double *dw2 = malloc(OC * C * sizeof(double)), *db2 = malloc(OC * sizeof(double));
    memcpy(dw2, dw, OC * C * sizeof(double));
    memcpy(db2, db, OC * sizeof(double));
    cpu_matmul_backward_f64(cx, dinp, dw2, db2, c.R, c.inp, c.w, N, C, OC, true);
    double worst = 0;
    for (int i = 0; i < OC * C; i++) worst = fmax(worst, fabs(dw2[i] - 2 * dw[i]));
    for (int i = 0; i < OC; i++) worst = fmax(worst, fabs(db2[i] - 2 * db[i]));
    CHECK(worst < 1e-12, "accumulate=true must add to dw/dbias (off by %g)", worst);
    /* no bias */
    double *out_nb = zeros(N * OC);
    cpu_matmul_forward_f64(cx, out_nb, c.inp, c.w, NULL, N, C, OC);
    mm_loss(&c);
    worst = 0;
    for (int r = 0; r < N; r++)
        for (int o = 0; o < OC; o++)
            worst = fmax(worst, fabs(out_nb[r * OC + o] + c.bias[o] - c.out[r * OC + o]));
    CHECK(worst < 1e-12, "bias NULL must mean no bias (off by %g)", worst);
    /* float twin, and the bf16 path through the ops table within bf16 rounding */
    float *fi = to_f32(c.inp, N * C), *fw = to_f32(c.w, OC * C), *fb = to_f32(c.bias, OC);
    float *fo = malloc(N * OC * sizeof(float));
    cpu_matmul_forward_f32(cx, fo, fi, fw, fb, N, C, OC);
    check_close("matmul forward", fo, c.out, N * OC, F32_TOL);
    uint16_t *w16 = malloc(OC * C * sizeof(uint16_t));
    bf16_from_f32(w16, fw, OC * C);
    ops_cpu()->matmul_forward(cx, fo, fi, fw, w16, fb, N, C, OC);
    check_close("matmul forward bf16", fo, c.out, N * OC, 1e-2);
    free(w16), free(fi), free(fw), free(fb), free(fo), free(out_nb), free(dw2), free(db2);
    free(c.inp), free(c.w), free(c.bias), free(c.out), free(c.R), free(dinp), free(dw), free(db);
}

/* ---- attention ----------------------------------------------------------------- */

struct attn_ctx {
    int B, T, C, NH;
    double *qkv, *out, *att, *R;
};

static double attn_loss(void *p)
{
    struct attn_ctx *c = p;
    cpu_attention_forward_f64(cx, c->out, c->att, c->qkv, c->B, c->T, c->C, c->NH);
    return dot(c->out, c->R, (size_t)c->B * c->T * c->C);
}

static void test_attention_backward_matches_finite_differences(void)
{
    int B = 2, T = 5, C = 12, NH = 3;
    struct attn_ctx c = {B,
                         T,
                         C,
                         NH,
                         rnd(B * T * 3 * C, 1),
                         zeros(B * T * C),
                         zeros(B * NH * T * T),
                         rnd(B * T * C, 1)};
    attn_loss(&c);
    /* causality: probabilities above the diagonal are zero, rows sum to one */
    double worst = 0;
    for (int bh = 0; bh < B * NH; bh++)
        for (int t = 0; t < T; t++) {
            double sum = 0;
            for (int s = 0; s < T; s++) {
                double a = c.att[(bh * T + t) * T + s];
                if (s > t) worst = fmax(worst, fabs(a));
                sum += a;
            }
            worst = fmax(worst, fabs(sum - 1));
        }
    CHECK(worst < 1e-12, "attention probabilities must be causal and normalised (off by %g)",
          worst);
    double *dqkv = rnd(B * T * 3 * C, 1), *datt = zeros(B * NH * T * T);
    cpu_attention_backward_f64(cx, dqkv, datt, c.R, c.qkv, c.att, B, T, C, NH);
    check_fd("attention dqkv", attn_loss, &c, c.qkv, dqkv, B * T * 3 * C, FD_TOL);
    float *fq = to_f32(c.qkv, B * T * 3 * C), *fo = malloc(B * T * C * sizeof(float));
    float *fa = malloc(B * NH * T * T * sizeof(float));
    cpu_attention_forward_f32(cx, fo, fa, fq, B, T, C, NH);
    attn_loss(&c);
    check_close("attention forward", fo, c.out, B * T * C, F32_TOL);
    free(fq), free(fo), free(fa), free(c.qkv), free(c.out), free(c.att), free(c.R), free(dqkv),
        free(datt);
}

/* ---- gelu, residual, encoder ------------------------------------------------------ */

struct ew_ctx {
    size_t n;
    double *inp, *out, *R;
};

static double gelu_loss(void *p)
{
    struct ew_ctx *c = p;
    cpu_gelu_forward_f64(cx, c->out, c->inp, c->n);
    return dot(c->out, c->R, c->n);
}

static void test_gelu_backward_matches_finite_differences(void)
{
    size_t n = 301;
    struct ew_ctx c = {n, rnd(n, 5), zeros(n), rnd(n, 1)};
    double *dinp = zeros(n);
    cpu_gelu_backward_f64(cx, dinp, c.inp, c.R, n);
    check_fd("gelu dinp", gelu_loss, &c, c.inp, dinp, n, FD_TOL);
    float *fi = to_f32(c.inp, n), *fo = malloc(n * sizeof(float));
    cpu_gelu_forward_f32(cx, fo, fi, n);
    gelu_loss(&c);
    check_close("gelu forward", fo, c.out, n, F32_TOL);
    /* GELU(x) = 0.5x(1 + tanh(√(2/π)(x + 0.044715x³))) at a known point */
    double x = 1.0, y;
    cpu_gelu_forward_f64(cx, &y, &x, 1);
    CHECK(fabs(y - 0.8411919906082768) < 1e-12, "gelu(1) = %.16f", y);
    free(fi), free(fo), free(c.inp), free(c.out), free(c.R), free(dinp);
}

/* ---- the Llama ops ---------------------------------------------------------------- */

struct rms_ctx {
    int N, C;
    double *inp, *w, *out, *rstd, *R;
};

static double rms_loss(void *p)
{
    struct rms_ctx *c = p;
    cpu_rmsnorm_forward_f64(cx, c->out, c->rstd, c->inp, c->w, c->N, c->C, 1e-5);
    return dot(c->out, c->R, (size_t)c->N * c->C);
}

static void test_rmsnorm_backward_matches_finite_differences(void)
{
    int N = 5, C = 24;
    struct rms_ctx c = {N, C, rnd(N * C, 2), rnd(C, 1), zeros(N * C), zeros(N), rnd(N * C, 1)};
    for (int i = 0; i < C; i++) c.w[i] += 1.5;
    rms_loss(&c);
    double *dinp = rnd(N * C, 1), *dinp0 = malloc(N * C * sizeof(double));
    memcpy(dinp0, dinp, N * C * sizeof(double)); /* dinp accumulates */
    double *dw = rnd(C, 1), *dw2 = malloc(C * sizeof(double));
    cpu_rmsnorm_backward_f64(cx, dinp, dw, c.R, c.inp, c.w, c.rstd, N, C, false);
    for (int i = 0; i < N * C; i++) dinp[i] -= dinp0[i];
    check_fd("rmsnorm dinp", rms_loss, &c, c.inp, dinp, N * C, FD_TOL);
    check_fd("rmsnorm dw", rms_loss, &c, c.w, dw, C, FD_TOL);
    for (int i = 0; i < C; i++) dw2[i] = 1.0;
    rms_loss(&c);
    cpu_rmsnorm_backward_f64(cx, dinp0, dw2, c.R, c.inp, c.w, c.rstd, N, C, true);
    double worst = 0;
    for (int i = 0; i < C; i++) worst = fmax(worst, fabs(dw2[i] - 1.0 - dw[i]));
    CHECK(worst < 1e-12, "accumulate=true must add to dw (off by %g)", worst);
    /* x·rsqrt(mean(x²) + eps)·w at a known row: (3, 4) has mean square 12.5 */
    double x[2] = {3, 4}, w[2] = {1, 2}, y[2], r;
    cpu_rmsnorm_forward_f64(cx, y, &r, x, w, 1, 2, 0.0);
    CHECK(fabs(y[0] - 3 / sqrt(12.5)) < 1e-15 && fabs(y[1] - 8 / sqrt(12.5)) < 1e-15,
          "rmsnorm of (3, 4): %g %g", y[0], y[1]);
    float *fi = to_f32(c.inp, N * C), *fw = to_f32(c.w, C), *fo = malloc(N * C * sizeof(float)),
          *fr = malloc(N * sizeof(float));
    cpu_rmsnorm_forward_f32(cx, fo, fr, fi, fw, N, C, 1e-5f);
    rms_loss(&c);
    check_close("rmsnorm forward", fo, c.out, N * C, F32_TOL);
    free(fi), free(fw), free(fo), free(fr), free(dw2), free(dinp), free(dinp0), free(dw);
    free(c.inp), free(c.w), free(c.out), free(c.rstd), free(c.R);
}

/* rotary positions: B = 2, T = 3, 4 query heads over 2 key/value heads of 6 */
enum { RB = 2, RT = 3, RNH = 4, RKV = 2, RHS = 6, RW = (RNH + 2 * RKV) * RHS };

struct rope_ctx {
    double *x, *out, *R;
    int pos0;
};

static double rope_loss(void *p)
{
    struct rope_ctx *c = p;
    memcpy(c->out, c->x, RB * RT * RW * sizeof(double));
    cpu_rope_forward_f64(cx, c->out, RB, RT, RNH, RKV, RHS, 10000.0, c->pos0);
    return dot(c->out, c->R, RB * RT * RW);
}

static void test_rope_rotates_q_and_k_by_position(void)
{
    size_t n = RB * RT * RW;
    struct rope_ctx c = {rnd(n, 1), zeros(n), rnd(n, 1), 2};
    double *g = malloc(n * sizeof *g);
    memcpy(g, c.R, n * sizeof *g);
    cpu_rope_backward_f64(cx, g, RB, RT, RNH, RKV, RHS, 10000.0, 2);
    check_fd("rope dx", rope_loss, &c, c.x, g, n, FD_TOL);
    rope_loss(&c);
    /* row t of batch 1, key head 1 (head 5 of the row), pair i = 1: rotated by
     * (2 + t)·10000^(-2/6); the value heads are left alone */
    for (int t = 0; t < RT; t++) {
        size_t row = (size_t)(RT + t) * RW;
        const double *in = c.x + row + 5 * RHS, *out = c.out + row + 5 * RHS;
        double a = (2 + t) * pow(10000.0, -2.0 / RHS);
        double want0 = in[1] * cos(a) - in[4] * sin(a), want1 = in[4] * cos(a) + in[1] * sin(a);
        CHECK(fabs(out[1] - want0) < 1e-14 && fabs(out[4] - want1) < 1e-14,
              "row %d: (%g, %g), want (%g, %g)", t, out[1], out[4], want0, want1);
        CHECK(memcmp(c.out + row + (RNH + RKV) * RHS, c.x + row + (RNH + RKV) * RHS,
                     RKV * RHS * sizeof(double)) == 0,
              "row %d: v must not rotate", t);
    }
    /* forward then backward is the identity */
    memcpy(g, c.out, n * sizeof *g);
    cpu_rope_backward_f64(cx, g, RB, RT, RNH, RKV, RHS, 10000.0, 2);
    double worst = 0;
    for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs(g[i] - c.x[i]));
    CHECK(worst < 1e-14, "rope back and forth moves %g", worst);
    free(c.x), free(c.out), free(c.R), free(g);
}

struct kv_ctx {
    double *packed, *out, *R;
};

static double kv_loss(void *p)
{
    struct kv_ctx *c = p;
    cpu_kv_expand_f64(cx, c->out, c->packed, RB * RT, RNH, RKV, RHS);
    return dot(c->out, c->R, (size_t)RB * RT * 3 * RNH * RHS);
}

static void test_kv_expand_repeats_each_head_for_its_group(void)
{
    size_t n = RB * RT * RW, m = (size_t)RB * RT * 3 * RNH * RHS;
    struct kv_ctx c = {rnd(n, 1), zeros(m), rnd(m, 1)};
    double *g = zeros(n);
    cpu_kv_expand_backward_f64(cx, g, c.R, RB * RT, RNH, RKV, RHS);
    check_fd("kv_expand dpacked", kv_loss, &c, c.packed, g, n, FD_TOL);
    kv_loss(&c);
    /* query head 3 reads key/value head 1 (3 / (4/2)) */
    const double *row = c.out + 3 * RNH * RHS, *in = c.packed + RW; /* row 1 */
    CHECK(memcmp(row + RNH * RHS + 3 * RHS, in + RNH * RHS + 1 * RHS, RHS * sizeof(double)) == 0 &&
              memcmp(row + 2 * RNH * RHS + 3 * RHS, in + (RNH + RKV) * RHS + 1 * RHS,
                     RHS * sizeof(double)) == 0,
          "head 3's k and v are key/value head 1's");
    free(c.packed), free(c.out), free(c.R), free(g);
}

/* transformers' Llama, written as it writes it, in double: rotate_half(x) =
 * cat(−x2, x1), out = x·cos(emb) + rotate_half(x)·sin(emb) with emb =
 * cat(freqs, freqs), freqs_i = pos / theta^(2i/hs) (sin_sign −1: a wrong
 * one); repeat_kv: query head h reads key/value head h / (NH/NKV) (kv_of:
 * another mapping, a wrong one when 1 < NKV < NH) */
struct gqa_shape {
    int B, T, NH, NKV, hs, pos0;
};

static void hf_rope(double *x, const struct gqa_shape *g, double theta, double sin_sign)
{
    int half = g->hs / 2, width = (g->NH + 2 * g->NKV) * g->hs;
    double rot[64];
    for (int r = 0; r < g->B * g->T; r++)
        for (int h = 0; h < g->NH + g->NKV; h++) {
            double *p = x + (size_t)r * width + (size_t)h * g->hs;
            for (int j = 0; j < g->hs; j++) rot[j] = j < half ? -p[j + half] : p[j - half];
            for (int j = 0; j < g->hs; j++) {
                double emb = (g->pos0 + r % g->T) / pow(theta, 2.0 * (j % half) / g->hs);
                p[j] = p[j] * cos(emb) + rot[j] * sin_sign * sin(emb);
            }
        }
}

static int kv_of_group(int h, int NH, int NKV)
{
    return h / (NH / NKV);
}

static int kv_of_modulo(int h, int NH, int NKV)
{
    (void)NH;
    return h % NKV;
}

static void hf_kv_expand(double *out, const double *packed, const struct gqa_shape *g,
                         int (*kv_of)(int h, int NH, int NKV))
{
    size_t C = (size_t)g->NH * g->hs, KVC = (size_t)g->NKV * g->hs;
    for (int r = 0; r < g->B * g->T; r++) {
        const double *in = packed + r * (C + 2 * KVC);
        double *o = out + r * 3 * C;
        for (size_t j = 0; j < C; j++) o[j] = in[j];
        for (int h = 0; h < g->NH; h++)
            for (int i = 0; i < g->hs; i++) {
                size_t kv = (size_t)kv_of(h, g->NH, g->NKV) * g->hs + i;
                o[C + (size_t)h * g->hs + i] = in[C + kv];
                o[2 * C + (size_t)h * g->hs + i] = in[C + KVC + kv];
            }
    }
}

static double max_diff(const double *a, const double *b, size_t n)
{
    double worst = 0;
    for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs(a[i] - b[i]));
    return worst;
}

struct gqa_ctx {
    const struct gqa_shape *g;
    double *x, *out, *R;
    size_t n, m; /* x's elements, the expansion's */
};

static double gqa_rope_loss(void *p)
{
    struct gqa_ctx *c = p;
    memcpy(c->out, c->x, c->n * sizeof(double));
    cpu_rope_forward_f64(cx, c->out, c->g->B, c->g->T, c->g->NH, c->g->NKV, c->g->hs, 5e5,
                         c->g->pos0);
    return dot(c->out, c->R, c->n);
}

static double gqa_kv_loss(void *p)
{
    struct gqa_ctx *c = p;
    cpu_kv_expand_f64(cx, c->out, c->x, c->g->B * c->g->T, c->g->NH, c->g->NKV, c->g->hs);
    return dot(c->out, c->R, c->m);
}

/* rope at one shape: transformers' values (and not with the sine flipped),
 * the float kernel within rounding, the backward against differences */
static void check_rope_shape(const struct gqa_shape *g, size_t n)
{
    struct gqa_ctx c = {g, rnd(n, 1), zeros(n), rnd(n, 1), n, 0};
    double *want = malloc(n * sizeof *want), *wrong = malloc(n * sizeof *wrong);
    memcpy(want, c.x, n * sizeof *want);
    memcpy(wrong, c.x, n * sizeof *wrong);
    hf_rope(want, g, 5e5, 1);
    hf_rope(wrong, g, 5e5, -1);
    gqa_rope_loss(&c);
    double err = max_diff(c.out, want, n), flipped = max_diff(c.out, wrong, n);
    CHECK(err < 1e-12, "NH %d NKV %d hs %d pos0 %d: rope off transformers' by %g", g->NH, g->NKV,
          g->hs, g->pos0, err);
    CHECK(flipped > 1e-2, "NH %d NKV %d: a flipped sine is only %g away: the check is blind", g->NH,
          g->NKV, flipped);
    float *f = to_f32(c.x, n);
    cpu_rope_forward_f32(cx, f, g->B, g->T, g->NH, g->NKV, g->hs, 5e5, g->pos0);
    check_close("rope forward", f, c.out, n, F32_TOL);
    double *grad = malloc(n * sizeof *grad);
    memcpy(grad, c.R, n * sizeof *grad);
    cpu_rope_backward_f64(cx, grad, g->B, g->T, g->NH, g->NKV, g->hs, 5e5, g->pos0);
    check_fd("rope dx", gqa_rope_loss, &c, c.x, grad, n, FD_TOL);
    free(c.x), free(c.out), free(c.R), free(want), free(wrong), free(f), free(grad);
}

/* kv_expand at one shape: transformers' repeat_kv (and not another mapping
 * where there is one), the float kernel the same values, the backward
 * against differences */
static void check_kv_shape(const struct gqa_shape *g, size_t n)
{
    size_t m = (size_t)g->B * g->T * 3 * g->NH * g->hs;
    struct gqa_ctx c = {g, rnd(n, 1), zeros(m), rnd(m, 1), n, m};
    double *want = zeros(m), *wrong = zeros(m);
    hf_kv_expand(want, c.x, g, kv_of_group);
    hf_kv_expand(wrong, c.x, g, kv_of_modulo);
    gqa_kv_loss(&c);
    CHECK(max_diff(c.out, want, m) == 0, "NH %d NKV %d: kv_expand is not repeat_kv", g->NH, g->NKV);
    if (g->NKV > 1 && g->NKV < g->NH)
        CHECK(max_diff(c.out, wrong, m) > 0, "NH %d NKV %d: h %% NKV passes too", g->NH, g->NKV);
    float *fx = to_f32(c.x, n), *fo = malloc(m * sizeof *fo);
    cpu_kv_expand_f32(cx, fo, fx, g->B * g->T, g->NH, g->NKV, g->hs);
    float *fwant = to_f32(c.out, m); /* moves only: the rounded doubles exactly */
    CHECK(memcmp(fo, fwant, m * sizeof *fo) == 0, "NH %d NKV %d: float kv_expand differs", g->NH,
          g->NKV);
    double *grad = zeros(n);
    cpu_kv_expand_backward_f64(cx, grad, c.R, g->B * g->T, g->NH, g->NKV, g->hs);
    check_fd("kv_expand dpacked", gqa_kv_loss, &c, c.x, grad, n, FD_TOL);
    free(c.x), free(c.out), free(c.R), free(want), free(wrong), free(fx), free(fo), free(fwant),
        free(grad);
}

/* 4 query heads over 4 (a copy), 2 and 1 (multi-query) key/value heads;
 * head sizes not powers of two; odd row counts; positions from 0 and later */
static void test_rope_and_kv_expand_match_transformers_llama(void)
{
    static const struct gqa_shape shapes[] = {
        {1, 5, 4, 4, 10, 0},
        {3, 3, 4, 2, 6, 11},
        {1, 7, 4, 1, 14, 3},
        {2, 3, 3, 1, 2, 1000},
    };
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
        const struct gqa_shape *g = &shapes[k];
        size_t n = (size_t)g->B * g->T * (g->NH + 2 * g->NKV) * g->hs;
        check_rope_shape(g, n);
        check_kv_shape(g, n);
    }
}

struct swiglu_ctx {
    int N, F;
    double *inp, *out, *R;
};

static double swiglu_loss(void *p)
{
    struct swiglu_ctx *c = p;
    cpu_swiglu_forward_f64(cx, c->out, c->inp, c->N, c->F);
    return dot(c->out, c->R, (size_t)c->N * c->F);
}

static void test_swiglu_backward_matches_finite_differences(void)
{
    int N = 7, F = 13;
    struct swiglu_ctx c = {N, F, rnd(2 * N * F, 4), zeros(N * F), rnd(N * F, 1)};
    double *dinp = zeros(2 * N * F);
    cpu_swiglu_backward_f64(cx, dinp, c.inp, c.R, N, F);
    check_fd("swiglu dinp", swiglu_loss, &c, c.inp, dinp, 2 * N * F, FD_TOL);
    /* silu(1)·2 = 2/(1 + e⁻¹) */
    double in[2] = {1, 2}, y;
    cpu_swiglu_forward_f64(cx, &y, in, 1, 1);
    CHECK(fabs(y - 2 / (1 + exp(-1.0))) < 1e-15, "swiglu(1, 2) = %.16f", y);
    float *fi = to_f32(c.inp, 2 * N * F), *fo = malloc(N * F * sizeof(float));
    cpu_swiglu_forward_f32(cx, fo, fi, N, F);
    swiglu_loss(&c);
    check_close("swiglu forward", fo, c.out, N * F, F32_TOL);
    free(fi), free(fo), free(c.inp), free(c.out), free(c.R), free(dinp);
}

static void test_residual_adds(void)
{
    double a[3] = {1, 2, 3}, b[3] = {0.5, -2, 4}, out[3];
    cpu_residual_forward_f64(cx, out, a, b, 3);
    CHECK(out[0] == 1.5 && out[1] == 0 && out[2] == 7, "residual sums");
}

struct enc_ctx {
    int B, T, C, V;
    int32_t *tok;
    double *wte, *wpe, *out, *R;
};

static double enc_loss(void *p)
{
    struct enc_ctx *c = p;
    cpu_encoder_forward_f64(cx, c->out, c->tok, c->wte, 0, c->V, c->wpe, c->B, c->T, c->C);
    return dot(c->out, c->R, (size_t)c->B * c->T * c->C);
}

static void test_encoder_backward_matches_finite_differences(void)
{
    int B = 3, T = 4, C = 6, V = 5, maxT = 7;
    int32_t tok[12] = {0, 3, 3, 1, 4, 4, 4, 0, 2, 3, 1, 1}; /* repeats on purpose */
    struct enc_ctx c = {
        B, T, C, V, tok, rnd(V * C, 1), rnd(maxT * C, 1), zeros(B * T * C), rnd(B * T * C, 1)};
    double *dwte = zeros(V * C), *dwpe = rnd(maxT * C, 1);
    for (int i = T * C; i < maxT * C; i++) dwpe[i] = 0; /* rows ≥ T are never touched */
    cpu_encoder_backward_f64(cx, dwte, 0, V, dwpe, c.R, tok, B, T, C, false);
    check_fd("encoder dwte", enc_loss, &c, c.wte, dwte, V * C, FD_TOL);
    check_fd("encoder dwpe", enc_loss, &c, c.wpe, dwpe, maxT * C, FD_TOL);
    free(c.wte), free(c.wpe), free(c.out), free(c.R), free(dwte), free(dwpe);
}

/* The vocabulary-parallel embedding: the shards' outputs (wpe on one of them)
 * sum to the whole table's, exactly; each shard's gradient is its rows of the
 * whole one. */
static void test_encoder_shards_sum_to_the_whole_embedding(void)
{
    int B = 2, T = 3, C = 4, V = 6, maxT = 3;
    int32_t tok[6] = {0, 5, 2, 3, 3, 1};
    double *wte = rnd(V * C, 2), *wpe = rnd(maxT * C, 2), *dout = rnd(B * T * C, 2);
    double *whole = zeros(B * T * C), *sum = zeros(B * T * C), *part = zeros(B * T * C);
    double *dwhole = zeros(V * C), *dwpe = zeros(maxT * C), *dpart = zeros(V * C);
    cpu_encoder_forward_f64(cx, whole, tok, wte, 0, V, wpe, B, T, C);
    cpu_encoder_backward_f64(cx, dwhole, 0, V, dwpe, dout, tok, B, T, C, false);
    for (int v0 = 0; v0 < V; v0 += 2) { /* three shards of two rows */
        cpu_encoder_forward_f64(cx, part, tok, wte + v0 * C, v0, 2, v0 == 0 ? wpe : NULL, B, T, C);
        for (int i = 0; i < B * T * C; i++) sum[i] += part[i];
        cpu_encoder_backward_f64(cx, dpart + v0 * C, v0, 2, NULL, dout, tok, B, T, C, false);
    }
    CHECK(memcmp(sum, whole, sizeof(double) * B * T * C) == 0, "shard outputs do not sum exactly");
    CHECK(memcmp(dpart, dwhole, sizeof(double) * V * C) == 0, "shard gradients differ");
    free(wte), free(wpe), free(dout), free(whole), free(sum), free(part), free(dwhole), free(dwpe),
        free(dpart);
}

/* The three-part cross-entropy over a vocabulary split in shards (maxima
 * combined by max, sums by +) gives the fused classifier's losses and
 * gradients, the padding included. */
static void test_classifier_in_vocabulary_shards_matches_the_fused_one(void)
{
    enum { N = 5, V = 10, Vp = 12, SHARDS = 3, W = Vp / SHARDS };
    int32_t targets[N] = {0, 9, 4, 5, 3};
    double *logits = rnd(N * Vp, 3), *fused = malloc(sizeof(double) * N * Vp);
    double losses[N], split_losses[N], max[N], sum[N], tl[N];
    memcpy(fused, logits, sizeof(double) * N * Vp);
    cpu_classifier_f64(cx, fused, losses, targets, N, V, Vp, 0.25);
    double part_max[SHARDS][N], part_sum[SHARDS][N], part_tl[SHARDS][N];
    double shard[SHARDS][N * W];
    for (int s = 0; s < SHARDS; s++) {
        for (int r = 0; r < N; r++)
            memcpy(&shard[s][r * W], &logits[r * Vp + s * W], sizeof(double) * W);
        int nv = V - s * W < 0 ? 0 : V - s * W > W ? W : V - s * W;
        cpu_classifier_max_f64(cx, shard[s], part_max[s], N, nv, W);
    }
    for (int r = 0; r < N; r++) {
        max[r] = part_max[0][r];
        for (int s = 1; s < SHARDS; s++) max[r] = part_max[s][r] > max[r] ? part_max[s][r] : max[r];
        sum[r] = tl[r] = 0;
    }
    for (int s = 0; s < SHARDS; s++) {
        int nv = V - s * W < 0 ? 0 : V - s * W > W ? W : V - s * W;
        cpu_classifier_sumexp_f64(cx, shard[s], max, targets, s * W, nv, W, part_sum[s], part_tl[s],
                                  N);
        for (int r = 0; r < N; r++) sum[r] += part_sum[s][r], tl[r] += part_tl[s][r];
    }
    double worst = 0;
    for (int s = 0; s < SHARDS; s++) {
        int nv = V - s * W < 0 ? 0 : V - s * W > W ? W : V - s * W;
        cpu_classifier_finish_f64(cx, shard[s], split_losses, targets, max, sum, tl, s * W, nv, W,
                                  N, 0.25);
        for (int r = 0; r < N; r++)
            for (int i = 0; i < W; i++) {
                double d = fabs(shard[s][r * W + i] - fused[r * Vp + s * W + i]);
                worst = d > worst ? d : worst;
            }
    }
    for (int r = 0; r < N; r++)
        CHECK(fabs(split_losses[r] - losses[r]) < 1e-12, "row %d: %.17g vs %.17g", r,
              split_losses[r], losses[r]);
    CHECK(worst < 1e-15, "gradients differ by %g", worst);
    free(logits), free(fused);
}

/* ---- classifier (softmax cross-entropy over the unpadded vocabulary) ---------------- */

struct cls_ctx {
    int N, V, Vp;
    int32_t *targets;
    double *logits, *work, *losses;
    double scale;
};

static double cls_loss(void *p)
{
    struct cls_ctx *c = p;
    memcpy(c->work, c->logits, (size_t)c->N * c->Vp * sizeof(double));
    cpu_classifier_f64(cx, c->work, c->losses, c->targets, c->N, c->V, c->Vp, 0);
    double s = 0;
    for (int i = 0; i < c->N; i++) s += c->losses[i];
    return s * c->scale;
}

/* A target outside [0, V) (a corrupt token the loader did not stop) is read
 * nowhere, not even far past the row: its loss is NaN, its row's dlogits p·scale
 * (they sum to scale, no one-hot term); the other rows are untouched. */
static void test_classifier_target_outside_vocabulary_gives_nan_not_a_read(void)
{
    enum { N = 4, V = 10, Vp = 16 };
    int32_t targets[N] = {3, -1, V, 1 << 30};
    double *logits = rnd(N * Vp, 3), losses[N];
    float *fl = to_f32(logits, N * Vp), flosses[N];
    cpu_classifier_f64(cx, logits, losses, targets, N, V, Vp, 0.5);
    cpu_classifier_f32(cx, fl, flosses, targets, N, V, Vp, 0.5);
    CHECK(isfinite(losses[0]) && isfinite(flosses[0]), "row 0: %g, %g", losses[0], flosses[0]);
    for (int r = 0; r < N; r++) {
        double sum = 0, fsum = 0;
        for (int i = 0; i < Vp; i++) sum += logits[r * Vp + i], fsum += fl[r * Vp + i];
        double want = r == 0 ? 0 : 0.5;
        CHECK(fabs(sum - want) < 1e-12 && fabs(fsum - want) < 1e-5, "row %d: dlogits sum %g, %g", r,
              sum, fsum);
        if (r)
            CHECK(isnan(losses[r]) && isnan(flosses[r]), "row %d (target %d): %g, %g", r,
                  targets[r], losses[r], flosses[r]);
    }
    free(logits), free(fl);
}

static void test_classifier_gradient_matches_finite_differences(void)
{
    int N = 4, V = 10, Vp = 16;
    int32_t targets[4] = {0, 9, 3, 3};
    struct cls_ctx c = {N, V, Vp, targets, rnd(N * Vp, 3), zeros(N * Vp), zeros(N), 0.25};
    for (int r = 0; r < N; r++) /* huge padded logits must not matter */
        for (int i = V; i < Vp; i++) c.logits[r * Vp + i] = 1e3;
    double loss = cls_loss(&c);
    double *g = malloc(N * Vp * sizeof(double));
    memcpy(g, c.logits, N * Vp * sizeof(double));
    cpu_classifier_f64(cx, g, c.losses, targets, N, V, Vp, c.scale);
    check_fd("classifier dlogits", cls_loss, &c, c.logits, g, N * Vp, FD_TOL);
    /* the loss of row 0 by hand */
    double mx = -1e300, sum = 0;
    for (int i = 0; i < V; i++) mx = fmax(mx, c.logits[i]);
    for (int i = 0; i < V; i++) sum += exp(c.logits[i] - mx);
    double want0 = log(sum) + mx - c.logits[0];
    cls_loss(&c);
    CHECK(fabs(c.losses[0] - want0) < 1e-12, "loss row 0: %g, by hand %g", c.losses[0], want0);
    CHECK(isfinite(loss), "the padded columns leaked into the loss: %g", loss);
    for (int r = 0; r < N; r++)
        for (int i = V; i < Vp; i++) CHECK(g[r * Vp + i] == 0, "padded dlogits must be 0");
    float *fl = to_f32(c.logits, N * Vp), *floss = malloc(N * sizeof(float));
    cpu_classifier_f32(cx, fl, floss, targets, N, V, Vp, 0);
    cls_loss(&c);
    check_close("classifier losses", floss, c.losses, N, F32_TOL);
    free(fl), free(floss), free(g), free(c.logits), free(c.work), free(c.losses);
}

/* ---- sum of squares, AdamW --------------------------------------------------------- */

static void test_sum_squares_is_exact_enough_and_deterministic(void)
{
    size_t n = 100003;
    float *x = malloc(n * sizeof(float));
    double want = 0;
    for (size_t i = 0; i < n; i++) {
        x[i] = (float)urand();
        want += (double)x[i] * x[i];
    }
    double got = cpu_sum_squares_f32(cx, x, n), again = cpu_sum_squares_f32(cx, x, n);
    CHECK(fabs(got - want) / want < 1e-12, "sum of squares %.17g, want %.17g", got, want);
    CHECK(got == again, "sum of squares must be deterministic");
    CHECK(cpu_sum_squares_f32(cx, x, 0) == 0, "empty sum");
    free(x);
}

/* torch.optim.AdamW single-tensor steps, written out in double, against the
 * op with betas b1, b2 */
static void adamw_against_torch(double b1, double b2)
{
    float p[3] = {0.5f, -1.0f, 2.0f}, g[3] = {0.1f, -0.3f, 0.0f}, m[3] = {0}, v[3] = {0};
    double pd[3] = {0.5, -1.0, 2.0}, md[3] = {0}, vd[3] = {0};
    double lr = 1e-2, eps = 1e-8, wd = 0.1, scale = 0.5;
    for (int t = 1; t <= 3; t++) {
        ops_cpu()->adamw(cx, p, NULL, g, m, v, 3, (float)lr, b1, b2, (float)eps, (float)wd,
                         (float)scale, t);
        for (int i = 0; i < 3; i++) {
            double gi = (double)g[i] * scale;
            pd[i] *= 1 - lr * wd;
            md[i] = b1 * md[i] + (1 - b1) * gi;
            vd[i] = b2 * vd[i] + (1 - b2) * gi * gi;
            double denom = sqrt(vd[i]) / sqrt(1 - pow(b2, t)) + eps;
            pd[i] -= lr / (1 - pow(b1, t)) * md[i] / denom;
        }
    }
    for (int i = 0; i < 3; i++)
        CHECK(fabs(p[i] - pd[i]) < 1e-6, "adamw (betas %.9g, %.9g) p[%d] = %.9g, want %.9g", b1, b2,
              i, p[i], pd[i]);
}

static void test_adamw_matches_torch_formula(void)
{
    adamw_against_torch(0.9, 0.95);
}

/* A beta within 3e-8 of 1 rounds to 1.0f: its 1 − β and bias correction are
 * the plan's double arithmetic, so the step is PyTorch's, not 0/0 (a run
 * with beta2 0.99999999 had stopped "diverged" at step 1). */
static void test_adamw_takes_betas_next_to_one(void)
{
    adamw_against_torch(0.9, 0.99999999);
    adamw_against_torch(1 - 2e-8, 0.95);
}

/* adamw_multi over segments of odd sizes in one flat buffer (some with a bf16
 * copy, some without weight decay, one empty), three steps: the same bits as
 * adamw called segment by segment. */
static void test_adamw_multi_gives_adamws_bits_segment_by_segment(void)
{
    enum { SEGS = 5, STEPS = 3 };
    const size_t sizes[SEGS] = {7, 1, 0, 1031, 65};
    const bool decays[SEGS] = {true, false, true, true, false},
               has16[SEGS] = {true, true, false, false, true};
    size_t n = 0;
    for (int i = 0; i < SEGS; i++) n += sizes[i];
    float *g = malloc(n * sizeof *g), *st[2][3]; /* [multi, single][p, m, v] */
    uint16_t *p16[2] = {calloc(n, 2), calloc(n, 2)};
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < 3; j++) st[k][j] = malloc(n * sizeof(float));
    for (size_t e = 0; e < n; e++) {
        g[e] = (float)urand();
        st[0][0][e] = st[1][0][e] = (float)(0.5 * urand());
        st[0][1][e] = st[1][1][e] = (float)(0.1 * urand());
        st[0][2][e] = st[1][2][e] = (float)(0.01 * fabs(urand())); /* second moments ≥ 0 */
    }
    const struct ops *o = ops_cpu();
    float lr = 3e-3f, eps = 1e-8f, wd = 0.1f, scale = 0.75f;
    for (int t = 1; t <= STEPS; t++) {
        struct adamw_segment segs[SEGS];
        size_t at = 0;
        for (int i = 0; i < SEGS; i++) {
            segs[i] = (struct adamw_segment){.p = st[0][0] + at,
                                             .p16 = has16[i] ? p16[0] + at : NULL,
                                             .g = g + at,
                                             .m = st[0][1] + at,
                                             .v = st[0][2] + at,
                                             .n = sizes[i],
                                             .decays = decays[i]};
            o->adamw(cx, st[1][0] + at, has16[i] ? p16[1] + at : NULL, g + at, st[1][1] + at,
                     st[1][2] + at, sizes[i], lr, 0.9, 0.95, eps, decays[i] ? wd : 0.0f, scale, t);
            at += sizes[i];
        }
        o->adamw_multi(cx, segs, SEGS, lr, 0.9, 0.95, eps, wd, scale, t);
    }
    const char *names[3] = {"p", "m", "v"};
    for (int j = 0; j < 3; j++)
        CHECK(!memcmp(st[0][j], st[1][j], n * sizeof(float)),
              "adamw_multi's %s differs from adamw's", names[j]);
    CHECK(!memcmp(p16[0], p16[1], n * 2), "adamw_multi's bf16 copy differs from adamw's");
    size_t bare = sizes[0] + sizes[1] + sizes[2]; /* the segment without a copy keeps zeros */
    CHECK(p16[0][bare] == 0 && p16[0][bare + sizes[3] - 1] == 0,
          "adamw_multi wrote a bf16 copy it was not given");
    o->adamw_multi(cx, NULL, 0, lr, 0.9, 0.95, eps, wd, scale, STEPS + 1); /* nothing to do */
    for (int k = 0; k < 2; k++) {
        for (int j = 0; j < 3; j++) free(st[k][j]);
        free(p16[k]);
    }
    free(g);
}

int main(void)
{
    cx = test_cpu_open();
    RUN(test_layernorm_backward_matches_finite_differences);
    RUN(test_matmul_backward_matches_finite_differences);
    RUN(test_attention_backward_matches_finite_differences);
    RUN(test_gelu_backward_matches_finite_differences);
    RUN(test_rmsnorm_backward_matches_finite_differences);
    RUN(test_rope_rotates_q_and_k_by_position);
    RUN(test_kv_expand_repeats_each_head_for_its_group);
    RUN(test_rope_and_kv_expand_match_transformers_llama);
    RUN(test_swiglu_backward_matches_finite_differences);
    RUN(test_residual_adds);
    RUN(test_encoder_backward_matches_finite_differences);
    RUN(test_encoder_shards_sum_to_the_whole_embedding);
    RUN(test_classifier_in_vocabulary_shards_matches_the_fused_one);
    RUN(test_classifier_gradient_matches_finite_differences);
    RUN(test_classifier_target_outside_vocabulary_gives_nan_not_a_read);
    RUN(test_sum_squares_is_exact_enough_and_deterministic);
    RUN(test_adamw_matches_torch_formula);
    RUN(test_adamw_takes_betas_next_to_one);
    RUN(test_adamw_multi_gives_adamws_bits_segment_by_segment);
    ops_cpu()->close(cx);
    return check_exit_code();
}
