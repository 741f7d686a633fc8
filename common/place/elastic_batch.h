/* elastic_batch.h — the global batch across layouts, decided once for every
 * launcher and the runtime: with parallel.dp "auto", a run resumed on another
 * number of replicas keeps its global batch (micro-batches per step over all
 * replicas, its newest checkpoint's) by choosing dp and batch.grad_accum
 * together; a fresh run, or a fixed dp, keeps the plan's grad_accum. */
#ifndef PLAIT_COMMON_ELASTIC_BATCH_H
#define PLAIT_COMMON_ELASTIC_BATCH_H

#include "common/formats/ckpt_shards.h" // defines: struct ckpt_batch, ckpt_newest_batch
#include "common/plan/plan.h"

/* The dp of an "auto" layout with at most `most` replicas of pp stages: most
 * for a fresh run (resumed NULL); for a resumed one the largest dp ≤ most
 * whose grad_accum keeps its global batch (elastic_batch_grad_accum), at
 * least 1. */
int elastic_batch_dp(const struct plan *p, int most, int pp, const struct ckpt_batch *resumed);

/* batch.grad_accum for dp replicas of pp stages: the resumed run's global
 * batch over dp where dp divides it (and, with the interleaved schedule, the
 * result is a multiple of pp); else the plan's. resumed: the run's newest
 * checkpoint's batch where dp is "auto"; NULL for a fresh run or a fixed dp. */
int elastic_batch_grad_accum(const struct plan *p, int dp, int pp,
                             const struct ckpt_batch *resumed);

#endif
