/* gpt2_memory.c — the byte accounting of gpt2_memory.h: which buffers a rank
 * of a GPT-2 holds, how large and how many, and their sum by kind. Pure
 * arithmetic, every product checked; allocating them is runtime/model.c's. */
#include "common/gpt2/gpt2_memory.h"

#include <math.h>
#include <string.h>

#include "common/checked.h"

/* Per-layer buffers kept for backward under each recompute policy. */
static bool layer_kept(enum gpt2_act a, enum plan_recompute recompute)
{
    switch (a) {
    case GPT2_ACT_RES3:
    case GPT2_ACT_G_FCPROJ:
    case GPT2_ACT_G_FC:
    case GPT2_ACT_G_ATTPROJ:
    case GPT2_ACT_G_QKV:
        return true;
    case GPT2_ACT_ATT:
    case GPT2_ACT_FCH_GELU:
        return recompute == PLAN_RECOMPUTE_NONE;
    default:
        return recompute != PLAN_RECOMPUTE_FULL;
    }
}

/* Whether a pass keeps buffer a, one copy every slot shares, across an MoE block's
 * exchange, where the other lane of a pair may write it meanwhile: the exchange's rows
 * (MOE_EP, MOE_DY) and sequence parallelism's gathered ones (WHOLE); the layer's buffers
 * the recompute policy does not keep (a backward reruns them before the block's backward
 * and reads them after it; a forward reads ln2 and res2 after its block), but for a dense
 * MLP's, whose layer exchanges nothing; with full recompute the block's own. */
static bool kept_across_exchange(enum gpt2_act a, enum plan_recompute recompute)
{
    if (a == GPT2_ACT_MOE_EP || a == GPT2_ACT_MOE_DY || a == GPT2_ACT_WHOLE) return true;
    if (a < GPT2_ACT_FIRST_SLOT)
        return !layer_kept(a, recompute) && a != GPT2_ACT_FCH && a != GPT2_ACT_FCH_GELU;
    return a >= GPT2_ACT_FIRST_MOE && a < GPT2_ACT_FIRST_MOE_SCRATCH &&
           recompute == PLAN_RECOMPUTE_FULL;
}

/* Whether a per-micro-batch buffer is held on this stage. */
static bool slot_held(enum gpt2_act a, const struct gpt2_shard *s)
{
    if (a == GPT2_ACT_INPUT) return true;
    if (a == GPT2_ACT_TOKENS) return s->first;
    return s->last;
}

int gpt2_chunk_moe_layers(const struct gpt2_shard *s)
{
    int n = s->part.layer_end - s->part.layer_begin, most = 0;
    for (int c = 0; c < s->part.chunks; c++) {
        int l0 = gpt2_shard_layer(s, c * n);
        int here = gpt2_moe_layers_before(&s->cfg, l0 + n) - gpt2_moe_layers_before(&s->cfg, l0);
        most = here > most ? here : most;
    }
    return most;
}

/* Elements of one copy of a mixture of experts' buffer a (gpt2_memory.h) for B sequences
 * of N tokens in all, the experts' widths split over tp, their rows from every ep rank. */
