/* attention_block.cu — attention one key/value block at a time, what context
 * parallelism's ring runs as each rank's keys and values pass by (kernels/ops.h
 * attention_block_forward and _backward; the CPU's ring_attention_generic.inc
 * is the reference). The tiling of attention_fused.cu with two differences: a
 * key is masked by the positions of the two rows (qpos, kpos), not by their
 * indexes, so no tile is skipped; and the forward starts from the output and
 * log-sum-exp the earlier blocks left (out = Σ exp(s − lse)·v: m = lse, l = 1,
 * o = out), merging the block in online. Deterministic: each output row is one
 * thread's, summed in a fixed order; the backward's terms are added. fp32 on
 * the CUDA cores. Not yet run on a GPU: plait-train --selftest checks it
 * against the CPU's. */
#include "kernels/cuda/attention_tile.cuh" // defines: TILE, load_tile, smem_for
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_ops.h"

/* one block: TILE query rows of head (b, h), thread i row t = t0 + i; shared:
 * q, o (own rows), k, v (the key tile) (TILE, hs+1), the scores (TILE, TILE+1) */
__global__ void block_forward_kernel(float *out, float *lse, const float *q, int ldq,
                                     const float *kv, const int32_t *qpos, const int32_t *kpos,
                                     int Tq, int Tk, int C, int NH, float scale, bool first)
{
    extern __shared__ float smem[];
    int hs = C / NH, ld = hs + 1, bh = blockIdx.y, b = bh / NH, h = bh % NH;
    int t0 = blockIdx.x * TILE, t = t0 + threadIdx.x, me = threadIdx.x * ld;
    float *qs = smem, *o = qs + TILE * ld, *k = o + TILE * ld, *v = k + TILE * ld;
    float *s = v + TILE * ld + threadIdx.x * (TILE + 1);
    const float *kbase = kv + (size_t)b * Tk * 2 * C + (size_t)h * hs;
    float *row = out + ((size_t)b * Tq + (t < Tq ? t : 0)) * C + (size_t)h * hs;
    load_tile(qs, q + (size_t)b * Tq * ldq + (size_t)h * hs, (size_t)ldq, t0, Tq, hs);
    float m = first || t >= Tq ? -INFINITY : lse[(size_t)bh * Tq + t];
    float l = m == -INFINITY ? 0.0f : 1.0f; /* the earlier blocks' output, normalised */
    for (int d = 0; d < hs; d++) o[me + d] = l > 0 ? row[d] : 0.0f;
    int pos = t < Tq ? qpos[t] : 0;
    for (int j0 = 0; j0 < Tk; j0 += TILE) {
        __syncthreads();
        load_tile(k, kbase, 2 * (size_t)C, j0, Tk, hs);
        load_tile(v, kbase + C, 2 * (size_t)C, j0, Tk, hs);
        __syncthreads();
        if (t >= Tq) continue;
        int n = min(TILE, Tk - j0);
        float tile_max = -INFINITY;
        for (int j = 0; j < n; j++) {
            if (kpos[j0 + j] > pos) { /* after the query: masked */
                s[j] = -INFINITY;
                continue;
            }
            float dot = 0.0f;
            for (int d = 0; d < hs; d++) dot += qs[me + d] * k[j * ld + d];
            s[j] = dot * scale;
            tile_max = fmaxf(tile_max, s[j]);
        }
        if (tile_max == -INFINITY) continue; /* no key of the tile is visible */
        float m_new = fmaxf(m, tile_max), corr = expf(m - m_new);
        l *= corr;
        for (int d = 0; d < hs; d++) o[me + d] *= corr;
        for (int j = 0; j < n; j++) {
            if (s[j] == -INFINITY) continue;
            float p = expf(s[j] - m_new);
            l += p;
            for (int d = 0; d < hs; d++) o[me + d] += p * v[j * ld + d];
        }
        m = m_new;
    }
    if (t >= Tq) return;
    if (l == 0.0f) { /* nothing visible so far: first writes zeros and -inf */
        if (first) {
            for (int d = 0; d < hs; d++) row[d] = 0.0f;
            lse[(size_t)bh * Tq + t] = -INFINITY;
        }
        return;
    }
    float inv = 1.0f / l;
    for (int d = 0; d < hs; d++) row[d] = o[me + d] * inv;
    lse[(size_t)bh * Tq + t] = m + logf(l);
}

