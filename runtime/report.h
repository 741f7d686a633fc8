/* report.h — what one rank's training run says: its opening lines, a step's
 * metrics (metrics.jsonl) and progress line, the evaluation's, run.json (the
 * machine, memory, modelled and measured speed) and the closing summary.
 * Rank 0 writes; the gathers behind a step's and the memory's figures are
 * collective. end.json is main.c's (how the process ended). */
#ifndef PLAIT_RUNTIME_REPORT_H
#define PLAIT_RUNTIME_REPORT_H

#include <stdbool.h>

#include "common/error.h"
#include "common/formats/metrics.h"
#include "runtime/parallel.h"
#include "runtime/trainer.h"

/* A step as the loop took it. */
struct step_taken {
    int index;                  /* 0-based */
    bool warm_up;               /* this process's first step: not in the averages */
    double t0;                  /* when it began (prof_now) */
    double bytes0[PAR_NCOMM];   /* the communicators' totals then: bytes sent, */
    double wait0[PAR_NCOMM];    /* and seconds blocked */
    double lr, loss, grad_norm; /* the step's */
};

/* The rate "% of peak" is against, once as the run starts, into t->peak_gflops (with
 * t->peak_source): PLAIT_PEAK_GFLOPS; a GPU's datasheet peak in the plan's precision where
 * plait knows the GPU (the MFU's); on the CPU, this rank's products at the plan's shapes
 * (cpu_rate_measure, as plait check measures them; the modelled speed's too); else one
 * product measured now (device_peak_gflops). */
void report_measure_peak(struct trainer *t);

/* On CPU ranks, the rates report_measure_peak takes, measured before the
 * model is allocated: the measurement's buffers (up to ~128 MB, freed) then
 * never add to the rank's peak resident set, which bench-memory holds against
 * the model's prediction. */
void report_measure_cpu_early(struct trainer *t);

/* Rank 0's files of the run as it starts: plan.json, metrics.jsonl (cut back
 * to the state's step) and run.json; resumed_from: the checkpoint, "" none. */
int report_open(struct trainer *t, const char *resumed_from, struct plait_error *err);

/* A size line of /proc/self/status ("VmHWM" the peak resident set, "VmRSS"
 * the current one), bytes; 0 where the kernel does not say. */
double report_proc_status_bytes(const char *field);

/* The lines a run's training opens with: the model and its shapes, the
 * layout, how bf16 or fp8 products run where they are emulated. */
void report_start(const struct trainer *t);

/* Step st's metrics into *sm, and rank 0's into metrics.jsonl; *dt is its
 * time (the slowest rank's, with several). Collective with several ranks. */
int report_step(struct trainer *t, const struct step_taken *st, struct step_metrics *sm, double *dt,
                struct plait_error *err);

/* After this process's first step (step, 1-based): the backend's fp8
 * fallback, if any, and every rank's memory in run.json. Collective. */
int report_first_step(struct trainer *t, int step, struct plait_error *err);

/* Rank 0's progress line of a step, printed now or held as train.log_every says; avg_step_s
 * for the ETA; first: this process's first step (always printed). metrics.jsonl has every
 * step whatever is printed. */
void report_progress(struct trainer *t, const struct step_metrics *s, double avg_step_s,
                     bool first);

/* The progress line held back, if any, printed now: before what a step does beyond
 * training (its evaluation, a checkpoint) and at the run's end. */
void report_progress_flush(struct trainer *t);

/* Rank 0's evaluation: its line and its metrics record. */
int report_eval(struct trainer *t, double val, struct plait_error *err);

/* Rank 0's end of a run that did not fail (rc PLAIT_EXIT_OK or _PREEMPTED):
 * the summary line and run.json with the measured speed. */
void report_end(struct trainer *t, int rc);

#endif