static bool moe_buffer_elems(enum gpt2_act a, const struct gpt2_shard *sh, long long B, long long N,
                             size_t *out)
{
    const struct gpt2_config *cfg = &sh->cfg;
    long long tp = sh->part.tp, ep = sh->part.ep > 1 ? sh->part.ep : 1;
    long long E = cfg->experts, k = cfg->top_k, C = cfg->hidden, Fm = cfg->moe_ffn / tp;
    long long FCm = gpt2_expert_fc_rows(cfg) / tp, S = cfg->shared_experts;
    long long R = ep * k, rows = R * N > N ? R * N : N; /* the local experts' rows: R·N */
    switch (a) {
    case GPT2_ACT_MOE_PROBS:
    case GPT2_ACT_MOE_LOGITS:
        return ck_size(out, N, E);
    case GPT2_ACT_MOE_GATE:
    case GPT2_ACT_MOE_CHOICE:
    case GPT2_ACT_MOE_POS:
    case GPT2_ACT_MOE_ROWS:
    case GPT2_ACT_MOE_DGATE:
        return ck_size(out, N, k);
    case GPT2_ACT_MOE_LSE:
        return ck_size(out, N);
    case GPT2_ACT_MOE_COUNTS:
        return ck_size(out, ep > 1 ? 3 : 2, E);
    case GPT2_ACT_MOE_Y:
        return ck_size(out, k, N, C);
    case GPT2_ACT_MOE_X:
    case GPT2_ACT_MOE_DY:
        return ck_size(out, R, N, C);
    case GPT2_ACT_MOE_EP:
        return ck_size(out, k + R, N, C);
    case GPT2_ACT_MOE_LN:
        return ck_size(out, N, C);
    case GPT2_ACT_MOE_BEFORE: /* a rank's two chunks of each sequence */
        return ck_size(out, 2 * B, E);
    case GPT2_ACT_MOE_H:
        return ck_size(out, R, N, FCm);
    case GPT2_ACT_MOE_ACT:
        return ck_size(out, R, N, Fm);
    case GPT2_ACT_MOE_SH_H:
        return ck_size(out, S, N, FCm);
    case GPT2_ACT_MOE_SH_ACT:
        return ck_size(out, S, N, Fm);
    case GPT2_ACT_MOE_DH:
        return ck_size(out, rows, FCm);
    default: /* GPT2_ACT_MOE_DACT */
        return ck_size(out, rows, Fm);
    }
}

/* How many copies of a mixture of experts' buffer a the rank holds: none without
 * an MoE layer, the scratch once, the rest per held micro-batch and MoE layer of a
 * chunk (one shared with full recompute). */
static size_t moe_buffer_copies(enum gpt2_act a, const struct gpt2_shard *s,
                                const struct gpt2_memory_shape *shape)
{
    size_t layers = (size_t)gpt2_chunk_moe_layers(s);
    bool shared = a == GPT2_ACT_MOE_SH_H || a == GPT2_ACT_MOE_SH_ACT;
    if (!layers || (shared && !s->cfg.shared_experts)) return 0;
    if (a == GPT2_ACT_MOE_LN) return shape->sequence_parallel;
    if (a == GPT2_ACT_MOE_EP) return s->part.ep > 1;
    if (a == GPT2_ACT_MOE_BEFORE) return shape->cp > 1;
    if (a >= GPT2_ACT_FIRST_MOE_SCRATCH) return 1;
    return shape->recompute == PLAN_RECOMPUTE_FULL ? 1 : (size_t)shape->slots * layers;
}

bool gpt2_act16(const struct gpt2_config *cfg, enum plan_precision precision)
{
    return precision == PLAN_PRECISION_BF16 && cfg->experts == 0;
}

bool gpt2_act_is16(enum gpt2_act a)
{
    return a == GPT2_ACT_LN1 || a == GPT2_ACT_LN2 || a == GPT2_ACT_LNF || a == GPT2_ACT_FCH_GELU ||
           a == GPT2_ACT_DLOGITS16;
}

size_t gpt2_logits_rows(const struct gpt2_shard *s, const struct gpt2_memory_shape *shape)
{
    if (!s->last || !(shape->logits_chunk_mb > 0)) return 0;
    double Vpt = (double)(s->cfg.padded_vocab / s->part.tp), C = s->cfg.hidden;
    double N = (double)shape->B * shape->T, slots = shape->slots;
    double rows = floor(shape->logits_chunk_mb * 1048576.0 / (Vpt * sizeof(float)));
    if (rows < 1) rows = 1;
    if (rows >= N) return 0;
    /* (in floats; with bf16 activations a chunk's dlogits in bf16 beside its logits) */
    double whole = slots * N * Vpt,
           chunked = slots * (Vpt + N) * C + rows * Vpt * (shape->act16 ? 1.5 : 1);
    return chunked < whole ? (size_t)rows : 0;
}

