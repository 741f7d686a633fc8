/* pipeline.h — the schedule executor: one optimizer step of one pipeline
 * stage, running the stage's list of operations from common/place/schedule.h
 * (forwards, backwards, and the transfers of activations and their
 * gradients between neighbouring stages) over the model's slots. Every
 * schedule runs through it, pp = 1 (plain gradient accumulation) included.
 *
 * It knows nothing of sockets or data files: the transfers go through a
 * pipe_link and the micro-batches come from a pipe_feed, which the training
 * loop (or a test) provides. */
#ifndef PLAIT_RUNTIME_PIPELINE_H
#define PLAIT_RUNTIME_PIPELINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "common/place/schedule.h"
#include "runtime/model.h"

/* Transfers with the neighbouring stages. send may return as soon as buf's
 * bytes are handed off (buf is reusable after it returns) and must never wait
 * for the peer to receive; on_host: buf is host memory (a control word), else
 * the model's (backend) memory. recv waits (with the layer's deadline). Tags
 * tell a micro-batch's activation from its gradient, but a receiver must
 * take a stage's messages in the order that stage sent them (NCCL pairs them
 * so). flush (may be NULL): waits until what was handed off has been sent
 * (the end of a step; a link that sends in the background needs it). */
struct pipe_link {
    int (*send)(void *ctx, int to_stage, uint32_t tag, const float *buf, size_t n, bool on_host,
                struct plait_error *err);
    int (*recv)(void *ctx, int from_stage, uint32_t tag, float *buf, size_t n,
                struct plait_error *err);
    int (*flush)(void *ctx, struct plait_error *err);
    void *ctx;
};

/* The micro-batches of the step, in order: micro k's tokens and targets (the
 * first stage uses the tokens, the last the targets). */
struct pipe_feed {
    int (*next)(void *ctx, int micro, int32_t *tokens, int32_t *targets, struct plait_error *err);
    void *ctx;
};

/* Where a stage's step went (seconds). */
struct pipe_times {
    double compute_s; /* forwards and backwards (tensor-parallel collectives included) */
    double send_s;    /* handing off activations and gradients */
    double idle_s;    /* waiting for a neighbour: the bubble, as this stage lived it */
    double data_s;    /* reading micro-batches */
};

/* How to run a step. */
struct pipe_step {
    int B, T;            /* the micro-batch */
    float grad_scale;    /* as model_forward's */
    bool accumulate;     /* the first backward adds to the gradients already there (a step
                            resumed where it stopped); else it writes them */
    /* Called once each micro-batch's gradients are in and its input gradient
     * has gone upstream (may be NULL): 0, or -1 with err. */
    int (*after_backward)(void *ctx, int micro, struct plait_error *err);
    /* NULL: the gradients accumulate over the whole step. Else (ZeRO 2) they
     * are handed over, and the buffer taken away, at every point of the
     * stage's list where it is quiescent (schedule_quiescent: micro-batches
     * 0..micros-1 have run every gradient pass, later ones none), after that
     * micro-batch's after_backward; the next pass writes the buffer afresh.
     * A step stopped early hands over where it drained. 0, or -1 with err. */
    int (*hand_over)(void *ctx, int micros, struct plait_error *err);
    /* A stop mid-step (both may be NULL: the step runs to its end).
     * agree_stop: on the first stage, before each micro-batch but the step's
     * first enters (the same place in every first-stage rank's list): *stop
     * (1 when a later stage asked for it) maxed over the first stage's ranks
     * and this rank's own wish; 0, or -1 with err. wants_stop: whether this
     * rank was asked to stop (a signal), told upstream with its gradients. */
    int (*agree_stop)(void *ctx, int *stop, struct plait_error *err);
    bool (*wants_stop)(void *ctx);
    void *ctx;
    /* The model's grads_final hook during the last backward before a hand-over
     * (the step's end without hand_over), as the gradients to be handed over
     * become final (may be NULL: runtime/buckets.h). */
    int (*grads_final)(void *ctx, size_t from, size_t to, struct plait_error *err);
    void *grads_ctx;
    /* Set as the hook is (may be NULL): whether the hand-over its pass leads to is the
     * step's end, its gradients the optimizer step's (ZeRO 2: else an earlier one's) */
    bool *grads_at_end;
};

/* Runs stage `stage`'s list of s on m (built with s->v chunks), whose slots must number at
 * least schedule_max_in_flight(s, stage). *loss_sum (last stage) gets the sum
 * of the micro-batches' mean losses, *done how many micro-batches completed:
 * s->m, or k when the first stage agreed to stop before micro-batch k (every
 * stage of the pipeline then completes exactly micro-batches 0..k-1). Each
 * activation and gradient is preceded on the link by a one-float control
 * word (pipeline.c says how a stop travels). Returns 0, or -1 with err. */
int pipeline_step(struct model *m, const struct schedule *s, int stage,
                  const struct pipe_link *link, const struct pipe_feed *feed,
                  const struct pipe_step *how, double *loss_sum, int *done,
                  struct pipe_times *times, struct plait_error *err);

#endif
