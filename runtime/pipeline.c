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

/* A micro-batch's activation and its gradient travel under different tags,
 * named by the chunk that receives them (v chunks a stage). */
static uint32_t tag_of(const struct schedule *s, int micro, int chunk, bool gradient)
{
    return 2u * ((uint32_t)micro * (uint32_t)s->v + (uint32_t)chunk) + (gradient ? 1u : 0u);
}

/* The neighbours in the virtual pipeline: chunk c of stage pp-1 feeds chunk
 * c+1 of stage 0, and gets its gradient back from there. */
static int next_stage(const struct schedule *s, int stage)
{
    return stage == s->pp - 1 ? 0 : stage + 1;
}

static int prev_stage(const struct schedule *s, int stage)
{
    return stage == 0 ? s->pp - 1 : stage - 1;
}

/* A stop mid-step. The first stage decides: before each micro-batch k > 0
 * enters (its F of chunk 0), every first-stage rank (tp × dp) calls
 * agree_stop at that same place of its list, so all of them agree on the same
 * k (interleaved: a k that is a multiple of pp). On a stop at k, a stage runs nothing more of
 * micro-batches >= k: it drains, running the rest of its list for micro-batches < k (forwards,
 * backwards, weight passes), and its gradients cover exactly 0..k-1. The
 * decision travels down in the control word that precedes every activation
 * on the link (0 go, 1 stop: no activation follows); a stage that reads a
 * stop at its receive of micro k (always chunk 0's: a micro-batch enters a
 * stage there first) forwards it at once and drains too. Dropping every
 * operation of micro-batches >= k from every stage's list keeps both ends of
 * each transfer or neither, so the shortened lists are deadlock-free as the
 * schedule is, and every wait keeps the link's deadline. The control word
 * before each gradient carries the sender's wish to stop upstream (its own
 * signal, or one from further down), so a signal to any rank reaches the
 * first stage, at the latest with the step's last gradients. */
static uint32_t control_tag(const struct schedule *s, int micro, int chunk, bool gradient)
{
    return 0x20000000u | tag_of(s, micro, chunk, gradient);
}

struct run {
    struct model *m;
    int v;        /* chunks */
    int *slot_of; /* [m·v] micro-batch k through chunk c (k·v + c) -> slot, -1 */
    bool *busy;   /* [n_slots] */
};

static int take_slot(struct run *r, int micro, int chunk, struct plait_error *err)
{
    int *at = &r->slot_of[micro * r->v + chunk];
    if (*at >= 0) return *at;
    for (int s = 0; s < r->m->n_slots; s++)
        if (!r->busy[s]) {
            r->busy[s] = true;
            r->m->slots[s].chunk = chunk;
            return *at = s;
        }
    return error_set(err,
                     "pipeline: no free activation slot for micro-batch %d, chunk %d (%d slots)",
                     micro, chunk, r->m->n_slots);
}

static int slot_of(const struct run *r, int micro, int chunk)
{
    return r->slot_of[micro * r->v + chunk];
}

static void give_slot(struct run *r, int micro, int chunk)
{
    int *at = &r->slot_of[micro * r->v + chunk];
    if (*at >= 0) r->busy[*at] = false;
    *at = -1;
}

/* The step's last backward of chunk c (its weight-gradient pass, when
 * split) makes that chunk's gradients final: the model calls how's hook as
 * its layers complete (with overwrite_each, every backward: each
 * micro-batch's gradients are handed over). The hook takes everything above a layer as final, so
 * it is set only when the chunks above (later in the buffer) are done too;
 * when a schedule finished a lower chunk first, that chunk's gradients wait
 * for the end of the step (buckets_finish). finished[c]: the chunk's
 * gradient passes so far, counting this one. */
static void hook(struct model *m, const struct schedule *s, const int *finished, int c,
                 const struct pipe_step *how)
{
    for (int above = c; above < s->v && !how->overwrite_each; above++)
        if (finished[above] != s->m) return;
    m->grads_final = how->grads_final;
    m->grads_final_ctx = how->grads_ctx;
}

/* Micro-batch k's gradients through chunk c are in (and its input gradient
 * has gone upstream): its slot is free. After chunk 0 (its last backward on
 * this stage) the caller's after_backward runs. 0, or -1 with err. */