/* Elements of one copy of buffer a; rows_div: tp with sequence parallelism
 * (the residual stream's buffers hold N/tp rows), else 1; logits_rows:
 * gpt2_logits_rows's. */
static bool buffer_elems(enum gpt2_act a, const struct gpt2_shard *s, long long B, long long T,
                         long long rows_div, bool fused_attention, long long cp,
                         long long logits_rows, size_t *out)
{
    const struct gpt2_config *cfg = &s->cfg;
    if (a >= GPT2_ACT_FIRST_MOE) return moe_buffer_elems(a, s, B, B * T, out);
    long long tp = s->part.tp, C = cfg->hidden, Ct = C / tp, NHt = cfg->heads / tp;
    long long Vpt = cfg->padded_vocab / tp, QKVt = gpt2_qkv_rows(cfg) / tp;
    long long FCt = gpt2_fc_rows(cfg) / tp, Ft = gpt2_ffn(cfg) / tp;
    size_t N;
    switch (a) {
    case GPT2_ACT_LN1_MEAN:
    case GPT2_ACT_LN1_RSTD:
    case GPT2_ACT_LN2_MEAN:
    case GPT2_ACT_LN2_RSTD:
    case GPT2_ACT_LNF_MEAN:
    case GPT2_ACT_LNF_RSTD:
        return ck_size(&N, B, T) && ck_size(out, (long long)(N / (size_t)rows_div));
    case GPT2_ACT_LN1:
    case GPT2_ACT_RES2:
    case GPT2_ACT_LN2:
    case GPT2_ACT_RES3:
    case GPT2_ACT_INPUT:
    case GPT2_ACT_LNF:
    case GPT2_ACT_DRES:
    case GPT2_ACT_GRAD_IN:
        return ck_size(&N, B, T) && ck_size(out, (long long)(N / (size_t)rows_div), C);
    case GPT2_ACT_TOKENS:
    case GPT2_ACT_TARGETS:
    case GPT2_ACT_LOSSES:
        return ck_size(out, B, T);
    case GPT2_ACT_CE_STATS:
        return ck_size(out, 3, B, T);
    case GPT2_ACT_QKV:
    case GPT2_ACT_D3C:
        return ck_size(out, B, T, 3, Ct);
    case GPT2_ACT_G_QKV:
    case GPT2_ACT_QKV_PACKED:
        return ck_size(out, B, T, QKVt);
    case GPT2_ACT_ATTY:
        return ck_size(out, B, T, Ct);
    case GPT2_ACT_FCH:
    case GPT2_ACT_D4C:
    case GPT2_ACT_G_FC:
        return ck_size(out, B, T, FCt);
    case GPT2_ACT_FCH_GELU:
    case GPT2_ACT_DFF:
        return ck_size(out, B, T, Ft);
    case GPT2_ACT_ATT:
    case GPT2_ACT_DATT:
        return fused_attention ? ck_size(out, B, NHt, T) : ck_size(out, B, NHt, T, T);
    case GPT2_ACT_LOGITS:
        return logits_rows ? ck_size(out, logits_rows, Vpt) : ck_size(out, B, T, Vpt);
    case GPT2_ACT_DLOGITS16:
        return ck_size(out, logits_rows, Vpt);
    case GPT2_ACT_DHEAD:
        return ck_size(out, Vpt, C);
    case GPT2_ACT_CP_RING:
        return ck_size(out, B, T, 2, Ct);
    case GPT2_ACT_CP_SCORES: /* kernels/ops.h ATTENTION_BLOCK_SCRATCH */
        return ck_size(out, B, NHt, T, 2 * T + C / cfg->heads + 2);
    case GPT2_ACT_CP_POS:
        return ck_size(out, cp, T);
    default: /* the (N,C) ones */
        return ck_size(out, B, T, C);
    }
}

