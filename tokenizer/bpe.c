/* bpe.c — a tokenizer's tables: which loader reads a file, tokens by id, the pre-tokenizer
 * and special-token regexes, the end-of-text token, decoding. Reading tokenizer.json is
 * bpe_json.c's, tiktoken files bpe_tiktoken.c's, encoding bpe_encode.c's. */
#include "tokenizer/bpe_impl.h"

#include <stdlib.h>
#include <string.h>

const char bpe_gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

struct bpe *bpe_json_load(const char *path, struct plait_error *err);
struct bpe *bpe_tiktoken_load(const char *path, const char *name, struct plait_error *err);

static bool ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), k = strlen(tail);
    return n >= k && strcmp(s + n - k, tail) == 0;
}

struct bpe *bpe_load(const char *path, const char *tiktoken_name, struct plait_error *err)
{
    if (tiktoken_name || ends_with(path, ".tiktoken")) return bpe_tiktoken_load(path, tiktoken_name, err);
    return bpe_json_load(path, err);
}

void bpe_free(struct bpe *b)
{
    if (!b) return;
    for (int i = 0; i < b->n_alloc; i++) free(b->token[i].bytes);
    free(b->token);
    bytes_map_free(&b->id_of);
    bytes_map_free(&b->special_of);
    pair_map_free(&b->merge);
    pcre2_code_free(b->pattern);
    pcre2_code_free(b->specials);
    free(b->path);
    free(b);
}

int bpe_vocab(const struct bpe *b)
{
    return b->n_ids;
}

int bpe_eot(const struct bpe *b)
{
    return b->eot;
}

const char *bpe_file_name(const struct bpe *b)
{
    return b->file_name;
}

const unsigned char *bpe_token_bytes(const struct bpe *b, int id, size_t *bytes)
{
    if (id < 0 || id >= b->n_ids || !b->token[id].bytes) return NULL;
    *bytes = b->token[id].n_bytes;
    return b->token[id].bytes;
}

int bpe_add_token(struct bpe *b, int id, const unsigned char *bytes, size_t n, bool special,
                  struct plait_error *err)
{
    if (id < 0 || id >= (1 << 30))
        return error_set(err, "%s: token id %d is out of range", b->path, id);
    if (id >= b->n_alloc) {
        int want = id + 1 > 2 * b->n_alloc ? id + 1 : 2 * b->n_alloc;
        struct bpe_token *t = realloc(b->token, (size_t)want * sizeof *t);
        if (!t) return error_set(err, "out of memory");
        memset(t + b->n_alloc, 0, (size_t)(want - b->n_alloc) * sizeof *t);
        b->token = t;
        b->n_alloc = want;
    }
    struct bpe_token *t = &b->token[id];
    if (t->bytes && (t->n_bytes != n || memcmp(t->bytes, bytes, n) != 0))
        return error_set(err, "%s: two tokens have id %d", b->path, id);
    if (t->bytes) { /* said twice: an added token that is also in the vocabulary */
        t->special |= special;
        return special && bytes_map_put(&b->special_of, t->bytes, n, id)
                   ? error_set(err, "out of memory")
                   : 0;
    }
    if (!(t->bytes = malloc(n ? n : 1))) return error_set(err, "out of memory");
    memcpy(t->bytes, bytes, n);
    t->n_bytes = n;
    t->special = special;
    if (id >= b->n_ids) b->n_ids = id + 1;
    if (bytes_map_put(special ? &b->special_of : &b->id_of, t->bytes, n, id))
        return error_set(err, "out of memory");
    return 0;
}

static pcre2_code *compile(const char *regex, size_t bytes, const char *what, const char *path,
                           struct plait_error *err)
{
    int code;
    PCRE2_SIZE at;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)regex, bytes,
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &code, &at,
                                   NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        error_set(err, "%s: %s: the regex does not compile at offset %zu: %s", path, what,
                  (size_t)at, (const char *)msg);
        return NULL;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* where JIT is missing, the interpreter runs */
    return re;
}

int bpe_set_pattern(struct bpe *b, const char *regex, const char *what, struct plait_error *err)
{
    pcre2_code_free(b->pattern);
    b->pattern = compile(regex, PCRE2_ZERO_TERMINATED, what, b->path, err);
    return b->pattern ? 0 : -1;
}

