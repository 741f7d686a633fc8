/* ops.h — every operation of a GPT-2 or Llama training step, behind one table that each
 * backend fills: kernels/cpu (the tested reference) and, op for op, a CUDA
 * backend. The runtime calls only these. Pointers are the backend's memory.
 *
 * Shapes: B batch, T time, C channels, NH heads, hs = C/NH, V vocab, Vp padded
 * vocab, N = B·T rows. Matrices are row-major; weights are (out, in) as in
 * llm.c and PyTorch's Linear.
 *
 * Every op takes the backend's context first: an opaque struct ops_ctx that
 * open() makes for a device and close() frees. It holds what the backend
 * would otherwise keep in globals: the device, its stream and library handles
 * (CUDA), scratch buffers, the sticky error. A context is used by one thread
 * at a time; two contexts are independent (their own scratch and error).
 *
 * Errors are sticky, as in CUDA: ops return nothing; the first failure (out of
 * memory, a library error) is kept in the context until take_error() returns
 * and clears it. The runtime checks after every micro-batch. Ops never fail
 * on numbers. */
#ifndef PLAIT_KERNELS_OPS_H
#define PLAIT_KERNELS_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/fp8.h"

struct ops_ctx; /* the backend's, opaque */

/* One tensor's part for adamw_multi: n elements of the master weights p, their
 * bf16 copy p16 (NULL: none), the gradient g and the moments m and v, all the
 * backend's memory; decays: weight decay applies (else 0). */
struct adamw_segment {
    float *p;
    uint16_t *p16;
    const float *g;
    float *m, *v;
    size_t n;
    bool decays;
};

struct ops {
    const char *name; /* "cpu" */

    /* A context on `device` (a CUDA index; the CPU backend ignores it), or
     * NULL with the reason in errbuf. close(NULL) does nothing. */
    struct ops_ctx *(*open)(int device, char *errbuf, size_t errbuf_bytes);
    void (*close)(struct ops_ctx *ctx);
    /* The stream the context's ops run on, in order (a cudaStream_t), for
     * work of others (collectives) to be ordered against; NULL on the CPU,
     * whose ops are done when they return. */
    void *(*stream)(struct ops_ctx *ctx);
    /* Waits until every op issued in the context so far is done (errors are
     * the sticky ones); NULL where ops are done when they return (the CPU).
     * Only for measuring: PLAIT_PROFILE's time per phase on a GPU. */
    void (*synchronize)(struct ops_ctx *ctx);

    /* memory: alloc returns zeroed memory or NULL */
    void *(*alloc)(struct ops_ctx *ctx, size_t bytes);
    void (*free)(struct ops_ctx *ctx, void *p);
    void (*upload)(struct ops_ctx *ctx, void *dst, const void *host_src, size_t bytes);
    void (*download)(struct ops_ctx *ctx, void *host_dst, const void *src, size_t bytes);
    /* Optional (NULL: calloc and free): zeroed host memory that upload and download move
     * at the link's full speed (page-locked on a GPU), or NULL; freed by host_free. */
    void *(*host_alloc)(struct ops_ctx *ctx, size_t bytes);
    void (*host_free)(struct ops_ctx *ctx, void *p);
    /* Optional (NULL: download, done when it returns): a copy of bytes from the device's
     * src into host_dst (host_alloc's memory) that starts once every op issued to the
     * context so far is done, on a copy stream of its own, so that the ops issued after it
     * run while it moves; neither buffer may be written (nor host_dst read) until
     * copies_wait. The CPU's is done when it returns. */
    void (*download_after)(struct ops_ctx *ctx, void *host_dst, const void *src, size_t bytes);
    /* Optional (NULL: nothing is ever in flight): returns when every download_after issued
     * so far is done; a failed copy is the context's sticky error. */
    void (*copies_wait)(struct ops_ctx *ctx);
    /* Optional (NULL where any thread may issue ops as it is): makes the calling thread
     * issue to the context's device (a thread the runtime starts, before its first op). */
    void (*bind_thread)(struct ops_ctx *ctx);
    /* Optional (NULL on the CPU, where all memory is the host's): whether p is the device's
     * memory (device or managed), which a host-memory transport must stage through upload
     * and download (the socket backend on GPU ranks), or the host's. */
    bool (*is_device_memory)(struct ops_ctx *ctx, const void *p);
    /* Optional (NULL on the CPU): the device's memory in use now, by every context on it
     * (this process's, its CUDA context and library workspaces included), and its size. */
    void (*memory_in_use)(struct ops_ctx *ctx, uint64_t *used, uint64_t *total);
    /* within the device */
    void (*copy)(struct ops_ctx *ctx, void *dst, const void *src, size_t bytes);
    /* rows of row_bytes each, read every src_pitch bytes from src and written every
     * dst_pitch bytes from dst (columns of a row-major matrix: one 2D copy on a GPU,
     * not a copy a row) */
    void (*copy_rows)(struct ops_ctx *ctx, void *dst, size_t dst_pitch, const void *src,
                      size_t src_pitch, size_t row_bytes, size_t rows);
    void (*zero)(struct ops_ctx *ctx, void *p, size_t bytes);
    /* 0 if no op failed since the last call; else -1 and the first message */
    int (*take_error)(struct ops_ctx *ctx, char *buf, size_t bytes);

