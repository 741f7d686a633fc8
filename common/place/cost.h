/* cost.h — what a parallel layout costs, before anything runs: bytes of
 * device memory per rank (parameters, gradients, optimizer state and
 * activations as the runtime allocates them: common/gpt2/gpt2_memory.h's
 * accounting, for the plan's precision, ZeRO stage, recompute policy and the
 * micro-batches its pipeline schedule holds), bytes each rank sends per
 * optimizer step over its tp, cp, pp and dp communicators, and a step-time
 * estimate from those and the links' bandwidths. Context parallelism is the
 * plan's parallel.cp (a layout's cp is never chosen): a rank runs seq_len/cp
 * tokens of each sequence, its gradients reduced over dp·cp ranks. Expert parallelism
 * (parallel.ep) spreads each MoE layer's routed experts over ep consecutive (folded) dp
 * ranks: the rows routed to them cross an all-to-all, and their gradients are summed over
 * the dp·cp/ep ranks holding the same experts. Pure arithmetic on the plan;
 * which links a communicator crosses is place.h's business. */
#ifndef PLAIT_COST_H
#define PLAIT_COST_H

#include <stdint.h>

#include "common/gpt2/gpt2_shard.h"
#include "common/plan/plan.h"

/* A concrete layout (no PLAN_AUTO here; cp is the plan's). */
struct cost_layout {
    int tp, pp, dp;
};

/* How the layers split over the pipeline: stage `stage` of pp holds layers
 * [*begin, *end): the plan's parallel.stage_layers when given; with an
 * interleaved schedule, chunks of the even split (gpt2_stage_chunks);
 * otherwise the split that balances this model's time per stage, the last
 * stage also running the final LayerNorm and the LM head (as many FLOPs as
 * 5 layers of GPT-2 124M). One decision, used by plait check, the runtime
 * and everything that builds a rank's part. */
void cost_stage_layers(const struct plan *p, int pp, int stage, int *begin, int *end);

/* The part of tensor rank tp_rank of tp at stage `stage` of pp, split so. */
struct gpt2_part cost_stage_part(const struct plan *p, int tp, int tp_rank, int pp, int stage);

struct cost_memory {      /* bytes, as gpt2_memory.h counts them */
    uint64_t params;      /* fp32 weights, padded to a multiple of dp, and their bf16 copy */
    uint64_t grads;       /* fp32 gradients (padded) and ZeRO's reduced slice */
    uint64_t optimizer;   /* AdamW moments of the ZeRO slice (and ZeRO's staging buffer) */
    uint64_t activations; /* the micro-batches the schedule holds, and scratch */
    uint64_t scratch;    /* a GPU rank's (device "cuda"; 0 elsewhere): the CUDA backend's
                            scratch slots (common/gpt2/gpt2_scratch.h) */
    uint64_t cuda_context; /* ... and cuBLASLt's workspace and the CUDA context's allowance
                              (GPT2_CUDA_CONTEXT_BYTES, an estimate) */
    uint64_t total;        /* all of the above */
    uint64_t disk;       /* parallel.offload "nvme": the moments' files (not in total) */
    uint64_t host;       /* a GPU rank's offloaded step (parallel.offload "host" or "nvme"
                            with device "cuda"): host memory beside the device's, not in
                            total: the moments (or nvme's two windows of each), the slice's
                            fp32 master weights and its gradient; 0 elsewhere */
    int64_t param_count; /* parameters of this rank's tp × pp shard (ZeRO divides
                            the bytes above, not this count) */
    int64_t slice_count; /* elements of the optimizer's slice (ZeRO's, else the shard's
                            padded to dp): what an AdamW step updates */
    int64_t logits_rows; /* the last stage: rows of logits computed at once, 0 a micro-batch's
                            whole (gpt2_logits_rows) */
};

/* Memory of one rank of pipeline stage `stage` (0 ≤ stage < pp; every tp and
 * dp rank of a stage holds the same): what model_init allocates for it. A
 * model too large to address reads as UINT64_MAX everywhere. */
void cost_memory_stage(const struct plan *p, struct cost_layout l, int stage,
                       struct cost_memory *out);

/* The most loaded stage's memory; *stage (may be NULL) gets which one. */
void cost_memory(const struct plan *p, struct cost_layout l, struct cost_memory *out, int *stage);

/* Bytes one rank sends per optimizer step over each communicator (the
 * busiest rank: a middle pipeline stage sends both ways). 0 when the degree
 * is 1. */
struct cost_traffic {
    double tp_bytes, pp_bytes, dp_bytes;
    double cp_bytes; /* the cp ring's key/value blocks and their gradients (cp > 1) */
    /* hybrid sharding (dp_shard < dp): dp_bytes is these two, the shard group's
     * reduce-scatter and gather and the replicas' sum of the slice; else 0 */
    double shard_bytes, replicas_bytes;
    /* expert parallelism (ep > 1): the ep group's all-to-all of the routed rows and their
     * counts, and the part of dp_bytes that is the routed experts' gradients summed over
     * their expert peers (the rest of dp_bytes is over every dp·cp rank); else 0 */
    double ep_bytes, experts_bytes;
};
void cost_traffic(const struct plan *p, struct cost_layout l, struct cost_traffic *out);

/* Host memory the socket backend's shared-memory rings take on one CPU rank of
 * `stage` by the end of its first step, when its peers share its node (peers
 * on other nodes use TCP, whose buffers are the kernel's: then this is an
 * upper bound). A ring is touched as far as its traffic reaches, up to
 * COMM_SHM_RING_BYTES (common/place/comm_memory.h): per step, a tp or dp ring
 * algorithm (and the expert peers') streams its bytes out to one neighbour and in
 * from another, the ep group's all-to-all sends each other rank its share, a
 * pipeline stage exchanges activations and gradients with each neighbour
 * stage, and the pipeline's ends sum the tied wte. The world's and the
 * model-parallel group's control-sized messages touch a page or two and are
 * left out. Not device memory: not in cost_memory's total. */
