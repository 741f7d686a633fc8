/* attention_fused.cu — causal attention without the (B,NH,T,T) buffer, in the
 * manner of FlashAttention-2: key tiles stream through shared memory, the
 * softmax is kept online, only each row's log-sum-exp (B,NH,T) is saved and
 * the backward recomputes the probabilities; tiles above the diagonal are
 * skipped. The CUDA table's attention_*_fused: fp32 runs, and head sizes the
 * tensor-core kernels (attention_tc.cu) do not take. */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/attention_tile.cuh" // defines: TILE, load_tile, smem_for
#include "kernels/cuda/cuda_ops.h"

/* Deterministic: every output row is owned by one thread that sums in a fixed
 * order (dK/dV by key rows, dQ by query rows in a second kernel, so no
 * atomics). fp32 on the CUDA cores, not the tensor cores. The runtime calls
 * these instead of attention.cu's unless PLAIT_CUDA_ATTENTION=simple, and keeps
 * lse in its att buffer. plait-train --selftest checks them against the CPU
 * attention (on an H100: within 2.5e-7). */

/* one block: TILE query rows of head (b, h); thread i owns row t = t0 + i.
 * shared: q, o (own rows), k, v (the key tile), each (TILE, hs+1), and the
 * tile's scores (TILE, TILE+1) (in registers they would go to local memory) */
__global__ void flash_forward_kernel(float *out, float *lse, const float *qkv, int T, int C, int NH,
                                     float scale)
{
    extern __shared__ float smem[];
    int hs = C / NH, ld = hs + 1, bh = blockIdx.y, b = bh / NH, h = bh % NH;
    int t0 = blockIdx.x * TILE, t = t0 + threadIdx.x;
    float *q = smem, *o = q + TILE * ld, *k = o + TILE * ld, *v = k + TILE * ld;
    float *s = v + TILE * ld + threadIdx.x * (TILE + 1); /* this thread's scores */
    const float *base = qkv + (size_t)b * T * 3 * C + (size_t)h * hs;
    load_tile(q, base, 3 * (size_t)C, t0, T, hs);
    for (int d = 0; d < hs; d++) o[threadIdx.x * ld + d] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    int last = min(t0 + TILE, T) - 1; /* keys beyond the block's last row are masked for all */
    for (int j0 = 0; j0 <= last; j0 += TILE) {
        __syncthreads();
        load_tile(k, base + C, 3 * (size_t)C, j0, T, hs);
        load_tile(v, base + 2 * C, 3 * (size_t)C, j0, T, hs);
        __syncthreads();
        if (t >= T) continue;
        float tile_max = -INFINITY;
        int n = min(TILE, t - j0 + 1); /* keys j0 .. min(t, j0+TILE-1) */
        if (n <= 0) continue;
        for (int j = 0; j < n; j++) {
            float dot = 0.0f;
            for (int d = 0; d < hs; d++) dot += q[threadIdx.x * ld + d] * k[j * ld + d];
            s[j] = dot * scale;
            tile_max = fmaxf(tile_max, s[j]);
        }
        float m_new = fmaxf(m, tile_max), corr = expf(m - m_new);
        l *= corr;
        for (int d = 0; d < hs; d++) o[threadIdx.x * ld + d] *= corr;
        for (int j = 0; j < n; j++) {
            float p = expf(s[j] - m_new);
            l += p;
            for (int d = 0; d < hs; d++) o[threadIdx.x * ld + d] += p * v[j * ld + d];
        }
        m = m_new;
    }
    if (t >= T) return;
    float inv = 1.0f / l;
    float *dst = out + ((size_t)b * T + t) * C + (size_t)h * hs;
    for (int d = 0; d < hs; d++) dst[d] = o[threadIdx.x * ld + d] * inv;
    lse[(size_t)bh * T + t] = m + logf(l);
}

