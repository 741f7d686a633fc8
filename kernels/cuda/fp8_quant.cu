/* fp8_quant.cu — kernels/fp8.h's quantiser on the GPU, bit for bit the CPU's
 * (kernels/cpu/fp8.c, mirrored function by function): the E4M3/E5M2 casts on
 * the fp32 bit pattern, a tile's scale from its amax, quantising in tiles
 * (optionally writing the codes transposed, which the TN products need),
 * decoding back to fp32, and the scales rearranged as cuBLASLt reads them
 * (kernels/fp8_lt.h). The amax is a maximum: exact and order-free, so the
 * same bits for any launch shape. The products that use them are in
 * matmul_fp8.cu. */
#include <float.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/fp8_cuda.cuh"

/* fp8.c's struct fmt, as device constants */
struct cu_fmt {
    int mant_bits, bias;
    uint8_t max_code;
    float max, min_normal, subnormal_q;
};

__device__ __forceinline__ cu_fmt cu_format(int fmt)
{
    if (fmt == FP8_E5M2) return cu_fmt{2, 15, 0x7b, 57344.0f, 0x1p-14f, 0x1p16f};
    return cu_fmt{3, 7, 0x7e, 448.0f, 0x1p-6f, 0x1p9f};
}

/* fp8_encode: round to nearest even on the bit pattern, saturating */
__device__ __forceinline__ uint8_t cu_fp8_encode(float x, int fmt)
{
    cu_fmt f = cu_format(fmt);
    uint32_t u = __float_as_uint(x);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    u &= 0x7fffffffu;
    if (u > 0x7f800000u) return 0x7f;
    float a = __uint_as_float(u);
    if (a >= f.max) return sign | f.max_code;
    if (a < f.min_normal) return sign | (uint8_t)rintf(__fmul_rn(a, f.subnormal_q));
    int shift = 23 - f.mant_bits;
    uint32_t r = (u + (1u << (shift - 1)) - 1u + ((u >> shift) & 1u)) >> shift;
    uint32_t code = r - ((uint32_t)(127 - f.bias) << f.mant_bits);
    return sign | (uint8_t)(code > f.max_code ? f.max_code : code);
}

/* fp8_decode: exact */
__device__ __forceinline__ float cu_fp8_decode(uint8_t code, int fmt)
{
    cu_fmt f = cu_format(fmt);
    int M = f.mant_bits;
    uint32_t e = (code & 0x7fu) >> M, m = code & ((1u << M) - 1u);
    uint32_t sign = (uint32_t)(code & 0x80u) << 24;
    float v;
    if (fmt == FP8_E4M3 && (code & 0x7fu) == 0x7fu) return __uint_as_float(0x7fc00000u);
    if (fmt == FP8_E5M2 && e == 31) {
        if (m) return __uint_as_float(0x7fc00000u);
        v = __uint_as_float(0x7f800000u);
    } else if (e == 0) {
        v = __fdiv_rn((float)m, f.subnormal_q);
    } else {
        v = __uint_as_float(((e - (uint32_t)f.bias + 127u) << 23) | (m << (23 - M)));
    }
    return __uint_as_float(__float_as_uint(v) | sign);
}

/* fp8_scale */
__device__ __forceinline__ float cu_fp8_scale(float amax, int fmt)
{
    if (!(amax > 0.0f) || !isfinite(amax)) return 1.0f;
    float s = __fdiv_rn(cu_format(fmt).max, amax);
    return isinf(s) ? FLT_MAX : s;
}

/* ---- quantising ------------------------------------------------------------------ */

/* One block per tile of tr × tc (tile k = br·nbc + bc): its amax, its scale
 * into scales[k], then its codes, at q[r·cols + c] or, transposed, at
 * q[c·rows + r]. */
