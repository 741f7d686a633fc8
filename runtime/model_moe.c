/* model_moe.c — the mixture-of-experts block of model_moe.h: routing through
 * kernels/ops.h's moe_* ops, each expert's MLP (the arch's: GELU with biases, or
 * SwiGLU) on its packed rows through the same products as the dense MLP, the
 * shared experts on every row, and the losses and routing counts the training
 * loop reports. The layer around it (norms, attention, residuals) is model_forward.c's and
 * model_backward.c's. */
#include "runtime/model_moe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/formats/ckpt_state.h" // defines: MOE_STATS

/* One expert's weights (or their gradients): fc (FCm,C), fcb (Fm), proj (C,Fm), projb (C);
 * the biases NULL in a Llama. */
struct expert {
    float *fc, *fcb, *proj, *projb;
    const uint16_t *fc16, *proj16; /* bf16 copies, or NULL */
};

/* An expert's widths on this rank: Fm/tp, and its fc rows FCm/tp (2Fm/tp for a Llama). */
static size_t width_of(const struct model *m)
{
    return (size_t)(m->cfg.moe_ffn / m->tp.size);
}

static size_t fc_rows_of(const struct model *m)
{
    return (size_t)(gpt2_expert_fc_rows(&m->cfg) / m->tp.size);
}

/* Expert x (0..E/ep-1 the rank's routed ones, E/ep.. shared) of layer l, this rank's columns of fc
 * and rows of fcproj as the dense MLP's (fcproj's bias whole): weights, or with grads gradients. */
static struct expert expert_of(const struct model *m, int l, int x, bool grads)
{
    const struct gpt2_config *cfg = &m->cfg;
    size_t C = (size_t)cfg->hidden, Fm = width_of(m), FCm = fc_rows_of(m), e = (size_t)x;
    bool bias = gpt2_shard_holds(&m->shard, GPT2_EXPFCB);
    struct expert w = {
        .fc = model_tensor(m, grads, GPT2_EXPFCW, l) + e * FCm * C,
        .fcb = bias ? model_tensor(m, grads, GPT2_EXPFCB, l) + e * Fm : NULL,
        .proj = model_tensor(m, grads, GPT2_EXPPROJW, l) + e * C * Fm,
        .projb = bias ? model_tensor(m, grads, GPT2_EXPPROJB, l) + e * C : NULL,
    };
    const uint16_t *fc16 = grads ? NULL : model_tensor16(m, GPT2_EXPFCW, l);
    const uint16_t *proj16 = grads ? NULL : model_tensor16(m, GPT2_EXPPROJW, l);
    w.fc16 = fc16 ? fc16 + e * FCm * C : NULL;
    w.proj16 = proj16 ? proj16 + e * C * Fm : NULL;
    return w;
}

/* y (n,C) = proj(act(fc(in))) for in (n,C), keeping h (n,FCm/tp) and act (n,Fm/tp): with
 * tp this rank's term of y, the bias in tp rank 0's. */
static void expert_forward(const struct model *m, const struct expert *w, float *y, float *h,
                           float *act, const float *in, int n)
{
    const struct ops *o = m->ops;
    int C = m->cfg.hidden, Fm = (int)width_of(m), FCm = (int)fc_rows_of(m);
    o->matmul_forward(m->ctx, h, in, w->fc, w->fc16, w->fcb, n, C, FCm);
    model_mlp_act(m, act, h, n, Fm);
    o->matmul_forward(m->ctx, y, act, w->proj, w->proj16, m->tp.rank == 0 ? w->projb : NULL, n, Fm,
                      C);
}

/* Its backward from dy (n,C): din (n,C) overwritten (may be dy's rows; with tp this
 * rank's term), the weight gradients into g, written or added (acc); an expert that took
 * no rows writes zeros. */
static void expert_backward(const struct model *m, const struct expert *w, const struct expert *g,
                            float *din, const float *dy, const float *in, const float *h,
                            const float *act, int n, bool acc)
{
    const struct ops *o = m->ops;
    size_t C = (size_t)m->cfg.hidden, Fm = width_of(m), FCm = fc_rows_of(m);
    if (n == 0) {
        if (acc) return;
        o->zero(m->ctx, g->fc, FCm * C * sizeof(float));
        o->zero(m->ctx, g->proj, C * Fm * sizeof(float));
        if (g->fcb) o->zero(m->ctx, g->fcb, Fm * sizeof(float));
        if (g->projb) o->zero(m->ctx, g->projb, C * sizeof(float));
        return;
    }
    o->matmul_backward(m->ctx, m->moe_dact, g->proj, g->projb, dy, act, w->proj, w->proj16, n,
                       (int)Fm, (int)C, acc);
    model_mlp_act_backward(m, m->moe_dh, h, m->moe_dact, n, (int)Fm);
    o->matmul_backward(m->ctx, din, g->fc, g->fcb, m->moe_dh, in, w->fc, w->fc16, n, (int)C,
                       (int)FCm, acc);
}

