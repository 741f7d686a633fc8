/* train_batches.h — what a training step does with its micro-batches: this
 * rank's share of the data through the pipeline executor, the gradient sums
 * the pipeline's ends share; and the forward-only passes (evaluation, the
 * developer's dump of step 1). The optimizer step and the loop are train.c's. */
#ifndef PLAIT_RUNTIME_TRAIN_BATCHES_H
#define PLAIT_RUNTIME_TRAIN_BATCHES_H

#include "common/error.h"
#include "runtime/trainer.h"

/* The micro-batches of step s (from st.micro on, when resumed mid-step)
 * through the schedule executor. Returns 1 when a stop ended it between
 * micro-batches, 0 when the step's gradients are complete, -1 on error (a
 * data error after a checkpoint of the work so far). */
int train_micro_batches(struct trainer *t, int s, float grad_scale, struct plait_error *err);

/* Whether this rank's st.loss_sum is part of the step's loss, summed over the ranks:
 * the last stage's (its cross-entropy) and, with mixture of experts, every stage's
 * (the MoE losses of its layers), each on tp rank 0. */
bool train_holds_loss(const struct trainer *t);

/* Mixture of experts: *out (MOE_STATS(E), common/formats/ckpt_state.h) the routing
 * statistics of the step's micro-batches so far, summed over the ranks (every rank
 * calls it); 0 without experts. */
int train_moe_stats(struct trainer *t, double *out, struct plait_error *err);

/* The tied wte's gradient, summed between the pipeline's first and last stage. */
int train_tied_sum(struct trainer *t, struct plait_error *err);

/* Mean loss over val_batches micro-batches from the start of the validation
 * data, reported by rank 0 (report_eval); not training time (kept out of the
 * profile). Returns 1 when interrupted by a stop request, 0 when done. */
int train_evaluate(struct trainer *t, struct plait_error *err);

/* PLAIT_DUMP_STEP1, once step 1's micro-batches are done and before its
 * optimizer step (the parameters are still the initial ones): the logits of
 * its first micro-batch (dp replica 0's), from a forward of it again, and the
 * step's gradients. */
int train_dump_step1(struct trainer *t, struct plait_error *err);

#endif
