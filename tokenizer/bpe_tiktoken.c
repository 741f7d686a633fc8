/* bpe_tiktoken.c — tiktoken's ranks files ("BASE64 RANK" a line; the rank is the id) and
 * the encodings plait knows by name: their regex and special tokens, which the files do not
 * hold. A pair of tokens merges when their bytes together are a token, at its rank. */
#include "tokenizer/bpe_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fsutil.h"

/* the case variants of the contractions are spelled out: (?i) would also fold U+017F
 * (long s) and U+212A (Kelvin) into s and k, which tiktoken's patterns do not */
#define CONTRACTIONS "('s|'S|'t|'T|'re|'rE|'Re|'RE|'ve|'vE|'Ve|'VE|'m|'M|'ll|'lL|'Ll|'LL|'d|'D)"
#define CL100K_PATTERN                                                                        \
    CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"  \
                 "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define O200K_UPPER "[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]"
#define O200K_LOWER "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]"
#define O200K_PATTERN                                                                         \
    "[^\\r\\n\\p{L}\\p{N}]?" O200K_UPPER "*" O200K_LOWER "+" CONTRACTIONS                      \
    "?|[^\\r\\n\\p{L}\\p{N}]?" O200K_UPPER "+" O200K_LOWER "*" CONTRACTIONS                    \
    "?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

struct special {
    const char *text;
    int id;
};

/* tiktoken's own definitions (tiktoken_ext/openai_public.py) */
static const struct encoding {
    const char *name, *pattern;
    struct special special[6];
} encodings[] = {
    {"gpt2", bpe_gpt2_pattern, {{"<|endoftext|>", 50256}}},
    {"r50k_base", bpe_gpt2_pattern, {{"<|endoftext|>", 50256}}},
    {"p50k_base", bpe_gpt2_pattern, {{"<|endoftext|>", 50256}}},
    {"cl100k_base",
     CL100K_PATTERN,
     {{"<|endoftext|>", 100257},
      {"<|fim_prefix|>", 100258},
      {"<|fim_middle|>", 100259},
      {"<|fim_suffix|>", 100260},
      {"<|endofprompt|>", 100276}}},
    {"o200k_base", O200K_PATTERN, {{"<|endoftext|>", 199999}, {"<|endofprompt|>", 200018}}},
};
#define N_ENCODINGS (sizeof encodings / sizeof *encodings)

const char *const bpe_tiktoken_names[] = {"gpt2", "r50k_base", "p50k_base", "cl100k_base",
                                          "o200k_base", NULL};

static int base64_value(unsigned char c)
{
    return c >= 'A' && c <= 'Z'   ? c - 'A'
           : c >= 'a' && c <= 'z' ? c - 'a' + 26
           : c >= '0' && c <= '9' ? c - '0' + 52
           : c == '+'             ? 62
           : c == '/'             ? 63
                                  : -1;
}

/* Decodes n base64 characters (with '=' padding) into out; its length, or -1. */
static long base64_decode(const char *in, size_t n, unsigned char *out)
{
    if (n % 4) return -1;
    long len = 0;
    for (size_t i = 0; i < n; i += 4) {
        int v[4], pad = 0;
        for (int k = 0; k < 4; k++) {
            unsigned char c = (unsigned char)in[i + k];
            if (c == '=' && i + 4 == n && k >= 2) {
                v[k] = 0;
                pad++;
            } else if ((v[k] = base64_value(c)) < 0 || pad) {
                return -1;
            }
        }
        uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        out[len++] = (unsigned char)(w >> 16);
        if (pad < 2) out[len++] = (unsigned char)(w >> 8);
        if (pad < 1) out[len++] = (unsigned char)w;
    }
    return len;
}

static const struct encoding *encoding_named(const char *name)
{
    for (size_t i = 0; i < N_ENCODINGS; i++)
        if (strcmp(encodings[i].name, name) == 0) return &encodings[i];
    return NULL;
}

