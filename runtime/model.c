/* model.c — GPT-2 and Llama forward and backward over one micro-batch,
 * expressed in the ops of kernels/ops.h, with activation recompute. A Llama
 * block is a GPT-2 block with RMSNorm for LayerNorm, rotary positions on q
 * and k (and its key/value heads repeated, grouped-query) between the QKV
 * product and the attention, SwiGLU for GELU, no biases, and an untied head. The training loop, the
 * optimizer step and checkpoints are elsewhere (train.c, optim.c, ckpt.c). */
#include "runtime/model.h"

#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/gpt2/gpt2_memory.h"
#include "common/log.h"
#include "runtime/model_moe.h"
#include "runtime/model_zero3.h"
#include "runtime/ring_attention.h"
#include "runtime/zero3.h"

static void *track(struct model *m, void *p)
{
    if (!p) return NULL;
    if (m->n_allocations == m->cap_allocations) {
        int cap = m->cap_allocations ? 2 * m->cap_allocations : 64;
        void **bigger = realloc(m->allocations, (size_t)cap * sizeof *bigger);
        if (!bigger) {
            m->ops->free(m->ctx, p);
            return NULL;
        }
        m->allocations = bigger;
        m->cap_allocations = cap;
    }
    m->allocations[m->n_allocations++] = p;
    return p;
}

/* Device memory of `bytes`, counted in *kind (one of m->allocated's). */
static void *dev_alloc(struct model *m, size_t bytes, uint64_t *kind)
{
    *kind += bytes;
    return track(m, m->ops->alloc(m->ctx, bytes));
}

/* Where each buffer of common/gpt2/gpt2_memory.h lives: a field of every slot's
 * layer_acts (one copy per slot and layer, or one shared when recomputed), of
 * every slot, or of the model. */
enum act_home { IN_LAYER, IN_SLOT, IN_MODEL, IN_MOE };
#define LAYER(a, f) [a] = {IN_LAYER, offsetof(struct layer_acts, f)}
#define MOE(a, f) [a] = {IN_MOE, offsetof(struct moe_acts, f)}
#define SLOT(a, f) [a] = {IN_SLOT, offsetof(struct model_slot, f)}
#define MODEL(a, f) [a] = {IN_MODEL, offsetof(struct model, f)}
static const struct {
    enum act_home home;
    size_t field;
} act_field[GPT2_ACTS] = {
    LAYER(GPT2_ACT_LN1, ln1),
    LAYER(GPT2_ACT_LN1_MEAN, ln1_mean),
    LAYER(GPT2_ACT_LN1_RSTD, ln1_rstd),
    LAYER(GPT2_ACT_QKV, qkv),
    LAYER(GPT2_ACT_ATTY, atty),
    LAYER(GPT2_ACT_ATT, att),
    LAYER(GPT2_ACT_RES2, res2),
    LAYER(GPT2_ACT_LN2, ln2),
    LAYER(GPT2_ACT_LN2_MEAN, ln2_mean),
    LAYER(GPT2_ACT_LN2_RSTD, ln2_rstd),
    LAYER(GPT2_ACT_FCH, fch),
    LAYER(GPT2_ACT_FCH_GELU, fch_gelu),
    LAYER(GPT2_ACT_RES3, res3),
    LAYER(GPT2_ACT_G_FCPROJ, g_fcproj),
    LAYER(GPT2_ACT_G_FC, g_fc),
    LAYER(GPT2_ACT_G_ATTPROJ, g_attproj),
    LAYER(GPT2_ACT_G_QKV, g_qkv),
    SLOT(GPT2_ACT_INPUT, input),
    SLOT(GPT2_ACT_TOKENS, tokens),
    SLOT(GPT2_ACT_TARGETS, targets),
    SLOT(GPT2_ACT_LNF, lnf),
    SLOT(GPT2_ACT_LNF_MEAN, lnf_mean),
    SLOT(GPT2_ACT_LNF_RSTD, lnf_rstd),
    SLOT(GPT2_ACT_LOGITS, logits),
    MODEL(GPT2_ACT_PROJ, proj),
    MODEL(GPT2_ACT_LOSSES, losses),
    MODEL(GPT2_ACT_CE_STATS, ce_stats),
    MODEL(GPT2_ACT_DRES, dres),
    MODEL(GPT2_ACT_GRAD_IN, grad_in),
    MODEL(GPT2_ACT_DC, dC),
    MODEL(GPT2_ACT_D3C, d3C),
    MODEL(GPT2_ACT_D4C, d4C),
    MODEL(GPT2_ACT_DATT, datt),
    MODEL(GPT2_ACT_WHOLE, whole),
    MODEL(GPT2_ACT_QKV_PACKED, qkv_packed),
    MODEL(GPT2_ACT_DFF, dff),
    MODEL(GPT2_ACT_CP_RING, cp_ring),
    MODEL(GPT2_ACT_CP_SCORES, cp_scores),
    MODEL(GPT2_ACT_CP_POS, cp_pos),
    MOE(GPT2_ACT_MOE_PROBS, probs),
    MOE(GPT2_ACT_MOE_GATE, gate),
    MOE(GPT2_ACT_MOE_LSE, lse),
    MOE(GPT2_ACT_MOE_CHOICE, choice),
    MOE(GPT2_ACT_MOE_POS, pos),
    MOE(GPT2_ACT_MOE_ROWS, rows),
    MOE(GPT2_ACT_MOE_COUNTS, counts),
    MOE(GPT2_ACT_MOE_X, x),
    MOE(GPT2_ACT_MOE_H, h),
    MOE(GPT2_ACT_MOE_ACT, act),
    MOE(GPT2_ACT_MOE_Y, y),
    MOE(GPT2_ACT_MOE_SH_H, sh_h),
    MOE(GPT2_ACT_MOE_SH_ACT, sh_act),
    MODEL(GPT2_ACT_MOE_LOGITS, moe_logits),
    MODEL(GPT2_ACT_MOE_DGATE, moe_dgate),
    MODEL(GPT2_ACT_MOE_DY, moe_dy),
    MODEL(GPT2_ACT_MOE_DH, moe_dh),
    MODEL(GPT2_ACT_MOE_DACT, moe_dact),
    MODEL(GPT2_ACT_MOE_LN, moe_ln),
    MODEL(GPT2_ACT_MOE_EP, moe_ep),
    MODEL(GPT2_ACT_MOE_BEFORE, moe_cp_before),
};
#undef MOE
#undef LAYER
#undef SLOT
#undef MODEL

/* Points the pointer field at `field` bytes into obj at p (every field in
 * act_field is a pointer to float or int32_t). */
static void point(void *obj, size_t field, void *p)
{
    memcpy((char *)obj + field, &p, sizeof p);
}

/* ---- the fp8 weight copy ------------------------------------------------------ */

/* The four product weights of a layer, in the order of the fp8 copy. */
static const enum gpt2_tensor fp8_weights[4] = {GPT2_QKVW, GPT2_ATTPROJW, GPT2_FCW, GPT2_FCPROJW};
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
static void fp8_layout(struct model *m)
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

/* The index of weight t (one of them) in fp8_weights. */
static int fp8_index(enum gpt2_tensor t)
{
    int k = 0;
    while (k < 3 && fp8_weights[k] != t) k++;
    return k;
}

/* The fp8 copy of weight t (one of fp8_weights) of layer l, and its scales:
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
static void quantize_weight(struct model *m, int k, int l, const float *w)
{
    int OC, C, e = fp8_weight_tile(m->fp8_scaling);
    float *scales;
    fp8_shape(m, k, &OC, &C);
    uint8_t *q = weight8(m, fp8_weights[k], l, &scales);
    m->ops->quantize_fp8(m->ctx, q, scales, w, OC, C, e, e, FP8_E4M3);
}

void model_refresh_fp8(struct model *m)
{
    if (m->z3) return; /* each layer window quantises what it gathers */
    for (int i = 0; m->params8 && i < gpt2_shard_layers(&m->shard); i++) {
        int l = gpt2_shard_layer(&m->shard, i);
        for (int k = 0; k < 4; k++) /* (an MoE block's MLP is its experts', not in fp8) */
            if (gpt2_shard_has(&m->shard, fp8_weights[k], l))
                quantize_weight(m, k, l,
                                m->params + gpt2_shard_offset(&m->shard, fp8_weights[k], l));
    }
}

/* Points buffer a's fields at base, copies of `bytes` each: the model's; every slot's
 * (one copy each); every slot's in each of its layers or MoE layers, one copy each where
 * the buffer holds more than a lane's one, else all at base. */
static void point_buffer(struct model *m, enum gpt2_act a, char *base, size_t bytes)
{
    const struct gpt2_buffer *b = &m->mem.act[a];
    bool each = b->copies / b->lanes > 1;
    size_t field = act_field[a].field, L = (size_t)m->n_layers, Lm = (size_t)m->n_moe;
    for (size_t s = 0; s < (size_t)m->n_slots; s++) {
        if (act_field[a].home == IN_SLOT) point(&m->slots[s], field, base + s * bytes);
        for (size_t l = 0; act_field[a].home == IN_LAYER && l < L; l++)
            point(&m->slots[s].layer[l], field, base + (each ? (s * L + l) * bytes : 0));
        for (size_t j = 0; act_field[a].home == IN_MOE && j < Lm; j++)
            point(&m->slots[s].moe[j], field, base + (each ? (s * Lm + j) * bytes : 0));
    }
    if (act_field[a].home == IN_MODEL) point(m, field, base);
}

/* Allocates buffer a as m->mem says and points its fields at it (at the first lane's
 * half, each lane's kept in moe_lane where it has two): 0, or -1 when out of memory. */
