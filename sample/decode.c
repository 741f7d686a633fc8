/* decode.c — one token at a time through a whole model, with a key/value
 * cache (decode.h). */
#include "sample/decode.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ops.h"

int decoder_init(struct decoder *d, const struct gpt2_shard *shard, const float *params,
                 struct plait_error *err)
{
    memset(d, 0, sizeof *d);
    const struct gpt2_config *c = &shard->cfg;
    if (shard->part.tp != 1 || !shard->first || !shard->last ||
        gpt2_shard_layers(shard) != c->layers)
        return error_set(err, "decoding needs the whole model on one rank (tp 1, pp 1)");
    char why[256] = "";
    d->shard = shard;
    d->params = params;
    d->ops = ops_cpu();
    d->ctx = d->ops->open(0, why, sizeof why);
    if (!d->ctx) return error_set(err, "the CPU backend: %s", why);
    d->T = c->max_seq_len;
    size_t C = (size_t)c->hidden, KVC = (size_t)gpt2_kv_heads(c) * (C / (size_t)c->heads);
    size_t cache = (size_t)c->layers * (size_t)d->T * KVC;
    size_t QKV = (size_t)gpt2_qkv_rows(c), FC = (size_t)gpt2_fc_rows(c) + (size_t)gpt2_ffn(c);
    size_t FCm = (size_t)(gpt2_expert_fc_rows(c) + c->moe_ffn), E = (size_t)c->experts + 1;
    size_t k = (size_t)c->top_k + 1;
    FC = FCm > FC ? FCm : FC; /* (an expert's MLP may be the wider) */
    d->k = malloc(cache * sizeof *d->k);
    d->v = malloc(cache * sizeof *d->v);
    d->x = malloc(C * sizeof *d->x);
    d->ln = malloc(C * sizeof *d->ln);
    d->qkv = malloc(QKV * sizeof *d->qkv);
    d->att = malloc(C * sizeof *d->att);
    d->fc = malloc(FC * sizeof *d->fc); /* the MLP's product, then its GELU or SwiGLU */
    d->proj = malloc(C * sizeof *d->proj);
    d->scores = malloc((size_t)d->T * sizeof *d->scores);
    d->stats = malloc(2 * sizeof *d->stats);
    d->logits = malloc((size_t)c->padded_vocab * sizeof *d->logits);
    d->router = malloc(E * sizeof *d->router);
    d->probs = malloc(E * sizeof *d->probs);
    d->gate = malloc(k * sizeof *d->gate);
    d->lse = malloc(sizeof *d->lse);
    d->mix = malloc(C * sizeof *d->mix);
    d->choice = malloc(k * sizeof *d->choice);
    if (!d->k || !d->v || !d->x || !d->ln || !d->qkv || !d->att || !d->fc || !d->proj ||
        !d->scores || !d->stats || !d->logits || !d->router || !d->probs || !d->gate || !d->lse ||
        !d->mix || !d->choice) {
        decoder_free(d);
        return error_set(err, "out of memory for the decoder's cache (%zu MB)",
                         2 * cache * sizeof(float) >> 20);
    }
    return 0;
}

void decoder_free(struct decoder *d)
{
    float *bufs[] = {d->k,      d->v,     d->x,      d->ln,     d->qkv,   d->att,  d->fc,  d->proj,
                     d->scores, d->stats, d->logits, d->router, d->probs, d->gate, d->lse, d->mix};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]);
    free(d->choice);
    if (d->ctx) d->ops->close(d->ctx);
    memset(d, 0, sizeof *d);
}

void decoder_reset(struct decoder *d)
{
    d->pos = 0;
}

/* Tensor t of layer l; NULL when the architecture has none (a Llama's biases). */
static const float *param(const struct decoder *d, enum gpt2_tensor t, int l)
{
    if (!gpt2_shard_holds(d->shard, t)) return NULL;
    return d->params + gpt2_shard_offset(d->shard, t, l);
}

