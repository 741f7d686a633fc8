/* ckpt_state.h — a checkpoint's state.json: how far training got (step,
 * micro-batch, loss so far, tokens), where in the data, and the sampler's
 * generator; its fresh value for a new run, and reading and writing it. The
 * runtime and plait ckpt import both write it through here. */
#ifndef PLAIT_CKPT_STATE_H
#define PLAIT_CKPT_STATE_H

#include <jansson.h>
#include <stdint.h>

#include "common/error.h"
#include "common/plan.h"

/* A position in the training data (runtime/data.h reads and advances it). */
struct data_position {
    int64_t epoch; /* completed passes over all shards */
    int64_t shard; /* index into this epoch's shard order */
    int64_t index; /* in order: token offset; shuffled: window number */
};

struct train_state {
    int step;         /* optimizer steps completed */
    int micro;        /* micro-batches of step+1 already accumulated */
    double loss_sum;  /* sum of their mean losses */
    int64_t tokens;   /* training tokens consumed */
    int eval_pending; /* the evaluation after `step` was interrupted */
    struct data_position data;
    uint64_t sample_rng[4]; /* the sampler's generator */
};

/* The state of a run before its first step: all zero, the sampler seeded
 * from sample.seed. */
void ckpt_state_fresh(struct train_state *st, const struct plan *plan);

/* state.json of the checkpoint at cdir; and the JSON written as it. */
int ckpt_read_state(const char *cdir, struct train_state *st, struct plait_error *err);
json_t *ckpt_state_json(const struct train_state *st);

#endif
