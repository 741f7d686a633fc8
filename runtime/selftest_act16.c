/* selftest_act16.c — the self-test's cases of the ops that keep an activation in bf16
 * (kernels/ops.h's "Activations stored in bf16"): each op of the GPU against its contract
 * as the CPU computes it — the fp32 namesake, then to_bf16; a product, the namesake with
 * w16 on the fp32 input that rounds to the bf16 one — and against the CPU's own 16 op
 * where the CPU has one. A bf16 output is compared in bf16 ulps (selftest.c's
 * act16_beyond); a norm's or activation's is also held bit for bit to its own backend's
 * namesake rounded (one kernel for both). Not the namesakes themselves: the other files'
 * cases. The harness and the shapes are selftest.c's. */
#include "runtime/selftest_cases.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "kernels/ops.h"

/* Whether this run computes a 16 op by its contract (the namesake, then to_bf16) rather
 * than by the op: the CPU's reference run does, in the first pass. A second pass, where
 * the CPU has the op, runs the op on every backend: the GPU's against the CPU's. */
static bool by_contract(const struct run *r, int pass)
{
    return pass == 0 && r->reference;
}

/* how many of n bf16 values differ in their bits between a and b (the backend's) */
static double bits_differ(struct run *r, const uint16_t *a, const uint16_t *b, size_t n)
{
    uint16_t *ha = malloc(n * sizeof *ha), *hb = malloc(n * sizeof *hb);
    double count = 0;
    if (ha && hb) {
        r->o->download(r->ctx, ha, a, n * sizeof *ha);
        r->o->download(r->ctx, hb, b, n * sizeof *hb);
        for (size_t i = 0; i < n; i++) count += ha[i] != hb[i];
    } else {
        r->broken = true;
    }
    free(ha);
    free(hb);
    return count;
}

/* A norm's or activation's bf16 output: op16 (n), the backend's 16 op's (NULL where it has
 * none: the CPU's until it gets one), beside rounded, its namesake's fp32 output rounded
 * by to_bf16 on the same backend. "out": the contract on the reference run, the op on the
 * other; "vs cpu16", where the CPU has the op (cpu16), the op on both; "!= rounded f32",
 * how many of the op's elements differ in their bits from rounded (0 without an op): 0 on
 * both, the CPU's by ops.h, the GPU's by its one kernel for both. */
static void keep16(struct run *r, const uint16_t *op16, const uint16_t *rounded, size_t n,
                   bool cpu16)
{
    selftest_out_act16(r, "out", by_contract(r, 0) || !op16 ? rounded : op16, n);
    if (cpu16 && op16) selftest_out_act16(r, "vs cpu16", op16, n);
    double differ = op16 ? bits_differ(r, op16, rounded, n) : 0;
    selftest_out_host(r, "!= rounded f32", &differ, 1, true);
}

/* an fp32 output of a 16 op beside its namesake's: the contract's on the reference run */
static void keep32(struct run *r, const char *name, const float *op, const float *namesake,
                   size_t n)
{
    selftest_out(r, name, by_contract(r, 0) || !op ? namesake : op, n);
}

/* ---- norms and activations: the namesake into its buffers, the 16 op into others ---- */

void selftest_layernorm16(struct run *r)
{
    const struct shape *s = r->s;
    size_t N = N_ROWS(s), n = N * s->C;
    float *x = selftest_rnd(r, n, 2, 0.5f), *w = selftest_rnd(r, s->C, 0.5f, 1),
          *b = selftest_rnd(r, s->C, 0.2f, 0);
    float *y = selftest_dev(r, n * 4), *mean = selftest_dev(r, N * 4),
          *rstd = selftest_dev(r, N * 4), *mean16 = selftest_dev(r, N * 4),
          *rstd16 = selftest_dev(r, N * 4);
    uint16_t *rounded = selftest_dev(r, n * 2), *y16 = selftest_dev(r, n * 2);
    if (r->broken) return;
    bool has = r->o->layernorm_forward16 != NULL;
    r->o->layernorm_forward(r->ctx, y, mean, rstd, x, w, b, (int)N, s->C);
    r->o->to_bf16(r->ctx, rounded, y, n);
    if (has) r->o->layernorm_forward16(r->ctx, y16, mean16, rstd16, x, w, b, (int)N, s->C);
    keep16(r, has ? y16 : NULL, rounded, n, ops_cpu()->layernorm_forward16 != NULL);
    keep32(r, "mean", has ? mean16 : NULL, mean, N);
    keep32(r, "rstd", has ? rstd16 : NULL, rstd, N);
}

