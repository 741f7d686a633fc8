/* gpt2_memory.h — the bytes one rank's GPT-2 holds in device memory: its
 * parameters, gradients and AdamW state over the ZeRO slice, and every
 * activation and scratch buffer. One accounting for two readers: the runtime
 * allocates by it (runtime/model.c, which checks its own count against it) and
 * the cost model predicts with it (common/place/cost.c, what `plait check` prints),
 * so predicted and allocated memory are the same number.
 *
 * What a rank holds, in bytes, with P = the shard's parameters (gpt2_shard),
 * Pp = P rounded up to a multiple of dp, S = the optimizer's slice (Pp/dp with
 * ZeRO >= 1, else P):
 *   params      4·Pp fp32 weights, + 2·Pp their bf16 copy (bf16 precision), or
 *               + the fp8 copy (fp8 precision): 1 byte per element of each
 *               held layer's four product weights (qkvw, attprojw, fcw,
 *               fcprojw; the embeddings stay fp32) and 4 per scale, one per
 *               matrix (tensor scaling) or per 128×128 block, and on the last
 *               stage 2 per element of its wte shard: the tied LM head's bf16
 *               copy (the head runs in bf16, out of fp8)
 *   grads       4·Pp fp32 gradients, + 4·S the slice's reduced gradient (ZeRO >= 1)
 *   optimizer   8·S AdamW moments, + 4·S the slice's staging buffer (ZeRO >= 1)
 *   activations the buffers below, fp32, but in bf16 precision the products' inputs
 *               (gpt2_act16: LN1, LN2, LNF, FCH_GELU) and a chunk's dlogits (DLOGITS16)
 *               in bf16, 2 bytes an element
 * ZeRO 3 holds the slice of each, 4·S weights (+ 2·S their bf16 copy in
 * bf16, which the layers are gathered from), 4·S gradients, 8·S moments,
 * and the windows its units are gathered into (gpt2_units.h: the embeddings'
 * unit, the last unit, two layers; kept gathered until the step's end, every
 * layer of the shard): 4 bytes an element for the weights (+ 2 for their bf16
 * copy in bf16); the gradient windows (the embeddings' unit, the last unit,
 * two layers, either way): 4 for their gradients and 4 for each one's staging
 * (this rank's part of its sum: up to the window, or S). Without data
 * parallelism ZeRO is off. */
#ifndef PLAIT_GPT2_MEMORY_H
#define PLAIT_GPT2_MEMORY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "common/gpt2/gpt2_shard.h"
#include "common/gpt2/gpt2_units.h"
#include "common/plan/plan.h"

/* The activation and scratch buffers (the dense MLP's not held where every layer of
 * the shard has an MoE block instead), N = B·T rows; R = the residual
 * stream's rows on this rank: N, or N/tp with sequence parallelism. For a
 * Llama read "4C" as the MLP's product width 2F (gate and up) and, for
 * FCH_GELU, F (SwiGLU's output); G_QKV is (N,QKV/tp), QKV = (NH+2KV)·hs the
 * product's width; the *_MEAN buffers are not held (RMSNorm keeps rstd). Per
 * layer
 * (one copy per held micro-batch and layer when kept, else one shared buffer
 * recomputed in backward): */
