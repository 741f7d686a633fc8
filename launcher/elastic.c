/* elastic.c — plait train's layout on this machine: "auto" tp and pp by the
 * cost model over the slots --ranks gives (layout_choose, as plait check and
 * every launcher choose; as 1 without --ranks), an "auto" dp filling the
 * slots while keeping the resumed run's global batch (elastic_batch_dp and
 * _grad_accum). cp stays as the plan says: dp is what changes. The runtime reshards the checkpoint
 * to whatever this decides. */
#include "launcher/elastic.h"

#include <stdbool.h>
#include <unistd.h>

#include "common/place/elastic_batch.h"
#include "common/place/layout.h"
#include "common/log.h"
#include "common/place/place.h" // defines: place_layout_text
#include "common/place/topo.h"
#include "launcher/plan_fit.h" // defines: fit_node_here

/* tp, pp (and an "auto" dp) chosen by layout_choose for `slots` ranks on
 * this machine's topology */
static int choose_here(struct plan *plan, int slots, const struct ckpt_batch *resumed,
                       struct plait_error *err)
{
    struct topo topo = {0};
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    struct place_node node;
    if (topo_load(&topo, NULL, err)) return -1;
    if (fit_node_here(plan, slots, &topo, host, &node, err)) {
        topo_free(&topo);
        return -1;
    }
    struct layout_inputs in = {.bw = {.pcie_gbps = 25, .network_gbps = 50, .memory_gbps = 100},
                               .resumed = resumed};
    struct layout_eval best;
    int rc = layout_choose(plan, &node, 1, &in, NULL, NULL, &best, err);
    if (rc == 0) {
        plan->parallel.tp = best.layout.tp;
        plan->parallel.pp = best.layout.pp;
        plan->parallel.dp = best.layout.dp;
        char text[96];
        log_info("parallel: %s on this machine's %d ranks (the cost model's choice for \"auto\")",
                 place_layout_text(text, sizeof text, best.layout.tp, plan->parallel.cp,
                                   best.layout.pp, best.layout.dp),
                 slots);
        layout_eval_free(&best);
    }
    topo_free(&topo);
    /* layout_choose's own words, as plait check prints them */
    return rc;
}

/* tp and pp as the plan says ("auto" as 1); dp fixed, or "auto" filling the slots */
static int fill_slots(struct plan *plan, int slots, const struct ckpt_batch *resumed,
                      struct plait_error *err)
{
    struct plan_parallel *par = &plan->parallel;
    if (par->tp == PLAN_AUTO && par->sequence_parallel)
        return error_set(err, "parallel.sequence_parallel needs tensor parallelism, but the "
                              "launcher chose tp 1 for parallel.tp \"auto\" (set parallel.tp)");
    if (par->tp == PLAN_AUTO) par->tp = 1;
    if (par->pp == PLAN_AUTO) par->pp = 1;
    int64_t base = (int64_t)par->tp * par->cp * par->pp; /* a replica's ranks */
    char text[96];
    if (par->dp != PLAN_AUTO) {
        int64_t world = base * par->dp;
        if (slots > 0 && world > slots)
            return error_set(
                err,
                "parallel: %s = %lld ranks do not fit the %d this machine is given "
                "(--ranks); with parallel.dp \"auto\" the run would go on with fewer "
                "data-parallel replicas",
                place_layout_text(text, sizeof text, par->tp, par->cp, par->pp, par->dp),
                (long long)world, slots);
        return 0;
    }
    int64_t most = slots > 0 ? slots / base : 1;
    if (most < 1)
        return error_set(err, "parallel: %s = %lld ranks do not fit the %d given (--ranks)",
                         place_layout_text(text, sizeof text, par->tp, par->cp, par->pp, 0),
                         (long long)base, slots);
    par->dp = elastic_batch_dp(plan, (int)most, par->pp, resumed);
    return 0;
}

int elastic_resolve(struct plan *plan, int slots, const char *run_dir, struct plait_error *err)
{
    struct plan_parallel *par = &plan->parallel;
    struct ckpt_batch before;
    bool resumed = par->dp == PLAN_AUTO && run_dir && ckpt_newest_batch(plan, run_dir, &before);
    const struct ckpt_batch *rb = resumed ? &before : NULL;
    bool choose = slots > 0 && (par->tp == PLAN_AUTO || par->pp == PLAN_AUTO);
    if (choose ? choose_here(plan, slots, rb, err) : fill_slots(plan, slots, rb, err)) return -1;
    plan->batch.grad_accum = elastic_batch_grad_accum(plan, par->dp, par->pp, rb);
    int64_t ranks = plan_ranks(plan);
    if (resumed && (before.dp != par->dp || before.grad_accum != plan->batch.grad_accum))
        log_info("parallel.dp auto: %d data-parallel replica%s of tp %d × pp %d in %lld rank%s "
                 "(the run had %d); batch.grad_accum %d (it had %d) keeps its global batch of "
                 "%lld micro-batches",
                 par->dp, par->dp == 1 ? "" : "s", par->tp, par->pp, (long long)ranks,
                 ranks == 1 ? "" : "s", before.dp, plan->batch.grad_accum, before.grad_accum,
                 (long long)before.global);
    return 0;
}