/* The norm of the row in d->x into d->ln: LayerNorm (GPT-2) or RMSNorm (Llama). */
static void norm(struct decoder *d, enum gpt2_tensor w, enum gpt2_tensor b, int l)
{
    const struct gpt2_config *c = &d->shard->cfg;
    if (c->llama)
        d->ops->rmsnorm_forward(d->ctx, d->ln, d->stats, d->x, param(d, w, l), 1, c->hidden,
                                c->norm_eps);
    else
        d->ops->layernorm_forward(d->ctx, d->ln, d->stats, d->stats + 1, d->x, param(d, w, l),
                                  param(d, b, l), 1, c->hidden);
}

/* att (C) = each head's softmax(q·kᵀ/√hs) over positions [0, pos] times v, for the row whose
 * keys and values are the cache's last; query head h reads key/value head h/(NH/KV) */
static void attend(struct decoder *d, const float *q, const float *k, const float *v)
{
    const struct gpt2_config *c = &d->shard->cfg;
    int NH = c->heads, hs = c->hidden / NH, n = d->pos + 1, KV = gpt2_kv_heads(c);
    size_t KVC = (size_t)KV * hs;
    float scale = 1.0f / sqrtf((float)hs);
    for (int h = 0; h < NH; h++) {
        const float *qh = q + h * hs;
        int kvh = h / (NH / KV);
        float mx = -INFINITY;
        for (int t = 0; t < n; t++) {
            const float *kt = k + (size_t)t * KVC + kvh * hs;
            float s = 0;
            for (int i = 0; i < hs; i++) s += qh[i] * kt[i];
            d->scores[t] = s * scale;
            mx = d->scores[t] > mx ? d->scores[t] : mx;
        }
        float sum = 0;
        for (int t = 0; t < n; t++) sum += d->scores[t] = expf(d->scores[t] - mx);
        float *out = d->att + h * hs;
        memset(out, 0, (size_t)hs * sizeof *out);
        for (int t = 0; t < n; t++) {
            const float *vt = v + (size_t)t * KVC + kvh * hs;
            float p = d->scores[t] / sum;
            for (int i = 0; i < hs; i++) out[i] += p * vt[i];
        }
    }
}

/* out (C) = the MLP's output for the row in d->ln: fc (FC rows) and its bias, the GELU
 * or SwiGLU of width F, fcproj and its bias; through d->fc */
static void mlp(struct decoder *d, const float *fc, const float *fcb, const float *proj,
                const float *projb, int FC, int F, float *out)
{
    const struct ops *o = d->ops;
    const struct gpt2_config *c = &d->shard->cfg;
    o->matmul_forward(d->ctx, d->fc, d->ln, fc, NULL, fcb, 1, c->hidden, FC);
    if (c->llama)
        o->swiglu_forward(d->ctx, d->fc + FC, d->fc, 1, F);
    else
        o->gelu_forward(d->ctx, d->fc + FC, d->fc, (size_t)FC);
    o->matmul_forward(d->ctx, out, d->fc + FC, proj, NULL, projb, 1, F, c->hidden);
}

/* Expert x (routed, or E + s shared) of layer l's MoE block on the row in d->ln, into
 * d->proj. */
static void expert(struct decoder *d, int l, int x)
{
    const struct gpt2_config *c = &d->shard->cfg;
    size_t C = (size_t)c->hidden, Fm = (size_t)c->moe_ffn, e = (size_t)x;
    size_t FCm = (size_t)gpt2_expert_fc_rows(c);
    const float *fcb = param(d, GPT2_EXPFCB, l), *projb = param(d, GPT2_EXPPROJB, l);
    mlp(d, param(d, GPT2_EXPFCW, l) + e * FCm * C, fcb ? fcb + e * Fm : NULL,
        param(d, GPT2_EXPPROJW, l) + e * C * Fm, projb ? projb + e * C : NULL, (int)FCm, (int)Fm,
        d->proj);
}

/* Layer l's MoE block on the row in d->ln, into d->proj: its k experts' outputs by
 * their gates, in choice order, then the shared experts' (as the training forward). */
