/* model.h — a GPT-2 or a Llama on one device (common/gpt2/gpt2_layout.h says
 * how a Llama fills the same tensors): its parameters, gradients and AdamW state,
 * the activations one micro-batch keeps for backward (fewer with recompute),
 * and the forward and backward passes written against kernels/ops.h. */
#ifndef PLAIT_RUNTIME_MODEL_H
#define PLAIT_RUNTIME_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "common/plan/plan.h"
#include "common/gpt2/gpt2_memory.h"
#include "common/gpt2/gpt2_shard.h"
#include "kernels/ops.h"
#include "runtime/group.h"
#include "runtime/gpt2.h"
#include "runtime/offload.h"
#include "runtime/profile.h"

struct zero3;
struct lanes; /* runtime/lanes.h */

/* Device bytes by kind (common/gpt2/gpt2_memory.h says what each counts). */
struct model_bytes {
    uint64_t params, grads, optimizer, activations;
};

/* An activation in its dtype: fp32, or bf16 where the model keeps its products' inputs in
 * bf16 (gpt2_act16: kernels/ops.h's bf16 activations); the other pointer NULL. */
struct act {
    float *f32;
    uint16_t *bf16;
};

static inline struct act act_f32(float *p)
{
    return (struct act){.f32 = p};
}

/* a's elements from element i on */
static inline struct act act_at(struct act a, size_t i)
{
    return (struct act){.f32 = a.f32 ? a.f32 + i : NULL, .bf16 = a.bf16 ? a.bf16 + i : NULL};
}

/* What one layer's forward leaves for its backward. With recompute, some of
 * these point at one shared scratch buffer and backward recomputes them.
 * R is the rows of the residual stream this rank holds: N, or with sequence
 * parallelism its block of N/tp rows (rows [tp_rank·R, (tp_rank+1)·R)). */
struct layer_acts {
    struct act ln1;             /* (R,C) */
    float *ln1_mean, *ln1_rstd; /* (R), (R); no mean in a Llama's RMSNorm */
    float *qkv;                 /* (N,3C/tp) this rank's heads of q, k, v (a Llama's
                                   rotated, its key/value heads repeated per query head) */
    float *atty;                /* (N,C/tp) attention output before projection */
    float *att;                 /* (B,NH/tp,T,T) softmax probabilities */
    float *res2;                /* (R,C) residual after attention */
    struct act ln2;             /* (R,C) */
    float *ln2_mean, *ln2_rstd; /* (R), (R) */
    float *fch;                 /* (N,4C/tp) column shard; a Llama's (N,2F/tp) gate and up */
    struct act fch_gelu;        /* (N,4C/tp); a Llama's (N,F/tp) SwiGLU of fch */
    float *res3;                /* (R,C) the layer's output */
    /* split backward only: the gradients of the four products' outputs (all N
     * rows), left by the input-gradient pass for the weight-gradient pass */
    float *g_fcproj, *g_fc;   /* (N,C), (N,4C/tp) */
    float *g_attproj, *g_qkv; /* (N,C), (N,QKV/tp): the packed product's */
};

/* What an MoE layer's forward leaves for its backward (runtime/model_moe.c;
 * gpt2_memory.h's GPT2_ACT_MOE_*, E experts, k choices, M ≤ kN packed rows). */
struct moe_acts {
    float *probs, *gate, *lse; /* (N,E), (N,k), (N) */
    int32_t *choice, *pos;     /* (N,k) the chosen experts, each choice's packed row (-1 dropped) */
    int32_t *rows;             /* (M) each packed row's token */
    int32_t *counts;           /* (2E) each expert's packed rows, then its choices (routed;
                                  cp > 1: the micro-batch's, every cp rank's); ep > 1 (3E):
                                  then the rows each ep rank sent each local expert, by
                                  source rank */
    float *x, *h, *act, *y;    /* (M,C), (M,FCm), (M,Fm), (M,C): the experts' rows */
    float *sh_h, *sh_act;      /* (S,N,FCm), (S,N,Fm): the shared experts' */
    int kept;                  /* M */
    double losses[2];          /* the balance loss and the z-loss of this forward */
    int32_t *routed_host;      /* (E) host: this forward's choices per expert */
};

