/* buckets.h — the data-parallel gradient reduction overlapped with backward:
 * the rank's gradient buffer cut into buckets of about parallel.bucket_mb at
 * layer boundaries, each summed over dp (ZeRO 0) or reduce-scattered into the
 * dp ranks' ZeRO slices (1 and 2: a bucket meets one or a few slices, so each
 * rank receives the part of it inside its own slice, an uneven
 * reduce-scatter) as soon as backward has finished writing it, while the
 * layers below it are still computing. ZeRO 0 and 1 do it in the step's last
 * backward; ZeRO 2 in the last backward before each hand-over (runtime/pipeline.h), each
 * added into the slice.
 *
 * The buffer is layer-major (common/gpt2/gpt2_shard.h) and backward runs from the
 * head to the embedding, so buckets complete from the end of the buffer
 * towards its start: the last layers (with the final LayerNorm) first. The
 * tied wte is the largest tensor, and it is written at both ends of
 * backward. Without a pipeline the model leaves the embedding's rows of wte
 * out of the last backward (model.h: defer_embedding), so wte is final right
 * after the head and its bucket goes first, overlapping the whole backward;
 * after it, every rank's embedding rows (B·T of them, gathered over dp) are
 * added to the summed wte (sliced: the slice's part of it) in rank order.
 * With a pipeline the first stage's
 * wte must first be summed with the last stage's (the tied sum), so the
 * embeddings' bucket starts after backward. With an interleaved schedule the
 * buffer holds the stage's chunks in order and each chunk's gradients become
 * final at its own last backward; the executor (runtime/pipeline.c) sets the
 * hook only when every chunk above is final too, so a chunk finished out of
 * that order waits for buckets_finish.
 *
 * Where each bucket starts depends only on the shard and bucket_mb, and
 * every rank starts them in the same order: the same bits on every rank of
 * the dp group, and the same bits run after run.
 *
 * A bucket's sums have arrived when its reduction is seen complete: polled (the group's
 * test) each time the hook starts buckets, else waited for by buckets_finish, in the order
 * started (the order they complete in). Whole layers' sums are then final unless the
 * LayerNorms' sums over tp follow (sequence parallelism): ZeRO 2 adding a micro-batch adds
 * them into the slice at once, and in the step's own reduction (final) a landed hook is
 * told the slice's part from its top down to them (a GPU rank's offloaded step brings it
 * down: runtime/host_step.h). wte (its deferred rows, a pipeline's tied sum) and the other
 * embeddings are never told: they come down at the step. */
#ifndef PLAIT_RUNTIME_BUCKETS_H
#define PLAIT_RUNTIME_BUCKETS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "runtime/group.h"
#include "runtime/model.h"

struct bucket {
    size_t at, n; /* gradient elements [at, at + n) */
    bool layers;  /* whole layers (and the final LayerNorm): final below a watermark; else
                     final when reported by its exact range (wte), or only after backward */
    bool final;   /* reported final by its exact range */
    void *req;    /* its sum in flight, or NULL */
    bool started;
    bool in_flight; /* started, and req not yet waited for or tested done */
    bool arrived;   /* its sums are in (waited for, tested done, or nobody else has them) */
    bool added;     /* ZeRO 2 adding: its part of the micro-batch's sums added to the slice */
    bool routed;    /* a routed expert's gradients (ep > 1): summed over the expert peers */
};

struct buckets {
    struct model *m;
    const struct group *dp;
    const struct group *experts; /* ep > 1: the dp ranks holding the same experts */
    struct bucket *b; /* [n], in the order they start */
    int n, next;      /* the next bucket to start */
    size_t watermark; /* the layer gradients at or above it are final */
    bool defer;       /* the embedding's rows of wte come after its sum */
    float *rows;      /* (dp, B·T, C) every rank's embedding-output gradient */
    int32_t *tokens;  /* (dp, B·T) and its tokens */
    bool sliced;      /* ZeRO >= 1: each bucket reduce-scattered into the dp ranks' slices */
    bool accumulate;  /* sliced: the sums are added to the slice (ZeRO 2 after the step's first
                         micro-batch; the caller sets it before that backward) */
    size_t *counts;   /* [dp] sliced: a bucket's elements in each rank's slice */
    /* The step's gradient as whole layers' sums become final (NULL: nobody is told; the
     * caller sets it only where nothing after buckets_finish changes those sums: no
     * replicas, no expert parallelism): called with [from, to) of the slice (ZeRO 0: of the
     * buffer), to always its top and from lower each time; after_backward: from
     * buckets_finish, the backward over */
    int (*landed)(void *ctx, size_t from, size_t to, bool after_backward, struct plait_error *err);
    void *landed_ctx;
    bool final;         /* this reduction's sums are the step's gradient, not a hand-over's
                           before its end (ZeRO 2; pipeline.h: grads_at_end sets it) */
    size_t landed_top;  /* the slice's top: slice_n sliced, else the shard's total */
    size_t landed_from; /* the slice at or above it has landed this step */
};

/* Cuts m's gradient buffer into buckets of at least bucket_mb MiB (whole
 * layers; fewer when the stage is small). A bucket_mb beyond the whole
 * gradient makes one bucket, summed after backward (no overlap). dp must
 * have iallreduce, and with ZeRO >= 1 (m->zero) ireduce_scatter_v. With
 * expert parallelism (the shard's ep > 1) the routed experts' runs of a bucket
 * are buckets of their own, summed over experts (the expert peers) instead. */
int buckets_init(struct buckets *bk, struct model *m, const struct group *dp,
                 const struct group *experts, double bucket_mb, struct plait_error *err);
void buckets_free(struct buckets *bk);

/* The model's grads_final hook: the gradients [from, to) are final for this
 * step; starts, in order, every bucket that is final, then (with landed, in the step's
 * own reduction) takes in those whose sums have arrived. */
int buckets_ready(void *bk, size_t from, size_t to, struct plait_error *err);

/* After the step's backward (and the tied wte's sum between the pipeline's
 * ends): starts what is left, waits for every sum (taking each in as it arrives), adds
 * the deferred embedding rows, and with layernorms sums the LayerNorms' gradients over tp
 * in what it reduced (model_sum_layernorm_grads: they commute with the sum
 * over dp). m->grads then holds the step's gradients summed over dp (ZeRO 0),
 * or m->grad_slice this rank's slice of them (ZeRO 1; ZeRO 2: the
 * micro-batch's added when accumulating). B×T: the step's micro-batch. */
int buckets_finish(struct buckets *bk, int B, int T, bool layernorms, struct plait_error *err);

/* Waits out whatever is in flight after a failure (errors ignored), so that
 * no operation outlives the step. */
void buckets_drop(struct buckets *bk);

#endif
