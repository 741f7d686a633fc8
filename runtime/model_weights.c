/* model_weights.c — a layer's weights as the passes take them: each tensor's
 * weights or gradient (in its ZeRO 3 window), its bf16 copy, the fp8 copy of the
 * four product weights and its scales, and the norms and products in the run's
 * precision. Not the collectives around them (model_tp.c) nor the layer built
 * from them (model_forward.c, model_backward.c). */
#include "runtime/model_weights.h"

#include <stdint.h>
#include <stdlib.h>

#include "common/log.h"
#include "runtime/model_zero3.h"
#include "runtime/zero3.h"

/* ---- the fp8 weight copy ------------------------------------------------------ */

/* The four product weights of a layer, in the order of the fp8 copy. */
const enum gpt2_tensor model_fp8_weights[4] = {GPT2_QKVW, GPT2_ATTPROJW, GPT2_FCW, GPT2_FCPROJW};
_Static_assert(GPT2_FP8_BLOCK == FP8_TILE, "gpt2_memory counts the blocks kernels/fp8.h scales");

/* (OC, C) of product weight k on this rank, as its product takes it:
 * (3C/tp, C) column shard, (C, C/tp) row shard, (4C/tp, C), (C, 4C/tp)
 * (a Llama's: (QKV/tp, C), (C, C/tp), (2F/tp, C), (C, F/tp)). */
static void fp8_shape(const struct model *m, int k, int *OC, int *C)
{
    int Cw = m->cfg.hidden, Cl = m->Cl;
    const int shape[4][2] = {{m->QKVl, Cw}, {Cw, Cl}, {m->FCl, Cw}, {Cw, m->Fl}};
    *OC = shape[k][0];
    *C = shape[k][1];
}

/* Where each matrix of a layer block starts in the copy and its scales. */
void model_fp8_layout(struct model *m)
{
    int e = fp8_weight_tile(m->fp8_scaling);
    m->fp8_layer_elems = m->fp8_layer_scales = 0;
    for (int k = 0; k < 4; k++) {
        int OC, C;
        fp8_shape(m, k, &OC, &C);
        m->fp8_at[k] = m->fp8_layer_elems;
        m->fp8_scale_at[k] = m->fp8_layer_scales;
        m->fp8_layer_elems += (size_t)OC * (size_t)C;
        m->fp8_layer_scales += fp8_scale_count(OC, C, e, e);
    }
}

/* The index of weight t (one of them) in model_fp8_weights. */
static int fp8_index(enum gpt2_tensor t)
{
    int k = 0;
    while (k < 3 && model_fp8_weights[k] != t) k++;
    return k;
}

/* The fp8 copy of weight t (one of model_fp8_weights) of layer l, and its scales:
 * its layer's block of the copy, or with ZeRO 3 the block of the window the
 * layer is gathered in (z3_block8). */
static uint8_t *weight8(const struct model *m, enum gpt2_tensor t, int l, float **scales)
{
    size_t off = gpt2_shard_offset(&m->shard, t, l);
    size_t block = (size_t)gpt2_shard_block(&m->shard, l);
    if (m->z3) {
        int i = mz3_window_index(m, off);
        if (i < 0 || m->z3_block8[i] < 0) {
            log_error("ZeRO 3: the fp8 copy of %s (layer %d) used outside a layer's window (a bug)",
                      gpt2_tensor_names[t], l);
            abort();
        }
        block = (size_t)m->z3_block8[i];
    }
    int k = fp8_index(t);
    *scales = m->scales8 + block * m->fp8_layer_scales + m->fp8_scale_at[k];
    return m->params8 + block * m->fp8_layer_elems + m->fp8_at[k];
}

/* Quantises weight matrix k of layer l, read at w, into its fp8 copy. */
void model_quantize_weight(struct model *m, int k, int l, const float *w)
{
    int OC, C, e = fp8_weight_tile(m->fp8_scaling);
    float *scales;
    fp8_shape(m, k, &OC, &C);
    uint8_t *q = weight8(m, model_fp8_weights[k], l, &scales);
    m->ops->quantize_fp8(m->ctx, q, scales, w, OC, C, e, e, FP8_E4M3);
}

void model_refresh_fp8(struct model *m)
{
    if (m->z3) return; /* each layer window quantises what it gathers */
    for (int i = 0; m->params8 && i < gpt2_shard_layers(&m->shard); i++) {
        int l = gpt2_shard_layer(&m->shard, i);
        for (int k = 0; k < 4; k++) /* (an MoE block's MLP is its experts', not in fp8) */
            if (gpt2_shard_has(&m->shard, model_fp8_weights[k], l))
                model_quantize_weight(
                    m, k, l, m->params + gpt2_shard_offset(&m->shard, model_fp8_weights[k], l));
    }
}

/* ---- parameter views -------------------------------------------------------- */

/* Tensor t of layer l (l = 0 for tensors that are not per layer): its
 * weights or its gradient. With ZeRO 3, in the window its unit was gathered
 * (or its gradient window taken) into: a pass that uses a unit it did not
 * gather is a bug, stopped here. */
float *model_param(const struct model *m, enum view v, enum gpt2_tensor t, int l)
{
    size_t off = gpt2_shard_offset(&m->shard, t, l);
    if (!m->z3) return (v == GRADS ? m->grads : m->params) + off;
    float *p = zero3_at(v == GRADS ? m->z3g : m->z3, off);
    if (!p) {
        log_error("ZeRO 3: the %s of %s (layer %d) used outside its unit's window (a bug)",
                  v == GRADS ? "gradient" : "weights", gpt2_tensor_names[t], l);
        abort();
    }
    return p;
}

/* The bf16 copy of weight matrix t of layer l: every one's in bf16, the LM
 * head's wte in fp8 (wte16); else NULL (fp32). */
