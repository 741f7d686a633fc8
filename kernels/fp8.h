/* fp8.h — FP8 quantisation as precision "fp8" trains with: the formats, the
 * scaling, and one quantiser the matrix products of every backend use (the
 * CPU emulates the products in fp32 on the quantised values, kernels/cpu/fp8.c;
 * a CUDA backend mirrors these functions and feeds the bytes to cuBLASLt).
 *
 * Formats (OCP FP8, NVIDIA's __nv_fp8_e4m3 / __nv_fp8_e5m2):
 *   E4M3: 1 sign, 4 exponent (bias 7), 3 mantissa bits, subnormals down to
 *         2^-9, max ±448, no infinity, S.1111.111 is NaN.
 *   E5M2: 1 sign, 5 exponent (bias 15), 2 mantissa bits, subnormals down to
 *         2^-16, max ±57344, ±infinity and NaNs as in IEEE.
 * A cast rounds to nearest, ties to even, and saturates: a finite value or an
 * infinity beyond the max becomes ±max (cvt's .satfinite); NaN stays NaN.
 *
 * Scaling: a tensor is cut into tiles of tile_rows × tile_cols (0 = the whole
 * dimension); each tile's scale comes from its current amax (the largest |x|,
 * NaN ignored): scale = max / amax, 1 when amax is 0 or not finite, FLT_MAX
 * when max / amax overflows. A value is multiplied by its tile's scale (in
 * fp32) before the cast; a product of quantised tensors is divided by both
 * scales after.
 *   "tensor": one tile (0 × 0): Transformer Engine's current scaling.
 *   "block":  DeepSeek-V3's fine-grained scaling: activations and gradients in
 *             1 × 128 tiles along the product's reduction dimension, weights
 *             in 128 × 128 blocks (FP8_TILE). */
#ifndef PLAIT_KERNELS_FP8_H
#define PLAIT_KERNELS_FP8_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" { /* the C quantiser, callable from the CUDA backend's C++ (its selftest) */
#endif

enum fp8_format { FP8_E4M3, FP8_E5M2 };
/* as plan.json's fp8_scaling (common/plan/plan.h's enum plan_fp8_scaling) */
enum fp8_scaling { FP8_SCALING_TENSOR, FP8_SCALING_BLOCK };

/* The largest finite value of a format: 448, 57344. */
float fp8_max(enum fp8_format fmt);

/* One value cast (no scaling), and one code back to fp32 (exact). */
uint8_t fp8_encode(float x, enum fp8_format fmt);
float fp8_decode(uint8_t code, enum fp8_format fmt);

/* The scale of a tile whose amax is amax. */
float fp8_scale(float amax, enum fp8_format fmt);

/* The tile edge of block scaling. */
#define FP8_TILE 128

/* The tile edge of a weight matrix's fp8 copy (both dimensions; 0 = the whole
 * tensor, one scale): FP8_TILE with block scaling. The 128×128 blocks serve a
 * product and its transpose alike. */
static inline int fp8_weight_tile(enum fp8_scaling scaling)
{
    return scaling == FP8_SCALING_BLOCK ? FP8_TILE : 0;
}

/* How many scales a (rows, cols) matrix has in tiles of tile_rows × tile_cols
 * (0 = the whole dimension): ⌈rows/tile_rows⌉ · ⌈cols/tile_cols⌉; edge tiles
 * are smaller (odd sizes are not padded). */
size_t fp8_scale_count(int rows, int cols, int tile_rows, int tile_cols);

/* q (rows, cols) = cast(x · scale of its tile); scales (⌈rows/tile_rows⌉,
 * ⌈cols/tile_cols⌉) row-major. Row-major x, OpenMP inside. */
void fp8_quantize(uint8_t *q, float *scales, const float *x, int rows, int cols, int tile_rows,
                  int tile_cols, enum fp8_format fmt);

/* x (rows, cols) = decode(q) / scale of its tile; with scales NULL, decode(q)
 * alone (per-tensor products divide the product instead). */
void fp8_dequantize(float *x, const uint8_t *q, const float *scales, int rows, int cols,
                    int tile_rows, int tile_cols, enum fp8_format fmt);

#ifdef __cplusplus
}
#endif

#endif
