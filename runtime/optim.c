/* optim.c — the gradients' reduction over the
 * data-parallel ranks (whole, or sliced with ZeRO), global-norm clipping and
 * the AdamW step over the tensors of this rank's slice. */
#include "runtime/optim.h"

#include <math.h>
#include <stdlib.h>

#include "runtime/host_step.h"
#include "runtime/model_zero3.h"

static bool has(const struct group *g)
{
    return g && g->size > 1;
}

/* The part of tensor instance [off, off+n) that falls in the slice
 * [lo, lo+len): *a its first element, the count returned (0: none). */
static size_t overlap(size_t off, size_t n, size_t lo, size_t len, size_t *a)
{
    size_t b = off + n < lo + len ? off + n : lo + len;
    *a = off > lo ? off : lo;
    return b > *a ? b - *a : 0;
}

struct slice_args {
    struct model *m;
    const float *g; /* the slice's gradient (slice_at is its element 0) */
    const struct plan_optimizer *o;
    float lr, scale;
    int t;
    /* the norm: the parts whose Σ g² this rank counts (x, n: NULL to count them); routed
     * 1: only the routed experts' runs (ep > 1), 0: only the rest, -1: all */
    const float **x;
    size_t *n;
    int parts, routed;
    /* AdamW's window of the slice, [lo, lo + len) of its elements, and its moments there
     * (all of the slice and adam_m/adam_v, unless they are offloaded) */
    size_t lo, len;
    float *wm, *wv;
    /* where AdamW runs: the model's backend on its weights, or (a GPU rank's offloaded
     * step, runtime/host_step.h) the CPU's on the slice's master weights in host memory
     * (master: its element 0; g is then the host copy of the gradient) */
    const struct ops *ops;
    struct ops_ctx *ctx;
    float *master;
    /* the window's segments gathered in segs (n_segs of segs_cap, kept for the
     * step's windows, freed after) for one adamw_multi */
    struct adamw_segment *segs;
    int n_segs, segs_cap;
};

/* The instance's part in the slice, if this rank counts its Σ g²
 * (gpt2_shard_counts), so that the sum over tp × pp (× dp slices) counts each
 * parameter once. */
static int add_part(void *ctx, enum gpt2_tensor t, int layer, size_t off, size_t n)
{
    (void)layer;
    struct slice_args *a = ctx;
    const struct model *m = a->m;
    if (!gpt2_shard_counts(&m->shard, t)) return 0;
    size_t at, k = overlap(off, n, m->slice_at, m->slice_n, &at);
    for (size_t i = at, end = at + k, run; i < end; i += run) {
        bool routed = gpt2_shard_routed_at(&m->shard, i, &run);
        if (run > end - i) run = end - i;
        if (a->routed >= 0 && routed != (a->routed == 1)) continue;
        if (a->x) {
            a->x[a->parts] = a->g + (i - m->slice_at);
            a->n[a->parts] = run;
        }
        a->parts++;
    }
    return 0;
}

/* Σ g² over the parts this rank counts, added in the shard's order; the
 * backend sums them all before one wait. */
static int sum_squares(struct slice_args *a, double *sum, struct plait_error *err)
{
    a->x = NULL;
    a->parts = 0;
    gpt2_shard_each(&a->m->shard, add_part, a);
    int parts = a->parts;
    a->x = malloc((size_t)(parts ? parts : 1) * sizeof *a->x);
    a->n = malloc((size_t)(parts ? parts : 1) * sizeof *a->n);
    double *sums = malloc((size_t)(parts ? parts : 1) * sizeof *sums);
    int rc = 0;
    if (!a->x || !a->n || !sums) {
        rc = error_set(err, "out of memory");
        goto out;
    }
    a->parts = 0;
    gpt2_shard_each(&a->m->shard, add_part, a);
    a->m->ops->sum_squares(a->m->ctx, sums, a->x, a->n, parts);
    *sum = 0;
    for (int i = 0; i < parts; i++) *sum += sums[i];
out:
    free(a->x);
    free(a->n);
    free(sums);
    a->x = NULL;
    a->n = NULL;
    return rc;
}

/* The instance's part in the window as AdamW's segment (n 0: none there). */
static struct adamw_segment segment_of(const struct slice_args *a, enum gpt2_tensor t, size_t off,
                                       size_t n)
{
    struct model *m = a->m;
    size_t at, k = overlap(off, n, m->slice_at + a->lo, a->len, &at);
    if (!k) return (struct adamw_segment){.n = 0};
    size_t in = at - m->slice_at, w = in - a->lo; /* within the slice, within the window */
    return (struct adamw_segment){
        .p = a->master ? a->master + in : model_master(m, at),
        .p16 = a->master ? NULL : model_copy16(m, t, off, at), /* refreshed after */
        .g = a->g + in,
        .m = a->wm + w,
        .v = a->wv + w,
        .n = k,
        .decays = gpt2_tensor_decays(t)};
}

