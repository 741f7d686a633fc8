/* schedule.h — pipeline schedules as data. A generator turns (kind, pp, m, v)
 * into each stage's list of operations; one executor in the runtime runs any
 * list, and `plait check` simulates and prints the same list, so the bubble it
 * predicts is the one the runtime measures.
 *
 * Operations per stage: F (forward of one micro-batch through one model chunk),
 * B (backward: with a split schedule only the input gradient), W (the weight
 * gradient, split schedules only), and the point-to-point transfers between
 * neighbouring stages: SEND_ACT/RECV_ACT (activations forward) and
 * SEND_GRAD/RECV_GRAD (their gradients backward). A receive is placed just
 * before the computation that needs it and a send just after the one that
 * produced it; sends never block (the executor posts them asynchronously), so
 * a list is deadlock-free when its receives can all complete in order, which
 * schedule_simulate checks.
 *
 * Interleaved schedules give each stage v model chunks: chunk c of stage s is
 * virtual stage c·pp + s, so the model's layers run stage 0..pp-1 through
 * chunk 0, then through chunk 1, and so on. DualPipeV (DeepSeek's "cut in
 * half" DualPipe) gives each stage two chunks in a V: chunk 0 of stage s is
 * virtual stage s and chunk 1 is virtual stage 2·pp-1-s, so a micro-batch
 * goes down the stages through chunk 0, turns on the last stage (its chunk 0
 * hands over to its own chunk 1) and comes back up through chunk 1: the first
 * stage embeds and computes the loss. schedule_virtual_stage says which. */
#ifndef PLAIT_SCHEDULE_H
#define PLAIT_SCHEDULE_H

#include <stdbool.h>
#include <stdio.h>

#include "common/error.h"
#include "common/plan/plan.h" // defines: struct plan, enum plan_pipeline

enum sched_kind { SCHED_1F1B, SCHED_GPIPE, SCHED_INTERLEAVED, SCHED_ZB_H1, SCHED_DUALPIPEV };
#define SCHED_KINDS 5

enum sched_op_type {
    SCHED_F,
    SCHED_B,
    SCHED_W,
    SCHED_SEND_ACT,
    SCHED_RECV_ACT,
    SCHED_SEND_GRAD,
    SCHED_RECV_GRAD
};

struct sched_op {
    enum sched_op_type type;
    int micro; /* 0..m-1 */
    int chunk; /* 0..v-1 */
};

struct schedule {
    enum sched_kind kind;
    int pp, m, v;
    bool split_backward;   /* B is the input gradient only and W follows separately */
    int *n_ops;            /* [pp] */
    struct sched_op **ops; /* [pp][n_ops[s]] */
};

/* Builds the schedule. m micro-batches per step; v chunks per stage (1 unless
 * interleaved, then >= 2 and m a multiple of pp; DualPipeV 2, with m >= 2·pp).
 * -1 with err when the combination is impossible. */
int schedule_make(struct schedule *s, enum sched_kind kind, int pp, int m, int v,
                  struct plait_error *err);
void schedule_free(struct schedule *s);

const char *schedule_kind_name(enum sched_kind kind);

/* The stage and chunk that run virtual stage j (schedule_virtual_stage's
 * inverse). */
void schedule_stage_of(const struct schedule *s, int j, int *stage, int *chunk);

/* Whether a kind splits each backward into an input- and a weight-gradient
 * pass (ZB-H1, DualPipeV). */
bool schedule_kind_splits(enum sched_kind kind);

/* The virtual stage chunk c of stage s runs: c·pp + s, or in DualPipeV's V
 * s for chunk 0 and 2·pp-1-s for chunk 1. Activations go from virtual stage
 * j to j + 1 (on DualPipeV's last stage, from its chunk 0 to its chunk 1). */
int schedule_virtual_stage(const struct schedule *s, int stage, int chunk);

/* The schedule a plan's stage runs with pp stages, the one place that decides
 * it: the plan's parallel.schedule, interleaved and dualpipev only with a
 * pipeline (one stage runs its layers as one chunk: 1F1B), v its chunks per
 * stage (dualpipev's 2). For
 * plait-train, plait check and the cost model alike. */
