/* ckpt_state.h — a checkpoint's state.json: how far training got (step,
 * micro-batch, loss so far, tokens), where in the data, and the sampler's
 * generator; its fresh value for a new run, and reading and writing it. The
 * runtime and plait ckpt import write it, and the runtime's loaders and the
 * resharding reader (ckpt_shards.h) read it, only through here. */
#ifndef PLAIT_CKPT_STATE_H
#define PLAIT_CKPT_STATE_H

#include <stdint.h>

#include "common/formats/ckptdir.h"
#include "common/error.h"
#include "common/plan/plan.h"

/* A position in the training data (runtime/data.h reads and advances it). */
struct data_position {
    int64_t epoch; /* completed passes over all shards */
    int64_t shard; /* index into this epoch's shard order */
    int64_t index; /* in order: token offset; shuffled: window number */
};

/* Mixture of experts: the routing statistics of a step's micro-batches (summed over the
 * ranks), [balance loss, z-loss, choices, dropped choices, choices of each expert], the
 * runtime's as a state's (carried across a mid-step stop as loss_sum is) */
enum { MOE_STAT_BALANCE, MOE_STAT_Z, MOE_STAT_CHOICES, MOE_STAT_DROPPED, MOE_STAT_ROUTED };
#define MOE_STATS(experts) (MOE_STAT_ROUTED + (experts))

struct train_state {
    int step;         /* optimizer steps completed */
    int micro;        /* micro-batches of step+1 already accumulated */
    double loss_sum;  /* sum of their mean losses */
    int64_t tokens;   /* training tokens consumed */
    int eval_pending; /* the evaluation after `step` was interrupted */
    struct data_position data;
    uint64_t sample_rng[4]; /* the sampler's generator */
    int moe_stats_n;        /* MOE_STATS(E) with mixture of experts (written then), else 0 */
    double moe_stats[MOE_STATS(PLAN_MOE_EXPERTS_MAX)];
};

/* The state of a run before its first step: all zero, the sampler seeded
 * from sample.seed. */
void ckpt_state_fresh(struct train_state *st, const struct plan *plan);

/* state.json of the checkpoint at cdir; -1 with err naming the file and the
 * member that is wrong. */
int ckpt_read_state(const char *cdir, struct train_state *st, struct plait_error *err);

/* Writes st as state.json into tmp, a checkpoint being written (ckptdir.h),
 * through f; listed in m unless m is NULL. */
int ckpt_state_write(const char *tmp, const struct train_state *st, struct ckpt_file *f,
                     struct ckpt_manifest *m, struct plait_error *err);

#endif
