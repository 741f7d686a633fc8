/* optim.h — the optimizer step: learning-rate schedule, global-norm gradient
 * clipping as torch.nn.utils.clip_grad_norm_, and AdamW per tensor (weight
 * decay on the 2-D matrices only). The update maths is the backend's op. */
#ifndef PLAIT_RUNTIME_OPTIM_H
#define PLAIT_RUNTIME_OPTIM_H

#include "common/error.h"
#include "common/plan.h"
#include "runtime/model.h"

/* Learning rate at step s (0-based) of a run of `steps` steps. */
double optim_lr(const struct plan_optimizer *o, int steps, int s);

/* One AdamW step (t is 1-based) on the model's accumulated gradients.
 * *grad_norm gets the global L2 norm before clipping. */
int optim_step(struct model *m, const struct plan_optimizer *o, double lr, int t, double *grad_norm,
               struct plait_error *err);

#endif
