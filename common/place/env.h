/* env.h — the env contract: every variable that passes from a launcher (plait
 * train, the SPANK plugin, plait launch in a pod) to the runtime plait-train.
 * It is the only interface between the two halves; the README documents it. */
#ifndef PLAIT_ENV_H
#define PLAIT_ENV_H

#include <stdbool.h>

#include "common/error.h"

/* Path of the resolved plan (plan_to_json output) the runtime must train. */
#define PLAIT_ENV_PLAN "PLAIT_PLAN"
/* Or the resolved plan itself, when no file is shared (set by the Slurm plugin). */
#define PLAIT_ENV_PLAN_JSON "PLAIT_PLAN_JSON"
/* The run directory: metrics, run.json, checkpoints (unless absolute). */
#define PLAIT_ENV_RUN_DIR "PLAIT_RUN_DIR"
/* This rank and the number of ranks (1 until 3D parallelism lands). */
#define PLAIT_ENV_RANK "PLAIT_RANK"
#define PLAIT_ENV_WORLD_SIZE "PLAIT_WORLD_SIZE"
/* Where this rank sits (place.h computes them all; launchers export them). */
#define PLAIT_ENV_LOCAL_RANK "PLAIT_LOCAL_RANK"             /* among its node's ranks */
#define PLAIT_ENV_LOCAL_WORLD_SIZE "PLAIT_LOCAL_WORLD_SIZE" /* ranks on its node */
#define PLAIT_ENV_NODE_RANK "PLAIT_NODE_RANK"               /* its node, in allocation order */
#define PLAIT_ENV_NODES "PLAIT_NODES"                       /* nodes of the job */
#define PLAIT_ENV_TP "PLAIT_TP"                             /* the layout's degrees */
#define PLAIT_ENV_PP "PLAIT_PP"
#define PLAIT_ENV_DP "PLAIT_DP"
#define PLAIT_ENV_CP "PLAIT_CP"           /* context parallelism (optional: 1) */
#define PLAIT_ENV_TP_RANK "PLAIT_TP_RANK" /* its coordinates */
#define PLAIT_ENV_PP_RANK "PLAIT_PP_RANK"
#define PLAIT_ENV_DP_RANK "PLAIT_DP_RANK"
#define PLAIT_ENV_CP_RANK "PLAIT_CP_RANK"     /* optional: 0 */
#define PLAIT_ENV_DEVICE "PLAIT_DEVICE"       /* CUDA index (PCI bus order), or "cpu" */
#define PLAIT_ENV_GPU_BUSID "PLAIT_GPU_BUSID" /* its GPU's PCI bus id */
#define PLAIT_ENV_NIC "PLAIT_NIC"             /* its network adapter ("mlx5_3") */
#define PLAIT_ENV_CPUS "PLAIT_CPUS"           /* the CPUs it binds to, a Linux CPU list */
#define PLAIT_ENV_NUMA "PLAIT_NUMA"           /* its NUMA node, -1 unknown */
/* The user's: how many ranks share each GPU, 1 to ENV_MAX_RANKS_PER_GPU (default 1), for
 * plait train and plait check on one machine (env_ranks_per_gpu reads it there, and
 * nothing else does): each GPU counts as that many slots, ranks r·K … r·K+K−1 of the
 * node's GPU slots on GPU r, each its own process and CUDA context, talking through
 * parallel.backend "socket" (NCCL takes one rank per GPU). */
#define PLAIT_ENV_RANKS_PER_GPU "PLAIT_RANKS_PER_GPU"
/* The contract's: the K a GPU rank's placement used, set only when above 1 (absent: 1),
 * the same on every rank of the job, so that all of them choose one collectives' backend. */
