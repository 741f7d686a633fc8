/* cuda_common.cuh — what the CUDA backend's files share: its context (device,
 * stream, cuBLASLt handle and workspace, scratch buffers, the sticky error),
 * one check macro per library (CUDA, cuBLASLt) recording file:line and the
 * library's message in the context, deterministic reductions, bf16 rounding,
 * and the ops each .cu defines. Internal: the runtime sees only cuda_ops.h. */
#ifndef PLAIT_KERNELS_CUDA_COMMON_CUH
#define PLAIT_KERNELS_CUDA_COMMON_CUH

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/gpt2/gpt2_scratch_slots.h"
#include "kernels/ops.h"
#include "kernels/ops_error.h"

/* ---- the context --------------------------------------------------------------- */

/* Scratch device memory slots (cu_scratch): common/gpt2/gpt2_scratch_slots.h names them
 * (and what each holds) for the count of their sizes, common/gpt2/gpt2_scratch.c */
enum {
    CU_SCRATCH_BF16_A = GPT2_SCRATCH_BF16_A,
    CU_SCRATCH_BF16_B = GPT2_SCRATCH_BF16_B,
    CU_SCRATCH_PARTIAL = GPT2_SCRATCH_PARTIAL,
    CU_SCRATCH_PARTIAL2 = GPT2_SCRATCH_PARTIAL2,
    CU_SCRATCH_INDEX = GPT2_SCRATCH_INDEX,
    /* the fp8 products (matmul_fp8.cu) */
    CU_FP8_X = GPT2_SCRATCH_FP8_X,
    CU_FP8_XS = GPT2_SCRATCH_FP8_XS,
    CU_FP8_D = GPT2_SCRATCH_FP8_D,
    CU_FP8_DS = GPT2_SCRATCH_FP8_DS,
    CU_FP8_WT = GPT2_SCRATCH_FP8_WT,
    CU_FP8_LTA = GPT2_SCRATCH_FP8_LTA,
    CU_FP8_LTB = GPT2_SCRATCH_FP8_LTB,
    CU_FP8_F32A = GPT2_SCRATCH_FP8_F32A,
    CU_FP8_F32B = GPT2_SCRATCH_FP8_F32B,
    CU_FP8_AMAX = GPT2_SCRATCH_FP8_AMAX,
    CU_SCRATCH_ATTENTION = GPT2_SCRATCH_ATTENTION,
    CU_SCRATCH_ROPE = GPT2_SCRATCH_ROPE,
    CU_SCRATCH_MOE = GPT2_SCRATCH_MOE,
    CU_SCRATCH_ADAMW = GPT2_SCRATCH_ADAMW,
    CU_SCRATCH_SUMSQ = GPT2_SCRATCH_SUMSQ,
    CU_SLOTS = GPT2_SCRATCH_SLOTS
};

/* encoder.cu's host buffers: the tokens, their per-row buckets, the counts */
struct cu_encoder_host {
    int32_t *tokens, *idx, *count;
    size_t tokens_n, idx_n, count_n;
};

/* What the rotary table in CU_SCRATCH_ROPE holds (llama.cu): positions
 * [pos0, pos0+T) of head size hs at theta; T 0: nothing yet. */
struct cu_rope_key { /* llama.cu's cu_rope_table: positions 0 .. T-1 (pos0 always 0) */
    int T, hs, pos0;
    double theta;
};

/* A table in a scratch slot and the host copy of its last upload, which an
 * unchanged table is not uploaded again after (optimizer.cu) */
struct cu_table {
    void *host;
    size_t bytes, capacity; /* bytes 0: nothing uploaded */
};

/* What kernels/ops.h's opaque context is in this backend (backend.cu makes
 * and frees it). Used by one thread at a time. */
