/* pipeline.c — running one stage's schedule for one step: micro-batches into
 * slots as they arrive, forwards and backwards through the model, transfers
 * through the link, and the time each kind of operation took. Which list to
 * run is common/place/schedule.c's; moving bytes is the link's. */
#include "runtime/pipeline.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/lanes.h"

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

/* The stage and chunk next to chunk c of `stage` in the virtual pipeline,
 * `by` virtual stages away (+1 downstream, -1 upstream): interleaved, chunk c
 * of stage pp-1 feeds chunk c+1 of stage 0; in DualPipeV's V the last stage's
 * chunk 0 feeds its own chunk 1 (the turn: no link, a copy). */
static int neighbour(const struct schedule *s, int stage, int c, int by, int *chunk)
{
    int to;
    schedule_stage_of(s, schedule_virtual_stage(s, stage, c) + by, &to, chunk);
    return to;
}

/* A stop mid-step. The first stage decides: before each micro-batch k > 0
 * enters (its F of chunk 0), every first-stage rank (tp × dp) calls
 * agree_stop at that same place of its list, so all of them agree on the same
 * k (schedule_may_stop: interleaved, a multiple of pp). On a stop at k, a stage runs nothing more of
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

/* One step of one stage: what its operations share. */
struct stepper {
    struct model *m;
    const struct schedule *s;
    int stage;
    const struct pipe_link *link;
    const struct pipe_feed *feed;
    const struct pipe_step *how;
    double *loss_sum;
    int *done;
    struct pipe_times *times;
    struct run r;
    int32_t *tokens, *targets;      /* (B·T) */
    int32_t *v_targets;             /* (m, B·T) DualPipeV's first stage, which embeds a
                                       micro-batch in chunk 0 and takes its loss in chunk 1:
                                       the targets read with its tokens, kept until then */
    float *grad;                    /* the next stage's input gradient, in the model's buffer */
    size_t NC;                      /* floats that cross a stage */
    int backwards[64], weights[64]; /* gradient passes so far, per chunk */
    bool *quiet;  /* [m + 1] where the gradients are handed over: after micro-batches 0..n-1
                     (schedule_quiescent with hand_over; else the step's end) */
    int handed;   /* the micro-batches handed over so far */
    int stop_at;                    /* the micro-batch the pipeline stops before */
    int turn_grad;                  /* DualPipeV's last stage: the micro-batch whose gradient
                                       its chunk 1 left in grad for its chunk 0, or -1 */
    float word;                     /* a control word */
    bool asked;                     /* a later stage asked to stop */
};

/* The last gradient pass of chunk c before a hand-over (the step's end,
 * or with hand_over a quiescent point; a weight-gradient pass when split)
 * makes that chunk's gradients final: the model calls how's hook as its
 * layers complete. The hook takes everything above a layer as final, so it
 * is set only when the chunks above (later in the buffer) are done too; when
 * a schedule finished a lower chunk first, that chunk's gradients wait for
 * the hand-over (buckets_finish). counts[c]: the chunk's passes of this kind
 * so far, counting this one. */
static void hook(struct stepper *st, const int *counts, int c)
{
    int n = counts[c];
    if (!st->quiet[n]) return;
    for (int above = c + 1; above < st->s->v; above++)
        if (counts[above] != n) return;
    st->m->grads_final = st->how->grads_final;
    st->m->grads_final_ctx = st->how->grads_ctx;
    if (st->how->grads_at_end) *st->how->grads_at_end = n == st->s->m;
}

/* Whether a gradient pass of chunk c adds to the buffer (passes of its kind
 * on the chunk since the last hand-over, or a resumed step's), counted[c]
 * before this one. */
static bool adds(const struct stepper *st, const int *counted, int c)
{
    return (st->how->accumulate && st->handed == 0) || counted[c] > st->handed;
}

/* Micro-batch k's gradients through chunk c are in (and its input gradient
 * has gone upstream): its slot is free. After chunk 0 (its last backward on
 * this stage) the caller's after_backward runs, then the hand-over where the
 * buffer is quiescent. 0, or -1 with err. */
static int micro_done(struct stepper *st, int k, int c, struct plait_error *err)
{
    const struct pipe_step *how = st->how;
    give_slot(&st->r, k, c);
    if (c != 0) return 0;
    *st->done = k + 1;
    if (how->after_backward && how->after_backward(how->ctx, k, err)) return -1;
    if (!how->hand_over || !st->quiet[k + 1]) return 0;
    st->handed = k + 1;
    return how->hand_over(how->ctx, k + 1, err);
}