/* one block: TILE key rows j = j0 + i of head (b, h); their dK, dV terms summed
 * over every query row that sees them, in order, then added. shared: k, v, dk,
 * dv (own rows), q and g (= dout) of the query tile */
__global__ void block_dkdv_kernel(float *dkv, const float *q, int ldq, const float *kv,
                                  const float *dout, const float *lse, const float *Dr,
                                  const int32_t *qpos, const int32_t *kpos, int Tq, int Tk, int C,
                                  int NH, float scale)
{
    extern __shared__ float smem[];
    int hs = C / NH, ld = hs + 1, bh = blockIdx.y, b = bh / NH, h = bh % NH;
    int j0 = blockIdx.x * TILE, j = j0 + threadIdx.x, me = threadIdx.x * ld;
    float *k = smem, *v = k + TILE * ld, *dk = v + TILE * ld, *dv = dk + TILE * ld;
    float *qs = dv + TILE * ld, *g = qs + TILE * ld;
    const float *kbase = kv + (size_t)b * Tk * 2 * C + (size_t)h * hs;
    load_tile(k, kbase, 2 * (size_t)C, j0, Tk, hs);
    load_tile(v, kbase + C, 2 * (size_t)C, j0, Tk, hs);
    for (int d = 0; d < hs; d++) dk[me + d] = dv[me + d] = 0.0f;
    int pos = j < Tk ? kpos[j] : 0;
    for (int q0 = 0; q0 < Tq; q0 += TILE) {
        __syncthreads();
        load_tile(qs, q + (size_t)b * Tq * ldq + (size_t)h * hs, (size_t)ldq, q0, Tq, hs);
        load_tile(g, dout + (size_t)b * Tq * C + (size_t)h * hs, (size_t)C, q0, Tq, hs);
        __syncthreads();
        if (j >= Tk) continue;
        for (int i = 0; i < TILE && q0 + i < Tq; i++) {
            int t = q0 + i;
            if (pos > qpos[t]) continue;
            float sc = 0.0f, dp = 0.0f;
            for (int d = 0; d < hs; d++) {
                sc += qs[i * ld + d] * k[me + d];
                dp += g[i * ld + d] * v[me + d];
            }
            float p = expf(sc * scale - lse[(size_t)bh * Tq + t]);
            float ds = p * (dp - Dr[(size_t)bh * Tq + t]) * scale;
            for (int d = 0; d < hs; d++) {
                dv[me + d] += p * g[i * ld + d];
                dk[me + d] += ds * qs[i * ld + d];
            }
        }
    }
    if (j >= Tk) return;
    float *dst = dkv + ((size_t)b * Tk + j) * 2 * C + (size_t)h * hs;
    for (int d = 0; d < hs; d++) {
        dst[d] += dk[me + d];
        dst[C + d] += dv[me + d];
    }
}

/* one block: TILE query rows t = t0 + i; their dQ terms summed over the keys
 * they see, in order, then added. shared: q, g, dq (own rows), k, v (the tile) */
