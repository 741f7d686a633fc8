/* train_batches.c — a training step's micro-batches: this rank's share of the
 * data fed to the pipeline executor (pipeline.c), what follows each backward
 * (ZeRO 2's reduction, the buckets), the stops agreed between micro-batches,
 * the gradient sums the pipeline's ends share; and the forward-only passes
 * through the stages (evaluation, PLAIT_DUMP_STEP1). The optimizer step and
 * the loop are train.c's. */
#include "runtime/train_batches.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <time.h>

#include "common/place/rank_order.h" // defines: rank_data_of
#include "runtime/dump.h"
#include "runtime/host_step.h"         // defines: host_step_expect and its hooks
#include "common/formats/ckpt_state.h" // defines: MOE_STATS
#include "runtime/model_moe.h"         // defines: model_moe_take_loss
#include "runtime/model_zero3.h"
#include "runtime/optim.h"
#include "runtime/report.h"
#include "runtime/ring_attention.h" // defines: ring_chunks
#include "runtime/train.h" // defines: train_stop_signal
#include "runtime/train_save.h"

/* One micro-batch forward only, through the pipeline's virtual stages in
 * turn (each stage's chunks in order; the schedule says which virtual stage
 * each is), in slot 0 under its own tag (tag + c·2^24 into chunk c): the
 * first virtual stage embeds tokens, the last keeps the logits and, with
 * targets, puts the mean loss in *loss. DualPipeV's turn (the last stage's
 * chunk 0 into its own chunk 1) is a copy within the slot. */
static int forward_through_stages(struct trainer *t, uint32_t tag, const int32_t *tokens,
                                  const int32_t *targets, double *loss, struct plait_error *err)
{
    const struct plan *p = t->plan;
    const struct schedule *sc = &t->sched;
    int B = p->batch.micro_batch, T = t->T, s = t->where->pp_rank;
    int V = t->where->pp * t->m.chunks, peer, pc;
    size_t NC = model_stage_floats(&t->m, B, T); /* this rank's rows, sequence parallel */
    struct pipe_link link = parallel_pipe_link(&t->par);
    for (int c = 0; c < t->m.chunks; c++) {
        int j = schedule_virtual_stage(sc, s, c); /* c without a pipeline */
        t->m.slots[0].chunk = c;
        if (j > 0 && (schedule_stage_of(sc, j - 1, &peer, &pc), peer == s))
            t->m.ops->copy(t->m.ctx, model_stage_input(&t->m, 0), model_stage_output(&t->m, 0),
                           NC * sizeof(float));
        else if (j > 0 && link.recv(link.ctx, peer, tag + ((uint32_t)c << 24),
                                    model_stage_input(&t->m, 0), NC, err))
            return -1;
        if (model_stage_forward(&t->m, 0, tokens, targets, B, T, 0.0f, loss, err)) return -1;
        if (j < V - 1 && (schedule_stage_of(sc, j + 1, &peer, &pc), peer != s) &&
            link.send(link.ctx, peer, tag + ((uint32_t)pc << 24), model_stage_output(&t->m, 0),
                      NC, false, err))
            return -1;
    }
    t->m.slots[0].chunk = 0;
    return link.flush ? link.flush(link.ctx, err) : 0;
}

/* The next micro-batch of d: this data-parallel rank's of the training data
 * (shared: every rank's turn), or the next of the validation data; with
 * context parallelism this cp rank's chunks of its sequences. */
static int read_chunks(struct trainer *t, struct data_loader *d, bool shared, int32_t *tokens,
                       int32_t *targets, struct plait_error *err)
{
    const struct env_rank *w = t->where;
    int cp = w->cp, B = t->plan->batch.micro_batch;
    int32_t *in = cp > 1 ? t->whole_tokens : tokens, *out = cp > 1 ? t->whole_targets : targets;
    if (shared ? data_next_of(d, rank_data_of(w->dp_rank, cp), w->dp / cp, in, out, err)
               : data_next(d, in, out, err))
        return -1;
    if (cp > 1) {
        ring_chunks(tokens, in, B, t->T, cp, w->cp_rank);
        ring_chunks(targets, out, B, t->T, cp, w->cp_rank);
    }
    return 0;
}

/* Mean loss over val_batches micro-batches from the start of the validation
 * data. Returns 1 when interrupted by a stop request, 0 when done. */