int moe_check(const struct model *m, struct plait_error *err)
{
    const struct ops *o = m->ops;
    if (!gpt2_moe(&m->cfg)) return 0;
    if (!o->moe_route || !o->moe_dispatch || !o->moe_gather || !o->moe_gather_backward ||
        !o->moe_combine || !o->moe_combine_backward || !o->moe_route_backward || !o->moe_losses)
        return error_set(err, "model.moe: the %s backend has no mixture-of-experts ops yet",
                         o->name);
    int ep = m->shard.part.ep;
    if (ep > 1 && (!m->ep_group || m->ep_group->size != ep || !m->ep_group->alltoall_v))
        return error_set(err,
                         "parallel.ep %d: the model has no ep group of %d ranks with an "
                         "all-to-all",
                         ep, ep);
    return 0;
}

int moe_init(struct model *m, struct plait_error *err)
{
    size_t E = (size_t)m->cfg.experts, layers = (size_t)m->n_slots * (size_t)m->n_moe;
    if (!gpt2_moe(&m->cfg)) return 0;
    m->moe_counts_host = calloc(3 * E, sizeof *m->moe_counts_host);
    if (m->shard.part.ep > 1 &&
        (!(m->moe_ep_counts = calloc(2 * E, sizeof *m->moe_ep_counts)) ||
         !(m->moe_ep_sizes = calloc(2 * (size_t)m->shard.part.ep, sizeof *m->moe_ep_sizes))))
        return error_set(err, "out of memory for the expert-parallel counts");
    m->moe_stats = calloc(MOE_STATS(E), sizeof *m->moe_stats);
    m->moe_routed_host = calloc(layers * E + 1, sizeof *m->moe_routed_host);
    if (!m->moe_counts_host || !m->moe_stats || !m->moe_routed_host)
        return error_set(err, "out of memory for the statistics of %zu experts", E);
    if (moe_cp_init(m, err)) return -1;
    for (size_t s = 0; s < (size_t)m->n_slots; s++)
        for (size_t j = 0; j < (size_t)m->n_moe; j++)
            m->slots[s].moe[j].routed_host = m->moe_routed_host + (s * (size_t)m->n_moe + j) * E;
    return 0;
}

void moe_free(struct model *m)
{
    moe_cp_free(m);
    free(m->moe_counts_host);
    free(m->moe_ep_counts);
    free(m->moe_ep_sizes);
    m->moe_ep_counts = NULL;
    m->moe_ep_sizes = NULL;
    free(m->moe_stats);
    free(m->moe_routed_host);
    m->moe_counts_host = NULL;
    m->moe_stats = NULL;
    m->moe_routed_host = NULL;
}

struct moe_acts *moe_acts_of(const struct model *m, const struct model_slot *sl, int i)
{
    int l0 = gpt2_shard_layer(&m->shard, sl->chunk * m->n_layers);
    int l = gpt2_shard_layer(&m->shard, sl->chunk * m->n_layers + i);
    return &sl->moe[gpt2_moe_layers_before(&m->cfg, l) - gpt2_moe_layers_before(&m->cfg, l0)];
}

/* An expert's capacity in a micro-batch of N tokens (with cp, every cp rank's):
 * ceil(capacity_factor·k·N/E), 0 (none) without a capacity factor. */
static int capacity_of(const struct model *m, int N)
{
    const struct gpt2_config *cfg = &m->cfg;
    if (m->moe_capacity_factor <= 0) return 0;
    double c = ceil(m->moe_capacity_factor * cfg->top_k * N / cfg->experts);
    return c > 0 ? (int)c : 1;
}

/* The local routed experts (E/ep), and the rows local expert e takes: this rank's own
 * (ep 1) or every ep rank's (moe_ep_rows). */
static int local_experts(const struct model *m)
{
    return gpt2_part_experts(&m->shard.part, &m->cfg);
}

static int rows_of(const struct model *m, const int32_t *counts, int e)
{
    return m->shard.part.ep > 1 ? moe_ep_rows(m, counts, e) : counts[e];
}

