/* cost_ep.c — expert parallelism's part of the cost model (cost.h): the ep group's
 * all-to-all of the routed rows and their counts, the MoE routing counts summed over a
 * cp group, and the routed experts' gradients summed over their expert peers (with
 * ZeRO, the slices over the peers and the dense part over the ep group). What a rank
 * holds with ep is gpt2_memory's (cost.c); the step's time from these bytes is
 * cost.c's too. */
#include <math.h>
#include <stddef.h>

#include "common/gpt2/gpt2_layout.h" // defines: gpt2_layer_moe
#include "common/gpt2/gpt2_shard.h"  // defines: gpt2_shard_layers, gpt2_shard_routed_at
#include "common/place/cost.h"
#include "common/place/cost_internal.h" // defines: what cost.c and cost_ep.c share
#include "common/plan/plan.h"           // defines: plan_zero_slices

int cost_ep_of(const struct plan *p)
{
    return p->parallel.ep > 1 ? p->parallel.ep : 1;
}

/* The MoE layers of a shard (all its chunks'). */
static int shard_moe_layers(const struct gpt2_shard *s)
{
    int n = 0;
    for (int i = 0; i < gpt2_shard_layers(s); i++)
        n += gpt2_layer_moe(&s->cfg, gpt2_shard_layer(s, i));
    return n;
}

/* The rows an MoE block packs for the routed experts from a rank's N tokens: each token's
 * k choices, an expert taking at most its capacity ceil(capacity_factor·k·N/E) (runtime/
 * model_moe.c's capacity_of). Routing is taken as balanced, k·N/E offered to each
 * expert, so the capacity bounds them only below a factor of 1. */
static double moe_rows(const struct plan *p, double N)
{
    const struct plan_moe *e = &p->model.moe;
    double rows = (double)e->top_k * N;
    if (e->capacity_factor > 0)
        rows =
            fmin(rows, e->experts * fmax(1, ceil(e->capacity_factor * e->top_k * N / e->experts)));
    return rows;
}

/* The forward passes a micro-batch runs through an MoE block: its own, and with full
 * recompute the backward's again (runtime/model_backward.c's layer_backward; a split
 * backward's weight pass reruns only the attention, layer_recompute; selective recompute
 * reruns the attention alone). */
static int moe_forwards(const struct plan *p)
{
    return 1 + (p->recompute == PLAN_RECOMPUTE_FULL ? 1 : 0);
}

/* Bytes one rank of `stage` sends over its ep group per optimizer step
 * (runtime/model_moe_ep.c): each forward of an MoE block exchanges the E experts' row
 * counts (int64) and then sends its packed rows to their experts' ranks and the experts'
 * outputs back; its backward sends the outputs' gradients out and the rows' input
 * gradients back. Every exchange is a pairwise all-to-all whose own block stays home:
 * with balanced routing (ep−1)/ep of the rows (and counts) leave the rank. The rows are
 * C fp32 values whatever the precision, as the CPU backend sends them (the CUDA backend
 * refuses MoE), whole on every tp rank (each tp rank has its own ep group). 0 without ep. */
double cost_ep_alltoall_bytes(const struct plan *p, struct cost_layout l, int stage)
{
    int ep = cost_ep_of(p);
    struct gpt2_shard s;
    if (ep == 1 || cost_stage_shard(p, l, stage, &s)) return 0;
    double away = (ep - 1.0) / ep,
           N = (double)p->batch.micro_batch * p->model.seq_len / cost_cp_of(p);
    double rows = away * moe_rows(p, N) * p->model.hidden * 4.0;
    double counts = away * p->model.moe.experts * 8.0;
    double per_layer = moe_forwards(p) * (counts + 2 * rows) + 2 * rows;
    return per_layer * shard_moe_layers(&s) * p->batch.grad_accum;
}

/* Bytes one rank of `stage` sends over its cp group per optimizer step for the MoE
 * blocks' routing (runtime/model_moe_cp.c): each forward of an MoE block sums a table of
 * every chunk's per-expert choices, b·2cp·E doubles, over the cp ranks. 0 without cp. */
double cost_cp_moe_count_bytes(const struct plan *p, struct cost_layout l, int stage)
{
    int cp = cost_cp_of(p);
    struct gpt2_shard s;
    if (cp == 1 || !p->model.moe.given || cost_stage_shard(p, l, stage, &s)) return 0;
    double table = 8.0 * p->batch.micro_batch * 2 * cp * p->model.moe.experts;
    return moe_forwards(p) * cost_ring_allreduce_bytes(table, cp) * shard_moe_layers(&s) *
           p->batch.grad_accum;
}

/* Elements of a shard's routed experts: at ep > 1 their gradients are summed over the
 * expert peers (gpt2_shard_routed_at, as runtime/buckets.c cuts them), not over dp. */
double cost_routed_elems(const struct gpt2_shard *s)
{
    double n = 0;
    size_t run;
    for (size_t at = 0; at < s->total; at += run)
        if (gpt2_shard_routed_at(s, at, &run)) n += (double)run;
    return n;
}

/* Expert parallelism with ZeRO (plan_zero_slices): ZeRO's collectives on the stage's Ψ over
 * the Z = S/ep expert peers of a shard group of S ranks, then the slice's dense part
 * (Ψ − Ψ_r)/Z all-reduced over the ep group, and with hybrid sharding the slice Ψ/Z over
 * the D/S replicas. Without hybrid sharding the peers' bytes are the experts' group's and
 * the ep group's sum dp's (the ep group is inside it); with it both are the shard
 * group's. Z = 1 (S = ep) is ZeRO 0 over the shard group, as the runtime runs it. */
void cost_ep_zero_traffic(const struct plan *p, struct cost_layout l, int stage, int S, int D,
                          struct cost_traffic *out)
{
    struct cost_state_widths w = cost_state_widths(p->precision);
    struct gpt2_shard sh;
    double psi = (double)cost_stage_param_count(p, l, stage);
    double routed = cost_stage_shard(p, l, stage, &sh) ? 0 : cost_routed_elems(&sh);
    double z = plan_zero_slices(&p->parallel, S), r = (double)D / S;
    double peers = cost_zero_bytes(p, l, stage, psi, z),
           dense =
               cost_ring_allreduce_bytes((psi - routed) / z * (double)w.grad_bytes, cost_ep_of(p));
    if (S < D) {
        out->shard_bytes = peers + dense;
        out->replicas_bytes = 2 * (r - 1) / r * psi / z * (double)w.grad_bytes;
    } else {
        out->experts_bytes = peers;
    }
    out->dp_bytes = peers + dense + out->replicas_bytes;
}