struct ops_ctx {
    int device;
    cudaStream_t stream; /* every op of this context runs on it, in order */
    /* download_after's (backend.cu): its copies' own stream and the event that orders
     * each after the work on stream; made at the first, NULL until then */
    cudaStream_t copy_stream;
    cudaEvent_t copy_after;
    cublasLtHandle_t lt; /* cuBLASLt handle */
    void *lt_workspace;  /* its workspace, lt_workspace_bytes */
    size_t lt_workspace_bytes;
    void *scratch[CU_SLOTS]; /* device memory, grown on demand */
    size_t scratch_bytes[CU_SLOTS];
    /* reserve_scratch's sizes (cuda_reserve_scratch): a slot asked for more afterwards
     * is grown still and said once (scratch_grown_line), or with
     * PLAIT_DEBUG_SCRATCH_STRICT=1 refused as an error */
    bool scratch_reserved;
    bool scratch_strict;
    size_t scratch_reserved_bytes[CU_SLOTS];
    bool scratch_grown;
    char scratch_grown_line[384];
    struct cu_encoder_host enc;
    struct cu_rope_key rope;
    struct cu_table adamw_table, sumsq_table; /* CU_SCRATCH_ADAMW's, CU_SCRATCH_SUMSQ's */
    struct ops_error error;
    int cc; /* the device's compute capability, major·10 + minor */
    /* matmul_fp8.cu: the first fp8 product that fell back to fp32, for the log */
    bool fp8_fell_back;
    char fp8_fallback_line[512];
};

/* ---- errors ------------------------------------------------------------------ */