/* One micro-batch's activations on this stage: what its forward leaves for
 * its backward. A pipeline stage holds several at once (the schedule says how
 * many); without a pipeline there is one. With model chunks (interleaved
 * schedules) a slot holds one micro-batch through one chunk. */
struct model_slot {
    int chunk;                  /* the chunk it runs through (0 .. chunks-1): set before
                                   its forward, kept until its backward */
    struct layer_acts *layer;   /* [n_layers: one chunk's] */
    struct moe_acts *moe;       /* [n_moe: the MoE layers of a chunk, in order] */
    float grad_scale;           /* its forward's (the MoE losses' gradients are scaled by it) */
    float *input;               /* (R,C) the chunk's input: the embedding on the first
                                   stage's chunk 0, the activation received on the others */
    int32_t *tokens, *targets;  /* (N) first stage: its tokens; last stage: the targets */
    struct act lnf;             /* (R,C) last stage (its last chunk) */
    float *lnf_mean, *lnf_rstd; /* (R), (R) */
    float *logits;              /* (N,Vp/tp) last stage; turned into dlogits by the loss;
                                   with logits_rows, (logits_rows,Vp/tp) every slot shares */
    float *dlnf;  /* (N,C) logits_rows only: the head's input gradient, from the forward */
    float *dhead; /* (Vp/tp,C) logits_rows only: the head's weight gradient, from the forward */
};

struct model {
    struct gpt2_config cfg;  /* the whole model's dimensions */
    struct gpt2_shard shard; /* what this rank holds, and where (layer-major) */
    struct group tp;         /* its tensor-parallel group */
    bool sp;                 /* Megatron sequence parallelism over tp (tp > 1 only) */
    int Cl, NHl;             /* channels and heads of this rank's attention: C/tp, NH/tp */
    int KVl, hs;             /* its key/value heads KV/tp, the head size C/NH */
    int QKVl, FCl, Fl;       /* its widths of the QKV product's output ((NH+2KV)·hs/tp), the MLP's
                                first product's (4C/tp; a Llama's 2F/tp) and second's input
                                (4C/tp; F/tp) */
    enum gpt2_tensor head;   /* the LM head's weight: wte (tied) or lmhead */
    int v0, Vpl, nv;         /* its vocabulary shard: entries [v0, v0+Vpl), nv of them real */
    int logits_rows;         /* last stage: rows of logits computed at once, the head's
                                gradients then made in the forward (gpt2_logits_rows); 0: a
                                micro-batch's whole, kept as dlogits for its backward */
    float *logits_out;       /* (N,Vp/tp) or NULL: where a forward without targets leaves its
                                logits (the developer's dump of step 1) */
    int chunks, n_layers;    /* its pipeline stage's model chunks (1 but interleaved) and the
                                layers of each (shard.part says which) */
    bool first, last;        /* the first stage embeds (in chunk 0), the last computes the
                                loss (in its last chunk) */
    const struct ops *ops;
    struct ops_ctx *ctx; /* ops' context (the caller's: it outlives the model) */
    int B, T;            /* the largest micro-batch the buffers hold */
    enum plan_precision precision;
    enum fp8_scaling fp8_scaling; /* precision fp8: how its products scale (kernels/fp8.h) */
    bool attention_bf16; /* attention on the backend's bf16 tensor cores (bf16, fp8 runs) */
    enum plan_recompute recompute;
    bool split_backward; /* the slots keep the products' output gradients */