/* Dr (B,NH,T) = Σ_d dout·out per row (FlashAttention-2's D) */
__global__ void flash_rowdot_kernel(float *Dr, const float *dout, const float *out, int B, int T,
                                    int C, int NH)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)B * NH * T) return;
    int t = (int)(i % T), bh = (int)(i / T), b = bh / NH, h = bh % NH, hs = C / NH;
    size_t at = ((size_t)b * T + t) * C + (size_t)h * hs;
    float s = 0.0f;
    for (int d = 0; d < hs; d++) s += dout[at + d] * out[at + d];
    Dr[i] = s;
}

/* one block: TILE key rows j = j0 + i of head (b, h); dK, dV summed over the
 * query rows t ≥ j in order. shared: k, v, dk, dv (own rows), q, g (= dout)
 * of the query tile, each (TILE, hs+1) */
__global__ void flash_dkdv_kernel(float *dqkv, const float *qkv, const float *dout,
                                  const float *lse, const float *Dr, int T, int C, int NH,
                                  float scale)
{
    extern __shared__ float smem[];
    int hs = C / NH, ld = hs + 1, bh = blockIdx.y, b = bh / NH, h = bh % NH;
    int j0 = blockIdx.x * TILE, j = j0 + threadIdx.x, me = threadIdx.x * ld;
    float *k = smem, *v = k + TILE * ld, *dk = v + TILE * ld, *dv = dk + TILE * ld;
    float *q = dv + TILE * ld, *g = q + TILE * ld;
    const float *base = qkv + (size_t)b * T * 3 * C + (size_t)h * hs;
    const float *gbase = dout + (size_t)b * T * C + (size_t)h * hs;
    load_tile(k, base + C, 3 * (size_t)C, j0, T, hs);
    load_tile(v, base + 2 * C, 3 * (size_t)C, j0, T, hs);
    for (int d = 0; d < hs; d++) dk[me + d] = dv[me + d] = 0.0f;
    for (int q0 = j0; q0 < T; q0 += TILE) { /* query tiles at or below the diagonal */
        __syncthreads();
        load_tile(q, base, 3 * (size_t)C, q0, T, hs);
        load_tile(g, gbase, (size_t)C, q0, T, hs);
        __syncthreads();
        if (j >= T) continue;
        for (int i = 0; i < TILE && q0 + i < T; i++) {
            int t = q0 + i;
            if (t < j) continue;
            float sc = 0.0f, dp = 0.0f;
            for (int d = 0; d < hs; d++) {
                sc += q[i * ld + d] * k[me + d];
                dp += g[i * ld + d] * v[me + d];
            }
            float p = expf(sc * scale - lse[(size_t)bh * T + t]);
            float ds = p * (dp - Dr[(size_t)bh * T + t]) * scale;
            for (int d = 0; d < hs; d++) {
                dv[me + d] += p * g[i * ld + d];
                dk[me + d] += ds * q[i * ld + d];
            }
        }
    }
    if (j >= T) return;
    float *dst = dqkv + ((size_t)b * T + j) * 3 * C + (size_t)h * hs;
    for (int d = 0; d < hs; d++) {
        dst[C + d] = dk[me + d];
        dst[2 * C + d] = dv[me + d];
    }
}

/* one block: TILE query rows t = t0 + i; dQ summed over the keys j ≤ t in
 * order. shared: q, g, dq (own rows), k, v (the key tile) */
