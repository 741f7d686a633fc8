/* fuzz_data.c — libFuzzer target for token shards: llmc_read_tokens_header and
 * data_open / data_next / data_seek / data_rewind over 1-3 shard files and the
 * B, T, vocabulary, seed and position that a control block (struct control)
 * gives. Checks the header rules and the in-order batches against its own
 * model of them, and that a saved position reads the same batch again. */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "common/formats/llmc.h"
#include "runtime/data.h"
#include "tests/fuzz/harness.h"

#define MAX_SHARDS 3

enum {
    SHUFFLE = 1 << 0,
    /* bits 1-2: shards - 1 (3 means one shard) */
    SEEK = 1 << 3,     /* data_seek to the input's position after the batches */
    REWIND = 1 << 4,   /* data_rewind reads the first batch again */
    TRUNCATE = 1 << 5, /* cut the last shard to truncate_bytes after data_open */
    FIFO = 1 << 6,     /* the last shard is a FIFO */
};

/* The input's first 40 bytes (little-endian); the shards follow, each but the
 * last after its length (uint32). */
struct control {
    uint8_t b_minus_1; /* B = 1 + (b & 7) */
    uint8_t t_minus_1; /* T = 1 + (t & 31) */
    uint16_t vocab_minus_1;
    uint8_t flags;
    uint8_t batches; /* micro-batches to read: & 31 */
    uint16_t truncate_bytes;
    uint64_t seed;
    int64_t seek_epoch, seek_shard, seek_index;
};
_Static_assert(sizeof(struct control) == 40, "control block layout");

