/* bpe_json.c — Hugging Face tokenizer.json for byte-level BPE: model.vocab and model.merges
 * (as "a b" strings or [a, b] pairs) through GPT-2's byte-to-character map, the added
 * tokens, the pre-tokenizer's regex (ByteLevel's own, or a Split's), ignore_merges. What a
 * byte-level BPE does not use (a normalizer, dropout, subword affixes, other decoders) is
 * refused with its JSON path. */
#include "tokenizer/bpe_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json_read.h"

/* GPT-2's bytes_to_unicode: the printable bytes stand for themselves, the others for the
 * characters from U+0100 on, in byte order. byte_of[c] for c < 324: the byte, else -1. */
static void byte_map(int byte_of[324])
{
    for (int c = 0; c < 324; c++) byte_of[c] = -1;
    int next = 256;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
        byte_of[printable ? b : next++] = b;
    }
}

/* A token's text in the byte-level alphabet -> its bytes (out holds strlen(s)); -1 when a
 * character is not of the alphabet. */
static long token_bytes(const int byte_of[324], const char *s, unsigned char *out)
{
    long n = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        int c, len = *p < 0x80 ? 1 : (*p & 0xe0) == 0xc0 ? 2 : 0;
        if (len == 1) c = *p;
        else if (len == 2 && (p[1] & 0xc0) == 0x80) c = (*p & 0x1f) << 6 | (p[1] & 0x3f);
        else return -1;
        if (c >= 324 || byte_of[c] < 0) return -1;
        out[n++] = (unsigned char)byte_of[c];
        p += len;
    }
    return n;
}

struct loader {
    struct bpe *b;
    struct json_read r;
    int byte_of[324];
    unsigned char *scratch; /* a token's bytes */
};

static int read_vocab(struct loader *l, json_t *vocab)
{
    const char *text;
    json_t *v;
    json_object_foreach(vocab, text, v) {
        long n = token_bytes(l->byte_of, text, l->scratch);
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return json_read_fail(&l->r, "model.vocab", text, "not a token id");
        if (n < 1)
            return json_read_fail(&l->r, "model.vocab", text,
                                  "not a byte-level token (a character outside GPT-2's byte "
                                  "alphabet): only byte-level BPE tokenizers are read");
        if (bpe_add_token(l->b, (int)json_integer_value(v), l->scratch, (size_t)n, false,
                          l->r.err))
            return l->r.failed = error_prefix(l->r.err, "model.vocab.%s: ", text);
    }
    return 0;
}

/* merges[i]: "a b" or ["a", "b"] -> its two tokens' ids */
static int merge_pair(struct loader *l, json_t *m, size_t i, int32_t id[2])
{
    char at[64], *parts[2] = {NULL, NULL};
    snprintf(at, sizeof at, "model.merges[%zu]", i);
    char *both = json_is_string(m) ? strdup(json_string_value(m)) : NULL;
    if (both && (parts[1] = strchr(both, ' '))) {
        *parts[1]++ = 0;
        parts[0] = both;
    } else if (json_is_array(m) && json_array_size(m) == 2 &&
               json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
        parts[0] = (char *)json_string_value(json_array_get(m, 0));
        parts[1] = (char *)json_string_value(json_array_get(m, 1));
    }
    int rc = 0;
    for (int k = 0; k < 2 && rc == 0; k++) {
        long n = parts[k] ? token_bytes(l->byte_of, parts[k], l->scratch) : -1;
        id[k] = n > 0 ? bytes_map_get(&l->b->id_of, l->scratch, (size_t)n) : -1;
        if (!parts[k])
            rc = error_set(l->r.err, "%s: %s: not \"a b\" or [\"a\", \"b\"]", l->r.file, at);
        else if (id[k] < 0)
            rc = error_set(l->r.err, "%s: %s: \"%s\" is not in model.vocab", l->r.file, at,
                           parts[k]);
    }
    free(both);
    return l->r.failed = rc;
}

static int read_merges(struct loader *l, json_t *merges)
{
    size_t i;
    json_t *m;
    json_array_foreach(merges, i, m) {
        int32_t id[2];
        if (merge_pair(l, m, i, id)) return -1;
        const struct bpe_token *a = &l->b->token[id[0]], *c = &l->b->token[id[1]];
        memcpy(l->scratch, a->bytes, a->n_bytes);
        memcpy(l->scratch + a->n_bytes, c->bytes, c->n_bytes);
        int32_t merged = bytes_map_get(&l->b->id_of, l->scratch, a->n_bytes + c->n_bytes);
        if (merged < 0)
            return l->r.failed = error_set(l->r.err, "%s: model.merges[%zu]: what it makes is "
                                           "not in model.vocab", l->r.file, i);
        if (pair_map_put(&l->b->merge, id[0], id[1], (uint32_t)i, merged))
            return l->r.failed = error_set(l->r.err, "out of memory");
    }
    return 0;
}

static int read_added(struct loader *l, json_t *added)
{
    size_t i;
    json_t *t;
    char at[64];
    json_array_foreach(added, i, t) {
        snprintf(at, sizeof at, "added_tokens[%zu]", i);
        int64_t id = json_read_int(&l->r, t, at, "id");
        const char *text = json_read_string(&l->r, t, at, "content");
        if (l->r.failed) return -1;
        if (bpe_add_token(l->b, (int)id, (const unsigned char *)text, strlen(text), true,
                          l->r.err))
            return l->r.failed = error_prefix(l->r.err, "%s: ", at);
    }
    return 0;
}