    /* out (B,T,C) = wte[tokens - v0] + wpe[t]; wte (nv,C) holds the rows of
     * vocabulary entries [v0, v0+nv) (the whole table: 0, Vp), a token outside
     * them contributes 0 (a vocabulary-parallel shard; the ranks' outputs sum
     * to the embedding); wpe (maxT,C) or NULL (not added) */
    void (*encoder_forward)(struct ops_ctx *ctx, float *out, const int32_t *tokens,
                            const float *wte, int v0, int nv, const float *wpe, int B, int T,
                            int C);
    /* dwte[tokens - v0] += dout for tokens in [v0, v0+nv) (always accumulates:
     * the LM head writes dwte first); dwpe[0:T] = dwpe·accumulate + Σ_b dout,
     * dwpe may be NULL, and dwte (wpe's part alone) */
    void (*encoder_backward)(struct ops_ctx *ctx, float *dwte, int v0, int nv, float *dwpe,
                             const float *dout, const int32_t *tokens, int B, int T, int C,
                             bool accumulate);
    /* out (N,C) += bias (C): a row-parallel product's bias, after the reduction */
    void (*add_bias)(struct ops_ctx *ctx, float *out, const float *bias, int N, int C);

    /* out (N,C) = (inp - mean)·rstd·w + b, eps 1e-5; mean, rstd (N) are saved */
    void (*layernorm_forward)(struct ops_ctx *ctx, float *out, float *mean, float *rstd,
                              const float *inp, const float *w, const float *b, int N, int C);
    /* dinp (N,C) += ...  (the residual stream's gradient accumulates);
     * dw, db (C) = (accumulate ? dw : 0) + ... */
    void (*layernorm_backward)(struct ops_ctx *ctx, float *dinp, float *dw, float *db,
                               const float *dout, const float *inp, const float *w,
                               const float *mean, const float *rstd, int N, int C, bool accumulate);

    /* out (N,OC) = inp (N,C) · wᵀ + bias; w (OC,C); bias may be NULL.
     * With w16 (bf16 copy of w, or NULL for fp32), inp is rounded to bf16 and
     * the product accumulates in fp32. */
    void (*matmul_forward)(struct ops_ctx *ctx, float *out, const float *inp, const float *w,
                           const uint16_t *w16, const float *bias, int N, int C, int OC);
    /* Optional (NULL: matmul_forward, then gelu_forward): pre (N,OC) = inp ·
     * wᵀ + bias as matmul_forward computes it, and out (N,OC) = gelu(pre) in
     * the same pass (the MLP's first product; cuBLASLt's GELU epilogue). The
     * same values within fp32 rounding. */
    void (*matmul_forward_gelu)(struct ops_ctx *ctx, float *out, float *pre, const float *inp,
                                const float *w, const uint16_t *w16, const float *bias, int N,
                                int C, int OC);
    /* dinp (N,C) = dout · w (overwritten);
     * dw (OC,C) = dw·accumulate + doutᵀ · inp;  dbias (OC) likewise, may be NULL.
     * dinp NULL: the weight gradients only; dw NULL: the input gradient only
     * (dbias is then ignored; split backward, zero-bubble schedules).
     * With w16 the three products take bf16 inputs. */
    void (*matmul_backward)(struct ops_ctx *ctx, float *dinp, float *dw, float *dbias,
                            const float *dout, const float *inp, const float *w,
                            const uint16_t *w16, int N, int C, int OC, bool accumulate);

