/* lr_schedule.h — the learning rate of every step, the one formula the runtime
 * trains with and the resume check compares (optimizer.schedule):
 *   warmup   steps s < warmup_steps: lr·(s+1)/warmup_steps, for every schedule;
 *   constant lr from there on;
 *   cosine   min + (lr − min)·(1 + cos(π·t))/2,
 *   linear   lr − (lr − min)·t,
 *            with t = (s − warmup)/(D − warmup), D = decay_steps (steps when 0),
 *            min = lr·min_lr_ratio;
 *   wsd      lr until the decay's start E = D − ⌈decay_fraction·(D − warmup)⌉, then
 *            linear to min: lr − (lr − min)·(s − E)/(D − E);
 * and min from step D on. Steps are 0-based (the first step is s = 0). */
#ifndef PLAIT_COMMON_LR_SCHEDULE_H
#define PLAIT_COMMON_LR_SCHEDULE_H

#include <stddef.h>

#include "common/plan/plan.h"

/* The learning rate of 0-based step s of a run of `steps` steps. */
double plan_lr(const struct plan_optimizer *o, int steps, int s);

/* Whether a run resumed at 0-based step s under `after` trains that step with
 * another learning rate than `before`'s schedule gave it: true with a note
 * naming the step, both rates and, where the decay's end moved with `steps`,
 * the optimizer.decay_steps that keeps the old schedule. */
bool plan_lr_jump(const struct plan *before, const struct plan *after, int s, char *note,
                  size_t note_bytes);

#endif
