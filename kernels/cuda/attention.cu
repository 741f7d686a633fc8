/* attention.cu — causal multi-head attention that keeps the probabilities, as
 * kernels/cpu does: att (B,NH,T,T) filled, datt as the scores' gradient. The
 * simple version (correct first, not fast), which the runtime uses only with
 * PLAIT_CUDA_ATTENTION=simple; the fused one is attention_fused.cu. */
#include "kernels/cuda/cuda_common.cuh"

/* Every output element is owned by one thread that sums in a fixed order
 * (deterministic); the causal upper triangle is skipped in every sum.
 * qkv (B,T,3C): q at [0,C), k at [C,2C), v at [2C,3C); head h owns the hs
 * columns [h·hs, (h+1)·hs) of each. out (B,T,C), heads side by side. */

enum { THREADS = 256, WARPS = THREADS / 32 };

/* att[bh,t,s] = scale·q_t·k_s for s ≤ t, 0 above the diagonal */
__global__ void scores_kernel(float *att, const float *qkv, int B, int T, int C, int NH,
                              float scale)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t total = (size_t)B * NH * T * T;
    if (i >= total) return;
    int s = (int)(i % T), t = (int)(i / T % T);
    int bh = (int)(i / ((size_t)T * T)), b = bh / NH, h = bh % NH, hs = C / NH;
    if (s > t) {
        att[i] = 0.0f;
        return;
    }
    const float *q = qkv + ((size_t)b * T + t) * 3 * C + (size_t)h * hs;
    const float *k = qkv + ((size_t)b * T + s) * 3 * C + C + (size_t)h * hs;
    float dot = 0.0f;
    for (int d = 0; d < hs; d++) dot += q[d] * k[d];
    att[i] = dot * scale;
}

/* one warp per row (bh, t): softmax over s ≤ t in place */
__global__ void causal_softmax_kernel(float *att, int rows, int T)
{
    int row = blockIdx.x * WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    int t = row % T;
    float *a = att + (size_t)row * T;
    float mx = -INFINITY;
    for (int s = lane; s <= t; s += 32) mx = fmaxf(mx, a[s]);
    mx = cu_warp_max(mx);
    float sum = 0.0f;
    for (int s = lane; s <= t; s += 32) {
        float e = expf(a[s] - mx);
        a[s] = e;
        sum += e;
    }
    float inv = 1.0f / cu_warp_sum(sum);
    for (int s = lane; s <= t; s += 32) a[s] *= inv;
}

/* out[b,t,h·hs+d] = Σ_{s ≤ t} att[bh,t,s]·v[b,s,h·hs+d] */
__global__ void att_values_kernel(float *out, const float *att, const float *qkv, int B, int T,
                                  int C, int NH)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)B * T * C) return;
    int c = (int)(i % C), t = (int)(i / C % T), b = (int)(i / ((size_t)C * T));
    int hs = C / NH, h = c / hs;
    const float *a = att + (((size_t)b * NH + h) * T + t) * T;
    const float *v = qkv + (size_t)b * T * 3 * C + 2 * C + c;
    float acc = 0.0f;
    for (int s = 0; s <= t; s++) acc += a[s] * v[(size_t)s * 3 * C];
    out[i] = acc;
}

void cu_attention_forward(struct ops_ctx *ctx, float *out, float *att, const float *qkv, int B,
                          int T, int C, int NH)
{
    if (B <= 0 || T <= 0 || C <= 0) return;
    float scale = 1.0f / sqrtf((float)(C / NH));
    size_t n = (size_t)B * NH * T * T;
    scores_kernel<<<cu_blocks(n, THREADS), THREADS, 0, ctx->stream>>>(att, qkv, B, T, C, NH, scale);
    if (!LAUNCH_OK(ctx)) return;
    int rows = B * NH * T;
    causal_softmax_kernel<<<cu_blocks((size_t)rows, WARPS), THREADS, 0, ctx->stream>>>(att, rows,
                                                                                       T);
    if (!LAUNCH_OK(ctx)) return;
    size_t m = (size_t)B * T * C;
    att_values_kernel<<<cu_blocks(m, THREADS), THREADS, 0, ctx->stream>>>(out, att, qkv, B, T, C,
                                                                          NH);
    (void)LAUNCH_OK(ctx);
}