__global__ void flash_dq_kernel(float *dqkv, const float *qkv, const float *dout, const float *lse,
                                const float *Dr, int T, int C, int NH, float scale)
{
    extern __shared__ float smem[];
    int hs = C / NH, ld = hs + 1, bh = blockIdx.y, b = bh / NH, h = bh % NH;
    int t0 = blockIdx.x * TILE, t = t0 + threadIdx.x, me = threadIdx.x * ld;
    float *q = smem, *g = q + TILE * ld, *dq = g + TILE * ld, *k = dq + TILE * ld;
    float *v = k + TILE * ld;
    const float *base = qkv + (size_t)b * T * 3 * C + (size_t)h * hs;
    const float *gbase = dout + (size_t)b * T * C + (size_t)h * hs;
    load_tile(q, base, 3 * (size_t)C, t0, T, hs);
    load_tile(g, gbase, (size_t)C, t0, T, hs);
    for (int d = 0; d < hs; d++) dq[me + d] = 0.0f;
    float row_lse = t < T ? lse[(size_t)bh * T + t] : 0.0f;
    float row_D = t < T ? Dr[(size_t)bh * T + t] : 0.0f;
    int last = min(t0 + TILE, T) - 1;
    for (int j0 = 0; j0 <= last; j0 += TILE) {
        __syncthreads();
        load_tile(k, base + C, 3 * (size_t)C, j0, T, hs);
        load_tile(v, base + 2 * C, 3 * (size_t)C, j0, T, hs);
        __syncthreads();
        if (t >= T) continue;
        for (int jj = 0; jj < TILE && j0 + jj <= t; jj++) {
            float sc = 0.0f, dp = 0.0f;
            for (int d = 0; d < hs; d++) {
                sc += q[me + d] * k[jj * ld + d];
                dp += g[me + d] * v[jj * ld + d];
            }
            float p = expf(sc * scale - row_lse);
            float ds = p * (dp - row_D) * scale;
            for (int d = 0; d < hs; d++) dq[me + d] += ds * k[jj * ld + d];
        }
    }
    if (t >= T) return;
    float *dst = dqkv + ((size_t)b * T + t) * 3 * C + (size_t)h * hs;
    for (int d = 0; d < hs; d++) dst[d] = dq[me + d];
}

float *cu_attention_rowdot(struct ops_ctx *ctx, const float *dout, const float *out, int B, int T,
                          int C, int NH)
{
    size_t rows = (size_t)B * NH * T;
    float *Dr = (float *)cu_scratch(ctx, CU_SCRATCH_PARTIAL, rows * sizeof(float));
    if (!Dr) return NULL;
    flash_rowdot_kernel<<<cu_blocks(rows, 256), 256, 0, ctx->stream>>>(Dr, dout, out, B, T, C, NH);
    return LAUNCH_OK(ctx) ? Dr : NULL;
}

extern "C" void ops_cuda_attention_fused_forward(struct ops_ctx *ctx, float *out, float *lse,
                                                 const float *qkv, int B, int T, int C, int NH)
{
    if (B <= 0 || T <= 0 || C <= 0) return;
    int hs = C / NH;
    size_t bytes;
    if (!smem_for(ctx, (const void *)flash_forward_kernel, 4, hs, TILE * (TILE + 1), &bytes))
        return;
    dim3 grid(cu_blocks((size_t)T, TILE), (unsigned)(B * NH));
    flash_forward_kernel<<<grid, TILE, bytes, ctx->stream>>>(out, lse, qkv, T, C, NH,
                                                             1.0f / sqrtf((float)hs));
    (void)LAUNCH_OK(ctx);
}

extern "C" void ops_cuda_attention_fused_backward(struct ops_ctx *ctx, float *dqkv,
                                                  const float *dout, const float *qkv,
                                                  const float *out, const float *lse, int B, int T,
                                                  int C, int NH)
{
    if (B <= 0 || T <= 0 || C <= 0) return;
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    size_t bytes;
    float *Dr = cu_attention_rowdot(ctx, dout, out, B, T, C, NH);
    if (!Dr) return;
    dim3 grid(cu_blocks((size_t)T, TILE), (unsigned)(B * NH));
    if (!smem_for(ctx, (const void *)flash_dkdv_kernel, 6, hs, 0, &bytes)) return;
    flash_dkdv_kernel<<<grid, TILE, bytes, ctx->stream>>>(dqkv, qkv, dout, lse, Dr, T, C, NH,
                                                          scale);
    if (!LAUNCH_OK(ctx)) return;
    if (!smem_for(ctx, (const void *)flash_dq_kernel, 5, hs, 0, &bytes)) return;
    flash_dq_kernel<<<grid, TILE, bytes, ctx->stream>>>(dqkv, qkv, dout, lse, Dr, T, C, NH, scale);
    (void)LAUNCH_OK(ctx);
}
