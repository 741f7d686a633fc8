/* plan.h — the training plan: one strict parser for plan.json, shared by the
 * CLI, the runtime, and (later) the SPANK plugin and the Kubernetes launcher.
 *
 * Strict means: an unknown key, a wrong JSON type or a value out of range is an
 * error that names the source, the line and the JSON path, e.g.
 *     plan.json:7: optimizer.lr: must be > 0 (got -3e-4)
 * Overrides (`--set optimizer.lr=1e-3`) are applied before validation and
 * errors in them name the override: `--set optimizer.lr=-1: optimizer.lr: ...`.
 *
 * Relative paths in a plan file are resolved against the plan file's directory;
 * relative paths given with --set against the current directory. The loaded
 * plan holds absolute paths and every default filled in; plan_to_json() writes
 * that resolved plan, which plan_load() reads back to an identical plan. */
#ifndef PLAIT_PLAN_H
#define PLAIT_PLAN_H

#include <stdbool.h>
#include <stdio.h>
#include <stdint.h>

#include "common/error.h"

enum plan_precision { PLAN_PRECISION_FP32, PLAN_PRECISION_BF16, PLAN_PRECISION_FP8 };
/* The largest model.vocab: 2^24. Token shards hold ids as uint16, or as uint32 for larger
 * vocabularies (llmc.h), and the model takes them as int32: the cap is not the format's but
 * a sanity bound, 64 times the largest published vocabulary (262,144), whose embedding at
 * hidden 4096 is already 256 GiB in fp32, so that a stray digit is refused by plait check
 * rather than found as a failed allocation. */
#define PLAN_VOCAB_MAX (1 << 24)

#define PLAN_PRECISIONS 3 /* how many: the one list the parser, the plugin's policy and help use   \
                           */
/* fp8's scaling (kernels/fp8.h); NONE (null in plan.json) unless precision is fp8 */
enum plan_fp8_scaling { PLAN_FP8_NONE = -1, PLAN_FP8_TENSOR, PLAN_FP8_BLOCK };
enum plan_recompute { PLAN_RECOMPUTE_NONE, PLAN_RECOMPUTE_SELECTIVE, PLAN_RECOMPUTE_FULL };
/* the learning rate after warmup (common/plan/lr_schedule.h says each exactly) */
enum plan_schedule {
    PLAN_SCHEDULE_CONSTANT,
    PLAN_SCHEDULE_COSINE,
    PLAN_SCHEDULE_LINEAR,
    PLAN_SCHEDULE_WSD /* warmup, stable, decay */
};
enum plan_device { PLAN_DEVICE_AUTO, PLAN_DEVICE_CPU, PLAN_DEVICE_CUDA };
/* the pipeline schedule (order as common/place/schedule.h's enum sched_kind) */
enum plan_pipeline {
    PLAN_PIPE_1F1B,
    PLAN_PIPE_GPIPE,
    PLAN_PIPE_INTERLEAVED,
    PLAN_PIPE_ZB_H1,
    PLAN_PIPE_DUALPIPEV
};
enum plan_backend { PLAN_BACKEND_AUTO, PLAN_BACKEND_SOCKET, PLAN_BACKEND_NCCL };
/* Where the optimizer's state lives: beside the weights, in host memory (a GPU rank's;
 * a CPU rank's is already), or in files streamed through a window (runtime/offload.h). */
enum plan_offload { PLAN_OFFLOAD_NONE, PLAN_OFFLOAD_HOST, PLAN_OFFLOAD_NVME };

/* model.moe: an MoE block (a router and E experts, each the arch's MLP) in place
 * of the MLP in layers i with i % every == every - 1. Absent (given false):
 * none, and the fields below their defaults. */
