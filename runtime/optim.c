/* optim.c — learning-rate schedule, gradient clipping and the AdamW step over
 * the parameter tensors. */
#include "runtime/optim.h"

#include <math.h>

double optim_lr(const struct plan_optimizer *o, int steps, int s)
{
    if (s < o->warmup_steps) return o->lr * (s + 1) / o->warmup_steps;
    if (o->schedule == PLAN_SCHEDULE_CONSTANT) return o->lr;
    double min_lr = o->lr * o->min_lr_ratio;
    double progress = (double)(s - o->warmup_steps) / (steps - o->warmup_steps);
    return min_lr + 0.5 * (1.0 + cos(M_PI * progress)) * (o->lr - min_lr);
}

struct adamw_args {
    struct model *m;
    const struct plan_optimizer *o;
    float lr, scale;
    int t;
};

/* AdamW on one tensor instance (weight decay by its kind). */
static int adamw_instance(void *ctx, enum gpt2_tensor t, int layer, size_t off, size_t n)
{
    (void)layer;
    struct adamw_args *a = ctx;
    struct model *m = a->m;
    double wd = gpt2_tensor_decays(t) ? a->o->weight_decay : 0.0;
    m->ops->adamw(m->params + off, m->params16 ? m->params16 + off : NULL, m->grads + off,
                  m->adam_m + off, m->adam_v + off, n, a->lr, (float)a->o->beta1,
                  (float)a->o->beta2, (float)a->o->eps, (float)wd, a->scale, a->t);
    return 0;
}

/* Σ g² over the tensor instances this rank counts: all it holds, but a tensor
 * whole on every tp rank only on tp rank 0, so the group's sum counts each
 * parameter once. */
struct norm_args {
    const struct model *m;
    double sum;
};

static int add_squares(void *ctx, enum gpt2_tensor t, int layer, size_t off, size_t n)
{
    (void)layer;
    struct norm_args *a = ctx;
    if (gpt2_tensor_tp_replicated(t) && a->m->tp.rank != 0) return 0;
    a->sum += a->m->ops->sum_squares(a->m->grads + off, n);
    return 0;
}

static int grad_norm_of(struct model *m, double *norm, struct plait_error *err)
{
    struct norm_args a = {m, 0};
    gpt2_shard_each(&m->shard, add_squares, &a);
    if (m->tp.size > 1 && m->tp.allreduce_f64(m->tp.ctx, &a.sum, 1, err))
        return error_prefix(err, "gradient norm: ");
    *norm = sqrt(a.sum);
    return 0;
}

int optim_step(struct model *m, const struct plan_optimizer *o, double lr, int t, double *grad_norm,
               struct plait_error *err)
{
    const struct ops *ops = m->ops;
    double norm = 0;
    int rc;
    PROF(&m->prof, PROF_GRAD_NORM, rc = grad_norm_of(m, &norm, err));
    if (rc) return -1;
    /* clip_grad_norm_: coef = max_norm / (norm + 1e-6), clamped to 1 */
    double scale = 1.0;
    if (o->grad_clip > 0) {
        double coef = o->grad_clip / (norm + 1e-6);
        scale = coef < 1.0 ? coef : 1.0;
    }
    double t0 = prof_now();
    struct adamw_args a = {m, o, (float)lr, (float)scale, t};
    gpt2_shard_each(&m->shard, adamw_instance, &a);
    m->prof.seconds[PROF_OPTIMIZER] += prof_now() - t0;
    *grad_norm = norm;
    char msg[512];
    if (ops->take_error(msg, sizeof msg))
        return error_set(err, "%s backend, optimizer step %d: %s", ops->name, t, msg);
    return 0;
}