static int act_buffer(struct model *m, enum gpt2_act a)
{
    const struct gpt2_buffer *b = &m->mem.act[a];
    if (!b->copies) return 0;
    size_t bytes = b->elems * b->elem_bytes; /* one copy; gpt2_memory checked the products */
    char *base = dev_alloc(m, bytes * b->copies, &m->allocated.activations);
    if (!base) return -1;
    for (size_t k = 0; b->lanes == 2 && k < 2; k++)
        m->moe_lane[k].acts[a] = base + k * (b->copies / 2) * bytes;
    point_buffer(m, a, base, bytes);
    return 0;
}

void model_lane_enter(struct model *m, int lane)
{
    for (int a = 0; a < GPT2_ACTS; a++)
        if (m->mem.act[a].lanes == 2)
            point_buffer(m, a, m->moe_lane[lane].acts[a],
                         m->mem.act[a].elems * m->mem.act[a].elem_bytes);
}

/* The settings the model keeps from its shape and its backend. */
static void model_settings(struct model *m, const struct gpt2_config *cfg, const struct group *tp,
                           const struct ops *ops, struct ops_ctx *ctx,
                           const struct model_shape *shape)
{
    m->cfg = *cfg;
    m->ops = ops;
    m->ctx = ctx;
    m->B = shape->B;
    m->T = shape->T;
    m->precision = shape->precision;
    m->fp8_scaling = shape->fp8_scaling == PLAN_FP8_BLOCK ? FP8_SCALING_BLOCK : FP8_SCALING_TENSOR;
    m->recompute = shape->recompute;
    m->split_backward = shape->split_backward;
    m->tp = tp ? *tp : (struct group){.size = 1};
    m->cp = shape->cp > 1 ? shape->cp : 1;
    m->cp_rank = m->cp > 1 ? shape->cp_rank : 0;
    m->cp_group = shape->cp_group;
    m->ep_group = shape->ep_group;
    m->moe_lane[1].ep_group = shape->ep_lane_group;
    m->moe_capacity_factor = shape->moe_capacity_factor;
    m->moe_aux = shape->moe_aux_loss;
    m->moe_z = shape->moe_z_loss;
}

/* fp8 needs the backend's fp8 products. */
static int check_fp8_ops(const struct ops *ops, enum plan_precision precision,
                         struct plait_error *err)
{
    if (precision == PLAN_PRECISION_FP8 &&
        (!ops->matmul_forward_fp8 || !ops->matmul_backward_fp8 || !ops->quantize_fp8))
        return error_set(err,
                         "precision: the %s backend has no fp8 matrix products (fp8 runs on "
                         "the cpu backend, emulated, or on a GPU of sm_89 or later)",
                         ops->name);
    return 0;
}

/* A Llama needs the backend's Llama ops (kernels/ops.h). */
static int check_llama_ops(const struct ops *ops, const struct gpt2_config *cfg,
                           struct plait_error *err)
{
    if (cfg->llama && (!ops->rmsnorm_forward || !ops->rmsnorm_backward || !ops->rope_forward ||
                       !ops->rope_backward || !ops->kv_expand || !ops->kv_expand_backward ||
                       !ops->swiglu_forward || !ops->swiglu_backward))
        return error_set(err, "model.arch \"llama\": the %s backend has no Llama ops yet",
                         ops->name);
    return 0;
}

/* The shape against the part and the tp group the model was given. */
static int check_shape(const struct model *m, const struct gpt2_part *part,
                       const struct model_shape *shape, struct plait_error *err)
{
    if (m->tp.size != part->tp || m->tp.rank != part->tp_rank)
        return error_set(err,
                         "model: its tensor-parallel group (rank %d of %d) is not its part's "
                         "(rank %d of %d)",
                         m->tp.rank, m->tp.size, part->tp_rank, part->tp);
    if (shape->slots < 1 || shape->slots > 1 << 16)
        return error_set(err, "model: %d micro-batches in flight", shape->slots);
    if (shape->dp < 1 || shape->dp_rank < 0 || shape->dp_rank >= shape->dp || shape->zero < 0 ||
        shape->zero > 3 || (shape->zero == 3 && shape->dp > 1 && !shape->dp_group))
        return error_set(err, "model: data-parallel rank %d of %d, ZeRO stage %d", shape->dp_rank,
                         shape->dp, shape->zero);
    if (shape->sequence_parallel && part->tp == 1)
        return error_set(err, "model: sequence parallelism needs a tensor-parallel group");
    return 0;
}

/* What the shard holds in memory (common/gpt2/gpt2_memory.c), the count the
 * allocations must match. */
static int count_memory(struct model *m, const struct model_shape *shape, struct plait_error *err)
{
    struct gpt2_memory_shape ms = {.B = shape->B,
                                   .T = shape->T,
                                   .cp = m->cp,
                                   .precision = shape->precision,
                                   .fp8_scaling = shape->fp8_scaling,
                                   .recompute = shape->recompute,
                                   .slots = shape->slots,
                                   .chunks = m->shard.part.chunks,
                                   .dp = shape->dp,
                                   .zero = shape->zero,
                                   .keep_gathered = shape->keep_gathered,
                                   .sequence_parallel = m->sp,
                                   .split_backward = m->split_backward,
                                   .fused_attention = m->ops->attention_forward_fused != NULL,
                                   .offload_window_mb =
                                       shape->offload_dir ? shape->offload_window_mb : 0,
                                   .moe_lanes = shape->ep_lane_group != NULL};
    return gpt2_memory(&m->shard, &ms, &m->mem, err);
}

/* This rank's sizes: its tp part of the hidden width, heads and vocabulary,
 * its layers and slots, its data-parallel slice. */
static void shard_sizes(struct model *m, const struct gpt2_config *cfg,
                        const struct gpt2_part *part, const struct model_shape *shape)
{
    m->Cl = cfg->hidden / part->tp;
    m->NHl = cfg->heads / part->tp;
    m->KVl = gpt2_kv_heads(cfg) / part->tp;
    m->hs = cfg->hidden / cfg->heads;
    m->QKVl = (int)(gpt2_qkv_rows(cfg) / part->tp);
    m->FCl = (int)(gpt2_fc_rows(cfg) / part->tp);
    m->Fl = gpt2_ffn(cfg) / part->tp;
    m->head = cfg->untied ? GPT2_LMHEAD : GPT2_WTE;
    m->Vpl = cfg->padded_vocab / part->tp;
    m->v0 = part->tp_rank * m->Vpl;
    int real = cfg->vocab - m->v0;
    m->nv = real < 0 ? 0 : real > m->Vpl ? m->Vpl : real;
    m->chunks = m->shard.part.chunks;
    m->n_layers = part->layer_end - part->layer_begin; /* of each chunk */
    m->n_moe = gpt2_chunk_moe_layers(&m->shard);
    m->first = m->shard.first;
    m->last = m->shard.last;
    m->n_slots = shape->slots;
    m->deferred_slot = -1;
    m->dp = shape->dp;
    m->dp_rank = shape->dp_rank;
    m->replicas = shape->replicas > 1 ? shape->replicas : 1;
    m->replica = shape->replica;
    m->zero = m->mem.zero;
    m->z3_keep = m->zero == 3 && shape->keep_gathered;
    m->n_padded = m->mem.padded;
    m->slice_n = m->mem.slice;
    m->slice_at = m->zero ? (size_t)m->dp_rank * m->slice_n : 0;
}

/* Offloaded moments: two windows of each in memory, counted as the
 * optimizer's; the files come with offload_open. */
static bool offload_windows(struct model *m)
{
    if (!(m->offload = calloc(1, sizeof *m->offload))) return false;
    m->offload->fd[0] = m->offload->fd[1] = m->offload->direct[0] = m->offload->direct[1] = -1;
    size_t bytes = m->mem.offload_window * sizeof(float);
    for (int b = 0; b < 2; b++)
        for (int k = 0; k < 2; k++)
            if (!(m->offload->buf[b][k] = dev_alloc(m, bytes, &m->allocated.optimizer)))
                return false;
    return true;
}

static bool allocate_zero3(struct model *m);
static bool allocate_rest(struct model *m);

/* The AdamW moments of the slice: beside the weights, or (nvme offload) in
 * files with two windows of each in memory. */
static bool allocate_moments(struct model *m)
{
    size_t S = m->slice_n;
    uint64_t *kind = &m->allocated.optimizer;
    if (m->mem.offload_window) return offload_windows(m);
    return (m->adam_m = dev_alloc(m, S * sizeof(float), kind)) &&
           (m->adam_v = dev_alloc(m, S * sizeof(float), kind));
}

/* The slots, the parameters, gradients and optimizer state (a slice of them
 * with ZeRO), their bf16 or fp8 copies, the activations, the losses. false:
 * out of memory. */
static bool allocate(struct model *m)
{
    m->slots = calloc((size_t)m->n_slots, sizeof *m->slots);
    if (!m->slots) return false;
    for (int s = 0; s < m->n_slots; s++)
        if (!(m->slots[s].layer = calloc((size_t)m->n_layers, sizeof *m->slots[s].layer)) ||
            !(m->slots[s].moe = calloc((size_t)m->n_moe + 1, sizeof *m->slots[s].moe)))
            return false;
    size_t S = m->slice_n, Pp = m->n_padded;
    struct model_bytes *a = &m->allocated;
    if (m->zero == 3) /* the slice, and the windows the units are gathered into */
        return allocate_zero3(m) && allocate_rest(m);
    bool ok = (m->params = dev_alloc(m, Pp * sizeof(float), &a->params)) &&
              (m->grads = dev_alloc(m, Pp * sizeof(float), &a->grads)) &&
              allocate_moments(m) &&
              (!m->zero || ((m->grad_slice = dev_alloc(m, S * sizeof(float), &a->grads)) &&
                            (m->slice_tmp = dev_alloc(m, S * sizeof(float), &a->optimizer))));
    if (ok && m->precision == PLAN_PRECISION_BF16)
        ok = (m->params16 = dev_alloc(m, Pp * sizeof(uint16_t), &a->params)) != NULL;
    return ok && allocate_rest(m);
}

