/* pipeline.c — running one stage's schedule for one step: micro-batches into
 * slots as they arrive, forwards and backwards through the model, transfers
 * through the link, and the time each kind of operation took. Which list to
 * run is common/schedule.c's; moving bytes is the link's. */
#include "runtime/pipeline.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A micro-batch's activation and its gradient travel under different tags. */
static uint32_t tag_of(int micro, bool gradient)
{
    return 2u * (uint32_t)micro + (gradient ? 1u : 0u);
}

/* A stop mid-step. The first stage decides: before each micro-batch k > 0
 * enters (its F of chunk 0), every first-stage rank (tp × dp) calls
 * agree_stop at that same place of its list, so all of them agree on the same
 * k. On a stop at k, a stage runs nothing more of micro-batches >= k: it
 * drains, running the rest of its list for micro-batches < k (forwards,
 * backwards, weight passes), and its gradients cover exactly 0..k-1. The
 * decision travels down in the control word that precedes every activation
 * on the link (0 go, 1 stop: no activation follows); a stage that reads a
 * stop at its receive of micro k forwards it at once and drains too. Dropping
 * every operation of micro-batches >= k from every stage's list keeps both
 * ends of each transfer or neither, so the shortened lists are deadlock-free
 * as the schedule is, and every wait keeps the link's deadline. The control
 * word before each gradient carries the sender's wish to stop upstream (its
 * own signal, or one from further down), so a signal to any rank reaches the
 * first stage, at the latest with the step's last gradients. */
static uint32_t control_tag(int micro, bool gradient)
{
    return 0x20000000u | tag_of(micro, gradient);
}

struct run {
    struct model *m;
    int *slot_of; /* [m] micro-batch -> slot, -1 */
    bool *busy;   /* [n_slots] */
};

static int take_slot(struct run *r, int micro, struct plait_error *err)
{
    if (r->slot_of[micro] >= 0) return r->slot_of[micro];
    for (int s = 0; s < r->m->n_slots; s++)
        if (!r->busy[s]) {
            r->busy[s] = true;
            return r->slot_of[micro] = s;
        }
    return error_set(err, "pipeline: no free activation slot for micro-batch %d (%d slots)", micro,
                     r->m->n_slots);
}

static void give_slot(struct run *r, int micro)
{
    if (r->slot_of[micro] >= 0) r->busy[r->slot_of[micro]] = false;
    r->slot_of[micro] = -1;
}

/* The step's last backward (its weight-gradient pass, when split) makes the
 * gradients final: the model calls how's hook as layers complete. */
static void hook(struct model *m, const struct pipe_step *how)
{
    m->grads_final = how->grads_final;
    m->grads_final_ctx = how->grads_ctx;
}

/* Micro-batch k's gradients are all in: its slot is free, and the caller's
 * after_backward runs. 0, or -1 with err. */
static int micro_done(struct run *r, const struct pipe_step *how, int k, int *done,
                      struct plait_error *err)
{
    give_slot(r, k);
    *done = k + 1;
    return how->after_backward ? how->after_backward(how->ctx, k, err) : 0;
}

