/* elastic_batch.c — dp and grad_accum that keep a resumed run's global batch
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
    return (int)g;
}

int elastic_batch_dp(const struct plan *p, int most, int pp, const struct ckpt_batch *resumed)
{
    if (!resumed) return most;
    for (int d = most; d > 1; d--)
        if (keeping(p, resumed->global, d, pp)) return d;
    return 1;
}

int elastic_batch_grad_accum(const struct plan *p, int dp, int pp, const struct ckpt_batch *resumed)
{
    if (!resumed) return p->batch.grad_accum;
    int g = keeping(p, resumed->global, dp, pp);
    return g ? g : p->batch.grad_accum;
}