    /* The same two products in fp8 (precision "fp8"), fp32 accumulation.
     * w8 (OC,C) is the weight's E4M3 copy with its scales w_scales, made by
     * quantize_fp8 in tiles of fp8_weight_tile(scaling) (one scale, or
     * ⌈OC/128⌉·⌈C/128⌉ row-major); the other operands are quantised inside
     * the op by kernels/fp8.h: inp in E4M3, dout in E5M2 with tensor scaling
     * (Transformer Engine's HYBRID recipe), in E4M3 with block scaling
     * (DeepSeek-V3), activations and gradients in 1×128 tiles along the
     * product's reduction dimension. dinp's product takes w8 transposed:
     * transposing codes and block scales is exact, so it is the same
     * weight. dbias is dout's fp32 sum. */
    void (*matmul_forward_fp8)(struct ops_ctx *ctx, float *out, const float *inp, const uint8_t *w8,
                               const float *w_scales, const float *bias, int N, int C, int OC,
                               enum fp8_scaling scaling);
    void (*matmul_backward_fp8)(struct ops_ctx *ctx, float *dinp, float *dw, float *dbias,
                                const float *dout, const float *inp, const uint8_t *w8,
                                const float *w_scales, int N, int C, int OC, bool accumulate,
                                enum fp8_scaling scaling);
    /* q (rows,cols) and scales = kernels/fp8.h's fp8_quantize of x (rows,cols)
     * in tiles of tile_rows × tile_cols (0 = the whole dimension), bit for
     * bit: the fp8 copy of a weight matrix, written after each optimizer step. */
    void (*quantize_fp8)(struct ops_ctx *ctx, uint8_t *q, float *scales, const float *x, int rows,
                         int cols, int tile_rows, int tile_cols, enum fp8_format fmt);

    /* qkv (B,T,3C) -> out (B,T,C); att (B,NH,T,T) gets the causal softmax
     * probabilities (zero above the diagonal), scale 1/sqrt(hs) */
    void (*attention_forward)(struct ops_ctx *ctx, float *out, float *att, const float *qkv, int B,
                              int T, int C, int NH);
    /* dqkv (B,T,3C) overwritten; datt (B,NH,T,T) is scratch */
    void (*attention_backward)(struct ops_ctx *ctx, float *dqkv, float *datt, const float *dout,
                               const float *qkv, const float *att, int B, int T, int C, int NH);
    /* Optional (NULL: the two above run): the same attention fused, without
     * the probabilities: lse (B,NH,T) keeps each row's log-sum-exp of the
     * scaled scores, and the backward recomputes the rest from qkv, the
     * forward's out and lse. The same out and dqkv within fp32 rounding. */
    void (*attention_forward_fused)(struct ops_ctx *ctx, float *out, float *lse, const float *qkv,
                                    int B, int T, int C, int NH);
    void (*attention_backward_fused)(struct ops_ctx *ctx, float *dqkv, const float *dout,
                                     const float *qkv, const float *out, const float *lse, int B,
                                     int T, int C, int NH);

