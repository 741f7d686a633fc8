/* buckets.c — cutting the gradient buffer into buckets at layer boundaries,
 * starting each one's sum over dp when backward has passed below it, and
 * waiting for them after backward. */
#include "runtime/buckets.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/profile.h"

int buckets_init(struct buckets *bk, struct model *m, const struct group *dp, double bucket_mb,
                 struct plait_error *err)
{
    memset(bk, 0, sizeof *bk);
    bk->m = m;
    bk->dp = dp;
    const struct gpt2_shard *s = &m->shard;
    size_t want = (size_t)(bucket_mb * (1 << 20) / sizeof(float));
    if (want < 1) want = 1;
    int layers = gpt2_shard_layers(s);
    if (!(bk->b = calloc((size_t)layers + 1, sizeof *bk->b)))
        return error_set(err, "out of memory");
    size_t hi = s->total; /* the top bucket takes the final LayerNorm with it */
    for (int i = layers - 1; i >= 0; i--) {
        size_t at = s->layers_at + (size_t)i * s->layer_elems;
        if (hi - at >= want || i == 0) {
            bk->b[bk->n++] = (struct bucket){.at = at, .n = hi - at};
            hi = at;
        }
    }
    if (s->layers_at) bk->b[bk->n++] = (struct bucket){.at = 0, .n = s->layers_at};
    return 0;
}

static int start(struct buckets *bk, struct bucket *b, struct plait_error *err)
{
    b->started = true;
    bk->next++;
    if (bk->dp->iallreduce(bk->dp->ctx, bk->m->grads + b->at, b->n, &b->req, err))
        return error_prefix(err, "data-parallel gradient sum of elements [%zu, %zu): ", b->at,
                            b->at + b->n);
    return 0;
}

int buckets_ready(void *ctx, size_t from, struct plait_error *err)
{
    struct buckets *bk = ctx;
    size_t layers_at = bk->m->shard.layers_at;
    while (bk->next < bk->n) {
        struct bucket *b = &bk->b[bk->next];
        if (b->at < from || b->at < layers_at) return 0;
        if (start(bk, b, err)) return -1;
    }
    return 0;
}

int buckets_finish(struct buckets *bk, struct plait_error *err)
{
    struct plait_error later; /* after the first failure: what the others say */
    int rc = 0;
    while (rc == 0 && bk->next < bk->n) rc = start(bk, &bk->b[bk->next], err);
    double t0 = prof_now();
    for (int i = 0; i < bk->n; i++) {
        struct bucket *b = &bk->b[i];
        if (b->started && bk->dp->wait(b->req, rc ? &later : err) && rc == 0)
            rc = error_prefix(err, "data-parallel gradient sum: ");
        b->req = NULL;
        b->started = false;
    }
    bk->next = 0;
    bk->wait_s = prof_now() - t0;
    return rc;
}

void buckets_drop(struct buckets *bk)
{
    struct plait_error ignored;
    for (int i = 0; i < bk->n; i++) {
        if (bk->b[i].started) bk->dp->wait(bk->b[i].req, &ignored);
        bk->b[i] = (struct bucket){.at = bk->b[i].at, .n = bk->b[i].n};
    }
    bk->next = 0;
}

void buckets_free(struct buckets *bk)
{
    buckets_drop(bk);
    free(bk->b);
    memset(bk, 0, sizeof *bk);
}