/* model.moe.experts' bound (a checkpoint's state holds the routing statistics of each) */
#define PLAN_MOE_EXPERTS_MAX 512
struct plan_moe {
    bool given;             /* the plan has model.moe */
    int experts;            /* E >= 2 */
    int top_k;              /* k, 1..E: the experts a token goes to */
    int every;              /* an MoE block every `every` layers (default 1: all) */
    int shared_experts;     /* S dense experts every token also passes (gate 1), default 0 */
    double capacity_factor; /* 0: no dropping; else an expert takes at most
                               ceil(capacity_factor·k·N/E) of a micro-batch's N tokens */
    double aux_loss;        /* the load-balancing loss's coefficient, default 0.01 */
    double router_z_loss;   /* the router z-loss's coefficient, default 0 */
    int ffn_hidden;         /* each expert's MLP width (required) */
};

struct plan_model {
    char *arch;       /* "gpt2" or "llama" (transformers' LlamaForCausalLM) */
    int layers;       /* L */
    int heads;        /* NH; hidden % heads == 0 */
    int hidden;       /* C */
    int vocab;        /* V, 1..PLAN_VOCAB_MAX */
    int padded_vocab; /* Vp >= V; default: V rounded up to a multiple of 128 */
    int seq_len;      /* T, the training sequence length */
    int max_seq_len;  /* rows of the position table, >= T; default T */
    uint64_t seed;
    char *init; /* NULL, or an llm.c GPT-2 checkpoint (absolute path) */
    /* llama only (refused for gpt2, whose values are fixed: kv_heads = heads,
     * ffn_hidden = 4·hidden, LayerNorm with eps 1e-5, learned positions): */
    int kv_heads;        /* key/value heads, grouped-query attention; default heads */
    int ffn_hidden;      /* the SwiGLU MLP's hidden width (required) */
    double rope_theta;   /* rotary positions' base, default 10000 */
    double norm_eps;     /* RMSNorm's epsilon, default 1e-5 */
    bool tie_embeddings; /* the LM head is wte (gpt2: always; llama: default false) */
    struct plan_moe moe; /* mixture of experts; moe.given false: a dense model */
};

/* Whether the plan's model is a Llama (model.arch "llama"). */
bool plan_model_is_llama(const struct plan_model *m);

struct plan_data {
    char *train; /* a file or a glob of llm.c token shards (absolute) */
    char *val;   /* NULL, or the same for validation */
    bool shuffle;
    int val_every;   /* evaluate every N steps (0 = only at the end); needs val */
    int val_batches; /* micro-batches per evaluation */
    char *tokenizer; /* NULL, or an llm.c tokenizer file for printing samples */
};

struct plan_batch {
    int micro_batch;  /* B, sequences per micro-batch */
    int grad_accum;   /* micro-batches per optimizer step */
    int global_batch; /* sequences per step over every replica; 0: micro_batch × grad_accum ×
                         dp. Given, grad_accum is derived from it and dp (elastic_batch.h) */
};

struct plan_optimizer {
    double lr, beta1, beta2, eps, weight_decay;
    double grad_clip; /* 0 = no clipping */
    int warmup_steps;
    enum plan_schedule schedule;
    double min_lr_ratio;
    int decay_steps;       /* the step the decay ends at (lr·min_lr_ratio from there); 0: steps */
    double decay_fraction; /* wsd: the share of the steps between warmup and decay_steps that
                              decay */
};

struct plan_checkpoint {
    char *dir; /* absolute, or relative to the run directory */
    int every; /* steps between checkpoints; 0 = by time (every_minutes) and at the end */
    double every_minutes; /* with every 0: minutes between checkpoints (rank 0's clock);
                             0 = only at the end */
    int keep;             /* complete checkpoints kept, newest first */
    int max_restarts;     /* times a launcher restarts the gang after a lost rank */
    bool async;           /* the step pauses only to copy its part to host memory; a
                             thread writes, fsyncs and commits */
};

/* tp, pp, dp: a degree ≥ 1, or PLAN_AUTO ("auto" in plan.json): dp fills the
 * allocation, tp and pp are chosen by the cost model (plait check explains). */