    /* Attention one key/value block at a time (context parallelism's ring;
     * kernels/cpu is the reference: ring_attention_generic.inc; NULL where a
     * backend has none yet). q: Tq query rows a sequence, row stride ldq
     * (q's C columns first: a qkv buffer's rows); kv (B,Tk,2C): per row
     * [k | v]; qpos (Tq) and kpos (Tk) each row's position in its sequence
     * (the same for every one of the B): a key is visible to a query at or
     * after it. scratch holds ATTENTION_BLOCK_SCRATCH floats. Forward: the block's softmax
     * merged into out (B,Tq,C) and lse (B,NH,Tq) through the log-sum-exp
     * (first: written, a row that sees no key of the block left at 0 and
     * -inf); over every block, the causal attention of the whole sequence.
     * Backward: given the whole attention's out and lse, the block's terms
     * added to dq (layout of q) and dkv (layout of kv). */
#define ATTENTION_BLOCK_SCRATCH(B, NH, Tq, Tk, hs) /* a (B,NH) grid of 2 (Tq,Tk), (Tq,hs), (2,Tq) */ \
    ((size_t)(B) * (size_t)(NH) * (size_t)(Tq) * (2 * (size_t)(Tk) + (size_t)(hs) + 2))
    void (*attention_block_forward)(struct ops_ctx *ctx, float *out, float *lse, float *scratch,
                                    const float *q, int ldq, const float *kv, const int32_t *qpos,
                                    const int32_t *kpos, int B, int Tq, int Tk, int C, int NH,
                                    bool first);
    void (*attention_block_backward)(struct ops_ctx *ctx, float *dq, float *dkv, float *scratch,
                                     const float *dout, const float *q, int ldq, const float *kv,
                                     const float *out, const float *lse, const int32_t *qpos,
                                     const int32_t *kpos, int B, int Tq, int Tk, int C, int NH);

    /* Optional (NULL: the fused ones above): the fused attention on bf16
     * tensor cores, which runs in bf16 and fp8 precision where
     * attention_bf16_takes(C/NH). q, k, v and dout are rounded to bf16 as
     * they are read, the probabilities and dS to bf16 before their products;
     * every sum is fp32; out, lse and dqkv as the fused ones (fp32). Within
     * bf16 rounding of the fused ones, not bit-equal (kernels/cuda/attention_tc.cu
     * says where it rounds). Deterministic. */
    bool (*attention_bf16_takes)(int head_size);
    void (*attention_forward_bf16)(struct ops_ctx *ctx, float *out, float *lse, const float *qkv,
                                   int B, int T, int C, int NH);
    void (*attention_backward_bf16)(struct ops_ctx *ctx, float *dqkv, const float *dout,
                                    const float *qkv, const float *out, const float *lse, int B,
                                    int T, int C, int NH);

    /* GELU, tanh approximation, n elements; dinp overwritten */
    void (*gelu_forward)(struct ops_ctx *ctx, float *out, const float *inp, size_t n);
    void (*gelu_backward)(struct ops_ctx *ctx, float *dinp, const float *inp, const float *dout,
                          size_t n);

