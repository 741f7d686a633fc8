/* optimizer.cu — AdamW fused with the bf16 copy of the updated parameters
 * (torch.optim.AdamW's single-tensor arithmetic, as kernels/cpu), one tensor
 * or many in one launch, and the sum of squares for gradient clipping in
 * double, deterministic: fixed blocks per tensor, a fixed-tree reduction
 * inside each, then one block over them; all tensors in two launches. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_common.cuh"

enum { THREADS = 256, SUM_BLOCKS = 1024, SUM_TENSORS = 256 /* per launch: 2 MiB of partials */ };
static_assert((int)SUM_BLOCKS == (int)GPT2_SCRATCH_SUM_BLOCKS, "gpt2_scratch.c counts these partials");
static_assert((int)SUM_TENSORS == (int)GPT2_SCRATCH_SUM_TENSORS, "gpt2_scratch.c counts these too");

/* The device copy of a table of `bytes` in scratch slot `slot`, uploaded (in
 * stream order, after the kernels that read the last one) only when it
 * differs from the last upload, kept in *t. NULL after recording the error. */
static const void *table_on_device(struct ops_ctx *ctx, struct cu_table *t, int slot,
                                   const void *host, size_t bytes)
{
    /* the slot grows only for more bytes than the last upload's: never a stale match */
    void *dev = cu_scratch(ctx, slot, bytes);
    if (!dev) return NULL;
    if (t->bytes == bytes && !memcmp(t->host, host, bytes)) return dev;
    t->bytes = 0;
    if (t->capacity < bytes) {
        void *grown = realloc(t->host, bytes);
        if (!grown) {
            cu_set_error(ctx, "out of memory for a %zu-byte optimizer table", bytes);
            return NULL;
        }
        t->host = grown, t->capacity = bytes;
    }
    memcpy(t->host, host, bytes);
    if (!CUDA_OK(ctx, cudaMemcpyAsync(dev, t->host, bytes, cudaMemcpyHostToDevice, ctx->stream)))
        return NULL;
    t->bytes = bytes;
    return dev;
}

/* A step's constants, computed on the host in the CPU's arithmetic
 * (kernels/cpu/ops_cpu.c, cpu_adamw): the betas' complements and the bias
 * corrections in double, then rounded. */
struct adamw_consts {
    float step_size, bc2_sqrt, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, grad_scale;
};

static struct adamw_consts step_consts(float lr, double beta1, double beta2, float eps,
                                       float grad_scale, int step)
{
    struct adamw_consts c;
    c.step_size = (float)(lr / (1.0 - pow(beta1, step)));
    c.bc2_sqrt = (float)sqrt(1.0 - pow(beta2, step));
    c.beta1 = (float)beta1, c.one_minus_beta1 = (float)(1.0 - beta1);
    c.beta2 = (float)beta2, c.one_minus_beta2 = (float)(1.0 - beta2);
    c.eps = eps, c.grad_scale = grad_scale;
    return c;
}

/* Element i, the CPU's arithmetic operation for operation, each rounded on
 * its own (__fmul_rn and friends are never fused into an FMA, and the CPU
 * build does not contract either): the same bits as kernels/cpu, so the bf16
 * copy rounds the same way and a GPU checkpoint continues on the CPU as it
 * would here. */
__device__ __forceinline__ void adamw_element(float *p, uint16_t *p16, const float *g, float *m,
                                              float *v, size_t i, float decay,
                                              const struct adamw_consts &c)
{
    float gi = __fmul_rn(g[i], c.grad_scale);
    float mi = __fadd_rn(__fmul_rn(m[i], c.beta1), __fmul_rn(gi, c.one_minus_beta1));
    float vi = __fadd_rn(__fmul_rn(v[i], c.beta2), __fmul_rn(__fmul_rn(c.one_minus_beta2, gi), gi));
    float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), c.bc2_sqrt), c.eps);
    float pi = __fsub_rn(__fmul_rn(p[i], decay), __fmul_rn(c.step_size, __fdiv_rn(mi, denom)));
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
    if (p16) p16[i] = cu_bf16_round(pi);
}

__global__ void adamw_kernel(float *p, uint16_t *p16, const float *g, float *m, float *v, size_t n,
                             float decay, struct adamw_consts c)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) adamw_element(p, p16, g, m, v, i, decay, c);
}

void cu_adamw(struct ops_ctx *ctx, float *p, uint16_t *p16, const float *g, float *m, float *v,
              size_t n, float lr, double beta1, double beta2, float eps, float weight_decay,
              float grad_scale, int step)
{
    if (!n) return;
    float decay = 1.0f - lr * weight_decay;
    adamw_kernel<<<cu_blocks(n, THREADS), THREADS, 0, ctx->stream>>>(
        p, p16, g, m, v, n, decay, step_consts(lr, beta1, beta2, eps, grad_scale, step));
    (void)LAUNCH_OK(ctx);
}

/* adamw_multi's segment on the device: the blocks from block0 on are its */
struct adamw_row {
    float *p;
    uint16_t *p16;
    const float *g;
    float *m, *v;
    size_t n, block0;
    int decays;
};
static_assert(sizeof(struct adamw_row) == GPT2_SCRATCH_ADAMW_ROW_BYTES, "gpt2_scratch.c counts its table");

/* Each block finds its segment (the last whose block0 ≤ it: rows ascend, none
 * empty) and updates THREADS of its elements as adamw_kernel would. */
