/* llama.cu — the Llama family's ops (kernels/ops.h): RMSNorm forward and
 * backward (one warp per row, fp32; the forward's output fp32 or bf16 from one
 * kernel; the weight gradient in the two deterministic passes of layernorm.cu),
 * rotary positions (one thread per row and pair, the angles' cos and sin from a
 * table built on the host in double), the grouped-query key/value expansion and
 * its group sums (one thread per output, the group's heads added in head
 * order), SwiGLU forward (its output fp32 or bf16, one kernel) and backward
 * (one thread per element). No reductions across threads except the warp sums
 * and the column sums: the same bits on every run.
 * kernels/cpu/llama_generic.inc is the reference. */
#include <math.h>
#include <stdlib.h>

#include "kernels/cuda/cuda_common.cuh"

enum { WARPS = 8, THREADS = WARPS * 32 };

/* ---- RMSNorm ------------------------------------------------------------------------ */

/* out (N,C) = w·(x·s), s = 1/sqrt(mean(x²) + eps), stored as Out (float, or
 * uint16_t: bf16); rstd (N) = s */
template <typename Out>
__global__ void rmsnorm_forward_kernel(Out *out, float *rstd, const float *inp, const float *w,
                                       int N, int C, float eps)
{
    int row = blockIdx.x * WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const float *x = inp + (size_t)row * C;
    float ss = 0.0f;
    for (int i = lane; i < C; i += 32) ss += x[i] * x[i];
    float s = 1.0f / sqrtf(cu_warp_sum(ss) / C + eps);
    Out *o = out + (size_t)row * C;
    for (int i = lane; i < C; i += 32) cu_store(o + i, w[i] * (x[i] * s));
    if (lane == 0) rstd[row] = s;
}

template <typename Out>
static void rmsnorm_forward(struct ops_ctx *ctx, Out *out, float *rstd, const float *inp,
                            const float *w, int N, int C, float eps)
{
    if (N <= 0) return;
    rmsnorm_forward_kernel<Out>
        <<<cu_blocks((size_t)N, WARPS), THREADS, 0, ctx->stream>>>(out, rstd, inp, w, N, C, eps);
    (void)LAUNCH_OK(ctx);
}

void cu_rmsnorm_forward(struct ops_ctx *ctx, float *out, float *rstd, const float *inp,
                        const float *w, int N, int C, float eps)
{
    rmsnorm_forward(ctx, out, rstd, inp, w, N, C, eps);
}

void cu_rmsnorm_forward16(struct ops_ctx *ctx, uint16_t *out, float *rstd, const float *inp,
                          const float *w, int N, int C, float eps)
{
    rmsnorm_forward(ctx, out, rstd, inp, w, N, C, eps);
}

/* dinp (N,C) += s·w·d − x·s³·Σ(w·d·x)/C */
__global__ void rmsnorm_dinp_kernel(float *dinp, const float *dout, const float *inp,
                                    const float *w, const float *rstd, int N, int C)
{
    int row = blockIdx.x * WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const float *x = inp + (size_t)row * C, *d = dout + (size_t)row * C;
    float s = rstd[row], dot = 0.0f;
    for (int i = lane; i < C; i += 32) dot += w[i] * d[i] * x[i];
    float k = cu_warp_sum(dot) * s * s * s / C;
    float *dx = dinp + (size_t)row * C;
    for (int i = lane; i < C; i += 32) dx[i] += w[i] * d[i] * s - x[i] * k;
}

/* pw (chunks, C): Σ over chunk blockIdx.y's rows, in row order, of d·(x·s) */
__global__ void rmsnorm_dw_partial_kernel(float *pw, const float *dout, const float *inp,
                                          const float *rstd, int N, int C)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    int r0 = blockIdx.y * CU_CHUNK_ROWS, r1 = min(r0 + CU_CHUNK_ROWS, N);
    float gw = 0.0f;
    for (int r = r0; r < r1; r++)
        gw += dout[(size_t)r * C + c] * (inp[(size_t)r * C + c] * rstd[r]);
    pw[(size_t)blockIdx.y * C + c] = gw;
}

void cu_rmsnorm_backward(struct ops_ctx *ctx, float *dinp, float *dw, const float *dout,
                         const float *inp, const float *w, const float *rstd, int N, int C,
                         bool accumulate)
{
    if (C <= 0) return;
    if (N > 0) {
        rmsnorm_dinp_kernel<<<cu_blocks((size_t)N, WARPS), THREADS, 0, ctx->stream>>>(
            dinp, dout, inp, w, rstd, N, C);
        if (!LAUNCH_OK(ctx)) return;
    }
    int chunks = (N + CU_CHUNK_ROWS - 1) / CU_CHUNK_ROWS;
    float *pw = NULL;
    if (chunks > 0) {
        pw = (float *)cu_scratch(ctx, CU_SCRATCH_PARTIAL, (size_t)chunks * C * sizeof(float));
        if (!pw) return;
        dim3 grid(cu_blocks((size_t)C, THREADS), (unsigned)chunks);
        rmsnorm_dw_partial_kernel<<<grid, THREADS, 0, ctx->stream>>>(pw, dout, inp, rstd, N, C);
        if (!LAUNCH_OK(ctx)) return;
    }
    cu_column_sum_finish(ctx, dw, pw, chunks, C, accumulate);
}