    /* The Llama family's ops (model.arch "llama"; kernels/cpu is the
     * reference, each with its CUDA kernel).
     *
     * RMSNorm: out (N,C) = inp·rsqrt(mean(inp²) + eps)·w; rstd (N) is saved.
     * Backward: dinp (N,C) += ... (the residual stream's gradient
     * accumulates); dw (C) = (accumulate ? dw : 0) + ... */
    void (*rmsnorm_forward)(struct ops_ctx *ctx, float *out, float *rstd, const float *inp,
                            const float *w, int N, int C, float eps);
    void (*rmsnorm_backward)(struct ops_ctx *ctx, float *dinp, float *dw, const float *dout,
                             const float *inp, const float *w, const float *rstd, int N, int C,
                             bool accumulate);
    /* Rotary positions, in place, on the q and k heads of x (B,T,(NH+2·NKV)·hs):
     * per row [q: NH heads][k: NKV heads][v: NKV heads], each head hs wide
     * (hs even); v is left alone. Position of row t is pos0 + t. As
     * transformers' apply_rotary_pos_emb: with i < hs/2, f_i = theta^(-2i/hs),
     * a = pos·f_i, the pair (x_i, x_{i+hs/2}) becomes
     * (x_i·cos a − x_{i+hs/2}·sin a, x_{i+hs/2}·cos a + x_i·sin a); angles
     * in double, then rounded. Backward: the same in place on the gradient with
     * the inverse rotation (−a). */
    void (*rope_forward)(struct ops_ctx *ctx, float *x, int B, int T, int NH, int NKV, int hs,
                         double theta, int pos0);
    void (*rope_backward)(struct ops_ctx *ctx, float *dx, int B, int T, int NH, int NKV, int hs,
                          double theta, int pos0);
    /* Grouped-query attention through the multi-head ops: out (N,3·NH·hs) =
     * [q | k, v repeated] from packed (N,(NH+2·NKV)·hs): query head h reads
     * key/value head h / (NH/NKV) (transformers' repeat_kv). Backward: dpacked
     * (N,(NH+2·NKV)·hs) overwritten, its k and v the sums over each group. */
    void (*kv_expand)(struct ops_ctx *ctx, float *out, const float *packed, int N, int NH, int NKV,
                      int hs);
    void (*kv_expand_backward)(struct ops_ctx *ctx, float *dpacked, const float *dout, int N,
                               int NH, int NKV, int hs);
    /* Optional (NULL: rope_forward on packed, then kv_expand; kv_expand_backward, then
     * rope_backward): the two in one pass. Forward: out (B·T,3·NH·hs) = kv_expand of packed
     * (B,T,(NH+2·NKV)·hs) with q and k rotated as rope_forward rotates them; packed is left
     * as it was, not rotated. Backward: dpacked (B·T,(NH+2·NKV)·hs) overwritten, the group
     * sums of dout (B·T,3·NH·hs) first, then rotated back. The composition's values (the
     * CPU's is the composition: the same bits). */
    void (*rope_kv_expand)(struct ops_ctx *ctx, float *out, const float *packed, int B, int T,
                           int NH, int NKV, int hs, double theta, int pos0);
    void (*rope_kv_expand_backward)(struct ops_ctx *ctx, float *dpacked, const float *dout, int B,
                                    int T, int NH, int NKV, int hs, double theta, int pos0);
    /* SwiGLU: inp (N,2F) holds per row [gate (F) | up (F)]; out (N,F) =
     * silu(gate)·up, silu(g) = g/(1+exp(−g)). Backward: dinp (N,2F)
     * overwritten from dout (N,F) and inp. */
    void (*swiglu_forward)(struct ops_ctx *ctx, float *out, const float *inp, int N, int F);
    void (*swiglu_backward)(struct ops_ctx *ctx, float *dinp, const float *inp, const float *dout,
                            int N, int F);

