/* model_backward.c — the backward pass over one micro-batch: the recompute of
 * what a layer's forward did not keep, a layer's gradients (whole, or split
 * into the input-gradient and weight-gradient passes of zero-bubble schedules),
 * the head's and the embedding's, the grads_final hook as blocks become final,
 * and the embedding rows a backward defers. The forward is model_forward.c's. */
#include "runtime/model.h"

#include <stdint.h>

#include "runtime/model_forward.h"
#include "runtime/model_moe.h"
#include "runtime/model_tp.h"
#include "runtime/model_weights.h"
#include "runtime/model_zero3.h"
#include "runtime/model_zero3_pass.h"
#include "runtime/ring_attention.h"

/* ---- backward ------------------------------------------------------------------ */

/* Recomputes what the recompute policy did not keep for local layer i, or for a split
 * backward's weight pass (weights) what its products read: under full recompute an MoE
 * layer's attention alone (its MoE block's weight gradients came with its input gradient,
 * so the block, its routing and its all-to-alls do not run a third time); under selective
 * recompute the MLP's activation alone (the attention's probabilities feed no product's
 * weight gradient). */
static int layer_recompute(struct model *m, struct model_slot *sl, int i, int B, int T,
                           bool weights, struct plait_error *err)
{
    struct layer_acts *a = &sl->layer[i];
    bool moe = gpt2_layer_moe(&m->cfg, model_slot_layer(m, sl, i));
    if (m->recompute == PLAN_RECOMPUTE_FULL)
        return weights && moe ? model_layer_attention_forward(m, sl, i, B, T, err)
                              : model_layer_forward(m, sl, i, B, T, err);
    if (m->recompute == PLAN_RECOMPUTE_SELECTIVE) {
        if (!weights && model_attention_fwd(m, a, B, T, err)) return -1;
        if (!moe) model_act_forward(m, a, B * T);
    }
    return 0;
}

/* Reruns what the recompute policy did not keep for local layer i, timed as
 * recompute, not as forward. */