/* How many copies of buffer a one lane holds; chunked: the logits in chunks
 * (gpt2_logits_rows > 0). */
static size_t buffer_copies(enum gpt2_act a, const struct gpt2_shard *s,
                            const struct gpt2_memory_shape *shape, size_t slot_layers, bool chunked)
{
    size_t slots = (size_t)shape->slots;
    if (a >= GPT2_ACT_FIRST_MOE) return moe_buffer_copies(a, s, shape);
    bool mlp = a == GPT2_ACT_FCH || a == GPT2_ACT_FCH_GELU || a == GPT2_ACT_D4C ||
               a == GPT2_ACT_DFF || a == GPT2_ACT_G_FC || a == GPT2_ACT_G_FCPROJ;
    if (mlp && !gpt2_shard_holds(s, GPT2_FCW)) return 0; /* every layer an MoE block */
    bool split_only = a >= GPT2_ACT_G_FCPROJ && a <= GPT2_ACT_G_QKV;
    if (split_only && !shape->split_backward) return 0;
    bool mean = a == GPT2_ACT_LN1_MEAN || a == GPT2_ACT_LN2_MEAN || a == GPT2_ACT_LNF_MEAN;
    if (mean && s->cfg.llama) return 0; /* RMSNorm keeps no mean */
    if (a == GPT2_ACT_QKV_PACKED) return gpt2_kv_heads(&s->cfg) != s->cfg.heads;
    if (a == GPT2_ACT_DFF) return s->cfg.llama;
    if (a < GPT2_ACT_FIRST_SLOT) return layer_kept(a, shape->recompute) ? slots * slot_layers : 1;
    if (a == GPT2_ACT_DLNF || a == GPT2_ACT_DHEAD) return chunked ? slots : 0;
    if (a == GPT2_ACT_LOGITS && chunked) return 1;
    if (a < GPT2_ACT_FIRST_SCRATCH) return slot_held(a, s) ? slots : 0;
    if (a == GPT2_ACT_CE_STATS) return s->part.tp > 1;
    if (a == GPT2_ACT_DLOGITS16) return chunked && shape->act16;
    if (a == GPT2_ACT_WHOLE) return shape->sequence_parallel;
    bool ring = shape->cp > 1;
    if (a == GPT2_ACT_CP_RING) return ring ? 5 : 0;
    if (a == GPT2_ACT_CP_POS) return ring;
    if (a == GPT2_ACT_CP_SCORES) return ring && !shape->fused_attention; /* (a GPU's in tiles) */
    if (a == GPT2_ACT_DATT) return !shape->fused_attention && !ring;
    if (a == GPT2_ACT_GRAD_IN) return s->part.pp > 1 && (!s->last || s->part.chunks > 1);
    return 1;
}

/* The fp8 copy of the held layers' product weights (gpt2_memory.h): *elems
 * codes and *scales scales, false on overflow. */
static bool fp8_copy(const struct gpt2_shard *s, enum plan_fp8_scaling scaling, size_t layers,
                     size_t *elems, size_t *scales)
{
    long long C = s->cfg.hidden, tp = s->part.tp, Ct = C / tp, b = GPT2_FP8_BLOCK;
    long long QKVt = gpt2_qkv_rows(&s->cfg) / tp, FCt = gpt2_fc_rows(&s->cfg) / tp;
    long long Ft = gpt2_ffn(&s->cfg) / tp;
    /* (OC, C) of qkvw, attprojw, fcw, fcprojw: column, row, column, row shards */
    const long long shape[4][2] = {{QKVt, C}, {C, Ct}, {FCt, C}, {C, Ft}};
    size_t codes = 0, n_scales = 0, n, k_scales;
    bool ok = true;
    for (int k = 0; ok && k < 4; k++) {
        long long r = shape[k][0], c = shape[k][1];
        k_scales =
            scaling == PLAN_FP8_BLOCK ? (size_t)((r + b - 1) / b) * (size_t)((c + b - 1) / b) : 1;
        ok = ck_size(&n, r, c) && ck_add(codes, n, &codes) && ck_add(n_scales, k_scales, &n_scales);
    }
    return ok && ck_mul(layers, codes, elems) && ck_mul(layers, n_scales, scales);
}

