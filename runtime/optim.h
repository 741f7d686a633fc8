/* optim.h — the optimizer step (its learning rate is common/plan/lr_schedule.h's): global-norm gradient
 * clipping as torch.nn.utils.clip_grad_norm_, and AdamW per tensor (weight
 * decay on the 2-D matrices only). The update maths is the backend's op. */
#ifndef PLAIT_RUNTIME_OPTIM_H
#define PLAIT_RUNTIME_OPTIM_H

#include "common/error.h"
#include "common/plan/plan.h"
#include "runtime/group.h"
#include "runtime/model.h"

/* The groups a step spans: dp holds copies of this rank's part (its
 * gradients are summed over it; with ZeRO each updates its slice and they
 * gather the parameters): with hybrid sharding the shard group, whose
 * replicas hold the same slices, the slice's sum then summed over them
 * (replicas); mp the ranks that together hold one copy of the model (tp ×
 * pp: the norm sums over them). NULL or size 1: none. */
struct optim_groups {
    const struct group *dp, *replicas, *mp;
    /* expert parallelism (the shard's ep > 1): the ep group, and the dp ranks holding the
     * same experts, over which the routed experts' gradients are summed (not dp); with ZeRO
     * dp is those expert peers (parallel_slices) and the slice's dense runs are summed over
     * the ep group after */
    const struct group *ep, *experts;
    bool summed; /* the gradients are already summed over dp (ZeRO 0) or reduce-scattered
                    into the slice (ZeRO 1) in buckets (runtime/buckets.h) */
};

/* Before a step, with ZeRO 2: the gradients of the micro-batches just run
 * (in m->grads) reduced over dp and added into this rank's slice (accumulate
 * false: the step's first). A no-op but at stage 2. */
int optim_reduce_micro(struct model *m, const struct optim_groups *g, bool accumulate,
                       struct plait_error *err);

/* One AdamW step (t is 1-based) on the model's accumulated gradients: summed
 * over dp (ZeRO 0), reduce-scattered to the slices (ZeRO 1) or already there
 * (ZeRO 2 and 3), then summed over the replicas; clipped by the global L2
 * norm (each parameter counted once over tp, pp and dp), which *grad_norm
 * gets; the parameters gathered back (ZeRO 1 and 2: every rank ends with the
 * same parameters for its part; ZeRO 3 keeps its slice). The tied wte's
 * gradient must already be summed between the pipeline's ends. */
int optim_step(struct model *m, const struct plan_optimizer *o, double lr, int t,
               const struct optim_groups *g, double *grad_norm, struct plait_error *err);

#endif