/* datt[bh,t,s] = dout_t·v_s for s ≤ t (0 above) */
__global__ void datt_kernel(float *datt, const float *dout, const float *qkv, int B, int T, int C,
                            int NH)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)B * NH * T * T) return;
    int s = (int)(i % T), t = (int)(i / T % T);
    int bh = (int)(i / ((size_t)T * T)), b = bh / NH, h = bh % NH, hs = C / NH;
    if (s > t) {
        datt[i] = 0.0f;
        return;
    }
    const float *d = dout + ((size_t)b * T + t) * C + (size_t)h * hs;
    const float *v = qkv + ((size_t)b * T + s) * 3 * C + 2 * C + (size_t)h * hs;
    float dot = 0.0f;
    for (int e = 0; e < hs; e++) dot += d[e] * v[e];
    datt[i] = dot;
}

/* one warp per row: datt ← att·(datt - Σ att·datt)·scale, the scores' gradient */
__global__ void softmax_backward_kernel(float *datt, const float *att, int rows, int T, float scale)
{
    int row = blockIdx.x * WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    int t = row % T;
    const float *a = att + (size_t)row * T;
    float *d = datt + (size_t)row * T;
    float dot = 0.0f;
    for (int s = lane; s <= t; s += 32) dot += a[s] * d[s];
    dot = cu_warp_sum(dot);
    for (int s = lane; s <= t; s += 32) d[s] = a[s] * (d[s] - dot) * scale;
}

/* dq, dk, dv of (b, t, column c of head h): one thread each, sums in order.
 *   dv[s] = Σ_{t ≥ s} att[t,s]·dout[t];  dq[t] = Σ_{s ≤ t} dS[t,s]·k[s];
 *   dk[s] = Σ_{t ≥ s} dS[t,s]·q[t] */
__global__ void dqkv_kernel(float *dqkv, const float *dS, const float *att, const float *dout,
                            const float *qkv, int B, int T, int C, int NH)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)B * T * C) return;
    int c = (int)(i % C), u = (int)(i / C % T), b = (int)(i / ((size_t)C * T));
    int hs = C / NH, h = c / hs;
    size_t head = ((size_t)b * NH + h) * T * T;
    const float *base = qkv + (size_t)b * T * 3 * C;
    const float *db = dout + (size_t)b * T * C + c;
    float dq = 0.0f, dk = 0.0f, dv = 0.0f;
    for (int s = 0; s <= u; s++)
        dq += dS[head + (size_t)u * T + s] * base[(size_t)s * 3 * C + C + c];
    for (int t = u; t < T; t++) {
        dk += dS[head + (size_t)t * T + u] * base[(size_t)t * 3 * C + c];
        dv += att[head + (size_t)t * T + u] * db[(size_t)t * C];
    }
    float *o = dqkv + ((size_t)b * T + u) * 3 * C + c;
    o[0] = dq;
    o[C] = dk;
    o[2 * C] = dv;
}

void cu_attention_backward(struct ops_ctx *ctx, float *dqkv, float *datt, const float *dout,
                           const float *qkv, const float *att, int B, int T, int C, int NH)
{
    if (B <= 0 || T <= 0 || C <= 0) return;
    float scale = 1.0f / sqrtf((float)(C / NH));
    size_t n = (size_t)B * NH * T * T;
    datt_kernel<<<cu_blocks(n, THREADS), THREADS, 0, ctx->stream>>>(datt, dout, qkv, B, T, C, NH);
    if (!LAUNCH_OK(ctx)) return;
    int rows = B * NH * T;
    softmax_backward_kernel<<<cu_blocks((size_t)rows, WARPS), THREADS, 0, ctx->stream>>>(
        datt, att, rows, T, scale);
    if (!LAUNCH_OK(ctx)) return;
    size_t m = (size_t)B * T * C;
    dqkv_kernel<<<cu_blocks(m, THREADS), THREADS, 0, ctx->stream>>>(dqkv, datt, att, dout, qkv, B,
                                                                    T, C, NH);
    (void)LAUNCH_OK(ctx);
}
