/* train_setup.h — the start of one rank's training run and its end: the
 * device, the other ranks, the run directory, the schedule, the model shard
 * (from the newest checkpoint, or fresh), the data, the developer's switches;
 * and everything given back. The loop is train.c's. */
#ifndef PLAIT_RUNTIME_TRAIN_SETUP_H
#define PLAIT_RUNTIME_TRAIN_SETUP_H

#include "common/error.h"
#include "runtime/trainer.h"

/* Sets up the run t names (plan, where, plan_json, run_dir), resumed from
 * the newest checkpoint if there is one; rank 0 opens the run's files.
 * Collective. On error, train_teardown still gives back what was made. */
int train_setup(struct trainer *t, struct plait_error *err);

/* Gives back all that train_setup made (however far it got). */
void train_teardown(struct trainer *t);

#endif