void selftest_rmsnorm16(struct run *r)
{
    const struct shape *s = r->s;
    size_t N = N_ROWS(s), n = N * s->C;
    float *x = selftest_rnd(r, n, 2, 0.5f), *w = selftest_rnd(r, s->C, 0.5f, 1);
    float *y = selftest_dev(r, n * 4), *rstd = selftest_dev(r, N * 4),
          *rstd16 = selftest_dev(r, N * 4);
    uint16_t *rounded = selftest_dev(r, n * 2), *y16 = selftest_dev(r, n * 2);
    if (r->broken) return;
    bool has = r->o->rmsnorm_forward16 != NULL;
    r->o->rmsnorm_forward(r->ctx, y, rstd, x, w, (int)N, s->C, 1e-5f);
    r->o->to_bf16(r->ctx, rounded, y, n);
    if (has) r->o->rmsnorm_forward16(r->ctx, y16, rstd16, x, w, (int)N, s->C, 1e-5f);
    keep16(r, has ? y16 : NULL, rounded, n, ops_cpu()->rmsnorm_forward16 != NULL);
    keep32(r, "rstd", has ? rstd16 : NULL, rstd, N);
}

/* the MLP's activation: (N, OC), GPT-2's 4·C */
void selftest_gelu16(struct run *r)
{
    const struct shape *s = r->s;
    size_t n = N_ROWS(s) * s->OC;
    float *x = selftest_rnd(r, n, 2, 0), *y = selftest_dev(r, n * 4);
    uint16_t *rounded = selftest_dev(r, n * 2), *y16 = selftest_dev(r, n * 2);
    if (r->broken) return;
    bool has = r->o->gelu_forward16 != NULL;
    r->o->gelu_forward(r->ctx, y, x, n);
    r->o->to_bf16(r->ctx, rounded, y, n);
    if (has) r->o->gelu_forward16(r->ctx, y16, x, n);
    keep16(r, has ? y16 : NULL, rounded, n, ops_cpu()->gelu_forward16 != NULL);
}

/* F = OC, inp (N, 2F) */
void selftest_swiglu16(struct run *r)
{
    const struct shape *s = r->s;
    size_t N = N_ROWS(s), F = (size_t)s->OC;
    float *x = selftest_rnd(r, N * 2 * F, 2, 0), *y = selftest_dev(r, N * F * 4);
    uint16_t *rounded = selftest_dev(r, N * F * 2), *y16 = selftest_dev(r, N * F * 2);
    if (r->broken) return;
    bool has = r->o->swiglu_forward16 != NULL;
    r->o->swiglu_forward(r->ctx, y, x, (int)N, (int)F);
    r->o->to_bf16(r->ctx, rounded, y, N * F);
    if (has) r->o->swiglu_forward16(r->ctx, y16, x, (int)N, (int)F);
    keep16(r, has ? y16 : NULL, rounded, N * F, ops_cpu()->swiglu_forward16 != NULL);
}

/* the fused residual add and norm: res and the statistics fp32, the norm's output bf16;
 * the namesake is the fused fp32 op (the CPU's: the composition) */