    /* flat buffers in the shard's order (device memory); params and grads are
     * padded with zeros to a multiple of dp (n_padded) so they split evenly */
    float *params, *grads;
    uint16_t *params16; /* bf16 copy of params, bf16 precision only */
    uint16_t *wte16;    /* fp8 precision, last stage: the bf16 copy of its wte shard
                           (Vp/tp, C), the tied LM head's weight: the head runs in bf16
                           (DeepSeek-V3 keeps its output head out of fp8), as bf16 runs
                           run it, not in fp32 */
    uint8_t *params8;   /* fp8 precision only: the E4M3 copy of each held layer's four
                           product weights (qkvw, attprojw, fcw, fcprojw, each (OC,C) as
                           its product takes it), layer block after layer block */
    float *scales8;     /* their scales (kernels/fp8.h), in the same order: one per
                           matrix, or per 128×128 block (fp8_weight_tile) */
    size_t fp8_at[4], fp8_scale_at[4], fp8_layer_elems, fp8_layer_scales; /* where the
                                 copy of matrix k of a layer block starts, and a block's size */
    size_t n_padded;          /* shard.total rounded up to a multiple of dp */
    int dp, dp_rank, zero;    /* the data-parallel group holding this part (with hybrid
                                 sharding its shard group), the ZeRO stage */
    int replicas, replica;    /* the shard group's replicas (HSDP's dp_replicate; 1: none):
                                 dp × replicas ranks hold this part; and this rank's */
    size_t slice_at, slice_n; /* the optimizer's slice of the buffer: all of it (ZeRO 0) or
                                 this dp rank's n_padded/dp elements */
    float *adam_m, *adam_v;   /* (slice_n) AdamW moments of the slice; NULL offloaded */
    /* ZeRO 3 (runtime/model_zero3.h): params is the slice alone (slice_n; element i is the
       buffer's slice_at + i), grads NULL; the units a pass uses are gathered into the
       parameter windows (z3), their gradients reduce-scattered out of the gradient
       windows (z3g), each rank's part into the window's staging, then added into
       grad_slice (slice_tmp is NULL). NULL below ZeRO 3. */
    struct zero3 *z3, *z3g;
    uint16_t *slice16; /* (slice_n) bf16: the slice's bf16 copy (AdamW writes it), which the
                          layers are gathered from in bf16 (runtime/model_zero3.c) */
    float **z3_pwin;   /* [z3_n_pwin] the parameter windows (mem.zero3_params' sizes) */
    uint16_t **win16;  /* [z3_n_pwin] bf16: each parameter window's copy */
    int *z3_block8;    /* [z3_n_pwin] fp8: each window's block of params8 (the layer windows'; -1
                          for the others) */
    int z3_n_pwin;
    float *z3_gwin[GPT2_ZERO3_GRAD_WINDOWS];  /* the gradient windows (mem.zero3_grads') */
    float *z3_stage[GPT2_ZERO3_GRAD_WINDOWS]; /* each one's staging: this rank's part of its sum */
    int z3_pending[GPT2_ZERO3_GRAD_WINDOWS];  /* units whose gradients scatter, oldest first */
    int z3_n_pending;
    bool z3_keep;            /* parallel.reshard_after_forward false: a unit gathered stays until
                                the step's end (mz3_drop_all) */
    bool z3_no_prefetch;     /* gather each unit only when the pass reaches it (a benchmark's) */
    struct offload *offload; /* nvme offload: the moments in files (runtime/offload.h); a
                                GPU rank's host_step: in its host memory or in files */
    struct host_step *host_step; /* a GPU rank's offload: the optimizer step on the CPU
                                    (runtime/host_step.h); NULL without */
    float *grad_slice;           /* (slice_n) ZeRO >= 1: the slice's gradient summed over dp
                                    (ZeRO 2 and 3: accumulated over the step's micro-batches) */
    float *slice_tmp;            /* (slice_n) ZeRO >= 1: staging for the slice's collectives */