void schedule_of_plan(const struct plan *p, int pp, enum sched_kind *kind, int *v);
/* Whether a plan's stages, pp of them, run each pair of DualPipeV's main steps (a forward of
 * one chunk beside a backward of the other) as two lanes that take turns, the experts'
 * all-to-all of one lane hidden behind the other's compute (runtime/lanes.h): DualPipeV with
 * a pipeline, model.moe and parallel.ep > 1, but at ZeRO 3 (whose gathers fill windows in a
 * pass's order) and on GPUs (the second lane's thread would need the rank's device and
 * stream bound): their pairs run one pass after the other, and *why_not (when not NULL)
 * says why; NULL otherwise. Such a stage holds a second copy of what a pass keeps across an
 * MoE block's exchange in one copy every slot shares, the buffers recompute reruns among
 * them (gpt2_memory_shape's moe_lanes). */
bool schedule_moe_lanes(const struct plan *p, int pp, const char **why_not);
/* schedule_make of schedule_of_plan, m the plan's batch.grad_accum */
int schedule_make_for_plan(struct schedule *s, const struct plan *p, int pp,
                           struct plait_error *err);

/* The most micro-batch chunks stage `stage` holds activations for at once (F
 * run, its backward — W when split — not yet): what the schedule promises and
 * the runtime allocates. GPipe m; 1F1B and ZB-H1 min(pp - stage, m);
 * interleaved min(2(pp - stage - 1) + (v - 1)·pp + 1, m·v); DualPipeV counted
 * on its list. */
int schedule_max_in_flight(const struct schedule *s, int stage);

/* Where a stage's gradient buffer is quiescent: at[n] (n = 1..m; at has m + 1
 * entries) is true when, at some point of stage's list, every gradient pass
 * (B, and W when split) of micro-batches 0..n-1 has run on every chunk and
 * none of a later micro-batch has. Each chunk's passes run in micro-batch
 * order, so that point is micro-batch n-1's last pass (its chunk 0's). at[m]
 * always; 1F1B, GPipe and ZB-H1 every n; interleaved the multiples of pp. A
 * gradient handed over there (ZeRO 2) is whole micro-batches'. */
void schedule_quiescent(const struct schedule *s, int stage, bool *at);

/* Whether the first stage may stop the step before micro-batch k enters (0 <
 * k < m): anywhere but interleaved, whose rest must be a multiple of pp to be
 * scheduled again, and dualpipev, which stops only at the step's end. Each such k is quiescent on every stage (at[k]), and the
 * rest's schedule is quiescent where the whole step's is, so gradients handed
 * over at quiescent points meet the same sums whether the step stopped or not. */
bool schedule_may_stop(const struct schedule *s, int k);

/* Running the lists with each computation taking a fixed time (t_f, t_b, t_w
 * per chunk; without a split, B takes t_b + t_w) and transfers taking none. */
struct sched_sim {
    double makespan;        /* time until the last stage finishes */
    double bubble;          /* idle share of pp · makespan */
    double busy_per_stage;  /* computation time of one stage */
    int peak_in_flight[64]; /* per stage (first 64): micro-batch chunks whose F ran and whose
                               activations are still held (W, or B without split, not yet run) */
};

/* -1 with err naming the first operation that can never run (a receive
 * without its send, a B before its F, a W before its B) or a stage that does
 * not run each F, B (and W) exactly once. */
int schedule_simulate(const struct schedule *s, double t_f, double t_b, double t_w,
                      struct sched_sim *out, struct plait_error *err);
/* schedule_simulate with a layer's backward twice its forward (split: B and
 * W one forward each), per chunk 1/v of the stage's: the bubble plait check
 * prints and the runtime reports beside the one it measures */
int schedule_simulate_textbook(const struct schedule *s, struct sched_sim *out,
                               struct plait_error *err);

/* The textbook bubble (schedule_simulate_textbook) of every kind at pp
 * stages and m micro-batches, the interleaved one with v chunks (2 when v
 * < 2), into bubble[kind]; -1 where the kind cannot run that shape. What
 * plait check sets beside a plan's own schedule. */
void schedule_bubbles(int pp, int m, int v, double bubble[SCHED_KINDS]);

/* A compact text timeline: one row per stage, one character per time unit of
 * the simulation with t_f = 1, t_b = 1, t_w = 1 (F: the micro-batch's last
 * digit; B lower case letter a-j by last digit; W: 'w'; idle '.'). At most
 * max_columns columns. */
void schedule_print(const struct schedule *s, FILE *out, int max_columns);

#endif
