/* tokenizer.c — llm.c's tokenizer files (tokenizer.h). */
#include "sample/tokenizer.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/fsutil.h"

#define TOKENIZER_MAGIC 20240328

int tokenizer_load(struct tokenizer *t, const char *path, struct plait_error *err)
{
    memset(t, 0, sizeof *t);
    t->eot = -1;
    FILE *f = fs_fopen_regular(path, err);
    if (!f) return -1;
    uint32_t h[256];
    int rc = -1;
    if (fread(h, 4, 256, f) != 256 || h[0] != TOKENIZER_MAGIC || (h[1] != 1 && h[1] != 2)) {
        error_set(err, "%s: not an llm.c tokenizer file (magic %u version %u)", path, h[0], h[1]);
        goto out;
    }
    if (h[2] < 1 || h[2] > 65536 || (h[1] == 2 && h[3] >= h[2])) {
        error_set(err,
                  "%s: inconsistent header (vocab %u, end-of-text token %u): tokens are uint16 "
                  "and the end-of-text token must be one of them",
                  path, h[2], h[3]);
        goto out;
    }
    t->vocab = (int)h[2];
    if (h[1] == 2) t->eot = (int)h[3];
    t->piece = calloc((size_t)t->vocab, sizeof *t->piece);
    if (!t->piece) {
        error_set(err, "out of memory");
        goto out;
    }
    for (int i = 0; i < t->vocab; i++) {
        unsigned char len;
        if (fread(&len, 1, 1, f) != 1 || !(t->piece[i] = calloc(1, (size_t)len + 1)) ||
            fread(t->piece[i], 1, len, f) != len) {
            error_set(err, "%s: truncated at token %d", path, i);
            goto out;
        }
    }
    rc = 0;
out:
    fclose(f);
    if (rc) tokenizer_free(t);
    return rc;
}

void tokenizer_free(struct tokenizer *t)
{
    if (t->piece)
        for (int i = 0; i < t->vocab; i++) free(t->piece[i]);
    free(t->piece);
    memset(t, 0, sizeof *t);
}