__global__ void adamw_multi_kernel(const struct adamw_row *rows, int count, float decay,
                                   float no_decay, struct adamw_consts c)
{
    int lo = 0, hi = count - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (rows[mid].block0 <= blockIdx.x)
            lo = mid;
        else
            hi = mid - 1;
    }
    const struct adamw_row *r = &rows[lo];
    size_t i = ((size_t)blockIdx.x - r->block0) * blockDim.x + threadIdx.x;
    if (i < r->n) adamw_element(r->p, r->p16, r->g, r->m, r->v, i, r->decays ? decay : no_decay, c);
}

void cu_adamw_multi(struct ops_ctx *ctx, const struct adamw_segment *segs, int count, float lr,
                    double beta1, double beta2, float eps, float weight_decay, float grad_scale,
                    int step)
{
    /* zeroed, padding too, so that an unchanged table compares equal and is not sent again */
    struct adamw_row *rows =
        (struct adamw_row *)calloc((size_t)(count > 0 ? count : 1), sizeof(struct adamw_row));
    if (!rows) {
        cu_set_error(ctx, "out of memory for adamw_multi's %d segments", count);
        return;
    }
    int n_rows = 0;
    size_t blocks = 0;
    for (int i = 0; i < count; i++) {
        const struct adamw_segment *s = &segs[i];
        if (!s->n) continue;
        struct adamw_row *r = &rows[n_rows++];
        r->p = s->p, r->p16 = s->p16, r->g = s->g, r->m = s->m, r->v = s->v;
        r->n = s->n, r->block0 = blocks, r->decays = s->decays;
        blocks += cu_blocks(s->n, THREADS);
    }
    if (blocks > 0x7fffffff) {
        cu_set_error(ctx, "adamw_multi: %zu blocks, more than a grid holds", blocks);
    } else if (n_rows) {
        const struct adamw_row *dev = (const struct adamw_row *)table_on_device(
            ctx, &ctx->adamw_table, CU_SCRATCH_ADAMW, rows, (size_t)n_rows * sizeof *rows);
        /* cu_adamw's decays: with weight_decay and with 0 */
        float decay = 1.0f - lr * weight_decay, no_decay = 1.0f - lr * 0.0f;
        if (dev) {
            adamw_multi_kernel<<<(unsigned)blocks, THREADS, 0, ctx->stream>>>(
                dev, n_rows, decay, no_decay, step_consts(lr, beta1, beta2, eps, grad_scale, step));
            (void)LAUNCH_OK(ctx);
        }
    }
    free(rows);
}

/* sum_squares' tensor on the device */
struct sum_row {
    const float *x;
    size_t n;
};
static_assert(sizeof(struct sum_row) == GPT2_SCRATCH_SUM_ROW_BYTES, "gpt2_scratch.c counts its table");

/* part[blockIdx.x] = Σ x² in double over the fixed slice (one of SUM_BLOCKS)
 * of tensor rows[blockIdx.x / SUM_BLOCKS] that is this block's */
__global__ void sum_squares_partial_kernel(double *part, const struct sum_row *rows)
{
    __shared__ double shared[32];
    const struct sum_row *r = &rows[blockIdx.x / SUM_BLOCKS];
    size_t per = (r->n + SUM_BLOCKS - 1) / SUM_BLOCKS;
    size_t lo = (size_t)(blockIdx.x % SUM_BLOCKS) * per, hi = lo + per < r->n ? lo + per : r->n;
    double s = 0.0;
    for (size_t i = lo + threadIdx.x; i < hi; i += blockDim.x)
        s += (double)r->x[i] * (double)r->x[i];
    s = cu_block_sum(s, shared);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

/* out[blockIdx.x] = the sum of the tensor's SUM_BLOCKS partials */
__global__ void sum_squares_final_kernel(double *out, const double *part)
{
    __shared__ double shared[32];
    const double *mine = part + (size_t)blockIdx.x * SUM_BLOCKS;
    double s = 0.0;
    for (int i = threadIdx.x; i < SUM_BLOCKS; i += blockDim.x) s += mine[i];
    s = cu_block_sum(s, shared);
    if (threadIdx.x == 0) out[blockIdx.x] = s;
}

/* Each tensor's sum into its slot, SUM_TENSORS tensors at a time (the
 * partials reused in stream order), then every slot back at once. */
static bool sum_squares_on_device(struct ops_ctx *ctx, double *sums, const float *const *x,
                                  const size_t *n, int count)
{
    struct sum_row *rows = (struct sum_row *)malloc((size_t)count * sizeof *rows);
    if (!rows) {
        cu_set_error(ctx, "out of memory for sum_squares' %d tensors", count);
        return false;
    }
    for (int i = 0; i < count; i++) rows[i].x = x[i], rows[i].n = n[i];
    const struct sum_row *dev = (const struct sum_row *)table_on_device(
        ctx, &ctx->sumsq_table, CU_SCRATCH_SUMSQ, rows, (size_t)count * sizeof *rows);
    free(rows);
    int group = count < SUM_TENSORS ? count : SUM_TENSORS;
    size_t bytes = ((size_t)group * SUM_BLOCKS + (size_t)count) * sizeof(double);
    double *part = (double *)cu_scratch(ctx, CU_SCRATCH_PARTIAL, bytes);
    if (!dev || !part) return false;
    double *slots = part + (size_t)group * SUM_BLOCKS;
    for (int first = 0; first < count; first += group) {
        int k = count - first < group ? count - first : group;
        sum_squares_partial_kernel<<<(unsigned)k * SUM_BLOCKS, THREADS, 0, ctx->stream>>>(
            part, dev + first);
        if (!LAUNCH_OK(ctx)) return false;
        sum_squares_final_kernel<<<(unsigned)k, THREADS, 0, ctx->stream>>>(slots + first, part);
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
