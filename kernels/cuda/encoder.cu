/* encoder.cu — token and position embeddings, forward and backward, with the
 * vocabulary-parallel shard of ops.h (rows [v0, v0+nv) of wte). The backward
 * is deterministic and adds in the CPU's order: each thread owns one channel
 * and walks the tokens in order (simple; a bucketed version would be faster). */
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

void cu_encoder_forward(float *out, const int32_t *tokens, const float *wte, int v0, int nv,
                        const float *wpe, int B, int T, int C)
{
    size_t total = (size_t)B * T * C;
    if (!total) return;
    encoder_forward_kernel<<<cu_blocks(total, THREADS), THREADS, 0, cu_stream>>>(
        out, tokens, wte, v0, nv, wpe, T, C, total);
    (void)LAUNCH_OK();
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

/* dwte[tok - v0, c] += dout[bt, c] for bt in order: one thread per channel */
__global__ void encoder_dwte_kernel(float *dwte, int v0, int nv, const float *dout,
                                    const int32_t *tokens, int N, int C)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    for (int bt = 0; bt < N; bt++) {
        int tok = tokens[bt] - v0;
        if (tok < 0 || tok >= nv) continue;
        dwte[(size_t)tok * C + c] += dout[(size_t)bt * C + c];
    }
}

void cu_encoder_backward(float *dwte, int v0, int nv, float *dwpe, const float *dout,
                         const int32_t *tokens, int B, int T, int C, bool accumulate)
{
    if (dwpe && T > 0 && C > 0) {
        size_t n = (size_t)T * C;
        encoder_dwpe_kernel<<<cu_blocks(n, THREADS), THREADS, 0, cu_stream>>>(dwpe, dout, B, T, C,
                                                                              accumulate);
        if (!LAUNCH_OK()) return;
    }
    if (dwte && B * T > 0 && C > 0) {
        encoder_dwte_kernel<<<cu_blocks((size_t)C, 64), 64, 0, cu_stream>>>(dwte, v0, nv, dout,
                                                                            tokens, B * T, C);
        (void)LAUNCH_OK();
    }
}
