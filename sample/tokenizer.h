/* tokenizer.h — llm.c's tokenizer files: each token's bytes, and the
 * end-of-text token (version 2), for printing samples as text. */
#ifndef PLAIT_SAMPLE_TOKENIZER_H
#define PLAIT_SAMPLE_TOKENIZER_H

#include "common/error.h"

struct tokenizer {
    int vocab;
    char **piece; /* [vocab] decoded bytes, NUL-terminated */
    int eot;      /* end-of-text token, or -1 */
};

/* Loads an llm.c tokenizer file (magic 20240328, version 1 or 2). */
int tokenizer_load(struct tokenizer *t, const char *path, struct plait_error *err);
void tokenizer_free(struct tokenizer *t);

#endif
