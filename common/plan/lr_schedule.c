/* lr_schedule.c — the learning-rate schedule (lr_schedule.h). */
#include "common/plan/lr_schedule.h"

#include <math.h>
#include <stdio.h>

/* the step the decay ends at */
static int decay_end(const struct plan_optimizer *o, int steps)
{
    return o->decay_steps ? o->decay_steps : steps;
}

double plan_lr(const struct plan_optimizer *o, int steps, int s)
{
    if (s < o->warmup_steps) return o->lr * (s + 1) / o->warmup_steps;
    if (o->schedule == PLAN_SCHEDULE_CONSTANT) return o->lr;
    int end = decay_end(o, steps);
    double min_lr = o->lr * o->min_lr_ratio;
    if (s >= end) return min_lr;
    double t = (double)(s - o->warmup_steps) / (end - o->warmup_steps);
    switch (o->schedule) {
    case PLAN_SCHEDULE_COSINE:
        return min_lr + 0.5 * (1.0 + cos(M_PI * t)) * (o->lr - min_lr);
    case PLAN_SCHEDULE_LINEAR:
        return o->lr - (o->lr - min_lr) * t;
    case PLAN_SCHEDULE_WSD: {
        int start = end - (int)ceil(o->decay_fraction * (end - o->warmup_steps));
        if (s < start) return o->lr;
        return o->lr - (o->lr - min_lr) * (s - start) / (end - start);
    }
    case PLAN_SCHEDULE_CONSTANT:
        break;
    }
    return o->lr;
}

bool plan_lr_jump(const struct plan *before, const struct plan *after, int s, char *note,
                  size_t note_bytes)
{
    double was = plan_lr(&before->optimizer, before->steps, s),
           now = plan_lr(&after->optimizer, after->steps, s);
    if (fabs(now - was) <= 1e-12 * fabs(was)) return false;
    int end = decay_end(&before->optimizer, before->steps);
    char keep[96] = "";
    if (!after->optimizer.decay_steps && !before->optimizer.decay_steps &&
        before->steps != after->steps && before->optimizer.schedule != PLAN_SCHEDULE_CONSTANT)
        snprintf(keep, sizeof keep, "; optimizer.decay_steps %d keeps the checkpoint's schedule",
                 end);
    snprintf(note, note_bytes,
             "the learning-rate schedule changes shape: step %d trains with lr %.3g, where the "
             "checkpoint's plan gave it %.3g%s",
             s + 1, now, was, keep);
    return true;
}