/* The balance loss's coefficient as the ops take it: their f_e is routed/(k·N) of the N
 * tokens they see, the rank's; with cp, routed is the micro-batch's cp·N tokens'
 * (moe_cp_counts), so the coefficient carries 1/cp. Each rank's P_e is its own tokens'
 * mean, as its z-loss is: their mean over the cp ranks, the loss's, is the micro-batch's. */
static double balance_coef(const struct model *m)
{
    return m->moe_aux / m->cp;
}

/* Each expert's packed rows of acts a (and with ep the rows each ep rank sent the local
 * experts), read back into m->moe_counts_host. */
static int32_t *counts_of(const struct model *m, const struct moe_acts *a)
{
    size_t n = (m->shard.part.ep > 1 ? 3 : 2) * (size_t)m->cfg.experts * sizeof(int32_t);
    m->ops->download(m->ctx, m->moe_counts_host, a->counts, n);
    return m->moe_counts_host;
}

int moe_forward(struct model *m, struct moe_acts *a, int l, const float *ln, int N, float **out,
                struct plait_error *err)
{
    const struct ops *o = m->ops;
    const struct gpt2_config *cfg = &m->cfg;
    int E = cfg->experts, k = cfg->top_k, C = cfg->hidden, S = cfg->shared_experts;
    int El = local_experts(m);
    bool ep = m->shard.part.ep > 1; /* the rows go to their experts' ranks and come back */
    float *own = ep ? m->moe_ep : a->x, *y = ep ? m->moe_dy : a->y;
    size_t Fm = width_of(m), FCm = fc_rows_of(m);
    o->matmul_forward(m->ctx, m->moe_logits, ln, model_tensor(m, false, GPT2_ROUTERW, l),
                      model_tensor16(m, GPT2_ROUTERW, l), NULL, N, C, E);
    o->moe_route(m->ctx, a->probs, a->choice, a->gate, a->lse, m->moe_logits, N, E, k);
    bool cp = m->cp > 1; /* each of the rank's 2B chunks from the micro-batch's choices before it */
    if (cp && moe_cp_counts(m, a, N, err)) return -1;
    a->kept = o->moe_dispatch(m->ctx, a->pos, a->rows, a->counts, a->counts + E, a->choice,
                              cp ? m->moe_cp_before : NULL, cp ? 2 * N / m->T : 1, N, E, k,
                              capacity_of(m, N * m->cp));
    o->moe_gather(m->ctx, own, ln, a->rows, a->kept, C);
    int32_t *counts = counts_of(m, a);
    memcpy(a->routed_host, counts + E, (size_t)E * sizeof *counts); /* for moe_count: the rank's */
    if (cp) /* the losses' f_e: the micro-batch's choices */
        o->upload(m->ctx, a->counts + E, m->moe_cp_routed, (size_t)E * sizeof *counts);
    if (ep && (moe_ep_counts(m, a, counts, err) || moe_ep_dispatch(m, counts, own, N, a->x, err)))
        return -1;
    for (int e = 0, at = 0, n; e < El; at += n, e++) {
        struct expert w = expert_of(m, l, e, false);
        size_t r = (size_t)at;
        if ((n = rows_of(m, counts, e)))
            expert_forward(m, &w, y + r * C, a->h + r * FCm, a->act + r * Fm, a->x + r * C, n);
    }
    if (ep && moe_ep_return(m, counts, y, N, a->y, err)) return -1;
    *out = m->proj;
    o->moe_combine(m->ctx, m->proj, a->y, a->gate, a->pos, N, k, C, false);
    for (int s = 0; s < S; s++) { /* gate 1, every row; m->dC is free in a forward */
        struct expert w = expert_of(m, l, El + s, false);
        size_t sN = (size_t)s * N;
        expert_forward(m, &w, m->dC, a->sh_h + sN * FCm, a->sh_act + sN * Fm, ln, N);
        o->residual_forward(m->ctx, m->proj, m->proj, m->dC, (size_t)N * C);
    }
    o->moe_losses(m->ctx, a->losses, a->probs, a->lse, a->counts + E, N, E, k, balance_coef(m),
                  m->moe_z);
    return 0;
}

