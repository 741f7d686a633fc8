/* run_read.h — what plait status and plait plot read back from a run
 * directory: the records of metrics.jsonl as columns. Not here: the run's
 * lock, checkpoints or end (status reads those itself). */
#ifndef PLAIT_LAUNCHER_RUN_READ_H
#define PLAIT_LAUNCHER_RUN_READ_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

struct run_step {
    int step;
    double loss, lr, ms, tokens_per_s;
    int64_t tokens_total; /* tokens trained on after this step */
};

struct run_eval {
    int step;
    double val_loss;
    int64_t tokens_total; /* tokens trained on at that step (0 when unknown) */
};

struct run_series {
    struct run_step *steps; /* in file order */
    struct run_eval *evals;
    int n_steps, n_evals;
};

/* Reads RUN_DIR/metrics.jsonl (lines that do not parse are skipped: a line
 * being written). A missing file is an empty series; -1 with err otherwise. */
int run_series_read(const char *run_dir, struct run_series *s, struct plait_error *err);
void run_series_free(struct run_series *s);

/* The run's checkpoint directory: its plan's checkpoint.dir (relative to the
 * run directory unless absolute; "checkpoints" by default). */
int run_checkpoint_dir(const char *run_dir, char *out, size_t out_bytes, struct plait_error *err);

#endif
