/* test_ops_fused.c — the CPU backend's fused ops (kernels/ops.h) against the ops they
 * fuse, run one after the other as the model ran them before: the same bits, at odd
 * shapes and real ones (a residual add and its LayerNorm or RMSNorm; rotary positions
 * on the packed q, k, v and the grouped-query expansion, and their backward). The GPU's
 * fused kernels are held to these by plait-train --selftest. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kernels/ops.h"
#include "tests/unit/cpu_ctx.h"
#include "tests/unit/fd_check.h"

static struct ops_ctx *cx; /* the kernels' context (main opens it) */

/* n floats in [shift - scale, shift + scale) */
static float *frnd(size_t n, double scale, double shift)
{
    float *p = malloc(n * sizeof *p);
    for (size_t i = 0; p && i < n; i++) p[i] = (float)(shift + scale * urand());
    return p;
}

static float *fcopy(const float *x, size_t n)
{
    float *p = malloc(n * sizeof *p);
    if (p) memcpy(p, x, n * sizeof *p);
    return p;
}

static bool same_bits(const char *what, const float *a, const float *b, size_t n, int C)
{
    bool same = memcmp(a, b, n * sizeof *a) == 0;
    CHECK(same, "%s at width %d: the fused op's bits differ from the composition's", what, C);
    return same;
}

/* res = a + b then the norm, fused and composed; rmsnorm's res over a, as an op may */
static void check_residual_norms(int N, int C)
{
    const struct ops *o = ops_cpu();
    size_t n = (size_t)N * C;
    float *a = frnd(n, 2, 0.5), *b = frnd(n, 1, 0), *w = frnd(C, 0.5, 1), *bias = frnd(C, 0.2, 0);
    float *res = malloc(n * 4), *out = malloc(n * 4), *mean = malloc(N * 4), *rstd = malloc(N * 4);
    float *res1 = malloc(n * 4), *out1 = malloc(n * 4), *mean1 = malloc(N * 4),
          *rstd1 = malloc(N * 4);
    o->residual_layernorm_forward(cx, res, out, mean, rstd, a, b, w, bias, N, C);
    o->residual_forward(cx, res1, a, b, n);
    o->layernorm_forward(cx, out1, mean1, rstd1, res1, w, bias, N, C);
    same_bits("residual+layernorm res", res, res1, n, C);
    same_bits("residual+layernorm out", out, out1, n, C);
    same_bits("residual+layernorm mean", mean, mean1, (size_t)N, C);
    same_bits("residual+layernorm rstd", rstd, rstd1, (size_t)N, C);
    float *a1 = fcopy(a, n);
    o->residual_rmsnorm_forward(cx, a, out, rstd, a, b, w, N, C, 1e-5f);
    o->residual_forward(cx, res1, a1, b, n);
    o->rmsnorm_forward(cx, out1, rstd1, res1, w, N, C, 1e-5f);
    same_bits("residual+rmsnorm res (over a)", a, res1, n, C);
    same_bits("residual+rmsnorm out", out, out1, n, C);
    same_bits("residual+rmsnorm rstd", rstd, rstd1, (size_t)N, C);
    free(a), free(a1), free(b), free(w), free(bias), free(res), free(out), free(mean), free(rstd);
    free(res1), free(out1), free(mean1), free(rstd1);
}

static void test_residual_norms_give_the_composition_bits(void)
{
    check_residual_norms(10, 12);  /* odd, narrower than a vector */
    check_residual_norms(37, 72);  /* odd rows */
    check_residual_norms(64, 768); /* GPT-2 124M */
    check_residual_norms(8, 4096); /* Llama 3 8B */
}

/* Forward: rope on packed in place then kv_expand (the model's order before), against
 * the fused op, which leaves packed as it was. Backward: kv_expand_backward then
 * rope_backward. */
static void check_rope_kv(int B, int T, int NH, int NKV, int hs, double theta, int pos0)
{
    const struct ops *o = ops_cpu();
    size_t N = (size_t)B * T, n = N * (size_t)(NH + 2 * NKV) * hs, wide = N * 3 * (size_t)NH * hs;
    float *packed = frnd(n, 1, 0), *kept = fcopy(packed, n), *out = malloc(wide * 4),
          *out1 = malloc(wide * 4), *dout = frnd(wide, 1, 0), *dp = malloc(n * 4),
          *dp1 = malloc(n * 4);
    o->rope_kv_expand(cx, out, packed, B, T, NH, NKV, hs, theta, pos0);
    CHECK(memcmp(packed, kept, n * sizeof *packed) == 0,
          "NH %d NKV %d hs %d: rope_kv_expand changed packed", NH, NKV, hs);
    o->rope_forward(cx, packed, B, T, NH, NKV, hs, theta, pos0);
    o->kv_expand(cx, out1, packed, (int)N, NH, NKV, hs);
    CHECK(memcmp(out, out1, wide * sizeof *out) == 0,
          "NH %d NKV %d hs %d pos0 %d: rope_kv_expand differs from rope then kv_expand", NH, NKV,
          hs, pos0);
    o->rope_kv_expand_backward(cx, dp, dout, B, T, NH, NKV, hs, theta, pos0);
    o->kv_expand_backward(cx, dp1, dout, (int)N, NH, NKV, hs);
    o->rope_backward(cx, dp1, B, T, NH, NKV, hs, theta, pos0);
    CHECK(memcmp(dp, dp1, n * sizeof *dp) == 0,
          "NH %d NKV %d hs %d pos0 %d: rope_kv_expand_backward differs from the composition", NH,
          NKV, hs, pos0);
    free(packed), free(kept), free(out), free(out1), free(dout), free(dp), free(dp1);
}

static void test_rope_kv_expand_gives_the_composition_bits(void)
{
    check_rope_kv(2, 5, 3, 1, 4, 10000.0, 0);      /* multi-query */
    check_rope_kv(3, 37, 6, 3, 12, 500000.0, 7);   /* groups of 2, positions from 7 */
    check_rope_kv(2, 9, 5, 5, 8, 10000.0, 1000);   /* NKV = NH: no groups */
    check_rope_kv(1, 64, 32, 8, 128, 500000.0, 0); /* Llama 3 8B's heads */
}

int main(void)
{
    cx = test_cpu_open();
    RUN(test_residual_norms_give_the_composition_bits);
    RUN(test_rope_kv_expand_gives_the_composition_bits);
    ops_cpu()->close(cx);
    return check_exit_code();
}