int pipeline_step(struct model *m, const struct schedule *s, int stage,
                  const struct pipe_link *link, const struct pipe_feed *feed,
                  const struct pipe_step *how, double *loss_sum, int *done,
                  struct pipe_times *times, struct plait_error *err)
{
    int B = how->B, T = how->T;
    if (s->v != 1)
        return error_set(err, "pipeline: the %s schedule is not supported by this runtime yet",
                         schedule_kind_name(s->kind));
    if (s->split_backward && !m->split_backward)
        return error_set(err, "pipeline: the %s schedule needs a model built for a split backward",
                         schedule_kind_name(s->kind));
    if (s->split_backward && how->overwrite_each)
        return error_set(err, "pipeline: a split backward cannot hand over each micro-batch's "
                              "gradients (ZeRO 2): another's input-gradient pass runs between "
                              "a micro-batch's two passes");
    if (schedule_max_in_flight(s, stage) > m->n_slots)
        return error_set(err,
                         "pipeline: stage %d holds up to %d micro-batches, the model has %d "
                         "slots",
                         stage, schedule_max_in_flight(s, stage), m->n_slots);
    size_t N = (size_t)B * T, NC = model_stage_floats(m, B, T); /* what crosses a stage */
    struct run r = {m, malloc((size_t)s->m * sizeof(int)), calloc((size_t)m->n_slots, 1)};
    int32_t *tokens = malloc(N * sizeof *tokens), *targets = malloc(N * sizeof *targets);
    float *grad = malloc(NC * sizeof *grad);
    int rc = -1, backwards = 0, weights = 0;
    int stop_at = s->m; /* the micro-batch the pipeline stops before */
    float word = 0;     /* a control word */
    bool asked = false; /* a later stage asked to stop */
    memset(times, 0, sizeof *times);
    if (loss_sum) *loss_sum = 0;
    *done = 0;
    if (!r.slot_of || !r.busy || !tokens || !targets || !grad) {
        error_set(err, "out of memory");
        goto out;
    }
    for (int k = 0; k < s->m; k++) r.slot_of[k] = -1;
    for (int i = 0; i < s->n_ops[stage]; i++) {
        struct sched_op op = s->ops[stage][i];
        int k = op.micro, slot;
        double t0 = now_s();
        if (k >= stop_at) continue; /* draining */
        /* A backward's input gradient goes upstream before after_backward runs:
         * a collective in it (ZeRO 2's tied sum with the first stage) must not
         * hold back the gradient the first stage waits for. */
        bool sends_grad = op.chunk * s->pp + stage > 0;
        switch (op.type) {
        case SCHED_RECV_ACT:
            if (link->recv(link->ctx, stage - 1, control_tag(k, false), &word, 1, err)) goto out;
            if (word != 0) { /* a stop at k: passed on down at once */
                stop_at = k;
                if (stage + 1 < s->pp &&
                    link->send(link->ctx, stage + 1, control_tag(k, false), &word, 1, err))
                    goto out;
                times->idle_s += now_s() - t0;
                break;
            }
            if ((slot = take_slot(&r, k, err)) < 0 ||
                link->recv(link->ctx, stage - 1, tag_of(k, false), model_stage_input(m, slot), NC,
                           err))
                goto out;
            times->idle_s += now_s() - t0;
            break;
        case SCHED_F: {
            double loss = 0;
            if (stage == 0 && op.chunk == 0 && k > 0 && how->agree_stop) {
                int stop = asked;
                if (how->agree_stop(how->ctx, &stop, err)) goto out;
                if (stop) {
                    stop_at = k;
                    word = 1;
                    if (s->pp > 1 && link->send(link->ctx, 1, control_tag(k, false), &word, 1, err))
                        goto out;
                    break;
                }
                t0 = now_s(); /* its wait is its communicators' (tp, dp), not this stage's */
            }
            if ((slot = take_slot(&r, k, err)) < 0) goto out;
            if (m->first || m->last) {
                if (feed->next(feed->ctx, k, tokens, targets, err)) goto out;
                double t1 = now_s();
                times->data_s += t1 - t0;
                t0 = t1;
            }
            if (model_stage_forward(m, slot, tokens, targets, B, T, how->grad_scale, &loss, err))
                goto out;
            if (m->last && loss_sum) *loss_sum += loss;
            times->compute_s += now_s() - t0;
            break;
        }
        case SCHED_SEND_ACT:
            word = 0;
            if (link->send(link->ctx, stage + 1, control_tag(k, false), &word, 1, err) ||
                link->send(link->ctx, stage + 1, tag_of(k, false),
                           model_stage_output(m, r.slot_of[k]), NC, err))
                goto out;
            times->send_s += now_s() - t0;
            break;
        case SCHED_RECV_GRAD:
            if (link->recv(link->ctx, stage + 1, control_tag(k, true), &word, 1, err) ||
                link->recv(link->ctx, stage + 1, tag_of(k, true), grad, NC, err))
                goto out;
            asked = asked || word != 0;
            times->idle_s += now_s() - t0;
            break;
        case SCHED_B: {
            if (r.slot_of[k] < 0) {
                error_set(err, "pipeline: backward of micro-batch %d before its forward", k);
                goto out;
            }
            bool acc = !how->overwrite_each && (how->accumulate || backwards > 0);
            if (++backwards == s->m && !s->split_backward) /* the step's last: final */
                hook(m, how);
            int failed = s->split_backward
                             ? model_stage_backward_input(m, r.slot_of[k], grad, B, T, acc, err)
                             : model_stage_backward(m, r.slot_of[k], grad, B, T, acc, err);
            m->grads_final = NULL;
            if (failed) goto out;
            times->compute_s += now_s() - t0;
            if (!s->split_backward && !sends_grad && micro_done(&r, how, k, done, err)) goto out;
            break;
        }
        case SCHED_W: {
            if (!s->split_backward || r.slot_of[k] < 0) {
                error_set(err, "pipeline: a weight-gradient operation for micro-batch %d %s", k,
                          s->split_backward ? "before its forward" : "in a combined schedule");
                goto out;
            }
            bool acc = !how->overwrite_each && (how->accumulate || weights > 0);
            if (++weights == s->m) hook(m, how);
            int failed = model_stage_backward_weights(m, r.slot_of[k], B, T, acc, err);
            m->grads_final = NULL;
            if (failed) goto out;
            times->compute_s += now_s() - t0;
            if (micro_done(&r, how, k, done, err)) goto out;
            break;
        }
        case SCHED_SEND_GRAD:
            word = asked || (how->wants_stop && how->wants_stop(how->ctx)) ? 1 : 0;
            if (link->send(link->ctx, stage - 1, control_tag(k, true), &word, 1, err) ||
                link->send(link->ctx, stage - 1, tag_of(k, true), model_stage_input_grad(m), NC,
                           err))
                goto out;
            times->send_s += now_s() - t0;
            if (!s->split_backward && micro_done(&r, how, k, done, err)) goto out;
            break;
        }
    }
    rc = 0;
out:
    free(r.slot_of);
    free(r.busy);
    free(tokens);
    free(targets);
    free(grad);
    return rc;
}
