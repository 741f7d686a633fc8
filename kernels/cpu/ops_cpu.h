/* ops_cpu.h — the CPU kernels by name, in float (what ops_cpu() runs) and in
 * double (the same source compiled for double, which the finite-difference
 * tests check). Semantics and shapes are those of kernels/ops.h. */
#ifndef PLAIT_KERNELS_CPU_OPS_CPU_H
#define PLAIT_KERNELS_CPU_OPS_CPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define OPS_CPU_DECLARE(real, SFX)                                                                 \
    void cpu_encoder_forward##SFX(real *out, const int32_t *tokens, const real *wte, int v0,       \
                                  int nv, const real *wpe, int B, int T, int C);                   \
    void cpu_encoder_backward##SFX(real *dwte, int v0, int nv, real *dwpe, const real *dout,       \
                                   const int32_t *tokens, int B, int T, int C, bool accumulate);   \
    void cpu_add_bias##SFX(real *out, const real *bias, int N, int C);                             \
    void cpu_layernorm_forward##SFX(real *out, real *mean, real *rstd, const real *inp,            \
                                    const real *w, const real *b, int N, int C);                   \
    void cpu_layernorm_backward##SFX(real *dinp, real *dw, real *db, const real *dout,             \
                                     const real *inp, const real *w, const real *mean,             \
                                     const real *rstd, int N, int C, bool accumulate);             \
    void cpu_matmul_forward##SFX(real *out, const real *inp, const real *w, const real *bias,      \
                                 int N, int C, int OC);                                            \
    void cpu_matmul_backward##SFX(real *dinp, real *dw, real *dbias, const real *dout,             \
                                  const real *inp, const real *w, int N, int C, int OC,            \
                                  bool accumulate);                                                \
    void cpu_attention_forward##SFX(real *out, real *att, const real *qkv, int B, int T, int C,    \
                                    int NH);                                                       \
    void cpu_attention_backward##SFX(real *dqkv, real *datt, const real *dout, const real *qkv,    \
                                     const real *att, int B, int T, int C, int NH);                \
    void cpu_gelu_forward##SFX(real *out, const real *inp, size_t n);                              \
    void cpu_gelu_backward##SFX(real *dinp, const real *inp, const real *dout, size_t n);          \
    void cpu_residual_forward##SFX(real *out, const real *a, const real *b, size_t n);             \
    void cpu_classifier##SFX(real *logits, real *losses, const int32_t *targets, int N, int V,     \
                             int Vp, real grad_scale);                                             \
    void cpu_classifier_max##SFX(const real *logits, real *row_max, int N, int nv, int Vp);        \
    void cpu_classifier_sumexp##SFX(const real *logits, const real *row_max,                       \
                                    const int32_t *targets, int v0, int nv, int Vp, real *row_sum, \
                                    real *target_logit, int N);                                    \
    void cpu_classifier_finish##SFX(real *logits, real *losses, const int32_t *targets,            \
                                    const real *row_max, const real *row_sum,                      \
                                    const real *target_logit, int v0, int nv, int Vp, int N,       \
                                    real grad_scale);                                              \
    double cpu_sum_squares##SFX(const real *x, size_t n);

OPS_CPU_DECLARE(float, _f32)
OPS_CPU_DECLARE(double, _f64)

/* The first error recorded by a CPU kernel since the last call (sticky, like
 * CUDA's): 0 if none, else -1 with the message copied into buf. */
int cpu_take_error(char *buf, size_t bytes);

/* Records an error (the first one wins). */
void cpu_set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