/* The instance's part in the window, if any, added to segs. */
static int adamw_instance(void *ctx, enum gpt2_tensor t, int layer, size_t off, size_t n)
{
    (void)layer;
    struct slice_args *a = ctx;
    struct adamw_segment s = segment_of(a, t, off, n);
    if (!s.n) return 0;
    if (a->n_segs == a->segs_cap) {
        int cap = a->segs_cap ? 2 * a->segs_cap : 64;
        struct adamw_segment *more = realloc(a->segs, (size_t)cap * sizeof *more);
        if (!more) return -1;
        a->segs = more, a->segs_cap = cap;
    }
    a->segs[a->n_segs++] = s;
    return 0;
}

/* offload_each_window's visitor: AdamW over the window's part of every
 * instance (weight decay by its kind), the segments listed first, then in one
 * adamw_multi where the backend has it, else segment by segment. */
static int adamw_window(void *ctx, size_t lo, size_t n, float *m, float *v, struct plait_error *err)
{
    struct slice_args *a = ctx;
    const struct plan_optimizer *o = a->o;
    a->lo = lo, a->len = n, a->wm = m, a->wv = v;
    a->n_segs = 0;
    if (gpt2_shard_each(&a->m->shard, adamw_instance, a))
        return error_set(err, "out of memory listing the optimizer's segments");
    if (a->ops->adamw_multi) {
        a->ops->adamw_multi(a->ctx, a->segs, a->n_segs, a->lr, o->beta1, o->beta2, (float)o->eps,
                            (float)o->weight_decay, a->scale, a->t);
        return 0;
    }
    for (int i = 0; i < a->n_segs; i++) {
        const struct adamw_segment *s = &a->segs[i];
        a->ops->adamw(a->ctx, s->p, s->p16, s->g, s->m, s->v, s->n, a->lr, o->beta1, o->beta2,
                      (float)o->eps, s->decays ? (float)o->weight_decay : 0.0f, a->scale, a->t);
    }
    return 0;
}

/* The runs of buf (elements [lo, lo + n) of the buffer, its padding left out) that are
 * (routed) or are not a routed expert's (ep > 1), each summed over g. */
static int sum_runs(struct model *m, float *buf, size_t lo, size_t n, const struct group *g,
                    bool routed, struct plait_error *err)
{
    size_t end = lo + n < m->shard.total ? lo + n : m->shard.total;
    for (size_t at = lo, run; has(g) && at < end; at += run) {
        bool here = gpt2_shard_routed_at(&m->shard, at, &run);
        if (run > end - at) run = end - at;
        if (here == routed && g->allreduce(g->ctx, buf + (at - lo), run, false, err)) return -1;
    }
    return 0;
}

/* ZeRO 0 without buckets: the gradients summed over dp, each routed expert's run
 * (ep > 1) over the ranks holding the same experts instead. */
static int sum_dense(struct model *m, const struct group *dp, struct plait_error *err)
{
    if (m->shard.part.ep <= 1) return dp->allreduce(dp->ctx, m->grads, m->shard.total, false, err);
    return sum_runs(m, m->grads, 0, m->shard.total, dp, false, err);
}

static int sum_routed(struct model *m, const struct optim_groups *g, struct plait_error *err)
{
    return m->shard.part.ep > 1 ? sum_runs(m, m->grads, 0, m->shard.total, g->experts, true, err)
                                : 0;
}

/* ZeRO with expert parallelism slices over the expert peers (plan_zero_slices), so each
 * rank of the ep group holds the same dense slice, reduced over its expert peers alone:
 * the slice's dense runs summed over the ep group too (the routed ones are this ep rank's
 * experts, summed already). */
static int sum_dense_over_ep(struct model *m, const struct optim_groups *g, struct plait_error *err)
{
    if (!m->zero || m->shard.part.ep <= 1 || !g) return 0;
    return sum_runs(m, m->grad_slice, m->slice_at, m->slice_n, g->ep, false, err);
}

int optim_reduce_micro(struct model *m, const struct optim_groups *g, bool accumulate,
                       struct plait_error *err)
{
    if (m->zero != 2) return 0;
    size_t S = m->slice_n;
    float *tmp = accumulate ? m->slice_tmp : m->grad_slice;
    int rc = g->dp->reduce_scatter(g->dp->ctx, m->grads, tmp, S, err);
    if (rc == 0 && accumulate)
        m->ops->residual_forward(m->ctx, m->grad_slice, m->grad_slice, tmp, S);
    return rc ? error_prefix(err, "data-parallel gradient reduction: ") : 0;
}