static int evaluate_batches(struct trainer *t, struct plait_error *err)
{
    const struct plan *p = t->plan;
    double sum = 0;
    if (t->reads_data) data_rewind(&t->val);
    for (int i = 0; i < p->data.val_batches; i++) {
        /* one rank stops the evaluation alone; a job evaluates to the end */
        if (train_stop_signal && !t->multi) return 1;
        double loss = 0;
        if (t->reads_data && read_chunks(t, &t->val, false, t->inputs, t->targets, err)) {
            t->data_failed = true;
            return error_prefix(err, "data.val: ");
        }
        if (forward_through_stages(t, 0x40000000u + (uint32_t)i, t->inputs, t->targets, &loss, err))
            return -1;
        sum += loss;
    }
    if (t->multi) { /* the last stage's, to everyone (tp ranks agree; one counts; with
                       context parallelism the mean of the cp ranks' means) */
        int cp = t->where->cp;
        double v = t->m.last && t->where->tp_rank == 0 && t->where->dp_rank < cp ? sum / cp : 0;
        if (t->par.g_world.allreduce_f64(t->par.g_world.ctx, &v, 1, err)) return -1;
        sum = v;
    }
    double val = sum / p->data.val_batches;
    return t->where->rank == 0 ? report_eval(t, val, err) : 0;
}

/* Evaluation's forward passes are not training time: kept out of the profile. */
int train_evaluate(struct trainer *t, struct plait_error *err)
{
    t->m.prof.paused++;
    int rc = evaluate_batches(t, err);
    t->m.prof.paused--;
    return rc;
}

int train_dump_step1(struct trainer *t, struct plait_error *err)
{
    const struct plan *p = t->plan;
    int B = p->batch.micro_batch, T = t->T;
    t->m.prof.paused++;
    if (t->m.last && !dump_logits_buffer(&t->m, B, T)) return error_set(err, "out of memory");
    int rc = forward_through_stages(t, 0x50000000u, t->dump_tokens, NULL, NULL, err) ||
                     dump_logits(&t->m, t->dump_dir, B, T, err) ||
                     dump_grads(&t->m, &t->par.g_world, t->dump_dir, err)
                 ? -1
                 : 0;
    t->m.prof.paused--;
    return rc;
}

/* The feed of the step's micro-batches: this rank's share of the data (the
 * developer's dump of step 1 keeps its first micro-batch's tokens). */
struct step_feed {
    struct trainer *t;
    int step;
    bool slice_holds; /* ZeRO 2: the slice holds this step's earlier micro-batches */
};

static int feed_next(void *ctx, int micro, int32_t *tokens, int32_t *targets,
                     struct plait_error *err)
{
    struct step_feed *f = ctx;
    struct trainer *t = f->t;
    const struct plan *p = t->plan;
    int rc;
    PROF(&t->m.prof, PROF_DATA, rc = read_chunks(t, &t->train, true, tokens, targets, err));
    if (rc) {
        t->data_failed = true;
        return error_prefix(err, "data.train: ");
    }
    if (t->slow_read_s > 0) {
        struct timespec ts = {(time_t)t->slow_read_s,
                              (long)(1e9 * (t->slow_read_s - (time_t)t->slow_read_s))};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
    }
    if (t->dump_dir && f->step == t->dump_step && micro == 0 && t->st.micro == 0)
        memcpy(t->dump_tokens, tokens, (size_t)p->batch.micro_batch * t->T * sizeof *tokens);
    return 0;
}

/* Whether this rank holds one end of a tied pipeline whose other end is
 * another stage's: not with both on one stage (no pipeline, or DualPipeV's V,
 * whose first stage embeds and computes the loss). */
static bool holds_one_tied_end(const struct model *m)
{
    return (m->first || m->last) && !(m->first && m->last) && !m->cfg.untied;
}

int train_tied_sum(struct trainer *t, struct plait_error *err)
{
    if (!holds_one_tied_end(&t->m)) return 0;
    return parallel_sum_ends(&t->par, t->m.grads + gpt2_shard_offset(&t->m.shard, GPT2_WTE, 0),
                             t->m.shard.elems[GPT2_WTE], err);
}

/* ZeRO 2 hands over at every micro-batch on both pipeline ends only with
 * one chunk and a whole backward (1F1B, GPipe), where the tied wte's sum
 * between them goes with each hand-over; an interleaved or split schedule
 * hands over at points of its own on each stage (schedule_quiescent), so wte
 * goes over unsummed and its sum between the ends is taken in the slices at
 * the step's end (tie_in_slices). */
static bool ties_in_slices(const struct trainer *t)
{
    return t->m.zero == 2 && (t->sched.v > 1 || t->sched.split_backward);
}

/* The gradients that more than one rank computed a term of: with sequence
 * parallelism the LayerNorms' over tp, and (tied) the wte's between the
 * pipeline's ends. */