/* Receives micro-batch k's activation for chunk c, or a stop at k (passed on
 * down at once: no activation follows it). */
static int op_recv_act(struct stepper *st, int k, int c, double t0, struct plait_error *err)
{
    const struct schedule *s = st->s;
    const struct pipe_link *link = st->link;
    int slot, from_chunk, from = neighbour(s, st->stage, c, -1, &from_chunk);
    if (from == st->stage) { /* the V's turn: chunk 0's output, still in its slot */
        int src = slot_of(&st->r, k, from_chunk);
        if (src < 0 || (slot = take_slot(&st->r, k, c, err)) < 0)
            return src < 0 ? error_set(err, "pipeline: micro-batch %d turns before its forward", k)
                           : -1;
        st->m->ops->copy(st->m->ctx, model_stage_input(st->m, slot),
                         model_stage_output(st->m, src), st->NC * sizeof(float));
        return 0;
    }
    if (link->recv(link->ctx, from, control_tag(s, k, c, false), &st->word, 1, err)) return -1;
    if (st->word != 0) {
        st->stop_at = k;
        if (st->stage + 1 < s->pp &&
            link->send(link->ctx, st->stage + 1, control_tag(s, k, c, false), &st->word, 1, true,
                       err))
            return -1;
    } else if ((slot = take_slot(&st->r, k, c, err)) < 0 ||
               link->recv(link->ctx, from, tag_of(s, k, c, false), model_stage_input(st->m, slot),
                          st->NC, err)) {
        return -1;
    }
    st->times->idle_s += now_s() - t0;
    return 0;
}

/* The first stage asks its peers whether to stop before micro-batch k enters
 * (interleaved: only where the rest of the step is a multiple of pp
 * micro-batches, as its schedule needs to resume it); *stopped when they
 * agreed to, the stop sent down. */
static int agree_stop(struct stepper *st, int k, bool *stopped, struct plait_error *err)
{
    const struct schedule *s = st->s;
    int stop = st->asked;
    *stopped = false;
    if (st->how->agree_stop(st->how->ctx, &stop, err)) return -1;
    if (!stop) return 0;
    *stopped = true;
    st->stop_at = k;
    st->word = 1;
    return s->pp > 1 &&
           st->link->send(st->link->ctx, 1, control_tag(s, k, 0, false), &st->word, 1, true, err);
}

/* Micro-batch k's forward through chunk c (its tokens where it embeds or
 * heads), its loss added where it heads. */
static int op_forward(struct stepper *st, int k, int c, double t0, struct plait_error *err)
{
    const struct schedule *s = st->s;
    const struct pipe_step *how = st->how;
    struct model *m = st->m;
    bool embeds = m->first && c == 0, heads = m->last && c == s->v - 1;
    if (st->stage == 0 && c == 0 && how->agree_stop && schedule_may_stop(s, k)) {
        bool stopped;
        if (agree_stop(st, k, &stopped, err)) return -1;
        if (stopped) return 0;
        t0 = now_s(); /* its wait is its communicators' (tp, dp), not this stage's */
    }
    int slot = take_slot(&st->r, k, c, err);
    if (slot < 0) return -1;
    size_t N = (size_t)how->B * how->T;
    if (st->v_targets && heads) { /* read with its tokens at chunk 0 */
        memcpy(st->targets, st->v_targets + (size_t)k * N, N * sizeof *st->targets);
    } else if (embeds || heads) {
        if (st->feed->next(st->feed->ctx, k, st->tokens, st->targets, err)) return -1;
        if (st->v_targets)
            memcpy(st->v_targets + (size_t)k * N, st->targets, N * sizeof *st->targets);
        double t1 = now_s();
        st->times->data_s += t1 - t0;
        t0 = t1;
    }
    double loss = 0;
    if (model_stage_forward(m, slot, st->tokens, st->targets, how->B, how->T, how->grad_scale,
                            &loss, err))
        return -1;
    if (heads && st->loss_sum) *st->loss_sum += loss;
    st->times->compute_s += now_s() - t0;
    return 0;
}

/* Micro-batch k's activation to the next chunk: the same on the next stage,
 * or c + 1 from the last stage */
