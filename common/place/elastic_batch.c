/* elastic_batch.c — dp and grad_accum that keep a resumed run's global batch, or the
 * plan's batch.global_batch,
 * (elastic_batch.h). Which checkpoint is the newest and what batch it ran is
 * ckpt_shards.c's; choosing tp and pp is layout.c's. */
#include "common/place/elastic_batch.h"

#include <limits.h>

/* grad_accum that keeps `global` micro-batches over dp replicas of pp stages,
 * or 0 when none does */
static int keeping(const struct plan *p, int64_t global, int dp, int pp)
{
    if (dp < 1 || global % dp != 0 || global / dp > INT_MAX) return 0;
    int64_t g = global / dp;
    if (p->parallel.schedule == PLAN_PIPE_INTERLEAVED && pp > 1 && g % pp != 0) return 0;
    if (p->parallel.schedule == PLAN_PIPE_DUALPIPEV && pp > 1 && g < 2 * pp) return 0;
    return (int)g;
}

/* the micro-batches a step must keep over all replicas: the resumed run's, else the plan's
 * batch.global_batch; 0 for none */
static int64_t target(const struct plan *p, const struct ckpt_batch *resumed)
{
    if (resumed) return resumed->global;
    return p->batch.global_batch ? p->batch.global_batch / p->batch.micro_batch : 0;
}

int elastic_batch_dp(const struct plan *p, int most, int pp, const struct ckpt_batch *resumed)
{
    int64_t global = target(p, resumed);
    if (!global) return most;
    for (int d = most; d > 1; d--)
        if (keeping(p, global, d, pp)) return d;
    return 1;
}

int elastic_batch_grad_accum(const struct plan *p, int dp, int pp, const struct ckpt_batch *resumed)
{
    int64_t global = target(p, resumed);
    int g = global ? keeping(p, global, dp, pp) : 0;
    return g ? g : p->batch.grad_accum;
}