static int shared_sums(struct trainer *t, bool tied, struct plait_error *err)
{
    return model_sum_layernorm_grads(&t->m, err) || (tied && train_tied_sum(t, err)) ? -1 : 0;
}

/* ZeRO 2, where the stage's buffer is quiescent: the micro-batches' gradients
 * since the last hand-over into the slice (added after the step's first). In
 * buckets started during the last backward: the tied wte's sum before the
 * embeddings' bucket, the LayerNorms' over tp in the slice; else both before
 * the reduction. */
static int hand_over(void *ctx, int micros, struct plait_error *err)
{
    struct step_feed *f = ctx;
    struct trainer *t = f->t;
    const struct plan *p = t->plan;
    int B = p->batch.micro_batch, T = t->T;
    bool tied = !ties_in_slices(t), adds = f->slice_holds;
    (void)micros;
    f->slice_holds = true;
    if (t->bucketed) {
        if ((t->hooked ? tied && train_tied_sum(t, err) : shared_sums(t, tied, err)) ||
            buckets_finish(&t->buckets, B, T, t->hooked, err))
            return -1;
        t->buckets.accumulate = true; /* the next hand-over's buckets add */
        return 0;
    }
    struct optim_groups g = {.dp = parallel_slices(&t->par, t->m.zero), .mp = &t->par.g_mp};
    return shared_sums(t, tied, err) || optim_reduce_micro(&t->m, &g, adds, err) ? -1 : 0;
}

/* With ties_in_slices, at the step's end: the tied wte's sum between the
 * pipeline's ends, in the slices. Each end gathers its slices over dp into
 * its gradient buffer (all handed over: free), sums wte there with the other
 * end, and takes its own slice's part of the sum back. */
static int tie_in_slices(struct trainer *t, struct plait_error *err)
{
    struct model *m = &t->m;
    const struct group *dp = parallel_slices(&t->par, m->zero);
    if (!holds_one_tied_end(m)) return 0;
    if (dp->size > 1 && dp->allgather(dp->ctx, m->grad_slice, m->grads, m->slice_n, err))
        return error_prefix(err, "the tied wte's gradient, gathered over dp: ");
    if (dp->size == 1) m->ops->copy(m->ctx, m->grads, m->grad_slice, m->slice_n * sizeof(float));
    if (train_tied_sum(t, err)) return -1;
    size_t wte = gpt2_shard_offset(&m->shard, GPT2_WTE, 0), end = wte + m->shard.elems[GPT2_WTE];
    size_t a = wte > m->slice_at ? wte : m->slice_at,
           z = end < m->slice_at + m->slice_n ? end : m->slice_at + m->slice_n;
    if (z > a)
        m->ops->copy(m->ctx, m->grad_slice + (a - m->slice_at), m->grads + a,
                     (z - a) * sizeof(float));
    return 0;
}

/* ZeRO 3, at the step's end: the gradients more than one rank computed a
 * term of, summed in the slices (the sums commute with the dp sum already
 * taken): the LayerNorms' over tp (sequence parallel), and the tied wte's
 * between the pipeline's ends, for which each end gathers the embeddings'
 * unit of its slices over dp, sums wte with the other end and keeps its own
 * slice's part. */
static int zero3_shared_sums(struct trainer *t, struct plait_error *err)
{
    struct model *m = &t->m;
    float *unit;
    if (mz3_drop_all(m, err) ||
        model_sum_layernorm_grads_in(m, m->grad_slice, m->slice_at, m->slice_n, err))
        return -1;
    if (!holds_one_tied_end(m)) return 0;
    size_t wte = gpt2_shard_offset(&m->shard, GPT2_WTE, 0); /* unit 0 starts the buffer */
    if (mz3_unit_grads(m, MZ3_EMBEDDINGS, &unit, err) ||
        parallel_sum_ends(&t->par, unit + wte, m->shard.elems[GPT2_WTE], err) ||
        mz3_unit_grads_back(m, MZ3_EMBEDDINGS, err))
        return error_prefix(err, "the tied wte's gradient: ");
    return 0;
}

/* After each micro-batch: its count, the fault injection. */
static int after_micro(void *ctx, int micro, struct plait_error *err)
{
    struct step_feed *f = ctx;
    struct trainer *t = f->t;
    const struct plan *p = t->plan;
    (void)micro;
    (void)err;
    t->st.micro++;
    t->st.tokens += (int64_t)p->batch.micro_batch * t->T * t->where->dp; /* (dp·cp ranks) */
    if (++t->micro_done == t->signal_after_micro) raise(SIGTERM);
    return 0;
}

