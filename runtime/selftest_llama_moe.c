/* selftest_llama_moe.c — the self-test's cases of the Llama family's ops
 * (RMSNorm, rotary positions, the key/value heads' repeat, SwiGLU) and of a
 * mixture of experts' routing (route, dispatch, gather and combine, the
 * routing's backward and losses). The harness is selftest.c's. */
#include "runtime/selftest_cases.h"

#include <stdint.h>
#include <stdlib.h>

#include "kernels/ops.h"

/* ---- the Llama ops: hs = C/NH (4, 12, 64), NKV = NH/2 where NH is even, else
 * 1 (multi-query at the first shape); kv_expand also at NKV = NH (a copy) ---- */

static int kv_heads(const struct shape *s)
{
    return s->NH % 2 == 0 ? s->NH / 2 : 1;
}

void selftest_rmsnorm(struct run *r)
{
    const struct shape *s = r->s;
    size_t n = N_ROWS(s) * s->C;
    float *x = selftest_rnd(r, n, 2, 0.5f), *w = selftest_rnd(r, s->C, 0.5f, 1);
    float *y = selftest_dev(r, n * 4), *rstd = selftest_dev(r, N_ROWS(s) * 4);
    float *dy = selftest_rnd(r, n, 1, 0), *dx = selftest_rnd(r, n, 1, 0);
    float *dw = selftest_rnd(r, s->C, 1, 0), *dw2 = selftest_rnd(r, s->C, 1, 0);
    if (r->broken) return;
    int N = (int)N_ROWS(s);
    r->o->rmsnorm_forward(r->ctx, y, rstd, x, w, N, s->C, 1e-5f);
    selftest_out(r, "out", y, n);
    selftest_out(r, "rstd", rstd, N_ROWS(s));
    r->o->rmsnorm_backward(r->ctx, dx, dw, dy, x, w, rstd, N, s->C, true);
    selftest_out(r, "dinp+=", dx, n);
    selftest_out(r, "dw_acc", dw, s->C);
    r->o->rmsnorm_backward(r->ctx, dx, dw2, dy, x, w, rstd, N, s->C, false);
    selftest_out(r, "dw", dw2, s->C);
}

/* q and k rotated at positions from 7 (theta 10^4), then at 0 (Llama 3's
 * 5·10^5, another table); a gradient rotated back; then positions from 1000,
 * where angles taken in fp32 instead of double put the output 2e-5 (third
 * shape) to 5e-5 (GPT-2's) off, above the limit (numpy, these inputs); then
 * from 500, inside the table the 1000s left (a GPU's rows of it, as context
 * parallelism's chunks take theirs) */
void selftest_rope(struct run *r)
{
    const struct shape *s = r->s;
    int hs = s->C / s->NH, KV = kv_heads(s);
    size_t n = N_ROWS(s) * (size_t)(s->NH + 2 * KV) * hs;
    float *x = selftest_rnd(r, n, 1, 0), *x2 = selftest_rnd(r, n, 1, 0),
          *dx = selftest_rnd(r, n, 1, 0);
    float *far = selftest_rnd(r, n, 1, 0), *mid = selftest_rnd(r, n, 1, 0);
    if (r->broken) return;
    r->o->rope_forward(r->ctx, x, s->B, s->T, s->NH, KV, hs, 10000.0, 7);
    selftest_out(r, "rotated pos0=7", x, n);
    r->o->rope_forward(r->ctx, x2, s->B, s->T, s->NH, KV, hs, 500000.0, 0);
    selftest_out(r, "rotated", x2, n);
    r->o->rope_backward(r->ctx, dx, s->B, s->T, s->NH, KV, hs, 10000.0, 7);
    selftest_out(r, "drotated", dx, n);
    r->o->rope_forward(r->ctx, far, s->B, s->T, s->NH, KV, hs, 10000.0, 1000);
    selftest_out(r, "rot pos0=1000", far, n);
    r->o->rope_forward(r->ctx, mid, s->B, s->T, s->NH, KV, hs, 10000.0, 500);
    selftest_out(r, "rot pos0=500", mid, n);
}