static int op_send_act(struct stepper *st, int k, int c, double t0, struct plait_error *err)
{
    const struct schedule *s = st->s;
    const struct pipe_link *link = st->link;
    int to, peer = neighbour(s, st->stage, c, +1, &to), slot = slot_of(&st->r, k, c);
    if (slot < 0)
        return error_set(err, "pipeline: sending micro-batch %d's activation before its forward",
                         k);
    if (peer == st->stage) return 0; /* the V's turn: chunk 1 copies it from the slot */
    st->word = 0;
    if (link->send(link->ctx, peer, control_tag(s, k, to, false), &st->word, 1, true, err) ||
        link->send(link->ctx, peer, tag_of(s, k, to, false), model_stage_output(st->m, slot),
                   st->NC, false, err))
        return -1;
    st->times->send_s += now_s() - t0;
    return 0;
}

/* The next stage's input gradient of micro-batch k, chunk c, and its wish to stop */
static int op_recv_grad(struct stepper *st, int k, int c, double t0, struct plait_error *err)
{
    const struct schedule *s = st->s;
    const struct pipe_link *link = st->link;
    int from_chunk, from = neighbour(s, st->stage, c, +1, &from_chunk);
    if (!st->grad)
        return error_set(err, "pipeline: stage %d has no buffer for the gradient it receives",
                         st->stage);
    if (from == st->stage || st->turn_grad >= 0) { /* the V's turn: left in grad by chunk 1 */
        if (from != st->stage || st->turn_grad != k)
            return error_set(err,
                             "pipeline: stage %d receives micro-batch %d's gradient while its "
                             "turn holds micro-batch %d's",
                             st->stage, k, st->turn_grad);
        st->turn_grad = -1;
        return 0;
    }
    if (link->recv(link->ctx, from, control_tag(s, k, c, true), &st->word, 1, err) ||
        link->recv(link->ctx, from, tag_of(s, k, c, true), st->grad, st->NC, err))
        return -1;
    st->asked = st->asked || st->word != 0;
    st->times->idle_s += now_s() - t0;
    return 0;
}

/* Micro-batch k's backward through chunk c (its input gradient alone when
 * the schedule splits the backward). A backward's input gradient goes
 * upstream before after_backward runs: a collective in it (ZeRO 2's tied sum
 * with the first stage) must not hold back the gradient the first stage
 * waits for, so a stage that sends one is done at its send. */
static int op_backward(struct stepper *st, int k, int c, double t0, struct plait_error *err)
{
    const struct schedule *s = st->s;
    const struct pipe_step *how = st->how;
    struct model *m = st->m;
    int slot = slot_of(&st->r, k, c);
    if (slot < 0)
        return error_set(err, "pipeline: backward of micro-batch %d, chunk %d before its forward",
                         k, c);
    bool acc = adds(st, st->backwards, c);
    st->backwards[c]++;
    if (!s->split_backward) hook(st, st->backwards, c);
    int failed = s->split_backward
                     ? model_stage_backward_input(m, slot, st->grad, how->B, how->T, acc, err)
                     : model_stage_backward(m, slot, st->grad, how->B, how->T, acc, err);
    m->grads_final = NULL;
    if (failed) return -1;
    st->times->compute_s += now_s() - t0;
    bool sends_grad = schedule_virtual_stage(s, st->stage, c) > 0;
    if (!s->split_backward && !sends_grad) return micro_done(st, k, c, err);
    return 0;
}

/* Micro-batch k's weight-gradient pass through chunk c (split backward) */
static int op_weights(struct stepper *st, int k, int c, double t0, struct plait_error *err)
{
    const struct pipe_step *how = st->how;
    int slot = slot_of(&st->r, k, c);
    if (!st->s->split_backward || slot < 0)
        return error_set(err, "pipeline: a weight-gradient operation for micro-batch %d %s", k,
                         st->s->split_backward ? "before its forward" : "in a combined schedule");
    bool acc = adds(st, st->weights, c);
    st->weights[c]++;
    hook(st, st->weights, c);
    int failed = model_stage_backward_weights(st->m, slot, how->B, how->T, acc, err);
    st->m->grads_final = NULL;
    if (failed) return -1;
    st->times->compute_s += now_s() - t0;
    return micro_done(st, k, c, err);
}

