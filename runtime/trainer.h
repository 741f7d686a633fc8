/* trainer.h — the state of one rank's training run, shared by the files that
 * make the run: train.c (the loop), train_setup.c (start and end),
 * train_batches.c (a step's micro-batches, evaluation), train_save.c (the
 * loop's checkpoints), run_dir.c (the run directory) and report.c (what the
 * run says). Nothing else includes it: train.h is the run's interface. */
#ifndef PLAIT_RUNTIME_TRAINER_H
#define PLAIT_RUNTIME_TRAINER_H

#include <stdbool.h>
#include <stdint.h>

#include "common/formats/ckpt_state.h"
#include "common/formats/ckptdir.h"
#include "common/formats/metrics.h"
#include "common/formats/runjson.h"
#include "common/formats/runlock.h"
#include "common/place/env.h"
#include "common/place/schedule.h"
#include "common/plan/plan.h"
#include "common/rng.h"
#include "kernels/cpu/cpu_rate.h"
#include "kernels/ops.h"
#include "runtime/buckets.h"
#include "runtime/ckpt_async.h"
#include "runtime/data.h"
#include "runtime/model.h"
#include "runtime/parallel.h"
#include "runtime/pipeline.h"
#include "runtime/sample.h"

struct trainer {
    const struct plan *plan;
    const struct env_rank *where; /* this rank's place (the env contract), context parallelism
                                     folded into its dp (parallel_fold): dp·cp ranks */
    int T;                        /* this rank's tokens of a sequence: model.seq_len / cp */
    int32_t *whole_tokens, *whole_targets; /* cp > 1: (B,seq_len) a micro-batch's sequences as
                                              read, before this rank takes its chunks */
    struct parallel par;          /* the other ranks (none with one rank) */
    bool par_ready, multi;        /* multi: more than one rank */
    struct schedule sched;        /* the pipeline schedule of a step */
    double bubble_sim;            /* its bubble simulated as plait check does (pp > 1) */
    bool sched_ready;
    const char *plan_json;
    const char *run_dir;
    char ckpt_dir[4096];
    struct runlock run_lock, ckpt_lock; /* one run per run and checkpoint directory */
    struct ckptdir ckpts;
    bool ckpts_open;
    const struct ops *ops; /* the op backend, */
    char device_note[512]; /* why not a GPU ("auto" on a host without one), "" */
    struct ops_ctx *ctx;   /* its context (the model's, the collectives' stream) */
    struct model m;
    bool model_ready;
    struct data_loader train, val;
    bool has_val;
    struct metrics metrics;
    struct train_state st;
    struct rng sample_rng;
    struct tokenizer tok;
    bool has_tok;
    int32_t *inputs, *targets;
    double peak_gflops;      /* the denominator of "% of peak" (report_measure_peak), */
    const char *peak_source; /* and what it is */
    struct cpu_rate cpu_rate; /* a CPU rank's rates at the plan's shapes, once measured */
    bool has_cpu_rate;
    double flops_per_token;
    double gpu_peak_tflops;  /* the dense datasheet peak of this rank's GPU in the plan's
                                precision, the denominator of MFU; 0: a CPU rank, or a GPU
                                plait does not know */
    const char *dump_dir;    /* PLAIT_DUMP_STEP1, NULL = off */
    int dump_step;           /* the step dumped: the first this process takes (0-based) */
    int32_t *dump_tokens;    /* (B·T) its first micro-batch (the first stage's) */
    long signal_after_micro; /* PLAIT_DEBUG_SIGNAL_AFTER_MICRO, 0 = off */
    double slow_read_s;      /* PLAIT_DEBUG_SLOW_RANK's delay for this rank, 0 = off */
    long micro_done;         /* micro-batches run by this process */
    bool reads_data;         /* a pipeline end: its loaders are open */
    struct pipe_times times; /* where the last step went */
    struct buckets buckets;  /* dp > 1: the gradients' reduction overlapping backward */
    bool bucketed;
    bool hooked;         /* the buckets start during this call's backwards (not a dump's step) */
    bool grads_early;    /* an offloaded step's gradient comes down before the step: during
                            the last backward (dp 1), or as the buckets' sums arrive
                            (runtime/host_step.h; make_step_buffers decides) */
    bool data_failed;    /* the last error came from reading data */
    double timed_s;      /* wall time of the steps in m.prof */
    double prior_step_s; /* a resumed run's median step before it stopped (its metrics), for the
                            ETA until this process has timed a step; 0: none */
    double rss_before_model;    /* run.json: the resident set just before model_init, bytes */
    char *made_run_dir;         /* the outermost directory this start created for the run */
    char *made_ckpt_dir;        /* (fs_mkdir_p_made), or NULL: undone if it fails */
    double saved_at_s;          /* when the last checkpoint was written (or training began) */
    struct ckpt_async async;    /* checkpoint.async: the one being written in the background */
    double ckpt_write_s;        /* run.json: the last checkpoint's write time (its files), */
    double ckpt_stall_s;        /* and how long the step paused for it */
    double last_loss, last_val; /* the final summary's (NAN until known) */
    struct run_record run;      /* run.json as rank 0 last wrote it */
    struct {                    /* rank 0's progress lines (train.log_every) */
        struct step_metrics held; /* the last step's, not printed yet */
        double held_step_s;       /* its ETA's average step */
        bool holding;
        double printed_at_s;      /* when the last was printed (prof_now) */
        unsigned warnings;        /* log_warnings() then */
    } progress;
};

#endif