/* the expansion and its group sums: the same values, added in head order */
void selftest_kv_expand(struct run *r)
{
    const struct shape *s = r->s;
    int hs = s->C / s->NH, N = (int)N_ROWS(s);
    const int kvs[2] = {kv_heads(s), s->NH};
    const char *names[2][2] = {{"out", "dpacked"}, {"out nkv=nh", "dpacked nkv=nh"}};
    size_t wide = N_ROWS(s) * 3 * s->C;
    float *d = selftest_rnd(r, wide, 1, 0), *o = selftest_dev(r, wide * 4);
    for (int k = 0; k < 2 && !r->broken; k++) {
        size_t n = N_ROWS(s) * (size_t)(s->NH + 2 * kvs[k]) * hs;
        float *packed = selftest_rnd(r, n, 1, 0),
              *dp = selftest_rnd(r, n, 1, 0); /* dp: overwritten */
        if (r->broken) return;
        r->o->kv_expand(r->ctx, o, packed, N, s->NH, kvs[k], hs);
        selftest_out(r, names[k][0], o, wide);
        r->o->kv_expand_backward(r->ctx, dp, d, N, s->NH, kvs[k], hs);
        selftest_out(r, names[k][1], dp, n);
    }
}

void selftest_swiglu(struct run *r)
{
    const struct shape *s = r->s;
    size_t N = N_ROWS(s), F = (size_t)s->OC;
    float *x = selftest_rnd(r, N * 2 * F, 2, 0), *d = selftest_rnd(r, N * F, 1, 0);
    float *y = selftest_dev(r, N * F * 4),
          *dx = selftest_rnd(r, N * 2 * F, 1, 0); /* dx: overwritten */
    if (r->broken) return;
    r->o->swiglu_forward(r->ctx, y, x, (int)N, (int)F);
    selftest_out(r, "out", y, N * F);
    r->o->swiglu_backward(r->ctx, dx, x, d, (int)N, (int)F);
    selftest_out(r, "dinp", dx, N * 2 * F);
}

/* ---- a mixture of experts' routing (model.moe): N = B·T tokens; every integer the
 * CPU's, every float within the case's tolerance ---- */

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
    *before = s->runs > 1 ? selftest_upload_ints(r, b, (size_t)s->runs * s->E) : (free(b), NULL);
    return selftest_upload_ints(r, h, N * s->k);
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
void selftest_moe_route(struct run *r)
{
    const struct shape *s = r->s;
    size_t N = N_ROWS(s), NE = N * s->E, Nk = N * s->k;
    float *logits = selftest_rnd(r, NE, 2, 0), *probs = selftest_dev(r, NE * 4),
          *gate = selftest_dev(r, Nk * 4);
    float *lse = selftest_dev(r, N * 4);
    int32_t *choice = selftest_dev(r, Nk * 4);
    if (r->broken) return;
    r->o->moe_route(r->ctx, probs, choice, gate, lse, logits, (int)N, s->E, s->k);
    selftest_out(r, "probs", probs, NE);
    selftest_out_ints(r, "choice", choice, Nk);
    selftest_out(r, "gate", gate, Nk);
    selftest_out(r, "lse", lse, N);
}

/* the dispatch: each choice's packed row or -1, each row's token, the counts, M */
void selftest_moe_dispatch(struct run *r)
{
    const struct shape *s = r->s;
    size_t Nk = N_ROWS(s) * s->k;
    int32_t *pos = selftest_dev(r, Nk * 4), *rows = selftest_dev(r, Nk * 4),
            *counts = selftest_dev(r, 2 * (size_t)s->E * 4);
    int M = 0;
    moe_dispatch_of(r, pos, rows, counts, &M);
    double kept = M;
    selftest_out_ints(r, "pos", pos, Nk);
    selftest_out_ints(r, "rows", rows, Nk); /* past M: the zeroed buffer on both */
    selftest_out_ints(r, "counts", counts, (size_t)s->E);
    selftest_out_ints(r, "routed", counts + s->E, (size_t)s->E);
    selftest_out_host(r, "kept", &kept, 1, true);
}

