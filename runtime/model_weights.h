/* model_weights.h — a layer's weights as the passes take them (model_weights.c),
 * for the model's files alone (model.c, model_tp.c, model_forward.c,
 * model_zero3_pass.c, model_backward.c); model.h is the model's interface. */
#ifndef PLAIT_RUNTIME_MODEL_WEIGHTS_H
#define PLAIT_RUNTIME_MODEL_WEIGHTS_H

#include <stdbool.h>

#include "runtime/model.h"

/* The four product weights of a layer, in the order of the fp8 copy; where each
 * matrix of a layer block starts in the copy and its scales; matrix k of layer l,
 * read at w, quantised into its fp8 copy. */
extern const enum gpt2_tensor model_fp8_weights[4];
void model_fp8_layout(struct model *m);
void model_quantize_weight(struct model *m, int k, int l, const float *w);

enum view { PARAMS, GRADS };

/* Tensor t of layer l: its weights or gradient (param), the bf16 copy of its
 * weights or NULL (model_weight16), NULL where the shard holds none (held). */
float *model_param(const struct model *m, enum view v, enum gpt2_tensor t, int l);
const uint16_t *model_weight16(const struct model *m, enum gpt2_tensor t, int l);
float *model_held(const struct model *m, enum view v, enum gpt2_tensor t, int l);

#define P(t, l) model_param(m, PARAMS, t, l)
#define G(t, l) model_param(m, GRADS, t, l)

/* The block's norm over R rows (LayerNorm or RMSNorm) into an fp32 or bf16 activation, and
 * its backward; a product of weight w (its bf16 copy w16, or NULL in fp32) on an fp32 or
 * bf16 input (ops.h's matmul_forward or matmul_forward16) and its backward; a block's
 * product in the run's precision (fp8's input is fp32) and its backward. */
void model_norm_forward(const struct model *m, struct act out, float *mean, float *rstd,
                        const float *in, enum gpt2_tensor w, enum gpt2_tensor b, int l, int R);
void model_norm_backward(const struct model *m, float *dinp, const float *dout, const float *in,
                         enum gpt2_tensor w, enum gpt2_tensor b, int l, const float *mean,
                         const float *rstd, int R, bool acc);
void model_product_forward(const struct model *m, float *out, struct act inp, const float *w,
                           const uint16_t *w16, const float *bias, int N, int C, int OC);
void model_product_backward(const struct model *m, float *dinp, float *dw, float *dbias,
                            const float *dout, struct act inp, const float *w, const uint16_t *w16,
                            int N, int C, int OC, bool accumulate);
void model_linear_forward(const struct model *m, float *out, struct act inp, enum gpt2_tensor t,
                          int l, const float *bias, int N, int C, int OC);
void model_linear_backward(const struct model *m, float *dinp, float *dw, float *dbias,
                           const float *dout, struct act inp, enum gpt2_tensor t, int l, int N,
                           int C, int OC, bool accumulate);

#endif
