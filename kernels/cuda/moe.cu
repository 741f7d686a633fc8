/* moe.cu — a mixture-of-experts block's routing (kernels/ops.h: moe_route,
 * moe_dispatch, moe_gather and moe_combine with their backwards,
 * moe_route_backward, moe_losses), op for op kernels/cpu's moe_generic.inc
 * and moe_dispatch.c. Built with -fmad=false (Makefile): no product is fused
 * into an addition, as the CPU's C17 never contracts one, so the router's
 * softmax (vmath.h's vexpf, the CPU's own), its top-k and gates, the route
 * backward, the gather's and the combine's sums run the CPU's operations in
 * its order: the same bits, lse's logf within an ulp. Summed in another
 * order: the gates' gradients (a warp's dot product) and the losses' doubles
 * (a block's tree). The dispatch is one block per expert walking the tokens
 * in order, its capacity counted as the CPU counts it. */
#include <math.h>

#include "kernels/cpu/vmath.h"
#include "kernels/cuda/cuda_common.cuh"

enum { THREADS = 256, WARPS = THREADS / 32, SCAN_THREADS = 1024 };

/* ---- the router ----------------------------------------------------------------------- */

/* One thread a token, its E logits in expert order as the CPU takes them:
 * probs (N,E), choice and gate (N,k), lse (N) */
__global__ void route_kernel(float *probs, int32_t *choice, float *gate, float *lse,
                             const float *logits, int N, int E, int k)
{
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= N) return;
    const float *x = logits + (size_t)t * E;
    float *p = probs + (size_t)t * E, mx = x[0], sum = 0.0f;
    for (int e = 1; e < E; e++) mx = x[e] > mx ? x[e] : mx;
    for (int e = 0; e < E; e++) sum += p[e] = vexpf(x[e] - mx);
    for (int e = 0; e < E; e++) p[e] /= sum;
    lse[t] = mx + logf(sum);
    int32_t *c = choice + (size_t)t * k;
    float *g = gate + (size_t)t * k, kept = 0.0f;
    for (int j = 0; j < k; j++) { /* the largest not yet taken; a strict > keeps the lower */
        int best = -1;
        for (int e = 0; e < E; e++) {
            bool taken = false;
            for (int i = 0; i < j; i++) taken |= c[i] == e;
            if (!taken && (best < 0 || p[e] > p[best])) best = e;
        }
        c[j] = best;
        kept += g[j] = p[best];
    }
    for (int j = 0; j < k; j++) g[j] /= kept;
}

void cu_moe_route(struct ops_ctx *ctx, float *probs, int32_t *choice, float *gate, float *lse,
                  const float *logits, int N, int E, int k)
{
    if (N <= 0 || E <= 0) return;
    route_kernel<<<cu_blocks((size_t)N, THREADS), THREADS, 0, ctx->stream>>>(probs, choice, gate,
                                                                             lse, logits, N, E, k);
    (void)LAUNCH_OK(ctx);
}

/* One thread a token: dlogits (N,E) from dgate through the gates and the
 * softmax, the balance loss's per_choice·routed[e] and the z-loss's
 * z·2·lse/N on each p_e (moe_generic.inc says the algebra) */
__global__ void route_backward_kernel(float *dlogits, const float *dgate, const float *probs,
                                      const int32_t *choice, const float *gate, const float *lse,
                                      const int32_t *routed, int N, int E, int k, float per_choice,
                                      float z)
{
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= N) return;
    const float *p = probs + (size_t)t * E;
    float *d = dlogits + (size_t)t * E;
    const int32_t *c = choice + (size_t)t * k;
    const float *g = gate + (size_t)t * k;
    for (int e = 0; e < E; e++) d[e] = per_choice * routed[e]; /* dp, for now */
    if (dgate) {
        const float *dg = dgate + (size_t)t * k;
        float S = 0.0f, dot = 0.0f;
        for (int j = 0; j < k; j++) {
            S += p[c[j]];
            dot += dg[j] * g[j];
        }
        for (int j = 0; j < k; j++) d[c[j]] += (dg[j] - dot) / S;
    }
    float pd = 0.0f;
    for (int e = 0; e < E; e++) pd += p[e] * d[e];
    float zt = z * 2 * lse[t] / N;
    for (int e = 0; e < E; e++) d[e] = p[e] * (d[e] - pd) + zt * p[e];
}

