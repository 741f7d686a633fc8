/* metrics.h — RUN_DIR/metrics.jsonl: one JSON object per
 * optimizer step ({"step", "loss", "lr", "grad_norm", "tokens", "tokens_total",
 * "ms", "tokens_per_s", "peak_pct"[, "mfu" on a GPU whose peak plait knows][, "resumed": true
 * on the first step a resumed run took: where it resumed, for plait plot]}, and with
 * several ranks "parallel":
 * {"ranks", "compute_pct", "comm_pct", "bubble_pct", ["bubble_simulated_pct" with a
 * pipeline,] "bytes": {"tp", "pp", "dp"[, "cp" with context parallelism]}, "wait_ms": {the same},
 * "straggler": {"rank", "busy_ms", "median_busy_ms"}}), with mixture of experts "moe":
 * {"balance_loss", "z_loss", "dropped", "load": [a share per expert]}, and one per
 * evaluation ({"eval_step",
 * "val_loss", "val_tokens"}). On resume the file is cut back to the
 * checkpoint's step so that it reads as if the run had never stopped.
 * plait-train's rank 0 writes it through here; plait status and plait plot
 * read it back through here. */
#ifndef PLAIT_METRICS_H
#define PLAIT_METRICS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common/error.h"
#include "common/formats/tensorboard.h"

struct metrics {
    FILE *f;
    char path[4096];
    FILE *echo;            /* also each record here (plait train --json: stdout), NULL none */
    struct tensorboard tb; /* and the scalars as TensorBoard events, when open */
};

struct step_metrics {
    int step; /* 1-based */
    double loss, lr, grad_norm;
    int64_t tokens, tokens_total;
    double ms, tokens_per_s;
    double peak_pct; /* model FLOPs as % of the device's measured rate */
    double mfu;      /* model FLOPs over the GPUs' dense datasheet peak, a fraction; 0: CPU
                        ranks or a GPU plait does not know (not written) */
    bool resumed;    /* the first step of a run resumed from a checkpoint (written when true) */
    /* more than one rank (written when ranks > 1): */
    int ranks;
    double compute_pct, comm_pct, idle_pct; /* shares of the step, averaged over the ranks:
                                               computing, sending, waiting for a pipeline
                                               neighbour (the bubble as measured) */
    double bubble_sim_pct;                  /* the schedule's simulated bubble (< 0: no pipeline) */
    double bytes_tp, bytes_pp, bytes_dp;    /* sent per rank in the step, averaged over the
                                               ranks of each communicator */
    double wait_tp_ms, wait_pp_ms, wait_dp_ms; /* time a rank was blocked in each communicator
                                                  (what computing did not hide; the pipeline's
                                                  includes waiting for a neighbour), averaged
                                                  the same way */
    double bytes_cp, wait_cp_ms; /* the same of context parallelism's ring (written when it sent) */
    double bytes_ep, wait_ep_ms; /* the same of expert parallelism's all-to-alls (written when
                                    they sent; the wait what the other lane of a DualPipeV pair
                                    did not hide) */
    double step_ms; /* the slowest rank's wall time: the step's (not written: ms is) */
    /* the straggler: the rank whose own work (computing, reading its data)
     * took longest, that work's time and the median rank's */
    int straggler;
    double busy_ms, median_busy_ms;
    /* mixture of experts (written as "moe" when moe_experts > 0): the balance loss and
     * the z-loss (a micro-batch's, summed over the MoE layers, as the loss is averaged),
     * the choices dropped at an expert's capacity (all of the step's), and each
     * expert's share of the step's choices */
    int moe_experts;
    double moe_balance_loss, moe_z_loss, moe_dropped;
    double *moe_load; /* (moe_experts): the writer's; read back, the series' */
};

struct eval_metrics {
    int step; /* the optimizer steps done when it ran */
    double val_loss;
    int64_t val_tokens;
    int64_t tokens_total; /* read back: the tokens trained on by then (the step record
                             before it; 0 when none); not written */
};

/* Opens run_dir/metrics.jsonl, keeping only records of steps ≤ keep_step. */
int metrics_open(struct metrics *mt, const char *run_dir, int keep_step, struct plait_error *err);
/* Also writes each step's loss, lr, gradient norm and tokens/s and each evaluation's loss as
 * TensorBoard events ("train/loss", …, "val/loss") into dir (relative: to run_dir), a new
 * file for a run resumed after keep_step steps (tensorboard.h). */
int metrics_tensorboard(struct metrics *mt, const char *run_dir, const char *dir, int keep_step,
                        struct plait_error *err);
int metrics_step(struct metrics *mt, const struct step_metrics *s, struct plait_error *err);
int metrics_eval(struct metrics *mt, const struct eval_metrics *e, struct plait_error *err);
void metrics_close(struct metrics *mt);

/* The records of a run, in file order. A record read back has what was
 * written: with one rank (no "parallel"), ranks is 1 and the parallel
 * fields 0; without a pipeline bubble_sim_pct is -1; step_ms is 0. */
struct metrics_series {
    struct step_metrics *steps;
    struct eval_metrics *evals;
    int n_steps, n_evals;
};

/* Reads RUN_DIR/metrics.jsonl. A line that is not JSON is passed over (one
 * being written), and so is an object that is neither a step's nor an
 * evaluation's; a record whose members are wrong is an error naming the
 * file, line and member. A missing file is an empty series. */
int metrics_read(const char *run_dir, struct metrics_series *s, struct plait_error *err);
void metrics_series_free(struct metrics_series *s);

#endif
