/* train_save.h — the checkpoints the training loop writes: at once or in the
 * background (checkpoint.async), when due by time, and the one that keeps the
 * work done when the data fails. The files are ckpt.c's and ckpt_parts.c's. */
#ifndef PLAIT_RUNTIME_TRAIN_SAVE_H
#define PLAIT_RUNTIME_TRAIN_SAVE_H

#include <stdbool.h>

#include "common/error.h"
#include "runtime/trainer.h"

/* Writes a checkpoint of the state now; in the background (checkpoint.async)
 * when `background` (a step boundary the run goes on from), otherwise at
 * once, after committing one still being written. */
int train_save(struct trainer *t, bool background, struct plait_error *err);

/* A checkpoint written in the background is committed once every rank's is:
 * looked at after a step that wrote none. */
int train_save_poll(struct trainer *t, struct plait_error *err);

/* checkpoint.every_minutes, when checkpoint.every is 0: due once that long
 * has passed since the last checkpoint by rank 0's clock, and every rank
 * learns rank 0's decision (a step boundary: all ranks call it). 1 due, 0
 * not, -1 with err. */
int train_save_due_by_time(struct trainer *t, struct plait_error *err);

/* Data that fails mid-run (a shard changed under us) must not cost the work
 * since the last checkpoint: the state after the last complete micro-batch is
 * written, then the error is returned with where to resume. Returns -1. */
int train_save_failing(struct trainer *t, struct plait_error *err);

#endif
