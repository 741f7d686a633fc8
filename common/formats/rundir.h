/* rundir.h — a run directory: the names of its files and of a checkpoint's,
 * the plan.json it holds (written by plait-train's rank 0 as plan_to_json
 * gives it, read back only through plan_load) and where its checkpoints are.
 * Each other file has one module that writes and reads it, named beside it. */
#ifndef PLAIT_RUNDIR_H
#define PLAIT_RUNDIR_H

#include <stddef.h>

#include "common/error.h"
#include "common/plan/plan.h"

/* in RUN_DIR */
#define RUNDIR_PLAN "plan.json"          /* the plan the run trains: here */
#define RUNDIR_RUN "run.json"            /* the run as it started, its memory: runjson.h */
#define RUNDIR_METRICS "metrics.jsonl"   /* a record per step and evaluation: metrics.h */
#define RUNDIR_END "end.json"            /* how its last process ended: runend.h */
#define RUNDIR_LOG "train.log"           /* rank 0's console: runtime/console.h */
#define RUNDIR_LOCK ".lock"              /* who runs it now: runlock.h */
#define RUNDIR_CHECKPOINTS "checkpoints" /* checkpoint.dir unless the plan says */

/* in one checkpoint (ckptdir.h) */
#define CKPT_MANIFEST "manifest.json" /* sizes, checksums, layout: ckpt_manifest.h */
#define CKPT_STATE "state.json"       /* how far training got: ckpt_state.h */
#define CKPT_PLAN "plan.json"         /* the plan that wrote it: as RUNDIR_PLAN */

/* Writes RUN_DIR/plan.json (whole: it appears at once), the text plan_to_json
 * made. A checkpoint's copy is written as its other files are (ckptdir.h). */
int rundir_plan_write(const char *dir, const char *plan_json, struct plait_error *err);

/* dir/plan.json through plan_load; NULL with err naming the file. */
struct plan *rundir_plan_load(const char *dir, struct plait_error *err);

/* The checkpoint directory of the run in run_dir: p's checkpoint.dir,
 * relative to run_dir unless absolute. */
int rundir_checkpoint_dir(const struct plan *p, const char *run_dir, char *out, size_t bytes,
                          struct plait_error *err);

#endif
