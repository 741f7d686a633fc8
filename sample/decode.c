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
    size_t C = (size_t)c->hidden, cache = (size_t)c->layers * (size_t)d->T * C;
    d->k = malloc(cache * sizeof *d->k);
    d->v = malloc(cache * sizeof *d->v);
    d->x = malloc(C * sizeof *d->x);
    d->ln = malloc(C * sizeof *d->ln);
    d->qkv = malloc(3 * C * sizeof *d->qkv);
    d->att = malloc(C * sizeof *d->att);
    d->fc = malloc(8 * C * sizeof *d->fc); /* the MLP's product, then its GELU */
    d->proj = malloc(C * sizeof *d->proj);
    d->scores = malloc((size_t)d->T * sizeof *d->scores);
    d->stats = malloc(2 * sizeof *d->stats);
    d->logits = malloc((size_t)c->padded_vocab * sizeof *d->logits);
    if (!d->k || !d->v || !d->x || !d->ln || !d->qkv || !d->att || !d->fc || !d->proj ||
        !d->scores || !d->stats || !d->logits) {
        decoder_free(d);
        return error_set(err, "out of memory for the decoder's cache (%zu MB)",
                         2 * cache * sizeof(float) >> 20);
    }
    return 0;
}

void decoder_free(struct decoder *d)
{
    float *bufs[] = {d->k,    d->v,    d->x,      d->ln,    d->qkv,   d->att,
                     d->fc,   d->proj, d->scores, d->stats, d->logits};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]);
    if (d->ctx) d->ops->close(d->ctx);
    memset(d, 0, sizeof *d);
}

void decoder_reset(struct decoder *d)
{
    d->pos = 0;
}

static const float *param(const struct decoder *d, enum gpt2_tensor t, int l)
{
    return d->params + gpt2_shard_offset(d->shard, t, l);
}

/* att (C) = each head's softmax(q·kᵀ/√hs) over positions [0, pos] times v, for the row whose
 * keys and values are the cache's last */
static void attend(struct decoder *d, const float *q, const float *k, const float *v)
{
    int C = d->shard->cfg.hidden, NH = d->shard->cfg.heads, hs = C / NH, n = d->pos + 1;
    float scale = 1.0f / sqrtf((float)hs);
    for (int h = 0; h < NH; h++) {
        const float *qh = q + h * hs;
        float mx = -INFINITY;
        for (int t = 0; t < n; t++) {
            const float *kt = k + (size_t)t * C + h * hs;
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
            const float *vt = v + (size_t)t * C + h * hs;
            float p = d->scores[t] / sum;
            for (int i = 0; i < hs; i++) out[i] += p * vt[i];
        }
    }
}

/* one transformer block on the row in d->x, its keys and values kept at d->pos */
static void block(struct decoder *d, int l)
{
    const struct ops *o = d->ops;
    int C = d->shard->cfg.hidden;
    size_t at = ((size_t)l * d->T + (size_t)d->pos) * C;
    float *k = d->k + (size_t)l * d->T * C, *v = d->v + (size_t)l * d->T * C;
    o->layernorm_forward(d->ctx, d->ln, d->stats, d->stats + 1, d->x, param(d, GPT2_LN1W, l),
                         param(d, GPT2_LN1B, l), 1, C);
    o->matmul_forward(d->ctx, d->qkv, d->ln, param(d, GPT2_QKVW, l), NULL,
                      param(d, GPT2_QKVB, l), 1, C, 3 * C);
    memcpy(d->k + at, d->qkv + C, (size_t)C * sizeof(float));
    memcpy(d->v + at, d->qkv + 2 * C, (size_t)C * sizeof(float));
    attend(d, d->qkv, k, v);
    o->matmul_forward(d->ctx, d->proj, d->att, param(d, GPT2_ATTPROJW, l), NULL,
                      param(d, GPT2_ATTPROJB, l), 1, C, C);
    o->residual_forward(d->ctx, d->x, d->x, d->proj, (size_t)C);
    o->layernorm_forward(d->ctx, d->ln, d->stats, d->stats + 1, d->x, param(d, GPT2_LN2W, l),
                         param(d, GPT2_LN2B, l), 1, C);
    o->matmul_forward(d->ctx, d->fc, d->ln, param(d, GPT2_FCW, l), NULL, param(d, GPT2_FCB, l),
                      1, C, 4 * C);
    o->gelu_forward(d->ctx, d->fc + 4 * C, d->fc, (size_t)4 * C);
    o->matmul_forward(d->ctx, d->proj, d->fc + 4 * C, param(d, GPT2_FCPROJW, l), NULL,
                      param(d, GPT2_FCPROJB, l), 1, 4 * C, C);
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
    o->encoder_forward(d->ctx, d->x, &tok, param(d, GPT2_WTE, 0), 0, c->padded_vocab,
                       param(d, GPT2_WPE, 0) + (size_t)d->pos * c->hidden, 1, 1, c->hidden);
    for (int l = 0; l < c->layers; l++) block(d, l);
    o->layernorm_forward(d->ctx, d->ln, d->stats, d->stats + 1, d->x, param(d, GPT2_LNFW, 0),
                         param(d, GPT2_LNFB, 0), 1, c->hidden);
    o->matmul_forward(d->ctx, d->logits, d->ln, param(d, GPT2_WTE, 0), NULL, NULL, 1, c->hidden,
                      c->padded_vocab);
    char why[256];
    if (o->take_error(d->ctx, why, sizeof why)) return error_set(err, "decoding: %s", why);
    d->pos++;
    return 0;
}
