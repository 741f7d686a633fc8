/* data.c — the token-shard loader: glob, header and token checks, pread of
 * each window from the shard being read, in-order and seeded-shuffle window
 * orders, positions. */
#include "runtime/data.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fsutil.h"
#include "common/formats/llmc.h"
#include "common/rng.h"

static void close_shard(struct data_loader *d)
{
    if (d->fd >= 0) close(d->fd);
    d->fd = -1;
    d->open_shard = -1;
}

static int open_shard(struct data_loader *d, int s, struct plait_error *err)
{
    if (d->open_shard == s) return 0;
    close_shard(d);
    int fd = fs_open_regular(d->shards[s].path, err);
    if (fd < 0) return -1;
    posix_fadvise(fd, 0, 0, d->shuffle ? POSIX_FADV_RANDOM : POSIX_FADV_SEQUENTIAL);
    d->fd = fd;
    d->open_shard = s;
    return 0;
}

/* Reads n tokens at token offset `at` of shard s (open) into out, as uint32 whatever the
 * shard's token size. */
static int read_tokens(struct data_loader *d, int s, int64_t at, uint32_t *out, size_t n,
                       struct plait_error *err)
{
    const struct data_shard *sh = &d->shards[s];
    size_t want = n * (size_t)sh->token_bytes, got = 0;
    off_t offset = LLMC_HEADER_BYTES + (off_t)at * sh->token_bytes;
    while (got < want) {
        ssize_t k = pread(d->fd, (char *)out + got, want - got, offset + (off_t)got);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0)
            return error_errno(err, "%s: reading tokens %lld..%lld", sh->path, (long long)at,
                               (long long)(at + (int64_t)n));
        if (k == 0)
            return error_set(err,
                             "%s: ends at byte %lld, inside tokens %lld..%lld (the file shrank "
                             "since training started: it had %lld tokens)",
                             sh->path, (long long)(offset + (off_t)got), (long long)at,
                             (long long)(at + (int64_t)n), (long long)sh->tokens);
        got += (size_t)k;
    }
    for (size_t i = n; sh->token_bytes == 2 && i-- > 0;) { /* widened in place, from the end */
        uint16_t t;
        memcpy(&t, (const char *)out + 2 * i, sizeof t);
        out[i] = t;
    }
    return 0;
}

/* The error for token `token` at token position `at` of shard s: the file, the
 * position and byte offset, the vocabulary; `after` says when it was found. */
static int bad_token(const struct data_loader *d, int s, uint32_t token, int64_t at,
                     const char *after, struct plait_error *err)
{
    return error_set(err,
                     "%s: token %u at position %lld (byte %lld) is not below the vocabulary "
                     "size %d (model.vocab)%s",
                     d->shards[s].path, token, (long long)at,
                     (long long)(LLMC_HEADER_BYTES + d->shards[s].token_bytes * at), d->vocab,
                     after);
}

/* Every token of shard s below the vocabulary size: one pass, at open. */
static int check_shard_tokens(struct data_loader *d, int s, struct plait_error *err)
{
    enum { CHUNK = 1 << 19 };
    uint32_t *buf = malloc(CHUNK * sizeof *buf);
    if (!buf) return error_set(err, "out of memory");
    int rc = open_shard(d, s, err);
    for (int64_t at = 0; rc == 0 && at < d->shards[s].tokens; at += CHUNK) {
        int64_t left = d->shards[s].tokens - at;
        size_t n = left < CHUNK ? (size_t)left : CHUNK;
        rc = read_tokens(d, s, at, buf, n, err);
        for (size_t i = 0; rc == 0 && i < n; i++)
            if (buf[i] >= (uint32_t)d->vocab)
                rc = bad_token(d, s, buf[i], at + (int64_t)i, "", err);
    }
    free(buf);
    close_shard(d);
    return rc;
}

int data_open(struct data_loader *d, const char *pattern, int B, int T, int vocab, bool shuffle,
              uint64_t seed, struct plait_error *err)
{
    memset(d, 0, sizeof *d);
    d->B = B;
    d->T = T;
    d->vocab = vocab;
    d->shuffle = shuffle;
    d->seed = seed;
    d->open_shard = d->fd = -1;
    d->order_epoch = d->window_key = -1;
    glob_t g;
    int rc = glob(pattern, GLOB_ERR, NULL, &g);
    if (rc == GLOB_NOMATCH)
        return error_set(err,
                         "no file matches %s: plait data prepare TEXT OUT.bin makes token "
                         "shards from a text file (examples/README.md says how to get each "
                         "example's data)",
                         pattern);
    if (rc != 0) {
        globfree(&g);
        return error_set(err, "cannot list %s", pattern);
    }
    d->shards = calloc(g.gl_pathc, sizeof *d->shards);
    if (!d->shards) {
        globfree(&g);
        return error_set(err, "out of memory");
    }
    int64_t window = (int64_t)B * T + 1, largest = 0;
    for (size_t i = 0; i < g.gl_pathc; i++) {
        struct data_shard *sh = &d->shards[d->n_shards];
        if (llmc_read_tokens_header(g.gl_pathv[i], &sh->tokens, &sh->token_bytes, err) != 0)
            goto fail;
        if (!(sh->path = strdup(g.gl_pathv[i]))) {
            error_set(err, "out of memory");
            goto fail;
        }
        d->n_shards++;
        if (sh->tokens > largest) largest = sh->tokens;
        if (check_shard_tokens(d, d->n_shards - 1, err)) goto fail;
    }
    if (largest < window) {
        error_set(err,
                  "%s: no shard holds one micro-batch of %d×%d+1 = %lld tokens (the largest "
                  "has %lld)",
                  pattern, B, T, (long long)window, (long long)largest);
        goto fail;
    }
    d->shard_order = calloc((size_t)d->n_shards, sizeof *d->shard_order);
    d->window = malloc(((size_t)window) * sizeof *d->window);
    if (!d->shard_order || !d->window) {
        error_set(err, "out of memory");
        goto fail;
    }
    globfree(&g);
    return 0;
fail:
    globfree(&g);
    data_close(d);
    return -1;
}