/* Micro-batch k's input gradient to the previous chunk: the same, or c - 1
 * on stage pp-1; its control word carries this stage's wish to stop */
static int op_send_grad(struct stepper *st, int k, int c, double t0, struct plait_error *err)
{
    const struct schedule *s = st->s;
    const struct pipe_step *how = st->how;
    const struct pipe_link *link = st->link;
    int to, peer = neighbour(s, st->stage, c, -1, &to);
    if (peer == st->stage) { /* the V's turn: into the buffer chunk 0's backward reads */
        if (st->turn_grad >= 0)
            return error_set(err, "pipeline: stage %d's turn holds micro-batch %d's gradient",
                             st->stage, st->turn_grad);
        st->m->ops->copy(st->m->ctx, st->grad, model_stage_input_grad(st->m),
                         st->NC * sizeof(float));
        st->turn_grad = k;
        st->times->send_s += now_s() - t0;
        return s->split_backward ? 0 : micro_done(st, k, c, err);
    }
    st->word = st->asked || (how->wants_stop && how->wants_stop(how->ctx)) ? 1 : 0;
    if (link->send(link->ctx, peer, control_tag(s, k, to, true), &st->word, 1, true, err) ||
        link->send(link->ctx, peer, tag_of(s, k, to, true), model_stage_input_grad(st->m), st->NC,
                   false, err))
        return -1;
    st->times->send_s += now_s() - t0;
    if (!s->split_backward) return micro_done(st, k, c, err);
    return 0;
}

/* Whether this model can run this schedule */
static int check_fits(const struct model *m, const struct schedule *s, int stage,
                      struct plait_error *err)
{
    if (s->v != m->chunks || s->v > 64)
        return error_set(err,
                         "pipeline: the %s schedule runs %d model chunks a stage, the model "
                         "has %d",
                         schedule_kind_name(s->kind), s->v, m->chunks);
    if (s->split_backward && !m->split_backward)
        return error_set(err, "pipeline: the %s schedule needs a model built for a split backward",
                         schedule_kind_name(s->kind));
    if (schedule_max_in_flight(s, stage) > m->n_slots)
        return error_set(err,
                         "pipeline: stage %d holds up to %d micro-batches, the model has %d "
                         "slots",
                         stage, schedule_max_in_flight(s, stage), m->n_slots);
    return 0;
}

static int run_op(struct stepper *st, struct sched_op op, struct plait_error *err)
{
    double t0 = now_s();
    switch (op.type) {
    case SCHED_RECV_ACT:
        return op_recv_act(st, op.micro, op.chunk, t0, err);
    case SCHED_F:
        return op_forward(st, op.micro, op.chunk, t0, err);
    case SCHED_SEND_ACT:
        return op_send_act(st, op.micro, op.chunk, t0, err);
    case SCHED_RECV_GRAD:
        return op_recv_grad(st, op.micro, op.chunk, t0, err);
    case SCHED_B:
        return op_backward(st, op.micro, op.chunk, t0, err);
    case SCHED_W:
        return op_weights(st, op.micro, op.chunk, t0, err);
    case SCHED_SEND_GRAD:
        return op_send_grad(st, op.micro, op.chunk, t0, err);
    }
    return 0;
}

/* DualPipeV's pairs in two lanes (m->lanes, runtime/lanes.h): where ops[i] is a forward
 * of micro-batch k through one chunk and the next computation a backward of micro-batch j
 * through the other, with nothing between but k's activation sent on and j's gradient
 * received, the index of that backward; else -1. */
static int pair_at(const struct stepper *st, const struct sched_op *ops, int n, int i)
{
    const struct sched_op *f = &ops[i];
    if (!st->m->lanes || f->type != SCHED_F) return -1;
    int b = i + 1;
    while (b < n && (ops[b].type == SCHED_SEND_ACT || ops[b].type == SCHED_RECV_GRAD)) b++;
    if (b == n || ops[b].type != SCHED_B || ops[b].chunk == f->chunk || ops[b].micro >= st->stop_at)
        return -1;
    for (int j = i + 1; j < b; j++) {
        const struct sched_op *x = ops[j].type == SCHED_SEND_ACT ? f : &ops[b];
        if (ops[j].micro != x->micro || ops[j].chunk != x->chunk) return -1;
    }
    return b;
}

struct lane_op {
    struct stepper *st;
    struct sched_op op;
};