static int recompute_timed(struct model *m, struct model_slot *sl, int i, int B, int T,
                           bool weights, struct plait_error *err)
{
    struct profile *pr = &m->prof;
    double t0 = prof_clock(pr);
    pr->paused++;
    int rc = layer_recompute(m, sl, i, B, T, weights, err);
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

/* The gradient of the QKV product's output, from dout (N,C/tp), the
 * attention output's: into `into` (N,QKV/tp) through the attention; with
 * grouped-query attention through d3C, the repeated key/value heads summed
 * back; a Llama's rotary positions undone (with the sums in one op where the
 * backend fuses them, as the forward). */
static int qkv_backward(struct model *m, struct layer_acts *a, float *into, const float *dout,
                        int B, int T, struct plait_error *err)
{
    const struct ops *o = m->ops;
    struct profile *pr = &m->prof;
    float *dqkv = m->qkv_packed ? m->d3C : into;
    int rc;
    PROF(pr, PROF_ATTENTION_BWD, rc = attention_bwd(m, a, dqkv, dout, B, T, err));
    if (rc) return -1;
    if (m->qkv_packed && o->rope_kv_expand_backward) { /* one pass */
        if (m->cp > 1)
            PROF(pr, PROF_ATTENTION_BWD, ring_rope(m, into, dqkv, B, T, true));
        else
            PROF(pr, PROF_ATTENTION_BWD,
                 o->rope_kv_expand_backward(m->ctx, into, dqkv, B, T, m->NHl, m->KVl, m->hs,
                                            m->cfg.rope_theta, 0));
        return 0;
    }
    if (m->qkv_packed)
        PROF(pr, PROF_ATTENTION_BWD,
             o->kv_expand_backward(m->ctx, into, dqkv, B * T, m->NHl, m->KVl, m->hs));
    if (m->cfg.llama && m->cp > 1)
        PROF(pr, PROF_ATTENTION_BWD, ring_rope(m, into, NULL, B, T, true));
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
#define GW(t) (w ? model_held(m, GRADS, t, l) : NULL)

/* The dense MLP's backward from dout (N,C), its output's gradient: m->dC gets
 * the gradient of its input (this rank's term of it with tp), the weight
 * gradients written or added (with BWD_INPUT left for layer_weights). */
static int mlp_backward(struct model *m, struct layer_acts *a, int l, const float *dout, int N,
                        bool acc, enum bwd_pass pass, struct plait_error *err)
{
    int C = m->cfg.hidden;
    struct act ln = a->ln2;
    struct profile *pr = &m->prof;
    bool w = pass == BWD_ALL; /* the weight gradients too (their inputs gathered) */
    dout = kept(m, pass, a->g_fcproj, dout, (size_t)N * C);
    float *dact = m->cfg.llama ? m->dff : m->d4C;
    PROF(pr, PROF_MATMUL_BWD,
         model_linear_backward(m, dact, GW(GPT2_FCPROJW), GW(GPT2_FCPROJB), dout, a->fch_gelu,
                               GPT2_FCPROJW, l, N, m->Fl, C, acc));
    float *dfc = pass == BWD_INPUT ? a->g_fc : m->d4C;
    PROF(pr, PROF_GELU_BWD, act_backward(m, a, dfc, dact, N));
    if (w && model_sp_gather_act(m, a->ln2, N, &ln, err)) return -1;
    PROF(pr, PROF_MATMUL_BWD,
         model_linear_backward(m, m->dC, GW(GPT2_FCW), GW(GPT2_FCB), dfc, ln, GPT2_FCW, l, N, C,
                               m->FCl, acc));
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
    int C = m->cfg.hidden, N = B * T, R = model_rows_of(m, N), l = model_slot_layer(m, sl, i);
    size_t NC = (size_t)N * C;
    struct layer_acts *a = &sl->layer[i];
    const float *in = model_layer_input(sl, i), *dout, *moe_in;
    struct act ln;
    float *dln;
    struct profile *pr = &m->prof;
    bool w = pass == BWD_ALL; /* the weight gradients too (their inputs gathered) */
    if (recompute_timed(m, sl, i, B, T, false, err)) return -1;
    /* MLP: res3 = res2 + fcproj(act(fc(ln2(res2)))), or + the MoE block's output */
    if (model_sp_gather(m, m->dres, N, &dout, err)) return -1;
    bool moe = gpt2_layer_moe(&m->cfg, l); /* its input gathered beside dout, sequence parallel */
    if (moe ? model_sp_gather_into(m, a->ln2.f32, N, m->moe_ln, &moe_in, err) ||
                  moe_backward(m, moe_acts_of(m, sl, i), l, dout, moe_in, m->dC, N, sl->grad_scale,
                               acc, err)
            : mlp_backward(m, a, l, dout, N, acc, pass, err))
        return -1;
    if (model_tp_sum_rows(m, m->dC, N, &dln, err)) return -1;
    PROF(pr, PROF_LAYERNORM_BWD,
         model_norm_backward(m, m->dres, dln, a->res2, GPT2_LN2W, GPT2_LN2B, l, a->ln2_mean,
                             a->ln2_rstd, R, acc));
    /* attention: res2 = in + attproj(attention(qkv(ln1(in)))) */
    if (model_sp_gather(m, m->dres, N, &dout, err)) return -1;
    dout = kept(m, pass, a->g_attproj, dout, NC);
    PROF(pr, PROF_MATMUL_BWD,
         model_linear_backward(m, m->dC, GW(GPT2_ATTPROJW), GW(GPT2_ATTPROJB), dout,
                               act_f32(a->atty), GPT2_ATTPROJW, l, N, m->Cl, C, acc));
    float *dqkv = pass == BWD_INPUT ? a->g_qkv : m->qkv_packed ? m->qkv_packed : m->d3C;
    if (qkv_backward(m, a, dqkv, m->dC, B, T, err)) return -1;
    ln = a->ln1;
    if (w && model_sp_gather_act(m, a->ln1, N, &ln, err)) return -1;
    PROF(pr, PROF_MATMUL_BWD,
         model_linear_backward(m, m->dC, GW(GPT2_QKVW), GW(GPT2_QKVB), dqkv, ln, GPT2_QKVW, l, N, C,
                               m->QKVl, acc));
#undef GW
    if (model_tp_sum_rows(m, m->dC, N, &dln, err)) return -1;
    PROF(pr, PROF_LAYERNORM_BWD,
         model_norm_backward(m, m->dres, dln, in, GPT2_LN1W, GPT2_LN1B, l, a->ln1_mean, a->ln1_rstd,
                             R, acc));
    return 0;
}

/* BWD_WEIGHTS of local layer i: the four products' weight gradients from
 * the output gradients BWD_INPUT kept and the inputs the slot holds (rerun
 * where the recompute policy did not keep them; the LayerNorm outputs
 * gathered again, sequence parallel). */
static int layer_weights(struct model *m, struct model_slot *sl, int i, int B, int T, bool acc,
                         struct plait_error *err)
{
    int C = m->cfg.hidden, N = B * T, l = model_slot_layer(m, sl, i);
    struct layer_acts *a = &sl->layer[i];
    struct profile *pr = &m->prof;
    struct act ln;
#define GB(t) model_held(m, GRADS, t, l)
    if (recompute_timed(m, sl, i, B, T, true, err)) return -1;
    if (!gpt2_layer_moe(&m->cfg, l)) { /* (an MoE block's came with its input gradient) */
        PROF(pr, PROF_MATMUL_BWD,
             model_linear_backward(m, NULL, G(GPT2_FCPROJW, l), GB(GPT2_FCPROJB), a->g_fcproj,
                                   a->fch_gelu, GPT2_FCPROJW, l, N, m->Fl, C, acc));
        if (model_sp_gather_act(m, a->ln2, N, &ln, err)) return -1;
        PROF(pr, PROF_MATMUL_BWD,
             model_linear_backward(m, NULL, G(GPT2_FCW, l), GB(GPT2_FCB), a->g_fc, ln, GPT2_FCW, l,
                                   N, C, m->FCl, acc));
    }
    PROF(pr, PROF_MATMUL_BWD,
         model_linear_backward(m, NULL, G(GPT2_ATTPROJW, l), GB(GPT2_ATTPROJB), a->g_attproj,
                               act_f32(a->atty), GPT2_ATTPROJW, l, N, m->Cl, C, acc));
    if (model_sp_gather_act(m, a->ln1, N, &ln, err)) return -1;
    PROF(pr, PROF_MATMUL_BWD,
         model_linear_backward(m, NULL, G(GPT2_QKVW, l), GB(GPT2_QKVB), a->g_qkv, ln, GPT2_QKVW, l,
                               N, C, m->QKVl, acc));
#undef GB
    return 0;
}

/* The LM head (logits = lnf · headᵀ, head wte when tied, else lmhead) and
 * the final norm: dres gets the gradient of the last layer's output. A tied
 * head writes dwte first (the first stage's embedding adds to it when the two
 * are one rank). With chunked logits the forward made the head's gradients
 * (model_forward.c's head_rows): its weight gradient is added (written) here. */
static int head_backward(struct model *m, struct model_slot *sl, int N, bool acc,
                         struct plait_error *err)
{
    const struct ops *o = m->ops;
    int C = m->cfg.hidden, R = model_rows_of(m, N);
    struct act lnf;
    float *dlnf;
    struct profile *pr = &m->prof;
    float *partial = m->dC; /* this rank's vocabulary part of the head's input gradient */
    if (m->logits_rows) {
        float *dw = G(m->head, 0);
        size_t n = (size_t)m->Vpl * C;
        partial = sl->dlnf;
        if (acc)
            PROF(pr, PROF_LM_HEAD_BWD, o->residual_forward(m->ctx, dw, dw, sl->dhead, n));
        else
            PROF(pr, PROF_LM_HEAD_BWD, o->copy(m->ctx, dw, sl->dhead, n * sizeof(float)));
    } else {
        if (model_sp_gather_act(m, sl->lnf, N, &lnf, err)) return -1;
        PROF(pr, PROF_LM_HEAD_BWD,
             model_product_backward(m, m->dC, G(m->head, 0), NULL, sl->logits, lnf, P(m->head, 0),
                                    model_weight16(m, m->head, 0), N, C, m->Vpl, acc));
    }
    if (model_tp_sum_rows(m, partial, N, &dlnf, err)) return -1;
    o->zero(m->ctx, m->dres, (size_t)R * C * sizeof(float));
    PROF(pr, PROF_LAYERNORM_BWD,
         model_norm_backward(m, m->dres, dlnf, sl->layer[m->n_layers - 1].res3, GPT2_LNFW,
                             GPT2_LNFB, 0, sl->lnf_mean, sl->lnf_rstd, R, acc));
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

static int stage_backward(struct model *m, int slot, const float *grad_out, int B, int T, bool acc,
                          enum bwd_pass pass, struct plait_error *err)
{
    const struct ops *o = m->ops;
    int C = m->cfg.hidden, N = B * T;
    struct model_slot *sl = &m->slots[slot];
    if (pass == BWD_INPUT && !m->split_backward)
        return error_set(err, "model: a split backward on a model built without it");
    acc = acc || m->z3; /* ZeRO 3: into zeroed gradient windows */
    if (model_heads(m, sl)) {
        if (model_z3_head_backward(m, sl, true, err) || head_backward(m, sl, N, acc, err) ||
            model_z3_head_backward(m, sl, false, err))
            return -1;
        size_t wte = gpt2_shard_offset(&m->shard, GPT2_WTE, 0);
        if (deferring(m) &&
            m->grads_final(m->grads_final_ctx, wte, wte + m->shard.elems[GPT2_WTE], err))
            return -1;
    } else {
        o->copy(m->ctx, m->dres, grad_out, model_stage_floats(m, B, T) * sizeof(float));
    }
    for (int i = m->n_layers - 1; i >= 0; i--)
        if (model_z3_layer_backward(m, sl, i, true, err) ||
            layer_backward(m, sl, i, B, T, acc, pass, err) ||
            model_z3_layer_backward(m, sl, i, false, err) ||
            (pass == BWD_ALL && layer_final(m, sl, i, err)))
            return -1;
    if (model_embeds(m, sl) && mz3_grad_take(m, MZ3_EMBEDDINGS, err)) return -1;
    if (model_embeds(m, sl)) {
        /* the embedding: with the tied head on this rank too it adds to dwte, else it
         * writes; sequence parallel, from the gathered rows (dwpe is then whole on every
         * rank) */
        bool acc_wte = acc || (m->last && !m->cfg.untied);
        const float *demb;
        struct profile *pr = &m->prof;
        if (model_sp_gather(m, m->dres, N, &demb, err)) return -1;
        if (!acc_wte) o->zero(m->ctx, G(GPT2_WTE, 0), m->shard.elems[GPT2_WTE] * sizeof(float));
        bool defer = deferring(m); /* wpe's part now, wte's once wte is summed */
        m->deferred_slot = defer ? slot : -1;
        float *dwte = defer ? NULL : G(GPT2_WTE, 0), *dwpe = model_held(m, GRADS, GPT2_WPE, 0);
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
    return model_check_ops(m, "backward", err);
}

int model_deferred_rows(struct model *m, int B, int T, const float **rows, const int32_t **tokens,
                        struct plait_error *err)
{
    if (m->deferred_slot < 0) return error_set(err, "model: no embedding rows were deferred");
    *tokens = m->slots[m->deferred_slot].tokens;
    m->deferred_slot = -1;
    return model_sp_gather(m, m->dres, B * T, rows, err);
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
        if (model_z3_layer_backward(m, &m->slots[slot], i, true, err) ||
            layer_weights(m, &m->slots[slot], i, B, T, acc, err) ||
            model_z3_layer_backward(m, &m->slots[slot], i, false, err) ||
            layer_final(m, &m->slots[slot], i, err))
            return -1;
    if (mz3_grad_settle(m, 0, err)) return -1;
    return model_check_ops(m, "backward (weight gradients)", err);
}

int model_backward(struct model *m, int B, int T, bool acc, struct plait_error *err)
{
    return model_stage_backward(m, 0, NULL, B, T, acc, err);
}