/* "dir/cl100k_base.tiktoken" -> "cl100k_base" (in buf) */
static const char *name_of_file(const char *path, char *buf, size_t n)
{
    const char *base = strrchr(path, '/');
    snprintf(buf, n, "%s", base ? base + 1 : path);
    char *dot = strrchr(buf, '.');
    if (dot) *dot = 0;
    return buf;
}

static int read_ranks(struct bpe *b, char *text, size_t bytes, struct plait_error *err)
{
    unsigned char piece[1024];
    size_t line = 0;
    for (char *p = text, *end = text + bytes; p < end;) {
        char *nl = memchr(p, '\n', (size_t)(end - p)), *eol = nl ? nl : end;
        line++;
        char *space = memchr(p, ' ', (size_t)(eol - p));
        if (eol == p) { /* an empty line (the last) */
            p = eol + 1;
            continue;
        }
        char *after;
        long len = space && (size_t)(space - p) <= 4 * sizeof piece / 3
                       ? base64_decode(p, (size_t)(space - p), piece)
                       : -1;
        long rank = space ? strtol(space + 1, &after, 10) : -1;
        if (len < 1 || rank < 0 || rank >= (1 << 30) || after != eol)
            return error_set(err, "%s:%zu: not \"BASE64 RANK\": not a tiktoken ranks file",
                             b->path, line);
        if (bpe_add_token(b, (int)rank, piece, (size_t)len, false, err))
            return error_prefix(err, "line %zu: ", line);
        p = eol + 1;
    }
    return line ? 0 : error_set(err, "%s: empty: not a tiktoken ranks file", b->path);
}

/* every split of every token into two tokens merges into it, at its rank */
static int derive_merges(struct bpe *b, struct plait_error *err)
{
    for (int id = 0; id < b->n_ids; id++) {
        const struct bpe_token *t = &b->token[id];
        for (size_t k = 1; t->bytes && !t->special && k < t->n_bytes; k++) {
            int32_t left = bytes_map_get(&b->id_of, t->bytes, k),
                    right = bytes_map_get(&b->id_of, t->bytes + k, t->n_bytes - k);
            if (left >= 0 && right >= 0 && pair_map_put(&b->merge, left, right, (uint32_t)id, id))
                return error_set(err, "out of memory");
        }
    }
    return 0;
}

struct bpe *bpe_tiktoken_load(const char *path, const char *name, struct plait_error *err)
{
    char buf[256];
    const char *want = name ? name : name_of_file(path, buf, sizeof buf);
    const struct encoding *e = encoding_named(want);
    if (!e) {
        error_set(err,
                  "%s: tiktoken encoding \"%s\" is not one plait knows (gpt2, r50k_base, "
                  "p50k_base, cl100k_base, o200k_base): name the file NAME.tiktoken or say "
                  "--tiktoken NAME",
                  path, want);
        return NULL;
    }
    struct bpe *b = calloc(1, sizeof *b);
    size_t bytes = 0;
    char *text = NULL;
    if (!b || !(b->path = strdup(path))) {
        error_set(err, "out of memory");
        goto fail;
    }
    if (!(text = fs_read_all(path, &bytes, err)) || read_ranks(b, text, bytes, err)) goto fail;
    for (int k = 0; k < 6 && e->special[k].text; k++) {
        const char *s = e->special[k].text;
        if (bpe_add_token(b, e->special[k].id, (const unsigned char *)s, strlen(s), true, err))
            goto fail;
    }
    snprintf(b->file_name, sizeof b->file_name, "%s.tiktoken", e->name);
    b->whole_piece_first = true;
    if (derive_merges(b, err) || bpe_set_pattern(b, e->pattern, e->name, err) ||
        bpe_finish(b, err))
        goto fail;
    free(text);
    return b;
fail:
    free(text);
    bpe_free(b);
    return NULL;
}