void selftest_residual_layernorm16(struct run *r)
{
    const struct shape *s = r->s;
    size_t N = N_ROWS(s), n = N * s->C;
    float *a = selftest_rnd(r, n, 2, 0.5f), *b = selftest_rnd(r, n, 1, 0),
          *w = selftest_rnd(r, s->C, 0.5f, 1), *bias = selftest_rnd(r, s->C, 0.2f, 0);
    float *res = selftest_dev(r, n * 4), *y = selftest_dev(r, n * 4),
          *mean = selftest_dev(r, N * 4), *rstd = selftest_dev(r, N * 4);
    float *res16 = selftest_dev(r, n * 4), *mean16 = selftest_dev(r, N * 4),
          *rstd16 = selftest_dev(r, N * 4);
    uint16_t *rounded = selftest_dev(r, n * 2), *y16 = selftest_dev(r, n * 2);
    if (r->broken) return;
    bool has = r->o->residual_layernorm_forward16 != NULL;
    r->o->residual_layernorm_forward(r->ctx, res, y, mean, rstd, a, b, w, bias, (int)N, s->C);
    r->o->to_bf16(r->ctx, rounded, y, n);
    if (has)
        r->o->residual_layernorm_forward16(r->ctx, res16, y16, mean16, rstd16, a, b, w, bias,
                                           (int)N, s->C);
    keep16(r, has ? y16 : NULL, rounded, n, ops_cpu()->residual_layernorm_forward16 != NULL);
    keep32(r, "res", has ? res16 : NULL, res, n);
    keep32(r, "mean", has ? mean16 : NULL, mean, N);
    keep32(r, "rstd", has ? rstd16 : NULL, rstd, N);
}

void selftest_residual_rmsnorm16(struct run *r)
{
    const struct shape *s = r->s;
    size_t N = N_ROWS(s), n = N * s->C;
    float *a = selftest_rnd(r, n, 2, 0.5f), *b = selftest_rnd(r, n, 1, 0),
          *w = selftest_rnd(r, s->C, 0.5f, 1);
    float *res = selftest_dev(r, n * 4), *y = selftest_dev(r, n * 4),
          *rstd = selftest_dev(r, N * 4), *res16 = selftest_dev(r, n * 4),
          *rstd16 = selftest_dev(r, N * 4);
    uint16_t *rounded = selftest_dev(r, n * 2), *y16 = selftest_dev(r, n * 2);
    if (r->broken) return;
    bool has = r->o->residual_rmsnorm_forward16 != NULL;
    r->o->residual_rmsnorm_forward(r->ctx, res, y, rstd, a, b, w, (int)N, s->C, 1e-5f);
    r->o->to_bf16(r->ctx, rounded, y, n);
    if (has)
        r->o->residual_rmsnorm_forward16(r->ctx, res16, y16, rstd16, a, b, w, (int)N, s->C, 1e-5f);
    keep16(r, has ? y16 : NULL, rounded, n, ops_cpu()->residual_rmsnorm_forward16 != NULL);
    keep32(r, "res", has ? res16 : NULL, res, n);
    keep32(r, "rstd", has ? rstd16 : NULL, rstd, N);
}

/* ---- the products: x (N,C) in fp32 and its bf16 copy x16, the weight's w16 ---- */

struct product16 {
    float *x, *w, *bias;
    uint16_t *x16, *w16;
};

static bool product16_inputs(struct run *r, struct product16 *p)
{
    const struct shape *s = r->s;
    size_t nx = N_ROWS(s) * s->C, nw = (size_t)s->OC * s->C;
    p->x = selftest_rnd(r, nx, 1, 0);
    p->w = selftest_rnd(r, nw, 0.1f, 0);
    p->bias = selftest_rnd(r, s->OC, 1, 0);
    p->x16 = selftest_dev(r, nx * 2);
    p->w16 = selftest_dev(r, nw * 2);
    if (r->broken) return false;
    r->o->to_bf16(r->ctx, p->x16, p->x, nx);
    r->o->to_bf16(r->ctx, p->w16, p->w, nw);
    return true;
}

