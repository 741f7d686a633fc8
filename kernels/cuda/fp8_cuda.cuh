/* fp8_cuda.cuh — what the CUDA backend's fp8 files share (fp8_quant.cu, the
 * quantiser; matmul_fp8.cu, the products): the quantiser's entry points and
 * what the device can do (their scratch slots are cuda_common.cuh's). Internal, like
 * cuda_common.cuh. */
#ifndef PLAIT_KERNELS_CUDA_FP8_CUDA_CUH
#define PLAIT_KERNELS_CUDA_FP8_CUDA_CUH

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/fp8.h"
#include "kernels/fp8_lt.h"

struct ops_ctx; /* cuda_common.cuh */

/* kernels/fp8.h's fp8_quantize, bit for bit, on the backend's stream; with
 * transposed the codes go to q (cols, rows) at the transposed places (the
 * scales keep fp8_quantize's layout). */
void cu_fp8_quantize_to(struct ops_ctx *ctx, uint8_t *q, float *scales, const float *x, int rows,
                        int cols, int tile_rows, int tile_cols, enum fp8_format fmt,
                        bool transposed);
/* the table's quantize_fp8 */
void cu_quantize_fp8(struct ops_ctx *ctx, uint8_t *q, float *scales, const float *x, int rows,
                     int cols, int tile_rows, int tile_cols, enum fp8_format fmt);
/* fp8_dequantize with scales (divided out tile by tile; a tensor is one tile) */
void cu_fp8_dequantize(struct ops_ctx *ctx, float *x, const uint8_t *q, const float *scales,
                       int rows, int cols, int tile_rows, int tile_cols, enum fp8_format fmt);
/* out (cols, rows) = in (rows, cols) transposed, bytes */
void cu_fp8_transpose(struct ops_ctx *ctx, uint8_t *out, const uint8_t *in, int rows, int cols);
/* cuBLASLt's scale array of l from plait's scales s (kernels/fp8_lt.h:
 * fp8_lt_count(l) floats, each 1/scale, the padding included) */
void cu_fp8_lt_scales(struct ops_ctx *ctx, float *out, const float *s,
                      const struct fp8_lt_scales *l);

/* matmul_fp8.cu: the table's products (the device's compute capability is
 * the context's cc) */
void cu_matmul_forward_fp8(struct ops_ctx *ctx, float *out, const float *inp, const uint8_t *w8,
                           const float *w_scales, const float *bias, int N, int C, int OC,
                           enum fp8_scaling scaling);
void cu_matmul_backward_fp8(struct ops_ctx *ctx, float *dinp, float *dw, float *dbias,
                            const float *dout, const float *inp, const uint8_t *w8,
                            const float *w_scales, int N, int C, int OC, bool accumulate,
                            enum fp8_scaling scaling);
/* NULL while every fp8 product ran on fp8 tensor cores; else the line that
 * says which fell back to dequantised fp32 products, and why */
const char *cu_fp8_fallback(struct ops_ctx *ctx);
/* The first compute capability with fp8 tensor cores (Ada, sm_89). */
#define CU_FP8_MIN_CC 89

#endif