/* the rows to the experts and back: gather, combine (onto what out held), the
 * combine's backward, the gather's (accumulating) */
void selftest_moe_rows(struct run *r)
{
    const struct shape *s = r->s;
    size_t N = N_ROWS(s), Nk = N * s->k, C = (size_t)s->C;
    int32_t *pos = selftest_dev(r, Nk * 4), *rows = selftest_dev(r, Nk * 4),
            *counts = selftest_dev(r, 2 * (size_t)s->E * 4);
    float *x = selftest_rnd(r, N * C, 1, 0), *y = selftest_rnd(r, Nk * C, 1, 0),
          *gate = selftest_rnd(r, Nk, 1, 0);
    float *dout = selftest_rnd(r, N * C, 1, 0), *o = selftest_rnd(r, N * C, 1, 0),
          *dx = selftest_rnd(r, N * C, 1, 0);
    float *packed = selftest_dev(r, Nk * C * 4), *dy = selftest_dev(r, Nk * C * 4),
          *dgate = selftest_dev(r, Nk * 4);
    int M = 0;
    moe_dispatch_of(r, pos, rows, counts, &M);
    if (r->broken) return;
    const struct ops *x_ = r->o;
    int n = (int)N, k = s->k;
    x_->moe_gather(r->ctx, packed, x, rows, M, s->C);
    selftest_out(r, "packed", packed, Nk * C);
    x_->moe_combine(r->ctx, o, y, gate, pos, n, k, s->C, true);
    selftest_out(r, "combine", o, N * C);
    x_->moe_combine_backward(r->ctx, dy, dgate, dout, y, gate, pos, n, k, s->C);
    selftest_out(r, "dy", dy, Nk * C);
    selftest_out(r, "dgate", dgate, Nk);
    x_->moe_gather_backward(r->ctx, dx, dy, pos, n, k, s->C, true);
    selftest_out(r, "dx", dx, N * C);
}

/* the router's backward, with the gates' gradients and without, and the losses (on
 * the host), from the backend's own route of random logits */
void selftest_moe_route_backward(struct run *r)
{
    const struct shape *s = r->s;
    size_t N = N_ROWS(s), NE = N * s->E, Nk = N * s->k;
    float *logits = selftest_rnd(r, NE, 2, 0), *probs = selftest_dev(r, NE * 4),
          *gate = selftest_dev(r, Nk * 4);
    float *lse = selftest_dev(r, N * 4), *dgate = selftest_rnd(r, Nk, 1, 0),
          *dl = selftest_dev(r, NE * 4);
    float *dl_losses = selftest_dev(r, NE * 4);
    int32_t *choice = selftest_dev(r, Nk * 4), *routed = malloc((size_t)s->E * sizeof *routed);
    for (int e = 0; routed && e < s->E; e++) routed[e] = (int32_t)rng_below(&r->rng, Nk + 1);
    int32_t *routed_d = selftest_upload_ints(r, routed, (size_t)s->E);
    if (r->broken) return;
    int n = (int)N, E = s->E, k = s->k;
    r->o->moe_route(r->ctx, probs, choice, gate, lse, logits, n, E, k);
    r->o->moe_route_backward(r->ctx, dl, dgate, probs, choice, gate, lse, routed_d, n, E, k, 0.5f,
                             0.25f);
    selftest_out(r, "dlogits", dl, NE);
    r->o->moe_route_backward(r->ctx, dl_losses, NULL, probs, choice, gate, lse, routed_d, n, E, k,
                             0.5f, 0.25f);
    selftest_out(r, "dlogits losses", dl_losses, NE);
    double losses[2];
    r->o->moe_losses(r->ctx, losses, probs, lse, routed_d, n, E, k, 0.01, 0.001);
    selftest_out_host(r, "balance loss", &losses[0], 1, false);
    selftest_out_host(r, "z-loss", &losses[1], 1, false);
}
