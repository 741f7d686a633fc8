/* selftest_fused.c — the self-test's cases of the fused ops, each against the CPU's
 * composition of the ops it fuses: a residual add with the LayerNorm or RMSNorm after it,
 * and rotary positions with grouped-query attention's key/value expansion (and their
 * backward). The harness and the shapes are selftest.c's. */
#include "runtime/selftest_cases.h"

#include "kernels/ops.h"

/* res into a buffer of its own; out and the statistics */
void selftest_residual_layernorm(struct run *r)
{
    const struct shape *s = r->s;
    size_t N = N_ROWS(s), n = N * s->C;
    float *a = selftest_rnd(r, n, 2, 0.5f), *b = selftest_rnd(r, n, 1, 0),
          *w = selftest_rnd(r, s->C, 0.5f, 1), *bias = selftest_rnd(r, s->C, 0.2f, 0);
    float *res = selftest_dev(r, n * 4), *y = selftest_dev(r, n * 4),
          *mean = selftest_dev(r, N * 4), *rstd = selftest_dev(r, N * 4);
    if (r->broken) return;
    r->o->residual_layernorm_forward(r->ctx, res, y, mean, rstd, a, b, w, bias, (int)N, s->C);
    selftest_out(r, "res", res, n);
    selftest_out(r, "out", y, n);
    selftest_out(r, "mean", mean, N);
    selftest_out(r, "rstd", rstd, N);
}

/* res written over a, as an op may (the runtime's res2 is a buffer of its own) */
void selftest_residual_rmsnorm(struct run *r)
{
    const struct shape *s = r->s;
    size_t N = N_ROWS(s), n = N * s->C;
    float *a = selftest_rnd(r, n, 2, 0.5f), *b = selftest_rnd(r, n, 1, 0),
          *w = selftest_rnd(r, s->C, 0.5f, 1);
    float *y = selftest_dev(r, n * 4), *rstd = selftest_dev(r, N * 4);
    if (r->broken) return;
    r->o->residual_rmsnorm_forward(r->ctx, a, y, rstd, a, b, w, (int)N, s->C, 1e-5f);
    selftest_out(r, "res (over a)", a, n);
    selftest_out(r, "out", y, n);
    selftest_out(r, "rstd", rstd, N);
}

/* hs = C/NH, the shape's NKV key/value heads: the expansion rotated at positions from 7
 * (Llama 3's theta), packed left unrotated; the gradient's group sums rotated back at
 * positions from 1000 (theta 10^4, another table) */
void selftest_rope_kv_expand(struct run *r)
{
    const struct shape *s = r->s;
    int hs = s->C / s->NH, KV = s->NKV;
    size_t n = N_ROWS(s) * (size_t)(s->NH + 2 * KV) * hs, wide = N_ROWS(s) * 3 * s->C;
    float *packed = selftest_rnd(r, n, 1, 0), *o = selftest_dev(r, wide * 4),
          *d = selftest_rnd(r, wide, 1, 0), *dp = selftest_rnd(r, n, 1, 0); /* dp: overwritten */
    if (r->broken) return;
    r->o->rope_kv_expand(r->ctx, o, packed, s->B, s->T, s->NH, KV, hs, 500000.0, 7);
    selftest_out(r, "out", o, wide);
    selftest_out(r, "packed (kept)", packed, n);
    r->o->rope_kv_expand_backward(r->ctx, dp, d, s->B, s->T, s->NH, KV, hs, 10000.0, 1000);
    selftest_out(r, "dpacked", dp, n);
}
