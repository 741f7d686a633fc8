/* encoder.cu — token and position embeddings, forward and backward, with the
 * vocabulary-parallel shard of ops.h (rows [v0, v0+nv) of wte). The backward
 * is deterministic and adds in the CPU's order, to the same bits: the tokens
 * are sorted on the host into one bucket per vocabulary row (positions in
 * order), and a block per row adds its positions' gradients in that order. */
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_common.cuh"

enum { THREADS = 256 };

/* out (B,T,C) = wte[tok - v0] (0 outside the shard) + wpe[t] (if any) */
__global__ void encoder_forward_kernel(float *out, const int32_t *tokens, const float *wte, int v0,
                                       int nv, const float *wpe, int T, int C, size_t total)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    size_t bt = i / C;
    int c = (int)(i % C);
    int tok = tokens[bt] - v0;
    float we = tok >= 0 && tok < nv ? wte[(size_t)tok * C + c] : 0.0f;
    float pe = wpe ? wpe[(size_t)(bt % T) * C + c] : 0.0f;
    out[i] = (tok >= 0 && tok < nv) && wpe ? we + pe : (tok >= 0 && tok < nv) ? we : pe;
}

void cu_encoder_forward(struct ops_ctx *ctx, float *out, const int32_t *tokens, const float *wte,
                        int v0, int nv, const float *wpe, int B, int T, int C)
{
    size_t total = (size_t)B * T * C;
    if (!total) return;
    encoder_forward_kernel<<<cu_blocks(total, THREADS), THREADS, 0, ctx->stream>>>(
        out, tokens, wte, v0, nv, wpe, T, C, total);
    (void)LAUNCH_OK(ctx);
}

/* dwpe (T,C) = dwpe·accumulate + Σ_b dout[b,t]: one thread per (t, c), b in order */
__global__ void encoder_dwpe_kernel(float *dwpe, const float *dout, int B, int T, int C,
                                    bool accumulate)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)T * C) return;
    float s = accumulate ? dwpe[i] : 0.0f;
    for (int b = 0; b < B; b++) s += dout[(size_t)b * T * C + i];
    dwpe[i] = s;
}

/* dwte[rows[r], c] += dout[order[k], c] for k in [starts[r], starts[r+1]):
 * one block per distinct token row (blockIdx.x), its threads over channels,
 * each adding that token's positions in increasing bt, as the CPU does */
__global__ void encoder_dwte_kernel(float *dwte, const float *dout, const int32_t *rows,
                                    const int32_t *starts, const int32_t *order, int C)
{
    int r = blockIdx.x, row = rows[r], k0 = starts[r], k1 = starts[r + 1];
    for (int c = blockIdx.y * blockDim.x + threadIdx.x; c < C; c += gridDim.y * blockDim.x) {
        float acc = dwte[(size_t)row * C + c];
        for (int k = k0; k < k1; k++) acc += dout[(size_t)order[k] * C + c];
        dwte[(size_t)row * C + c] = acc;
    }
}

/* Host buckets of the tokens in the shard, by row, each in bt order (a stable
 * counting sort): idx = rows (n_rows) | starts (n_rows + 1) | order (N), in one
 * buffer to upload at once, in the context's host buffers (ctx->enc), grown on
 * demand. */
static bool grow(struct ops_ctx *ctx, int32_t **p, size_t *have, size_t want)
{
    if (*have >= want) return true;
    int32_t *q = (int32_t *)realloc(*p, want * sizeof(int32_t));
    if (!q) {
        cu_set_error(ctx, "out of host memory for %zu token indices", want);
        return false;
    }
    *p = q;
    *have = want;
    return true;
}

static int buckets(struct ops_ctx *ctx, const int32_t *tokens, int N, int v0, int nv)
{
    struct cu_encoder_host *h = &ctx->enc;
    size_t n = (size_t)N, rows_cap = n < (size_t)nv ? n : (size_t)nv;
    if (!grow(ctx, &h->count, &h->count_n, (size_t)nv + 1) ||
        !grow(ctx, &h->idx, &h->idx_n, 2 * rows_cap + 1 + n))
        return -1;
    int32_t *count = h->count;
    memset(count, 0, ((size_t)nv + 1) * sizeof(int32_t));
    for (int bt = 0; bt < N; bt++) {
        int tok = tokens[bt] - v0;
        if (tok >= 0 && tok < nv) count[tok]++;
    }
    int n_rows = 0, at = 0;
    int32_t *rows = h->idx;
    for (int v = 0; v < nv; v++) /* each row's first slot in order, rows in order */
        if (count[v]) {
            rows[n_rows++] = v;
            int c = count[v];
            count[v] = at;
            at += c;
        }
    int32_t *starts = rows + n_rows, *order = starts + n_rows + 1;
    for (int r = 0; r < n_rows; r++) starts[r] = count[rows[r]];
    starts[n_rows] = at;
    for (int bt = 0; bt < N; bt++) {
        int tok = tokens[bt] - v0;
        if (tok >= 0 && tok < nv) order[count[tok]++] = bt;
    }
    return n_rows;
}

void cu_encoder_backward(struct ops_ctx *ctx, float *dwte, int v0, int nv, float *dwpe,
                         const float *dout, const int32_t *tokens, int B, int T, int C,
                         bool accumulate)
{
    if (dwpe && T > 0 && C > 0) {
        size_t n = (size_t)T * C;
        encoder_dwpe_kernel<<<cu_blocks(n, THREADS), THREADS, 0, ctx->stream>>>(dwpe, dout, B, T, C,
                                                                                accumulate);
        if (!LAUNCH_OK(ctx)) return;
    }
    int N = B * T;
    if (!dwte || N <= 0 || C <= 0 || nv <= 0) return;
    /* the tokens to the host (N int32, a wait), sorted into rows there */
    struct cu_encoder_host *h = &ctx->enc;
    if (!grow(ctx, &h->tokens, &h->tokens_n, (size_t)N)) return;
    CUDA_TRY(ctx, cudaMemcpyAsync(h->tokens, tokens, (size_t)N * sizeof(int32_t),
                                  cudaMemcpyDeviceToHost, ctx->stream));
    CUDA_TRY(ctx, cudaStreamSynchronize(ctx->stream));
    int n_rows = buckets(ctx, h->tokens, N, v0, nv);
    if (n_rows <= 0) return;
    size_t idx_n = 2 * (size_t)n_rows + 1 + (size_t)h->idx[2 * n_rows]; /* starts[n_rows] */
    int32_t *idx = (int32_t *)cu_scratch(ctx, CU_SCRATCH_INDEX, idx_n * sizeof(int32_t));
    if (!idx) return;
    /* pageable memory is staged before this returns: h->idx may be reused */
    CUDA_TRY(ctx, cudaMemcpyAsync(idx, h->idx, idx_n * sizeof(int32_t), cudaMemcpyHostToDevice,
                                  ctx->stream));
    dim3 grid((unsigned)n_rows, cu_blocks((size_t)C, THREADS));
    encoder_dwte_kernel<<<grid, THREADS, 0, ctx->stream>>>(dwte, dout, idx, idx + n_rows,
                                                           idx + 2 * n_rows + 1, C);
    (void)LAUNCH_OK(ctx);
}
