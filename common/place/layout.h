/* layout.h — the one place a layout is decided: a concrete tp × pp × dp
 * (× the plan's cp, which "auto" never changes), placed on the allocation's nodes and costed (memory per rank, traffic,
 * step time), and "auto" degrees resolved by the cost model's best tokens per
 * second among the layouts that can be placed and fit. plait check prints the
 * candidates; the Slurm plugin and plait train take the same choice. */
#ifndef PLAIT_LAYOUT_H
#define PLAIT_LAYOUT_H

#include <stdbool.h>
#include <stdint.h>

#include "common/formats/ckpt_shards.h" // defines: struct ckpt_batch
#include "common/place/cost.h"
#include "common/error.h"
#include "common/place/place.h"
#include "common/plan/plan.h"

/* What the topology does not say. */
struct layout_inputs {
    uint64_t device_memory_bytes; /* 0: unknown (anything fits) */
    double device_tflops;         /* 0: from the first node's GPU model, or the CPU's rates */
    /* The nodes' CPU, measured (this machine's: kernels/cpu/cpu_rate.h), for
     * CPU ranks; NULL: not measured (another machine, an hwloc XML file), CPU
     * ranks then compute at layout_device_tflops's assumption, nothing else
     * modelled */
    const struct cost_cpu_rates *cpu;
    struct place_bandwidth bw;
    /* the run being resumed, whose global batch an "auto" dp keeps
     * (common/place/elastic_batch.h), or NULL: fill the slots. A launcher whose
     * slots must all run (a Slurm step, a pod gang) passes NULL; the runtime
     * then keeps the global batch where that dp divides it. */
    const struct ckpt_batch *resumed;
};

/* One layout, placed and costed. */
struct layout_eval {
    struct cost_layout layout;
    bool placed, fits;
    char why[1024]; /* why it cannot run, if it cannot */
    struct rank_map map;
    struct cost_memory mem;
    int worst_stage;
    struct cost_traffic traffic;
    struct cost_time time;
    double tokens_per_s;
};

void layout_evaluate(const struct plan *p, struct cost_layout l, const struct place_node *nodes,
                     int n_nodes, const struct layout_inputs *in, struct layout_eval *e);

/* p with parallel.device "auto" resolved to where the map placed the ranks
 * (a shallow copy, valid while p is): what a rank holds depends on it (a
 * GPU's fused attention keeps no probabilities, cost.h), so the memory of a
 * placed layout is counted on this. */
struct plan layout_plan_as_placed(const struct plan *p, const struct rank_map *m);
void layout_eval_free(struct layout_eval *e);

/* The highest ZeRO stage plait-train runs. */
#define LAYOUT_ZERO_MAX 3

/* The most loaded rank's memory under layout l with p's parallel.zero set to `zero`
 * and its parallel.offload to `offload` (p as placed: layout_plan_as_placed, whose
 * device says whether offload moves a GPU rank's step to the CPU): the one count
 * behind every "what would fit". */
void layout_memory_with(const struct plan *p, struct cost_layout l, int zero,
                        enum plan_offload offload, struct cost_memory *out);

/* Its total with p's own parallel.offload. */
uint64_t layout_memory_at_zero(const struct plan *p, struct cost_layout l, int zero);

/* The lowest ZeRO stage a layout may run: 1 with hybrid sharding's replicas
 * (their ranks hold slices), else 0. */
int layout_zero_lowest(const struct plan *p, struct cost_layout l);

/* The cheapest ZeRO stage (the least data-parallel traffic: the lowest) with
 * which every rank of layout l fits in device_bytes; -1 when none does, when
 * dp is 1 (ZeRO shards nothing) or device_bytes is 0 (unknown). */
int layout_zero_to_fit(const struct plan *p, struct cost_layout l, uint64_t device_bytes);

/* For GPU ranks (p as placed, device "cuda") with parallel.offload "none": the
 * lowest ZeRO stage, the plan's or above, at which offload "host" (the AdamW step
 * on the CPU, the optimizer state in host memory) makes every rank of l fit in
 * device_bytes; -1 when none does, when the ranks are not GPUs, the plan
 * offloads already or device_bytes is 0 (unknown). */
int layout_host_offload_to_fit(const struct plan *p, struct cost_layout l, uint64_t device_bytes);

