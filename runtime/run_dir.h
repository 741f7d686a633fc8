/* run_dir.h — the run directory as a run takes it: rank 0 makes it, locks it
 * and its checkpoint directory, starts it afresh when asked (--fresh), checks
 * that it belongs to this plan, and a first start that failed takes away what
 * it made. The files in it are common/formats/'s; what the run writes there is
 * report.c's and the checkpoints'. */
#ifndef PLAIT_RUNTIME_RUN_DIR_H
#define PLAIT_RUNTIME_RUN_DIR_H

#include <stdbool.h>

#include "common/error.h"
#include "runtime/trainer.h"

/* What a refusal to take over a run directory tells the user to do: --fresh, or another
 * directory; where its checkpoints hold weights plait ckpt import put there (a step-0
 * checkpoint), never --fresh, which would remove them. */
const char *run_dir_fresh_advice(struct trainer *t);

/* Every rank: where the checkpoints are; rank 0: the run directory and the
 * checkpoints' made, locked, made fresh (--fresh) and checked against the
 * plan, the run's end cleared and the console kept there. Every rank learns
 * whether rank 0 failed. Collective. */
int run_dir_open(struct trainer *t, struct plait_error *err);

/* Whether the run directory holds something a different plan would lose:
 * metrics records or checkpoints (own: only those under the run directory,
 * not a checkpoint.dir elsewhere, whose checkpoints say their own plan). */
bool run_dir_has_history(struct trainer *t, bool own);

/* A first start that failed leaves nothing behind: what it wrote in the
 * directories it created, and they, go (only when they hold no history, and
 * by rmdir: anything else there keeps them). After teardown (the locks). */
void run_dir_undo_failed_start(struct trainer *t, bool history);

#endif