enum gpt2_act {
    GPT2_ACT_LN1,      /* (R,C)       kept unless full recompute */
    GPT2_ACT_LN1_MEAN, /* (R) */
    GPT2_ACT_LN1_RSTD, /* (R) */
    GPT2_ACT_QKV,      /* (N,3C/tp)   column shard */
    GPT2_ACT_ATTY,     /* (N,C/tp) */
    GPT2_ACT_ATT,      /* (B,NH/tp,T,T) kept without recompute only; with a fused
                          attention (B,NH/tp,T): each row's log-sum-exp */
    GPT2_ACT_RES2,     /* (R,C) */
    GPT2_ACT_LN2,      /* (R,C) */
    GPT2_ACT_LN2_MEAN, /* (R) */
    GPT2_ACT_LN2_RSTD, /* (R) */
    GPT2_ACT_FCH,      /* (N,4C/tp)   column shard */
    GPT2_ACT_FCH_GELU, /* (N,4C/tp)   kept without recompute only */
    GPT2_ACT_RES3,     /* (R,C)       always kept: the layer's output */
    /* split backward (zero-bubble schedules) only, always kept: the four
     * products' output gradients, from the input- to the weight-gradient pass */
    GPT2_ACT_G_FCPROJ,  /* (N,C) */
    GPT2_ACT_G_FC,      /* (N,4C/tp) */
    GPT2_ACT_G_ATTPROJ, /* (N,C) */
    GPT2_ACT_G_QKV,     /* (N,3C/tp) */
    /* per held micro-batch */
    GPT2_ACT_INPUT,    /* (R,C)       the stage's input */
    GPT2_ACT_TOKENS,   /* (N) int32   first stage */
    GPT2_ACT_TARGETS,  /* (N) int32   last stage */
    GPT2_ACT_LNF,      /* (R,C)       last stage */
    GPT2_ACT_LNF_MEAN, /* (R) */
    GPT2_ACT_LNF_RSTD, /* (R) */
    GPT2_ACT_LOGITS,   /* (N,Vp/tp)   last stage, vocabulary shard; with chunked logits
                          (gpt2_logits_rows) one (rows,Vp/tp) every slot shares */
    GPT2_ACT_DLNF,     /* (N,C)       chunked logits only: the head's input gradient (this
                          rank's vocabulary part of it), made in the forward */
    GPT2_ACT_DHEAD,    /* (Vp/tp,C)   chunked logits only: the head's weight gradient, made
                          in the forward, added into the gradients by the backward */
    /* scratch, one each */
    GPT2_ACT_PROJ,       /* (N,C) */
    GPT2_ACT_LOSSES,     /* (N) */
    GPT2_ACT_CE_STATS,   /* (3N)        tp > 1 */
    GPT2_ACT_DLOGITS16,  /* (rows,Vp/tp) bf16, chunked logits with bf16 activations (gpt2_act16):
                            a chunk's dlogits, the LM head's backward reads them as they are */
    GPT2_ACT_DRES,       /* (R,C) */
    GPT2_ACT_GRAD_IN,    /* (R,C)       a stage's input gradient received from the next
                            (pipeline stages but the last, every stage when interleaved) */
    GPT2_ACT_DC,         /* (N,C) */
    GPT2_ACT_D3C,        /* (N,3C/tp) */
    GPT2_ACT_D4C,        /* (N,4C/tp) */
    GPT2_ACT_DATT,       /* (B,NH/tp,T,T); none with a fused attention */
    GPT2_ACT_WHOLE,      /* (N,C)       sequence parallel only: rows gathered from the group */
    GPT2_ACT_QKV_PACKED, /* (N,QKV/tp) grouped-query llama only: q, k and v as the product
                            writes them (KV heads of k and v), then their gradient */
    GPT2_ACT_DFF,        /* (N,F/tp)   llama only: the SwiGLU output's gradient */
    GPT2_ACT_CP_RING,    /* (N,2C/tp)  cp > 1 only, 5 copies: the key/value blocks coming
                            and going around the ring, their gradients' two partial sums
                            (in, out) and this rank's term (runtime/ring_attention.c) */
    GPT2_ACT_CP_SCORES,  /* (B,NH/tp,T,2T+hs+2) cp > 1 only: one block's scores, their
                            gradient, its output and row statistics; none with a fused
                            attention (the CUDA backend's block attention runs in tiles) */
    GPT2_ACT_CP_POS,     /* (cp·T) int32 cp > 1 only: every cp rank's token positions */
    /* mixture of experts (model.moe) only, with E experts, S shared ones, k choices a
     * token, Fm an expert's width (FCm its fc rows: 2Fm for a Llama, else Fm; both /tp
     * on a tp rank); per MoE layer (one copy per held micro-batch and MoE layer of a
     * chunk, or one shared with full recompute). With expert parallelism (ep > 1) the
     * local experts' rows are those every ep rank sent, at most ep·kN: X, H, ACT, DY,
     * DH and DACT hold ep·kN rows, COUNTS 3E (then the rows from each source rank for
     * each local expert), Y stays this rank's kN rows, come back. */
    GPT2_ACT_MOE_PROBS,  /* (N,E)      the router's softmax */
    GPT2_ACT_MOE_GATE,   /* (N,k)      the chosen experts' gates */
    GPT2_ACT_MOE_LSE,    /* (N)        each row's logsumexp of the logits (z-loss) */
    GPT2_ACT_MOE_CHOICE, /* (N,k) int32 the chosen experts */
    GPT2_ACT_MOE_POS,    /* (N,k) int32 each choice's packed row, -1 dropped */
    GPT2_ACT_MOE_ROWS,   /* (kN) int32 each packed row's token */
    GPT2_ACT_MOE_COUNTS, /* (2E) int32 each expert's rows, then its choices */
    GPT2_ACT_MOE_X,      /* (kN,C)     the tokens packed expert by expert */
    GPT2_ACT_MOE_H,      /* (kN,FCm)   the experts' first products */
    GPT2_ACT_MOE_ACT,    /* (kN,Fm)    their activations */
    GPT2_ACT_MOE_Y,      /* (kN,C)     the experts' outputs */
    GPT2_ACT_MOE_SH_H,   /* (S·N,FCm)  the shared experts' first products */
    GPT2_ACT_MOE_SH_ACT, /* (S·N,Fm)   their activations */
    /* scratch, one each */
    GPT2_ACT_MOE_LOGITS, /* (N,E)      the router's logits, then their gradient */
    GPT2_ACT_MOE_DGATE,  /* (N,k) */
    GPT2_ACT_MOE_DY,     /* (kN,C)     the experts' output gradients, then input gradients */
    GPT2_ACT_MOE_DH,     /* (max(kN,N),FCm) */
    GPT2_ACT_MOE_DACT,   /* (max(kN,N),Fm) */
    GPT2_ACT_MOE_LN,     /* (N,C)      sequence parallel only: the block's input gathered
                            again in backward, beside its output's gradient */
    GPT2_ACT_MOE_EP,     /* ((k + ep·k)N, C) ep > 1 only: this rank's packed rows (or their
                            gradients) and, by source rank, the rows the all-to-all brought */
    GPT2_ACT_MOE_BEFORE, /* (2B,E) int32 cp > 1 only: each expert's choices in the
                            micro-batch before each of the rank's chunks (runtime/
                            model_moe_cp.c: the capacity's count in token order) */
    GPT2_ACTS
};
#define GPT2_ACT_FIRST_SLOT GPT2_ACT_INPUT
#define GPT2_ACT_FIRST_SCRATCH GPT2_ACT_PROJ
#define GPT2_ACT_FIRST_MOE GPT2_ACT_MOE_PROBS
#define GPT2_ACT_FIRST_MOE_SCRATCH GPT2_ACT_MOE_LOGITS