/* ---- rotary positions --------------------------------------------------------------- */

/* The table (T, hs/2) of (cos a, sin a) for positions pos0 .. pos0+T-1, a = pos·theta^
 * (-2i/hs), built on the host in double with the CPU's very expression (the GPU's double
 * cos/sin would need local memory for its large-argument reduction) and rounded once. One
 * table of positions 0 .. the furthest asked so far is kept in CU_SCRATCH_ROPE, and a
 * call gets its rows of it: every layer of a step, forward and backward, and context
 * parallelism's two chunks of each sequence at their own positions (runtime/
 * ring_attention.c, a call a chunk) build it once. NULL after recording the error. */
const float2 *cu_rope_table(struct ops_ctx *ctx, int T, int hs, double theta, int pos0)
{
    struct cu_rope_key *have = &ctx->rope;
    int half = hs / 2, positions = pos0 + T;
    if (pos0 < 0 || positions < pos0) {
        cu_set_error(ctx, "rope: positions %d + %d out of range", pos0, T);
        return NULL;
    }
    if (have->T >= positions && have->hs == hs && have->theta == theta)
        return (const float2 *)ctx->scratch[CU_SCRATCH_ROPE] + (size_t)pos0 * half;
    struct cu_rope_key want = {positions, hs, 0, theta};
    size_t n = (size_t)positions * half;
    have->T = 0;
    float2 *table = (float2 *)cu_scratch(ctx, CU_SCRATCH_ROPE, n * sizeof(float2));
    float2 *host = (float2 *)malloc(n * sizeof(float2));
    if (!table || !host) {
        if (table) cu_set_error(ctx, "rope: no host memory for a %zu-entry table", n);
        free(host);
        return NULL;
    }
    for (int t = 0; t < positions; t++)
        for (int i = 0; i < half; i++) {
            double a = (double)t * pow(theta, -2.0 * i / hs);
            host[(size_t)t * half + i] = make_float2((float)cos(a), (float)sin(a));
        }
    bool ok = CUDA_OK(ctx, cudaMemcpyAsync(table, host, n * sizeof(float2), cudaMemcpyHostToDevice,
                                           ctx->stream)) &&
              CUDA_OK(ctx, cudaStreamSynchronize(ctx->stream));
    free(host);
    if (!ok) return NULL;
    *have = want;
    return table + (size_t)pos0 * half;
}

/* Thread (row, i) rotates pair i of each q and k head of the row by its
 * position's angle, forward (sign 1) or back (sign -1: sin negated) */
__global__ void rope_kernel(float *x, const float2 *table, int B, int T, int NH, int NKV, int hs,
                            float sign)
{
    int half = hs / 2;
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * T * half) return;
    int r = (int)(idx / half), i = (int)(idx % half);
    float2 cs = table[(size_t)(r % T) * half + i];
    float c = cs.x, s = sign * cs.y;
    float *row = x + (size_t)r * (NH + 2 * NKV) * hs;
    for (int h = 0; h < NH + NKV; h++) {
        float *p = row + (size_t)h * hs;
        float x0 = p[i], x1 = p[i + half];
        p[i] = x0 * c - x1 * s;
        p[i + half] = x1 * c + x0 * s;
    }
}

static void rope(struct ops_ctx *ctx, float *x, int B, int T, int NH, int NKV, int hs, double theta,
                 int pos0, float sign)
{
    size_t n = (size_t)B * T * (hs / 2);
    if (!n) return;
    const float2 *table = cu_rope_table(ctx, T, hs, theta, pos0);
    if (!table) return;
    rope_kernel<<<cu_blocks(n, THREADS), THREADS, 0, ctx->stream>>>(x, table, B, T, NH, NKV, hs,
                                                                    sign);
    (void)LAUNCH_OK(ctx);
}

void cu_rope_forward(struct ops_ctx *ctx, float *x, int B, int T, int NH, int NKV, int hs,
                     double theta, int pos0)
{
    rope(ctx, x, B, T, NH, NKV, hs, theta, pos0, 1.0f);
}

/* the rotation is orthogonal: its gradient is the inverse rotation */
void cu_rope_backward(struct ops_ctx *ctx, float *dx, int B, int T, int NH, int NKV, int hs,
                      double theta, int pos0)
{
    rope(ctx, dx, B, T, NH, NKV, hs, theta, pos0, -1.0f);
}

/* ---- grouped-query key/value expansion ---------------------------------------------- */