void cu_moe_route_backward(struct ops_ctx *ctx, float *dlogits, const float *dgate,
                           const float *probs, const int32_t *choice, const float *gate,
                           const float *lse, const int32_t *routed, int N, int E, int k, float aux,
                           float z)
{
    if (N <= 0 || E <= 0) return;
    float per_choice = aux * E / ((float)k * N) / N; /* the CPU's float operations, in its order */
    route_backward_kernel<<<cu_blocks((size_t)N, THREADS), THREADS, 0, ctx->stream>>>(
        dlogits, dgate, probs, choice, gate, lse, routed, N, E, k, per_choice, z);
    (void)LAUNCH_OK(ctx);
}

/* sums (E+1): block e < E the probabilities of expert e over the tokens, block
 * E the squared logsumexps, each in double */
__global__ void losses_sums_kernel(double *sums, const float *probs, const float *lse, int N, int E)
{
    __shared__ double shared[32];
    int e = blockIdx.x;
    double s = 0.0;
    for (int t = threadIdx.x; t < N; t += blockDim.x)
        s += e < E ? (double)probs[(size_t)t * E + e] : (double)lse[t] * lse[t];
    s = cu_block_sum(s, shared);
    if (threadIdx.x == 0) sums[e] = s;
}

/* out (2): the balance loss over the experts in order, and the z-loss */
__global__ void losses_final_kernel(double *out, const double *sums, const int32_t *routed, int N,
                                    int E, int k, double aux, double z)
{
    double balance = 0.0;
    for (int e = 0; e < E; e++) balance += (double)routed[e] / ((double)k * N) * (sums[e] / N);
    out[0] = aux * E * balance;
    out[1] = z * sums[E] / N;
}

/* The two losses come back to the host: this waits for the stream. */
void cu_moe_losses(struct ops_ctx *ctx, double *out, const float *probs, const float *lse,
                   const int32_t *routed, int N, int E, int k, double aux, double z)
{
    out[0] = out[1] = NAN;
    double *sums =
        E < 0 ? NULL : (double *)cu_scratch(ctx, CU_SCRATCH_MOE, (size_t)(E + 3) * sizeof *sums);
    if (!sums) return;
    double *res = sums + E + 1;
    losses_sums_kernel<<<E + 1, THREADS, 0, ctx->stream>>>(sums, probs, lse, N, E);
    if (!LAUNCH_OK(ctx)) return;
    losses_final_kernel<<<1, 1, 0, ctx->stream>>>(res, sums, routed, N, E, k, aux, z);
    if (!LAUNCH_OK(ctx)) return;
    double host[2];
    if (CUDA_OK(ctx,
                cudaMemcpyAsync(host, res, sizeof host, cudaMemcpyDeviceToHost, ctx->stream)) &&
        CUDA_OK(ctx, cudaStreamSynchronize(ctx->stream))) {
        out[0] = host[0];
        out[1] = host[1];
    }
}

/* ---- the dispatch --------------------------------------------------------------------- */

/* How many threads of the block before this one hold `flag` (warp ballots,
 * then the warps' counts scanned by warp 0); *total: the block's. Every
 * thread of the block calls it. shared holds 32 ints. */
__device__ int block_count_before(bool flag, int *shared, int *total)
{
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    unsigned ballot = __ballot_sync(0xffffffffu, flag);
    int before = __popc(ballot & ((1u << lane) - 1u));
    __syncthreads(); /* shared may still be read from a previous call */
    if (lane == 0) shared[warp] = __popc(ballot);
    __syncthreads();
    if (warp == 0) {
        int v = lane < warps ? shared[lane] : 0;
        for (int o = 1; o < 32; o <<= 1) { /* inclusive scan over the warps */
            int u = __shfl_up_sync(0xffffffffu, v, o);
            if (lane >= o) v += u;
        }
        shared[lane] = v;
    }
    __syncthreads();
    *total = shared[31];
    return before + (warp ? shared[warp - 1] : 0);
}

