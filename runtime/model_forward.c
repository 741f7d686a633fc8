/* model_forward.c — the forward pass over one micro-batch in the ops of
 * kernels/ops.h: a layer (GPT-2's block, or a Llama's: RMSNorm for LayerNorm,
 * rotary positions on q and k and its key/value heads repeated between the QKV
 * product and the attention, SwiGLU for GELU, no biases; its MLP or an MoE
 * block), the embedding at the first stage, the final norm, logits and loss at
 * the last (a vocabulary split across tp), and model_stage_forward taking a slot
 * through its chunk. The backward and its recompute are model_backward.c's. */
#include "runtime/model_forward.h"

#include <stdint.h>

#include "runtime/model_moe.h"
#include "runtime/model_tp.h"
#include "runtime/model_weights.h"
#include "runtime/model_zero3.h"
#include "runtime/model_zero3_pass.h"
#include "runtime/ring_attention.h"

/* ---- forward ------------------------------------------------------------------ */

/* Local layer i of a slot: its activations; its parameters are the model's
 * layer model_slot_layer(m, sl, i). */
int model_slot_layer(const struct model *m, const struct model_slot *sl, int i)
{
    return gpt2_shard_layer(&m->shard, sl->chunk * m->n_layers + i);
}

/* Whether the slot's chunk embeds (the first stage's first chunk) or ends in
 * the head (the last stage's last chunk). */
bool model_embeds(const struct model *m, const struct model_slot *sl)
{
    return m->first && sl->chunk == 0;
}

bool model_heads(const struct model *m, const struct model_slot *sl)
{
    return m->last && sl->chunk == m->chunks - 1;
}

const float *model_layer_input(const struct model_slot *sl, int i)
{
    return i == 0 ? sl->input : sl->layer[i - 1].res3;
}

/* The attention of layer acts a: on bf16 tensor cores or fused where the
 * backend has them, with att then holding only each row's log-sum-exp (its
 * first B·NH·T floats). */
