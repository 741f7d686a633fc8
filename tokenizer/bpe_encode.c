/* bpe_encode.c — text to ids: special tokens split out (when asked), the pre-tokenizer's
 * regex cuts the rest into pieces, each piece's bytes merge pair by pair, the lowest rank
 * first (tiktoken's and Hugging Face's byte-level BPE), through a per-thread cache of the
 * pieces seen. */
#include "tokenizer/bpe_impl.h"

#include <stdlib.h>
#include <string.h>

enum {
    CACHE_KEY_BYTES = 4 << 20, /* the cache is emptied when either fills */
    CACHE_IDS = 1 << 20,
    CACHE_PIECE_MAX = 256, /* longer pieces are not cached */
};

struct bpe_session {
    const struct bpe *b;
    pcre2_match_data *match;
    struct bytes_map cache;  /* a piece's bytes -> its ids at ids[value + 1 ...], ids[value] of them */
    unsigned char *keys;     /* the cached pieces' bytes */
    size_t keys_used;
    int32_t *ids;
    size_t ids_used;
    int32_t *part;     /* a piece's tokens while it merges */
    uint32_t *rank;    /* rank[i]: of merging part[i] and part[i + 1], UINT32_MAX: none */
    int32_t *merged;   /* merged[i]: the token they make */
    size_t part_cap;
};

struct bpe_session *bpe_session_new(const struct bpe *b, struct plait_error *err)
{
    struct bpe_session *s = calloc(1, sizeof *s);
    if (!s || !(s->match = pcre2_match_data_create(1, NULL)) ||
        !(s->keys = malloc(CACHE_KEY_BYTES)) || !(s->ids = malloc(CACHE_IDS * sizeof *s->ids))) {
        bpe_session_free(s);
        error_set(err, "out of memory");
        return NULL;
    }
    s->b = b;
    return s;
}

void bpe_session_free(struct bpe_session *s)
{
    if (!s) return;
    pcre2_match_data_free(s->match);
    bytes_map_free(&s->cache);
    free(s->keys);
    free(s->ids);
    free(s->part);
    free(s->rank);
    free(s->merged);
    free(s);
}

static void pair_rank(const struct bpe *b, struct bpe_session *s, size_t i)
{
    if (pair_map_get(&b->merge, s->part[i], s->part[i + 1], &s->rank[i], &s->merged[i]))
        s->rank[i] = UINT32_MAX;
}

/* piece's tokens into s->part; their count, or 0 when memory runs out */
static size_t merge_piece(struct bpe_session *s, const unsigned char *p, size_t n)
{
    const struct bpe *b = s->b;
    if (n > s->part_cap) {
        size_t want = n > 2 * s->part_cap ? n : 2 * s->part_cap;
        int32_t *part = realloc(s->part, want * sizeof *part);
        if (part) s->part = part;
        uint32_t *rank = realloc(s->rank, want * sizeof *rank);
        if (rank) s->rank = rank;
        int32_t *merged = realloc(s->merged, want * sizeof *merged);
        if (merged) s->merged = merged;
        if (!part || !rank || !merged) return 0;
        s->part_cap = want;
    }
    for (size_t i = 0; i < n; i++) s->part[i] = b->byte_id[p[i]];
    for (size_t i = 0; i + 1 < n; i++) pair_rank(b, s, i);
    while (n > 1) {
        size_t best = 0;
        for (size_t i = 1; i + 1 < n; i++)
            if (s->rank[i] < s->rank[best]) best = i;
        if (s->rank[best] == UINT32_MAX) break;
        s->part[best] = s->merged[best];
        size_t tail = n - best - 2; /* the parts after the pair's right one */
        memmove(&s->part[best + 1], &s->part[best + 2], tail * sizeof *s->part);
        memmove(&s->rank[best + 1], &s->rank[best + 2], tail * sizeof *s->rank);
        memmove(&s->merged[best + 1], &s->merged[best + 2], tail * sizeof *s->merged);
        n--;
        if (best > 0) pair_rank(b, s, best - 1);
        if (best + 1 < n) pair_rank(b, s, best);
    }
    return n;
}