int moe_backward(struct model *m, struct moe_acts *a, int l, const float *dout, const float *ln,
                 float *dln, int N, float grad_scale, bool acc, struct plait_error *err)
{
    const struct ops *o = m->ops;
    const struct gpt2_config *cfg = &m->cfg;
    int E = cfg->experts, k = cfg->top_k, C = cfg->hidden, S = cfg->shared_experts;
    int El = local_experts(m);
    size_t Fm = width_of(m), FCm = fc_rows_of(m), NC = (size_t)N * C;
    bool ep = m->shard.part.ep > 1; /* the rows' gradients out to the experts and back */
    float *own = ep ? m->moe_ep : m->moe_dy;
    o->moe_combine_backward(m->ctx, own, m->moe_dgate, dout, a->y, a->gate, a->pos, N, k, C);
    /* with tp, y and so dgate were this rank's terms: the gates' gradients are their sum */
    if (model_tp_allreduce(m, m->moe_dgate, (size_t)N * k, err)) return -1;
    const int32_t *counts = counts_of(m, a);
    if (ep && moe_ep_dispatch(m, counts, own, N, m->moe_dy, err)) return -1;
    for (int e = 0, at = 0, n; e < El; at += n, e++) {
        struct expert w = expert_of(m, l, e, false), g = expert_of(m, l, e, true);
        size_t r = (size_t)at;
        float *dy = m->moe_dy + r * C; /* overwritten by the rows' input gradient */
        n = rows_of(m, counts, e);
        expert_backward(m, &w, &g, dy, dy, a->x + r * C, a->h + r * FCm, a->act + r * Fm, n, acc);
    }
    if (ep && moe_ep_return(m, counts, m->moe_dy, N, own, err)) return -1;
    o->moe_gather_backward(m->ctx, dln, own, a->pos, N, k, C, false);
    /* the router: its gates' gradients and the losses', scaled as the loss is */
    double scale = (double)grad_scale * N;
    o->moe_route_backward(m->ctx, m->moe_logits, m->moe_dgate, a->probs, a->choice, a->gate, a->lse,
                          a->counts + E, N, E, k, (float)(balance_coef(m) * scale),
                          (float)(m->moe_z * scale));
    o->matmul_backward(m->ctx, m->proj, model_tensor(m, true, GPT2_ROUTERW, l), NULL, m->moe_logits,
                       ln, model_tensor(m, false, GPT2_ROUTERW, l),
                       model_tensor16(m, GPT2_ROUTERW, l), N, C, E, acc);
    /* the router is whole on every tp rank: its input gradient in tp rank 0's term only */
    if (m->tp.rank == 0) o->residual_forward(m->ctx, dln, dln, m->proj, NC);
    for (int s = 0; s < S; s++) {
        struct expert w = expert_of(m, l, El + s, false), g = expert_of(m, l, El + s, true);
        size_t sN = (size_t)s * N;
        expert_backward(m, &w, &g, m->proj, dout, ln, a->sh_h + sN * FCm, a->sh_act + sN * Fm, N,
                        acc);
        o->residual_forward(m->ctx, dln, dln, m->proj, NC);
    }
    return 0;
}

/* x rounded to a multiple of 2^-40: sums of such terms (below 2^13) are exact, the same
 * in any order and over any ranks, so a step stopped and resumed mid-way reports the
 * same metrics to the bit, and its loss (summed over the ranks at the stop, then over
 * the rest) takes no rounding from the MoE losses */
static double exact_term(double x)
{
    return ldexp(nearbyint(ldexp(x, 40)), -40);
}

void moe_count(struct model *m, const struct model_slot *sl, int N)
{
    const struct gpt2_config *cfg = &m->cfg;
    int E = cfg->experts, k = cfg->top_k, first = sl->chunk * m->n_layers;
    double *st = m->moe_stats;
    for (int i = 0; i < m->n_layers; i++) {
        if (!gpt2_layer_moe(cfg, gpt2_shard_layer(&m->shard, first + i))) continue;
        const struct moe_acts *a = moe_acts_of(m, sl, i);
        double balance = exact_term(a->losses[0]), z = exact_term(a->losses[1]);
        m->moe_loss += balance + z;
        st[MOE_STAT_BALANCE] += balance;
        st[MOE_STAT_Z] += z;
        st[MOE_STAT_CHOICES] += (double)k * N;
        st[MOE_STAT_DROPPED] += (double)k * N - a->kept;
        for (int e = 0; e < E; e++) st[MOE_STAT_ROUTED + e] += a->routed_host[e];
    }
}

double model_moe_take_loss(struct model *m)
{
    double loss = m->moe_loss;
    m->moe_loss = 0;
    return loss;
}

void model_moe_stats_clear(struct model *m)
{
    if (m->moe_stats) memset(m->moe_stats, 0, MOE_STATS(m->cfg.experts) * sizeof *m->moe_stats);
}