__global__ void block_dq_kernel(float *dq, const float *q, int ldq, const float *kv,
                                const float *dout, const float *lse, const float *Dr,
                                const int32_t *qpos, const int32_t *kpos, int Tq, int Tk, int C,
                                int NH, float scale)
{
    extern __shared__ float smem[];
    int hs = C / NH, ld = hs + 1, bh = blockIdx.y, b = bh / NH, h = bh % NH;
    int t0 = blockIdx.x * TILE, t = t0 + threadIdx.x, me = threadIdx.x * ld;
    float *qs = smem, *g = qs + TILE * ld, *dqs = g + TILE * ld, *k = dqs + TILE * ld;
    float *v = k + TILE * ld;
    const float *kbase = kv + (size_t)b * Tk * 2 * C + (size_t)h * hs;
    load_tile(qs, q + (size_t)b * Tq * ldq + (size_t)h * hs, (size_t)ldq, t0, Tq, hs);
    load_tile(g, dout + (size_t)b * Tq * C + (size_t)h * hs, (size_t)C, t0, Tq, hs);
    for (int d = 0; d < hs; d++) dqs[me + d] = 0.0f;
    float row_lse = t < Tq ? lse[(size_t)bh * Tq + t] : 0.0f;
    float row_D = t < Tq ? Dr[(size_t)bh * Tq + t] : 0.0f;
    int pos = t < Tq ? qpos[t] : 0;
    for (int j0 = 0; j0 < Tk; j0 += TILE) {
        __syncthreads();
        load_tile(k, kbase, 2 * (size_t)C, j0, Tk, hs);
        load_tile(v, kbase + C, 2 * (size_t)C, j0, Tk, hs);
        __syncthreads();
        if (t >= Tq) continue;
        for (int jj = 0; jj < TILE && j0 + jj < Tk; jj++) {
            if (kpos[j0 + jj] > pos) continue;
            float sc = 0.0f, dp = 0.0f;
            for (int d = 0; d < hs; d++) {
                sc += qs[me + d] * k[jj * ld + d];
                dp += g[me + d] * v[jj * ld + d];
            }
            float p = expf(sc * scale - row_lse);
            float ds = p * (dp - row_D) * scale;
            for (int d = 0; d < hs; d++) dqs[me + d] += ds * k[jj * ld + d];
        }
    }
    if (t >= Tq) return;
    float *dst = dq + ((size_t)b * Tq + t) * ldq + (size_t)h * hs;
    for (int d = 0; d < hs; d++) dst[d] += dqs[me + d];
}

extern "C" void ops_cuda_attention_block_forward(struct ops_ctx *ctx, float *out, float *lse,
                                                 float *scratch, const float *q, int ldq,
                                                 const float *kv, const int32_t *qpos,
                                                 const int32_t *kpos, int B, int Tq, int Tk, int C,
                                                 int NH, bool first)
{
    (void)scratch; /* (the CPU's; the tiles here are in shared memory) */
    if (B <= 0 || Tq <= 0 || Tk <= 0 || C <= 0) return;
    int hs = C / NH;
    size_t bytes;
    if (!smem_for(ctx, (const void *)block_forward_kernel, 4, hs, TILE * (TILE + 1), &bytes))
        return;
    dim3 grid(cu_blocks((size_t)Tq, TILE), (unsigned)(B * NH));
    block_forward_kernel<<<grid, TILE, bytes, ctx->stream>>>(
        out, lse, q, ldq, kv, qpos, kpos, Tq, Tk, C, NH, 1.0f / sqrtf((float)hs), first);
    (void)LAUNCH_OK(ctx);
}

extern "C" void ops_cuda_attention_block_backward(struct ops_ctx *ctx, float *dq, float *dkv,
                                                  float *scratch, const float *dout,
                                                  const float *q, int ldq, const float *kv,
                                                  const float *out, const float *lse,
                                                  const int32_t *qpos, const int32_t *kpos, int B,
                                                  int Tq, int Tk, int C, int NH)
{
    (void)scratch;
    if (B <= 0 || Tq <= 0 || Tk <= 0 || C <= 0) return;
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    size_t bytes;
    float *Dr = cu_attention_rowdot(ctx, dout, out, B, Tq, C, NH);
    if (!Dr) return;
    dim3 keys(cu_blocks((size_t)Tk, TILE), (unsigned)(B * NH));
    if (!smem_for(ctx, (const void *)block_dkdv_kernel, 6, hs, 0, &bytes)) return;
    block_dkdv_kernel<<<keys, TILE, bytes, ctx->stream>>>(dkv, q, ldq, kv, dout, lse, Dr, qpos,
                                                          kpos, Tq, Tk, C, NH, scale);
    if (!LAUNCH_OK(ctx)) return;
    dim3 queries(cu_blocks((size_t)Tq, TILE), (unsigned)(B * NH));
    if (!smem_for(ctx, (const void *)block_dq_kernel, 5, hs, 0, &bytes)) return;
    block_dq_kernel<<<queries, TILE, bytes, ctx->stream>>>(dq, q, ldq, kv, dout, lse, Dr, qpos,
                                                           kpos, Tq, Tk, C, NH, scale);
    (void)LAUNCH_OK(ctx);
}