/* ZeRO 3's model state: the slice's weights, gradient and moments, the
 * parameter windows (a bf16 copy beside each in bf16) and the gradient
 * windows (a staging buffer beside each); the pools over them come after
 * (model_init). */
static bool allocate_zero3(struct model *m)
{
    size_t S = m->slice_n, gcaps[GPT2_ZERO3_GRAD_WINDOWS];
    struct model_bytes *a = &m->allocated;
    bool ok = (m->params = dev_alloc(m, S * sizeof(float), &a->params)) &&
              (m->grad_slice = dev_alloc(m, S * sizeof(float), &a->grads)) && allocate_moments(m) &&
              (m->precision != PLAN_PRECISION_BF16 ||
               (m->slice16 = dev_alloc(m, S * sizeof(uint16_t), &a->params)));
    int np = gpt2_zero3_caps(m->mem.zero3_params, NULL);
    size_t *pcaps = calloc((size_t)np + 1, sizeof *pcaps);
    m->z3_pwin = calloc((size_t)np + 1, sizeof *m->z3_pwin);
    m->win16 = calloc((size_t)np + 1, sizeof *m->win16);
    m->z3_block8 = calloc((size_t)np + 1, sizeof *m->z3_block8);
    ok = ok && pcaps && m->z3_pwin && m->win16 && m->z3_block8;
    m->z3_n_pwin = ok ? gpt2_zero3_caps(m->mem.zero3_params, pcaps) : 0;
    for (int i = 0, k = 0; i < m->z3_n_pwin; i++) /* fp8: the layer windows' blocks */
        m->z3_block8[i] = gpt2_zero3_layer_window(m->mem.zero3_params, pcaps[i]) ? k++ : -1;
    for (int i = 0; ok && i < m->z3_n_pwin; i++)
        ok = (m->z3_pwin[i] = dev_alloc(m, pcaps[i] * sizeof(float), &a->params)) &&
             (m->precision != PLAN_PRECISION_BF16 ||
              (m->win16[i] = dev_alloc(m, pcaps[i] * sizeof(uint16_t), &a->params)));
    free(pcaps);
    int ng = gpt2_zero3_caps(m->mem.zero3_grads, gcaps);
    for (int i = 0; ok && i < ng; i++)
        ok = (m->z3_gwin[i] = dev_alloc(m, gcaps[i] * sizeof(float), &a->grads)) &&
             (m->z3_stage[i] =
                  dev_alloc(m, (gcaps[i] < S ? gcaps[i] : S) * sizeof(float), &a->grads));
    return ok;
}

/* The fp8 copy, the activations, the losses. */
static bool allocate_rest(struct model *m)
{
    struct model_bytes *a = &m->allocated;
    bool ok = true;
    if (ok && m->precision == PLAN_PRECISION_FP8) {
        size_t layers = (size_t)gpt2_shard_layers(&m->shard);
        if (m->zero == 3) /* a copy in each layer window (window_copies) */
            layers = (size_t)gpt2_zero3_layer_windows(m->mem.zero3_params);
        fp8_layout(m);
        ok =
            (m->params8 = dev_alloc(m, layers * m->fp8_layer_elems, &a->params)) &&
            (m->scales8 = dev_alloc(m, layers * m->fp8_layer_scales * sizeof(float), &a->params)) &&
            (!m->mem.lm_head16 ||
             (m->wte16 = dev_alloc(m, m->mem.lm_head16 * sizeof(uint16_t), &a->params)));
    }
    for (int i = 0; ok && i < GPT2_ACTS; i++) ok = act_buffer(m, i) == 0;
    if (!ok) return false;
    m->losses_host = calloc((size_t)m->B * (size_t)m->T, sizeof(float));
    return m->losses_host != NULL;
}

/* What was allocated must be what common/gpt2/gpt2_memory.c counts. */
static int check_allocated(struct model *m, struct plait_error *err)
{
    const struct model_bytes *a = &m->allocated;
    if (a->params == m->mem.params && a->grads == m->mem.grads &&
        a->optimizer == m->mem.optimizer && a->activations == m->mem.activations)
        return 0;
    struct model_bytes want = {m->mem.params, m->mem.grads, m->mem.optimizer, m->mem.activations};
    model_free(m);
    return error_set(err,
                     "model: allocated %llu/%llu/%llu/%llu bytes of parameters, gradients, "
                     "optimizer state, activations; common/gpt2/gpt2_memory.c counts "
                     "%llu/%llu/%llu/%llu (a bug: the two must agree)",
                     (unsigned long long)a->params, (unsigned long long)a->grads,
                     (unsigned long long)a->optimizer, (unsigned long long)a->activations,
                     (unsigned long long)want.params, (unsigned long long)want.grads,
                     (unsigned long long)want.optimizer, (unsigned long long)want.activations);
}

int model_init(struct model *m, const struct gpt2_config *cfg, const struct gpt2_part *part,
               const struct group *tp, const struct ops *ops, struct ops_ctx *ctx,
               const struct model_shape *shape, struct plait_error *err)
{
    memset(m, 0, sizeof *m);
    model_settings(m, cfg, tp, ops, ctx, shape);
    if (check_fp8_ops(ops, shape->precision, err) || check_llama_ops(ops, cfg, err) ||
        gpt2_shard_init(&m->shard, cfg, part, err) || check_shape(m, part, shape, err))
        return -1;
    m->sp = shape->sequence_parallel;
    if (count_memory(m, shape, err)) return -1;
    shard_sizes(m, cfg, part, shape);
    if (moe_check(m, err)) return -1;
    /* the attention kernel: the bf16 tensor cores' where the backend takes this head size */
    m->attention_bf16 = shape->precision != PLAN_PRECISION_FP32 && ops->attention_bf16_takes &&
                        ops->attention_bf16_takes(cfg->hidden / cfg->heads);
    if (!allocate(m)) {
        model_free(m);
        return error_set(err, "out of memory for a %s of %zu parameters with micro-batch %d×%d",
                         cfg->llama ? "Llama" : "GPT-2", m->shard.total, shape->B, shape->T);
    }
    if (m->offload && offload_open(m->offload, shape->offload_dir, shape->offload_rank, m->slice_n,
                                   m->mem.offload_window, err)) {
        model_free(m);
        return -1;
    }
    if ((m->zero == 3 && mz3_init(m, shape->dp_group, err)) || (m->cp > 1 && ring_init(m, err)) ||
        moe_init(m, err) || moe_ep_lanes_init(m, err)) {
        model_free(m);
        return -1;
    }
    return check_allocated(m, err);
}

void model_free(struct model *m)
{
    mz3_free(m);
    free(m->z3_pwin);
    free(m->win16);
    free(m->z3_block8);
    m->z3_pwin = NULL;
    m->win16 = NULL;
    m->z3_block8 = NULL;
    if (m->offload) offload_close(m->offload);
    free(m->offload);
    m->offload = NULL;
    for (int i = 0; i < m->n_allocations; i++) m->ops->free(m->ctx, m->allocations[i]);
    free(m->allocations);
    moe_ep_lanes_free(m);
    moe_free(m);
    for (int s = 0; m->slots && s < m->n_slots; s++) {
        free(m->slots[s].layer);
        free(m->slots[s].moe);
    }
    free(m->slots);
    free(m->losses_host);
    m->allocations = NULL;
    m->slots = NULL;
    m->losses_host = NULL;
    m->n_allocations = m->cap_allocations = 0;
}

int model_moment_put(struct model *m, int k, const float *host, size_t n, struct plait_error *err)
{
    if (m->offload) /* its file was zeros when opened, and loads come before any step */
        return offload_write(m->offload, k, 0, host, n, err);
    float *dst = k ? m->adam_v : m->adam_m;
    if (n < m->slice_n) m->ops->zero(m->ctx, dst, m->slice_n * sizeof(float));
    if (n) m->ops->upload(m->ctx, dst, host, n * sizeof(float));
    return 0;
}

/* The slice's elements the shard has (the padding after it has none). */
static size_t slice_held(const struct model *m)
{
    size_t end = m->slice_at + m->slice_n, have = m->shard.total;
    return m->slice_at >= have ? 0 : (end < have ? end : have) - m->slice_at;
}

void model_set_params(struct model *m, const float *host_params)
{
    if (m->zero == 3) {
        model_set_param_slice(m, host_params + m->slice_at, slice_held(m));
        return;
    }
    m->ops->upload(m->ctx, m->params, host_params, m->shard.total * sizeof(float));
    model_refresh_bf16(m);
    model_refresh_fp8(m);
}

void model_set_param_slice(struct model *m, const float *host, size_t n)
{
    m->ops->zero(m->ctx, m->params, m->slice_n * sizeof(float));
    if (n) m->ops->upload(m->ctx, m->params, host, n * sizeof(float));
    model_refresh_bf16(m);
}

float *model_master(const struct model *m, size_t at)
{
    return m->zero == 3 ? m->params + (at - m->slice_at) : m->params + at;
}

void model_grads_clear(struct model *m)
{
    if (m->zero == 3) m->ops->zero(m->ctx, m->grad_slice, m->slice_n * sizeof(float));
}

void model_refresh_bf16(struct model *m)
{
    if (m->zero == 3) { /* the slice's copy; each window gets its own when gathered */
        if (m->slice16) m->ops->to_bf16(m->ctx, m->slice16, m->params, m->slice_n);
        return;
    }
    if (m->params16) m->ops->to_bf16(m->ctx, m->params16, m->params, m->shard.total);
    if (m->wte16)
        m->ops->to_bf16(m->ctx, m->wte16, m->params + gpt2_shard_offset(&m->shard, m->head, 0),
                        m->mem.lm_head16);
}

