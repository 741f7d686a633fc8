/* elastic.c — plait train's layout on this machine: "auto" tp and pp as 1,
 * an "auto" dp filling the slots while keeping the resumed run's global
 * batch (its newest checkpoint's). The runtime reshards the checkpoint to
 * whatever this decides. */
#include "launcher/elastic.h"

#include <stdbool.h>

#include "common/ckpt_shards.h"
#include "common/log.h"

int elastic_resolve(struct plan *plan, int slots, const char *run_dir, struct plait_error *err)
{
    struct plan_parallel *par = &plan->parallel;
    if (par->tp == PLAN_AUTO && par->sequence_parallel)
        return error_set(err, "parallel.sequence_parallel needs tensor parallelism, but the "
                              "launcher chose tp 1 for parallel.tp \"auto\" (set parallel.tp)");
    if (par->tp == PLAN_AUTO) par->tp = 1;
    if (par->pp == PLAN_AUTO) par->pp = 1;
    int64_t base = (int64_t)par->tp * par->pp;
    if (par->dp != PLAN_AUTO) {
        int64_t world = base * par->dp;
        if (slots > 0 && world > slots)
            return error_set(err,
                             "parallel: tp %d × pp %d × dp %d = %lld ranks do not fit the %d "
                             "this machine is given (--ranks); with parallel.dp \"auto\" the run "
                             "would go on with fewer data-parallel replicas",
                             par->tp, par->pp, par->dp, (long long)world, slots);
        return 0;
    }
    int64_t most = slots > 0 ? slots / base : 1;
    if (most < 1)
        return error_set(err,
                         "parallel: tp %d × pp %d = %lld ranks do not fit the %d given (--ranks)",
                         par->tp, par->pp, (long long)base, slots);
    /* the global batch in micro-batches: the resumed run's (its newest
     * checkpoint's), else the plan's at most dp */
    struct ckpt_batch before;
    bool resumed = run_dir && ckpt_newest_batch(plan, run_dir, &before);
    int64_t global = resumed ? before.global : (int64_t)plan->batch.grad_accum * most;
    int dp = 0;
    for (int64_t d = most; d >= 1 && !dp; d--)
        if (global % d == 0) dp = (int)d;
    par->dp = dp;
    plan->batch.grad_accum = (int)(global / dp);
    if (resumed && (before.dp != dp || before.grad_accum != plan->batch.grad_accum))
        log_info("parallel.dp auto: %d data-parallel replica%s of tp %d × pp %d in %lld rank%s "
                 "(the run had %d); batch.grad_accum %d (it had %d) keeps its global batch of "
                 "%lld micro-batches",
                 dp, dp == 1 ? "" : "s", par->tp, par->pp, (long long)(base * dp),
                 base * dp == 1 ? "" : "s", before.dp, plan->batch.grad_accum, before.grad_accum,
                 (long long)global);
    return 0;
}
