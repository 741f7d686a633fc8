/* plan_ranks.c — the ranks a plan's parallel section makes: all of them (plan_ranks), a
 * hybrid-sharding shard group's (plan_dp_shard) and those ZeRO slices a rank's part over
 * with expert parallelism (plan_zero_slices). Placing them is common/place/'s. */
#include <stdint.h>

#include "common/plan/plan.h"

int64_t plan_ranks(const struct plan *plan)
{
    const struct plan_parallel *par = &plan->parallel;
    if (par->tp == PLAN_AUTO || par->pp == PLAN_AUTO || par->dp == PLAN_AUTO) return 0;
    return (int64_t)par->tp * par->cp * par->pp * par->dp;
}

int plan_dp_shard(const struct plan_parallel *par, int dp)
{
    if (par->dp_shard != PLAN_AUTO) return par->dp_shard;
    if (par->dp_replicate != PLAN_AUTO) return dp / par->dp_replicate;
    return dp;
}

int plan_zero_slices(const struct plan_parallel *par, int shard)
{
    return par->ep > 1 && par->zero > 0 && shard % par->ep == 0 ? shard / par->ep : shard;
}