/* The most MoE layers one of the shard's chunks holds (a slot's MoE activations). */
int gpt2_chunk_moe_layers(const struct gpt2_shard *s);

/* How a rank's model is run beyond its part. */
struct gpt2_memory_shape {
    int B, T; /* the largest micro-batch (T: the rank's tokens of a sequence, seq_len/cp) */
    int cp;   /* context parallelism (0 or 1: none): the ring's key/value blocks, their
                 gradients and one block's scores (runtime/ring_attention.c) */
    enum plan_precision precision;
    enum plan_fp8_scaling fp8_scaling; /* precision fp8 only */
    enum plan_recompute recompute;
    int slots;  /* micro-batches (interleaved: model chunks) whose activations are held at once */
    int chunks; /* model chunks per stage: a slot holds layers/chunks layers (1 but
                   for interleaved schedules) */
    int dp;     /* data-parallel ranks holding the same part (with cp: dp·cp, folded) */
    int zero;   /* ZeRO stage 0..3 */
    bool keep_gathered;       /* ZeRO 3 with parallel.reshard_after_forward false: a unit stays
                                 gathered until the step's end (a window for each unit) */
    bool sequence_parallel;   /* the residual stream on N/tp rows (tp > 1, N divisible by tp) */
    bool split_backward;      /* zero-bubble schedules: the G_* buffers */
    bool fused_attention;     /* the backend's fused attention (kernels/ops.h
                                 attention_*_fused, the CUDA backend's): no
                                 (B,NH,T,T) probabilities, their gradient neither */
    double offload_window_mb; /* parallel.offload "nvme": the moments' window (0: none) */
    double logits_chunk_mb;   /* the plan's logits_chunk_mb (gpt2_logits_rows; 0: whole) */
    bool host_step; /* a GPU rank with parallel.offload "host" or "nvme" (runtime/host_step.h):
                       the AdamW step on the CPU, the slice's fp32 master weights and gradient
                       staged in host memory with the moments ("host") or their windows
                       ("nvme"), none of them on the device */
    bool act16;     /* the products' inputs stored in bf16 (gpt2_act16) */
    bool moe_lanes; /* DualPipeV's pairs in two lanes (schedule_moe_lanes): a stage with MoE
                       layers holds a second copy (gpt2_buffer's lanes) of what a pass keeps
                       across an MoE block's all-to-all in one copy every slot shares: MOE_EP,
                       MOE_DY, (sequence parallel) WHOLE, and the buffers the recompute policy
                       reruns (a dense MLP's but) */
};