static void moe(struct decoder *d, int l)
{
    const struct ops *o = d->ops;
    const struct gpt2_config *c = &d->shard->cfg;
    int C = c->hidden, E = c->experts, k = c->top_k;
    o->matmul_forward(d->ctx, d->router, d->ln, param(d, GPT2_ROUTERW, l), NULL, NULL, 1, C, E);
    o->moe_route(d->ctx, d->probs, d->choice, d->gate, d->lse, d->router, 1, E, k);
    memset(d->mix, 0, (size_t)C * sizeof *d->mix);
    for (int j = 0; j < k; j++) {
        expert(d, l, d->choice[j]);
        for (int i = 0; i < C; i++) d->mix[i] += d->gate[j] * d->proj[i];
    }
    for (int s = 0; s < c->shared_experts; s++) {
        expert(d, l, E + s);
        o->residual_forward(d->ctx, d->mix, d->mix, d->proj, (size_t)C);
    }
    memcpy(d->proj, d->mix, (size_t)C * sizeof *d->proj);
}

/* one transformer block on the row in d->x, its keys and values kept at d->pos */
static void block(struct decoder *d, int l)
{
    const struct ops *o = d->ops;
    const struct gpt2_config *c = &d->shard->cfg;
    int C = c->hidden, KV = gpt2_kv_heads(c), hs = C / c->heads, F = gpt2_ffn(c);
    int QKV = (int)gpt2_qkv_rows(c), FC = (int)gpt2_fc_rows(c);
    size_t KVC = (size_t)KV * hs, at = ((size_t)l * d->T + (size_t)d->pos) * KVC;
    float *k = d->k + (size_t)l * d->T * KVC, *v = d->v + (size_t)l * d->T * KVC;
    norm(d, GPT2_LN1W, GPT2_LN1B, l);
    o->matmul_forward(d->ctx, d->qkv, d->ln, param(d, GPT2_QKVW, l), NULL,
                      param(d, GPT2_QKVB, l), 1, C, QKV);
    if (c->llama) o->rope_forward(d->ctx, d->qkv, 1, 1, c->heads, KV, hs, c->rope_theta, d->pos);
    memcpy(d->k + at, d->qkv + C, KVC * sizeof(float));
    memcpy(d->v + at, d->qkv + C + KVC, KVC * sizeof(float));
    attend(d, d->qkv, k, v);
    o->matmul_forward(d->ctx, d->proj, d->att, param(d, GPT2_ATTPROJW, l), NULL,
                      param(d, GPT2_ATTPROJB, l), 1, C, C);
    o->residual_forward(d->ctx, d->x, d->x, d->proj, (size_t)C);
    norm(d, GPT2_LN2W, GPT2_LN2B, l);
    if (gpt2_layer_moe(c, l))
        moe(d, l);
    else
        mlp(d, param(d, GPT2_FCW, l), param(d, GPT2_FCB, l), param(d, GPT2_FCPROJW, l),
            param(d, GPT2_FCPROJB, l), FC, F, d->proj);
    o->residual_forward(d->ctx, d->x, d->x, d->proj, (size_t)C);
}

int decoder_feed(struct decoder *d, int token, struct plait_error *err)
{
    const struct gpt2_config *c = &d->shard->cfg;
    const struct ops *o = d->ops;
    if (d->pos >= d->T) return error_set(err, "the context is full (%d positions)", d->T);
    if (token < 0 || token >= c->vocab)
        return error_set(err, "token %d is outside the vocabulary (%d)", token, c->vocab);
    int32_t tok = token;
    const float *wpe = param(d, GPT2_WPE, 0);
    o->encoder_forward(d->ctx, d->x, &tok, param(d, GPT2_WTE, 0), 0, c->padded_vocab,
                       wpe ? wpe + (size_t)d->pos * c->hidden : NULL, 1, 1, c->hidden);
    for (int l = 0; l < c->layers; l++) block(d, l);
    norm(d, GPT2_LNFW, GPT2_LNFB, 0);
    o->matmul_forward(d->ctx, d->logits, d->ln, param(d, c->untied ? GPT2_LMHEAD : GPT2_WTE, 0),
                      NULL, NULL, 1, c->hidden, c->padded_vocab);
    char why[256];
    if (o->take_error(d->ctx, why, sizeof why)) return error_set(err, "decoding: %s", why);
    d->pos++;
    return 0;
}
