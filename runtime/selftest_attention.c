/* selftest_attention.c — the self-test's cases of attention: the plain and
 * fused kernels, context parallelism's block attention, and the bf16 tensor
 * cores'. The harness is selftest.c's. */
#include "runtime/selftest_cases.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/bf16.h"      // defines: bf16_round
#include "kernels/cuda/cuda_ops.h" // defines: ops_cuda_attention_fused_forward
#include "kernels/ops.h"

void selftest_attention(struct run *r)
{
    const struct shape *s = r->s;
    size_t N = N_ROWS(s), att_n = (size_t)s->B * s->NH * s->T * s->T;
    float *qkv = selftest_rnd(r, N * 3 * s->C, 1, 0), *dout = selftest_rnd(r, N * s->C, 1, 0);
    float *o = selftest_dev(r, N * s->C * 4), *att = selftest_dev(r, att_n * 4),
          *datt = selftest_dev(r, att_n * 4);
    float *dqkv = selftest_dev(r, N * 3 * s->C * 4);
    if (r->broken) return;
    r->o->attention_forward(r->ctx, o, att, qkv, s->B, s->T, s->C, s->NH);
    selftest_out(r, "out", o, N * s->C);
    selftest_out(r, "att", att, att_n);
    r->o->attention_backward(r->ctx, dqkv, datt, dout, qkv, att, s->B, s->T, s->C, s->NH);
    selftest_out(r, "dqkv", dqkv, N * 3 * s->C);
}

/* the fused attention (kernels/cuda/attention_fused.cu, not in ops.h yet) on
 * the GPU against the CPU's ops.h attention: the same out and dqkv */
void selftest_attention_fused(struct run *r)
{
    const struct shape *s = r->s;
    bool fused = strcmp(r->o->name, "cuda") == 0;
    size_t N = N_ROWS(s), att_n = (size_t)s->B * s->NH * s->T * s->T;
    float *qkv = selftest_rnd(r, N * 3 * s->C, 1, 0), *dout = selftest_rnd(r, N * s->C, 1, 0);
    float *o = selftest_dev(r, N * s->C * 4), *dqkv = selftest_dev(r, N * 3 * s->C * 4);
    float *att = fused ? NULL : selftest_dev(r, att_n * 4),
          *datt = fused ? NULL : selftest_dev(r, att_n * 4);
    float *lse = fused ? selftest_dev(r, (size_t)s->B * s->NH * s->T * 4) : NULL;
    if (r->broken) return;
    if (fused) {
        ops_cuda_attention_fused_forward(r->ctx, o, lse, qkv, s->B, s->T, s->C, s->NH);
        ops_cuda_attention_fused_backward(r->ctx, dqkv, dout, qkv, o, lse, s->B, s->T, s->C, s->NH);
    } else {
        r->o->attention_forward(r->ctx, o, att, qkv, s->B, s->T, s->C, s->NH);
        r->o->attention_backward(r->ctx, dqkv, datt, dout, qkv, att, s->B, s->T, s->C, s->NH);
    }
    selftest_out(r, "out", o, N * s->C);
    selftest_out(r, "dqkv", dqkv, N * 3 * s->C);
}

/* n positions a·i + c, uploaded */
static int32_t *positions(struct run *r, size_t n, int a, int c)
{
    int32_t *h = malloc(n * sizeof *h);
    for (size_t i = 0; h && i < n; i++) h[i] = (int32_t)(a * (int)i + c);
    return selftest_upload_ints(r, h, n);
}

/* Context parallelism's block attention (the ring's; kernels/cuda/attention_block.cu
 * on the GPU): T query rows at odd positions (q inside a qkv buffer, as the ring
 * reads it) against two blocks of T keys, at even and at odd positions, merged one
 * after the other (the first written, the second merged through the log-sum-exp);
 * then both blocks' backward added into dq and each block's dkv. */
void selftest_attention_block(struct run *r)
{
    const struct shape *s = r->s;
    size_t N = N_ROWS(s), kv_n = N * 2 * s->C, rows = (size_t)s->B * s->NH * s->T;
    int hs = s->C / s->NH;
    float *qkv = selftest_rnd(r, N * 3 * s->C, 1, 0), *dout = selftest_rnd(r, N * s->C, 1, 0);
    float *kv1 = selftest_rnd(r, kv_n, 1, 0), *kv2 = selftest_rnd(r, kv_n, 1, 0);
    float *o = selftest_dev(r, N * s->C * 4), *lse = selftest_dev(r, rows * 4),
          *dqkv = selftest_dev(r, N * 3 * s->C * 4);
    float *dkv1 = selftest_dev(r, kv_n * 4), *dkv2 = selftest_dev(r, kv_n * 4);
    float *scratch = selftest_dev(r, ATTENTION_BLOCK_SCRATCH(s->B, s->NH, s->T, s->T, hs) * 4);
    int32_t *qpos = positions(r, (size_t)s->T, 2, 1), *even = positions(r, (size_t)s->T, 2, 0);
    int32_t *odd = positions(r, (size_t)s->T, 2, 1);
    if (r->broken) return;
    const struct ops *x = r->o;
    int B = s->B, T = s->T, C = s->C, NH = s->NH;
    x->attention_block_forward(r->ctx, o, lse, scratch, qkv, 3 * C, kv1, qpos, even, B, T, T, C,
                               NH, true);
    x->attention_block_forward(r->ctx, o, lse, scratch, qkv, 3 * C, kv2, qpos, odd, B, T, T, C, NH,
                               false);
    selftest_out(r, "out", o, N * C);
    selftest_out(r, "lse", lse, rows);
    x->zero(r->ctx, dqkv, N * 3 * C * 4);
    x->zero(r->ctx, dkv1, kv_n * 4);
    x->zero(r->ctx, dkv2, kv_n * 4);
    x->attention_block_backward(r->ctx, dqkv, dkv1, scratch, dout, qkv, 3 * C, kv1, o, lse, qpos,
                                even, B, T, T, C, NH);
    x->attention_block_backward(r->ctx, dqkv, dkv2, scratch, dout, qkv, 3 * C, kv2, o, lse, qpos,
                                odd, B, T, T, C, NH);
    selftest_out(r, "dq", dqkv, N * 3 * C);
    selftest_out(r, "dkv", dkv1, kv_n);
    selftest_out(r, "dkv 2", dkv2, kv_n);
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
void selftest_attention_bf16(struct run *r)
{
    const struct shape *s = r->s;
    bool tc = r->o->attention_forward_bf16 != NULL;
    size_t N = N_ROWS(s), att_n = (size_t)s->B * s->NH * s->T * s->T;
    float *qkv = selftest_rnd(r, N * 3 * s->C, 1, 0), *dout = selftest_rnd(r, N * s->C, 1, 0);
    float *o = selftest_dev(r, N * s->C * 4), *dqkv = selftest_dev(r, N * 3 * s->C * 4);
    float *att = tc ? NULL : selftest_dev(r, att_n * 4),
          *datt = tc ? NULL : selftest_dev(r, att_n * 4);
    float *lse = tc ? selftest_dev(r, (size_t)s->B * s->NH * s->T * 4) : NULL;
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
    selftest_out(r, "out", o, N * s->C);
    selftest_out(r, "dqkv", dqkv, N * 3 * s->C);
}