/* The block edge of the fp8 copy's block scaling (kernels/fp8.h's FP8_TILE). */
#define GPT2_FP8_BLOCK 128

struct gpt2_buffer {
    size_t elems;      /* of one copy */
    size_t elem_bytes; /* 4 (fp32, int32), 2 (bf16: gpt2_act16's) */
    size_t copies;     /* 0: not held */
    size_t lanes;      /* 2: the copies are two lanes' halves, the first lane's first (the
                          buffer kept across an MoE block's exchange, moe_lanes), else 1 */
};

struct gpt2_memory {
    int zero;      /* the ZeRO stage in effect (0 when dp = 1) */
    size_t padded; /* Pp: parameter elements rounded up to a multiple of dp */
    size_t slice;  /* S: elements of the optimizer's slice */
    struct gpt2_buffer act[GPT2_ACTS];
    size_t fp8_elems, fp8_scales; /* precision fp8: the weight copy's codes and scales */
    size_t lm_head16;             /* precision fp8, last stage: elements of the LM head's
                                     bf16 copy of wte, (Vp/tp, C) */
    /* ZeRO 3 (gpt2_units.h): the windows the units are gathered into (a bf16 copy
       beside each in bf16) and those their gradients are reduce-scattered out of
       (a staging buffer beside each) */
    struct gpt2_zero3_windows zero3_params, zero3_grads;
    size_t logits_rows;    /* gpt2_logits_rows: rows of logits computed at once, 0 whole */
    size_t offload_window; /* nvme offload: floats of a moment's window (two of each in
                              memory), 0 without */
    uint64_t params, grads, optimizer, activations, total; /* bytes */
    uint64_t disk; /* bytes in files (nvme offload's moments), not in total */
    uint64_t host; /* bytes in host memory beside the device's (host_step), not in total */
};

/* How many rows of logits the last stage computes at once: 0 (the whole micro-batch's,
 * kept per held micro-batch for the backward as their gradient, dlogits), or the rows
 * of logits_chunk_mb MiB (at least 1) where that holds less: the forward then computes,
 * chunk by chunk, the logits, the loss, dlogits and from them the head's input gradient
 * (DLNF) and weight gradient (DHEAD), which a held micro-batch keeps instead of its
 * dlogits ((Vp/tp + N)·C against N·Vp/tp elements; with bf16 activations the chunk's dlogits
 * in bf16 beside it, DLOGITS16). Not on other stages: 0. */
size_t gpt2_logits_rows(const struct gpt2_shard *s, const struct gpt2_memory_shape *shape);

/* Whether a rank keeps the inputs of its products in bf16 (the norms' outputs LN1, LN2 and
 * LNF, the MLP's activation FCH_GELU: kernels/ops.h's bf16 activations), not fp32: in bf16
 * precision, where every product that reads them rounds them to bf16 anyway, so the
 * values are the same and half the bytes move. Not with experts (an MoE block's router
 * and dispatch read its input in fp32), nor in fp8 (its products quantise fp32 inputs). */
bool gpt2_act16(const struct gpt2_config *cfg, enum plan_precision precision);

/* Whether buffer a is one of gpt2_act16's (the products' inputs, and DLOGITS16). */
bool gpt2_act_is16(enum gpt2_act a);

/* Floats of an offload window (parallel.offload_window_mb: nvme's moments, a GPU rank's
 * offloaded step's copies and AdamW calls): window_mb MiB, at least 1, at most the slice's S. */
size_t gpt2_offload_window(double window_mb, size_t S);

/* The memory of shard s run as shape says: -1 with err when a buffer is too
 * large to address (naming the plan fields) or the shape is out of range. */
int gpt2_memory(const struct gpt2_shard *s, const struct gpt2_memory_shape *shape,
                struct gpt2_memory *out, struct plait_error *err);

#endif