/* Block e, expert e: its choices in token order, run by run (len tokens
 * each, the last maybe shorter), each run's count starting from before
 * (runs,E); a choice is kept while fewer than `capacity` (0: no limit) came
 * to e before it. pos (N·k) of e's choices: its place among e's kept rows,
 * or -1; counts[e] the kept, routed[e] every choice. */
__global__ void __launch_bounds__(SCAN_THREADS)
    dispatch_count_kernel(int32_t *pos, int32_t *counts, int32_t *routed, const int32_t *choice,
                          const int32_t *before, int N, int k, int E, int len, int capacity)
{
    __shared__ int shared[32];
    int e = blockIdx.x, kept_all = 0, seen_all = 0;
    for (int t0 = 0; t0 < N; t0 += len) {
        int seen = before ? before[(size_t)(t0 / len) * E + e] : 0;
        size_t i1 = (size_t)min(t0 + len, N) * k;
        for (size_t base = (size_t)t0 * k; base < i1; base += blockDim.x) {
            size_t i = base + threadIdx.x;
            bool mine = i < i1 && choice[i] == e;
            int n_mine, ahead = block_count_before(mine, shared, &n_mine);
            bool kept = mine && (capacity <= 0 || seen + ahead < capacity);
            int n_kept, kept_ahead = block_count_before(kept, shared, &n_kept);
            if (mine) pos[i] = kept ? kept_all + kept_ahead : -1; /* -1: the expert is full */
            seen += n_mine;
            seen_all += n_mine;
            kept_all += n_kept;
        }
    }
    if (threadIdx.x == 0) {
        counts[e] = kept_all;
        routed[e] = seen_all;
    }
}

/* One thread a choice: its place moved past the experts before its own, and
 * its packed row told its token */
__global__ void dispatch_place_kernel(int32_t *pos, int32_t *rows, const int32_t *counts,
                                      const int32_t *choice, size_t choices, int k, int E)
{
    extern __shared__ int32_t first[]; /* (E) each expert's first packed row */
    if (threadIdx.x == 0)
        for (int e = 0, at = 0; e < E; at += counts[e], e++) first[e] = at;
    __syncthreads();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= choices || pos[i] < 0) return;
    int32_t p = pos[i] + first[choice[i]];
    pos[i] = p;
    rows[p] = (int32_t)(i / k);
}

/* The kept count comes back to the host: this waits for the stream (the
 * runtime reads the counts right after anyway: model_moe.c). */
int cu_moe_dispatch(struct ops_ctx *ctx, int32_t *pos, int32_t *rows, int32_t *counts,
                    int32_t *routed, const int32_t *choice, const int32_t *before, int ranges,
                    int N, int E, int k, int capacity)
{
    if (E <= 0) return 0;
    int len = ranges > 1 && N >= ranges ? N / ranges : N;
    size_t choices = N > 0 && k > 0 ? (size_t)N * k : 0;
    dispatch_count_kernel<<<E, SCAN_THREADS, 0, ctx->stream>>>(
        pos, counts, routed, choice, before, choices ? N : 0, k, E, len > 0 ? len : 1, capacity);
    if (!LAUNCH_OK(ctx)) return 0;
    if (choices) {
        dispatch_place_kernel<<<cu_blocks(choices, THREADS), THREADS, (size_t)E * sizeof(int32_t),
                                ctx->stream>>>(pos, rows, counts, choice, choices, k, E);
        if (!LAUNCH_OK(ctx)) return 0;
    }
    int32_t *host = (int32_t *)malloc((size_t)E * sizeof *host);
    int kept = 0;
    if (!host) {
        cu_set_error(ctx, "out of memory for the counts of %d experts", E);
        return 0;
    }
    if (CUDA_OK(ctx, cudaMemcpyAsync(host, counts, (size_t)E * sizeof *host, cudaMemcpyDeviceToHost,
                                     ctx->stream)) &&
        CUDA_OK(ctx, cudaStreamSynchronize(ctx->stream)))
        for (int e = 0; e < E; e++) kept += host[e];
    free(host);
    return kept;
}