uint16_t *model_copy16(const struct model *m, enum gpt2_tensor t, size_t off, size_t at)
{
    if (m->z3) /* bf16: the slice's copy, which the layers are gathered from */
        return m->slice16 ? m->slice16 + (at - m->slice_at) : NULL;
    if (m->params16) return m->params16 + at;
    if (m->wte16 && t == m->head && m->last) return m->wte16 + (at - off);
    return NULL;
}

/* ---- parameter views -------------------------------------------------------- */

enum view { PARAMS, GRADS };

/* Tensor t of layer l (l = 0 for tensors that are not per layer): its
 * weights or its gradient. With ZeRO 3, in the window its unit was gathered
 * (or its gradient window taken) into: a pass that uses a unit it did not
 * gather is a bug, stopped here. */
static float *param(const struct model *m, enum view v, enum gpt2_tensor t, int l)
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
static const uint16_t *weight16(const struct model *m, enum gpt2_tensor t, int l)
{
    size_t off = gpt2_shard_offset(&m->shard, t, l);
    if (m->z3 && m->precision == PLAN_PRECISION_BF16) return mz3_at16(m, off);
    if (m->z3) return m->wte16 && t == m->head && m->last ? m->wte16 : NULL; /* fp8's head */
    return model_copy16(m, t, off, off);
}

float *model_tensor(const struct model *m, bool grads, enum gpt2_tensor t, int l)
{
    return param(m, grads ? GRADS : PARAMS, t, l);
}

const uint16_t *model_tensor16(const struct model *m, enum gpt2_tensor t, int l)
{
    return weight16(m, t, l);
}

#define P(t, l) param(m, PARAMS, t, l)
#define G(t, l) param(m, GRADS, t, l)

/* A tensor the architecture may not have (a Llama's biases, GPT-2's wpe on
 * tp ranks but 0): its parameters or gradient, NULL when the shard holds none. */
static float *held(const struct model *m, enum view v, enum gpt2_tensor t, int l)
{
    return gpt2_shard_holds(&m->shard, t) ? param(m, v, t, l) : NULL;
}

/* The block's norm over R rows: GPT-2's LayerNorm (mean and rstd kept), a
 * Llama's RMSNorm (rstd kept); weight w and bias b of layer l. */
static void norm_forward(const struct model *m, float *out, float *mean, float *rstd,
                         const float *in, enum gpt2_tensor w, enum gpt2_tensor b, int l, int R)
{
    int C = m->cfg.hidden;
    if (m->cfg.llama)
        m->ops->rmsnorm_forward(m->ctx, out, rstd, in, P(w, l), R, C, m->cfg.norm_eps);
    else
        m->ops->layernorm_forward(m->ctx, out, mean, rstd, in, P(w, l), P(b, l), R, C);
}