#define PLAN_AUTO 0
/* The most ranks a plan may ask for (tp × pp × dp): far beyond any cluster,
 * small enough that every count derived from it fits an int. */
#define PLAN_MAX_RANKS (1 << 24)

/* An explicit split of the layers over the pipeline stages (parallel.stage_layers). */
#define PLAN_MAX_STAGES 256
struct plan_ints {
    int n; /* 0: not given */
    int v[PLAN_MAX_STAGES];
};

struct plan_parallel {
    int tp, pp, dp;
    /* context parallelism: each sequence split over cp ranks (2·cp chunks, rank i taking
     * chunks i and 2·cp−1−i), attention as a ring; world = tp·cp·pp·dp, the cp ranks
     * next to tp in the rank order (rank_order.h), gradients averaged over dp·cp */
    int cp;
    /* hybrid sharding (HSDP): dp = dp_shard × dp_replicate, ZeRO's slices over each group of
     * dp_shard ranks, the groups replicas of each other; PLAN_AUTO ("auto"): from the other
     * and dp (both: dp_shard = dp, dp_replicate = 1). plan_dp_shard resolves them. */
    int dp_shard, dp_replicate;
    /* expert parallelism: each MoE layer's experts spread over ep ranks, E/ep a rank; ep
     * divides dp·cp and is an inner factor of the dp coordinate with cp folded in
     * (rank_dp_fold), as hybrid sharding's shard rank is: an ep group is ep consecutive
     * folded dp ranks, ep_rank = dp_rank % ep */
    int ep;
    bool allow_tp_over_pcie;    /* let a tp group span NVLink domains of one node */
    int zero;                   /* ZeRO stage 0..3: what data parallelism shards */
    bool reshard_after_forward; /* ZeRO 3: a unit is gathered again for its backward (and
                                   each micro-batch); false: kept gathered until the step's end */
    enum plan_device device;
    enum plan_pipeline schedule;
    int virtual_stages;            /* model chunks per pipeline stage (interleaved: >= 2; else 1) */
    struct plan_ints stage_layers; /* layers of each stage (n = pp), or none: the cost
                                      model's balanced split (common/place/cost.h) */
    bool sequence_parallel;        /* tp > 1 only */
    double bucket_mb;              /* data-parallel gradient bucket */
    double timeout_s;              /* every wait's deadline (collectives, the store, peers) */
    enum plan_backend backend;
    enum plan_offload offload; /* where the AdamW moments live */
    char *offload_dir;         /* nvme: the directory of each rank's files (rank-N/) */
    double offload_window_mb;  /* nvme: each moment's window in memory, MiB */
};

struct plan_sample {
    int tokens;         /* tokens to sample before and after training; 0 = none */
    double temperature; /* > 0 */
    int top_k;          /* 0 = whole vocabulary */
    char *prompt;       /* text (byte vocab / tokenizer) that starts each sample */
    uint64_t seed;
};

/* what a run reports, besides metrics.jsonl and its console */
struct plan_train {
    char *tensorboard; /* NULL, or a directory (relative: to the run directory) for
                          TensorBoard event files (common/formats/tensorboard.h) */
    int log_every;     /* rank 0's progress line every N steps, or PLAN_AUTO ("auto"): about one a
                          second (runtime/report.c's report_progress says which steps) */
};

struct plan {
    char *source; /* where it came from, for messages ("examples/plans/x.json") */
    struct plan_model model;
    struct plan_data data;
    struct plan_batch batch;
    struct plan_optimizer optimizer;
    int steps;
    enum plan_precision precision;
    enum plan_fp8_scaling fp8_scaling; /* precision fp8: "tensor" (default) or "block" */
    enum plan_recompute recompute;
    double logits_chunk_mb; /* the most MiB of logits the last stage computes at once, its head's
                               backward then run chunk by chunk in the forward (0: whole) */
    struct plan_checkpoint checkpoint;
    struct plan_parallel parallel;
    struct plan_sample sample;
    struct plan_train train;
};

