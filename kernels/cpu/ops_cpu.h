/* ops_cpu.h — the CPU kernels by name, in float (what ops_cpu() runs) and in
 * double (the same source compiled for double, which the finite-difference
 * tests check). Semantics and shapes are those of kernels/ops.h; each takes
 * a CPU context (ops_cpu()->open) first, as the table's ops do. */
#ifndef PLAIT_KERNELS_CPU_OPS_CPU_H
#define PLAIT_KERNELS_CPU_OPS_CPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ops_ctx; /* kernels/ops.h: ops_cpu()->open makes one */

#define OPS_CPU_DECLARE(real, SFX)                                                                 \
    void cpu_encoder_forward##SFX(struct ops_ctx *ctx, real *out, const int32_t *tokens,           \
                                  const real *wte, int v0, int nv, const real *wpe, int B, int T,  \
                                  int C);                                                          \
    void cpu_encoder_backward##SFX(struct ops_ctx *ctx, real *dwte, int v0, int nv, real *dwpe,    \
                                   const real *dout, const int32_t *tokens, int B, int T, int C,   \
                                   bool accumulate);                                               \
    void cpu_add_bias##SFX(struct ops_ctx *ctx, real *out, const real *bias, int N, int C);        \
    void cpu_layernorm_forward##SFX(struct ops_ctx *ctx, real *out, real *mean, real *rstd,        \
                                    const real *inp, const real *w, const real *b, int N, int C);  \
    void cpu_layernorm_backward##SFX(                                                              \
        struct ops_ctx *ctx, real *dinp, real *dw, real *db, const real *dout, const real *inp,    \
        const real *w, const real *mean, const real *rstd, int N, int C, bool accumulate);         \
    void cpu_matmul_forward##SFX(struct ops_ctx *ctx, real *out, const real *inp, const real *w,   \
                                 const real *bias, int N, int C, int OC);                          \
    void cpu_matmul_backward##SFX(struct ops_ctx *ctx, real *dinp, real *dw, real *dbias,          \
                                  const real *dout, const real *inp, const real *w, int N, int C,  \
                                  int OC, bool accumulate);                                        \
    void cpu_attention_forward##SFX(struct ops_ctx *ctx, real *out, real *att, const real *qkv,    \
                                    int B, int T, int C, int NH);                                  \
    void cpu_attention_backward##SFX(struct ops_ctx *ctx, real *dqkv, real *datt,                  \
                                     const real *dout, const real *qkv, const real *att, int B,    \
                                     int T, int C, int NH);                                        \
    void cpu_gelu_forward##SFX(struct ops_ctx *ctx, real *out, const real *inp, size_t n);         \
    void cpu_gelu_backward##SFX(struct ops_ctx *ctx, real *dinp, const real *inp,                  \
                                const real *dout, size_t n);                                       \
    void cpu_residual_forward##SFX(struct ops_ctx *ctx, real *out, const real *a, const real *b,   \
                                   size_t n);                                                      \
    void cpu_classifier##SFX(struct ops_ctx *ctx, real *logits, real *losses,                      \
                             const int32_t *targets, int N, int V, int Vp, real grad_scale);       \
    void cpu_classifier_max##SFX(struct ops_ctx *ctx, const real *logits, real *row_max, int N,    \
                                 int nv, int Vp);                                                  \
    void cpu_classifier_sumexp##SFX(struct ops_ctx *ctx, const real *logits, const real *row_max,  \
                                    const int32_t *targets, int v0, int nv, int Vp, real *row_sum, \
                                    real *target_logit, int N);                                    \
    void cpu_classifier_finish##SFX(struct ops_ctx *ctx, real *logits, real *losses,               \
                                    const int32_t *targets, const real *row_max,                   \
                                    const real *row_sum, const real *target_logit, int v0, int nv, \
                                    int Vp, int N, real grad_scale);                               \
    double cpu_sum_squares##SFX(struct ops_ctx *ctx, const real *x, size_t n);                     \
    void cpu_rmsnorm_forward##SFX(struct ops_ctx *ctx, real *out, real *rstd, const real *inp,     \
                                  const real *w, int N, int C, real eps);                          \
    void cpu_rmsnorm_backward##SFX(struct ops_ctx *ctx, real *dinp, real *dw, const real *dout,    \
                                   const real *inp, const real *w, const real *rstd, int N, int C, \
                                   bool accumulate);                                               \
    void cpu_rope_forward##SFX(struct ops_ctx *ctx, real *x, int B, int T, int NH, int NKV,        \
                               int hs, double theta, int pos0);                                    \
    void cpu_rope_backward##SFX(struct ops_ctx *ctx, real *dx, int B, int T, int NH, int NKV,      \
                                int hs, double theta, int pos0);                                   \
    void cpu_kv_expand##SFX(struct ops_ctx *ctx, real *out, const real *packed, int N, int NH,     \
                            int NKV, int hs);                                                      \
    void cpu_kv_expand_backward##SFX(struct ops_ctx *ctx, real *dpacked, const real *dout, int N,  \
                                     int NH, int NKV, int hs);                                     \
    void cpu_swiglu_forward##SFX(struct ops_ctx *ctx, real *out, const real *inp, int N, int F);   \
    void cpu_swiglu_backward##SFX(struct ops_ctx *ctx, real *dinp, const real *inp,                \
                                  const real *dout, int N, int F);                                 \
    void cpu_attention_block_forward##SFX(struct ops_ctx *ctx, real *out, real *lse,               \
                                          real *scratch, const real *q, int ldq, const real *kv,   \
                                          const int32_t *qpos, const int32_t *kpos, int B, int Tq, \
                                          int Tk, int C, int NH, bool first);                      \
    void cpu_attention_block_backward##SFX(                                                        \
        struct ops_ctx *ctx, real *dq, real *dkv, real *scratch, const real *dout, const real *q,  \
        int ldq, const real *kv, const real *out, const real *lse, const int32_t *qpos,            \
        const int32_t *kpos, int B, int Tq, int Tk, int C, int NH);                                \
    void cpu_moe_route##SFX(struct ops_ctx *ctx, real *probs, int32_t *choice, real *gate,         \
                            real *lse, const real *logits, int N, int E, int k);                   \
    void cpu_moe_gather##SFX(struct ops_ctx *ctx, real *packed, const real *x,                     \
                             const int32_t *rows, int M, int C);                                   \
    void cpu_moe_gather_backward##SFX(struct ops_ctx *ctx, real *dx, const real *dpacked,          \
                                      const int32_t *pos, int N, int k, int C, bool accumulate);   \
    void cpu_moe_combine##SFX(struct ops_ctx *ctx, real *out, const real *y, const real *gate,     \
                              const int32_t *pos, int N, int k, int C, bool accumulate);           \
    void cpu_moe_combine_backward##SFX(struct ops_ctx *ctx, real *dy, real *dgate,                 \
                                       const real *dout, const real *y, const real *gate,          \
                                       const int32_t *pos, int N, int k, int C);                   \
    void cpu_moe_route_backward##SFX(struct ops_ctx *ctx, real *dlogits, const real *dgate,        \
                                     const real *probs, const int32_t *choice, const real *gate,   \
                                     const real *lse, const int32_t *routed, int N, int E, int k,  \
                                     real aux, real z);                                            \
    void cpu_moe_losses##SFX(struct ops_ctx *ctx, double *out, const real *probs, const real *lse, \
                             const int32_t *routed, int N, int E, int k, double aux, double z);

OPS_CPU_DECLARE(float, _f32)
OPS_CPU_DECLARE(double, _f64)

/* kernels/ops.h's moe_dispatch: integers only, one for both precisions. */
int cpu_moe_dispatch(struct ops_ctx *ctx, int32_t *pos, int32_t *rows, int32_t *counts,
                     int32_t *routed, const int32_t *choice, const int32_t *before, int ranges,
                     int N, int E, int k, int capacity);

/* Records an error in ctx (the first one wins until ops->take_error). */
void cpu_set_error(struct ops_ctx *ctx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
