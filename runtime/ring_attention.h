/* ring_attention.h — context parallelism inside a model: a sequence of cp·T
 * tokens cut into 2·cp chunks of T/2, cp rank i holding chunks i and
 * 2·cp−1−i (the causal work then even over the ranks, as Megatron and
 * torchtitan split it), so that every op but the attention runs on the rank's
 * T tokens alone; the embedding and a Llama's rotary positions take each
 * chunk's true positions; the attention passes each rank's key/value block
 * around the cp group's ring. Which ranks form the ring is runtime/parallel.c's. */
#ifndef PLAIT_RUNTIME_RING_ATTENTION_H
#define PLAIT_RUNTIME_RING_ATTENTION_H

#include <stdbool.h>
#include <stdint.h>

#include "common/error.h"

struct model;
struct layer_acts;

/* Which of a sequence's 2·cp chunks is cp rank r's first (half 0: chunk r) or second
 * (half 1: chunk 2·cp−1−r). */
int ring_chunk(int cp, int r, int half);

/* The positions of cp rank r's T tokens of a sequence (T even): its two chunks,
 * r's first. */
void ring_positions(int32_t *pos, int T, int cp, int r);

/* Cp rank r's T tokens (B,T) of each of the B sequences of cp·T in whole
 * (B,cp·T): its two chunks one after the other. */
void ring_chunks(int32_t *mine, const int32_t *whole, int B, int T, int cp, int r);

/* Whether the model's backend runs the ring, and every rank's positions into
 * the model's memory (model_init, cp > 1). */
int ring_init(struct model *m, struct plait_error *err);

/* The embedding of the rank's tokens (as ops->encoder_forward), wpe by position */
void ring_encoder_forward(struct model *m, float *out, const int32_t *tokens, const float *wte,
                          const float *wpe, int B, int T);
/* Its backward (as ops->encoder_backward): dwte added, dwpe written or added */
void ring_encoder_backward(struct model *m, float *dwte, float *dwpe, const float *dout,
                           const int32_t *tokens, int B, int T, bool accumulate);

/* A Llama's rotary positions on x (B,T,(NH+2KV)·hs/tp) in place, and their backward;
 * with expanded (B,T,3C/tp) the fused ops (ops->rope_kv_expand: the backend has them)
 * instead: forward, expanded = x's key/value heads repeated and rotated, x left as it was;
 * backward, x = expanded's group sums rotated back */
void ring_rope(struct model *m, float *x, float *expanded, int B, int T, bool backward);

/* The attention of a layer's q, k and v (a->qkv) over the whole sequence: out
 * into a->atty, each row's log-sum-exp into a->att. */
int ring_attention_forward(struct model *m, struct layer_acts *a, int B, int T,
                           struct plait_error *err);

/* Its backward: dqkv (B,T,3C/tp) written from dout (B,T,C/tp); the key/value
 * gradient of each block is summed on its way around the ring and comes home. */
int ring_attention_backward(struct model *m, struct layer_acts *a, float *dqkv, const float *dout,
                            int B, int T, struct plait_error *err);

#endif