#define PLAIT_ENV_GPU_SHARED_BY "PLAIT_GPU_SHARED_BY"
#define ENV_MAX_RANKS_PER_GPU 64
/* How many times the job has been restarted (Slurm requeue, pod restart). */
#define PLAIT_ENV_RESTART_COUNT "PLAIT_RESTART_COUNT"
/* Set to 1 by `plait train --fresh`: the run directory's checkpoints, metrics
 * and plan are removed before training starts from scratch. */
#define PLAIT_ENV_FRESH "PLAIT_FRESH"
/* Optional: GFLOP/s the device can do, instead of measuring it at start-up
 * (the denominator of the "% of peak" in the progress line). */
#define PLAIT_ENV_PEAK_GFLOPS "PLAIT_PEAK_GFLOPS"
/* Set to 1: print where the step time went (per phase) at the end of a run. */
#define PLAIT_ENV_PROFILE "PLAIT_PROFILE"
/* Rank 0's console: "json" (one JSON object per step on stdout, as
 * metrics.jsonl), "quiet" (only errors and the final summary); unset: progress
 * lines. plait train --json / --quiet set it. */
#define PLAIT_ENV_CONSOLE "PLAIT_CONSOLE"
/* Developer: write the logits of step 1's first micro-batch and all gradients
 * of step 1 (before clipping) as raw float32 into this directory; a resumed
 * run dumps the first step it takes instead (not one resumed mid-step). */
#define PLAIT_ENV_DUMP_STEP1 "PLAIT_DUMP_STEP1"

/* Developer fault injection: after this many micro-batches (counted from the
 * start of this process), plait-train sends itself SIGTERM, so that tests can
 * stop it at an exact point through the real signal path; "RANK:N": only
 * global rank RANK does (a signal that reaches one rank). */
#define PLAIT_ENV_DEBUG_SIGNAL_AFTER_MICRO "PLAIT_DEBUG_SIGNAL_AFTER_MICRO"
/* Developer fault injection: "RANK:MS", global rank RANK takes MS ms longer
 * to read each micro-batch (a slow file system), so that tests see the
 * straggler report name it. */
#define PLAIT_ENV_DEBUG_SLOW_RANK "PLAIT_DEBUG_SLOW_RANK"
/* Developer: "1" makes the pipeline link of CPU ranks work as it does on nccl
 * (runtime/parallel.c: a communicator per direction between two stages, sends
 * posted without waiting), so that path runs in tests without a GPU. */
#define PLAIT_ENV_DEBUG_NCCL_LINK "PLAIT_DEBUG_NCCL_LINK"
/* Developer: "1" stops ZeRO 3 from starting a unit's gather before the pass
 * reaches it (runtime/model_zero3.h), so that make bench shows what the
 * prefetch hides. */
#define PLAIT_ENV_DEBUG_NO_PREFETCH "PLAIT_DEBUG_NO_PREFETCH"

/* Developer: "1" makes context parallelism's ring wait for each key/value
 * block (and gradient) to arrive before working on the one at hand
 * (runtime/ring_attention.c), so that make bench shows what the overlap hides. */
#define PLAIT_ENV_DEBUG_NO_RING_OVERLAP "PLAIT_DEBUG_NO_RING_OVERLAP"

/* Developer: "1" runs each pair of DualPipeV's main steps one pass after the other, each
 * all-to-all of the experts waited for as it starts (runtime/lanes.h), so that tests
 * compare the bits and make bench shows what the two lanes hide. */
#define PLAIT_ENV_DEBUG_NO_MOE_OVERLAP "PLAIT_DEBUG_NO_MOE_OVERLAP"

/* Developer: "1" makes a CPU rank with parallel.offload take a GPU rank's step on the CPU
 * (runtime/host_step.h: its state in separate host memory, the copy thread moving the
 * gradient and weights through the backend's download and upload), so that path runs in
 * tests without a GPU. */
#define PLAIT_ENV_DEBUG_HOST_STEP "PLAIT_DEBUG_HOST_STEP"