const uint16_t *model_weight16(const struct model *m, enum gpt2_tensor t, int l)
{
    size_t off = gpt2_shard_offset(&m->shard, t, l);
    if (m->z3 && m->precision == PLAN_PRECISION_BF16) return mz3_at16(m, off);
    if (m->z3) return m->wte16 && t == m->head && m->last ? m->wte16 : NULL; /* fp8's head */
    return model_copy16(m, t, off, off);
}

float *model_tensor(const struct model *m, bool grads, enum gpt2_tensor t, int l)
{
    return model_param(m, grads ? GRADS : PARAMS, t, l);
}

const uint16_t *model_tensor16(const struct model *m, enum gpt2_tensor t, int l)
{
    return model_weight16(m, t, l);
}

/* A tensor the architecture may not have (a Llama's biases, GPT-2's wpe on
 * tp ranks but 0): its parameters or gradient, NULL when the shard holds none. */
float *model_held(const struct model *m, enum view v, enum gpt2_tensor t, int l)
{
    return gpt2_shard_holds(&m->shard, t) ? model_param(m, v, t, l) : NULL;
}

/* The block's norm over R rows into out (fp32 or bf16): GPT-2's LayerNorm (mean and rstd
 * kept), a Llama's RMSNorm (rstd kept); weight w and bias b of layer l. */
void model_norm_forward(const struct model *m, struct act out, float *mean, float *rstd,
                        const float *in, enum gpt2_tensor w, enum gpt2_tensor b, int l, int R)
{
    const struct ops *o = m->ops;
    int C = m->cfg.hidden;
    float eps = m->cfg.norm_eps;
    if (m->cfg.llama && out.bf16)
        o->rmsnorm_forward16(m->ctx, out.bf16, rstd, in, P(w, l), R, C, eps);
    else if (m->cfg.llama)
        o->rmsnorm_forward(m->ctx, out.f32, rstd, in, P(w, l), R, C, eps);
    else if (out.bf16)
        o->layernorm_forward16(m->ctx, out.bf16, mean, rstd, in, P(w, l), P(b, l), R, C);
    else
        o->layernorm_forward(m->ctx, out.f32, mean, rstd, in, P(w, l), P(b, l), R, C);
}

/* Its backward: dinp += ..., the weight's (and bias's) gradient written or added. */
void model_norm_backward(const struct model *m, float *dinp, const float *dout, const float *in,
                         enum gpt2_tensor w, enum gpt2_tensor b, int l, const float *mean,
                         const float *rstd, int R, bool acc)
{
    int C = m->cfg.hidden;
    if (m->cfg.llama)
        m->ops->rmsnorm_backward(m->ctx, dinp, G(w, l), dout, in, P(w, l), rstd, R, C, acc);
    else
        m->ops->layernorm_backward(m->ctx, dinp, G(w, l), G(b, l), dout, in, P(w, l), mean, rstd, R,
                                   C, acc);
}

void model_product_forward(const struct model *m, float *out, struct act inp, const float *w,
                           const uint16_t *w16, const float *bias, int N, int C, int OC)
{
    if (inp.bf16)
        m->ops->matmul_forward16(m->ctx, out, inp.bf16, w16, bias, N, C, OC);
    else
        m->ops->matmul_forward(m->ctx, out, inp.f32, w, w16, bias, N, C, OC);
}

void model_product_backward(const struct model *m, float *dinp, float *dw, float *dbias,
                            const float *dout, struct act inp, const float *w, const uint16_t *w16,
                            int N, int C, int OC, bool accumulate)
{
    if (inp.bf16)
        m->ops->matmul_backward16(m->ctx, dinp, dw, dbias, dout, inp.bf16, w16, N, C, OC,
                                  accumulate);
    else
        m->ops->matmul_backward(m->ctx, dinp, dw, dbias, dout, inp.f32, w, w16, N, C, OC,
                                accumulate);
}

/* out (N,OC) = inp (N,C) · (weight t of layer l)ᵀ + bias, a block's product in
 * the run's precision: fp32, bf16 (the weight's bf16 copy; the input fp32 or bf16) or fp8
 * (the weight's fp8 copy, the fp32 input quantised inside the op). The LM head is not
 * one: in fp8 it runs in bf16 (wte16), as DeepSeek-V3 keeps its output head
 * out of fp8. */
void model_linear_forward(const struct model *m, float *out, struct act inp, enum gpt2_tensor t,
                          int l, const float *bias, int N, int C, int OC)
{
    if (m->precision == PLAN_PRECISION_FP8) {
        float *scales;
        const uint8_t *w8 = weight8(m, t, l, &scales);
        m->ops->matmul_forward_fp8(m->ctx, out, inp.f32, w8, scales, bias, N, C, OC,
                                   m->fp8_scaling);
    } else
        model_product_forward(m, out, inp, P(t, l), model_weight16(m, t, l), bias, N, C, OC);
}

/* Its backward (ops.h's matmul_backward), in the same precision. */
void model_linear_backward(const struct model *m, float *dinp, float *dw, float *dbias,
                           const float *dout, struct act inp, enum gpt2_tensor t, int l, int N,
                           int C, int OC, bool accumulate)
{
    if (m->precision == PLAN_PRECISION_FP8) {
        float *scales;
        const uint8_t *w8 = weight8(m, t, l, &scales);
        m->ops->matmul_backward_fp8(m->ctx, dinp, dw, dbias, dout, inp.f32, w8, scales, N, C, OC,
                                    accumulate, m->fp8_scaling);
    } else
        model_product_backward(m, dinp, dw, dbias, dout, inp, P(t, l), model_weight16(m, t, l), N,
                               C, OC, accumulate);
}