    int n_slots;
    struct model_slot *slots; /* [n_slots] */
    float *proj;              /* (N,C) scratch: output of the two projections */
    float *qkv_packed;        /* (N,QKV/tp) scratch, grouped-query only: the product's q, k, v
                                 before the key/value heads are repeated, then their gradient */
    float *dff;               /* (N,F/tp) scratch, a Llama's: the SwiGLU output's gradient */
    float *whole;             /* (N,C) scratch, sequence parallel only: the rows gathered from
                                 the tp group (a LayerNorm's output, the residual gradient),
                                 or the R rows a reduce-scatter leaves */
    float *losses;            /* (N) */
    float *ce_stats;          /* (3N) row max, Σexp, target logit (tp > 1) */
    uint16_t *dlogits16;      /* (logits_rows,Vp/tp) bf16: a chunk's dlogits, with bf16
                                 activations (gpt2_act16); else NULL */

    /* backward scratch */
    float *grad_in; /* (R,C) the next stage's input gradient, received by the pipeline
                       (gpt2_memory.h: GRAD_IN); NULL where none comes */
    float *dres;    /* (R,C) gradient of the residual stream; after a stage's backward, of its
                       input */
    float *dC;      /* (N,C) */
    float *d3C;     /* (N,3C/tp) */
    float *d4C;     /* (N,4C/tp) */
    float *datt;    /* (B,NH/tp,T,T) */

    /* context parallelism (runtime/ring_attention.h): this rank's T tokens are two chunks
     * of a sequence cp·T long; cp 1: none, the buffers NULL */
    int cp, cp_rank;
    const struct group *cp_group; /* the ring (cp ranks), outliving the model */
    float *cp_ring;               /* (5,N,2C/tp) key/value blocks and their gradients */
    float *cp_scores;             /* (B,NH/tp,T,2T+hs+2) one block's scratch
                                     (kernels/ops.h ATTENTION_BLOCK_SCRATCH) */
    int32_t *cp_pos;              /* (cp,T) every cp rank's positions of its tokens */
    bool cp_serial;               /* each shift waited for as it starts (a benchmark's) */

    /* mixture of experts (runtime/model_moe.h): the most MoE layers a chunk holds, the
     * scratch of gpt2_memory.h's GPT2_ACT_MOE_* and what the losses and metrics take */
    int n_moe;
    float *moe_logits, *moe_dgate, *moe_dy, *moe_dh, *moe_dact;
    float *moe_ln;          /* (N,C) sequence parallel: the block's input gathered in backward */
    float *moe_ep;          /* ep > 1: the all-to-all's rows (gpt2_memory.h GPT2_ACT_MOE_EP) */
    int64_t *moe_ep_counts; /* ep > 1, host (2E): the row counts sent and received */
    size_t *moe_ep_sizes;   /* ep > 1, host (2·ep): an all-to-all's counts */
    const struct group *ep_group; /* ep > 1: the ep ranks the experts are spread over */
    /* cp > 1 (model_moe_cp.c): the choices before each of the rank's chunks (gpt2_memory.h
     * GPT2_ACT_MOE_BEFORE), and on the host a layer's choices (N,k) then those before
     * each chunk (2B,E), every chunk's choices in the micro-batch's order (B,2cp,E), and
     * each expert's choices in the micro-batch (E) */
    int32_t *moe_cp_before, *moe_cp_host, *moe_cp_routed;
    double *moe_cp_chunks;
    /* DualPipeV's pairs in two lanes (runtime/lanes.h; set by the caller, NULL: one lane at
     * a time): what a pass keeps across an MoE block's all-to-all in one copy every slot
     * shares (moe_ep, moe_dy, whole, the buffers recompute reruns: gpt2_memory's lanes 2;
     * the host counts) and the ep group it exchanges on, each lane's own; moe_ep_lane_enter
     * installs a lane's in the fields above and the slots'. moe_lane[1].ep_group NULL: no
     * second set */
    struct lanes *lanes;
    struct moe_lane {
        void *acts[GPT2_ACTS]; /* each two-lane buffer's copy (gpt2_buffer lanes 2), else NULL */
        int32_t *counts_host;
        int64_t *ep_counts;
        size_t *ep_sizes;
        const struct group *ep_group;
    } moe_lane[2];
    double moe_capacity_factor, moe_aux, moe_z; /* plan.h struct plan_moe's */
    int32_t *moe_counts_host;                   /* (2E) a layer's counts, read back */
    int32_t *moe_routed_host;                   /* every slot's moe_acts' routed_host */
    double moe_loss;                            /* the MoE losses of the training forwards
                                                   since model_moe_take_loss */
    double *moe_stats; /* (MOE_STATS(E), common/formats/ckpt_state.h) the routing of the
                          training forwards since model_moe_stats_clear: the losses, the
                          choices (k·N a micro-batch and layer), those dropped and each
                          expert's, summed over micro-batches and layers */