/* with the bias and without */
void selftest_matmul_forward16(struct run *r)
{
    static const char *const names[2][2] = {{"out_bias", "out"}, {"out_bias cpu16", "out cpu16"}};
    const struct shape *s = r->s;
    int N = (int)N_ROWS(s), C = s->C, OC = s->OC;
    size_t n = (size_t)N * OC;
    struct product16 p;
    float *y1 = selftest_dev(r, n * 4), *y2 = selftest_dev(r, n * 4);
    if (!product16_inputs(r, &p) || r->broken) return;
    int passes = ops_cpu()->matmul_forward16 ? 2 : 1;
    for (int pass = 0; pass < passes; pass++) {
        if (by_contract(r, pass)) {
            r->o->matmul_forward(r->ctx, y1, p.x, p.w, p.w16, p.bias, N, C, OC);
            r->o->matmul_forward(r->ctx, y2, p.x, p.w, p.w16, NULL, N, C, OC);
        } else {
            r->o->matmul_forward16(r->ctx, y1, p.x16, p.w16, p.bias, N, C, OC);
            r->o->matmul_forward16(r->ctx, y2, p.x16, p.w16, NULL, N, C, OC);
        }
        selftest_out(r, names[pass][0], y1, n);
        selftest_out(r, names[pass][1], y2, n);
    }
}

/* all three gradients accumulated, then split: the input's alone, the weights' alone;
 * each pass into gradients of its own (their starting values drawn alike on both sides) */
void selftest_matmul_backward16(struct run *r)
{
    static const char *const names[2][6] = {
        {"dinp", "dw_acc", "dbias_acc", "dinp_only", "dw_only", "dbias"},
        {"dinp cpu16", "dw_acc cpu16", "dbias_acc cpu16", "dinp_only cpu16", "dw_only cpu16",
         "dbias cpu16"}};
    const struct shape *s = r->s;
    int N = (int)N_ROWS(s), C = s->C, OC = s->OC;
    size_t nx = (size_t)N * C, nw = (size_t)OC * C;
    struct product16 p;
    if (!product16_inputs(r, &p)) return;
    float *dy = selftest_rnd(r, (size_t)N * OC, 1, 0);
    int passes = ops_cpu()->matmul_backward16 ? 2 : 1;
    for (int pass = 0; pass < passes; pass++) {
        float *dx = selftest_dev(r, nx * 4), *dx2 = selftest_dev(r, nx * 4);
        float *dw = selftest_rnd(r, nw, 1, 0), *db = selftest_rnd(r, OC, 1, 0);
        float *dw2 = selftest_rnd(r, nw, 1, 0), *db2 = selftest_rnd(r, OC, 1, 0);
        if (r->broken) return;
        if (by_contract(r, pass)) {
            r->o->matmul_backward(r->ctx, dx, dw, db, dy, p.x, p.w, p.w16, N, C, OC, true);
            r->o->matmul_backward(r->ctx, dx2, NULL, NULL, dy, p.x, p.w, p.w16, N, C, OC, false);
            r->o->matmul_backward(r->ctx, NULL, dw2, db2, dy, p.x, p.w, p.w16, N, C, OC, false);
        } else {
            r->o->matmul_backward16(r->ctx, dx, dw, db, dy, p.x16, p.w16, N, C, OC, true);
            r->o->matmul_backward16(r->ctx, dx2, NULL, NULL, dy, p.x16, p.w16, N, C, OC, false);
            r->o->matmul_backward16(r->ctx, NULL, dw2, db2, dy, p.x16, p.w16, N, C, OC, false);
        }
        const float *outs[6] = {dx, dw, db, dx2, dw2, db2};
        const size_t lens[6] = {nx, nw, (size_t)OC, nx, nw, (size_t)OC};
        for (int k = 0; k < 6; k++) selftest_out(r, names[pass][k], outs[k], lens[k]);
    }
}

/* The MLP's first product with its GELU, the output in bf16 and pre in fp32: the contract
 * is the fused fp32 op where the backend has one, else (the CPU) matmul_forward and
 * gelu_forward, then to_bf16 */
