/* data.c — the token-shard loader: glob, header checks, mmap of the shard
 * being read, in-order and seeded-shuffle window orders, positions. */
#include "runtime/data.h"

#include <fcntl.h>
#include <glob.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/llmc.h"
#include "common/rng.h"

static void close_shard(struct data_loader *d)
{
    if (d->map) munmap(d->map, d->map_bytes);
    d->map = NULL;
    d->tokens = NULL;
    d->open_shard = -1;
}

static int open_shard(struct data_loader *d, int s, struct plait_error *err)
{
    if (d->open_shard == s) return 0;
    close_shard(d);
    const struct data_shard *sh = &d->shards[s];
    int fd = open(sh->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return error_errno(err, "%s", sh->path);
    size_t bytes = LLMC_HEADER_BYTES + (size_t)sh->tokens * 2;
    void *map = mmap(NULL, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return error_errno(err, "mmap of %s", sh->path);
    madvise(map, bytes, d->shuffle ? MADV_RANDOM : MADV_SEQUENTIAL);
    d->map = map;
    d->map_bytes = bytes;
    d->tokens = (const uint16_t *)((const char *)map + LLMC_HEADER_BYTES);
    d->open_shard = s;
    return 0;
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
    d->open_shard = -1;
    d->order_epoch = d->window_key = -1;
    glob_t g;
    int rc = glob(pattern, GLOB_ERR, NULL, &g);
    if (rc == GLOB_NOMATCH) return error_set(err, "no file matches %s", pattern);
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
        if (llmc_read_tokens_header(g.gl_pathv[i], &sh->tokens, err) != 0) goto fail;
        if (!(sh->path = strdup(g.gl_pathv[i]))) {
            error_set(err, "out of memory");
            goto fail;
        }
        d->n_shards++;
        if (sh->tokens > largest) largest = sh->tokens;
    }
    if (largest < window) {
        error_set(err,
                  "%s: no shard holds one micro-batch of %d×%d+1 = %lld tokens (the largest "
                  "has %lld)",
                  pattern, B, T, (long long)window, (long long)largest);
        goto fail;
    }
    d->shard_order = calloc((size_t)d->n_shards, sizeof *d->shard_order);
    if (!d->shard_order) {
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
    close_shard(d);
    for (int i = 0; i < d->n_shards; i++) free(d->shards[i].path);
    free(d->shards);
    free(d->shard_order);
    free(d->window_order);
    memset(d, 0, sizeof *d);
    d->open_shard = -1;
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

int data_next(struct data_loader *d, int32_t *inputs, int32_t *targets, struct plait_error *err)
{
    int s = 0;
    int64_t start = 0;
    if (advance(d, &s, &start, err) || open_shard(d, s, err)) return -1;
    int64_t bt = (int64_t)d->B * d->T;
    const uint16_t *w = d->tokens + start;
    for (int64_t i = 0; i <= bt; i++)
        if (w[i] >= d->vocab)
            return error_set(err,
                             "%s: token %u at position %lld is not below the vocabulary "
                             "size %d",
                             d->shards[s].path, w[i], (long long)(start + i), d->vocab);
    for (int64_t i = 0; i < bt; i++) {
        inputs[i] = w[i];
        targets[i] = w[i + 1];
    }
    return 0;
}

void data_rewind(struct data_loader *d)
{
    memset(&d->pos, 0, sizeof d->pos);
}

int data_seek(struct data_loader *d, const struct data_position *pos, struct plait_error *err)
{
    if (pos->epoch < 0 || pos->shard < 0 || pos->shard > d->n_shards || pos->index < 0)
        return error_set(err,
                         "data position (epoch %lld, shard %lld, index %lld) does not fit "
                         "%d shards",
                         (long long)pos->epoch, (long long)pos->shard, (long long)pos->index,
                         d->n_shards);
    d->pos = *pos;
    return 0;
}