    float *losses_host; /* (N) */
    /* Called, when set, as backward finishes writing gradients: the elements
     * [from, to) of grads are final (the data-parallel buckets start their
     * sums). A return of -1 fails the backward. */
    int (*grads_final)(void *ctx, size_t from, size_t to, struct plait_error *err);
    void *grads_final_ctx;
    /* With grads_final set, a model holding both ends (no pipeline) leaves the
     * embedding's rows of wte out of that backward, so that wte is final right
     * after the head (the hook hears of it first) and its sum overlaps the
     * whole backward; model_deferred_rows and model_add_embedding_rows add
     * them once it is summed. */
    bool defer_embedding;
    int deferred_slot;                  /* the slot whose embedding rows were left out, -1: none */
    struct profile prof;                /* time per phase (the training loop resets it) */
    struct gpt2_memory mem;             /* what it holds, by common/gpt2/gpt2_memory.c */
    struct gpt2_memory_shape mem_shape; /* ... for this shape */
    struct model_bytes allocated;       /* what model_init allocated, counted by kind (= mem's) */
    uint64_t scratch_bytes; /* the backend's scratch reserved beside it (model_scratch.c;
                               0 on the CPU), which gpt2_memory does not count */
    void **allocations;     /* everything above, for model_free */
    int n_allocations, cap_allocations;
};

/* How a rank's model is built beyond its part. */
struct model_shape {
    int B, T; /* the largest micro-batch (T: this rank's tokens of a sequence, seq_len/cp) */
    enum plan_precision precision;
    enum plan_fp8_scaling fp8_scaling; /* precision fp8 only */
    enum plan_recompute recompute;
    int slots;                    /* micro-batches in flight at once (1 without a pipeline) */
    int cp, cp_rank;              /* context parallelism (0 or 1: none) and this rank's place */
    const struct group *cp_group; /* cp > 1: its ring (runtime/ring_attention.h) */
    const struct group *ep_group; /* ep > 1: the experts' all-to-all (runtime/model_moe.h) */
    const struct group *ep_lane_group; /* DualPipeV's pairs in two lanes (schedule_moe_lanes):
                                          the second lane's ep group, a second set of what an
                                          MoE block keeps across its exchange; NULL: none */
    int dp, dp_rank;              /* data-parallel ranks holding the same part (1, 0: none): with
                                     hybrid sharding the shard group's */
    int replicas, replica;        /* its replicas (0 or 1: none), and this rank's (0-based) */
    int zero;                     /* ZeRO stage: from 1 the optimizer state, from 2 the accumulated
                                     gradients, at 3 the parameters too, hold this rank's 1/dp slice
                                     of the parameters */
    const struct group *dp_group; /* ZeRO 3: the group of those dp ranks (gathers and
                                     reduce-scatters unevenly), outliving the model */
    bool keep_gathered;           /* ZeRO 3, parallel.reshard_after_forward false: a unit
                                     gathered stays until the step's end (a window each) */
    bool sequence_parallel;       /* tp > 1: the residual stream, LayerNorms and biases of the
                                     row-parallel products on N/tp rows a rank (B·T divisible
                                     by tp) */
    bool split_backward;          /* backward in two passes (zero-bubble schedules): each slot keeps
                                     what the weight-gradient pass needs */
    const char *offload_dir;      /* parallel.offload "nvme": the moments' files go under it
                                     (rank-<offload_rank>/), two windows of each in memory */
    int offload_rank;
    double offload_window_mb;
    double logits_chunk_mb; /* the plan's: the last stage's logits in chunks (model.logits_rows) */
    bool host_step;         /* parallel.offload on a GPU rank: the optimizer's step on the CPU, its
                               state in host memory (runtime/host_step.h) */
    bool activations_f32;   /* PLAIT_DEBUG_ACTIVATIONS_F32: the products' inputs in fp32 even
                               where gpt2_act16 would keep them in bf16 (tests compare) */
    double moe_capacity_factor, moe_aux_loss, moe_z_loss; /* model.moe's (plan.h) */
};