    /* A mixture-of-experts block's routing (model.moe; kernels/cpu is the
     * reference: moe_generic.inc; NULL where a backend has none yet). N
     * tokens, E experts, k choices a token; every buffer backend memory.
     *
     * Route: probs (N,E) = softmax(logits); choice (N,k) the k largest,
     * largest first, ties to the lower expert; gate (N,k) those over their
     * sum; lse (N) each row's logsumexp (the z-loss).
     * Dispatch: each choice's row in the packed (expert-major, token order
     * within an expert) buffer, pos (N,k), or -1 where `capacity` of the
     * micro-batch's choices (0: no limit) came to its expert before it; rows
     * (M) each packed row's token; counts (E) each expert's rows; routed (E)
     * every choice counted, dropped or not (the balance loss's f_e·k·N).
     * The N tokens are `ranges` equal runs, each a stretch of the
     * micro-batch's token order (context parallelism: a rank's chunks);
     * before (ranges,E) each expert's choices in the micro-batch before run
     * j's first token (NULL: none; with ranges 1 the N tokens are the whole
     * micro-batch). Returns M = Σ counts.
     * Gather: packed (M,C) = x's rows; backward dx (N,C) (+)= each token's
     * kept rows of dpacked, in choice order.
     * Combine: out (N,C) (+)= Σ_j gate·y[pos] over the kept choices, in
     * choice order; backward dy (M,C) = gate·dout, dgate (N,k) = dout·y[pos]
     * (0 for a dropped choice).
     * Route backward: dlogits (N,E) overwritten from dgate (NULL: none)
     * through the gates and the softmax, plus the balance loss's and the
     * z-loss's gradients, their coefficients aux and z already scaled as the
     * loss is. Losses: out[0] = aux·E·Σ_e f_e·P_e (f_e = routed[e]/(k·N),
     * P_e the mean p_e), out[1] = z·mean(lse²), on the host. */
    void (*moe_route)(struct ops_ctx *ctx, float *probs, int32_t *choice, float *gate, float *lse,
                      const float *logits, int N, int E, int k);
    int (*moe_dispatch)(struct ops_ctx *ctx, int32_t *pos, int32_t *rows, int32_t *counts,
                        int32_t *routed, const int32_t *choice, const int32_t *before, int ranges,
                        int N, int E, int k, int capacity);
    void (*moe_gather)(struct ops_ctx *ctx, float *packed, const float *x, const int32_t *rows,
                       int M, int C);
    void (*moe_gather_backward)(struct ops_ctx *ctx, float *dx, const float *dpacked,
                                const int32_t *pos, int N, int k, int C, bool accumulate);
    void (*moe_combine)(struct ops_ctx *ctx, float *out, const float *y, const float *gate,
                        const int32_t *pos, int N, int k, int C, bool accumulate);
    void (*moe_combine_backward)(struct ops_ctx *ctx, float *dy, float *dgate, const float *dout,
                                 const float *y, const float *gate, const int32_t *pos, int N,
                                 int k, int C);
    void (*moe_route_backward)(struct ops_ctx *ctx, float *dlogits, const float *dgate,
                               const float *probs, const int32_t *choice, const float *gate,
                               const float *lse, const int32_t *routed, int N, int E, int k,
                               float aux, float z);
    void (*moe_losses)(struct ops_ctx *ctx, double *out, const float *probs, const float *lse,
                       const int32_t *routed, int N, int E, int k, double aux, double z);

    /* out = a + b, n elements (out may alias a or b) */
    void (*residual_forward)(struct ops_ctx *ctx, float *out, const float *a, const float *b,
                             size_t n);
    /* Optional (NULL: residual_forward, then layernorm_forward or rmsnorm_forward): a
     * block's residual add and the norm of its result in one pass over each row. res (N,C) =
     * a + b (res may alias a or b), then out (N,C) the norm of res, its statistics (N) saved
     * as the norm's op saves them (LayerNorm's eps 1e-5). The composition's values (the
     * CPU's is the composition: the same bits). */
    void (*residual_layernorm_forward)(struct ops_ctx *ctx, float *res, float *out, float *mean,
                                       float *rstd, const float *a, const float *b, const float *w,
                                       const float *bias, int N, int C);
    void (*residual_rmsnorm_forward)(struct ops_ctx *ctx, float *res, float *out, float *rstd,
                                     const float *a, const float *b, const float *w, int N, int C,
                                     float eps);