/* Developer: "1" keeps a bf16 run's activations in fp32 where the model would keep its
 * products' inputs in bf16 (common/gpt2/gpt2_memory.h gpt2_act16), so that tests compare
 * the two to the bit. */
#define PLAIT_ENV_DEBUG_ACTIVATIONS_F32 "PLAIT_DEBUG_ACTIVATIONS_F32"

/* Developer: "1" keeps an offloaded step's whole gradient for the step (runtime/host_step.h:
 * none of it brought down during the last backward or as its buckets' sums arrive), so that
 * tests compare the bits with the overlap and without. */
#define PLAIT_ENV_DEBUG_NO_OFFLOAD_OVERLAP "PLAIT_DEBUG_NO_OFFLOAD_OVERLAP"

/* The rendezvous store (store.h) that rank 0's launcher hosts: where it is,
 * "host:port" with an IPv6 literal in brackets ("[fd00::7]:29500";
 * store_addr_parse reads it), and the per-job secret every client proves it
 * knows (64 hex digits from store_secret_generate). The secret is as private
 * as the job's environment: readable by the job's user and root only. */
#define PLAIT_ENV_STORE_ADDR "PLAIT_STORE_ADDR"
#define PLAIT_ENV_STORE_SECRET "PLAIT_STORE_SECRET"

/* Exit codes of plait-train (and plait train, which passes them on). */
enum plait_exit {
    PLAIT_EXIT_OK = 0,
    PLAIT_EXIT_ERROR = 1,      /* bad input or a failure; the message says which */
    PLAIT_EXIT_USAGE = 2,      /* bad command line */
    PLAIT_EXIT_PREEMPTED = 75, /* stopped by SIGTERM/SIGUSR1/SIGINT/SIGHUP after
                                  writing a checkpoint: resumable (EX_TEMPFAIL) */
    PLAIT_EXIT_RESTART = 76,   /* a peer was lost (a rank died, a pod never came, a
                                  node is gone): nothing of this process is wrong;
                                  restart the whole gang from the newest checkpoint */
    PLAIT_EXIT_SKIPPED = 77    /* plait-train --selftest: no GPU here (or no CUDA
                                  backend in this build); nothing was checked */
};

/* ---- reading the contract (the runtime's side; common/place/place.c writes it) --- */

/* Where one rank sits, as the launcher said. Without PLAIT_RANK in the
 * environment: one rank, 1 × 1 × 1 (plait-train run by hand). */
struct env_rank {
    int rank, world;             /* global rank, ranks in all */
    int local_rank, local_world; /* among its node's ranks */
    int node_rank, nodes;        /* its node, of how many */
    int tp, pp, dp, cp;          /* the layout (dp: the data-parallel replicas, cp not in it) */
    int tp_rank, pp_rank, dp_rank,
        cp_rank; /* its coordinates (rank = tp_rank + tp·(cp_rank + cp·(dp_rank + dp·pp_rank)),
                    rank_order.h); with hybrid sharding the runtime splits dp_rank into a
                    shard rank and a replica by the plan's parallel.dp_shard: no variable */
    int device;  /* CUDA index, or -1 for a CPU rank */
    int ranks_per_gpu; /* ranks sharing each GPU of the job (PLAIT_GPU_SHARED_BY; 1: none) */
    int restart_count;
    char store_addr[320]; /* "" when the job has one rank and no store */
    char store_secret[260];
};

/* Reads and checks the contract: numbers in range, world = tp·cp·pp·dp, the
 * coordinates those of rank in Megatron order, a store for more than one
 * rank. -1 with err naming the variable. */
int env_rank_read(struct env_rank *out, struct plait_error *err);

/* PLAIT_RANKS_PER_GPU into *k: 1 when unset; -1 with err naming the variable and its
 * value when it is not an integer in [1, ENV_MAX_RANKS_PER_GPU]. The one reader of it
 * (plait train and plait check on this machine). */
int env_ranks_per_gpu(int *k, struct plait_error *err);

#endif