/* bytes += n·width, false on overflow */
static bool add_bytes(uint64_t *bytes, size_t n, size_t width)
{
    size_t b;
    return ck_mul(n, width, &b) && !__builtin_add_overflow(*bytes, (uint64_t)b, bytes);
}

size_t gpt2_offload_window(double window_mb, size_t S)
{
    double w = window_mb * 1048576.0 / sizeof(float);
    size_t floats = w < 1 ? 1 : w > (double)S ? S : (size_t)w;
    return floats ? floats : 1;
}

/* ZeRO 3's model state: the slice's weights and gradient, the parameter
 * windows (every layer's when kept gathered, else two) and the gradient
 * windows with their staging; false on overflow. */
static bool zero3_windows(const struct gpt2_shard *s, bool keep_gathered, bool bf16,
                          struct gpt2_memory *out)
{
    size_t S = out->slice, caps[GPT2_ZERO3_GRAD_WINDOWS];
    int layers = keep_gathered ? gpt2_shard_layers(s) : 2;
    out->zero3_params = gpt2_zero3_windows(s, out->padded, layers);
    out->zero3_grads = gpt2_zero3_windows(s, out->padded, 2);
    /* the slice's weights (in bf16 with the bf16 copy the layers are gathered from) */
    bool ok = add_bytes(&out->params, S, bf16 ? 6 : 4) && add_bytes(&out->grads, S, 4);
    struct gpt2_zero3_windows p = out->zero3_params;
    size_t param_elems, layer_elems;
    ok = ok && ck_mul(p.layer, (size_t)p.layers, &layer_elems) &&
         ck_add(p.first, p.last, &param_elems) && ck_add(param_elems, layer_elems, &param_elems) &&
         add_bytes(&out->params, param_elems, bf16 ? 6 : 4);
    int n = gpt2_zero3_caps(out->zero3_grads, caps);
    for (int i = 0; ok && i < n; i++) /* + each one's staging */
        ok = add_bytes(&out->grads, caps[i], 4) &&
             add_bytes(&out->grads, caps[i] < S ? caps[i] : S, 4);
    return ok;
}

int gpt2_memory(const struct gpt2_shard *s, const struct gpt2_memory_shape *shape,
                struct gpt2_memory *out, struct plait_error *err)
{
    const struct gpt2_memory_shape *h = shape;
    memset(out, 0, sizeof *out);
    if (h->B < 1 || h->T < 1 || h->slots < 1 || h->chunks < 1 || h->dp < 1 || h->zero < 0 ||
        h->zero > 3)
        return error_set(err,
                         "memory of a micro-batch %d×%d, %d held at once in %d chunk(s), over "
                         "dp %d with ZeRO %d: out of range",
                         h->B, h->T, h->slots, h->chunks, h->dp, h->zero);
    long long rows_div = h->sequence_parallel ? s->part.tp : 1;
    if (h->sequence_parallel && (s->part.tp < 2 || (long long)h->B * h->T % rows_div))
        return error_set(err,
                         "parallel.sequence_parallel: batch.micro_batch %d × model.seq_len %d = "
                         "%lld rows do not split evenly over parallel.tp %d",
                         h->B, h->T, (long long)h->B * h->T, s->part.tp);
    size_t layers = (size_t)gpt2_shard_layers(s);
    size_t slot_layers = (layers + (size_t)h->chunks - 1) / (size_t)h->chunks;

