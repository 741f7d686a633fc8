/* rope_expand.cu — rotary positions fused with grouped-query attention's key/value
 * expansion (kernels/ops.h's rope_kv_expand and its backward): one thread a (row, pair,
 * key/value head) does that head's group, its q heads, its k head rotated once and
 * written to each query head of the group, its v head likewise unrotated. The rotation is
 * llama.cu's, with its (cos, sin) table (cu_rope_table); the backward's group sums are
 * kv_expand_backward_kernel's, in head order, then rotated back: the composition's
 * values. The unfused ops stay llama.cu's. */
#include "kernels/cuda/cuda_common.cuh"

enum { THREADS = 256 };

/* the pair (x0, x1) rotated by the angle whose (cos, sin) is (c, s), as rope_kernel */
__device__ __forceinline__ float2 rotate(float x0, float x1, float c, float s)
{
    return make_float2(x0 * c - x1 * s, x1 * c + x0 * s);
}

/* The thread's pair of the grid's x: row r of B·T (time t), pair i of hs/2; false past
 * the last of the pairs */
__device__ __forceinline__ bool pair_of(size_t pairs, int T, int hs, size_t *r, size_t *t, int *i)
{
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x, half = (size_t)hs / 2;
    if (idx >= pairs) return false;
    *r = idx / half;
    *t = *r % T;
    *i = (int)(idx % half);
    return true;
}

/* out (N,3C), C = NH·hs: [q rotated | k of head h/group rotated | v of head h/group] from
 * packed (N,C+2·KVC) */
__global__ void rope_kv_expand_kernel(float *out, const float *packed, const float2 *table,
                                      size_t pairs, int T, int NH, int NKV, int hs)
{
    size_t r, t;
    int i, g = blockIdx.y, half = hs / 2, group = NH / NKV;
    if (!pair_of(pairs, T, hs, &r, &t, &i)) return;
    size_t C = (size_t)NH * hs, KVC = (size_t)NKV * hs;
    float2 cs = table[t * half + i];
    const float *in = packed + r * (C + 2 * KVC);
    float *o = out + r * 3 * C;
    for (int h = g * group; h < (g + 1) * group; h++) {
        size_t q = (size_t)h * hs + i;
        float2 y = rotate(in[q], in[q + half], cs.x, cs.y);
        o[q] = y.x;
        o[q + half] = y.y;
    }
    size_t kg = C + (size_t)g * hs + i, vg = kg + KVC;
    float2 k = rotate(in[kg], in[kg + half], cs.x, cs.y);
    float v0 = in[vg], v1 = in[vg + half];
    for (int h = g * group; h < (g + 1) * group; h++) {
        size_t at = C + (size_t)h * hs + i;
        o[at] = k.x;
        o[at + half] = k.y;
        o[at + C] = v0;
        o[at + C + half] = v1;
    }
}

/* dpacked (N,C+2·KVC) from dout (N,3C): q rotated back; each k and v head the sum of its
 * group's heads in head order, k's then rotated back */
__global__ void rope_kv_expand_backward_kernel(float *dpacked, const float *dout,
                                               const float2 *table, size_t pairs, int T, int NH,
                                               int NKV, int hs)
{
    size_t r, t;
    int i, g = blockIdx.y, half = hs / 2, group = NH / NKV;
    if (!pair_of(pairs, T, hs, &r, &t, &i)) return;
    size_t C = (size_t)NH * hs, KVC = (size_t)NKV * hs;
    float2 cs = table[t * half + i];
    float c = cs.x, s = -cs.y; /* the inverse rotation */
    const float *d = dout + r * 3 * C;
    float *o = dpacked + r * (C + 2 * KVC);
    float k0 = 0.0f, k1 = 0.0f, v0 = 0.0f, v1 = 0.0f;
    for (int h = g * group; h < (g + 1) * group; h++) {
        size_t q = (size_t)h * hs + i;
        float2 y = rotate(d[q], d[q + half], c, s);
        o[q] = y.x;
        o[q + half] = y.y;
        k0 += d[C + q];
        k1 += d[C + q + half];
        v0 += d[2 * C + q];
        v1 += d[2 * C + q + half];
    }
    size_t kg = C + (size_t)g * hs + i, vg = kg + KVC;
    float2 k = rotate(k0, k1, c, s);
    o[kg] = k.x;
    o[kg + half] = k.y;
    o[vg] = v0;
    o[vg + half] = v1;
}

/* The grid of a fused op: B·T·hs/2 pairs along x, the NKV key/value heads along y; the
 * table of the positions, or NULL (nothing to do, or the error recorded). */
static const float2 *launch_shape(struct ops_ctx *ctx, int B, int T, int NH, int NKV, int hs,
                                  double theta, int pos0, size_t *pairs, dim3 *grid)
{
    *pairs = (size_t)B * T * (hs / 2);
    if (!*pairs || NKV <= 0 || NH % NKV != 0) return NULL;
    *grid = dim3(cu_blocks(*pairs, THREADS), (unsigned)NKV);
    return cu_rope_table(ctx, T, hs, theta, pos0);
}

void cu_rope_kv_expand(struct ops_ctx *ctx, float *out, const float *packed, int B, int T, int NH,
                       int NKV, int hs, double theta, int pos0)
{
    size_t pairs;
    dim3 grid;
    const float2 *table = launch_shape(ctx, B, T, NH, NKV, hs, theta, pos0, &pairs, &grid);
    if (!table) return;
    rope_kv_expand_kernel<<<grid, THREADS, 0, ctx->stream>>>(out, packed, table, pairs, T, NH, NKV,
                                                             hs);
    (void)LAUNCH_OK(ctx);
}

void cu_rope_kv_expand_backward(struct ops_ctx *ctx, float *dpacked, const float *dout, int B,
                                int T, int NH, int NKV, int hs, double theta, int pos0)
{
    size_t pairs;
    dim3 grid;
    const float2 *table = launch_shape(ctx, B, T, NH, NKV, hs, theta, pos0, &pairs, &grid);
    if (!table) return;
    rope_kv_expand_backward_kernel<<<grid, THREADS, 0, ctx->stream>>>(dpacked, dout, table, pairs,
                                                                      T, NH, NKV, hs);
    (void)LAUNCH_OK(ctx);
}