int model_attention_fwd(struct model *m, struct layer_acts *a, int B, int T,
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

/* q, k and v of layer acts a from ln (N,C): the product into a->qkv; a
 * Llama's rotary positions on q and k, and with grouped-query attention the
 * product into qkv_packed, its key/value heads then repeated into a->qkv (the
 * two in one op where the backend fuses them; with cp one a chunk, at its
 * positions). */
static void qkv_forward(struct model *m, struct layer_acts *a, struct act ln, int l, int B, int T)
{
    const struct ops *o = m->ops;
    int N = B * T;
    float *out = m->qkv_packed ? m->qkv_packed : a->qkv;
    struct profile *pr = &m->prof;
    PROF(pr, PROF_MATMUL_FWD,
         model_linear_forward(m, out, ln, GPT2_QKVW, l, model_held(m, PARAMS, GPT2_QKVB, l), N,
                              m->cfg.hidden, m->QKVl));
    if (!m->cfg.llama) return;
    if (m->qkv_packed && o->rope_kv_expand) { /* one pass; out left unrotated */
        if (m->cp > 1)
            PROF(pr, PROF_ATTENTION_FWD, ring_rope(m, out, a->qkv, B, T, false));
        else
            PROF(pr, PROF_ATTENTION_FWD,
                 o->rope_kv_expand(m->ctx, a->qkv, out, B, T, m->NHl, m->KVl, m->hs,
                                   m->cfg.rope_theta, 0));
        return;
    }
    if (m->cp > 1)
        PROF(pr, PROF_ATTENTION_FWD, ring_rope(m, out, NULL, B, T, false));
    else
        PROF(pr, PROF_ATTENTION_FWD,
             o->rope_forward(m->ctx, out, B, T, m->NHl, m->KVl, m->hs, m->cfg.rope_theta, 0));
    if (m->qkv_packed)
        PROF(pr, PROF_ATTENTION_FWD, o->kv_expand(m->ctx, a->qkv, out, N, m->NHl, m->KVl, m->hs));
}

/* res2 (R,C) = in + proj, the attention's residual add, and ln2 its norm: in one op where
 * the backend fuses them (timed as the norm: the add's pass over memory is gone), else the
 * two. */
static void residual_norm_forward(struct model *m, struct layer_acts *a, const float *in,
                                  const float *proj, int l, int R)
{
    const struct ops *o = m->ops;
    int C = m->cfg.hidden;
    struct profile *pr = &m->prof;
    float eps = m->cfg.norm_eps;
    const float *w = P(GPT2_LN2W, l);
    if (a->ln2.bf16 && m->cfg.llama && o->residual_rmsnorm_forward16) {
        PROF(pr, PROF_LAYERNORM_FWD,
             o->residual_rmsnorm_forward16(m->ctx, a->res2, a->ln2.bf16, a->ln2_rstd, in, proj, w,
                                           R, C, eps));
    } else if (a->ln2.bf16 && !m->cfg.llama && o->residual_layernorm_forward16) {
        PROF(pr, PROF_LAYERNORM_FWD,
             o->residual_layernorm_forward16(m->ctx, a->res2, a->ln2.bf16, a->ln2_mean, a->ln2_rstd,
                                             in, proj, w, P(GPT2_LN2B, l), R, C));
    } else if (a->ln2.f32 && m->cfg.llama && o->residual_rmsnorm_forward) {
        PROF(pr, PROF_LAYERNORM_FWD,
             o->residual_rmsnorm_forward(m->ctx, a->res2, a->ln2.f32, a->ln2_rstd, in, proj, w, R,
                                         C, eps));
    } else if (a->ln2.f32 && !m->cfg.llama && o->residual_layernorm_forward) {
        PROF(pr, PROF_LAYERNORM_FWD,
             o->residual_layernorm_forward(m->ctx, a->res2, a->ln2.f32, a->ln2_mean, a->ln2_rstd,
                                           in, proj, w, P(GPT2_LN2B, l), R, C));
    } else {
        PROF(pr, PROF_RESIDUAL_FWD, o->residual_forward(m->ctx, a->res2, in, proj, (size_t)R * C));
        PROF(pr, PROF_LAYERNORM_FWD,
             model_norm_forward(m, a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, GPT2_LN2W, GPT2_LN2B,
                                l, R));
    }
}

/* The MLP's activation: GELU of fch (N,4C/tp), or a Llama's SwiGLU of its
 * gate and up halves (N,2F/tp), into fch_gelu (fp32 or bf16). */
void model_act_forward(struct model *m, struct layer_acts *a, int N)
{
    const struct ops *o = m->ops;
    uint16_t *out = a->fch_gelu.bf16;
    if (!out)
        model_mlp_act(m, a->fch_gelu.f32, a->fch, N, m->Fl);
    else if (m->cfg.llama)
        o->swiglu_forward16(m->ctx, out, a->fch, N, m->Fl);
    else
        o->gelu_forward16(m->ctx, out, a->fch, (size_t)N * m->Fl);
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
int model_layer_attention_forward(struct model *m, struct model_slot *sl, int i, int B, int T,
                                  struct plait_error *err)
{
    int N = B * T, R = model_rows_of(m, N), l = model_slot_layer(m, sl, i);
    struct layer_acts *a = &sl->layer[i];
    const float *in = model_layer_input(sl, i);
    struct act ln;
    struct profile *pr = &m->prof;
    PROF(pr, PROF_LAYERNORM_FWD,
         model_norm_forward(m, a->ln1, a->ln1_mean, a->ln1_rstd, in, GPT2_LN1W, GPT2_LN1B, l, R));
    if (model_sp_gather_act(m, a->ln1, N, &ln, err)) return -1;
    qkv_forward(m, a, ln, l, B, T);
    int rc;
    PROF(pr, PROF_ATTENTION_FWD, rc = model_attention_fwd(m, a, B, T, err));
    return rc;
}

int model_layer_forward(struct model *m, struct model_slot *sl, int i, int B, int T,
                        struct plait_error *err)
{
    const struct ops *o = m->ops;
    int C = m->cfg.hidden, N = B * T, R = model_rows_of(m, N), l = model_slot_layer(m, sl, i);
    struct layer_acts *a = &sl->layer[i];
    const float *in = model_layer_input(sl, i);
    struct act ln;
    float *proj;
    struct profile *pr = &m->prof;
    if (model_layer_attention_forward(m, sl, i, B, T, err)) return -1;
    if (model_row_parallel_forward(m, &proj, act_f32(a->atty), GPT2_ATTPROJW, GPT2_ATTPROJB, l, N,
                                   m->Cl, err))
        return -1;
    residual_norm_forward(m, a, in, proj, l, R);
    if (model_sp_gather_act(m, a->ln2, N, &ln, err)) return -1;
    if (gpt2_layer_moe(&m->cfg, l)) { /* an MoE block for the MLP, summed over tp (fp32) */
        if (moe_forward(m, moe_acts_of(m, sl, i), l, ln.f32, N, &proj, err) ||
            model_tp_sum_rows(m, proj, N, &proj, err))
            return -1;
        PROF(pr, PROF_RESIDUAL_FWD,
             o->residual_forward(m->ctx, a->res3, a->res2, proj, (size_t)R * C));
        return 0;
    }
    const float *fcb = model_held(m, PARAMS, GPT2_FCB, l);
    const uint16_t *fcw16 = model_weight16(m, GPT2_FCW, l);
    bool fused = !m->cfg.llama && m->precision != PLAN_PRECISION_FP8;
    if (fused && ln.bf16 && o->matmul_forward_gelu16) {
        PROF(pr, PROF_MATMUL_FWD, /* one pass */
             o->matmul_forward_gelu16(m->ctx, a->fch_gelu.bf16, a->fch, ln.bf16, fcw16, fcb, N, C,
                                      m->FCl));
    } else if (fused && ln.f32 && o->matmul_forward_gelu) {
        PROF(pr, PROF_MATMUL_FWD,
             o->matmul_forward_gelu(m->ctx, a->fch_gelu.f32, a->fch, ln.f32, P(GPT2_FCW, l), fcw16,
                                    fcb, N, C, m->FCl));
    } else {
        PROF(pr, PROF_MATMUL_FWD,
             model_linear_forward(m, a->fch, ln, GPT2_FCW, l, fcb, N, C, m->FCl));
        PROF(pr, PROF_GELU_FWD, model_act_forward(m, a, N));
    }
    if (model_row_parallel_forward(m, &proj, a->fch_gelu, GPT2_FCPROJW, GPT2_FCPROJB, l, N, m->Fl,
                                   err))
        return -1;
    PROF(pr, PROF_RESIDUAL_FWD, o->residual_forward(m->ctx, a->res3, a->res2, proj, (size_t)R * C));
    return 0;
}

int model_check_ops(struct model *m, const char *what, struct plait_error *err)
{
    char msg[512];
    if (m->ops->take_error(m->ctx, msg, sizeof msg) == 0) return 0;
    return error_set(err, "%s backend, %s: %s", m->ops->name, what, msg);
}

/* The loss of n rows of logits (targets, losses: theirs) over a vocabulary split across the
 * tp group (the full logits are never gathered): row max, then Σexp and the target's logit,
 * reduced between; dlogits over the logits, or (dlogits16) into it in bf16. */
static int vocab_parallel_loss(struct model *m, float *logits, uint16_t *dlogits16,
                               const int32_t *targets, float *losses, int n, float grad_scale,
                               struct plait_error *err)
{
    const struct ops *o = m->ops;
    float *mx = m->ce_stats, *sum = mx + n, *tl = sum + n;
    o->classifier_max(m->ctx, logits, mx, n, m->nv, m->Vpl);
    if (model_tp_reduce(m, mx, (size_t)n, true, err)) return -1;
    o->classifier_sumexp(m->ctx, logits, mx, targets, m->v0, m->nv, m->Vpl, sum, tl, n);
    if (model_tp_reduce(m, sum, 2 * (size_t)n, false, err)) return -1; /* sums and target logits */
    if (dlogits16)
        o->classifier_finish16(m->ctx, dlogits16, logits, losses, targets, mx, sum, tl, m->v0,
                               m->nv, m->Vpl, n, grad_scale);
    else
        o->classifier_finish(m->ctx, logits, losses, targets, mx, sum, tl, m->v0, m->nv, m->Vpl, n,
                             grad_scale);
    return 0;
}

/* Rows [r0, r0 + n) of the head: their logits, loss and (grad_scale != 0) dlogits in
 * sl->logits; with chunked logits also the head's input gradient of those rows into
 * sl->dlnf and its weight gradient added into sl->dhead (written by the first rows). */
static int head_rows(struct model *m, struct model_slot *sl, struct act lnf, int r0, int n,
                     float grad_scale, struct plait_error *err)
{
    const struct ops *o = m->ops;
    int C = m->cfg.hidden;
    struct act in = act_at(lnf, (size_t)r0 * C);
    const float *w = P(m->head, 0);
    const uint16_t *w16 = model_weight16(m, m->head, 0);
    const int32_t *targets = sl->targets + r0;
    float *losses = m->losses + r0;
    struct profile *pr = &m->prof;
    /* the chunk's dlogits in bf16 where the head's backward reads them so (its input too) */
    uint16_t *d16 = m->logits_rows && grad_scale != 0 && in.bf16 ? m->dlogits16 : NULL;
    PROF(pr, PROF_LM_HEAD_FWD,
         model_product_forward(m, sl->logits, in, w, w16, NULL, n, C, m->Vpl));
    if (m->tp.size == 1 && d16) {
        PROF(pr, PROF_LOSS,
             o->classifier16(m->ctx, d16, sl->logits, losses, targets, n, m->cfg.vocab,
                             m->cfg.padded_vocab, grad_scale));
    } else if (m->tp.size == 1) {
        PROF(pr, PROF_LOSS,
             o->classifier(m->ctx, sl->logits, losses, targets, n, m->cfg.vocab,
                           m->cfg.padded_vocab, grad_scale));
    } else {
        double t0 = prof_clock(pr);
        if (vocab_parallel_loss(m, sl->logits, d16, targets, losses, n, grad_scale, err)) return -1;
        if (!pr->paused) pr->seconds[PROF_LOSS] += prof_clock(pr) - t0;
    }
    float *dlnf = m->logits_rows ? sl->dlnf + (size_t)r0 * C : NULL;
    if (d16)
        PROF(pr, PROF_LM_HEAD_BWD,
             o->matmul_backward_dout16(m->ctx, dlnf, sl->dhead, d16, in.bf16, w16, n, C, m->Vpl,
                                       r0 > 0));
    else if (m->logits_rows && grad_scale != 0)
        PROF(pr, PROF_LM_HEAD_BWD,
             model_product_backward(m, dlnf, sl->dhead, NULL, sl->logits, in, w, w16, n, C, m->Vpl,
                                    r0 > 0));
    return 0;
}

/* The last stage's head: final LayerNorm, logits, and with targets the loss, in chunks
 * of m->logits_rows rows (or at once); without targets the logits go to m->logits_out
 * where one is set. */
static int head_forward(struct model *m, struct model_slot *sl, const int32_t *targets, int N,
                        float grad_scale, double *mean_loss, struct plait_error *err)
{
    const struct ops *o = m->ops;
    int C = m->cfg.hidden;
    struct act lnf;
    struct profile *pr = &m->prof;
    PROF(pr, PROF_LAYERNORM_FWD,
         model_norm_forward(m, sl->lnf, sl->lnf_mean, sl->lnf_rstd, sl->layer[m->n_layers - 1].res3,
                            GPT2_LNFW, GPT2_LNFB, 0, model_rows_of(m, N)));
    if (model_sp_gather_act(m, sl->lnf, N, &lnf, err)) return -1;
    if (!targets) {
        if (m->logits_out)
            PROF(pr, PROF_LM_HEAD_FWD,
                 model_product_forward(m, m->logits_out, lnf, P(m->head, 0),
                                       model_weight16(m, m->head, 0), NULL, N, C, m->Vpl));
        return 0;
    }
    o->upload(m->ctx, sl->targets, targets, (size_t)N * sizeof(int32_t));
    int rows = m->logits_rows ? m->logits_rows : N;
    for (int r0 = 0; r0 < N; r0 += rows)
        if (head_rows(m, sl, lnf, r0, N - r0 < rows ? N - r0 : rows, grad_scale, err)) return -1;
    o->download(m->ctx, m->losses_host, m->losses, (size_t)N * sizeof(float));
    double sum = 0;
    for (int i = 0; i < N; i++) sum += m->losses_host[i];
    if (mean_loss) *mean_loss = sum / N;
    return 0;
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
    if (model_embeds(m, sl) &&
        (model_hold_unit(m, MZ3_EMBEDDINGS, err) || model_z3_next(m, sl, -1, true, err)))
        return -1;
    if (model_embeds(m, sl)) {
        o->upload(m->ctx, sl->tokens, tokens, (size_t)N * sizeof(int32_t));
        /* vocabulary-parallel: each rank its rows of wte, one of them wpe; the sum is
         * exact (all-reduced, or reduce-scattered to this rank's rows) */
        float *emb = m->sp ? m->whole : sl->input;
        const float *wpe = m->tp.rank == 0 ? model_held(m, PARAMS, GPT2_WPE, 0) : NULL;
        if (m->cp > 1)
            PROF(pr, PROF_EMBED_FWD,
                 ring_encoder_forward(m, emb, sl->tokens, P(GPT2_WTE, 0), wpe, B, T));
        else
            PROF(pr, PROF_EMBED_FWD,
                 o->encoder_forward(m->ctx, emb, sl->tokens, P(GPT2_WTE, 0), m->v0, m->Vpl, wpe, B,
                                    T, C));
        if (m->sp ? model_sp_scatter(m, emb, sl->input, N, err)
                  : model_tp_reduce(m, emb, (size_t)N * C, false, err))
            return -1;
        /* (kept for a tied head on this slot: the head uses the same unit) */
        if (!(model_heads(m, sl) && model_tied_head(m)) && mz3_drop(m, MZ3_EMBEDDINGS, err))
            return -1;
    }
    sl->grad_scale = grad_scale;
    for (int i = 0; i < m->n_layers; i++) {
        int u = model_z3_unit(m, sl, i);
        if (model_z3_next(m, sl, i, true, err) || model_hold_unit(m, u, err) ||
            model_layer_forward(m, sl, i, B, T, err) || mz3_drop(m, u, err))
            return -1;
    }
    if (m->n_moe && grad_scale != 0) moe_count(m, sl, N); /* a training forward's */
    if (model_heads(m, sl) && (model_z3_head(m, true, err) ||
                               head_forward(m, sl, targets, N, grad_scale, mean_loss, err) ||
                               (grad_scale == 0 && model_z3_head(m, false, err))))
        return -1;
    return model_check_ops(m, "forward", err);
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
    return (size_t)model_rows_of(m, B * T) * (size_t)m->cfg.hidden;
}

const float *model_stage_output(const struct model *m, int slot)
{
    return m->slots[slot].layer[m->n_layers - 1].res3;
}

const float *model_stage_input_grad(const struct model *m)
{
    return m->dres;
}
