/* train.h — the training run of one rank: start or resume, the step loop over
 * micro-batches, evaluation, metrics, checkpoints, and stopping cleanly when
 * asked to (preemption). */
#ifndef PLAIT_RUNTIME_TRAIN_H
#define PLAIT_RUNTIME_TRAIN_H

#include <signal.h>
#include <stdbool.h>

#include "common/place/env.h"
#include "common/error.h"
#include "common/plan/plan.h"

/* Set (to the signal number) by the program's SIGTERM/SIGUSR1/SIGINT/SIGHUP
 * handler; the loop checks it after every micro-batch, writes a checkpoint
 * and returns PLAIT_EXIT_PREEMPTED. */
extern volatile sig_atomic_t train_stop_signal;

/* True once rank 0 holds the run directory's lock (and removed its end.json):
 * the end of this process is the run's to record. */
extern bool train_run_held;

/* Trains plan in run_dir (created if needed; resumed if it holds a
 * checkpoint) as the rank `where` says. plan_json is the resolved plan, stored
 * with run.json and the checkpoints. Returns PLAIT_EXIT_OK or
 * PLAIT_EXIT_PREEMPTED, or -1 with err. */
int train_run(const struct plan *plan, const char *plan_json, const char *run_dir,
              const struct env_rank *where, struct plait_error *err);

#endif
