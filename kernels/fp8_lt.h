/* fp8_lt.h — where cuBLASLt reads block scales on Hopper, and how plait's own
 * scales (kernels/fp8.h's fp8_quantize layout) are rearranged into that
 * layout for the three products of a linear layer. Header-only so that the
 * CUDA backend's kernel (kernels/cuda/fp8_quant.cu) and the CPU unit tests
 * (tests/unit/test_fp8.c, which multiply through this layout on the CPU) use
 * the same index arithmetic. Not the products themselves (matmul_fp8.cu).
 *
 * cuBLASLt's layouts (cuBLAS 12.9+, sm_90; cublasLtMatmulMatrixScale_t). An
 * fp8 operand on Hopper is always stored (outer, K) row-major, K contiguous
 * (the "TN" form: A is K × M column-major taken transposed, B is K × N). Its
 * scales, as dequantising factors (1/scale):
 *   VEC128_32F (1 × 128 tiles along K): a (⌈K/128⌉, outer) row-major array,
 *     the outer index fastest: tile (o, kb) at kb·outer + o.
 *   BLK128x128_32F (128 × 128 blocks): a (⌈outer/128⌉, ld) row-major array,
 *     the K blocks fastest, ld = ⌈K/128⌉ rounded up to a multiple of 4:
 *     block (ob, kb) at ob·ld + kb; the padding is never read for a tile.
 * Sources, which agree: NVIDIA's CUDALibrarySamples cuBLASLt/Common/helpers.h
 * getScaleTensorSize (VEC128: ⌈inner/128⌉·outer; BLK128x128: roundoff(⌈inner/
 * 128⌉, 4)·⌈outer/128⌉, "see cuBLAS docs: block scaling factors layout");
 * Transformer Engine's "GEMM-ready" block-scaling format (docs/features/
 * low_precision_training/fp8_blockwise_scaling: 1D scales [K/128, pad4(outer)]
 * transposed, 2D scales [outer/128, pad4(K/128)]; its quantizers write
 * scale_inv[kb·stride + o] and scale_inv[ob·stride + kb], then hand the
 * arrays to cublasLtMatmul as they are); PyTorch's scaled_mm on sm_90 (1×128
 * scales "outer-dim-major", strides (1, outer); 128×128 scales padded to L4 =
 * round_up(⌈K/128⌉, 4) with K blocks contiguous). The fp8 path needs every
 * dimension a multiple of 16, so outer is a multiple of 4 and the VEC128
 * array needs no padding. */
#ifndef PLAIT_KERNELS_FP8_LT_H
#define PLAIT_KERNELS_FP8_LT_H

#include <stdbool.h>
#include <stddef.h>

#include "kernels/fp8.h" /* FP8_TILE */

#ifdef __CUDACC__
#define FP8_LT_HD __host__ __device__
#else
#define FP8_LT_HD
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* the two block-scaling modes (cuBLASLt's VEC128_32F, BLK128x128_32F) */
enum fp8_lt_mode { FP8_LT_VEC128, FP8_LT_BLK128 };

/* The three products of a linear layer, each as cuBLASLt's TN product
 * D (Nb, Ma) = B (Nb, K) · A (Ma, K)ᵀ, operands (outer, K):
 *   FP8_FWD:  out (N,OC) = x (N,C) · w (OC,C)ᵀ          A = w,  B = x,     K = C
 *   FP8_DINP: dinp (N,C) = dout (N,OC) · (wᵀ (C,OC))ᵀ   A = wᵀ, B = dout,  K = OC
 *   FP8_DW:   dw (OC,C) = doutᵀ (OC,N) · (xᵀ (C,N))ᵀ    A = xᵀ, B = doutᵀ, K = N */
enum fp8_product { FP8_FWD, FP8_DINP, FP8_DW };

/* One operand's scales: plait's array and how cuBLASLt's is made from it. */
struct fp8_lt_scales {
    enum fp8_lt_mode mode;
    int rows, cols;  /* plait's scales, (rows, cols) row-major */
    bool transposed; /* cuBLASLt's array holds them transposed */
    int out_rows;    /* cuBLASLt's array: out_rows rows ... */
    int ld;          /* ... ld floats apart (beyond the row's width: padding) */
};

static inline int fp8_lt_blocks(int n)
{
    return (n + FP8_TILE - 1) / FP8_TILE;
}

/* plait's scales (rows, cols) of an operand in `mode`, whose K tiles run
 * along the array's columns (k_along_cols) or its rows */
static inline struct fp8_lt_scales fp8_lt_layout(enum fp8_lt_mode mode, int rows, int cols,
                                                 bool k_along_cols)
{
    struct fp8_lt_scales l;
    l.mode = mode;
    l.rows = rows;
    l.cols = cols;
    /* VEC128 wants the outer index fastest, BLK128 the K blocks fastest */
    l.transposed = (mode == FP8_LT_VEC128) == k_along_cols;
    l.out_rows = l.transposed ? cols : rows;
    int width = l.transposed ? rows : cols;
    l.ld = mode == FP8_LT_BLK128 ? (width + 3) / 4 * 4 : width;
    return l;
}

/* With block scaling, operand A (a) or B of product p, from plait's scales of
 * it: w's (⌈OC/128⌉, ⌈C/128⌉) 128×128 blocks (the copy the optimizer writes);
 * an activation's or gradient's 1×128 tiles along the reduced dimension,
 * x's (N, ⌈C/128⌉) and dout's (N, ⌈OC/128⌉), or in dw, reduced along N,
 * 128×1 tiles: x's (⌈N/128⌉, C), dout's (⌈N/128⌉, OC). */
static inline struct fp8_lt_scales fp8_lt_block_scales(enum fp8_product p, bool a, int N, int C,
                                                       int OC)
{
    switch (p) {
    case FP8_FWD:
        return a ? fp8_lt_layout(FP8_LT_BLK128, fp8_lt_blocks(OC), fp8_lt_blocks(C), true)
                 : fp8_lt_layout(FP8_LT_VEC128, N, fp8_lt_blocks(C), true);
    case FP8_DINP: /* wᵀ: the same blocks, K (OC) now along plait's rows */
        return a ? fp8_lt_layout(FP8_LT_BLK128, fp8_lt_blocks(OC), fp8_lt_blocks(C), false)
                 : fp8_lt_layout(FP8_LT_VEC128, N, fp8_lt_blocks(OC), true);
    case FP8_DW:
    default:
        return a ? fp8_lt_layout(FP8_LT_VEC128, fp8_lt_blocks(N), C, false)
                 : fp8_lt_layout(FP8_LT_VEC128, fp8_lt_blocks(N), OC, false);
    }
}

/* How many floats cuBLASLt's array of l holds. */
static inline size_t fp8_lt_count(const struct fp8_lt_scales *l)
{
    return (size_t)l->out_rows * (size_t)l->ld;
}

/* Entry i of cuBLASLt's array of l: 1/scale of the tile plait keeps in s,
 * or 1 in the padding. */
static inline FP8_LT_HD float fp8_lt_entry(const float *s, struct fp8_lt_scales l, size_t i)
{
    int r = (int)(i / (size_t)l.ld), c = (int)(i % (size_t)l.ld);
    int width = l.transposed ? l.rows : l.cols;
    if (c >= width) return 1.0f;
    float v = l.transposed ? s[(size_t)c * (size_t)l.cols + (size_t)r]
                           : s[(size_t)r * (size_t)l.cols + (size_t)c];
    return 1.0f / v;
}

#ifdef __cplusplus
}
#endif

#endif
