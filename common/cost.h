/* cost.h — what a parallel layout costs, before anything runs: bytes of
 * device memory per rank (parameters, gradients and optimizer state by
 * precision and ZeRO stage after the ZeRO paper; activations by micro-batch,
 * sequence length, tp and recompute policy), bytes each rank sends per
 * optimizer step over its tp, pp and dp communicators, and a step-time
 * estimate from those and the links' bandwidths. Pure arithmetic on the plan;
 * which links a communicator crosses is place.h's business. */
#ifndef PLAIT_COST_H
#define PLAIT_COST_H

#include <stdint.h>

#include "common/plan.h"

/* A concrete layout (no PLAN_AUTO here). */
struct cost_layout {
    int tp, pp, dp;
};

struct cost_memory {
    uint64_t params; /* model weights as the device holds them */
    uint64_t grads;
    uint64_t optimizer;   /* AdamW moments (and fp32 master weights in bf16) */
    uint64_t activations; /* what backward needs, at the pipeline's peak */
    uint64_t total;
    int64_t param_count; /* parameters of this rank's tp × pp shard (Ψ; ZeRO divides
                            the bytes above, not this count) */
};

/* Parameters, gradients and optimizer state of a rank holding `param_count`
 * parameters, over dp ranks at ZeRO stage `zero` (fills params, grads,
 * optimizer, param_count and total; activations 0). E.g. 7e9 parameters,
 * bf16, no ZeRO: 16 bytes each, 112 GB. */
void cost_model_state(int64_t param_count, enum plan_precision precision, int zero, int dp,
                      struct cost_memory *out);

/* Memory of one rank of pipeline stage `stage` (0 ≤ stage < pp). */
void cost_memory_stage(const struct plan *p, struct cost_layout l, int stage,
                       struct cost_memory *out);

/* The most loaded stage's memory; *stage (may be NULL) gets which one. */
void cost_memory(const struct plan *p, struct cost_layout l, struct cost_memory *out, int *stage);

/* Bytes one rank sends per optimizer step over each communicator (the
 * busiest rank: a middle pipeline stage sends both ways). 0 when the degree
 * is 1. */
struct cost_traffic {
    double tp_bytes, pp_bytes, dp_bytes;
};
void cost_traffic(const struct plan *p, struct cost_layout l, struct cost_traffic *out);

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
    double device_tflops;             /* sustained dense matmul rate per device */
};

struct cost_time {
    double compute_s, tp_s, pp_s, dp_s, bubble_s, total_s;
};

/* Step-time estimate: compute, tp (on the critical path), pp p2p and bubble
 * ((pp−1)/grad_accum of the compute, 1F1B), dp (the part not hidden behind
 * backward). */
void cost_step_time(const struct plan *p, struct cost_layout l, const struct cost_links *links,
                    struct cost_time *out);

/* "none", "NVLink", "memory", "PCIe", "network". */
const char *cost_link_name(enum cost_link link);

#endif