static int encode_piece(struct bpe_session *s, const unsigned char *p, size_t n,
                        struct bpe_ids *out)
{
    const struct bpe *b = s->b;
    int32_t whole = b->whole_piece_first ? bytes_map_get(&b->id_of, p, n) : -1;
    if (whole >= 0) return bpe_ids_push(out, whole);
    int32_t at = n <= CACHE_PIECE_MAX ? bytes_map_get(&s->cache, p, n) : -1;
    if (at < 0) {
        size_t k = merge_piece(s, p, n);
        if (k == 0) return -1;
        if (n > CACHE_PIECE_MAX) {
            for (size_t i = 0; i < k; i++)
                if (bpe_ids_push(out, s->part[i])) return -1;
            return 0;
        }
        if (s->keys_used + n > CACHE_KEY_BYTES || s->ids_used + k + 1 > CACHE_IDS ||
            2 * (s->cache.n + 1) > (size_t)CACHE_IDS) {
            bytes_map_clear(&s->cache);
            s->keys_used = s->ids_used = 0;
        }
        unsigned char *key = memcpy(s->keys + s->keys_used, p, n);
        at = (int32_t)s->ids_used;
        s->ids[s->ids_used++] = (int32_t)k;
        memcpy(s->ids + s->ids_used, s->part, k * sizeof *s->part);
        s->ids_used += k;
        s->keys_used += n;
        if (bytes_map_put(&s->cache, key, n, at)) return -1;
    }
    for (int32_t i = 0; i < s->ids[at]; i++)
        if (bpe_ids_push(out, s->ids[at + 1 + i])) return -1;
    return 0;
}

/* the length of the UTF-8 character at p (1 for a byte that starts none) */
static size_t char_bytes(const unsigned char *p, size_t left)
{
    size_t n = *p >= 0xf0 ? 4 : *p >= 0xe0 ? 3 : *p >= 0xc0 ? 2 : 1;
    return n <= left ? n : 1;
}

/* text without special tokens: the regex's matches, and what lies between them, are pieces */
static int encode_ordinary(struct bpe_session *s, const unsigned char *t, size_t n,
                           struct bpe_ids *out)
{
    const struct bpe *b = s->b;
    if (!b->pattern) return n ? encode_piece(s, t, n, out) : 0;
    size_t gap = 0, start = 0;
    while (start < n) {
        int rc = pcre2_match(b->pattern, t, n, start, 0, s->match, NULL);
        if (rc < 0) break; /* no match in the rest (or a limit: the rest is one piece) */
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(s->match);
        if (ov[1] == ov[0]) { /* an empty match cuts nothing */
            start = ov[0] + char_bytes(t + ov[0], n - ov[0]);
            continue;
        }
        if (ov[0] > gap && encode_piece(s, t + gap, ov[0] - gap, out)) return -1;
        if (encode_piece(s, t + ov[0], ov[1] - ov[0], out)) return -1;
        gap = start = ov[1];
    }
    return gap < n ? encode_piece(s, t + gap, n - gap, out) : 0;
}

static int encode_text(struct bpe_session *s, const unsigned char *t, size_t n, bool first,
                       struct bpe_ids *out)
{
    if (!(first && s->b->add_prefix_space && n && t[0] != ' '))
        return encode_ordinary(s, t, n, out);
    unsigned char *spaced = malloc(n + 1); /* ByteLevel's add_prefix_space */
    if (!spaced) return -1;
    spaced[0] = ' ';
    memcpy(spaced + 1, t, n);
    int rc = encode_ordinary(s, spaced, n + 1, out);
    free(spaced);
    return rc;
}

int bpe_encode(struct bpe_session *s, const char *text, size_t bytes, bool special,
               struct bpe_ids *out, struct plait_error *err)
{
    const struct bpe *b = s->b;
    const unsigned char *t = (const unsigned char *)text;
    size_t start = 0;
    int rc = 0;
    while (special && b->specials && start < bytes && rc == 0) {
        if (pcre2_match(b->specials, t, bytes, start, 0, s->match, NULL) < 0) break;
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(s->match);
        size_t from = ov[0], to = ov[1]; /* (encode_text matches with the same match data) */
        rc = encode_text(s, t + start, from - start, start == 0, out);
        if (rc == 0) rc = bpe_ids_push(out, bytes_map_get(&b->special_of, t + from, to - from));
        start = to;
    }
    if (rc == 0 && start < bytes) rc = encode_text(s, t + start, bytes - start, start == 0, out);
    return rc ? error_set(err, "out of memory encoding %zu bytes of text", bytes) : 0;
}
