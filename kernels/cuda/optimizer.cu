/* optimizer.cu — AdamW fused with the bf16 copy of the updated parameters
 * (torch.optim.AdamW's single-tensor arithmetic, as kernels/cpu), and the
 * sum of squares for gradient clipping in double, deterministic: fixed
 * blocks, a fixed-tree reduction inside each, then one block over them. */
#include <math.h>

#include "kernels/cuda/cuda_common.cuh"

enum { THREADS = 256, SUM_BLOCKS = 1024 };
static_assert((int)SUM_BLOCKS == (int)GPT2_SCRATCH_SUM_BLOCKS, "gpt2_scratch.c counts these partials");

/* The CPU's arithmetic operation for operation, each rounded on its own
 * (__fmul_rn and friends are never fused into an FMA, and the CPU build does
 * not contract either): the same bits as kernels/cpu, so the bf16 copy rounds
 * the same way and a GPU checkpoint continues on the CPU as it would here. */
__global__ void adamw_kernel(float *p, uint16_t *p16, const float *g, float *m, float *v, size_t n,
                             float decay, float step_size, float bc2_sqrt, float beta1,
                             float one_minus_beta1, float beta2, float one_minus_beta2, float eps,
                             float grad_scale)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float gi = __fmul_rn(g[i], grad_scale);
    float mi = __fadd_rn(__fmul_rn(m[i], beta1), __fmul_rn(gi, one_minus_beta1));
    float vi = __fadd_rn(__fmul_rn(v[i], beta2), __fmul_rn(__fmul_rn(one_minus_beta2, gi), gi));
    float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), bc2_sqrt), eps);
    float pi = __fsub_rn(__fmul_rn(p[i], decay), __fmul_rn(step_size, __fdiv_rn(mi, denom)));
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
    if (p16) p16[i] = cu_bf16_round(pi);
}

void cu_adamw(struct ops_ctx *ctx, float *p, uint16_t *p16, const float *g, float *m, float *v,
              size_t n, float lr, double beta1, double beta2, float eps, float weight_decay,
              float grad_scale, int step)
{
    if (!n) return;
    /* the step's constants on the host, in the CPU's arithmetic */
    float decay = 1.0f - lr * weight_decay;
    float step_size = (float)(lr / (1.0 - pow(beta1, step)));
    float bc2_sqrt = (float)sqrt(1.0 - pow(beta2, step));
    adamw_kernel<<<cu_blocks(n, THREADS), THREADS, 0, ctx->stream>>>(
        p, p16, g, m, v, n, decay, step_size, bc2_sqrt, (float)beta1, (float)(1.0 - beta1),
        (float)beta2, (float)(1.0 - beta2), eps, grad_scale);
    (void)LAUNCH_OK(ctx);
}

/* part[blockIdx.x] = Σ x² over the block's fixed slice, in double */
__global__ void sum_squares_partial_kernel(double *part, const float *x, size_t n, size_t per)
{
    __shared__ double shared[32];
    size_t lo = (size_t)blockIdx.x * per, hi = lo + per < n ? lo + per : n;
    double s = 0.0;
    for (size_t i = lo + threadIdx.x; i < hi; i += blockDim.x) s += (double)x[i] * (double)x[i];
    s = cu_block_sum(s, shared);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

__global__ void sum_squares_final_kernel(double *out, const double *part, int parts)
{
    __shared__ double shared[32];
    double s = 0.0;
    for (int i = threadIdx.x; i < parts; i += blockDim.x) s += part[i];
    s = cu_block_sum(s, shared);
    if (threadIdx.x == 0) *out = s;
}

/* Each tensor's sum into its own slot after the partials (the partials
 * reused in stream order), then every slot back at once. */
static bool sum_squares_on_device(struct ops_ctx *ctx, double *sums, const float *const *x,
                                  const size_t *n, int count)
{
    size_t bytes = ((size_t)SUM_BLOCKS + (size_t)count) * sizeof(double);
    double *part = (double *)cu_scratch(ctx, CU_SCRATCH_PARTIAL, bytes), *slots = part + SUM_BLOCKS;
    if (!part ||
        !CUDA_OK(ctx, cudaMemsetAsync(slots, 0, (size_t)count * sizeof(double), ctx->stream)))
        return false;
    for (int i = 0; i < count; i++) {
        if (!n[i]) continue;
        size_t per = (n[i] + SUM_BLOCKS - 1) / SUM_BLOCKS;
        sum_squares_partial_kernel<<<SUM_BLOCKS, THREADS, 0, ctx->stream>>>(part, x[i], n[i], per);
        if (!LAUNCH_OK(ctx)) return false;
        sum_squares_final_kernel<<<1, THREADS, 0, ctx->stream>>>(slots + i, part, SUM_BLOCKS);
        if (!LAUNCH_OK(ctx)) return false;
    }
    return CUDA_OK(ctx, cudaMemcpyAsync(sums, slots, (size_t)count * sizeof(double),
                                        cudaMemcpyDeviceToHost, ctx->stream)) &&
           CUDA_OK(ctx, cudaStreamSynchronize(ctx->stream));
}

void cu_sum_squares(struct ops_ctx *ctx, double *sums, const float *const *x, const size_t *n,
                    int count)
{
    if (count > 0 && !sum_squares_on_device(ctx, sums, x, n, count))
        for (int i = 0; i < count; i++) sums[i] = NAN;
}