/* Its backward: dinp += ..., the weight's (and bias's) gradient written or added. */
static void norm_backward(const struct model *m, float *dinp, const float *dout, const float *in,
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

/* out (N,OC) = inp (N,C) · (weight t of layer l)ᵀ + bias, a block's product in
 * the run's precision: fp32, bf16 (the weight's bf16 copy) or fp8 (the
 * weight's fp8 copy, the input quantised inside the op). The LM head is not
 * one: in fp8 it runs in bf16 (wte16), as DeepSeek-V3 keeps its output head
 * out of fp8. */
static void linear_forward(const struct model *m, float *out, const float *inp, enum gpt2_tensor t,
                           int l, const float *bias, int N, int C, int OC)
{
    if (m->precision == PLAN_PRECISION_FP8) {
        float *scales;
        const uint8_t *w8 = weight8(m, t, l, &scales);
        m->ops->matmul_forward_fp8(m->ctx, out, inp, w8, scales, bias, N, C, OC, m->fp8_scaling);
    } else
        m->ops->matmul_forward(m->ctx, out, inp, P(t, l), weight16(m, t, l), bias, N, C, OC);
}

/* Its backward (ops.h's matmul_backward), in the same precision. */
static void linear_backward(const struct model *m, float *dinp, float *dw, float *dbias,
                            const float *dout, const float *inp, enum gpt2_tensor t, int l, int N,
                            int C, int OC, bool accumulate)
{
    if (m->precision == PLAN_PRECISION_FP8) {
        float *scales;
        const uint8_t *w8 = weight8(m, t, l, &scales);
        m->ops->matmul_backward_fp8(m->ctx, dinp, dw, dbias, dout, inp, w8, scales, N, C, OC,
                                    accumulate, m->fp8_scaling);
    } else
        m->ops->matmul_backward(m->ctx, dinp, dw, dbias, dout, inp, P(t, l), weight16(m, t, l), N,
                                C, OC, accumulate);
}

/* ---- tensor parallelism ------------------------------------------------------------ */

/* The rows of the residual stream this rank holds of N: N/tp sequence parallel. */
static int rows_of(const struct model *m, int N)
{
    return m->sp ? N / m->tp.size : N;
}

/* Sums (or maxes) n floats of buf over the tp group: a no-op without one. */
static int tp_reduce(struct model *m, float *buf, size_t n, bool max, struct plait_error *err)
{
    if (m->tp.size == 1) return 0;
    if (m->tp.allreduce(m->tp.ctx, buf, n, max, err))
        return error_prefix(err, "tensor-parallel all-reduce: ");
    return 0;
}

int model_tp_allreduce(struct model *m, float *buf, size_t n, struct plait_error *err)
{
    return tp_reduce(m, buf, n, false, err);
}

/* Sequence parallelism's two collectives over (N,C) row blocks, R = N/tp
 * rows a rank. The residual stream's rows (R,C) -> *whole (N,C), every
 * rank's block in rank order, in m->whole (without sequence parallelism the
 * rows are already whole: *whole = rows). */
static int sp_gather_into(struct model *m, const float *rows, int N, float *into,
                          const float **whole, struct plait_error *err)
{
    *whole = rows;
    if (!m->sp) return 0;
    size_t RC = (size_t)(N / m->tp.size) * m->cfg.hidden;
    if (m->tp.allgather(m->tp.ctx, rows, into, RC, err))
        return error_prefix(err, "sequence-parallel all-gather: ");
    *whole = into;
    return 0;
}

static int sp_gather(struct model *m, const float *rows, int N, const float **whole,
                     struct plait_error *err)
{
    return sp_gather_into(m, rows, N, m->whole, whole, err);
}

/* partial (N,C) summed over the group, this rank's R rows of the sum into
 * rows (R,C), another buffer. */
static int sp_scatter(struct model *m, const float *partial, float *rows, int N,
                      struct plait_error *err)
{
    size_t RC = (size_t)(N / m->tp.size) * m->cfg.hidden;
    if (m->tp.reduce_scatter(m->tp.ctx, partial, rows, RC, err))
        return error_prefix(err, "sequence-parallel reduce-scatter: ");
    return 0;
}

/* partial (N,C), this rank's term of a sum over the group (a row-parallel
 * product, the input gradient of a column-parallel one) -> *rows: the sum's
 * rows this rank holds, (N,C) in place (all-reduce) or, sequence parallel,
 * its R rows in m->whole (reduce-scatter). */
static int tp_sum_rows(struct model *m, float *partial, int N, float **rows,
                       struct plait_error *err)
{
    *rows = m->sp ? m->whole : partial;
    return m->sp ? sp_scatter(m, partial, m->whole, N, err)
                 : tp_reduce(m, partial, (size_t)N * m->cfg.hidden, false, err);
}

/* *out = inp (N,in_cols) · wᵀ + bias for a row-parallel weight, on this
 * rank's rows of the residual stream: the partial product into m->proj, its
 * sum over the group, then the bias once (fused without tp). */
static int row_parallel_forward(struct model *m, float **out, const float *inp, enum gpt2_tensor w,
                                enum gpt2_tensor bias, int l, int N, int in_cols,
                                struct plait_error *err)
{
    const struct ops *o = m->ops;
    int C = m->cfg.hidden;
    float *prod = m->proj;
    struct profile *pr = &m->prof;
    *out = prod;
    const float *b = held(m, PARAMS, bias, l);
    if (m->tp.size == 1) {
        PROF(pr, PROF_MATMUL_FWD, linear_forward(m, prod, inp, w, l, b, N, in_cols, C));
        return 0;
    }
    PROF(pr, PROF_MATMUL_FWD, linear_forward(m, prod, inp, w, l, NULL, N, in_cols, C));
    if (tp_sum_rows(m, prod, N, out, err)) return -1;
    if (b) PROF(pr, PROF_MATMUL_FWD, o->add_bias(m->ctx, *out, b, rows_of(m, N), C));
    return 0;
}

/* ---- forward ------------------------------------------------------------------ */

/* Local layer i of a slot: its activations; its parameters are the model's
 * layer slot_layer(m, sl, i). */
static int slot_layer(const struct model *m, const struct model_slot *sl, int i)
{
    return gpt2_shard_layer(&m->shard, sl->chunk * m->n_layers + i);
}

/* Whether the slot's chunk embeds (the first stage's first chunk) or ends in
 * the head (the last stage's last chunk). */
static bool embeds(const struct model *m, const struct model_slot *sl)
{
    return m->first && sl->chunk == 0;
}

static bool heads(const struct model *m, const struct model_slot *sl)
{
    return m->last && sl->chunk == m->chunks - 1;
}

static const float *layer_input(const struct model_slot *sl, int i)
{
    return i == 0 ? sl->input : sl->layer[i - 1].res3;
}

/* The attention of layer acts a: on bf16 tensor cores or fused where the
 * backend has them, with att then holding only each row's log-sum-exp (its
 * first B·NH·T floats). */
static int attention_fwd(struct model *m, struct layer_acts *a, int B, int T,
                         struct plait_error *err)
{
    const struct ops *o = m->ops;
    if (m->cp > 1)
        return ring_attention_forward(m, a, B, T, err);
    else if (m->attention_bf16)
        o->attention_forward_bf16(m->ctx, a->atty, a->att, a->qkv, B, T, m->Cl, m->NHl);
    else if (o->attention_forward_fused)
        o->attention_forward_fused(m->ctx, a->atty, a->att, a->qkv, B, T, m->Cl, m->NHl);
    else
        o->attention_forward(m->ctx, a->atty, a->att, a->qkv, B, T, m->Cl, m->NHl);
    return 0;
}

/* dqkv (B,T,3C/tp) from dout (B,T,C/tp), the attention's output gradient */
static int attention_bwd(struct model *m, struct layer_acts *a, float *dqkv, const float *dout,
                         int B, int T, struct plait_error *err)
{
    const struct ops *o = m->ops;
    if (m->cp > 1)
        return ring_attention_backward(m, a, dqkv, dout, B, T, err);
    else if (m->attention_bf16)
        o->attention_backward_bf16(m->ctx, dqkv, dout, a->qkv, a->atty, a->att, B, T, m->Cl,
                                   m->NHl);
    else if (o->attention_backward_fused)
        o->attention_backward_fused(m->ctx, dqkv, dout, a->qkv, a->atty, a->att, B, T, m->Cl,
                                    m->NHl);
    else
        o->attention_backward(m->ctx, dqkv, m->datt, dout, a->qkv, a->att, B, T, m->Cl, m->NHl);
    return 0;
}

/* q, k and v of layer acts a from ln (N,C): the product into a->qkv; a
 * Llama's rotary positions on q and k, and with grouped-query attention the
 * product into qkv_packed, its key/value heads then repeated into a->qkv. */
static void qkv_forward(struct model *m, struct layer_acts *a, const float *ln, int l, int B, int T)
{
    const struct ops *o = m->ops;
    int N = B * T;
    float *out = m->qkv_packed ? m->qkv_packed : a->qkv;
    struct profile *pr = &m->prof;
    PROF(pr, PROF_MATMUL_FWD,
         linear_forward(m, out, ln, GPT2_QKVW, l, held(m, PARAMS, GPT2_QKVB, l), N, m->cfg.hidden,
                        m->QKVl));
    if (!m->cfg.llama) return;
    if (m->cp > 1)
        PROF(pr, PROF_ATTENTION_FWD, ring_rope(m, out, B, T, false));
    else
        PROF(pr, PROF_ATTENTION_FWD,
             o->rope_forward(m->ctx, out, B, T, m->NHl, m->KVl, m->hs, m->cfg.rope_theta, 0));
    if (m->qkv_packed)
        PROF(pr, PROF_ATTENTION_FWD, o->kv_expand(m->ctx, a->qkv, out, N, m->NHl, m->KVl, m->hs));
}

/* The MLP's activation: GELU of fch (N,4C/tp), or a Llama's SwiGLU of its
 * gate and up halves (N,2F/tp), into fch_gelu. */
static void act_forward(struct model *m, struct layer_acts *a, int N)
{
    model_mlp_act(m, a->fch_gelu, a->fch, N, m->Fl);
}

void model_mlp_act(const struct model *m, float *out, const float *in, int N, int F)
{
    if (m->cfg.llama)
        m->ops->swiglu_forward(m->ctx, out, in, N, F);
    else
        m->ops->gelu_forward(m->ctx, out, in, (size_t)N * F);
}

void model_mlp_act_backward(const struct model *m, float *din, const float *in, const float *dout,
                            int N, int F)
{
    if (m->cfg.llama)
        m->ops->swiglu_backward(m->ctx, din, in, dout, N, F);
    else
        m->ops->gelu_backward(m->ctx, din, in, dout, (size_t)N * F);
}

/* Sequence parallel, the LayerNorms and residual adds run on this rank's R
 * rows; each column-parallel product reads the LayerNorm's output gathered
 * from the group, each row-parallel one is reduce-scattered back to R rows. */
static int layer_forward(struct model *m, struct model_slot *sl, int i, int B, int T,
                         struct plait_error *err)
{
    const struct ops *o = m->ops;
    int C = m->cfg.hidden, N = B * T, R = rows_of(m, N), l = slot_layer(m, sl, i);
    struct layer_acts *a = &sl->layer[i];
    const float *in = layer_input(sl, i), *ln;
    float *proj;
    struct profile *pr = &m->prof;
    PROF(pr, PROF_LAYERNORM_FWD,
         norm_forward(m, a->ln1, a->ln1_mean, a->ln1_rstd, in, GPT2_LN1W, GPT2_LN1B, l, R));
    if (sp_gather(m, a->ln1, N, &ln, err)) return -1;
    qkv_forward(m, a, ln, l, B, T);
    int rc;
    PROF(pr, PROF_ATTENTION_FWD, rc = attention_fwd(m, a, B, T, err));
    if (rc) return -1;
    if (row_parallel_forward(m, &proj, a->atty, GPT2_ATTPROJW, GPT2_ATTPROJB, l, N, m->Cl, err))
        return -1;
    PROF(pr, PROF_RESIDUAL_FWD, o->residual_forward(m->ctx, a->res2, in, proj, (size_t)R * C));
    PROF(pr, PROF_LAYERNORM_FWD,
         norm_forward(m, a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, GPT2_LN2W, GPT2_LN2B, l, R));
    if (sp_gather(m, a->ln2, N, &ln, err)) return -1;
    if (gpt2_layer_moe(&m->cfg, l)) { /* an MoE block for the MLP, summed over tp */
        if (moe_forward(m, moe_acts_of(m, sl, i), l, ln, N, &proj, err) ||
            tp_sum_rows(m, proj, N, &proj, err))
            return -1;
        PROF(pr, PROF_RESIDUAL_FWD,
             o->residual_forward(m->ctx, a->res3, a->res2, proj, (size_t)R * C));
        return 0;
    }
    const float *fcb = held(m, PARAMS, GPT2_FCB, l);
    if (o->matmul_forward_gelu && !m->cfg.llama && m->precision != PLAN_PRECISION_FP8) {
        PROF(pr, PROF_MATMUL_FWD, /* one pass */
             o->matmul_forward_gelu(m->ctx, a->fch_gelu, a->fch, ln, P(GPT2_FCW, l),
                                    weight16(m, GPT2_FCW, l), fcb, N, C, m->FCl));
    } else {
        PROF(pr, PROF_MATMUL_FWD, linear_forward(m, a->fch, ln, GPT2_FCW, l, fcb, N, C, m->FCl));
        PROF(pr, PROF_GELU_FWD, act_forward(m, a, N));
    }
    if (row_parallel_forward(m, &proj, a->fch_gelu, GPT2_FCPROJW, GPT2_FCPROJB, l, N, m->Fl, err))
        return -1;
    PROF(pr, PROF_RESIDUAL_FWD, o->residual_forward(m->ctx, a->res3, a->res2, proj, (size_t)R * C));
    return 0;
}

static int check_ops(struct model *m, const char *what, struct plait_error *err)
{
    char msg[512];
    if (m->ops->take_error(m->ctx, msg, sizeof msg) == 0) return 0;
    return error_set(err, "%s backend, %s: %s", m->ops->name, what, msg);
}

/* The loss over a vocabulary split across the tp group (the full logits are
 * never gathered): row max, then Σexp and the target's logit, reduced between. */
static int vocab_parallel_loss(struct model *m, struct model_slot *sl, int N, float grad_scale,
                               struct plait_error *err)
{
    const struct ops *o = m->ops;
    float *mx = m->ce_stats, *sum = mx + N, *tl = sum + N;
    o->classifier_max(m->ctx, sl->logits, mx, N, m->nv, m->Vpl);
    if (tp_reduce(m, mx, (size_t)N, true, err)) return -1;
    o->classifier_sumexp(m->ctx, sl->logits, mx, sl->targets, m->v0, m->nv, m->Vpl, sum, tl, N);
    if (tp_reduce(m, sum, 2 * (size_t)N, false, err)) return -1; /* sums and target logits */
    o->classifier_finish(m->ctx, sl->logits, m->losses, sl->targets, mx, sum, tl, m->v0, m->nv,
                         m->Vpl, N, grad_scale);
    return 0;
}

/* The last stage's head: final LayerNorm, logits, and with targets the loss. */
static int head_forward(struct model *m, struct model_slot *sl, const int32_t *targets, int N,
                        float grad_scale, double *mean_loss, struct plait_error *err)
{
    const struct ops *o = m->ops;
    int C = m->cfg.hidden;
    const float *lnf;
    struct profile *pr = &m->prof;
    PROF(pr, PROF_LAYERNORM_FWD,
         norm_forward(m, sl->lnf, sl->lnf_mean, sl->lnf_rstd, sl->layer[m->n_layers - 1].res3,
                      GPT2_LNFW, GPT2_LNFB, 0, rows_of(m, N)));
    if (sp_gather(m, sl->lnf, N, &lnf, err)) return -1;
    PROF(pr, PROF_LM_HEAD_FWD,
         o->matmul_forward(m->ctx, sl->logits, lnf, P(m->head, 0), weight16(m, m->head, 0), NULL, N,
                           C, m->Vpl));
    if (!targets) return 0;
    o->upload(m->ctx, sl->targets, targets, (size_t)N * sizeof(int32_t));
    if (m->tp.size == 1) {
        PROF(pr, PROF_LOSS,
             o->classifier(m->ctx, sl->logits, m->losses, sl->targets, N, m->cfg.vocab,
                           m->cfg.padded_vocab, grad_scale));
    } else {
        double t0 = prof_clock(pr);
        if (vocab_parallel_loss(m, sl, N, grad_scale, err)) return -1;
        if (!pr->paused) pr->seconds[PROF_LOSS] += prof_clock(pr) - t0;
    }
    o->download(m->ctx, m->losses_host, m->losses, (size_t)N * sizeof(float));
    double sum = 0;
    for (int i = 0; i < N; i++) sum += m->losses_host[i];
    if (mean_loss) *mean_loss = sum / N;
    return 0;
}

/* ---- ZeRO 3's gathers along a pass (model_zero3.h) ------------------------------ */

/* The unit of the slot's local layer i. */
static int z3_unit(const struct model *m, const struct model_slot *sl, int i)
{
    return mz3_layer_unit(sl->chunk * m->n_layers + i);
}

/* Whether the head's weight is wte, of the embeddings' unit. */
static bool tied_head(const struct model *m)
{
    return m->head == GPT2_WTE;
}

/* The copies a gathered window carries, made once a gather (the window
 * holds unit u at w): bf16, the whole unit's bf16 copy; fp8, a layer's four
 * matrices quantised into the window's fp8 block (the amax of each whole
 * matrix, as model_refresh_fp8's) and the LM head's bf16 copy. */
static void window_copies(struct model *m, int u, const struct zero3_window *win)
{
    struct gpt2_unit un = gpt2_unit(&m->shard, m->n_padded, u);
    int i = mz3_window_index(m, un.at), L = gpt2_shard_layers(&m->shard);
    float *w = win->buf;
    if (m->precision == PLAN_PRECISION_BF16 && !win->mixed) /* a mixed gather brought it */
        m->ops->to_bf16(m->ctx, m->win16[i], w, un.elems);
    if (m->precision != PLAN_PRECISION_FP8) return;
    for (int k = 0; u >= 1 && u <= L && k < 4; k++) {
        int l = gpt2_shard_layer(&m->shard, u - 1);
        if (gpt2_shard_has(&m->shard, fp8_weights[k], l)) /* (not an MoE block's experts) */
            quantize_weight(m, k, l,
                            w + (gpt2_shard_offset(&m->shard, fp8_weights[k], l) - un.at));
    }
    size_t head = gpt2_shard_offset(&m->shard, m->head, 0);
    if (m->wte16 && u == gpt2_unit_of(&m->shard, m->head, 0))
        m->ops->to_bf16(m->ctx, m->wte16, w + (head - un.at), m->mem.lm_head16);
}

/* Unit u held gathered (mz3_hold), with the copies its window carries. */
static int hold_unit(struct model *m, int u, struct plait_error *err)
{
    if (mz3_hold(m, u, err)) return -1;
    struct zero3_window *w = m->z3 ? zero3_window_of(m->z3, u) : NULL;
    if (w && !w->ready) window_copies(m, u, w);
    if (w) w->ready = true;
    return 0;
}

/* The gathers the pass needs after local layer i (-1: the embedding's;
 * n_layers: the head's) started: forward, layer i + 1's or the head's
 * units; backward, layer i - 1's. */
static int z3_next(struct model *m, const struct model_slot *sl, int i, bool forward,
                   struct plait_error *err)
{
    if (!m->z3) return 0;
    int j = forward ? i + 1 : i - 1;
    if (j >= 0 && j < m->n_layers) return mz3_want(m, z3_unit(m, sl, j), err);
    if (forward && j == m->n_layers && heads(m, sl))
        return mz3_want(m, mz3_last_unit(m), err) ||
                       (tied_head(m) && mz3_want(m, MZ3_EMBEDDINGS, err))
                   ? -1
                   : 0;
    return 0;
}

/* The head's units (the last; the embeddings' too when tied) held, or
 * dropped. A training forward (grad_scale != 0) leaves them held for its
 * backward, which starts with them: their windows are theirs alone
 * (gpt2_units.h), and the backward drops them. */
static int z3_head(struct model *m, bool hold, struct plait_error *err)
{
    int (*f)(struct model *, int, struct plait_error *) = hold ? hold_unit : mz3_drop;
    return f(m, mz3_last_unit(m), err) || (tied_head(m) && f(m, MZ3_EMBEDDINGS, err)) ? -1 : 0;
}

int model_stage_forward(struct model *m, int slot, const int32_t *tokens, const int32_t *targets,
                        int B, int T, float grad_scale, double *mean_loss, struct plait_error *err)
{
    const struct ops *o = m->ops;
    int C = m->cfg.hidden, N = B * T;
    if (B > m->B || T > m->T || T > m->cfg.max_seq_len || slot < 0 || slot >= m->n_slots ||
        m->slots[slot].chunk < 0 || m->slots[slot].chunk >= m->chunks)
        return error_set(err,
                         "micro-batch %d×%d in slot %d (chunk %d) exceeds the model's buffers "
                         "(%d×%d, %d slots, %d chunks)",
                         B, T, slot, slot < 0 || slot >= m->n_slots ? -1 : m->slots[slot].chunk,
                         m->B, m->T, m->n_slots, m->chunks);
    if (m->sp && N % m->tp.size != 0)
        return error_set(err,
                         "micro-batch %d×%d: %d rows do not split over the %d ranks of "
                         "sequence parallelism",
                         B, T, N, m->tp.size);
    struct model_slot *sl = &m->slots[slot];
    struct profile *pr = &m->prof;
    if (embeds(m, sl) && (hold_unit(m, MZ3_EMBEDDINGS, err) || z3_next(m, sl, -1, true, err)))
        return -1;
    if (embeds(m, sl)) {
        o->upload(m->ctx, sl->tokens, tokens, (size_t)N * sizeof(int32_t));
        /* vocabulary-parallel: each rank its rows of wte, one of them wpe; the sum is
         * exact (all-reduced, or reduce-scattered to this rank's rows) */
        float *emb = m->sp ? m->whole : sl->input;
        const float *wpe = m->tp.rank == 0 ? held(m, PARAMS, GPT2_WPE, 0) : NULL;
        if (m->cp > 1)
            PROF(pr, PROF_EMBED_FWD,
                 ring_encoder_forward(m, emb, sl->tokens, P(GPT2_WTE, 0), wpe, B, T));
        else
            PROF(pr, PROF_EMBED_FWD,
                 o->encoder_forward(m->ctx, emb, sl->tokens, P(GPT2_WTE, 0), m->v0, m->Vpl, wpe,
                                    B, T, C));
        if (m->sp ? sp_scatter(m, emb, sl->input, N, err)
                  : tp_reduce(m, emb, (size_t)N * C, false, err))
            return -1;
        /* (kept for a tied head on this slot: the head uses the same unit) */
        if (!(heads(m, sl) && tied_head(m)) && mz3_drop(m, MZ3_EMBEDDINGS, err)) return -1;
    }
    sl->grad_scale = grad_scale;
    for (int i = 0; i < m->n_layers; i++) {
        int u = z3_unit(m, sl, i);
        if (z3_next(m, sl, i, true, err) || hold_unit(m, u, err) ||
            layer_forward(m, sl, i, B, T, err) || mz3_drop(m, u, err))
            return -1;
    }
    if (m->n_moe && grad_scale != 0) moe_count(m, sl, N); /* a training forward's */
    if (heads(m, sl) &&
        (z3_head(m, true, err) || head_forward(m, sl, targets, N, grad_scale, mean_loss, err) ||
         (grad_scale == 0 && z3_head(m, false, err))))
        return -1;
    return check_ops(m, "forward", err);
}

int model_forward(struct model *m, const int32_t *inputs, const int32_t *targets, int B, int T,
                  float grad_scale, double *mean_loss, struct plait_error *err)
{
    return model_stage_forward(m, 0, inputs, targets, B, T, grad_scale, mean_loss, err);
}

float *model_stage_input(struct model *m, int slot)
{
    return m->slots[slot].input;
}

size_t model_stage_floats(const struct model *m, int B, int T)
{
    return (size_t)rows_of(m, B * T) * (size_t)m->cfg.hidden;
}

const float *model_stage_output(const struct model *m, int slot)
{
    return m->slots[slot].layer[m->n_layers - 1].res3;
}

const float *model_stage_input_grad(const struct model *m)
{
    return m->dres;
}

const float *model_logits(const struct model *m)
{
    return m->slots[0].logits;
}

/* ---- backward ------------------------------------------------------------------ */

/* Recomputes what the recompute policy did not keep for local layer i. */
static int layer_recompute(struct model *m, struct model_slot *sl, int i, int B, int T,
                           struct plait_error *err)
{
    struct layer_acts *a = &sl->layer[i];
    if (m->recompute == PLAN_RECOMPUTE_FULL) return layer_forward(m, sl, i, B, T, err);
    if (m->recompute == PLAN_RECOMPUTE_SELECTIVE) {
        if (attention_fwd(m, a, B, T, err)) return -1;
        if (!gpt2_layer_moe(&m->cfg, slot_layer(m, sl, i))) act_forward(m, a, B * T);
    }
    return 0;
}

/* Reruns what the recompute policy did not keep for local layer i, timed as
 * recompute, not as forward. */
static int recompute_timed(struct model *m, struct model_slot *sl, int i, int B, int T,
                           struct plait_error *err)
{
    struct profile *pr = &m->prof;
    double t0 = prof_clock(pr);
    pr->paused++;
    int rc = layer_recompute(m, sl, i, B, T, err);
    pr->paused--;
    if (rc) return -1;
    if (!pr->paused) pr->seconds[PROF_RECOMPUTE] += prof_clock(pr) - t0;
    return 0;
}

/* Which gradients a backward pass computes. */
enum bwd_pass {
    BWD_ALL,    /* everything */
    BWD_INPUT,  /* all but the products' weight gradients, whose output gradients it keeps */
    BWD_WEIGHTS /* those weight gradients, from what BWD_INPUT kept */
};

/* A product's output gradient for BWD_INPUT: kept in `keep` (the slot's),
 * copied there from `from` unless it was computed there. */
static const float *kept(struct model *m, enum bwd_pass pass, float *keep, const float *from,
                         size_t n)
{
    if (pass != BWD_INPUT) return from;
    if (keep != from) m->ops->copy(m->ctx, keep, from, n * sizeof(float));
    return keep;
}

/* The gradient of the QKV product's output, from dout (N,C/tp), the
 * attention output's: into `into` (N,QKV/tp) through the attention; with
 * grouped-query attention through d3C, the repeated key/value heads summed
 * back; a Llama's rotary positions undone. */
static int qkv_backward(struct model *m, struct layer_acts *a, float *into, const float *dout,
                        int B, int T, struct plait_error *err)
{
    const struct ops *o = m->ops;
    struct profile *pr = &m->prof;
    float *dqkv = m->qkv_packed ? m->d3C : into;
    int rc;
    PROF(pr, PROF_ATTENTION_BWD, rc = attention_bwd(m, a, dqkv, dout, B, T, err));
    if (rc) return -1;
    if (m->qkv_packed)
        PROF(pr, PROF_ATTENTION_BWD,
             o->kv_expand_backward(m->ctx, into, dqkv, B * T, m->NHl, m->KVl, m->hs));
    if (m->cfg.llama && m->cp > 1)
        PROF(pr, PROF_ATTENTION_BWD, ring_rope(m, into, B, T, true));
    else if (m->cfg.llama)
        PROF(pr, PROF_ATTENTION_BWD,
             o->rope_backward(m->ctx, into, B, T, m->NHl, m->KVl, m->hs, m->cfg.rope_theta, 0));
    return 0;
}

/* The MLP activation's backward: dfc (N,4C/tp; a Llama's N,2F/tp) from the
 * activation output's gradient dact and the product's output fch. */
static void act_backward(struct model *m, struct layer_acts *a, float *dfc, const float *dact,
                         int N)
{
    model_mlp_act_backward(m, dfc, a->fch, dact, N, m->Fl);
}

/* A weight gradient of layer l's, NULL where the pass leaves it (!w). */
#define GW(t) (w ? held(m, GRADS, t, l) : NULL)

/* The dense MLP's backward from dout (N,C), its output's gradient: m->dC gets
 * the gradient of its input (this rank's term of it with tp), the weight
 * gradients written or added (with BWD_INPUT left for layer_weights). */
static int mlp_backward(struct model *m, struct layer_acts *a, int l, const float *dout, int N,
                        bool acc, enum bwd_pass pass, struct plait_error *err)
{
    int C = m->cfg.hidden;
    const float *ln = a->ln2;
    struct profile *pr = &m->prof;
    bool w = pass == BWD_ALL; /* the weight gradients too (their inputs gathered) */
    dout = kept(m, pass, a->g_fcproj, dout, (size_t)N * C);
    float *dact = m->cfg.llama ? m->dff : m->d4C;
    PROF(pr, PROF_MATMUL_BWD,
         linear_backward(m, dact, GW(GPT2_FCPROJW), GW(GPT2_FCPROJB), dout, a->fch_gelu,
                         GPT2_FCPROJW, l, N, m->Fl, C, acc));
    float *dfc = pass == BWD_INPUT ? a->g_fc : m->d4C;
    PROF(pr, PROF_GELU_BWD, act_backward(m, a, dfc, dact, N));
    if (w && sp_gather(m, a->ln2, N, &ln, err)) return -1;
    PROF(pr, PROF_MATMUL_BWD,
         linear_backward(m, m->dC, GW(GPT2_FCW), GW(GPT2_FCB), dfc, ln, GPT2_FCW, l, N, C, m->FCl,
                         acc));
    return 0;
}

/* On entry m->dres holds the gradient of the layer's output (whole on every
 * tp rank, or its R rows sequence parallel); on exit, of its input. The input
 * gradients of the column-parallel products are partial sums over the group
 * until reduced. Sequence parallel, the mirror of the forward: the residual
 * gradient is gathered before each row-parallel product's backward (which so
 * sees all N rows: its bias gradient is whole on every rank), the LayerNorm
 * outputs are gathered again for the column-parallel weight gradients, and
 * their input gradients are reduce-scattered to R rows. With BWD_INPUT the
 * products' weight gradients are left for layer_weights. */
static int layer_backward(struct model *m, struct model_slot *sl, int i, int B, int T, bool acc,
                          enum bwd_pass pass, struct plait_error *err)
{
    int C = m->cfg.hidden, N = B * T, R = rows_of(m, N), l = slot_layer(m, sl, i);
    size_t NC = (size_t)N * C;
    struct layer_acts *a = &sl->layer[i];
    const float *in = layer_input(sl, i), *dout, *ln;
    float *dln;
    struct profile *pr = &m->prof;
    bool w = pass == BWD_ALL; /* the weight gradients too (their inputs gathered) */
    if (recompute_timed(m, sl, i, B, T, err)) return -1;
    /* MLP: res3 = res2 + fcproj(act(fc(ln2(res2)))), or + the MoE block's output */
    if (sp_gather(m, m->dres, N, &dout, err)) return -1;
    bool moe = gpt2_layer_moe(&m->cfg, l); /* its input gathered beside dout, sequence parallel */
    if (moe ? sp_gather_into(m, a->ln2, N, m->moe_ln, &ln, err) ||
                  moe_backward(m, moe_acts_of(m, sl, i), l, dout, ln, m->dC, N, sl->grad_scale, acc,
                               err)
            : mlp_backward(m, a, l, dout, N, acc, pass, err))
        return -1;
    if (tp_sum_rows(m, m->dC, N, &dln, err)) return -1;
    PROF(pr, PROF_LAYERNORM_BWD,
         norm_backward(m, m->dres, dln, a->res2, GPT2_LN2W, GPT2_LN2B, l, a->ln2_mean, a->ln2_rstd,
                       R, acc));
    /* attention: res2 = in + attproj(attention(qkv(ln1(in)))) */
    if (sp_gather(m, m->dres, N, &dout, err)) return -1;
    dout = kept(m, pass, a->g_attproj, dout, NC);
    PROF(pr, PROF_MATMUL_BWD,
         linear_backward(m, m->dC, GW(GPT2_ATTPROJW), GW(GPT2_ATTPROJB), dout, a->atty,
                         GPT2_ATTPROJW, l, N, m->Cl, C, acc));
    float *dqkv = pass == BWD_INPUT ? a->g_qkv : m->qkv_packed ? m->qkv_packed : m->d3C;
    if (qkv_backward(m, a, dqkv, m->dC, B, T, err)) return -1;
    ln = a->ln1;
    if (w && sp_gather(m, a->ln1, N, &ln, err)) return -1;
    PROF(pr, PROF_MATMUL_BWD,
         linear_backward(m, m->dC, GW(GPT2_QKVW), GW(GPT2_QKVB), dqkv, ln, GPT2_QKVW, l, N, C,
                         m->QKVl, acc));
#undef GW
    if (tp_sum_rows(m, m->dC, N, &dln, err)) return -1;
    PROF(pr, PROF_LAYERNORM_BWD,
         norm_backward(m, m->dres, dln, in, GPT2_LN1W, GPT2_LN1B, l, a->ln1_mean, a->ln1_rstd, R,
                       acc));
    return 0;
}

/* BWD_WEIGHTS of local layer i: the four products' weight gradients from
 * the output gradients BWD_INPUT kept and the inputs the slot holds (rerun
 * where the recompute policy did not keep them; the LayerNorm outputs
 * gathered again, sequence parallel). */
static int layer_weights(struct model *m, struct model_slot *sl, int i, int B, int T, bool acc,
                         struct plait_error *err)
{
    int C = m->cfg.hidden, N = B * T, l = slot_layer(m, sl, i);
    struct layer_acts *a = &sl->layer[i];
    struct profile *pr = &m->prof;
    const float *ln;
#define GB(t) held(m, GRADS, t, l)
    if (recompute_timed(m, sl, i, B, T, err)) return -1;
    if (!gpt2_layer_moe(&m->cfg, l)) { /* (an MoE block's came with its input gradient) */
        PROF(pr, PROF_MATMUL_BWD,
             linear_backward(m, NULL, G(GPT2_FCPROJW, l), GB(GPT2_FCPROJB), a->g_fcproj,
                             a->fch_gelu, GPT2_FCPROJW, l, N, m->Fl, C, acc));
        if (sp_gather(m, a->ln2, N, &ln, err)) return -1;
        PROF(pr, PROF_MATMUL_BWD,
             linear_backward(m, NULL, G(GPT2_FCW, l), GB(GPT2_FCB), a->g_fc, ln, GPT2_FCW, l, N, C,
                             m->FCl, acc));
    }
    PROF(pr, PROF_MATMUL_BWD,
         linear_backward(m, NULL, G(GPT2_ATTPROJW, l), GB(GPT2_ATTPROJB), a->g_attproj, a->atty,
                         GPT2_ATTPROJW, l, N, m->Cl, C, acc));
    if (sp_gather(m, a->ln1, N, &ln, err)) return -1;
    PROF(pr, PROF_MATMUL_BWD,
         linear_backward(m, NULL, G(GPT2_QKVW, l), GB(GPT2_QKVB), a->g_qkv, ln, GPT2_QKVW, l, N, C,
                         m->QKVl, acc));
#undef GB
    return 0;
}

/* The LM head (logits = lnf · headᵀ, head wte when tied, else lmhead) and
 * the final norm: dres gets the gradient of the last layer's output. A tied
 * head writes dwte first (the first stage's embedding adds to it when the two
 * are one rank). */
static int head_backward(struct model *m, struct model_slot *sl, int N, bool acc,
                         struct plait_error *err)
{
    const struct ops *o = m->ops;
    int C = m->cfg.hidden, R = rows_of(m, N);
    const float *lnf;
    float *dlnf;
    struct profile *pr = &m->prof;
    if (sp_gather(m, sl->lnf, N, &lnf, err)) return -1;
    PROF(pr, PROF_LM_HEAD_BWD,
         o->matmul_backward(m->ctx, m->dC, G(m->head, 0), NULL, sl->logits, lnf, P(m->head, 0),
                            weight16(m, m->head, 0), N, C, m->Vpl, acc));
    if (tp_sum_rows(m, m->dC, N, &dlnf, err)) return -1;
    o->zero(m->ctx, m->dres, (size_t)R * C * sizeof(float));
    PROF(pr, PROF_LAYERNORM_BWD,
         norm_backward(m, m->dres, dlnf, sl->layer[m->n_layers - 1].res3, GPT2_LNFW, GPT2_LNFB, 0,
                       sl->lnf_mean, sl->lnf_rstd, R, acc));
    return 0;
}

/* Tells the grads_final hook that the slot's local layer i's gradients (its
 * block in the buffer: chunk · n_layers + i), and those of every block above
 * and of the final LayerNorm, are final. */
static int layer_final(struct model *m, const struct model_slot *sl, int i, struct plait_error *err)
{
    size_t block = (size_t)sl->chunk * (size_t)m->n_layers + (size_t)i;
    size_t from = gpt2_shard_block_at(&m->shard, (int)block);
    return m->grads_final ? m->grads_final(m->grads_final_ctx, from, m->shard.total, err) : 0;
}

/* Whether this backward leaves the embedding's wte rows for later. */
static bool deferring(const struct model *m)
{
    return m->grads_final && m->defer_embedding && m->first && m->last && !m->cfg.untied;
}

/* ZeRO 3, the head's backward: its units held and their gradient windows
 * taken before (hold), or after it (!hold) the units dropped and their
 * gradients handed to the scatter (the tied wte's kept for the embedding's
 * rows when this slot embeds too). */
static int z3_head_backward(struct model *m, const struct model_slot *sl, bool hold,
                            struct plait_error *err)
{
    int last = mz3_last_unit(m);
    if (!m->z3) return 0;
    if (hold)
        return z3_head(m, true, err) || mz3_grad_take(m, last, err) ||
                       (tied_head(m) && mz3_grad_take(m, MZ3_EMBEDDINGS, err)) ||
                       z3_next(m, sl, m->n_layers, false, err)
                   ? -1
                   : 0;
    return z3_head(m, false, err) || mz3_grad_give(m, last, err) ||
                   (tied_head(m) && !embeds(m, sl) && mz3_grad_give(m, MZ3_EMBEDDINGS, err))
               ? -1
               : 0;
}

/* ZeRO 3, local layer i's backward: its unit held (layer i - 1's started)
 * and a gradient window taken before (hold), or after it dropped and its
 * gradient handed to the scatter. */
static int z3_layer_backward(struct model *m, const struct model_slot *sl, int i, bool hold,
                             struct plait_error *err)
{
    int u = z3_unit(m, sl, i);
    if (!m->z3) return 0;
    if (hold)
        return z3_next(m, sl, i, false, err) || hold_unit(m, u, err) || mz3_grad_take(m, u, err) ? -1
                                                                                                : 0;
    return mz3_drop(m, u, err) || mz3_grad_give(m, u, err) ? -1 : 0;
}

static int stage_backward(struct model *m, int slot, const float *grad_out, int B, int T, bool acc,
                          enum bwd_pass pass, struct plait_error *err)
{
    const struct ops *o = m->ops;
    int C = m->cfg.hidden, N = B * T;
    struct model_slot *sl = &m->slots[slot];
    if (pass == BWD_INPUT && !m->split_backward)
        return error_set(err, "model: a split backward on a model built without it");
    acc = acc || m->z3; /* ZeRO 3: into zeroed gradient windows */
    if (heads(m, sl)) {
        if (z3_head_backward(m, sl, true, err) || head_backward(m, sl, N, acc, err) ||
            z3_head_backward(m, sl, false, err))
            return -1;
        size_t wte = gpt2_shard_offset(&m->shard, GPT2_WTE, 0);
        if (deferring(m) &&
            m->grads_final(m->grads_final_ctx, wte, wte + m->shard.elems[GPT2_WTE], err))
            return -1;
    } else {
        o->copy(m->ctx, m->dres, grad_out, model_stage_floats(m, B, T) * sizeof(float));
    }
    for (int i = m->n_layers - 1; i >= 0; i--)
        if (z3_layer_backward(m, sl, i, true, err) ||
            layer_backward(m, sl, i, B, T, acc, pass, err) ||
            z3_layer_backward(m, sl, i, false, err) ||
            (pass == BWD_ALL && layer_final(m, sl, i, err)))
            return -1;
    if (embeds(m, sl) && mz3_grad_take(m, MZ3_EMBEDDINGS, err)) return -1;
    if (embeds(m, sl)) {
        /* the embedding: with the tied head on this rank too it adds to dwte, else it
         * writes; sequence parallel, from the gathered rows (dwpe is then whole on every
         * rank) */
        bool acc_wte = acc || (m->last && !m->cfg.untied);
        const float *demb;
        struct profile *pr = &m->prof;
        if (sp_gather(m, m->dres, N, &demb, err)) return -1;
        if (!acc_wte) o->zero(m->ctx, G(GPT2_WTE, 0), m->shard.elems[GPT2_WTE] * sizeof(float));
        bool defer = deferring(m); /* wpe's part now, wte's once wte is summed */
        m->deferred_slot = defer ? slot : -1;
        float *dwte = defer ? NULL : G(GPT2_WTE, 0), *dwpe = held(m, GRADS, GPT2_WPE, 0);
        if (m->cp > 1)
            PROF(pr, PROF_EMBED_BWD,
                 ring_encoder_backward(m, dwte, dwpe, demb, sl->tokens, B, T, acc));
        else
            PROF(pr, PROF_EMBED_BWD,
                 o->encoder_backward(m->ctx, dwte, m->v0, m->Vpl, dwpe, demb, sl->tokens, B, T, C,
                                     acc));
        if (mz3_grad_give(m, MZ3_EMBEDDINGS, err)) return -1;
    }
    if (mz3_grad_settle(m, 0, err)) return -1;
    return check_ops(m, "backward", err);
}

int model_deferred_rows(struct model *m, int B, int T, const float **rows, const int32_t **tokens,
                        struct plait_error *err)
{
    if (m->deferred_slot < 0) return error_set(err, "model: no embedding rows were deferred");
    *tokens = m->slots[m->deferred_slot].tokens;
    m->deferred_slot = -1;
    return sp_gather(m, m->dres, B * T, rows, err);
}

void model_add_embedding_rows(struct model *m, const float *rows, const int32_t *tokens, int B,
                              int T)
{
    PROF(&m->prof, PROF_EMBED_BWD,
         m->ops->encoder_backward(m->ctx, G(GPT2_WTE, 0), m->v0, m->Vpl, NULL, rows, tokens, B, T,
                                  m->cfg.hidden, true));
}

int model_stage_backward(struct model *m, int slot, const float *grad_out, int B, int T, bool acc,
                         struct plait_error *err)
{
    return stage_backward(m, slot, grad_out, B, T, acc, BWD_ALL, err);
}

int model_stage_backward_input(struct model *m, int slot, const float *grad_out, int B, int T,
                               bool acc, struct plait_error *err)
{
    return stage_backward(m, slot, grad_out, B, T, acc, BWD_INPUT, err);
}

int model_stage_backward_weights(struct model *m, int slot, int B, int T, bool acc,
                                 struct plait_error *err)
{
    if (!m->split_backward)
        return error_set(err, "model: a split backward on a model built without it");
    acc = acc || m->z3; /* ZeRO 3: into zeroed gradient windows */
    for (int i = m->n_layers - 1; i >= 0; i--)
        if (z3_layer_backward(m, &m->slots[slot], i, true, err) ||
            layer_weights(m, &m->slots[slot], i, B, T, acc, err) ||
            z3_layer_backward(m, &m->slots[slot], i, false, err) ||
            layer_final(m, &m->slots[slot], i, err))
            return -1;
    if (mz3_grad_settle(m, 0, err)) return -1;
    return check_ops(m, "backward (weight gradients)", err);
}

int model_backward(struct model *m, int B, int T, bool acc, struct plait_error *err)
{
    return model_stage_backward(m, 0, NULL, B, T, acc, err);
}

/* The LayerNorm tensors' instances in the shard, (offset, elements) pairs. */
struct ln_list {
    size_t (*at)[2];
    int n;
};

static int ln_instance(void *ctx, enum gpt2_tensor t, int layer, size_t off, size_t n)
{
    (void)layer;
    struct ln_list *l = ctx;
    if (t == GPT2_LN1W || t == GPT2_LN1B || t == GPT2_LN2W || t == GPT2_LN2B || t == GPT2_LNFW ||
        t == GPT2_LNFB) {
        l->at[l->n][0] = off;
        l->at[l->n++][1] = n;
    }
    return 0;
}

static int by_offset(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return (x > y) - (x < y);
}

int model_sum_layernorm_grads(struct model *m, struct plait_error *err)
{
    return model_sum_layernorm_grads_in(m, m->grads, 0, m->shard.total, err);
}

/* One all-reduce for each run of adjacent instances in the buffer (a layer's
 * weight and bias lie together), cut to [lo, lo + n). */
int model_sum_layernorm_grads_in(struct model *m, float *buf, size_t lo, size_t n,
                                 struct plait_error *err)
{
    if (!m->sp) return 0;
    struct ln_list l = {malloc((4 * (size_t)gpt2_shard_layers(&m->shard) + 2) * sizeof *l.at), 0};
    if (!l.at) return error_set(err, "out of memory");
    gpt2_shard_each(&m->shard, ln_instance, &l);
    qsort(l.at, (size_t)l.n, sizeof *l.at, by_offset);
    int rc = 0;
    for (int i = 0; i < l.n && rc == 0;) {
        size_t off = l.at[i][0], run = 0;
        for (; i < l.n && l.at[i][0] == off + run; i++) run += l.at[i][1];
        size_t a = off > lo ? off : lo, b = off + run < lo + n ? off + run : lo + n;
        if (b > a) rc = tp_reduce(m, buf + (a - lo), b - a, false, err);
    }
    free(l.at);
    return rc ? error_prefix(err, "the LayerNorms' gradients: ") : 0;
}
