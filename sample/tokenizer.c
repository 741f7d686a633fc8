/* tokenizer.c — the samples' tokenizer (tokenizer.h): llm.c's tokenizer files, BPE ones
 * through tokenizer/bpe.h, and where a run's is found. */
#include "sample/tokenizer.h"

#include <glob.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fsutil.h"

#define TOKENIZER_MAGIC 20240328

static int load_bpe(struct tokenizer *t, const char *path, struct plait_error *err)
{
    if (!(t->bpe = bpe_load(path, NULL, err))) return -1;
    t->vocab = bpe_vocab(t->bpe);
    t->eot = bpe_eot(t->bpe);
    return 0;
}

int tokenizer_load(struct tokenizer *t, const char *path, struct plait_error *err)
{
    memset(t, 0, sizeof *t);
    t->eot = -1;
    FILE *f = fs_fopen_regular(path, err);
    if (!f) return -1;
    uint32_t h[256] = {0};
    int rc = -1;
    size_t got = fread(h, 4, 256, f);
    if (h[0] != TOKENIZER_MAGIC) { /* not llm.c's: a BPE tokenizer's file */
        fclose(f);
        return load_bpe(t, path, err);
    }
    if (got != 256 || (h[1] != 1 && h[1] != 2)) {
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
    bpe_free(t->bpe);
    memset(t, 0, sizeof *t);
}

const char *tokenizer_piece(const struct tokenizer *t, int token, size_t *bytes)
{
    if (t->bpe) return (const char *)bpe_token_bytes(t->bpe, token, bytes);
    if (token < 0 || token >= t->vocab) return NULL;
    *bytes = strlen(t->piece[token]);
    return t->piece[token];
}

char *tokenizer_beside(const char *dir)
{
    char *path = NULL;
    glob_t g;
    if (asprintf(&path, "%s/tokenizer.json", dir) < 0) return NULL;
    if (access(path, R_OK) == 0) return path;
    free(path);
    path = NULL;
    if (asprintf(&path, "%s/*.tiktoken", dir) < 0) return NULL;
    int rc = glob(path, 0, NULL, &g);
    free(path);
    path = rc == 0 && g.gl_pathc ? strdup(g.gl_pathv[0]) : NULL;
    if (rc == 0) globfree(&g);
    return path;
}

int tokenizer_open(struct tokenizer *t, const struct plan *p, bool *found,
                   struct plait_error *err)
{
    memset(t, 0, sizeof *t);
    *found = false;
    if (p->data.tokenizer) {
        if (tokenizer_load(t, p->data.tokenizer, err))
            return error_prefix(err, "data.tokenizer: ");
        *found = true;
        return 0;
    }
    char *dir = fs_dirname(p->data.train), *path = dir ? tokenizer_beside(dir) : NULL;
    free(dir);
    int rc = path ? tokenizer_load(t, path, err) : 0;
    if (rc) error_prefix(err, "the tokenizer beside data.train: ");
    *found = path && rc == 0;
    free(path);
    return rc;
}
