/* sample.h — samples during a run: the rank's model, when it is a whole one,
 * through the sampler (sample/sampler.h). */
#ifndef PLAIT_RUNTIME_SAMPLE_H
#define PLAIT_RUNTIME_SAMPLE_H

#include <stdio.h>

#include "common/error.h"
#include "common/plan/plan.h"
#include "common/rng.h"
#include "runtime/model.h"
#include "sample/sampler.h"

/* Writes s->tokens sampled tokens after the prompt to out as they come, from
 * m's parameters (copied to host memory where they are a device's). -1 with
 * err when m is a part of the model (tp or pp > 1). */
int sample_text(struct model *m, const struct plan_sample *s, const struct tokenizer *tok,
                struct rng *r, FILE *out, struct plait_error *err);

#endif