    /* Activations stored in bf16: in precision "bf16" the products' inputs (the norms'
     * outputs and the MLP's activation: common/gpt2/gpt2_memory.h's gpt2_act16) are kept
     * in bf16, not fp32. Each op below is its namesake above with that activation in bf16.
     * A writer computes in fp32 as its namesake does and rounds each output element once,
     * to nearest even, as it stores it (the CPU's: its namesake's fp32 values, rounded:
     * the same bits as rounding the namesake's output). A product takes the bf16 input as
     * it is, with the weight's bf16 copy w16 and fp32 sums: its namesake's result on an
     * fp32 input that rounds to these values (matmul_forward and matmul_backward with w16
     * round their input to bf16 first), the same bits on the CPU. NULL: the backend has
     * none; the model then keeps these activations in fp32. */
    void (*layernorm_forward16)(struct ops_ctx *ctx, uint16_t *out, float *mean, float *rstd,
                                const float *inp, const float *w, const float *b, int N, int C);
    void (*rmsnorm_forward16)(struct ops_ctx *ctx, uint16_t *out, float *rstd, const float *inp,
                              const float *w, int N, int C, float eps);
    void (*gelu_forward16)(struct ops_ctx *ctx, uint16_t *out, const float *inp, size_t n);
    void (*swiglu_forward16)(struct ops_ctx *ctx, uint16_t *out, const float *inp, int N, int F);
    void (*matmul_forward16)(struct ops_ctx *ctx, float *out, const uint16_t *inp,
                             const uint16_t *w16, const float *bias, int N, int C, int OC);
    void (*matmul_backward16)(struct ops_ctx *ctx, float *dinp, float *dw, float *dbias,
                              const float *dout, const uint16_t *inp, const uint16_t *w16, int N,
                              int C, int OC, bool accumulate);
    /* Optional within (NULL: matmul_forward16 into pre, then gelu_forward16; residual_forward,
     * then the norm's forward16): the fused ones with a bf16 output. */
    void (*matmul_forward_gelu16)(struct ops_ctx *ctx, uint16_t *out, float *pre,
                                  const uint16_t *inp, const uint16_t *w16, const float *bias,
                                  int N, int C, int OC);
    void (*residual_layernorm_forward16)(struct ops_ctx *ctx, float *res, uint16_t *out,
                                         float *mean, float *rstd, const float *a, const float *b,
                                         const float *w, const float *bias, int N, int C);
    void (*residual_rmsnorm_forward16)(struct ops_ctx *ctx, float *res, uint16_t *out,
                                       float *rstd, const float *a, const float *b,
                                       const float *w, int N, int C, float eps);
    /* The classifier's gradient in bf16 (the last stage's logits in chunks, with bf16
     * activations): classifier and classifier_finish (grad_scale != 0) with dlogits (N,Vp)
     * written, rounded once, into dlogits16 instead of over the logits, which are then
     * undefined; and the LM head's backward on them: matmul_backward16 with dout (N,OC) in
     * bf16 as it is (no bias). matmul_backward16 rounds an fp32 dout to bf16 first: the same
     * bits on the CPU as the fp32 dlogits through it. */
    void (*classifier16)(struct ops_ctx *ctx, uint16_t *dlogits16, float *logits, float *losses,
                         const int32_t *targets, int N, int V, int Vp, float grad_scale);
    void (*classifier_finish16)(struct ops_ctx *ctx, uint16_t *dlogits16, float *logits,
                                float *losses, const int32_t *targets, const float *row_max,
                                const float *row_sum, const float *target_logit, int v0, int nv,
                                int Vp, int N, float grad_scale);
    void (*matmul_backward_dout16)(struct ops_ctx *ctx, float *dinp, float *dw,
                                   const uint16_t *dout, const uint16_t *inp, const uint16_t *w16,
                                   int N, int C, int OC, bool accumulate);

    /* Cross-entropy of logits (N,Vp) against targets (N), softmax over the
     * first V columns only. losses (N) = -log p[target]. With grad_scale != 0,
     * logits is overwritten by dlogits = (p - onehot)·grad_scale, with the
     * padded columns set to 0. A target outside [0, V) is never read: its
     * loss is NaN and its row's dlogits p·grad_scale (the data loader refuses
     * such a token first, naming the file and position: runtime/data.c). */
    void (*classifier)(struct ops_ctx *ctx, float *logits, float *losses, const int32_t *targets,
                       int N, int V, int Vp, float grad_scale);
    /* The same over a vocabulary split across ranks, in three parts with the
     * ranks' results combined in between: this rank's logits (N,Vp) hold
     * entries [v0, v0+Vp), of which the first nv are real (the rest padding).
     * max: row_max (N) = max over its nv columns (-inf when nv = 0);
     * sumexp: given the global row_max, row_sum (N) = Σ exp(x - max) over its
     * columns and target_logit (N) = the target's logit if it is here, else 0;
     * finish: given the global max, sum and target logit, losses (N) and, with
     * grad_scale != 0, logits overwritten by dlogits as above. */
    void (*classifier_max)(struct ops_ctx *ctx, const float *logits, float *row_max, int N, int nv,
                           int Vp);
    void (*classifier_sumexp)(struct ops_ctx *ctx, const float *logits, const float *row_max,
                              const int32_t *targets, int v0, int nv, int Vp, float *row_sum,
                              float *target_logit, int N);
    void (*classifier_finish)(struct ops_ctx *ctx, float *logits, float *losses,
                              const int32_t *targets, const float *row_max, const float *row_sum,
                              const float *target_logit, int v0, int nv, int Vp, int N,
                              float grad_scale);

