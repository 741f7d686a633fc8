/* layernorm.cu — LayerNorm forward and backward, fused: one warp per row for
 * the statistics, the output (fp32, or bf16 rounded as it is stored: one kernel
 * for both) and the input gradient; the weight and bias gradients in two
 * deterministic passes (chunks of rows, then chunks in order, see
 * cu_column_sum_finish). eps 1e-5 as in kernels/cpu. */
#include "kernels/cuda/cuda_common.cuh"

enum { WARPS = 8, THREADS = WARPS * 32 };

/* out (N,C) = (inp - mean)·rstd·w + b, stored as Out (float, or uint16_t: bf16);
 * mean, rstd (N). Two passes over the row, as the CPU (mean, then the variance
 * around it). */
template <typename Out>
__global__ void layernorm_forward_kernel(Out *out, float *mean, float *rstd, const float *inp,
                                         const float *w, const float *b, int N, int C)
{
    int row = blockIdx.x * WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const float *x = inp + (size_t)row * C;
    float sum = 0.0f;
    for (int i = lane; i < C; i += 32) sum += x[i];
    float m = cu_warp_sum(sum) / C;
    float var = 0.0f;
    for (int i = lane; i < C; i += 32) var += (x[i] - m) * (x[i] - m);
    float s = 1.0f / sqrtf(cu_warp_sum(var) / C + 1e-5f);
    Out *o = out + (size_t)row * C;
    for (int i = lane; i < C; i += 32) cu_store(o + i, (x[i] - m) * s * w[i] + b[i]);
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = s;
    }
}

template <typename Out>
static void layernorm_forward(struct ops_ctx *ctx, Out *out, float *mean, float *rstd,
                              const float *inp, const float *w, const float *b, int N, int C)
{
    if (N <= 0) return;
    layernorm_forward_kernel<Out><<<cu_blocks((size_t)N, WARPS), THREADS, 0, ctx->stream>>>(
        out, mean, rstd, inp, w, b, N, C);
    (void)LAUNCH_OK(ctx);
}

void cu_layernorm_forward(struct ops_ctx *ctx, float *out, float *mean, float *rstd,
                          const float *inp, const float *w, const float *b, int N, int C)
{
    layernorm_forward(ctx, out, mean, rstd, inp, w, b, N, C);
}

void cu_layernorm_forward16(struct ops_ctx *ctx, uint16_t *out, float *mean, float *rstd,
                            const float *inp, const float *w, const float *b, int N, int C)
{
    layernorm_forward(ctx, out, mean, rstd, inp, w, b, N, C);
}

/* dinp (N,C) += (dout·w - mean(dout·w) - norm·mean(dout·w·norm))·rstd */
__global__ void layernorm_dinp_kernel(float *dinp, const float *dout, const float *inp,
                                      const float *w, const float *mean, const float *rstd, int N,
                                      int C)
{
    int row = blockIdx.x * WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const float *x = inp + (size_t)row * C, *d = dout + (size_t)row * C;
    float m = mean[row], s = rstd[row];
    float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
    for (int i = lane; i < C; i += 32) {
        float dnorm = d[i] * w[i];
        dnorm_mean += dnorm;
        dnorm_norm_mean += dnorm * (x[i] - m) * s;
    }
    dnorm_mean = cu_warp_sum(dnorm_mean) / C;
    dnorm_norm_mean = cu_warp_sum(dnorm_norm_mean) / C;
    float *dx = dinp + (size_t)row * C;
    for (int i = lane; i < C; i += 32) {
        float norm = (x[i] - m) * s;
        dx[i] += (d[i] * w[i] - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
}

/* pw, pb (chunks, C): Σ over chunk blockIdx.y's rows, in row order, of
 * dout·norm and dout */
__global__ void layernorm_dwdb_partial_kernel(float *pw, float *pb, const float *dout,
                                              const float *inp, const float *mean,
                                              const float *rstd, int N, int C)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    int r0 = blockIdx.y * CU_CHUNK_ROWS, r1 = min(r0 + CU_CHUNK_ROWS, N);
    float gw = 0.0f, gb = 0.0f;
    for (int r = r0; r < r1; r++) {
        float d = dout[(size_t)r * C + c];
        gw += d * (inp[(size_t)r * C + c] - mean[r]) * rstd[r];
        gb += d;
    }
    pw[(size_t)blockIdx.y * C + c] = gw;
    pb[(size_t)blockIdx.y * C + c] = gb;
}

void cu_layernorm_backward(struct ops_ctx *ctx, float *dinp, float *dw, float *db,
                           const float *dout, const float *inp, const float *w, const float *mean,
                           const float *rstd, int N, int C, bool accumulate)
{
    if (C <= 0) return;
    if (N > 0) {
        layernorm_dinp_kernel<<<cu_blocks((size_t)N, WARPS), THREADS, 0, ctx->stream>>>(
            dinp, dout, inp, w, mean, rstd, N, C);
        if (!LAUNCH_OK(ctx)) return;
    }
    int chunks = (N + CU_CHUNK_ROWS - 1) / CU_CHUNK_ROWS;
    float *pw = NULL, *pb = NULL;
    if (chunks > 0) {
        size_t bytes = (size_t)chunks * C * sizeof(float);
        pw = (float *)cu_scratch(ctx, CU_SCRATCH_PARTIAL, bytes);
        pb = (float *)cu_scratch(ctx, CU_SCRATCH_PARTIAL2, bytes);
        if (!pw || !pb) return;
        dim3 grid(cu_blocks((size_t)C, THREADS), (unsigned)chunks);
        layernorm_dwdb_partial_kernel<<<grid, THREADS, 0, ctx->stream>>>(pw, pb, dout, inp, mean,
                                                                         rstd, N, C);
        if (!LAUNCH_OK(ctx)) return;
    }
    cu_column_sum_finish(ctx, dw, pw, chunks, C, accumulate);
    cu_column_sum_finish(ctx, db, pb, chunks, C, accumulate);
}