__global__ void quantize_tiles_kernel(uint8_t *q, float *scales, const float *x, int rows, int cols,
                                      int tr, int tc, int nbc, int fmt, bool transposed)
{
    __shared__ float shared[32];
    __shared__ float scale;
    int k = blockIdx.x, br = k / nbc, bc = k % nbc;
    int r0 = br * tr, c0 = bc * tc;
    int h = min(tr, rows - r0), w = min(tc, cols - c0);
    long n = (long)h * w;
    float m = 0.0f; /* NaN never wins: fmaxf drops it, as fp8.c's comparison does */
    for (long i = threadIdx.x; i < n; i += blockDim.x)
        m = fmaxf(m, fabsf(x[(size_t)(r0 + i / w) * cols + c0 + i % w]));
    m = cu_block_max(m, shared);
    if (threadIdx.x == 0) {
        scale = cu_fp8_scale(m, fmt);
        scales[k] = scale;
    }
    __syncthreads();
    for (long i = threadIdx.x; i < n; i += blockDim.x) {
        size_t r = (size_t)(r0 + i / w), c = (size_t)(c0 + i % w);
        uint8_t code = cu_fp8_encode(__fmul_rn(x[r * cols + c], scale), fmt);
        q[transposed ? c * rows + r : r * cols + c] = code;
    }
}

/* The whole tensor as one tile: partial maxima per block, ... */
enum { AMAX_BLOCKS = 264, AMAX_THREADS = 512 };
static_assert((int)AMAX_BLOCKS == (int)GPT2_SCRATCH_AMAX_BLOCKS, "gpt2_scratch.c counts these partials");

__global__ void amax_partial_kernel(float *partial, const float *x, size_t n)
{
    __shared__ float shared[32];
    float m = 0.0f;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        m = fmaxf(m, fabsf(x[i]));
    m = cu_block_max(m, shared);
    if (threadIdx.x == 0) partial[blockIdx.x] = m;
}

/* ... their maximum and the scale ... */
__global__ void amax_scale_kernel(float *scale, const float *partial, int n_partial, int fmt)
{
    __shared__ float shared[32];
    float m = 0.0f;
    for (int i = threadIdx.x; i < n_partial; i += blockDim.x) m = fmaxf(m, partial[i]);
    m = cu_block_max(m, shared);
    if (threadIdx.x == 0) scale[0] = cu_fp8_scale(m, fmt);
}

/* ... then every code */
__global__ void encode_kernel(uint8_t *q, const float *x, const float *scale, int rows, int cols,
                              int fmt, bool transposed)
{
    size_t n = (size_t)rows * cols, i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    size_t r = i / (size_t)cols, c = i % (size_t)cols;
    uint8_t code = cu_fp8_encode(__fmul_rn(x[i], scale[0]), fmt);
    q[transposed ? c * rows + r : i] = code;
}

void cu_fp8_quantize_to(struct ops_ctx *ctx, uint8_t *q, float *scales, const float *x, int rows,
                        int cols, int tile_rows, int tile_cols, enum fp8_format fmt,
                        bool transposed)
{
    if (rows <= 0 || cols <= 0) return;
    int tr = tile_rows > 0 ? tile_rows : rows, tc = tile_cols > 0 ? tile_cols : cols;
    int nbr = (rows + tr - 1) / tr, nbc = (cols + tc - 1) / tc;
    size_t n = (size_t)rows * cols;
    if (nbr * nbc == 1 && n > 4096) { /* one tile too big for one block */
        float *partial = (float *)cu_scratch(ctx, CU_FP8_AMAX, AMAX_BLOCKS * sizeof(float));
        if (!partial) return;
        amax_partial_kernel<<<AMAX_BLOCKS, AMAX_THREADS, 0, ctx->stream>>>(partial, x, n);
        amax_scale_kernel<<<1, 256, 0, ctx->stream>>>(scales, partial, AMAX_BLOCKS, (int)fmt);
        encode_kernel<<<cu_blocks(n, 256), 256, 0, ctx->stream>>>(q, x, scales, rows, cols,
                                                                  (int)fmt, transposed);
        (void)LAUNCH_OK(ctx);
        return;
    }
    long tile = (long)tr * tc;
    unsigned threads = tile >= 256 ? 256 : (unsigned)((tile + 31) / 32 * 32);
    quantize_tiles_kernel<<<(unsigned)(nbr * nbc), threads, 0, ctx->stream>>>(
        q, scales, x, rows, cols, tr, tc, nbc, (int)fmt, transposed);
    (void)LAUNCH_OK(ctx);
}