/* Allocates everything for the part of the model `part` names
 * (gpt2_part_whole: all of it); tp is its tensor-parallel group (NULL: none;
 * its size must be part->tp). The model runs ops in ctx (ops->open's, closed
 * by the caller after model_free). Parameters are zero: call
 * model_set_params next. */
int model_init(struct model *m, const struct gpt2_config *cfg, const struct gpt2_part *part,
               const struct group *tp, const struct ops *ops, struct ops_ctx *ctx,
               const struct model_shape *shape, struct plait_error *err);
void model_free(struct model *m);

/* Copies host parameters in, in the shard's order (and refreshes the bf16 or
 * fp8 copy); ZeRO 3 keeps its slice of them. */
void model_set_params(struct model *m, const float *host_params);

/* ZeRO 3: the slice's parameters from host memory, its first n elements
 * (n <= slice_n), zeros after them. */
void model_set_param_slice(struct model *m, const float *host, size_t n);

/* Where the optimizer's slice element `at` of the buffer (slice_at <= at <
 * slice_at + slice_n) has its fp32 weight. */
float *model_master(const struct model *m, size_t at);

/* ZeRO 3, at a step's start: the slice's accumulated gradients zeroed (the
 * step's contributions are added into it); nothing below ZeRO 3. */
void model_grads_clear(struct model *m);

/* AdamW moment k (0: m, 1: v) of the slice from host memory: its first n
 * elements (n <= slice_n), zeros after them; into the model's memory, or
 * into its offload file. */
int model_moment_put(struct model *m, int k, const float *host, size_t n, struct plait_error *err);

/* Rewrites the bf16 copies from the fp32 weights: all of params16 (bf16), the
 * LM head's wte16 (fp8); nothing in fp32. Where AdamW did not write them
 * (model_copy16): a load, a ZeRO step's gathered weights. */
void model_refresh_bf16(struct model *m);

/* Where the bf16 copy of parameter element `at` lives, that element being in
 * the instance of tensor t that starts at `off` in the buffer: AdamW writes
 * it beside the fp32 weight. NULL when the element has none. */
uint16_t *model_copy16(const struct model *m, enum gpt2_tensor t, size_t off, size_t at);

/* Rewrites the fp8 copy (params8, scales8) from the fp32 weights, each
 * matrix quantised with the scales of its current amax (kernels/fp8.h);
 * nothing outside precision fp8. After every change of the weights: an
 * optimizer step, a load (so a resumed run rebuilds it from the master
 * weights, to the bit). */
void model_refresh_fp8(struct model *m);

/* Forward over one micro-batch of B×T tokens (B ≤ m->B, T ≤ m->T). With
 * targets, *mean_loss gets the mean cross-entropy; with grad_scale != 0 the
 * logits are replaced by their gradient (for model_backward), scaled by
 * grad_scale, which is 1/(tokens in the optimizer step). With tp > 1 the
 * logits are this rank's vocabulary shard (the loss is whole on every rank). */
int model_forward(struct model *m, const int32_t *inputs, const int32_t *targets, int B, int T,
                  float grad_scale, double *mean_loss, struct plait_error *err);

