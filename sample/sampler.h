/* sampler.h — text from a whole model: autoregressive sampling with
 * temperature and top-k through a key/value cache (decode.h), and turning
 * tokens into text (bytes for a vocabulary of at most 256, the run's tokenizer
 * (tokenizer.h) for others, token ids otherwise), written as valid UTF-8; a BPE
 * tokenizer also encodes the prompt. What plait
 * train samples during a run (runtime/sample.h) and plait sample from a
 * checkpoint both run. */
#ifndef PLAIT_SAMPLE_SAMPLER_H
#define PLAIT_SAMPLE_SAMPLER_H

#include <stdio.h>

#include "common/error.h"
#include "common/gpt2/gpt2_shard.h"
#include "common/plan/plan.h"
#include "common/rng.h"
#include "sample/tokenizer.h"

/* Writes s->tokens sampled tokens after s->prompt to out as they come, from
 * the whole model `whole` whose buffer (gpt2_shard.h's order) is params, in
 * host memory. tok may be NULL (bytes or ids are printed then). */
int sample_tokens(const struct gpt2_shard *whole, const float *params, const struct plan_sample *s,
                  const struct tokenizer *tok, struct rng *r, FILE *out, struct plait_error *err);

#endif
