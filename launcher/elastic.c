/* elastic.c — plait train's layout on this machine: "auto" tp and pp as 1,
 * an "auto" dp filling the slots while keeping the resumed run's global
 * batch. The runtime reshards the checkpoint to whatever this decides. */
#include "launcher/elastic.h"

#include <stdlib.h>
#include <sys/stat.h>

#include "common/fsutil.h"
#include "common/log.h"

/* The run's previous plan (its plan.json), or NULL when there is none or it
 * does not load (the runtime then says why). */
static struct plan *previous_plan(const char *run_dir)
{
    char path[4096];
    struct plait_error err;
    struct stat st;
    if (!run_dir || fs_join(path, sizeof path, run_dir, "plan.json", &err) || stat(path, &st) != 0)
        return NULL;
    char *text = fs_read_all(path, NULL, &err);
    struct plan *before = text ? plan_load_text(text, path, NULL, NULL, 0, &err) : NULL;
    free(text);
    return before;
}

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
    /* the global batch in micro-batches: the resumed run's, else the plan's at most dp */
    struct plan *before = previous_plan(run_dir);
    int64_t global = (int64_t)plan->batch.grad_accum * most;
    bool resumed = before && before->parallel.dp != PLAN_AUTO &&
                   before->batch.micro_batch == plan->batch.micro_batch;
    if (resumed) global = (int64_t)before->batch.grad_accum * before->parallel.dp;
    int dp = 0;
    for (int64_t d = most; d >= 1 && !dp; d--)
        if (global % d == 0) dp = (int)d;
    par->dp = dp;
    plan->batch.grad_accum = (int)(global / dp);
    if (resumed &&
        (before->parallel.dp != dp || before->batch.grad_accum != plan->batch.grad_accum))
        log_info("parallel.dp auto: %d data-parallel replica%s of tp %d × pp %d in %lld rank%s "
                 "(the run had %d); batch.grad_accum %d (it had %d) keeps its global batch of "
                 "%lld micro-batches",
                 dp, dp == 1 ? "" : "s", par->tp, par->pp, (long long)(base * dp),
                 base * dp == 1 ? "" : "s", before->parallel.dp, plan->batch.grad_accum,
                 before->batch.grad_accum, (long long)global);
    plan_free(before);
    return 0;
}