void cu_quantize_fp8(struct ops_ctx *ctx, uint8_t *q, float *scales, const float *x, int rows,
                     int cols, int tile_rows, int tile_cols, enum fp8_format fmt)
{
    cu_fp8_quantize_to(ctx, q, scales, x, rows, cols, tile_rows, tile_cols, fmt, false);
}

/* ---- decoding, transposing --------------------------------------------------------- */

/* x = decode(q) / the scale of its tile (fp8_dequantize's with scales) */
__global__ void dequantize_kernel(float *x, const uint8_t *q, const float *scales, int rows,
                                  int cols, int tr, int tc, int nbc, int fmt)
{
    size_t n = (size_t)rows * cols, i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    int r = (int)(i / (size_t)cols), c = (int)(i % (size_t)cols);
    x[i] = __fdiv_rn(cu_fp8_decode(q[i], fmt), scales[(r / tr) * nbc + c / tc]);
}

void cu_fp8_dequantize(struct ops_ctx *ctx, float *x, const uint8_t *q, const float *scales,
                       int rows, int cols, int tile_rows, int tile_cols, enum fp8_format fmt)
{
    if (rows <= 0 || cols <= 0) return;
    int tr = tile_rows > 0 ? tile_rows : rows, tc = tile_cols > 0 ? tile_cols : cols;
    size_t n = (size_t)rows * cols;
    dequantize_kernel<<<cu_blocks(n, 256), 256, 0, ctx->stream>>>(x, q, scales, rows, cols, tr, tc,
                                                                  (cols + tc - 1) / tc, (int)fmt);
    (void)LAUNCH_OK(ctx);
}

/* out (cols, rows) = inᵀ for in (rows, cols), through 32×32 tiles in shared memory */
template <typename T> __global__ void transpose_kernel(T *out, const T *in, int rows, int cols)
{
    __shared__ T tile[32][33];
    int bx = blockIdx.x * 32, by = blockIdx.y * 32;
    for (int j = threadIdx.y; j < 32; j += blockDim.y) {
        int r = by + j, c = bx + threadIdx.x;
        if (r < rows && c < cols) tile[j][threadIdx.x] = in[(size_t)r * cols + c];
    }
    __syncthreads();
    for (int j = threadIdx.y; j < 32; j += blockDim.y) {
        int c = bx + j, r = by + threadIdx.x;
        if (r < rows && c < cols) out[(size_t)c * rows + r] = tile[threadIdx.x][j];
    }
}

void cu_fp8_transpose(struct ops_ctx *ctx, uint8_t *out, const uint8_t *in, int rows, int cols)
{
    if (rows <= 0 || cols <= 0) return;
    dim3 grid((unsigned)((cols + 31) / 32), (unsigned)((rows + 31) / 32)), block(32, 8);
    transpose_kernel<uint8_t><<<grid, block, 0, ctx->stream>>>(out, in, rows, cols);
    (void)LAUNCH_OK(ctx);
}

/* cuBLASLt's scale array of l (kernels/fp8_lt.h) from plait's scales s:
 * every entry written, the padding too (cuBLASLt must never find stale
 * floats there) */
__global__ void lt_scales_kernel(float *out, const float *s, struct fp8_lt_scales l, size_t n)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) out[i] = fp8_lt_entry(s, l, i);
}

void cu_fp8_lt_scales(struct ops_ctx *ctx, float *out, const float *s,
                      const struct fp8_lt_scales *l)
{
    size_t n = fp8_lt_count(l);
    if (n == 0) return;
    lt_scales_kernel<<<cu_blocks(n, 256), 256, 0, ctx->stream>>>(out, s, *l, n);
    (void)LAUNCH_OK(ctx);
}
