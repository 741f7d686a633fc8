/* ckpt.h — checkpoints of one rank: weights (an llm.c GPT-2 file, so other
 * tools can read them), AdamW moments, the gradients of an unfinished step,
 * and the training state (step, data position, RNG), tied together by a
 * manifest of sizes and CRC-32C checksums.
 *
 * A checkpoint is a directory <dir>/step_SSSSSSSS_MMMM (S = optimizer steps
 * done, M = micro-batches done of the next step, non-zero only after a
 * preemption). It is written under a temporary name, every file fsynced, then
 * renamed, so it is visible only when complete. Loading takes the newest that
 * verifies; a corrupt or truncated one is reported and skipped. */
#ifndef PLAIT_RUNTIME_CKPT_H
#define PLAIT_RUNTIME_CKPT_H

#include <stdint.h>

#include "common/error.h"
#include "runtime/data.h"
#include "runtime/model.h"

struct train_state {
    int step;         /* optimizer steps completed */
    int micro;        /* micro-batches of step+1 already accumulated */
    double loss_sum;  /* sum of their mean losses */
    int64_t tokens;   /* training tokens consumed */
    int eval_pending; /* the evaluation after `step` was interrupted */
    struct data_position data;
    uint64_t sample_rng[4]; /* the sampler's generator */
};

/* Writes a checkpoint of the model and state into dir (created if needed) and
 * removes all but the newest `keep` complete ones. The gradients are saved
 * when st->micro > 0. plan_json (the resolved plan) is stored beside. */
int ckpt_save(const char *dir, const struct model *m, const struct train_state *st, int keep,
              const char *plan_json, struct plait_error *err);

/* Loads the newest complete checkpoint of dir that verifies. Returns 1 when one
 * was loaded (its directory name into name), 0 when there is none, -1 on an
 * error that is not about a particular checkpoint's integrity. */
int ckpt_load_latest(const char *dir, struct model *m, struct train_state *st, char *name,
                     size_t name_bytes, struct plait_error *err);

#endif