/* One pre-tokenizer: ByteLevel (its regex when use_regex) or a Split on a regex, Isolated. */
static int read_pre_one(struct loader *l, json_t *p, const char *at, bool *have_regex)
{
    const char *type = json_read_string(&l->r, p, at, "type");
    if (l->r.failed) return -1;
    if (strcmp(type, "ByteLevel") == 0) {
        json_t *use = json_object_get(p, "use_regex");
        l->b->add_prefix_space = json_is_true(json_object_get(p, "add_prefix_space"));
        if (use && !json_is_true(use)) return 0;
        if (*have_regex) return json_read_fail(&l->r, at, "use_regex", "a second regex");
        *have_regex = true;
        return bpe_set_pattern(l->b, bpe_gpt2_pattern, "pre_tokenizer", l->r.err) ? l->r.failed = -1 : 0;
    }
    if (strcmp(type, "Split") != 0)
        return json_read_fail(&l->r, at, "type",
                              "\"%s\": only ByteLevel and Split pre-tokenizers are read", type);
    char pat_at[128];
    snprintf(pat_at, sizeof pat_at, "%s.pattern", at);
    json_t *pattern = json_read_object(&l->r, p, at, "pattern");
    const char *regex = l->r.failed ? NULL : json_read_string(&l->r, pattern, pat_at, "Regex");
    const char *behavior = json_read_string(&l->r, p, at, "behavior");
    if (l->r.failed) return -1;
    if (strcmp(behavior, "Isolated") != 0 || json_is_true(json_object_get(p, "invert")))
        return json_read_fail(&l->r, at, "behavior", "\"%s\": only Isolated, not inverted",
                              behavior);
    if (*have_regex) return json_read_fail(&l->r, at, "pattern", "a second regex");
    *have_regex = true;
    return bpe_set_pattern(l->b, regex, pat_at, l->r.err) ? l->r.failed = -1 : 0;
}

static int read_pre(struct loader *l, json_t *root)
{
    json_t *pre = json_object_get(root, "pre_tokenizer");
    bool have_regex = false;
    if (!pre || json_is_null(pre)) return 0;
    const char *type = json_read_string(&l->r, pre, "pre_tokenizer", "type");
    if (l->r.failed || strcmp(type, "Sequence") != 0)
        return l->r.failed ? -1 : read_pre_one(l, pre, "pre_tokenizer", &have_regex);
    json_t *list = json_read_array(&l->r, pre, "pre_tokenizer", "pretokenizers");
    size_t i;
    json_t *p;
    char at[64];
    json_array_foreach(list, i, p) {
        snprintf(at, sizeof at, "pre_tokenizer.pretokenizers[%zu]", i);
        if (read_pre_one(l, p, at, &have_regex)) return -1;
    }
    return l->r.failed;
}

/* what a byte-level BPE must not have */
static int refuse_others(struct loader *l, json_t *root, json_t *model)
{
    json_t *norm = json_object_get(root, "normalizer"), *dec = json_object_get(root, "decoder");
    const char *type = json_read_string(&l->r, model, "model", "type");
    if (l->r.failed) return -1;
    if (strcmp(type, "BPE") != 0)
        return json_read_fail(&l->r, "model", "type", "\"%s\": only BPE is read", type);
    if (norm && !json_is_null(norm))
        return json_read_fail(&l->r, "", "normalizer",
                              "a normalizer is not supported (byte-level BPE has none)");
    if (dec && !json_is_null(dec) &&
        strcmp(json_string_value(json_object_get(dec, "type")) ?: "", "ByteLevel") != 0)
        return json_read_fail(&l->r, "decoder", "type", "only a ByteLevel decoder is read");
    static const char *const unused[] = {"dropout", "continuing_subword_prefix",
                                         "end_of_word_suffix", NULL};
    for (int k = 0; unused[k]; k++) {
        json_t *v = json_object_get(model, unused[k]);
        if (v && !json_is_null(v) && !(json_is_string(v) && !*json_string_value(v)))
            return json_read_fail(&l->r, "model", unused[k], "not supported (byte-level BPE)");
    }
    return 0;
}

struct bpe *bpe_json_load(const char *path, struct plait_error *err)
{
    struct loader l = {.r = {.file = path, .err = err}};
    byte_map(l.byte_of);
    json_t *root = NULL;
    if (!(l.b = calloc(1, sizeof *l.b)) || !(l.b->path = strdup(path))) {
        error_set(err, "out of memory");
        goto fail;
    }
    snprintf(l.b->file_name, sizeof l.b->file_name, "tokenizer.json");
    if (!(root = json_read_file(&l.r, path))) goto fail;
    json_t *model = json_read_object(&l.r, root, "", "model");
    if (l.r.failed || refuse_others(&l, root, model)) goto fail;
    json_t *vocab = json_read_object(&l.r, model, "model", "vocab"),
           *merges = json_read_array(&l.r, model, "model", "merges"),
           *added = json_object_get(root, "added_tokens");
    size_t most = 64; /* the longest token's bytes: at most its text's */
    const char *text;
    json_t *v;
    json_object_foreach(vocab, text, v) most = strlen(text) > most ? strlen(text) : most;
    if (l.r.failed) goto fail;
    if (!(l.scratch = malloc(2 * most))) {
        error_set(err, "out of memory");
        goto fail;
    }
    l.b->whole_piece_first = json_is_true(json_object_get(model, "ignore_merges"));
    if (read_vocab(&l, vocab) || read_merges(&l, merges) ||
        (json_is_array(added) && read_added(&l, added)) || read_pre(&l, root) ||
        bpe_finish(l.b, err))
        goto fail;
    free(l.scratch);
    json_decref(root);
    return l.b;
fail:
    free(l.scratch);
    json_decref(root);
    bpe_free(l.b);
    return NULL;
}
