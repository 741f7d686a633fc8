/* model.c — a model's memory: the settings and checks of model_init, its
 * buffers allocated as common/gpt2/gpt2_memory.c counts them and pointed into
 * the slots and layers (each lane's copies too), model_free, and the parameters
 * and AdamW moments in and out with their bf16 copy. The passes are
 * model_forward.c's and model_backward.c's; the fp8 copy is model_weights.c's. */
#include "runtime/model.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/gpt2/gpt2_memory.h"
#include "runtime/host_step.h"
#include "runtime/model_moe.h"
#include "runtime/model_scratch.h" // defines: model_reserve_scratch
#include "runtime/model_weights.h" // defines: model_fp8_layout
#include "runtime/model_zero3.h"
#include "runtime/ring_attention.h"

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
#define LAYER(a, f) [a] = {IN_LAYER, offsetof(struct layer_acts, f), 0}
/* a struct act: its f32 field, and its bf16 one (gpt2_act16) */
#define LAYER16(a, f)                                                                              \
    [a] = {IN_LAYER, offsetof(struct layer_acts, f.f32), offsetof(struct layer_acts, f.bf16)}
#define SLOT16(a, f)                                                                               \
    [a] = {IN_SLOT, offsetof(struct model_slot, f.f32), offsetof(struct model_slot, f.bf16)}
