/* sample.h — text from the model: autoregressive sampling with temperature
 * and top-k, and turning tokens into text (bytes for a vocabulary of at most
 * 256, an llm.c tokenizer file for others, token ids otherwise). */
#ifndef PLAIT_RUNTIME_SAMPLE_H
#define PLAIT_RUNTIME_SAMPLE_H

#include <stdio.h>

#include "common/error.h"
#include "common/plan/plan.h"
#include "common/rng.h"
#include "runtime/model.h"

struct tokenizer {
    int vocab;
    char **piece; /* [vocab] decoded bytes, NUL-terminated */
    int eot;      /* end-of-text token, or -1 */
};

/* Loads an llm.c tokenizer file (magic 20240328, version 1 or 2). */
int tokenizer_load(struct tokenizer *t, const char *path, struct plait_error *err);
void tokenizer_free(struct tokenizer *t);

/* Writes s->tokens sampled tokens after the prompt to out as they come. tok
 * may be NULL (bytes or ids are printed then). */
int sample_text(struct model *m, const struct plan_sample *s, const struct tokenizer *tok,
                struct rng *r, FILE *out, struct plait_error *err);

#endif
