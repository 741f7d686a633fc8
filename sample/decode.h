/* decode.h — generating tokens one at a time with a key/value cache: each new
 * token runs the model on its own row, its attention reading the keys and
 * values every earlier position left in the cache, instead of the whole
 * context again. The model's parameters are a whole model's (tp = pp = 1,
 * the buffer of gpt2_shard.h) in host memory; the work is the CPU backend's
 * ops (ops_cpu) with the attention of one query written here. The logits of
 * each position are the full forward pass's to fp32 rounding
 * (tests/unit/test_decode.c). An MoE block (model.moe) runs the token through the
 * k experts its router chose, as training without a capacity (one token drops
 * none), and the shared ones. */
#ifndef PLAIT_SAMPLE_DECODE_H
#define PLAIT_SAMPLE_DECODE_H

#include <stdint.h>

#include "common/error.h"
#include "common/gpt2/gpt2_shard.h"

struct ops_ctx;

struct decoder {
    const struct gpt2_shard *shard; /* a whole model's */
    const float *params;            /* its buffer, host memory */
    const struct ops *ops;          /* the CPU backend */
    struct ops_ctx *ctx;
    int T;                          /* positions the cache holds: the model's max_seq_len */
    int pos;                        /* tokens fed so far */
    float *k, *v;                   /* (L, T, C) the cache */
    float *x, *ln, *qkv, *att, *fc, *proj, *scores, *stats; /* one row's activations */
    float *logits;                  /* (Vp) after the last token fed */
    /* mixture of experts (E experts, top k): the router's logits and probabilities (E
     * each), its gates (k) and logsumexp, the chosen experts (k), the block's output (C) */
    float *router, *probs, *gate, *lse, *mix;
    int32_t *choice;
};

/* A decoder over shard's params (both must outlive it). -1 with err when the
 * shard is not a whole model or memory runs out. */
int decoder_init(struct decoder *d, const struct gpt2_shard *shard, const float *params,
                 struct plait_error *err);
void decoder_free(struct decoder *d);

/* Feeds the next token at position d->pos (which must be below d->T) and
 * computes the logits for the one after it into d->logits. */
int decoder_feed(struct decoder *d, int token, struct plait_error *err);

/* Forgets every position (the next token fed is at position 0). */
void decoder_reset(struct decoder *d);

#endif