void selftest_matmul_gelu16(struct run *r)
{
    static const char *const names[2][2] = {{"pre", "gelu"}, {"pre cpu16", "gelu cpu16"}};
    const struct shape *s = r->s;
    int N = (int)N_ROWS(s), C = s->C, OC = s->OC;
    size_t n = (size_t)N * OC;
    struct product16 p;
    float *pre = selftest_dev(r, n * 4), *y = selftest_dev(r, n * 4);
    uint16_t *y16 = selftest_dev(r, n * 2);
    if (!product16_inputs(r, &p) || r->broken) return;
    int passes = ops_cpu()->matmul_forward_gelu16 ? 2 : 1;
    for (int pass = 0; pass < passes; pass++) {
        if (!by_contract(r, pass)) {
            r->o->matmul_forward_gelu16(r->ctx, y16, pre, p.x16, p.w16, p.bias, N, C, OC);
        } else if (r->o->matmul_forward_gelu) {
            r->o->matmul_forward_gelu(r->ctx, y, pre, p.x, p.w, p.w16, p.bias, N, C, OC);
        } else {
            r->o->matmul_forward(r->ctx, pre, p.x, p.w, p.w16, p.bias, N, C, OC);
            r->o->gelu_forward(r->ctx, y, pre, n);
        }
        if (by_contract(r, pass)) r->o->to_bf16(r->ctx, y16, y, n);
        selftest_out(r, names[pass][0], pre, n);
        selftest_out_act16(r, names[pass][1], y16, n);
    }
}

/* ---- the LM head with bf16 activations: the classifier's gradient in bf16, the
 * head's backward on it (dout (N,Vp) = dlogits16, OC = Vp) ---- */

/* dlogits16 held to the namesake's fp32 dlogits rounded (keep16: within a bf16 ulp of
 * the CPU's, and bit for bit to its own backend's namesake, one kernel for both), the
 * losses to the namesake's; each op on logits of its own (it leaves them undefined) */
void selftest_classifier16(struct run *r)
{
    const struct shape *s = r->s;
    size_t N = N_ROWS(s), n = N * s->Vp;
    int32_t *tgt = selftest_tokens(r, N, s->V);
    float *lg = selftest_rnd(r, n, 2, 0), *lg16 = selftest_dev(r, n * 4);
    float *loss = selftest_dev(r, N * 4), *loss16 = selftest_dev(r, N * 4);
    uint16_t *rounded = selftest_dev(r, n * 2), *d16 = selftest_dev(r, n * 2);
    if (r->broken) return;
    bool has = r->o->classifier16 != NULL;
    float scale = 1.0f / (float)N;
    r->o->copy(r->ctx, lg16, lg, n * 4);
    if (has) r->o->classifier16(r->ctx, d16, lg16, loss16, tgt, (int)N, s->V, s->Vp, scale);
    r->o->classifier(r->ctx, lg, loss, tgt, (int)N, s->V, s->Vp, scale);
    r->o->to_bf16(r->ctx, rounded, lg, n);
    keep16(r, has ? d16 : NULL, rounded, n, ops_cpu()->classifier16 != NULL);
    keep32(r, "losses", has ? loss16 : NULL, loss, N);
}

/* the vocabulary-parallel finish on one rank's shard, as selftest_classifier_parts: entries
 * [v0, v0+nv) of a (N, Vs) slice, targets inside and outside it; its row statistics from
 * the backend's own classifier_max and classifier_sumexp */