#define MOE(a, f) [a] = {IN_MOE, offsetof(struct moe_acts, f), 0}
#define SLOT(a, f) [a] = {IN_SLOT, offsetof(struct model_slot, f), 0}
#define MODEL(a, f) [a] = {IN_MODEL, offsetof(struct model, f), 0}
static const struct {
    enum act_home home;
    size_t field;
    size_t field16; /* a struct act's bf16 pointer (elem_bytes 2), else 0 */
} act_field[GPT2_ACTS] = {
    LAYER16(GPT2_ACT_LN1, ln1),
    LAYER(GPT2_ACT_LN1_MEAN, ln1_mean),
    LAYER(GPT2_ACT_LN1_RSTD, ln1_rstd),
    LAYER(GPT2_ACT_QKV, qkv),
    LAYER(GPT2_ACT_ATTY, atty),
    LAYER(GPT2_ACT_ATT, att),
    LAYER(GPT2_ACT_RES2, res2),
    LAYER16(GPT2_ACT_LN2, ln2),
    LAYER(GPT2_ACT_LN2_MEAN, ln2_mean),
    LAYER(GPT2_ACT_LN2_RSTD, ln2_rstd),
    LAYER(GPT2_ACT_FCH, fch),
    LAYER16(GPT2_ACT_FCH_GELU, fch_gelu),
    LAYER(GPT2_ACT_RES3, res3),
    LAYER(GPT2_ACT_G_FCPROJ, g_fcproj),
    LAYER(GPT2_ACT_G_FC, g_fc),
    LAYER(GPT2_ACT_G_ATTPROJ, g_attproj),
    LAYER(GPT2_ACT_G_QKV, g_qkv),
    SLOT(GPT2_ACT_INPUT, input),
    SLOT(GPT2_ACT_TOKENS, tokens),
    SLOT(GPT2_ACT_TARGETS, targets),
    SLOT16(GPT2_ACT_LNF, lnf),
    SLOT(GPT2_ACT_LNF_MEAN, lnf_mean),
    SLOT(GPT2_ACT_LNF_RSTD, lnf_rstd),
    SLOT(GPT2_ACT_LOGITS, logits),
    SLOT(GPT2_ACT_DLNF, dlnf),
    SLOT(GPT2_ACT_DHEAD, dhead),
    MODEL(GPT2_ACT_PROJ, proj),
    MODEL(GPT2_ACT_LOSSES, losses),
    MODEL(GPT2_ACT_CE_STATS, ce_stats),
    [GPT2_ACT_DLOGITS16] = {IN_MODEL, offsetof(struct model, dlogits16),
                            offsetof(struct model, dlogits16)},
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
#undef LAYER16
#undef SLOT
#undef SLOT16
#undef MODEL

/* Points the pointer field at `field` bytes into obj at p (every field in
 * act_field is a pointer to float, uint16_t or int32_t). */
static void point(void *obj, size_t field, void *p)
{
    memcpy((char *)obj + field, &p, sizeof p);
}

/* Points buffer a's fields at base, copies of `bytes` each: the model's; every slot's,
 * or every slot's in each of its layers or MoE layers: one copy each where the buffer
 * holds more than a lane's one, else all at base. */
static void point_buffer(struct model *m, enum gpt2_act a, char *base, size_t bytes)
{
    const struct gpt2_buffer *b = &m->mem.act[a];
    bool each = b->copies / b->lanes > 1;
    size_t field = b->elem_bytes == 2 ? act_field[a].field16 : act_field[a].field,
           L = (size_t)m->n_layers, Lm = (size_t)m->n_moe;
    for (size_t s = 0; s < (size_t)m->n_slots; s++) {
        if (act_field[a].home == IN_SLOT) point(&m->slots[s], field, base + (each ? s * bytes : 0));
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

/* Whether the backend keeps activations in bf16 (kernels/ops.h: every op but the optional). */
static bool has_act16_ops(const struct ops *o)
{
    return o->layernorm_forward16 && o->rmsnorm_forward16 && o->gelu_forward16 &&
           o->swiglu_forward16 && o->matmul_forward16 && o->matmul_backward16 && o->classifier16 &&
           o->classifier_finish16 && o->matmul_backward_dout16;
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
                                   .host_step = shape->host_step,
                                   .logits_chunk_mb = shape->logits_chunk_mb,
                                   .act16 = !shape->activations_f32 && has_act16_ops(m->ops) &&
                                            gpt2_act16(&m->cfg, shape->precision),
                                   .moe_lanes = shape->ep_lane_group != NULL};
    m->mem_shape = ms;
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
    m->logits_rows = (int)m->mem.logits_rows;
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
    if (!(m->offload = malloc(sizeof *m->offload))) return false;
    offload_init(m->offload);
    size_t bytes = m->mem.offload_window * sizeof(float);
    for (int b = 0; b < 2; b++)
        for (int k = 0; k < 2; k++)
            if (!(m->offload->buf[b][k] = dev_alloc(m, bytes, &m->allocated.optimizer)))
                return false;
    return true;
}

/* A GPU rank's offloaded step (runtime/host_step.h): its host memory, which must be what
 * gpt2_memory counts as host, and the moments in it ("host") or in files through its
 * windows ("nvme"). */
static int open_host_step(struct model *m, const struct model_shape *shape, struct plait_error *err)
{
    if (!(m->offload = malloc(sizeof *m->offload))) return error_set(err, "out of memory");
    offload_init(m->offload);
    if (!(m->host_step = calloc(1, sizeof *m->host_step))) return error_set(err, "out of memory");
    size_t window = gpt2_offload_window(shape->offload_window_mb, m->slice_n);
    if (host_step_open(m->host_step, m->ops, m->ctx, m->slice_n, window, m->mem.offload_window > 0,
                       err)) {
        free(m->host_step);
        m->host_step = NULL;
        return -1;
    }
    if (m->host_step->bytes != m->mem.host)
        return error_set(err,
                         "model: %llu bytes of host memory for the optimizer step; "
                         "common/gpt2/gpt2_memory.c counts %llu (a bug: the two must agree)",
                         (unsigned long long)m->host_step->bytes, (unsigned long long)m->mem.host);
    host_step_moments(m->host_step, m->offload);
    if (m->mem.offload_window)
        return offload_open(m->offload, shape->offload_dir, shape->offload_rank, m->slice_n,
                            m->mem.offload_window, err);
    return 0;
}

static bool allocate_zero3(struct model *m);
static bool allocate_rest(struct model *m);

/* The AdamW moments of the slice: beside the weights, or (nvme offload) in
 * files with two windows of each in memory. */
static bool allocate_moments(struct model *m)
{
    size_t S = m->slice_n;
    uint64_t *kind = &m->allocated.optimizer;
    if (m->mem.host) return true; /* a GPU rank's step on the CPU: open_host_step's */
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
              (m->grads = dev_alloc(m, Pp * sizeof(float), &a->grads)) && allocate_moments(m) &&
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
        model_fp8_layout(m);
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
    if (shape->host_step
            ? open_host_step(m, shape, err)
            : m->offload && offload_open(m->offload, shape->offload_dir, shape->offload_rank,
                                         m->slice_n, m->mem.offload_window, err)) {
        model_free(m);
        return -1;
    }
    if ((m->zero == 3 && mz3_init(m, shape->dp_group, err)) || (m->cp > 1 && ring_init(m, err)) ||
        moe_init(m, err) || moe_ep_lanes_init(m, err) || model_reserve_scratch(m, err)) {
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
    if (m->host_step) host_step_close(m->host_step); /* after the offload's thread stopped */
    free(m->host_step);
    m->host_step = NULL;
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