static int micro_done(struct run *r, const struct pipe_step *how, int k, int c, int *done,
                      struct plait_error *err)
{
    give_slot(r, k, c);
    if (c != 0) return 0;
    *done = k + 1;
    return how->after_backward ? how->after_backward(how->ctx, k, err) : 0;
}

int pipeline_step(struct model *m, const struct schedule *s, int stage,
                  const struct pipe_link *link, const struct pipe_feed *feed,
                  const struct pipe_step *how, double *loss_sum, int *done,
                  struct pipe_times *times, struct plait_error *err)
{
    int B = how->B, T = how->T;
    if (s->v != m->chunks || s->v > 64)
        return error_set(err,
                         "pipeline: the %s schedule runs %d model chunks a stage, the model "
                         "has %d",
                         schedule_kind_name(s->kind), s->v, m->chunks);
    if (s->v > 1 && how->overwrite_each)
        return error_set(err, "pipeline: an interleaved schedule cannot hand over each "
                              "micro-batch's gradients (ZeRO 2): other micro-batches' backwards "
                              "run between a micro-batch's chunks");
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
    struct run r = {m, s->v, malloc((size_t)s->m * (size_t)s->v * sizeof(int)),
                    calloc((size_t)m->n_slots, 1)};
    int32_t *tokens = malloc(N * sizeof *tokens), *targets = malloc(N * sizeof *targets);
    /* the next stage's input gradient, received into the model's buffer */
    float *grad = m->grad_in;
    int rc = -1, backwards[64] = {0}, weights[64] = {0}; /* per chunk */
    int stop_at = s->m; /* the micro-batch the pipeline stops before */
    float word = 0;     /* a control word */
    bool asked = false; /* a later stage asked to stop */
    memset(times, 0, sizeof *times);
    if (loss_sum) *loss_sum = 0;
    *done = 0;
    if (!r.slot_of || !r.busy || !tokens || !targets) {
        error_set(err, "out of memory");
        goto out;
    }
    for (int k = 0; k < s->m * s->v; k++) r.slot_of[k] = -1;
    for (int i = 0; i < s->n_ops[stage]; i++) {
        struct sched_op op = s->ops[stage][i];
        int k = op.micro, c = op.chunk, slot;
        bool embeds = m->first && c == 0, heads = m->last && c == s->v - 1;
        double t0 = now_s();
        if (k >= stop_at) continue; /* draining */
        /* A backward's input gradient goes upstream before after_backward runs:
         * a collective in it (ZeRO 2's tied sum with the first stage) must not
         * hold back the gradient the first stage waits for. */
        bool sends_grad = c * s->pp + stage > 0;
        switch (op.type) {
        case SCHED_RECV_ACT:
            if (link->recv(link->ctx, prev_stage(s, stage), control_tag(s, k, c, false), &word, 1,
                           err))
                goto out;
            if (word != 0) { /* a stop at k: passed on down at once */
                stop_at = k;
                if (stage + 1 < s->pp &&
                    link->send(link->ctx, stage + 1, control_tag(s, k, c, false), &word, 1, true,
                               err))
                    goto out;
                times->idle_s += now_s() - t0;
                break;
            }
            if ((slot = take_slot(&r, k, c, err)) < 0 ||
                link->recv(link->ctx, prev_stage(s, stage), tag_of(s, k, c, false),
                           model_stage_input(m, slot), NC, err))
                goto out;
            times->idle_s += now_s() - t0;
            break;
        case SCHED_F: {
            double loss = 0;
            /* interleaved: only where the rest of the step is a multiple of pp
             * micro-batches, as its schedule needs to resume it */
            if (stage == 0 && c == 0 && k > 0 && how->agree_stop &&
                k % (s->v > 1 ? s->pp : 1) == 0) {
                int stop = asked;
                if (how->agree_stop(how->ctx, &stop, err)) goto out;
                if (stop) {
                    stop_at = k;
                    word = 1;
                    if (s->pp > 1 &&
                        link->send(link->ctx, 1, control_tag(s, k, 0, false), &word, 1, true, err))
                        goto out;
                    break;
                }
                t0 = now_s(); /* its wait is its communicators' (tp, dp), not this stage's */
            }
            if ((slot = take_slot(&r, k, c, err)) < 0) goto out;
            if (embeds || heads) {
                if (feed->next(feed->ctx, k, tokens, targets, err)) goto out;
                double t1 = now_s();
                times->data_s += t1 - t0;
                t0 = t1;
            }
            if (model_stage_forward(m, slot, tokens, targets, B, T, how->grad_scale, &loss, err))
                goto out;
            if (heads && loss_sum) *loss_sum += loss;
            times->compute_s += now_s() - t0;
            break;
        }
        case SCHED_SEND_ACT: /* to the next chunk: the same on the next stage, or c + 1 */
            if (slot_of(&r, k, c) < 0) {
                error_set(err, "pipeline: sending micro-batch %d's activation before its forward",
                          k);
                goto out;
            }
            word = 0;
            if (link->send(link->ctx, next_stage(s, stage),
                           control_tag(s, k, stage == s->pp - 1 ? c + 1 : c, false), &word, 1, true,
                           err) ||
                link->send(link->ctx, next_stage(s, stage),
                           tag_of(s, k, stage == s->pp - 1 ? c + 1 : c, false),
                           model_stage_output(m, slot_of(&r, k, c)), NC, false, err))
                goto out;
            times->send_s += now_s() - t0;
            break;
        case SCHED_RECV_GRAD:
            if (!grad) {
                error_set(err, "pipeline: stage %d has no buffer for the gradient it receives",
                          stage);
                goto out;
            }
            if (link->recv(link->ctx, next_stage(s, stage), control_tag(s, k, c, true), &word, 1,
                           err) ||
                link->recv(link->ctx, next_stage(s, stage), tag_of(s, k, c, true), grad, NC, err))
                goto out;
            asked = asked || word != 0;
            times->idle_s += now_s() - t0;
            break;
        case SCHED_B: {
            if ((slot = slot_of(&r, k, c)) < 0) {
                error_set(err, "pipeline: backward of micro-batch %d, chunk %d before its forward",
                          k, c);
                goto out;
            }
            bool acc = !how->overwrite_each && (how->accumulate || backwards[c] > 0);
            backwards[c]++;
            if (!s->split_backward) hook(m, s, backwards, c, how);
            int failed = s->split_backward
                             ? model_stage_backward_input(m, slot, grad, B, T, acc, err)
                             : model_stage_backward(m, slot, grad, B, T, acc, err);
            m->grads_final = NULL;
            if (failed) goto out;
            times->compute_s += now_s() - t0;
            if (!s->split_backward && !sends_grad && micro_done(&r, how, k, c, done, err)) goto out;
            break;
        }
        case SCHED_W: {
            if (!s->split_backward || (slot = slot_of(&r, k, c)) < 0) {
                error_set(err, "pipeline: a weight-gradient operation for micro-batch %d %s", k,
                          s->split_backward ? "before its forward" : "in a combined schedule");
                goto out;
            }
            bool acc = !how->overwrite_each && (how->accumulate || weights[c] > 0);
            weights[c]++;
            hook(m, s, weights, c, how);
            int failed = model_stage_backward_weights(m, slot, B, T, acc, err);
            m->grads_final = NULL;
            if (failed) goto out;
            times->compute_s += now_s() - t0;
            if (micro_done(&r, how, k, c, done, err)) goto out;
            break;
        }
        case SCHED_SEND_GRAD: /* to the previous chunk: the same, or c - 1 on stage pp-1 */
            word = asked || (how->wants_stop && how->wants_stop(how->ctx)) ? 1 : 0;
            if (link->send(link->ctx, prev_stage(s, stage),
                           control_tag(s, k, stage == 0 ? c - 1 : c, true), &word, 1, true, err) ||
                link->send(link->ctx, prev_stage(s, stage),
                           tag_of(s, k, stage == 0 ? c - 1 : c, true), model_stage_input_grad(m),
                           NC, false, err))
                goto out;
            times->send_s += now_s() - t0;
            if (!s->split_backward && micro_done(&r, how, k, c, done, err)) goto out;
            break;
        }
    }
    if (link->flush && link->flush(link->ctx, err)) goto out;
    rc = 0;
out:
    free(r.slot_of);
    free(r.busy);
    free(tokens);
    free(targets);
    return rc;
}