/* Every field of a plan, one line each: its dotted path, type and range or names, default,
 * whether it is required and whether it may change on resume (plait help plan). */
void plan_fields_print(FILE *out);

/* Loads, applies overrides ("dot.path=value"; the value is JSON if it parses
 * as JSON, otherwise a string) and validates. Returns NULL and fills err. */
struct plan *plan_load(const char *path, const char *const *overrides, int n_overrides,
                       struct plait_error *err);

/* The same from text; base_dir resolves relative paths (NULL = current dir). */
struct plan *plan_load_text(const char *text, const char *source, const char *base_dir,
                            const char *const *overrides, int n_overrides, struct plait_error *err);

void plan_free(struct plan *plan);

/* The resolved plan as JSON text (every field, defaults filled, absolute
 * paths); malloc'ed. */
char *plan_to_json(const struct plan *plan);

/* The same on one line (for an environment variable); malloc'ed. */
char *plan_to_json_line(const struct plan *plan);

/* One field that differs between two plans, its values as plan_to_json writes
 * them (shortened to fit). may_change: the field may differ when a run resumes
 * (steps, checkpoint cadence, evaluation and sampling, recompute, device);
 * any other difference means another run. */
struct plan_change {
    char path[64];
    char before[128], after[128];
    bool may_change;
};

/* Compares every field of two loaded plans (source excluded); fills out[0..max)
 * in schema order and returns how many fields differ (possibly more than max). */
int plan_diff(const struct plan *before, const struct plan *after, struct plan_change *out,
              int max);

/* Whether a run of `before` may go on under `after`: 0 when every field that
 * differs may change (described into notes, "" when none differ); -1 with err
 * listing the fields that may not ("optimizer.lr 0.002 -> 0.001, ...").
 * batch.grad_accum may change when parallel.dp does so that the global batch
 * (micro_batch × grad_accum × dp) stays: the steps read the same data. */
int plan_resumable(const struct plan *before, const struct plan *after, char *notes,
                   size_t notes_bytes, struct plait_error *err);

/* tp × cp × pp × dp when all are fixed, else 0 ("auto" is decided at launch).
 * A loaded plan keeps it within PLAN_MAX_RANKS. */
int64_t plan_ranks(const struct plan *plan);

/* The ranks of a shard group (ZeRO's slices, HSDP) when the data-parallel
 * degree is dp: parallel.dp_shard, or dp / parallel.dp_replicate, or dp. */
int plan_dp_shard(const struct plan_parallel *par, int dp);

/* The ranks ZeRO slices a rank's part over, of a shard group of `shard` ranks (dp_shard,
 * with cp folded in): all of them, or with expert parallelism at ZeRO >= 1 the expert
 * peers among them (shard / ep), the ranks holding the same routed experts, so that
 * one contiguous slice of the part is the same tensors on every rank it is sliced over.
 * The ep ranks of a group hold the same dense slice then: the replicas of its dense part. */
int plan_zero_slices(const struct plan_parallel *par, int shard);

/* Names of the enums, as they are spelled in plan.json. */
const char *plan_precision_name(enum plan_precision p);
/* The precision named `name` ("fp32", "bf16", "fp8"), or -1 when none is. */
int plan_precision_parse(const char *name, enum plan_precision *out);
const char *plan_fp8_scaling_name(enum plan_fp8_scaling s); /* "none" for PLAN_FP8_NONE */
const char *plan_recompute_name(enum plan_recompute r);
const char *plan_schedule_name(enum plan_schedule s);
const char *plan_device_name(enum plan_device d);
const char *plan_pipeline_name(enum plan_pipeline s);
const char *plan_backend_name(enum plan_backend b);
const char *plan_offload_name(enum plan_offload o);

#endif