/* Backward after model_forward(..., grad_scale != 0). Parameter gradients are
 * written (accumulate = false, the first micro-batch of a step) or added. */
int model_backward(struct model *m, int B, int T, bool accumulate, struct plait_error *err);

/* With sequence parallelism each tp rank's LayerNorm gradients (ln1, ln2,
 * lnf: weights and biases) cover its own rows only: sums them over the tp
 * group, in place (a no-op without sequence parallelism). Call it once the
 * gradients to be stepped or sliced are complete: before optim_step, or with
 * ZeRO 2 after each micro-batch, before optim_reduce_micro (in buckets,
 * buckets_finish sums them in what it reduced). */
int model_sum_layernorm_grads(struct model *m, struct plait_error *err);

/* The same for the part of the buffer's elements [lo, lo + n) that buf holds
 * (buf[0] is element lo): a ZeRO slice, summed over dp already (the sums
 * commute). Every rank of the tp group passes the same range. */
int model_sum_layernorm_grads_in(struct model *m, float *buf, size_t lo, size_t n,
                                 struct plait_error *err);

/* The same for one pipeline stage and one slot (model_forward and
 * model_backward are these for the whole model in slot 0), through the
 * slot's chunk (m->slots[slot].chunk; with chunks, read "chunk" for "stage"
 * below: the first stage's chunk 0 embeds, the last stage's last chunk
 * computes the loss).
 * Forward: the first stage embeds `tokens` (host); the others read their
 * input from model_stage_input(m, slot), where the previous stage's output
 * was received. The last stage computes the loss against `targets` (host)
 * as model_forward does; the others leave their output at
 * model_stage_output(m, slot).
 * Backward: the last stage starts from its dlogits; the others from
 * grad_out (model_stage_floats, backend memory: the next stage's input
 * gradient). After it,
 * the gradient of this stage's input is at model_stage_input_grad(m), valid
 * until the next backward (the first stage has used it for its embedding). */
int model_stage_forward(struct model *m, int slot, const int32_t *tokens, const int32_t *targets,
                        int B, int T, float grad_scale, double *mean_loss, struct plait_error *err);
int model_stage_backward(struct model *m, int slot, const float *grad_out, int B, int T,
                         bool accumulate, struct plait_error *err);

/* The same backward in two passes, for zero-bubble schedules (the model
 * built with split_backward): the input-gradient pass computes everything
 * but the four products' weight gradients of each layer (the LayerNorms',
 * the head's and the embedding's included) and leaves the gradient of the
 * stage's input as model_stage_backward does; the weight-gradient pass, run
 * later on the same slot, adds those (accumulate as model_stage_backward's,
 * counted over weight-gradient passes). Together they give
 * model_stage_backward's gradients. */
int model_stage_backward_input(struct model *m, int slot, const float *grad_out, int B, int T,
                               bool accumulate, struct plait_error *err);
int model_stage_backward_weights(struct model *m, int slot, int B, int T, bool accumulate,
                                 struct plait_error *err);
float *model_stage_input(struct model *m, int slot);
/* Floats of a stage's input, its output and their gradients for a B×T
 * micro-batch: N·C, or this rank's R·C rows with sequence parallelism (tp
 * rank r of one stage exchanges with tp rank r of the next). */
size_t model_stage_floats(const struct model *m, int B, int T);
const float *model_stage_output(const struct model *m, int slot);
const float *model_stage_input_grad(const struct model *m);

/* The embedding-output gradient (N,C: all rows, gathered over tp when
 * sequence parallel) and the tokens of the slot whose embedding rows the
 * last backward deferred: -1 with err when none was. */
int model_deferred_rows(struct model *m, int B, int T, const float **rows, const int32_t **tokens,
                        struct plait_error *err);

/* Adds those rows (any rank's, backend memory) into the wte gradient. */
void model_add_embedding_rows(struct model *m, const float *rows, const int32_t *tokens, int B,
                              int T);

#endif