    /* sums[i] (host) = Σ x[i]² over n[i] elements, in double, for count
     * tensors, deterministic for a given n[i]: one wait for all of them (a
     * GPU's sums come back together), not one per tensor. NaN on a failure. */
    void (*sum_squares)(struct ops_ctx *ctx, double *sums, const float *const *x, const size_t *n,
                        int count);

    /* AdamW as torch.optim.AdamW, on n elements, with the gradient first
     * multiplied by grad_scale (clipping); step is 1-based. With p16 != NULL,
     * p16 gets the bf16 copy of the updated parameters. The betas are the
     * plan's doubles: 1 − β and the bias corrections 1 − βᵗ are computed in
     * double (as PyTorch computes its scalars), so a β within 3e-8 of 1, which
     * rounds to 1.0f, still moves the moments and corrects them. */
    void (*adamw)(struct ops_ctx *ctx, float *p, uint16_t *p16, const float *g, float *m, float *v,
                  size_t n, float lr, double beta1, double beta2, float eps, float weight_decay,
                  float grad_scale, int step);
    /* adamw on each of count segments, with weight_decay where the segment
     * decays and 0 where not: the same bits as adamw called segment by
     * segment, in one launch on a GPU. NULL: call adamw per segment. */
    void (*adamw_multi)(struct ops_ctx *ctx, const struct adamw_segment *segs, int count, float lr,
                        double beta1, double beta2, float eps, float weight_decay, float grad_scale,
                        int step);

    /* dst (n, bf16) = round-to-nearest-even(src) */
    void (*to_bf16)(struct ops_ctx *ctx, uint16_t *dst, const float *src, size_t n);

    /* NULL when the bf16 products of matmul_* run natively (or when this
     * pointer is NULL); else one line for the log saying that they are
     * emulated, why, and what it costs. Decided once per process. */
    const char *(*bf16_emulation)(struct ops_ctx *ctx);
    /* NULL while every fp8 product of the context ran on fp8 tensor cores (or
     * when this pointer is NULL: the CPU emulates them all, and says so); else
     * one line for the log saying which fell back to dequantised products, and
     * why. */
    const char *(*fp8_fallback)(struct ops_ctx *ctx);

    /* Optional (NULL where ops need no scratch of their own: the CPU): makes the backend's
     * scratch slots (common/gpt2/gpt2_scratch_slots.h, n_slots of them) bytes[i] bytes each
     * now (0: left), so that a step grows none: what common/gpt2/gpt2_scratch.c counts and
     * plait check predicts. A slot an op later asks more of is grown all the same and said
     * by scratch_grown (with PLAIT_DEBUG_SCRATCH_STRICT=1 in the environment: refused, the
     * op's error, but for an fp8 product's fallback to fp32, which the device decides).
     * 0, or -1 with the error kept for take_error (out of memory). */
    int (*reserve_scratch)(struct ops_ctx *ctx, const uint64_t *bytes, int n_slots);
    /* Optional: NULL while no slot grew past its reservation; else one line for the log
     * naming the first that did and its bytes. */
    const char *(*scratch_grown)(struct ops_ctx *ctx);
};

/* The CPU backend (always present). */
const struct ops *ops_cpu(void);

#endif
