/* classifier.cu — softmax cross-entropy over the padded vocabulary, fused with
 * its gradient (one block per row: max, Σexp, loss, then dlogits written over
 * the logits in the same kernel, or rounded to bf16 into a buffer of their own:
 * the ...16 ops, the same kernel), and the three parts of the vocabulary-
 * parallel version (max, Σexp with the target's logit, finish). Block
 * reductions in a fixed tree: deterministic. logits (N,Vp), targets (N). */
#include "kernels/cuda/cuda_common.cuh"

enum { THREADS = 512 };

/* dlogits of a row from its logits: exp(x - mx)·(scale/sum), the target's
 * minus scale, the padding [nv, Vp) 0. The same arithmetic as kernels/cpu.
 * out (Vp) is the row itself (fp32, in place: each element read, then written
 * by one thread) or a bf16 row of its own (cu_store: rounded once). */
template <typename T>
__device__ void row_gradient(T *out, const float *row, int nv, int Vp, int target, float mx,
                             float sum, float grad_scale)
{
    float k = grad_scale / sum;
    for (int i = threadIdx.x; i < Vp; i += blockDim.x) {
        float g = 0.0f;
        if (i < nv) {
            g = expf(row[i] - mx) * k;
            if (i == target) g -= grad_scale;
        }
        cu_store(out + i, g);
    }
}

__device__ float row_max(const float *row, int nv, float *shared)
{
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < nv; i += blockDim.x) mx = fmaxf(mx, row[i]);
    return cu_block_max(mx, shared);
}

__device__ float row_sumexp(const float *row, int nv, float mx, float *shared)
{
    float s = 0.0f;
    for (int i = threadIdx.x; i < nv; i += blockDim.x) s += expf(row[i] - mx);
    return cu_block_sum(s, shared);
}

/* dlogits (N,Vp): the logits themselves (fp32), or bf16 (classifier16) */
template <typename T>
__global__ void classifier_kernel(T *dlogits, float *logits, float *losses,
                                  const int32_t *targets, int V, int Vp, float grad_scale)
{
    __shared__ float shared[32];
    float *row = logits + (size_t)blockIdx.x * Vp;
    int target = targets[blockIdx.x];
    /* a target outside [0, V) is read nowhere: its loss is NaN, as on the CPU (ops.h) */
    float target_logit = target >= 0 && target < V ? row[target] : NAN;
    float mx = row_max(row, V, shared);
    float sum = row_sumexp(row, V, mx, shared);
    if (threadIdx.x == 0) losses[blockIdx.x] = logf(sum) + mx - target_logit;
    __syncthreads(); /* every thread has read the target's logit */
    if (grad_scale != 0.0f)
        row_gradient(dlogits + (size_t)blockIdx.x * Vp, row, V, Vp, target, mx, sum, grad_scale);
}

void cu_classifier(struct ops_ctx *ctx, float *logits, float *losses, const int32_t *targets, int N,
                   int V, int Vp, float grad_scale)
{
    if (N <= 0) return;
    classifier_kernel<<<N, THREADS, 0, ctx->stream>>>(logits, logits, losses, targets, V, Vp,
                                                      grad_scale);
    (void)LAUNCH_OK(ctx);
}

/* ops.h classifier16: the logits are read only (the contract leaves them undefined) */
void cu_classifier16(struct ops_ctx *ctx, uint16_t *dlogits16, float *logits, float *losses,
                     const int32_t *targets, int N, int V, int Vp, float grad_scale)
{
    if (N <= 0) return;
    classifier_kernel<<<N, THREADS, 0, ctx->stream>>>(dlogits16, logits, losses, targets, V, Vp,
                                                      grad_scale);
    (void)LAUNCH_OK(ctx);
}

__global__ void classifier_max_kernel(const float *logits, float *out, int nv, int Vp)
{
    __shared__ float shared[32];
    float mx = row_max(logits + (size_t)blockIdx.x * Vp, nv, shared);
    if (threadIdx.x == 0) out[blockIdx.x] = mx;
}

void cu_classifier_max(struct ops_ctx *ctx, const float *logits, float *row_max_out, int N, int nv,
                       int Vp)
{
    if (N <= 0) return;
    classifier_max_kernel<<<N, THREADS, 0, ctx->stream>>>(logits, row_max_out, nv, Vp);
    (void)LAUNCH_OK(ctx);
}

__global__ void classifier_sumexp_kernel(const float *logits, const float *row_max_in,
                                         const int32_t *targets, int v0, int nv, int Vp,
                                         float *row_sum, float *target_logit)
{
    __shared__ float shared[32];
    const float *row = logits + (size_t)blockIdx.x * Vp;
    float sum = row_sumexp(row, nv, row_max_in[blockIdx.x], shared);
    if (threadIdx.x == 0) {
        int t = targets[blockIdx.x] - v0;
        row_sum[blockIdx.x] = sum;
        target_logit[blockIdx.x] = t >= 0 && t < nv ? row[t] : 0.0f;
    }
}

void cu_classifier_sumexp(struct ops_ctx *ctx, const float *logits, const float *row_max_in,
                          const int32_t *targets, int v0, int nv, int Vp, float *row_sum,
                          float *target_logit, int N)
{
    if (N <= 0) return;
    classifier_sumexp_kernel<<<N, THREADS, 0, ctx->stream>>>(logits, row_max_in, targets, v0, nv,
                                                             Vp, row_sum, target_logit);
    (void)LAUNCH_OK(ctx);
}

/* dlogits (N,Vp): the logits themselves (fp32), or bf16 (classifier_finish16) */
template <typename T>
__global__ void classifier_finish_kernel(T *dlogits, const float *logits, float *losses,
                                         const int32_t *targets, const float *row_max_in,
                                         const float *row_sum, const float *target_logit, int v0,
                                         int nv, int Vp, float grad_scale)
{
    int r = blockIdx.x;
    float mx = row_max_in[r], sum = row_sum[r];
    if (threadIdx.x == 0) losses[r] = logf(sum) + mx - target_logit[r];
    if (grad_scale != 0.0f)
        row_gradient(dlogits + (size_t)r * Vp, logits + (size_t)r * Vp, nv, Vp, targets[r] - v0,
                     mx, sum, grad_scale);
}

void cu_classifier_finish(struct ops_ctx *ctx, float *logits, float *losses, const int32_t *targets,
                          const float *row_max_in, const float *row_sum, const float *target_logit,
                          int v0, int nv, int Vp, int N, float grad_scale)
{
    if (N <= 0) return;
    classifier_finish_kernel<<<N, THREADS, 0, ctx->stream>>>(logits, logits, losses, targets,
                                                             row_max_in, row_sum, target_logit, v0,
                                                             nv, Vp, grad_scale);
    (void)LAUNCH_OK(ctx);
}

void cu_classifier_finish16(struct ops_ctx *ctx, uint16_t *dlogits16, float *logits, float *losses,
                            const int32_t *targets, const float *row_max_in, const float *row_sum,
                            const float *target_logit, int v0, int nv, int Vp, int N,
                            float grad_scale)
{
    if (N <= 0) return;
    classifier_finish_kernel<<<N, THREADS, 0, ctx->stream>>>(dlogits16, logits, losses, targets,
                                                             row_max_in, row_sum, target_logit, v0,
                                                             nv, Vp, grad_scale);
    (void)LAUNCH_OK(ctx);
}
