/* selftest_cases.h — what the self-test's harness (selftest.c) and its cases
 * (selftest_gpt2.c, selftest_attention.c, selftest_llama_moe.c, selftest_fused.c,
 * selftest_act16.c) share: a shape, one run of an op on one backend and what makes
 * its inputs and keeps its outputs, and each case. selftest.h is the self-test's
 * interface. */
#ifndef PLAIT_RUNTIME_SELFTEST_CASES_H
#define PLAIT_RUNTIME_SELFTEST_CASES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/rng.h"
#include "kernels/ops.h"

/* B batch, T time, C channels, NH heads, V vocab, Vp padded vocab, OC a
 * product's output width; a mixture of experts' routing (E > 0): E experts, k
 * choices a token, capacity (0: none) and the runs its tokens are cut into */
struct shape {
    int B, T, C, NH, V, Vp, OC;
    int E, k, capacity, runs;
    int NKV; /* key/value heads, the fused rotary case's (its own shapes) */
};

enum { MAX_OUTS = 12, MAX_HELD = 32 };

/* One run of one op on one backend: its device buffers and its outputs,
 * downloaded to the host. */
struct run {
    const struct ops *o;
    struct ops_ctx *ctx; /* o's */
    const struct shape *s;
    /* the CPU's run, which the others are compared with: where a case's op is defined by a
     * contract over other ops (selftest_act16.c's: the namesake, then to_bf16), the
     * reference computes the contract */
    bool reference;
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
    bool out_act16[MAX_OUTS]; /* a bf16 activation: compared in bf16 ulps (selftest.c) */
};

#define N_ROWS(s) ((size_t)(s)->B * (s)->T)

/* A run's device memory, random inputs and outputs (selftest.c). */
void *selftest_dev(struct run *r, size_t bytes);
float *selftest_rnd(struct run *r, size_t n, float scale, float shift);
int32_t *selftest_upload_ints(struct run *r, int32_t *host, size_t n);
int32_t *selftest_tokens(struct run *r, size_t n, int below);
void selftest_out(struct run *r, const char *name, const void *d, size_t n);
void selftest_out_host(struct run *r, const char *name, const double *v, size_t n, bool exact);
void selftest_out_ints(struct run *r, const char *name, const int32_t *d, size_t n);
void selftest_out_fp32(struct run *r, const char *name, const void *d, size_t n);
void selftest_out16(struct run *r, const char *name, const uint16_t *d, size_t n);
void selftest_out_act16(struct run *r, const char *name, const uint16_t *d, size_t n);
void selftest_out8(struct run *r, const char *name, const uint8_t *d, size_t n);

/* The cases: each makes its inputs, runs the op(s), keeps the outputs. */
void selftest_attention(struct run *r);
void selftest_attention_bf16(struct run *r);
void selftest_attention_block(struct run *r);
void selftest_attention_fused(struct run *r);
void selftest_classifier(struct run *r);
void selftest_classifier16(struct run *r);
void selftest_classifier_bad_target(struct run *r);
void selftest_classifier_finish16(struct run *r);
void selftest_classifier_parts(struct run *r);
void selftest_elementwise(struct run *r);
void selftest_encoder_backward(struct run *r);
void selftest_encoder_forward(struct run *r);
void selftest_gelu_epilogue_bf16(struct run *r);
void selftest_gelu_epilogue_f32(struct run *r);
void selftest_gelu16(struct run *r);
void selftest_kv_expand(struct run *r);
void selftest_layernorm(struct run *r);
void selftest_layernorm16(struct run *r);
void selftest_matmul_backward_bf16(struct run *r);
void selftest_matmul_backward_dout16(struct run *r);
void selftest_matmul_backward16(struct run *r);
void selftest_matmul_backward_f32(struct run *r);
void selftest_matmul_backward_fp8_block(struct run *r);
void selftest_matmul_backward_fp8_tensor(struct run *r);
void selftest_matmul_forward_bf16(struct run *r);
void selftest_matmul_forward16(struct run *r);
void selftest_matmul_forward_f32(struct run *r);
void selftest_matmul_forward_fp8_block(struct run *r);
void selftest_matmul_forward_fp8_tensor(struct run *r);
void selftest_matmul_gelu_bf16(struct run *r);
void selftest_matmul_gelu_f32(struct run *r);
void selftest_matmul_gelu16(struct run *r);
void selftest_moe_dispatch(struct run *r);
void selftest_moe_route(struct run *r);
void selftest_moe_route_backward(struct run *r);
void selftest_moe_rows(struct run *r);
void selftest_optimizer(struct run *r);
void selftest_adamw_multi(struct run *r);
void selftest_sum_squares_many(struct run *r);
void selftest_quantize_e4m3(struct run *r);
void selftest_quantize_e5m2(struct run *r);
void selftest_residual_layernorm(struct run *r);
void selftest_residual_layernorm16(struct run *r);
void selftest_residual_rmsnorm(struct run *r);
void selftest_residual_rmsnorm16(struct run *r);
void selftest_rmsnorm(struct run *r);
void selftest_rmsnorm16(struct run *r);
void selftest_rope(struct run *r);
void selftest_rope_kv_expand(struct run *r);
void selftest_swiglu(struct run *r);
void selftest_swiglu16(struct run *r);

#endif
