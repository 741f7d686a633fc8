/* cost_internal.h — what the cost model's two files share: cost.c's helpers that
 * expert parallelism's traffic (cost_ep.c) builds on, and cost_ep.c's terms that
 * cost.c's traffic adds. Included only by cost.c and cost_ep.c, never installed;
 * cost.h is the cost model's interface. */
#ifndef PLAIT_PLACE_COST_INTERNAL_H
#define PLAIT_PLACE_COST_INTERNAL_H

#include <stdint.h>

#include "common/gpt2/gpt2_shard.h"
#include "common/place/cost.h"
#include "common/plan/plan.h"

/* ---- cost.c ---- */

/* Context parallelism's degree (1 without cp). */
int cost_cp_of(const struct plan *p);

/* The part one rank of `stage` holds into *s; -1 when the model cannot be split so. */
int cost_stage_shard(const struct plan *p, struct cost_layout l, int stage, struct gpt2_shard *s);

/* Parameters one rank of `stage` holds (0 when the model cannot be split so). */
uint64_t cost_stage_param_count(const struct plan *p, struct cost_layout l, int stage);

/* Widths of the values the dp collectives carry (the ZeRO paper's mixed
 * precision; what memory a rank holds is gpt2_memory's), bytes. */
struct cost_state_widths {
    uint64_t param_bytes, grad_bytes;
};
struct cost_state_widths cost_state_widths(enum plan_precision precision);

/* Bytes a ring all-reduce of `bytes` sends from each of n ranks. */
double cost_ring_allreduce_bytes(double bytes, int n);

/* Bytes ZeRO's collectives (the plan's stage) send from one rank of `stage` in a step
 * for psi elements sliced over s ranks. */
double cost_zero_bytes(const struct plan *p, struct cost_layout l, int stage, double psi, double s);

/* ---- cost_ep.c ---- */

/* Expert parallelism's degree (1 without ep). */
int cost_ep_of(const struct plan *p);

/* Bytes one rank of `stage` sends over its ep group per optimizer step (0 without ep). */
double cost_ep_alltoall_bytes(const struct plan *p, struct cost_layout l, int stage);

/* Bytes one rank of `stage` sends over its cp group per step for the MoE blocks'
 * routing counts (0 without cp or MoE). */
double cost_cp_moe_count_bytes(const struct plan *p, struct cost_layout l, int stage);

/* Elements of a shard's routed experts (their gradients summed over the expert peers). */
double cost_routed_elems(const struct gpt2_shard *s);

/* ZeRO with ep (plan_zero_slices below S): the dp traffic of one rank of `stage` in a
 * shard group of S ranks of D (dp·cp) into *out's dp_bytes, shard_bytes,
 * replicas_bytes and experts_bytes. */
void cost_ep_zero_traffic(const struct plan *p, struct cost_layout l, int stage, int S, int D,
                          struct cost_traffic *out);

#endif
