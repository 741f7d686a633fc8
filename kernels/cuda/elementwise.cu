/* elementwise.cu — the element-wise ops (bias add, GELU forward, its output fp32
 * or bf16 from one kernel, and backward, residual add, fp32 -> bf16) and the
 * deterministic two-pass column sums the
 * other files use for bias and LayerNorm parameter gradients. One thread per
 * element; no reductions across threads except in the column sums. */
#include "kernels/cuda/cuda_common.cuh"

enum { THREADS = 256 };

/* out (N,C) += bias (C) */
__global__ void add_bias_kernel(float *out, const float *bias, size_t total, int C)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) out[i] += bias[i % C];
}

void cu_add_bias(struct ops_ctx *ctx, float *out, const float *bias, int N, int C)
{
    size_t total = (size_t)N * C;
    if (!total) return;
    add_bias_kernel<<<cu_blocks(total, THREADS), THREADS, 0, ctx->stream>>>(out, bias, total, C);
    (void)LAUNCH_OK(ctx);
}

#define GELU_S 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_A 0.044715f

/* out stored as Out (float, or uint16_t: bf16) */
template <typename Out> __global__ void gelu_forward_kernel(Out *out, const float *inp, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = inp[i];
    cu_store(out + i, 0.5f * x * (1.0f + tanhf(GELU_S * (x + GELU_A * x * x * x))));
}

__global__ void gelu_backward_kernel(float *dinp, const float *inp, const float *dout, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = inp[i];
    float th = tanhf(GELU_S * (x + GELU_A * x * x * x));
    float sech2 = 1.0f - th * th;
    float grad = 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_S * (1.0f + 3.0f * GELU_A * x * x);
    dinp[i] = grad * dout[i];
}

template <typename Out>
static void gelu_forward(struct ops_ctx *ctx, Out *out, const float *inp, size_t n)
{
    if (!n) return;
    gelu_forward_kernel<Out><<<cu_blocks(n, THREADS), THREADS, 0, ctx->stream>>>(out, inp, n);
    (void)LAUNCH_OK(ctx);
}

void cu_gelu_forward(struct ops_ctx *ctx, float *out, const float *inp, size_t n)
{
    gelu_forward(ctx, out, inp, n);
}

void cu_gelu_forward16(struct ops_ctx *ctx, uint16_t *out, const float *inp, size_t n)
{
    gelu_forward(ctx, out, inp, n);
}

void cu_gelu_backward(struct ops_ctx *ctx, float *dinp, const float *inp, const float *dout,
                      size_t n)
{
    if (!n) return;
    gelu_backward_kernel<<<cu_blocks(n, THREADS), THREADS, 0, ctx->stream>>>(dinp, inp, dout, n);
    (void)LAUNCH_OK(ctx);
}

/* out = a + b (out may alias a or b: each thread reads before it writes) */
__global__ void residual_kernel(float *out, const float *a, const float *b, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}

void cu_residual_forward(struct ops_ctx *ctx, float *out, const float *a, const float *b, size_t n)
{
    if (!n) return;
    residual_kernel<<<cu_blocks(n, THREADS), THREADS, 0, ctx->stream>>>(out, a, b, n);
    (void)LAUNCH_OK(ctx);
}

__global__ void to_bf16_kernel(uint16_t *dst, const float *src, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = cu_bf16_round(src[i]);
}

void cu_to_bf16(struct ops_ctx *ctx, uint16_t *dst, const float *src, size_t n)
{
    if (!n) return;
    to_bf16_kernel<<<cu_blocks(n, THREADS), THREADS, 0, ctx->stream>>>(dst, src, n);
    (void)LAUNCH_OK(ctx);
}

/* ---- column sums ---------------------------------------------------------------------- */

/* partial (chunks, C): chunk blockIdx.y's rows of in (N,C) summed in row order */
__global__ void column_partial_kernel(float *partial, const float *in, int N, int C)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    int r0 = blockIdx.y * CU_CHUNK_ROWS, r1 = min(r0 + CU_CHUNK_ROWS, N);
    float s = 0.0f;
    for (int r = r0; r < r1; r++) s += in[(size_t)r * C + c];
    partial[(size_t)blockIdx.y * C + c] = s;
}

__global__ void column_finish_kernel(float *out, const float *partial, int chunks, int C,
                                     bool accumulate)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float s = accumulate ? out[c] : 0.0f;
    for (int k = 0; k < chunks; k++) s += partial[(size_t)k * C + c];
    out[c] = s;
}

void cu_column_sum_finish(struct ops_ctx *ctx, float *out, const float *partial, int chunks, int C,
                          bool accumulate)
{
    if (C <= 0) return;
    column_finish_kernel<<<cu_blocks((size_t)C, THREADS), THREADS, 0, ctx->stream>>>(
        out, partial, chunks, C, accumulate);
    (void)LAUNCH_OK(ctx);
}

void cu_column_sum(struct ops_ctx *ctx, float *out, const float *in, int N, int C, bool accumulate)
{
    if (C <= 0) return;
    int chunks = (N + CU_CHUNK_ROWS - 1) / CU_CHUNK_ROWS;
    if (chunks > 0) {
        float *partial =
            (float *)cu_scratch(ctx, CU_SCRATCH_PARTIAL, (size_t)chunks * C * sizeof(float));
        if (!partial) return;
        dim3 grid(cu_blocks((size_t)C, THREADS), (unsigned)chunks);
        column_partial_kernel<<<grid, THREADS, 0, ctx->stream>>>(partial, in, N, C);
        if (!LAUNCH_OK(ctx)) return;
        cu_column_sum_finish(ctx, out, partial, chunks, C, accumulate);
    } else {
        cu_column_sum_finish(ctx, out, NULL, 0, C, accumulate);
    }
}