/* Records the first error in ctx (later ones are dropped until take_error). */
void cu_set_error(struct ops_ctx *ctx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Each returns true (and records "file:line: what: message" in ctx) on failure. */
bool cu_fail_cuda(struct ops_ctx *ctx, cudaError_t e, const char *what, const char *file, int line);
bool cu_fail_lt(struct ops_ctx *ctx, cublasStatus_t s, const char *what, const char *file,
                int line);

/* CUDA_OK(ctx, x) / LT_OK(ctx, x): true when the call succeeded; the failure
 * is recorded in ctx. */
#define CUDA_OK(ctx, x) (!cu_fail_cuda((ctx), (x), #x, __FILE__, __LINE__))
#define LT_OK(ctx, x) (!cu_fail_lt((ctx), (x), #x, __FILE__, __LINE__))
/* In a void op: record and return on failure. */
#define CUDA_TRY(ctx, x)                                                                           \
    do {                                                                                           \
        if (!CUDA_OK(ctx, x)) return;                                                              \
    } while (0)
/* After a kernel launch: a bad configuration is reported here, a fault later. */
#define LAUNCH_OK(ctx) CUDA_OK(ctx, cudaGetLastError())

/* Scratch device memory of at least `bytes` in ctx's slot, grown on demand.
 * NULL after recording the error. */
void *cu_scratch(struct ops_ctx *ctx, int slot, size_t bytes);

static inline unsigned cu_blocks(size_t n, unsigned threads)
{
    return (unsigned)((n + threads - 1) / threads);
}

/* The alignment of a pointer in bytes (the largest power of two dividing it,
 * at most 256): cuBLASLt's heuristic otherwise assumes 256 and may pick a
 * kernel that faults on a tensor that starts inside the flat parameter buffer. */
static inline uint32_t cu_alignment_bytes(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    uint32_t bytes = 1;
    while (bytes < 256 && !(a & bytes)) bytes <<= 1;
    return bytes;
}

/* cuBLASLt's search preference for a product in ctx: its workspace, and the
 * real alignment of cuBLAS's A, B, C and D (the heuristic otherwise assumes
 * 256 bytes and may pick a kernel that faults on a tensor that starts inside
 * a flat buffer). false after recording the failure (*pref then NULL or to
 * be destroyed by the caller). */
bool cu_lt_preference(struct ops_ctx *ctx, const void *a, const void *b, const void *c,
                      const void *d, cublasLtMatmulPreference_t *pref);

/* ---- device helpers --------------------------------------------------------------- */

/* Round to nearest even on the bit pattern, NaN kept quiet: kernels/cpu/bf16.h's
 * bf16_round, bit for bit. */
__device__ __forceinline__ uint16_t cu_bf16_round(float f)
{
    uint32_t x = __float_as_uint(f);
    uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    uint32_t quiet_nan = (x >> 16) | 0x40u;
    return (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

/* A kernel's output element stored as its type: fp32 as it is, bf16 rounded once by
 * cu_bf16_round (kernels/ops.h's ..._forward16: one kernel body for both, templated on
 * the output's type). */
__device__ __forceinline__ void cu_store(float *p, float v)
{
    *p = v;
}
__device__ __forceinline__ void cu_store(uint16_t *p, float v)
{
    *p = cu_bf16_round(v);
}

/* Warp reductions in a fixed butterfly order: the same bits on every run. */
template <typename T> __device__ __forceinline__ T cu_warp_sum(T v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float cu_warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Block reductions (blockDim.x a multiple of 32, at most 1024); every thread
 * gets the result. `shared` holds 32 values of T. */
template <typename T> __device__ T cu_block_sum(T v, T *shared)
{
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    v = cu_warp_sum(v);
    __syncthreads(); /* shared may still be read from a previous call */
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    T s = lane < warps ? shared[lane] : (T)0;
    return cu_warp_sum(s);
}
__device__ __forceinline__ float cu_block_max(float v, float *shared)
{
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    v = cu_warp_max(v);
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    float m = lane < warps ? shared[lane] : -INFINITY;
    return cu_warp_max(m);
}

/* ---- column sums in two deterministic passes ---------------------------------------- */

/* Rows are cut into chunks of CU_CHUNK_ROWS; a first kernel writes each
 * chunk's column sums into partial (chunks, C) in row order, and this adds
 * them in chunk order: out (C) = out·accumulate + Σ_chunks partial. */
enum { CU_CHUNK_ROWS = (int)GPT2_SCRATCH_CHUNK_ROWS };
void cu_column_sum_finish(struct ops_ctx *ctx, float *out, const float *partial, int chunks, int C,
                          bool accumulate);
/* out (C) = out·accumulate + Σ_rows in (N,C), the two passes above. */
void cu_column_sum(struct ops_ctx *ctx, float *out, const float *in, int N, int C, bool accumulate);

/* ---- the ops, by file (semantics in kernels/ops.h) ------------------------------------ */
/* (each ..._forward16 is its namesake with the activation it writes or reads in bf16) */

/* encoder.cu */
void cu_encoder_forward(struct ops_ctx *ctx, float *out, const int32_t *tokens, const float *wte,
                        int v0, int nv, const float *wpe, int B, int T, int C);
void cu_encoder_backward(struct ops_ctx *ctx, float *dwte, int v0, int nv, float *dwpe,
                         const float *dout, const int32_t *tokens, int B, int T, int C,
                         bool accumulate);
/* layernorm.cu */
void cu_layernorm_forward(struct ops_ctx *ctx, float *out, float *mean, float *rstd,
                          const float *inp, const float *w, const float *b, int N, int C);
void cu_layernorm_forward16(struct ops_ctx *ctx, uint16_t *out, float *mean, float *rstd,
                            const float *inp, const float *w, const float *b, int N, int C);
void cu_layernorm_backward(struct ops_ctx *ctx, float *dinp, float *dw, float *db,
                           const float *dout, const float *inp, const float *w, const float *mean,
                           const float *rstd, int N, int C, bool accumulate);
/* matmul.cu */
void cu_matmul_forward(struct ops_ctx *ctx, float *out, const float *inp, const float *w,
                       const uint16_t *w16, const float *bias, int N, int C, int OC);
void cu_matmul_forward_gelu(struct ops_ctx *ctx, float *out, float *pre, const float *inp,
                            const float *w, const uint16_t *w16, const float *bias, int N, int C,
                            int OC);
void cu_matmul_backward(struct ops_ctx *ctx, float *dinp, float *dw, float *dbias,
                        const float *dout, const float *inp, const float *w, const uint16_t *w16,
                        int N, int C, int OC, bool accumulate);
void cu_matmul_forward16(struct ops_ctx *ctx, float *out, const uint16_t *inp, const uint16_t *w16,
                         const float *bias, int N, int C, int OC);
void cu_matmul_forward_gelu16(struct ops_ctx *ctx, uint16_t *out, float *pre, const uint16_t *inp,
                              const uint16_t *w16, const float *bias, int N, int C, int OC);
void cu_matmul_backward16(struct ops_ctx *ctx, float *dinp, float *dw, float *dbias,
                          const float *dout, const uint16_t *inp, const uint16_t *w16, int N, int C,
                          int OC, bool accumulate);
void cu_matmul_backward_dout16(struct ops_ctx *ctx, float *dinp, float *dw, const uint16_t *dout,
                               const uint16_t *inp, const uint16_t *w16, int N, int C, int OC,
                               bool accumulate);
/* attention.cu */
void cu_attention_forward(struct ops_ctx *ctx, float *out, float *att, const float *qkv, int B,
                          int T, int C, int NH);
void cu_attention_backward(struct ops_ctx *ctx, float *dqkv, float *datt, const float *dout,
                           const float *qkv, const float *att, int B, int T, int C, int NH);
/* attention_fused.cu: D (B,NH,T) = Σ_d dout·out per row (FlashAttention-2's
 * D), in scratch (CU_SCRATCH_PARTIAL) until the next use of that slot; NULL
 * after recording the error */
float *cu_attention_rowdot(struct ops_ctx *ctx, const float *dout, const float *out, int B, int T,
                           int C, int NH);
/* attention_tc.cu: the fused attention on bf16 tensor cores */
bool cu_attention_bf16_takes(int head_size);
void cu_attention_forward_bf16(struct ops_ctx *ctx, float *out, float *lse, const float *qkv,
                               int B, int T, int C, int NH);
void cu_attention_backward_bf16(struct ops_ctx *ctx, float *dqkv, const float *dout,
                                const float *qkv, const float *out, const float *lse, int B,
                                int T, int C, int NH);
/* llama.cu: the Llama family's ops */
void cu_rmsnorm_forward(struct ops_ctx *ctx, float *out, float *rstd, const float *inp,
                        const float *w, int N, int C, float eps);
void cu_rmsnorm_forward16(struct ops_ctx *ctx, uint16_t *out, float *rstd, const float *inp,
                          const float *w, int N, int C, float eps);
void cu_rmsnorm_backward(struct ops_ctx *ctx, float *dinp, float *dw, const float *dout,
                         const float *inp, const float *w, const float *rstd, int N, int C,
                         bool accumulate);
void cu_rope_forward(struct ops_ctx *ctx, float *x, int B, int T, int NH, int NKV, int hs,
                     double theta, int pos0);
void cu_rope_backward(struct ops_ctx *ctx, float *dx, int B, int T, int NH, int NKV, int hs,
                      double theta, int pos0);
void cu_kv_expand(struct ops_ctx *ctx, float *out, const float *packed, int N, int NH, int NKV,
                  int hs);
void cu_kv_expand_backward(struct ops_ctx *ctx, float *dpacked, const float *dout, int N, int NH,
                           int NKV, int hs);
/* the (T, hs/2) table of (cos, sin) of rotary positions pos0 + t, kept in the context */
const float2 *cu_rope_table(struct ops_ctx *ctx, int T, int hs, double theta, int pos0);
void cu_swiglu_forward(struct ops_ctx *ctx, float *out, const float *inp, int N, int F);
void cu_swiglu_forward16(struct ops_ctx *ctx, uint16_t *out, const float *inp, int N, int F);
void cu_swiglu_backward(struct ops_ctx *ctx, float *dinp, const float *inp, const float *dout,
                        int N, int F);
/* rope_expand.cu: rotary positions fused with the key/value expansion */
void cu_rope_kv_expand(struct ops_ctx *ctx, float *out, const float *packed, int B, int T, int NH,
                       int NKV, int hs, double theta, int pos0);
void cu_rope_kv_expand_backward(struct ops_ctx *ctx, float *dpacked, const float *dout, int B,
                                int T, int NH, int NKV, int hs, double theta, int pos0);
/* norm_fused.cu: a residual add fused with the norm after it */
void cu_residual_layernorm_forward(struct ops_ctx *ctx, float *res, float *out, float *mean,
                                   float *rstd, const float *a, const float *b, const float *w,
                                   const float *bias, int N, int C);
void cu_residual_rmsnorm_forward(struct ops_ctx *ctx, float *res, float *out, float *rstd,
                                 const float *a, const float *b, const float *w, int N, int C,
                                 float eps);
void cu_residual_layernorm_forward16(struct ops_ctx *ctx, float *res, uint16_t *out, float *mean,
                                     float *rstd, const float *a, const float *b, const float *w,
                                     const float *bias, int N, int C);
void cu_residual_rmsnorm_forward16(struct ops_ctx *ctx, float *res, uint16_t *out, float *rstd,
                                   const float *a, const float *b, const float *w, int N, int C,
                                   float eps);
/* elementwise.cu */
void cu_add_bias(struct ops_ctx *ctx, float *out, const float *bias, int N, int C);
void cu_gelu_forward(struct ops_ctx *ctx, float *out, const float *inp, size_t n);
void cu_gelu_forward16(struct ops_ctx *ctx, uint16_t *out, const float *inp, size_t n);
void cu_gelu_backward(struct ops_ctx *ctx, float *dinp, const float *inp, const float *dout,
                      size_t n);
void cu_residual_forward(struct ops_ctx *ctx, float *out, const float *a, const float *b, size_t n);
void cu_to_bf16(struct ops_ctx *ctx, uint16_t *dst, const float *src, size_t n);
/* classifier.cu */
void cu_classifier(struct ops_ctx *ctx, float *logits, float *losses, const int32_t *targets, int N,
                   int V, int Vp, float grad_scale);
void cu_classifier_max(struct ops_ctx *ctx, const float *logits, float *row_max, int N, int nv,
                       int Vp);
void cu_classifier_sumexp(struct ops_ctx *ctx, const float *logits, const float *row_max,
                          const int32_t *targets, int v0, int nv, int Vp, float *row_sum,
                          float *target_logit, int N);
void cu_classifier_finish(struct ops_ctx *ctx, float *logits, float *losses, const int32_t *targets,
                          const float *row_max, const float *row_sum, const float *target_logit,
                          int v0, int nv, int Vp, int N, float grad_scale);
void cu_classifier16(struct ops_ctx *ctx, uint16_t *dlogits16, float *logits, float *losses,
                     const int32_t *targets, int N, int V, int Vp, float grad_scale);
void cu_classifier_finish16(struct ops_ctx *ctx, uint16_t *dlogits16, float *logits, float *losses,
                            const int32_t *targets, const float *row_max, const float *row_sum,
                            const float *target_logit, int v0, int nv, int Vp, int N,
                            float grad_scale);
/* moe.cu: a mixture-of-experts block's routing */
void cu_moe_route(struct ops_ctx *ctx, float *probs, int32_t *choice, float *gate, float *lse,
                  const float *logits, int N, int E, int k);
int cu_moe_dispatch(struct ops_ctx *ctx, int32_t *pos, int32_t *rows, int32_t *counts,
                    int32_t *routed, const int32_t *choice, const int32_t *before, int ranges,
                    int N, int E, int k, int capacity);
void cu_moe_gather(struct ops_ctx *ctx, float *packed, const float *x, const int32_t *rows, int M,
                   int C);
void cu_moe_gather_backward(struct ops_ctx *ctx, float *dx, const float *dpacked,
                            const int32_t *pos, int N, int k, int C, bool accumulate);
void cu_moe_combine(struct ops_ctx *ctx, float *out, const float *y, const float *gate,
                    const int32_t *pos, int N, int k, int C, bool accumulate);
void cu_moe_combine_backward(struct ops_ctx *ctx, float *dy, float *dgate, const float *dout,
                             const float *y, const float *gate, const int32_t *pos, int N, int k,
                             int C);
void cu_moe_route_backward(struct ops_ctx *ctx, float *dlogits, const float *dgate,
                           const float *probs, const int32_t *choice, const float *gate,
                           const float *lse, const int32_t *routed, int N, int E, int k, float aux,
                           float z);
void cu_moe_losses(struct ops_ctx *ctx, double *out, const float *probs, const float *lse,
                   const int32_t *routed, int N, int E, int k, double aux, double z);
/* optimizer.cu */
void cu_sum_squares(struct ops_ctx *ctx, double *sums, const float *const *x, const size_t *n,
                    int count);
void cu_adamw(struct ops_ctx *ctx, float *p, uint16_t *p16, const float *g, float *m, float *v,
              size_t n, float lr, double beta1, double beta2, float eps, float weight_decay,
              float grad_scale, int step);
void cu_adamw_multi(struct ops_ctx *ctx, const struct adamw_segment *segs, int count, float lr,
                    double beta1, double beta2, float eps, float weight_decay, float grad_scale,
                    int step);

#endif