static int by_length_down(const void *x, const void *y, void *arg)
{
    const struct bpe_token *t = arg;
    size_t a = t[*(const int *)x].n_bytes, c = t[*(const int *)y].n_bytes;
    return (a < c) - (a > c);
}

/* \Q...\E for each special token's text, longest first, joined by | */
static int compile_specials(struct bpe *b, struct plait_error *err)
{
    int n = 0, *ids = malloc((size_t)b->n_ids * sizeof *ids + 1);
    size_t bytes = 1;
    if (!ids) return error_set(err, "out of memory");
    for (int i = 0; i < b->n_ids; i++)
        if (b->token[i].bytes && b->token[i].special && b->token[i].n_bytes) {
            ids[n++] = i;
            bytes += 2 * b->token[i].n_bytes + 6;
        }
    char *re = n ? malloc(bytes) : NULL;
    int rc = n && !re ? error_set(err, "out of memory") : 0;
    if (n && re) {
        qsort_r(ids, (size_t)n, sizeof *ids, by_length_down, b->token);
        size_t at = 0;
        for (int k = 0; k < n; k++) {
            const struct bpe_token *t = &b->token[ids[k]];
            if (k) re[at++] = '|';
            for (size_t i = 0; i < t->n_bytes; i++) { /* \E inside a token ends \Q: escape all */
                unsigned char c = t->bytes[i];
                if (c < 0x80 && !((c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') ||
                                  (c >= 'a' && c <= 'z')))
                    re[at++] = '\\';
                re[at++] = (char)c;
            }
        }
        b->specials = compile(re, at, "the special tokens", b->path, err);
        rc = b->specials ? 0 : -1;
    }
    free(re);
    free(ids);
    return rc;
}

/* the end-of-text token: the first of these names the tokenizer has */
static int find_eot(const struct bpe *b)
{
    static const char *const names[] = {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>",
                                        NULL};
    for (int k = 0; names[k]; k++)
        for (int i = 0; i < b->n_ids; i++) {
            const struct bpe_token *t = &b->token[i];
            if (t->bytes && t->n_bytes == strlen(names[k]) &&
                memcmp(t->bytes, names[k], t->n_bytes) == 0)
                return i;
        }
    return -1;
}

int bpe_finish(struct bpe *b, struct plait_error *err)
{
    for (int c = 0; c < 256; c++) {
        unsigned char byte = (unsigned char)c;
        if ((b->byte_id[c] = bytes_map_get(&b->id_of, &byte, 1)) < 0)
            return error_set(err,
                             "%s: byte 0x%02x has no token of its own: not a byte-level BPE "
                             "tokenizer",
                             b->path, c);
    }
    b->eot = find_eot(b);
    return compile_specials(b, err);
}

int bpe_decode(const struct bpe *b, const int32_t *ids, size_t n, char **text, size_t *bytes,
               size_t *cap, struct plait_error *err)
{
    for (size_t k = 0; k < n; k++) {
        size_t len;
        const unsigned char *p = bpe_token_bytes(b, ids[k], &len);
        if (!p) return error_set(err, "%s: no token has id %d", b->path, ids[k]);
        if (*bytes + len + 1 > *cap) {
            size_t want = 2 * *cap > *bytes + len + 1 ? 2 * *cap : *bytes + len + 64;
            char *t = realloc(*text, want);
            if (!t) return error_set(err, "out of memory");
            *text = t;
            *cap = want;
        }
        memcpy(*text + *bytes, p, len);
        *bytes += len;
        (*text)[*bytes] = 0;
    }
    return 0;
}

int bpe_ids_push(struct bpe_ids *out, int32_t id)
{
    if (out->n == out->cap) {
        size_t want = out->cap ? 2 * out->cap : 256;
        int32_t *p = realloc(out->id, want * sizeof *p);
        if (!p) return -1;
        out->id = p;
        out->cap = want;
    }
    out->id[out->n++] = id;
    return 0;
}

void bpe_ids_free(struct bpe_ids *ids)
{
    free(ids->id);
    memset(ids, 0, sizeof *ids);
}
