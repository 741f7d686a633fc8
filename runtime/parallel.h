/* parallel.h — one rank among the others: the store it joined, the world and
 * its tensor-, pipeline- and data-parallel communicators (runtime/comm), and
 * what the training loop needs of them as runtime/group.h tables and a
 * pipeline link. With one rank there is no store and no communicator, the
 * groups have size 1, and every call below is a no-op. */
#ifndef PLAIT_RUNTIME_PARALLEL_H
#define PLAIT_RUNTIME_PARALLEL_H

#include <stdbool.h>
#include <stdint.h>

#include "common/place/env.h"
#include "common/error.h"
#include "runtime/comm/comm.h"
#include "runtime/group.h"
#include "runtime/pipeline.h"

struct store;
struct ops;
struct ops_ctx;

/* Where this rank's tensors are, for its collectives: the comm backend
 * (socket: host memory; nccl: device memory, host values staged by it) and
 * the op backend's context, whose stream orders the collectives (nccl) and
 * whose memory holds the pipeline's messages on their way. */
struct parallel_device {
    enum comm_backend_kind backend;
    const struct ops *ops;
    struct ops_ctx *ctx;
};

/* A pipeline message on its way (nccl): a copy, host memory or the op
 * backend's, until its send completes. */
struct parallel_outgoing {
    void *buf;
    size_t cap;
    bool on_host;
    struct comm_request *req; /* NULL: the slot is free */
};

struct parallel {
    struct env_rank where;
    double timeout_s;
    struct store *store;               /* NULL with one rank */
    struct comm *world, *tp, *pp, *dp; /* NULL where the degree is 1 */
    struct comm *mp;                   /* tp × pp: the ranks holding one copy of the model */
    struct comm *ends;                 /* the first and last stage of a pipeline (pp > 1):
                                          the tied wte's gradient is summed over it */
    struct comm *cp;                   /* context parallelism's ring (cp > 1): the cp ranks of
                                          one sequence, by cp rank */
    /* hybrid sharding (dp_shard < dp): dp rank d is shard rank d % dp_shard of replica
     * d / dp_shard (replicas outermost: a shard group is dp_shard consecutive dp ranks) */
    int dp_shard;
    struct comm *shard, *replicas; /* NULL without hybrid sharding */
    /* g_shard: the ranks the gradients are reduced over and ZeRO slices them over (the
     * shard group; all of dp without hybrid sharding); g_replicas: the replicas of this
     * rank's slice (size 1: none), over which the slice's sum is summed once a step */
    struct group g_tp, g_shard, g_replicas, g_mp, g_world, g_cp;
    /* expert parallelism (ep > 1; plan.h): dp rank d is ep rank d % ep of ep group d / ep.
     * g_ep: the ep group, the experts' all-to-all; g_experts: the dp ranks of the shard
     * group holding the same experts (the same ep rank), the routed experts' gradients summed
     * over it, and with ZeRO the ranks the part is sliced over (parallel_slices) */
    int ep;
    struct comm *ep_comm, *expert_peers; /* NULL where their size is 1 */
    struct group g_ep, g_experts;
    /* the same ep groups again (parallel_ep_lane): DualPipeV's second lane's all-to-all, in
     * flight beside the first lane's (runtime/lanes.h); NULL, size 1: none */
    struct comm *ep_lane_comm;
    struct group g_ep_lane;
    struct parallel_device dev;
    /* nccl (or PLAIT_DEBUG_NCCL_LINK=1): the pipeline's messages travel on
     * a communicator of their own per direction between two neighbouring
     * stages, posted without waiting. NCCL buffers nothing and runs a
     * communicator's operations in posting order, so on one communicator two
     * neighbours each sending first would wait for each other; here a
     * send's stream holds sends to one stage only, a receive's receives from
     * one only, each in the order of the other end (test_pipeline checks the
     * schedules keep it). */
    bool pair_links;
    struct comm *link_to[2], *link_from[2]; /* to and from the stages below */
    int link_to_stage[2], link_from_stage[2], n_to, n_from;
    struct parallel_outgoing *out; /* [n_out] the sends' copies */
    int n_out;
};

/* Joins the store and builds the communicators of where's layout, with
 * context parallelism folded into its dp coordinate (parallel_fold), (names
 * carry the restart count, so a restarted gang cannot meet a stale one) on
 * dev's backend, with shard groups of dp_shard ranks (plan_dp_shard; dp:
 * none) and expert parallelism's groups at ep > 1. Every rank calls it; it fails by timeout_s
 * naming what did not come. */
int parallel_init(struct parallel *p, const struct env_rank *where, int dp_shard, int ep,
                  double timeout_s, const struct parallel_device *dev, struct plait_error *err);
void parallel_free(struct parallel *p);

/* The group ZeRO at stage `zero` slices this rank's part over (plan_zero_slices): the
 * shard group, or with expert parallelism at ZeRO >= 1 the expert peers in it. */
const struct group *parallel_slices(const struct parallel *p, int zero);

/* A second communicator over each ep group (p->ep_lane_comm, g_ep_lane), for DualPipeV's
 * second lane (common/place/schedule.h schedule_moe_lanes): every rank calls it, or none.
 * Nothing at ep 1. */
int parallel_ep_lane(struct parallel *p, struct plait_error *err);

/* The runtime's view of a rank of the env contract: context parallelism folded into
 * the dp coordinate (rank_order.h's rank_dp_fold), dp the dp·cp ranks the gradients
 * are averaged over and ZeRO slices over; cp and cp_rank as they were. */
struct env_rank parallel_fold(const struct env_rank *where);

/* A rank that fails tells the others (the store's abort), so that they stop
 * at once instead of at their deadline. */
void parallel_abort(struct parallel *p, const char *reason);

/* The transfers between this rank's pipeline neighbours (its pp group). On
 * nccl a send is copied and posted on its direction's communicator without
 * waiting; flush waits for the sends (the end of a step). */
struct pipe_link parallel_pipe_link(struct parallel *p);

/* The tied wte's gradient (n floats) summed between the first and last
 * pipeline stage (a no-op with pp = 1). */
int parallel_sum_ends(struct parallel *p, float *grad, size_t n, struct plait_error *err);

/* Waits until every rank has arrived (world barrier). */
int parallel_barrier(struct parallel *p, struct plait_error *err);

/* Rank 0's text (up to bytes, NUL included) to every rank: rank 0 passes it
 * in buf, the others receive it there. */
int parallel_share_text(struct parallel *p, const char *what, char *buf, size_t bytes,
                        struct plait_error *err);

/* What this rank's communicators have done so far: bytes sent, and seconds
 * its callers waited in them (0 where the communicator does not exist). */
enum { PAR_TP, PAR_PP, PAR_DP, PAR_ENDS, PAR_WORLD, PAR_CP, PAR_EP, PAR_NCOMM };
void parallel_comm_totals(const struct parallel *p, double bytes[PAR_NCOMM],
                          double wait_s[PAR_NCOMM]);

/* Every rank's n doubles, in rank order, into all (world·n); with one rank a copy. */
int parallel_gather(struct parallel *p, const double *mine, size_t n, double *all,
                    struct plait_error *err);

/* The largest of every rank's *flag, into *flag on every rank (the stop
 * agreement; an error flag). */
int parallel_max_int(struct parallel *p, int *flag, struct plait_error *err);

/* The same over the ranks of this rank's pipeline stage (its tp × dp ranks:
 * the max over tp, then over dp): the first stage's stop agreement. */
int parallel_max_stage(struct parallel *p, int *flag, struct plait_error *err);

#endif