static int lane_op_run(void *ctx, struct plait_error *err)
{
    struct lane_op *x = ctx;
    return run_op(x->st, x->op, err);
}

/* The pair ops[i] (forward) and ops[b] (backward), its transfers around it: the gradient
 * received before the two lanes start and the activation sent after they end. A later
 * receive from one neighbour and an earlier send to the other keep the list deadlock-free:
 * the two chunks' passes face opposite neighbours, and a neighbour's messages to this stage
 * never wait on what it has not yet received from here. */
static int run_pair(struct stepper *st, const struct sched_op *ops, int i, int b,
                    struct plait_error *err)
{
    for (int j = i + 1; j < b; j++)
        if (ops[j].type == SCHED_RECV_GRAD && run_op(st, ops[j], err)) return -1;
    struct pipe_times *tm = st->times;
    double t0 = now_s(), compute0 = tm->compute_s, data0 = tm->data_s;
    struct lane_op f = {st, ops[i]}, bw = {st, ops[b]};
    const lane_pass pass[2] = {lane_op_run, lane_op_run};
    void *const ctx[2] = {&f, &bw};
    if (lanes_run(st->m->lanes, pass, ctx, err)) return -1;
    /* each lane timed itself, the other's turns included: the pair took its wall time */
    tm->compute_s = compute0 + (now_s() - t0) - (tm->data_s - data0);
    for (int j = i + 1; j < b; j++)
        if (ops[j].type == SCHED_SEND_ACT && run_op(st, ops[j], err)) return -1;
    return 0;
}

int pipeline_step(struct model *m, const struct schedule *s, int stage,
                  const struct pipe_link *link, const struct pipe_feed *feed,
                  const struct pipe_step *how, double *loss_sum, int *done,
                  struct pipe_times *times, struct plait_error *err)
{
    if (check_fits(m, s, stage, err)) return -1;
    size_t N = (size_t)how->B * how->T;
    struct stepper st = {.m = m,
                         .s = s,
                         .stage = stage,
                         .link = link,
                         .feed = feed,
                         .how = how,
                         .loss_sum = loss_sum,
                         .done = done,
                         .times = times,
                         .r = {m, s->v, malloc((size_t)s->m * (size_t)s->v * sizeof(int)),
                               calloc((size_t)m->n_slots, 1)},
                         .tokens = malloc(N * sizeof(int32_t)),
                         .targets = malloc(N * sizeof(int32_t)),
                         .grad = m->grad_in,
                         .NC = model_stage_floats(m, how->B, how->T),
                         .quiet = calloc((size_t)s->m + 1, sizeof(bool)),
                         .stop_at = s->m,
                         .turn_grad = -1,
                         .v_targets = m->first && m->last && s->v > 1
                                          ? malloc((size_t)s->m * N * sizeof(int32_t))
                                          : NULL};
    int rc = -1;
    memset(times, 0, sizeof *times);
    if (loss_sum) *loss_sum = 0;
    *done = 0;
    if (!st.r.slot_of || !st.r.busy || !st.tokens || !st.targets || !st.quiet ||
        (m->first && m->last && s->v > 1 && !st.v_targets)) {
        error_set(err, "out of memory");
        goto out;
    }
    if (how->hand_over)
        schedule_quiescent(s, stage, st.quiet);
    else
        st.quiet[s->m] = true;
    for (int k = 0; k < s->m * s->v; k++) st.r.slot_of[k] = -1;
    for (int i = 0, b; i < s->n_ops[stage]; i++) {
        if (s->ops[stage][i].micro >= st.stop_at) continue; /* past stop_at: draining */
        if ((b = pair_at(&st, s->ops[stage], s->n_ops[stage], i)) >= 0) {
            if (run_pair(&st, s->ops[stage], i, b, err)) goto out;
            i = b;
        } else if (run_op(&st, s->ops[stage][i], err)) {
            goto out;
        }
    }
    /* drained at a stop: schedule_may_stop's are quiescent, so this is for safety only */
    if (how->hand_over && st.handed < *done && how->hand_over(how->ctx, *done, err)) goto out;
    if (link->flush && link->flush(link->ctx, err)) goto out;
    rc = 0;
out:
    free(st.r.slot_of);
    free(st.r.busy);
    free(st.tokens);
    free(st.targets);
    free(st.v_targets);
    free(st.quiet);
    return rc;
}