void data_close(struct data_loader *d)
{
    if (d->shards) close_shard(d); /* a loader never opened is all zero: fd 0 is not ours */
    for (int i = 0; i < d->n_shards; i++) free(d->shards[i].path);
    free(d->shards);
    free(d->shard_order);
    free(d->window_order);
    free(d->window);
    memset(d, 0, sizeof *d);
    d->open_shard = d->fd = -1;
}

/* Fisher-Yates over 0..n-1 from a stream seeded by (seed, key). */
static void permutation(int64_t *out, int64_t n, uint64_t seed, uint64_t key)
{
    struct rng r;
    rng_seed(&r, seed, key);
    for (int64_t i = 0; i < n; i++) out[i] = i;
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)rng_below(&r, (uint64_t)i + 1);
        int64_t t = out[i];
        out[i] = out[j];
        out[j] = t;
    }
}

static int64_t windows_in(const struct data_loader *d, int s)
{
    int64_t bt = (int64_t)d->B * d->T;
    return (d->shards[s].tokens - 1) / bt;
}

/* The shard at the current position, moving on past shards that are used up;
 * in shuffle mode also the window number to read. */
static int advance(struct data_loader *d, int *shard, int64_t *start, struct plait_error *err)
{
    int64_t bt = (int64_t)d->B * d->T;
    struct data_position *p = &d->pos;
    for (;;) {
        if (p->shard >= d->n_shards) {
            p->epoch++;
            p->shard = 0;
            p->index = 0;
        }
        if (!d->shuffle) {
            int s = (int)p->shard;
            if (p->index + bt + 1 > d->shards[s].tokens) {
                p->shard++;
                p->index = 0;
                continue;
            }
            *shard = s;
            *start = p->index;
            p->index += bt;
            return 0;
        }
        if (d->order_epoch != p->epoch) {
            permutation(d->shard_order, d->n_shards, d->seed, 2 * (uint64_t)p->epoch);
            d->order_epoch = p->epoch;
        }
        int s = (int)d->shard_order[p->shard];
        int64_t n = windows_in(d, s);
        if (p->index >= n) {
            p->shard++;
            p->index = 0;
            continue;
        }
        int64_t key = p->epoch * d->n_shards + s;
        if (d->window_key != key) {
            int64_t *order = realloc(d->window_order, (size_t)n * sizeof *order);
            if (!order)
                return error_set(err, "out of memory for a shuffle of %lld windows", (long long)n);
            d->window_order = order;
            permutation(order, n, d->seed, 2 * (uint64_t)key + 1);
            d->window_key = key;
        }
        *shard = s;
        *start = d->window_order[p->index] * bt;
        p->index++;
        return 0;
    }
}

int data_next_of(struct data_loader *d, int rank, int ranks, int32_t *inputs, int32_t *targets,
                 struct plait_error *err)
{
    int s = 0;
    int64_t start = 0, bt = (int64_t)d->B * d->T;
    struct data_position before = d->pos;
    for (int k = 0; k < rank; k++) /* the windows of the readers before this one */
        if (advance(d, &s, &start, err)) goto fail;
    if (advance(d, &s, &start, err) || open_shard(d, s, err) ||
        read_tokens(d, s, start, d->window, (size_t)bt + 1, err))
        goto fail;
    const uint32_t *w = d->window;
    for (int64_t i = 0; i <= bt; i++)
        if (w[i] >= (uint32_t)d->vocab) { /* every token was below it at open: the file changed */
            bad_token(d, s, w[i], start + i, "; the file changed since training opened it", err);
            goto fail;
        }
    for (int64_t i = 0; i < bt; i++) {
        inputs[i] = (int32_t)w[i];
        targets[i] = (int32_t)w[i + 1];
    }
    int ss;
    int64_t st;
    for (int k = rank + 1; k < ranks; k++) /* and after it */
        if (advance(d, &ss, &st, err)) goto fail;
    return 0;
fail:
    d->pos = before;
    return -1;
}

int data_next(struct data_loader *d, int32_t *inputs, int32_t *targets, struct plait_error *err)
{
    return data_next_of(d, 0, 1, inputs, targets, err);
}

void data_rewind(struct data_loader *d)
{
    memset(&d->pos, 0, sizeof d->pos);
}

int data_seek(struct data_loader *d, const struct data_position *pos, struct plait_error *err)
{
    /* what any position the loader reaches can hold: an index within the
     * largest shard (tokens in order, windows shuffled) and an epoch whose
     * successor and shuffle key (epoch · shards + shard) fit in 64 bits */
    int64_t most_index = 0;
    for (int s = 0; s < d->n_shards; s++) {
        int64_t n = d->shuffle ? windows_in(d, s) : d->shards[s].tokens;
        if (n > most_index) most_index = n;
    }
    int64_t most_epoch = INT64_MAX / 2 / ((int64_t)d->n_shards + 1) - 1;
    if (pos->epoch < 0 || pos->epoch > most_epoch || pos->shard < 0 || pos->shard > d->n_shards ||
        pos->index < 0 || pos->index > most_index)
        return error_set(err,
                         "data position (epoch %lld, shard %lld, index %lld) does not fit "
                         "%d shards of at most %lld %s",
                         (long long)pos->epoch, (long long)pos->shard, (long long)pos->index,
                         d->n_shards, (long long)most_index, d->shuffle ? "windows" : "tokens");
    d->pos = *pos;
    return 0;
}
