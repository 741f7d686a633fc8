/* tokenizer.h — the tokenizer samples are written and prompts read with: an llm.c tokenizer
 * file (each token's bytes, the end-of-text token: decoding only) or a BPE tokenizer
 * (tokenizer/bpe.h: a tokenizer.json or tiktoken file, which also encodes prompts). */
#ifndef PLAIT_SAMPLE_TOKENIZER_H
#define PLAIT_SAMPLE_TOKENIZER_H

#include <stdbool.h>

#include "common/error.h"
#include "common/plan/plan.h"
#include "tokenizer/bpe.h"

struct tokenizer {
    int vocab;
    char **piece;    /* llm.c's: [vocab] decoded bytes, NUL-terminated; NULL for a BPE one */
    int eot;         /* end-of-text token, or -1 */
    struct bpe *bpe; /* a BPE tokenizer, or NULL */
};

/* Loads an llm.c tokenizer file (magic 20240328, version 1 or 2), else a tokenizer.json or
 * NAME.tiktoken (bpe_load). */
int tokenizer_load(struct tokenizer *t, const char *path, struct plait_error *err);
void tokenizer_free(struct tokenizer *t);

/* The run's tokenizer: data.tokenizer when the plan names one, else the one plait data
 * prepare --tokenizer left beside the training shards (tokenizer.json, else the first
 * *.tiktoken in data.train's directory). *found is false when there is none (0 returned). */
int tokenizer_open(struct tokenizer *t, const struct plan *p, bool *found,
                   struct plait_error *err);

/* The tokenizer file plait data prepare --tokenizer left in dir (tokenizer.json, else the
 * first *.tiktoken): malloc'ed, or NULL when there is none. */
char *tokenizer_beside(const char *dir);

/* token's bytes (*bytes long), or NULL when the tokenizer has no such token. */
const char *tokenizer_piece(const struct tokenizer *t, int token, size_t *bytes);

#endif
