/* rank_order.h — Megatron's rank order, the one place it is written: tp
 * fastest, then cp, then dp, then pp, so
 * rank = tp_rank + tp·(cp_rank + cp·(dp_rank + dp·pp_rank)). Context
 * parallelism folds into the dp coordinate (rank_dp_fold): a layout of dp·cp
 * "gradient" dp ranks in the 3D order, rank = tp_rank + tp·(d + dp·cp·pp_rank)
 * with d = dp_rank·cp + cp_rank, since gradients are averaged over dp·cp.
 * Placement numbers ranks with it, the env contract checks it, the
 * communicators group by it. Not here: which node or device a rank gets
 * (place.c). */
#ifndef PLAIT_COMMON_RANK_ORDER_H
#define PLAIT_COMMON_RANK_ORDER_H

#include <stdint.h>

/* A rank's coordinates in a tp × pp × dp layout */
struct rank_coords {
    int tp_rank, pp_rank, dp_rank;
};

/* The rank at coordinates c of a layout with tp and dp (64-bit: the plan's
 * degrees can be large before they are checked against the world) */
static inline int64_t rank_of(int tp, int dp, struct rank_coords c)
{
    return c.tp_rank + (int64_t)tp * (c.dp_rank + (int64_t)dp * c.pp_rank);
}

/* Hybrid sharding splits the dp coordinate into dp_replicate replicas of a
 * shard group of dp_shard ranks, replicas outermost: a shard group is
 * dp_shard consecutive dp ranks (tp·dp_shard consecutive ranks, which
 * placement keeps on one node, in one NVLink domain, where they fit).
 * Expert parallelism splits it the same way: an ep group is ep consecutive
 * dp ranks, ep rank rank_shard_of(dp_rank, ep), group rank_replica_of. */
static inline int rank_shard_of(int dp_rank, int dp_shard)
{
    return dp_rank % dp_shard;
}

static inline int rank_replica_of(int dp_rank, int dp_shard)
{
    return dp_rank / dp_shard;
}

/* The dp coordinate with context parallelism folded in: the cp ranks of data-parallel
 * rank dp_rank are cp consecutive ones (the gradients' and ZeRO's dp rank), and back */
static inline int rank_dp_fold(int dp_rank, int cp, int cp_rank)
{
    return dp_rank * cp + cp_rank;
}

static inline int rank_cp_of(int folded_dp_rank, int cp)
{
    return folded_dp_rank % cp;
}

static inline int rank_data_of(int folded_dp_rank, int cp)
{
    return folded_dp_rank / cp;
}

/* The coordinates of rank in a layout with tp and dp (dp·cp, folded, with cp) */
static inline struct rank_coords rank_coords_of(int64_t rank, int tp, int dp)
{
    return (struct rank_coords){.tp_rank = (int)(rank % tp),
                                .pp_rank = (int)(rank / tp / dp),
                                .dp_rank = (int)(rank / tp % dp)};
}

#endif
