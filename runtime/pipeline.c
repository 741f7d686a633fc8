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
 * its layers complete. The hook takes everything above a layer as final, so
 * it is set only when the chunks above (later in the buffer) are done too;
 * when a schedule finished a lower chunk first, that chunk's gradients wait
 * for the end of the step (buckets_finish). finished[c]: the chunk's
 * gradient passes so far, counting this one. */
static void hook(struct model *m, const struct schedule *s, const int *finished, int c,
                 const struct pipe_step *how)
{
    for (int above = c; above < s->v; above++)
        if (finished[above] != s->m) return;
    m->grads_final = how->grads_final;
    m->grads_final_ctx = how->grads_ctx;
}

/* Micro-batch k's gradients through chunk c are in: its slot is free. After
 * chunk 0 (its last backward on this stage) the caller's after_backward
 * runs. 1 to go on, 0 when it stopped the step (pp = 1), -1. */
static int micro_done(struct run *r, const struct schedule *s, const struct pipe_step *how, int k,
                      int c, int *done, struct plait_error *err)
{
    give_slot(r, k, c);
    if (c != 0) return 1;
    *done = k + 1;
    if (!how->after_backward) return 1;
    int stop = how->after_backward(how->ctx, k, err);
    if (stop < 0) return -1;
    return stop > 0 && s->pp == 1 ? 0 : 1;
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
    float *grad = malloc(NC * sizeof *grad);
    int rc = -1, go, backwards[64] = {0}, weights[64] = {0}; /* per chunk */
    memset(times, 0, sizeof *times);
    if (loss_sum) *loss_sum = 0;
    *done = 0;
    if (!r.slot_of || !r.busy || !tokens || !targets || !grad) {
        error_set(err, "out of memory");
        goto out;
    }
    for (int k = 0; k < s->m * s->v; k++) r.slot_of[k] = -1;
    for (int i = 0; i < s->n_ops[stage]; i++) {
        struct sched_op op = s->ops[stage][i];
        int k = op.micro, c = op.chunk, slot;
        bool embeds = m->first && c == 0, heads = m->last && c == s->v - 1;
        double t0 = now_s();
        switch (op.type) {
        case SCHED_RECV_ACT:
            if ((slot = take_slot(&r, k, c, err)) < 0 ||
                link->recv(link->ctx, prev_stage(s, stage), tag_of(s, k, c, false),
                           model_stage_input(m, slot), NC, err))
                goto out;
            times->idle_s += now_s() - t0;
            break;
        case SCHED_F: {
            double loss = 0;
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
            if (link->send(link->ctx, next_stage(s, stage),
                           tag_of(s, k, stage == s->pp - 1 ? c + 1 : c, false),
                           model_stage_output(m, slot_of(&r, k, c)), NC, err))
                goto out;
            times->send_s += now_s() - t0;
            break;
        case SCHED_RECV_GRAD:
            if (link->recv(link->ctx, next_stage(s, stage), tag_of(s, k, c, true), grad, NC, err))
                goto out;
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
            if (!s->split_backward && (go = micro_done(&r, s, how, k, c, done, err)) != 1) {
                rc = go;
                goto out;
            }
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
            if ((go = micro_done(&r, s, how, k, c, done, err)) != 1) {
                rc = go;
                goto out;
            }
            break;
        }
        case SCHED_SEND_GRAD: /* to the previous chunk: the same, or c - 1 on stage pp-1 */
            if (link->send(link->ctx, prev_stage(s, stage),
                           tag_of(s, k, stage == 0 ? c - 1 : c, true), model_stage_input_grad(m),
                           NC, err))
                goto out;
            times->send_s += now_s() - t0;
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
