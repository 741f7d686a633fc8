/* buckets.h — the data-parallel gradient sum overlapped with backward
 * (ZeRO 0): the rank's gradient buffer cut into buckets of about
 * parallel.bucket_mb at layer boundaries, each summed over dp as soon as the
 * step's last backward has finished writing it, while the layers below it
 * are still computing; what cannot start early (the embeddings, whose tied
 * wte is first summed between the pipeline's ends) goes last, after backward.
 *
 * The buffer is layer-major (common/gpt2_shard.h) and backward runs from the
 * last layer to the first, so buckets complete from the end of the buffer
 * towards its start: bucket 0 holds the last layers (and the final
 * LayerNorm), the last bucket the embeddings. With an interleaved schedule
 * the buffer holds the stage's chunks in order and each chunk's gradients
 * become final at its own last backward; the executor (runtime/pipeline.c)
 * calls buckets_ready only when every chunk above is final too, so a chunk
 * finished out of that order waits for buckets_finish. Where each bucket starts depends
 * only on the shard and bucket_mb, so every dp rank (same part) cuts the same
 * buckets and sums them in the same order: the same bits on every rank, and
 * the same bits run after run. */
#ifndef PLAIT_RUNTIME_BUCKETS_H
#define PLAIT_RUNTIME_BUCKETS_H

#include <stdbool.h>
#include <stddef.h>

#include "common/error.h"
#include "runtime/group.h"
#include "runtime/model.h"

struct bucket {
    size_t at, n; /* gradient elements [at, at + n) */
    void *req;    /* its sum in flight, or NULL */
    bool started;
};

struct buckets {
    struct model *m;
    const struct group *dp;
    struct bucket *b; /* [n], from the end of the buffer */
    int n, next;      /* the next bucket to start */
    double wait_s;    /* the last step's wait for sums still running after backward */
};

/* Cuts m's gradient buffer into buckets of at least bucket_mb MiB (whole
 * layers; fewer when the stage is small). dp must have iallreduce. */
int buckets_init(struct buckets *bk, struct model *m, const struct group *dp, double bucket_mb,
                 struct plait_error *err);
void buckets_free(struct buckets *bk);

/* The model's grads_final hook: the gradients at elements >= from are final
 * for this step; starts every bucket (but the last) lying wholly above. */
int buckets_ready(void *bk, size_t from, struct plait_error *err);

/* After the step's backward (and the tied wte's sum between the pipeline's
 * ends): starts what is left, waits for every sum. m->grads then holds the
 * step's gradients summed over dp. */
int buckets_finish(struct buckets *bk, struct plait_error *err);

/* Waits out whatever is in flight after a failure (errors ignored), so that
 * no operation outlives the step. */
void buckets_drop(struct buckets *bk);

#endif