/* out (N,3C), C = NH·hs: [q | k of head h/group | v of head h/group] */
__global__ void kv_expand_kernel(float *out, const float *packed, int N, int NH, int NKV, int hs)
{
    size_t C = (size_t)NH * hs, KVC = (size_t)NKV * hs, width = 3 * C;
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)N * width) return;
    size_t r = idx / width, j = idx % width;
    const float *in = packed + r * (C + 2 * KVC);
    if (j < C) {
        out[idx] = in[j];
        return;
    }
    size_t part = (j - C) / C, within = (j - C) % C; /* part 0: k, 1: v */
    size_t g = within / hs / (size_t)(NH / NKV);
    out[idx] = in[C + part * KVC + g * hs + within % hs];
}

/* dpacked (N,C+2·KVC): q copied, each k and v head the sum of its group's
 * heads in head order */
__global__ void kv_expand_backward_kernel(float *dpacked, const float *dout, int N, int NH, int NKV,
                                          int hs)
{
    size_t C = (size_t)NH * hs, KVC = (size_t)NKV * hs, width = C + 2 * KVC;
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)N * width) return;
    size_t r = idx / width, j = idx % width;
    const float *d = dout + r * 3 * C;
    if (j < C) {
        dpacked[idx] = d[j];
        return;
    }
    size_t part = (j - C) / KVC, within = (j - C) % KVC, group = (size_t)(NH / NKV);
    size_t g = within / hs, i = within % hs;
    const float *src = d + C + part * C + g * group * hs + i;
    float s = 0.0f;
    for (size_t h = 0; h < group; h++) s += src[h * hs];
    dpacked[idx] = s;
}

void cu_kv_expand(struct ops_ctx *ctx, float *out, const float *packed, int N, int NH, int NKV,
                  int hs)
{
    size_t n = (size_t)N * 3 * NH * hs;
    if (!n || NKV <= 0) return;
    kv_expand_kernel<<<cu_blocks(n, THREADS), THREADS, 0, ctx->stream>>>(out, packed, N, NH, NKV,
                                                                         hs);
    (void)LAUNCH_OK(ctx);
}

void cu_kv_expand_backward(struct ops_ctx *ctx, float *dpacked, const float *dout, int N, int NH,
                           int NKV, int hs)
{
    size_t n = (size_t)N * (NH + 2 * NKV) * hs;
    if (!n || NKV <= 0) return;
    kv_expand_backward_kernel<<<cu_blocks(n, THREADS), THREADS, 0, ctx->stream>>>(dpacked, dout, N,
                                                                                  NH, NKV, hs);
    (void)LAUNCH_OK(ctx);
}

/* ---- SwiGLU ------------------------------------------------------------------------- */

/* out (N,F) = silu(gate)·up, inp (N,2F) = [gate | up] per row */
/* out stored as Out (float, or uint16_t: bf16) */
template <typename Out>
__global__ void swiglu_forward_kernel(Out *out, const float *inp, int N, int F)
{
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)N * F) return;
    size_t r = idx / F, i = idx % F;
    const float *g = inp + r * 2 * F, *u = g + F;
    cu_store(out + idx, g[i] / (1.0f + expf(-g[i])) * u[i]);
}

/* silu(g)' = σ(g)·(1 + g·(1 − σ(g))) */
__global__ void swiglu_backward_kernel(float *dinp, const float *inp, const float *dout, int N,
                                       int F)
{
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)N * F) return;
    size_t r = idx / F, i = idx % F;
    const float *g = inp + r * 2 * F, *u = g + F;
    float *dg = dinp + r * 2 * F, *du = dg + F, d = dout[idx];
    float sig = 1.0f / (1.0f + expf(-g[i]));
    dg[i] = d * u[i] * sig * (1.0f + g[i] * (1.0f - sig));
    du[i] = d * (g[i] * sig);
}

template <typename Out>
static void swiglu_forward(struct ops_ctx *ctx, Out *out, const float *inp, int N, int F)
{
    size_t n = (size_t)N * F;
    if (!n) return;
    swiglu_forward_kernel<Out><<<cu_blocks(n, THREADS), THREADS, 0, ctx->stream>>>(out, inp, N, F);
    (void)LAUNCH_OK(ctx);
}

void cu_swiglu_forward(struct ops_ctx *ctx, float *out, const float *inp, int N, int F)
{
    swiglu_forward(ctx, out, inp, N, F);
}

void cu_swiglu_forward16(struct ops_ctx *ctx, uint16_t *out, const float *inp, int N, int F)
{
    swiglu_forward(ctx, out, inp, N, F);
}

void cu_swiglu_backward(struct ops_ctx *ctx, float *dinp, const float *inp, const float *dout,
                        int N, int F)
{
    size_t n = (size_t)N * F;
    if (!n) return;
    swiglu_backward_kernel<<<cu_blocks(n, THREADS), THREADS, 0, ctx->stream>>>(dinp, inp, dout, N,
                                                                               F);
    (void)LAUNCH_OK(ctx);
}