/* A stop between micro-batches (the executor's agreement, pipeline.c): this
 * rank's wish, and, on the first stage, every first-stage rank's (with pp = 1,
 * every rank's). */
static bool wants_stop(void *ctx)
{
    (void)ctx;
    return train_stop_signal != 0;
}

static int agree_stop(void *ctx, int *stop, struct plait_error *err)
{
    struct step_feed *f = ctx;
    *stop = *stop || train_stop_signal;
    return f->t->multi ? parallel_max_stage(&f->t->par, stop, err) : 0;
}

bool train_holds_loss(const struct trainer *t)
{
    return t->where->tp_rank == 0 && (t->m.last || t->m.n_moe > 0);
}

int train_moe_stats(struct trainer *t, double *out, struct plait_error *err)
{
    int n = gpt2_moe(&t->m.cfg) ? MOE_STATS(t->m.cfg.experts) : 0;
    for (int i = 0; i < n; i++) out[i] = train_holds_loss(t) ? t->m.moe_stats[i] : 0;
    if (n && t->multi && t->par.g_world.allreduce_f64(t->par.g_world.ctx, out, (size_t)n, err))
        return -1;
    return 0;
}

int train_micro_batches(struct trainer *t, int s, float grad_scale, struct plait_error *err)
{
    const struct plan *p = t->plan;
    int A = p->batch.grad_accum, left = A - t->st.micro, done = 0;
    struct schedule resumed, *sched = &t->sched;
    if (left < A) { /* resumed mid-step: the rest of it, through the same kind of schedule */
        if (schedule_make(&resumed, t->sched.kind, t->sched.pp, left, t->sched.v, err)) return -1;
        sched = &resumed;
    }
    struct step_feed f = {t, s, t->st.micro > 0};
    struct pipe_feed feed = {feed_next, &f};
    struct pipe_link link = parallel_pipe_link(&t->par);
    struct pipe_step how = {.B = p->batch.micro_batch,
                            .T = t->T,
                            .grad_scale = grad_scale,
                            .accumulate = t->st.micro > 0 && t->m.zero < 2,
                            .after_backward = after_micro,
                            .hand_over = t->m.zero == 2 ? hand_over : NULL,
                            .agree_stop = agree_stop,
                            .wants_stop = wants_stop,
                            .ctx = &f};
    /* the gradient sum starts during the last backward, and an offloaded step's gradient
     * comes down to the host as it is final (with nothing to sum, as the layers are; else as
     * their buckets' sums arrive); not in a step whose gradients are dumped (the dump shows
     * this rank's own) */
    bool dumped = t->dump_dir && t->st.step == t->dump_step && t->st.micro == 0;
    bool early = t->grads_early && !dumped;
    t->hooked = t->bucketed && !dumped;
    if (t->hooked) {
        how.grads_final = buckets_ready;
        how.grads_ctx = &t->buckets;
        how.grads_at_end = &t->buckets.final;
    } else if (early) {
        how.grads_final = host_step_grads_final;
        how.grads_ctx = t->m.host_step;
    }
    if (t->bucketed) {
        t->buckets.landed = early ? host_step_landed : NULL;
        t->buckets.landed_ctx = t->m.host_step;
    }
    if (early) /* the gradient optim_step hands it: the buffer at ZeRO 0, else the slice */
        host_step_expect(t->m.host_step, t->m.zero ? t->m.grad_slice : t->m.grads,
                         t->m.zero ? t->m.slice_n : t->m.shard.total);
    if (t->bucketed) t->buckets.accumulate = t->m.zero == 2 && t->st.micro > 0;
    if (t->st.micro == 0) model_grads_clear(&t->m); /* ZeRO 3: the step's sums start at 0 */
    double loss_sum = 0;
    t->data_failed = false;
    int rc = pipeline_step(&t->m, sched, t->where->pp_rank, &link, &feed, &how, &loss_sum, &done,
                           &t->times, err);
    if (sched == &resumed) schedule_free(&resumed);
    if (rc && t->bucketed) buckets_drop(&t->buckets);
    t->st.loss_sum += loss_sum + model_moe_take_loss(&t->m); /* the MoE losses are the loss's */
    if (rc && t->data_failed) return train_save_failing(t, err);
    if (rc) return error_prefix(err, "step %d, micro-batch %d: ", s + 1, t->st.micro + 1);
    if (t->st.micro < A && !train_stop_signal) train_stop_signal = SIGTERM; /* another rank's */
    if (t->st.micro < A) return 1;
    if (t->m.zero == 3) return zero3_shared_sums(t, err);
    return ties_in_slices(t) && tie_in_slices(t, err) ? -1 : 0;
}
