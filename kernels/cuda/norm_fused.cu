/* norm_fused.cu — a block's residual add fused with the norm of its result (kernels/ops.h's
 * residual_layernorm_forward and residual_rmsnorm_forward, and their ...16 with the norm's
 * output in bf16, one kernel for both, rounded as it is stored): one warp a row reads a and b
 * once, writes res once and keeps the row in registers for the statistics and the output
 * (a row wider than 32·CACHED columns reads its rest back from res, each lane its own
 * writes). The sums run in layernorm.cu's and llama.cu's order (each lane its columns in
 * order, then the warp's butterfly): the composition's values. Not the backward: the
 * norms' own. */
#include "kernels/cuda/cuda_common.cuh"

enum { WARPS = 8, THREADS = WARPS * 32, CACHED = 32 };

/* f(i, x) for each column i of the lane's in order, x the row's value there: the first
 * CACHED of them from v (indices the compiler knows: registers), the rest read from row */
template <typename F>
__device__ __forceinline__ void each_column(const float (&v)[CACHED], const float *row, int lane,
                                            int C, F f)
{
#pragma unroll
    for (int k = 0; k < CACHED; k++)
        if (lane + 32 * k < C) f(lane + 32 * k, v[k]);
    for (int i = lane + 32 * CACHED; i < C; i += 32) f(i, row[i]);
}

/* res (N,C) = a + b (res may alias a or b: a lane reads a column before it writes it), then
 * LAYERNORM: out = (res − mean)·rstd·w + bias, mean = Σres/C, rstd = 1/sqrt(Σ(res −
 * mean)²/C + eps), mean and rstd (N) saved, as layernorm_forward_kernel; else out =
 * w·(res·rstd), rstd = 1/sqrt(Σres²/C + eps) saved, as rmsnorm_forward_kernel. out is
 * stored as Out (float, or uint16_t: bf16). */
template <bool LAYERNORM, typename Out>
__global__ void residual_norm_kernel(float *res, Out *out, float *mean, float *rstd, const float *a,
                                     const float *b, const float *w, const float *bias, int N,
                                     int C, float eps)
{
    int row = blockIdx.x * WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return; /* the whole warp: one row a warp */
    size_t off = (size_t)row * C;
    float *x = res + off, v[CACHED], sum = 0.0f;
#pragma unroll
    for (int k = 0; k < CACHED; k++) {
        int i = lane + 32 * k;
        v[k] = i < C ? a[off + i] + b[off + i] : 0.0f;
        if (i < C) {
            x[i] = v[k];
            sum += LAYERNORM ? v[k] : v[k] * v[k];
        }
    }
    for (int i = lane + 32 * CACHED; i < C; i += 32) {
        float y = a[off + i] + b[off + i];
        x[i] = y;
        sum += LAYERNORM ? y : y * y;
    }
    float m = 0.0f, s;
    if (LAYERNORM) {
        m = cu_warp_sum(sum) / C;
        float var = 0.0f;
        each_column(v, x, lane, C, [&](int, float y) { var += (y - m) * (y - m); });
        s = 1.0f / sqrtf(cu_warp_sum(var) / C + eps);
    } else {
        s = 1.0f / sqrtf(cu_warp_sum(sum) / C + eps);
    }
    Out *o = out + off;
    each_column(v, x, lane, C, [&](int i, float y) {
        cu_store(o + i, LAYERNORM ? (y - m) * s * w[i] + bias[i] : w[i] * (y * s));
    });
    if (lane == 0) {
        if (LAYERNORM) mean[row] = m;
        rstd[row] = s;
    }
}

template <bool LAYERNORM, typename Out>
static void residual_norm(struct ops_ctx *ctx, float *res, Out *out, float *mean, float *rstd,
                          const float *a, const float *b, const float *w, const float *bias, int N,
                          int C, float eps)
{
    if (N <= 0) return;
    residual_norm_kernel<LAYERNORM, Out><<<cu_blocks((size_t)N, WARPS), THREADS, 0, ctx->stream>>>(
        res, out, mean, rstd, a, b, w, bias, N, C, eps);
    (void)LAUNCH_OK(ctx);
}

void cu_residual_layernorm_forward(struct ops_ctx *ctx, float *res, float *out, float *mean,
                                   float *rstd, const float *a, const float *b, const float *w,
                                   const float *bias, int N, int C)
{
    residual_norm<true>(ctx, res, out, mean, rstd, a, b, w, bias, N, C, 1e-5f);
}

void cu_residual_layernorm_forward16(struct ops_ctx *ctx, float *res, uint16_t *out, float *mean,
                                     float *rstd, const float *a, const float *b, const float *w,
                                     const float *bias, int N, int C)
{
    residual_norm<true>(ctx, res, out, mean, rstd, a, b, w, bias, N, C, 1e-5f);
}

void cu_residual_rmsnorm_forward(struct ops_ctx *ctx, float *res, float *out, float *rstd,
                                 const float *a, const float *b, const float *w, int N, int C,
                                 float eps)
{
    residual_norm<false>(ctx, res, out, NULL, rstd, a, b, w, NULL, N, C, eps);
}

void cu_residual_rmsnorm_forward16(struct ops_ctx *ctx, float *res, uint16_t *out, float *rstd,
                                   const float *a, const float *b, const float *w, int N, int C,
                                   float eps)
{
    residual_norm<false>(ctx, res, out, NULL, rstd, a, b, w, NULL, N, C, eps);
}