/* What to change so that a layout that does not fit does: the cheapest ZeRO
 * stage that fits, with its memory beside the stage below it's ("parallel.zero
 * 2 fits with 61.00 GB of 80.00 per GPU; zero 1 needs 97.00"); when none does
 * (or dp is 1), on GPU ranks, parallel.offload "host" if it fits
 * (layout_host_offload_to_fit: 'parallel.offload "host" fits with 41.20 GB of
 * 80.00 per GPU (..., 48.00 GB, in host memory)'); and the other levers. One line. */
void layout_fit_advice(const struct plan *p, struct cost_layout l, uint64_t device_bytes, char *buf,
                       size_t n);

/* The layout of plan on these nodes, for plait check, plait train, plait
 * launch, the plugin and plait k8s alike: its own degrees, dp "auto" filling
 * the slots (a resumed run's, or a plan's with batch.global_batch: as many
 * replicas as keep that global batch, elastic_batch_dp), tp/pp "auto" by the cost model (every candidate is passed
 * to visit, if given, as it is evaluated; sequence parallelism takes tp > 1).
 * best gets the choice, evaluated (placed; it may still not fit: best->fits).
 * -1 with err when no layout can be placed. */
int layout_choose(const struct plan *p, const struct place_node *nodes, int n_nodes,
                  const struct layout_inputs *in,
                  void (*visit)(void *ctx, const struct layout_eval *candidate), void *ctx,
                  struct layout_eval *best, struct plait_error *err);

/* The dp of a plan whose tp and pp are fixed, on `slots` slots: its own, or
 * "auto": as many replicas of tp × cp × pp as the slots hold (a resumed run's, or
 * a plan's with batch.global_batch: as many as keep that global batch,
 * elastic_batch_dp); 0 when not one fits. The one count of dp layout_choose
 * and a launcher whose slots must all run (the Slurm plugin's step) share:
 * such a launcher refuses when the count leaves slots empty. */
int64_t layout_fixed_dp(const struct plan *p, int64_t slots, const struct ckpt_batch *resumed);

/* The sustained matmul rate the cost model assumes for a node's devices
 * (TFLOP/s): a calibrated share of the first GPU's dense datasheet peak in
 * this precision (common/place/gpu.h); a CPU rank whose machine was not measured:
 * 0.4, a guess (a measured one: layout_cpu_rank_links). */
double layout_device_tflops(const struct topo *t, enum plan_precision precision);

/* A node's CPUs: the hardware threads of its cores (at least one). */
int layout_node_cpus(const struct topo *t);

/* The CPUs one CPU rank of the map gets: its node's hardware threads divided
 * among the node's ranks (a share below 1 when ranks share cores, as
 * place_ranks then gives them), on the node where that is least; no more than
 * the OpenMP threads a rank runs (threads > 0). */
double layout_cpus_per_rank(const struct rank_map *m, const struct place_node *nodes, int threads);

/* A CPU rank's rates from its machine's measured ones per CPU, each times the
 * CPUs it gets: the products' (unless given_tflops: the caller's device_tflops
 * stands), the attention's, the layer ops' bandwidth and the parameter pass's
 * (links->device_memory_gbps). */
void layout_cpu_rank_links(const struct cost_cpu_rates *cpu, double cpus, bool given_tflops,
                           struct cost_links *links);

/* The same for one GPU model (spec NULL: a GPU plait does not know). */
double layout_gpu_tflops(const struct gpu_spec *spec, enum plan_precision precision);

/* The memory bandwidth of a node's GPUs (GB/s, the datasheet's), 0 when the
 * node has none or plait does not know them (the cost model then leaves the
 * optimizer's pass out, as for CPU ranks). */
double layout_device_memory_gbps(const struct topo *t);

/* The smallest device memory among the nodes (bytes), 0 when unknown. */
uint64_t layout_device_memory(const struct place_node *nodes, int n, double override_gb);
/* A rank's share of gpu_bytes: all of it, or 1/K of it where the map puts K ranks on one
 * GPU (PLAIT_RANKS_PER_GPU): every fit (layout_evaluate's, the ZeRO advice) compares a
 * rank's prediction with it, which is the prediction × K against the GPU. */
uint64_t layout_rank_device_memory(const struct rank_map *m, uint64_t gpu_bytes);

/* plait check's modelled tokens/s for the plan's layout ("auto" as 1) on this
 * machine, its ranks placed as plait train places them (topology discovered
 * with hwloc), CPU ranks at cpu's rates (NULL: not measured); 0 when it
 * cannot tell. */
double layout_modelled_tokens_per_s(const struct plan *p, const struct cost_cpu_rates *cpu);

#endif
