/* place.h — the rank map: which node, device, NIC and cores each global rank
 * of a tp × cp × pp × dp layout gets, so that every tensor-parallel group sits
 * in one NVLink domain, a context-parallel group as close after it as the
 * nodes allow, the stages of a pipeline stay as close as the nodes allow, and
 * only stage boundaries and data-parallel reductions cross the network. Shared by plait check, the
 * SPANK plugin and the launcher: every task computes the same map from the same inputs, without
 * talking. */
#ifndef PLAIT_PLACE_H
#define PLAIT_PLACE_H

#include <stdbool.h>

#include "common/place/cost.h"
#include "common/error.h"
#include "common/plan/plan.h"
#include "common/place/topo.h"

/* One node of the allocation, in allocation order. */
struct place_node {
    const char *name;        /* host name, for messages and the map */
    const struct topo *topo; /* its hardware */
    int slots;               /* ranks it can take: GPUs granted, or CPU ranks on a
                                node without GPUs */
    const int *gpus;         /* the granted GPUs (indexes into topo->gpus), or NULL:
                                the placement picks `slots` of them, whole NVLink
                                domains first */
    bool cpu_ranks;          /* CPU ranks even if the node has GPUs (device "cpu") */
    int ranks_per_gpu;       /* slots per GPU (PLAIT_RANKS_PER_GPU on one machine; 0 or 1:
                                one rank per GPU); with granted GPUs, 1 */
};

struct place_rank {
    int rank;           /* global rank: tp fastest, then cp, dp, pp (rank_order.h) */
    int node;           /* index into the nodes */
    int local_rank;     /* among the ranks of its node, by global rank */
    int tp, cp, pp, dp; /* coordinates (dp: the data-parallel one, cp not folded in) */
    int gpu;        /* index into its node's topo->gpus, or -1 (a CPU rank) */
    int nic;        /* index into its node's topo->nics, or -1 (none) */
    int *cores;     /* indexes into its node's topo->cores, ascending */
    int n_cores;
    int numa; /* its GPU's NUMA node (CPU rank: its first core's), -1 unknown */
};

/* The links a communicator's groups cross: the slowest of them, how many
 * groups cross each kind, and the bandwidth of the slowest (GB/s). */
struct place_comm {
    enum cost_link slowest;
    double gbps;
    int groups;               /* groups of this communicator (0 when its degree is 1) */
    int crossing[COST_LINKS]; /* by enum cost_link: groups whose slowest link is it */
    int peers_behind;         /* ep's groups: the most peers one member reaches over the
                                 slowest link, of its degree − 1 (an all-to-all sends each its
                                 share; the others' go alongside over faster links); else 0 */
};

struct rank_map {
    int world, tp, cp, pp, dp; /* world = tp·cp·pp·dp */
    int dp_shard; /* hybrid sharding's shard group (plan_dp_shard; dp: none) */
    int n_nodes;
    struct place_rank *ranks; /* [world], by global rank */
    struct place_comm comm_tp, comm_pp, comm_dp; /* dp: the dp·cp ranks gradients are summed over
                                                    (cp folds into dp: rank_order.h) */
    struct place_comm comm_cp;                   /* ranks differing in cp alone (cp > 1) */
    struct place_comm comm_shard, comm_replicas; /* hybrid sharding's groups (dp_shard < dp):
                                                    a shard group is dp_shard·cp ranks */
    int ep; /* expert parallelism's degree (parallel.ep; 1: none) */
    struct place_comm comm_ep, comm_experts; /* ep > 1: the all-to-all's groups, ep consecutive
                                                (folded) dp ranks, and the expert peers, the
                                                dp·cp/ep ranks with the same ep rank */
    int gpu_sharing;  /* the most ranks on one GPU (1: a GPU each; 0: CPU ranks) */
    int shared_node;  /* the first node with more ranks than cores to give them (they then
                         get one core each, round-robin, and share them), or -1 */
    int shared_ranks; /* those ranks and the cores they share, for the warning */
    int shared_cores;
};

/* Bandwidths the topology does not state (GB/s per rank). */
struct place_bandwidth {
    double pcie_gbps;    /* GPU to GPU over PCIe, no NVLink */
    double network_gbps; /* one NIC */
    double memory_gbps;  /* between CPU ranks of one node */
};

/* Places a concrete layout (no PLAN_AUTO), cp from plan->parallel.cp: each
 * stage's cp tp groups are carved one after another, so a cp group shares a
 * node (an NVLink domain) whenever it fits. Refuses, with the reason in err,
 * when the layout does not fit: too few slots, a tp group that cannot stay in
 * one NVLink domain (naming the domains and the largest tp that fits, unless
 * plan->parallel.allow_tp_over_pcie), or one that would span nodes. */
int place_ranks(const struct plan *plan, int tp, int pp, int dp, const struct place_node *nodes,
                int n_nodes, const struct place_bandwidth *bw, struct rank_map *out,
                struct plait_error *err);
void rank_map_free(struct rank_map *m);

/* "node n1 has 2 cores for 4 ranks: ..." when m->shared_node >= 0 (the
 * launchers warn with it), else "". */
void place_shared_cores_text(const struct rank_map *m, const struct place_node *nodes, char *buf,
                             size_t bytes);

/* "tp 2 × cp 2 × pp 1 × dp 4" (cp named only when > 1, so a layout without
 * context parallelism reads as it always has; dp 0: a replica, "tp 2 × cp 2 ×
 * pp 1") into buf; returns buf. */
char *place_layout_text(char *buf, size_t bytes, int tp, int cp, int pp, int dp);

/* The env contract of one rank (NAME=value strings, malloc'ed, NULL-ended). */
char **place_rank_env(const struct rank_map *m, const struct place_node *nodes, int rank);
void place_env_free(char **env);

#endif