int optim_step(struct model *m, const struct plan_optimizer *o, double lr, int t,
               const struct optim_groups *g, double *grad_norm, struct plait_error *err)
{
    const struct ops *ops = m->ops;
    const struct group *dp = g ? g->dp : NULL, *mp = g ? g->mp : NULL,
                       *rep = g ? g->replicas : NULL;
    struct slice_args a = {
        .m = m, .g = m->grads, .o = o, .lr = (float)lr, .t = t, .ops = ops, .ctx = m->ctx};
    double t0 = prof_clock(&m->prof);
    if (mz3_gathered(m) >= 0)
        return error_set(err,
                         "ZeRO 3: unit %d is still gathered at the optimizer step, which would "
                         "leave its window stale (a bug: mz3_drop_all comes first)",
                         mz3_gathered(m));
    /* the gradients over dp: whole (ZeRO 0) or this rank's slice (ZeRO 1; 2 has it) */
    int rc = 0;
    if (has(dp) && m->zero == 0 && !g->summed)
        rc = sum_dense(m, dp, err);
    else if (has(dp) && m->zero == 1 && !g->summed)
        rc = dp->reduce_scatter(dp->ctx, m->grads, m->grad_slice, m->slice_n, err);
    if (rc) return error_prefix(err, "data-parallel gradient reduction: ");
    if (has(dp) && m->zero == 0 && !g->summed && sum_routed(m, g, err))
        return error_prefix(err, "the routed experts' gradient reduction: ");
    if (sum_dense_over_ep(m, g, err))
        return error_prefix(err, "the dense slice's gradient sum over the ep group: ");
    if (m->zero) a.g = m->grad_slice;
    /* hybrid sharding: the replicas' sums of the same slice (or of the whole, unsliced) */
    if (has(rep) && rep->allreduce(rep->ctx, m->zero ? m->grad_slice : m->grads,
                                   m->zero ? m->slice_n : m->shard.total, false, err))
        return error_prefix(err, "gradient sum over the data-parallel replicas: ");
    m->prof.seconds[PROF_GRAD_NORM] += prof_clock(&m->prof) - t0;
    /* the norm: this rank's count, summed over the slices (dp) and the model's parts */
    t0 = prof_clock(&m->prof);
    double sum, routed = 0;
    bool ep = m->shard.part.ep > 1;
    a.routed = ep ? 0 : -1;
    if (sum_squares(&a, &sum, err)) return -1;
    if (ep) { /* the routed experts' each on its ep rank, summed over the ep group */
        a.routed = 1;
        if (sum_squares(&a, &routed, err)) return -1;
        if (g && has(g->ep) && g->ep->allreduce_f64(g->ep->ctx, &routed, 1, err))
            return error_prefix(err, "gradient norm over the ep group: ");
        sum += routed;
    }
    if ((m->zero && has(dp) && dp->allreduce_f64(dp->ctx, &sum, 1, err)) ||
        (has(mp) && mp->allreduce_f64(mp->ctx, &sum, 1, err)))
        return error_prefix(err, "gradient norm: ");
    double norm = sqrt(sum);
    m->prof.seconds[PROF_GRAD_NORM] += prof_clock(&m->prof) - t0;
    /* clip_grad_norm_: coef = max_norm / (norm + 1e-6), clamped to 1 */
    double scale = 1.0;
    if (o->grad_clip > 0) {
        double coef = o->grad_clip / (norm + 1e-6);
        scale = coef < 1.0 ? coef : 1.0;
    }
    a.scale = (float)scale;
    t0 = prof_clock(&m->prof);
    if (m->host_step) { /* on the CPU, the slice's weights and gradient in host memory */
        const float *dev_grad = a.g;
        a.ops = ops_cpu(), a.ctx = m->host_step->cpu_ctx;
        a.master = m->host_step->master, a.g = m->host_step->grad;
        rc = host_step_run(m->host_step, m->offload, dev_grad, model_master(m, m->slice_at),
                           adamw_window, &a, err);
        if (!rc && !(m->zero && m->zero < 3 && has(dp)))
            model_refresh_bf16(m); /* else the gather's */
    } else if (m->offload) {
        rc = offload_each_window(m->offload, adamw_window, &a, err);
    } else {
        rc = adamw_window(&a, 0, m->slice_n, m->adam_m, m->adam_v, err);
    }
    free(a.segs);
    if (rc) return -1;
    if (m->zero && m->zero < 3 && has(dp)) { /* every slice back to every rank (ZeRO 3
                                                  gathers each unit when a pass needs it) */
        /* the rank's slice: both device memory, a copy within the device */
        float *mine = m->slice_tmp;
        ops->copy(m->ctx, mine, m->params + m->slice_at, m->slice_n * sizeof(float));
        rc = dp->allgather(dp->ctx, mine, m->params, m->slice_n, err);
        if (rc) return error_prefix(err, "data-parallel parameter gather: ");
        model_refresh_bf16(m);
    }
    model_refresh_fp8(m); /* the whole matrices updated: their amax, then the copy */
    m->prof.seconds[PROF_OPTIMIZER] += prof_clock(&m->prof) - t0;
    *grad_norm = norm;
    char msg[512];
    if (ops->take_error(m->ctx, msg, sizeof msg))
        return error_set(err, "%s backend, optimizer step %d: %s", ops->name, t, msg);
    return 0;
}