    /* the model state */
    size_t P = s->total, dp = (size_t)h->dp, S;
    out->zero = h->dp > 1 ? h->zero : 0;
    bool ok = ck_add(P, dp - 1, &out->padded);
    out->padded = out->padded / dp * dp;
    out->slice = S = out->zero ? out->padded / dp : P;
    bool bf16 = h->precision == PLAN_PRECISION_BF16;
    if (out->zero == 3) { /* the slice, and windows the units are gathered into */
        ok = ok && zero3_windows(s, h->keep_gathered, bf16, out);
    } else {
        size_t Pp = out->padded;
        ok = ok && add_bytes(&out->params, Pp, 4) && add_bytes(&out->params, bf16 ? Pp : 0, 2) &&
             add_bytes(&out->grads, Pp, 4) && add_bytes(&out->grads, out->zero ? S : 0, 4) &&
             add_bytes(&out->optimizer, out->zero ? S : 0, 4);
    }
    /* the moments: beside the weights, or on disk with two windows of each in memory; a
     * GPU rank's step on the CPU keeps them (or their windows) in host memory with the
     * slice's master weights and gradient */
    out->offload_window =
        h->offload_window_mb > 0 ? gpt2_offload_window(h->offload_window_mb, S) : 0;
    uint64_t *moments = h->host_step ? &out->host : &out->optimizer;
    ok = ok && (out->offload_window
                    ? add_bytes(moments, out->offload_window, 16) && add_bytes(&out->disk, S, 8)
                    : add_bytes(moments, S, 8));
    ok = ok && (!h->host_step || add_bytes(&out->host, S, 8));
    if (ok && h->precision == PLAN_PRECISION_FP8) {
        out->lm_head16 = s->last ? s->elems[s->cfg.untied ? GPT2_LMHEAD : GPT2_WTE] : 0;
        /* ZeRO 3: a copy in each layer window, made as the layer is gathered */
        size_t blocks =
            out->zero == 3 ? (size_t)gpt2_zero3_layer_windows(out->zero3_params) : layers;
        ok = fp8_copy(s, h->fp8_scaling, blocks, &out->fp8_elems, &out->fp8_scales) &&
             add_bytes(&out->params, out->fp8_elems, 1) &&
             add_bytes(&out->params, out->fp8_scales, 4) &&
             add_bytes(&out->params, out->lm_head16, 2);
    }

    /* the activations and scratch */
    out->logits_rows = gpt2_logits_rows(s, h);
    for (int a = 0; ok && a < GPT2_ACTS; a++) {
        struct gpt2_buffer *b = &out->act[a];
        b->elem_bytes = h->act16 && gpt2_act_is16(a) ? 2 : 4;
        b->copies = buffer_copies(a, s, h, slot_layers, out->logits_rows > 0);
        /* the second lane's copy of what a block keeps across its exchange, where a pair's
         * two lanes switch at its MoE blocks */
        b->lanes = b->copies && kept_across_exchange(a, h->recompute) && h->moe_lanes &&
                           gpt2_chunk_moe_layers(s)
                       ? 2
                       : 1;
        b->copies *= b->lanes;
        size_t n;
        /* the ring's block attention keeps each row's log-sum-exp, as a fused one */
        ok = buffer_elems(a, s, h->B, h->T, rows_div, h->fused_attention || h->cp > 1,
                          h->cp > 1 ? h->cp : 1, (long long)out->logits_rows, &b->elems) &&
             ck_mul(b->elems, b->copies, &n) && add_bytes(&out->activations, n, b->elem_bytes);
    }
    ok = ok && !__builtin_add_overflow(out->params, out->grads, &out->total) &&
         !__builtin_add_overflow(out->total, out->optimizer, &out->total) &&
         !__builtin_add_overflow(out->total, out->activations, &out->total) &&
         out->total <= SIZE_MAX;
    if (ok) return 0;
    return error_set(err,
                     "batch.micro_batch %d × model.seq_len %d (with model.heads %d, "
                     "model.hidden %d, model.padded_vocab %d, model.layers %d): the model's "
                     "buffers are too large to address",
                     h->B, h->T, s->cfg.heads, s->cfg.hidden, s->cfg.padded_vocab, s->cfg.layers);
}
