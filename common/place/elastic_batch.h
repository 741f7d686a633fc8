/* elastic_batch.h — the global batch across layouts, decided once for every
 * launcher and the runtime: with parallel.dp "auto", a run resumed on another
 * number of replicas keeps its global batch (micro-batches per step over all
 * replicas, its newest checkpoint's) by choosing dp and batch.grad_accum
 * together; so does a fresh run with batch.global_batch (sequences a step); a
 * fresh run without it, or a fixed dp, keeps the plan's grad_accum. */
#ifndef PLAIT_COMMON_ELASTIC_BATCH_H
#define PLAIT_COMMON_ELASTIC_BATCH_H

#include "common/formats/ckpt_shards.h" // defines: struct ckpt_batch, ckpt_newest_batch
#include "common/plan/plan.h"

/* The dp of an "auto" layout with at most `most` replicas of pp stages: most
 * for a fresh run (resumed NULL) without batch.global_batch; else the largest
 * dp ≤ most whose grad_accum keeps the resumed run's global batch, or the
 * plan's (elastic_batch_grad_accum), at least 1. */
int elastic_batch_dp(const struct plan *p, int most, int pp, const struct ckpt_batch *resumed);

/* batch.grad_accum for dp replicas of pp stages: the resumed run's global
 * batch (else the plan's batch.global_batch) over dp where dp divides it
 * (and, with the interleaved schedule, the result is a multiple of pp); else
 * the plan's grad_accum. resumed: the run's newest checkpoint's batch where dp
 * is "auto"; NULL for a fresh run or a fixed dp. */
int elastic_batch_grad_accum(const struct plan *p, int dp, int pp,
                             const struct ckpt_batch *resumed);

#endif