/* ---- the rows to the experts and back ---------------------------------------------------- */

/* Block m: packed row m = x's row rows[m] */
__global__ void gather_kernel(float *packed, const float *x, const int32_t *rows, int C)
{
    const float *src = x + (size_t)rows[blockIdx.x] * C;
    float *dst = packed + (size_t)blockIdx.x * C;
    for (int i = threadIdx.x; i < C; i += blockDim.x) dst[i] = src[i];
}

void cu_moe_gather(struct ops_ctx *ctx, float *packed, const float *x, const int32_t *rows, int M,
                   int C)
{
    if (M <= 0 || C <= 0) return;
    gather_kernel<<<M, THREADS, 0, ctx->stream>>>(packed, x, rows, C);
    (void)LAUNCH_OK(ctx);
}

/* Block t: out[t] (+)= Σ_j gate[t,j]·rows[pos[t,j]] over the kept choices, in choice
 * order (gate NULL: each row as it is, the gather's backward) */
__global__ void kept_sum_kernel(float *out, const float *rows, const float *gate,
                                const int32_t *pos, int k, int C, bool accumulate)
{
    size_t t = blockIdx.x;
    float *o = out + t * C;
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        float v = accumulate ? o[i] : 0.0f;
        for (int j = 0; j < k; j++) {
            int32_t m = pos[t * k + j];
            if (m < 0) continue;
            float x = rows[(size_t)m * C + i];
            v += gate ? gate[t * k + j] * x : x;
        }
        o[i] = v;
    }
}

void cu_moe_gather_backward(struct ops_ctx *ctx, float *dx, const float *dpacked,
                            const int32_t *pos, int N, int k, int C, bool accumulate)
{
    if (N <= 0 || C <= 0) return;
    kept_sum_kernel<<<N, THREADS, 0, ctx->stream>>>(dx, dpacked, NULL, pos, k, C, accumulate);
    (void)LAUNCH_OK(ctx);
}

void cu_moe_combine(struct ops_ctx *ctx, float *out, const float *y, const float *gate,
                    const int32_t *pos, int N, int k, int C, bool accumulate)
{
    if (N <= 0 || C <= 0) return;
    kept_sum_kernel<<<N, THREADS, 0, ctx->stream>>>(out, y, gate, pos, k, C, accumulate);
    (void)LAUNCH_OK(ctx);
}

/* One warp a choice (t,j): dy[pos] = gate·dout[t], dgate = dout[t]·y[pos]
 * (a warp's sum), 0 for a dropped choice */
__global__ void combine_backward_kernel(float *dy, float *dgate, const float *dout, const float *y,
                                        const float *gate, const int32_t *pos, size_t choices,
                                        int k, int C)
{
    size_t w = (size_t)blockIdx.x * WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (w >= choices) return;
    int32_t m = pos[w];
    float s = 0.0f;
    if (m >= 0) {
        const float *d = dout + (w / k) * C, *row = y + (size_t)m * C;
        float *drow = dy + (size_t)m * C, g = gate[w];
        for (int i = lane; i < C; i += 32) {
            s += d[i] * row[i];
            drow[i] = g * d[i];
        }
        s = cu_warp_sum(s);
    }
    if (lane == 0) dgate[w] = s;
}

void cu_moe_combine_backward(struct ops_ctx *ctx, float *dy, float *dgate, const float *dout,
                             const float *y, const float *gate, const int32_t *pos, int N, int k,
                             int C)
{
    size_t choices = N > 0 && k > 0 ? (size_t)N * k : 0;
    if (!choices) return;
    combine_backward_kernel<<<cu_blocks(choices, WARPS), THREADS, 0, ctx->stream>>>(
        dy, dgate, dout, y, gate, pos, choices, k, C);
    (void)LAUNCH_OK(ctx);
}