struct shard {
    const uint8_t *bytes;
    size_t n;
    int64_t tokens; /* the header's count, when the header is good */
    int width;      /* its tokens' bytes: 2 (uint16) or 4 (uint32) */
    bool good;
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The header rules of llmc.h, read independently: magic, version (uint16 or uint32 tokens),
 * and a size that is exactly the header plus the announced tokens. */
static bool header_good(const uint8_t *bytes, size_t n, int64_t *tokens, int *width)
{
    int32_t h[3];
    if (n < LLMC_HEADER_BYTES) return false;
    memcpy(h, bytes, sizeof h);
    *tokens = h[2];
    *width = h[0] == LLMC_TOKENS32_MAGIC && h[1] == LLMC_TOKENS32_VERSION ? 4
             : h[0] == LLMC_TOKENS_MAGIC && h[1] == LLMC_TOKENS_VERSION   ? 2
                                                                          : 0;
    return *width && h[2] >= 0 && (uint64_t)n == LLMC_HEADER_BYTES + (uint64_t)*width * (uint64_t)h[2];
}

static uint32_t token_at(const struct shard *s, int64_t i)
{
    if (s->width == 2) {
        uint16_t t;
        memcpy(&t, s->bytes + LLMC_HEADER_BYTES + 2 * i, 2);
        return t;
    }
    uint32_t t;
    memcpy(&t, s->bytes + LLMC_HEADER_BYTES + 4 * i, 4);
    return t;
}

/* data.h's order without shuffle: the window at the position, or the next
 * shard's first when it does not fit (after the last shard, the first again). */
static void model_next(struct data_position *p, const struct shard *sh, int n, int64_t bt, int *s,
                       int64_t *start)
{
    for (;;) {
        if (p->shard >= n) p->epoch++, p->shard = 0, p->index = 0;
        int64_t tokens = sh[p->shard].tokens;
        if (p->index > tokens - bt - 1) { /* does not fit (without overflow) */
            p->shard++;
            p->index = 0;
            continue;
        }
        *s = (int)p->shard;
        *start = p->index;
        p->index += bt;
        return;
    }
}

static bool same_position(const struct data_position *a, const struct data_position *b)
{
    return a->epoch == b->epoch && a->shard == b->shard && a->index == b->index;
}

struct batch {
    int rc;
    int32_t *inputs, *targets;
    struct data_position after;
};

/* data_next into b; an error must be a message. */
static void next(struct data_loader *d, struct batch *b)
{
    struct plait_error err = {.text = ""};
    b->rc = data_next(d, b->inputs, b->targets, &err);
    if (b->rc) fuzz_check_message(err.text);
    b->after = d->pos;
}

static void check_same_batch(const struct batch *a, const struct batch *b, int64_t bt,
                             const char *what)
{
    FUZZ_CHECK(a->rc == b->rc, "%s: rc %d then %d", what, a->rc, b->rc);
    FUZZ_CHECK(same_position(&a->after, &b->after), "%s: ends at a different position", what);
    if (a->rc) return;
    FUZZ_CHECK(memcmp(a->inputs, b->inputs, (size_t)bt * 4) == 0 &&
                   memcmp(a->targets, b->targets, (size_t)bt * 4) == 0,
               "%s: a different batch", what);
}

/* The batch is the window at start of shard s: targets are inputs shifted by one. */
static void check_window(const struct batch *b, const struct shard *s, int64_t start, int64_t bt)
{
    for (int64_t i = 0; i < bt; i++) {
        FUZZ_CHECK((uint32_t)b->inputs[i] == token_at(s, start + i), "input %lld", (long long)i);
        FUZZ_CHECK((uint32_t)b->targets[i] == token_at(s, start + i + 1), "target %lld", (long long)i);
    }
}

static bool window_in_vocab(const struct shard *s, int64_t start, int64_t bt, int vocab)
{
    for (int64_t i = 0; i <= bt; i++)
        if (token_at(s, start + i) >= (uint32_t)vocab) return false;
    return true;
}

/* A shuffled batch is some whole window of some shard. */
static void check_some_window(const struct batch *b, const struct shard *sh, int n, int64_t bt)
{
    for (int s = 0; s < n; s++)
        for (int64_t start = 0; start + bt + 1 <= sh[s].tokens; start += bt) {
            int64_t i = 0;
            while (i < bt && (uint32_t)b->inputs[i] == token_at(&sh[s], start + i) &&
                   (uint32_t)b->targets[i] == token_at(&sh[s], start + i + 1))
                i++;
            if (i == bt) return;
        }
    FUZZ_CHECK(false, "a shuffled batch that is no window of any shard");
}

/* Shard s is the harness's descriptor FUZZ_FD + s; the glob finds those in use. */
_Static_assert(FUZZ_FD % 10 == 0 && MAX_SHARDS <= 10 && MAX_SHARDS <= FUZZ_FDS, "shard names");

static void write_shards(const struct shard *sh, int n, bool fifo)
{
    for (int s = 0; s < MAX_SHARDS; s++) {
        if (s >= n)
            fuzz_close(FUZZ_FD + s);
        else if (fifo && s == n - 1)
            fuzz_fifo(FUZZ_FD + s);
        else
            fuzz_file(FUZZ_FD + s, sh[s].bytes, sh[s].n);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct control c;
    if (size < sizeof c) return -1; /* not added to the corpus */
    memcpy(&c, data, sizeof c);
    const int B = 1 + (c.b_minus_1 & 7), T = 1 + (c.t_minus_1 & 31), vocab = 1 + c.vocab_minus_1;
    const int64_t bt = (int64_t)B * T;
    const bool shuffle = c.flags & SHUFFLE, fifo = c.flags & FIFO;
    const int n = 1 + (c.flags >> 1 & 3) % MAX_SHARDS, batches = c.batches & 31;

    /* the shards */
    struct shard sh[MAX_SHARDS] = {{0}};
    const uint8_t *p = data + sizeof c, *end = data + size;
    for (int s = 0; s < n; s++) {
        size_t len = (size_t)(end - p);
        if (s < n - 1) {
            uint32_t want = 0;
            if (len >= 4) memcpy(&want, p, 4), p += 4, len -= 4;
            if (want < len) len = want;
        }
        sh[s].bytes = p;
        sh[s].n = len;
        sh[s].good = header_good(p, len, &sh[s].tokens, &sh[s].width);
        p += len;
    }
    write_shards(sh, n, fifo);

    /* the header reader agrees with the rules */
    bool all_good = true;
    int64_t largest = 0;
    for (int s = 0; s < n; s++) {
        struct plait_error err = {.text = ""};
        int64_t tokens = -1;
        int width = 0;
        int rc = llmc_read_tokens_header(fuzz_fd_path(FUZZ_FD + s), &tokens, &width, &err);
        bool good = sh[s].good && !(fifo && s == n - 1);
        FUZZ_CHECK((rc == 0) == good, "shard %d: header %s, rules say %s: %s", s,
                   rc == 0 ? "accepted" : "refused", good ? "good" : "bad", err.text);
        if (rc) fuzz_check_message(err.text);
        if (rc == 0)
            FUZZ_CHECK(tokens == sh[s].tokens && width == sh[s].width,
                       "shard %d: %lld tokens of %d bytes, the header says %lld of %d", s,
                       (long long)tokens, width, (long long)sh[s].tokens, sh[s].width);
        all_good = all_good && good;
        if (good && sh[s].tokens > largest) largest = sh[s].tokens;
    }

    /* every token of every shard below the vocabulary (data_open reads them all) */
    bool tokens_ok = true;
    for (int s = 0; s < n && all_good; s++)
        for (int64_t i = 0; i < sh[s].tokens && tokens_ok; i++)
            tokens_ok = token_at(&sh[s], i) < (uint32_t)vocab;

    /* the loader opens exactly when every shard is good, every token is below
     * the vocabulary and one shard holds a window */
    struct data_loader d;
    struct plait_error err = {.text = ""};
    char pattern[64];
    snprintf(pattern, sizeof pattern, "/proc/self/fd/%d[0-%d]", FUZZ_FD / 10, MAX_SHARDS - 1);
    int rc = data_open(&d, pattern, B, T, vocab, shuffle, c.seed, &err);
    bool should_open = all_good && tokens_ok && largest >= bt + 1;
    FUZZ_CHECK((rc == 0) == should_open, "data_open %s, the rules say %s: %s",
               rc == 0 ? "opened" : "refused", should_open ? "open" : "refuse", err.text);
    if (rc) {
        fuzz_check_message(err.text);
        return 0;
    }
    FUZZ_CHECK(d.n_shards == n, "%d shards, wrote %d", d.n_shards, n);
    for (int s = 0; s < n; s++)
        FUZZ_CHECK(d.shards[s].tokens == sh[s].tokens, "shard %d: %lld tokens, want %lld", s,
                   (long long)d.shards[s].tokens, (long long)sh[s].tokens);

    /* a shard that changes after the checks: cut short (no longer what its
     * header says) — reading must fail or succeed, never fault */
    bool changed = false;
    if (c.flags & TRUNCATE) {
        FUZZ_CHECK(ftruncate(FUZZ_FD + n - 1, c.truncate_bytes) == 0, "truncate: %s",
                   strerror(errno));
        changed = c.truncate_bytes != sh[n - 1].n;
    }

    struct batch first = {0}, b = {0}, again = {0};
    struct batch *all[] = {&first, &b, &again};
    for (int i = 0; i < 3; i++) {
        all[i]->inputs = calloc((size_t)bt, sizeof(int32_t));
        all[i]->targets = calloc((size_t)bt, sizeof(int32_t));
        FUZZ_CHECK(all[i]->inputs && all[i]->targets, "out of memory");
    }
    struct data_position model = {0};
    for (int k = 0; k < batches; k++) {
        struct data_position before = d.pos;
        next(&d, &b);
        if (!changed && !shuffle) {
            int s;
            int64_t start;
            model_next(&model, sh, n, bt, &s, &start);
            bool ok = window_in_vocab(&sh[s], start, bt, vocab);
            FUZZ_CHECK((b.rc == 0) == ok, "batch %d: rc %d, but the window is %sin the vocabulary",
                       k, b.rc, ok ? "" : "not ");
            FUZZ_CHECK(same_position(&b.after, &model),
                       "batch %d: position (%lld, %lld, %lld), "
                       "want (%lld, %lld, %lld)",
                       k, (long long)b.after.epoch, (long long)b.after.shard,
                       (long long)b.after.index, (long long)model.epoch, (long long)model.shard,
                       (long long)model.index);
            if (ok) check_window(&b, &sh[s], start, bt);
        } else if (!changed && b.rc == 0) {
            check_some_window(&b, sh, n, bt);
        }
        /* a saved position reads the same batch again */
        FUZZ_CHECK(data_seek(&d, &before, &err) == 0, "seek back: %s", err.text);
        next(&d, &again);
        if (!changed) check_same_batch(&b, &again, bt, "reading from a saved position");
        if (k == 0) {
            memcpy(first.inputs, b.inputs, (size_t)bt * 4);
            memcpy(first.targets, b.targets, (size_t)bt * 4);
            first.rc = b.rc;
            first.after = b.after;
        }
    }
    if ((c.flags & REWIND) && batches > 0) {
        data_rewind(&d);
        next(&d, &again);
        if (!changed) check_same_batch(&first, &again, bt, "the first batch after a rewind");
    }
    if (c.flags & SEEK) {
        struct data_position to = {c.seek_epoch, c.seek_shard, c.seek_index};
        /* out of range (data.h) is refused; whatever is accepted must read */
        bool in_range = to.epoch >= 0 && to.shard >= 0 && to.shard <= n && to.index >= 0;
        rc = data_seek(&d, &to, &err);
        FUZZ_CHECK(rc != 0 || in_range, "data_seek accepted (%lld, %lld, %lld)",
                   (long long)to.epoch, (long long)to.shard, (long long)to.index);
        if (rc) fuzz_check_message(err.text);
        for (int k = 0; rc == 0 && k < 2; k++) next(&d, &b);
    }
    for (int i = 0; i < 3; i++) {
        free(all[i]->inputs);
        free(all[i]->targets);
    }
    data_close(&d);
    return 0;
}