void selftest_classifier_finish16(struct run *r)
{
    const struct shape *s = r->s;
    size_t N = N_ROWS(s);
    int Vs = s->Vp / 2, nv = Vs - 3, v0 = s->V / 4;
    size_t n = N * (size_t)Vs;
    int32_t *tgt = selftest_tokens(r, N, s->V);
    float *lg = selftest_rnd(r, n, 2, 0), *lg16 = selftest_dev(r, n * 4);
    float *mx = selftest_dev(r, N * 4), *sum = selftest_dev(r, N * 4), *tl = selftest_dev(r, N * 4);
    float *loss = selftest_dev(r, N * 4), *loss16 = selftest_dev(r, N * 4);
    uint16_t *rounded = selftest_dev(r, n * 2), *d16 = selftest_dev(r, n * 2);
    if (r->broken) return;
    bool has = r->o->classifier_finish16 != NULL;
    r->o->copy(r->ctx, lg16, lg, n * 4);
    r->o->classifier_max(r->ctx, lg, mx, (int)N, nv, Vs);
    r->o->classifier_sumexp(r->ctx, lg, mx, tgt, v0, nv, Vs, sum, tl, (int)N);
    if (has)
        r->o->classifier_finish16(r->ctx, d16, lg16, loss16, tgt, mx, sum, tl, v0, nv, Vs, (int)N,
                                  0.5f);
    r->o->classifier_finish(r->ctx, lg, loss, tgt, mx, sum, tl, v0, nv, Vs, (int)N, 0.5f);
    r->o->to_bf16(r->ctx, rounded, lg, n);
    keep16(r, has ? d16 : NULL, rounded, n, ops_cpu()->classifier_finish16 != NULL);
    keep32(r, "losses", has ? loss16 : NULL, loss, N);
}

/* The product on a bf16 dout: dy16 = to_bf16(dy), against matmul_backward16 on dy, which
 * rounds dy to the same dy16 first (ops.h); dw accumulated and not, dinp alone and with
 * dw, each pass into gradients of its own as selftest_matmul_backward16 */
void selftest_matmul_backward_dout16(struct run *r)
{
    static const char *const names[2][4] = {
        {"dinp", "dw_acc", "dinp_only", "dw_only"},
        {"dinp cpu16", "dw_acc cpu16", "dinp_only cpu16", "dw_only cpu16"}};
    const struct shape *s = r->s;
    int N = (int)N_ROWS(s), C = s->C, OC = s->OC;
    size_t nx = (size_t)N * C, nw = (size_t)OC * C, ny = (size_t)N * OC;
    struct product16 p;
    if (!product16_inputs(r, &p)) return;
    float *dy = selftest_rnd(r, ny, 1, 0);
    uint16_t *dy16 = selftest_dev(r, ny * 2);
    if (r->broken) return;
    r->o->to_bf16(r->ctx, dy16, dy, ny);
    int passes = ops_cpu()->matmul_backward_dout16 ? 2 : 1;
    for (int pass = 0; pass < passes; pass++) {
        float *dx = selftest_dev(r, nx * 4), *dx2 = selftest_dev(r, nx * 4);
        float *dw = selftest_rnd(r, nw, 1, 0), *dw2 = selftest_rnd(r, nw, 1, 0);
        if (r->broken) return;
        if (by_contract(r, pass)) {
            r->o->matmul_backward16(r->ctx, dx, dw, NULL, dy, p.x16, p.w16, N, C, OC, true);
            r->o->matmul_backward16(r->ctx, dx2, NULL, NULL, dy, p.x16, p.w16, N, C, OC, false);
            r->o->matmul_backward16(r->ctx, NULL, dw2, NULL, dy, p.x16, p.w16, N, C, OC, false);
        } else {
            r->o->matmul_backward_dout16(r->ctx, dx, dw, dy16, p.x16, p.w16, N, C, OC, true);
            r->o->matmul_backward_dout16(r->ctx, dx2, NULL, dy16, p.x16, p.w16, N, C, OC, false);
            r->o->matmul_backward_dout16(r->ctx, NULL, dw2, dy16, p.x16, p.w16, N, C, OC, false);
        }
        const float *outs[4] = {dx, dw, dx2, dw2};
        const size_t lens[4] = {nx, nw, nx, nw};
        for (int k = 0; k < 4; k++) selftest_out(r, names[pass][k], outs[k], lens[k]);
    }
}