uint64_t cost_comm_ring_bytes(const struct plan *p, struct cost_layout l, int stage);

/* Where a communicator's traffic goes and how fast (filled by placement). */
/* From fastest to slowest; MEMORY is between CPU ranks of one node. */
enum cost_link {
    COST_LINK_NONE,
    COST_LINK_NVLINK,
    COST_LINK_MEMORY,
    COST_LINK_PCIE,
    COST_LINK_NETWORK,
    COST_LINKS
};

struct cost_links {
    enum cost_link tp, pp, dp;        /* the slowest link each group crosses */
    double tp_gbps, pp_gbps, dp_gbps; /* its bandwidth per rank, GB/s */
    enum cost_link shard, replicas;   /* hybrid sharding: its two groups' */
    double shard_gbps, replicas_gbps;
    enum cost_link cp; /* context parallelism's ring (cp > 1) */
    double cp_gbps;
    enum cost_link ep, experts;   /* expert parallelism (ep > 1): the all-to-all's group, */
    double ep_gbps, experts_gbps; /* and the expert peers the routed gradients sum over */
    double ep_share;              /* the share of a rank's all-to-all bytes that crosses
                                     ep's slowest link (its peers behind it of ep − 1; the
                                     rest goes alongside over faster links); 0: all */
    double device_tflops;         /* sustained dense matmul rate per device */
    double device_memory_gbps;    /* the device's memory bandwidth, GB/s (a GPU's
                                     datasheet figure, a CPU rank's measured pass over
                                     its parameters); 0: not modelled */
    /* A CPU rank whose machine was measured (struct cost_cpu_rates); 0 elsewhere:
     * a GPU's calibrated share covers these, and an unmeasured CPU is not known */
    double attention_tflops; /* the attention's rate (its per-head products and softmax
                                run slower than the layers' products); 0: device_tflops */
    double activation_gbps;  /* the bandwidth of the memory-bound layer ops (LayerNorm,
                                GELU, residual adds, softmax, embedding); 0: not modelled */
    double parallel_op_s;    /* what each CPU op's parallel region costs beyond its work:
                                its threads woken and joined; 0: not modelled */
};

/* What this machine's CPU kernels reached, per CPU (kernels/cpu/cpu_rate.h
 * measures them at a plan's shapes), and the OpenMP threads a rank runs: a
 * rank's rates are these times the CPUs it gets (its node's CPUs divided among
 * the node's ranks, no more than its threads). */
struct cost_cpu_rates {
    double matmul_gflops, attention_gflops; /* the layers' products; the attention */
    double activation_gbps, memory_gbps;    /* the layer ops; a pass over the parameters */
    double parallel_op_us;                  /* a parallel op's start and join, per rank */
    int threads;                            /* a rank's OpenMP threads (0: as many as CPUs) */
};

/* A GPU rank's offloaded AdamW step (cost_memory's host > 0; runtime/host_step.h): the
 * slice's gradient goes down to host memory and its updated weights come back, 4 bytes an
 * element each way, over the host link at COST_HOST_LINK_GBPS (PCIe 4.0 x16's practical
 * rate, plait check's PCIe default, conservative for a Gen5 GPU; one direction at a time);
 * the CPU's AdamW pass reads the gradient and reads and writes the master weights and both
 * moments, 4 + 8 + 16 = 28 bytes an element, at COST_HOST_MEMORY_GBPS (a rank's share of
 * its host's memory bandwidth: some 400 GB/s of a two-socket node over its 8 GPUs). nvme's
 * file reads and writes are not modelled (as on CPU ranks). */
#define COST_HOST_LINK_GBPS 25.0
#define COST_HOST_MEMORY_GBPS 50.0
#define COST_HOST_LINK_BYTES 8  /* per slice element: the gradient down, the weights up */
#define COST_HOST_STEP_BYTES 28 /* per slice element: the CPU's AdamW pass */

struct cost_time {
    double compute_s, tp_s, pp_s, dp_s, bubble_s, optimizer_s, total_s;
    double host_step_s; /* part of optimizer_s: the offloaded step's (COST_HOST_*), else 0 */
    double cp_s;        /* the cp ring's traffic, on the critical path as tp's */
    double ep_s;        /* the experts' all-to-all, likewise (serial: no overlap modelled) */
    double memory_s;    /* the memory-bound ops (links->activation_gbps; 0 when not modelled) */
    double parallel_s;  /* the CPU ops' parallel starts (links->parallel_op_s; likewise) */
};

/* Step-time estimate: compute (the products at device_tflops, the attention at
 * attention_tflops), the memory-bound ops at activation_gbps and the parallel
 * ops' starts at parallel_op_s (CPU ranks), tp, cp and ep's all-to-all
 * (on the critical path; the all-to-all's ep_share over its slowest link), pp p2p and bubble
 * ((pp−1)/grad_accum of the per-micro-batch work, 1F1B), dp (the part not hidden behind backward;
 * the routed experts' part over the expert peers' link), and the optimizer's pass over the weights
 * at the device's memory bandwidth (when links->device_memory_gbps is given), with a GPU rank's
 * offloaded step (COST_HOST_*) on top. */
void cost_step_time(const struct plan *p, struct cost_layout l, const struct cost_links *links,
                    struct cost_time *out);

/* "none", "NVLink", "memory", "PCIe", "network". */
const char *cost_link_name(enum cost_link link);

#endif
