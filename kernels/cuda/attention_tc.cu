/* attention_tc.cu — causal attention on the bf16 tensor cores (mma.sync
 * m16n8k16, fp32 accumulation), in the manner of FlashAttention-2: the runs
 * in bf16 and fp8 precision take it (the CUDA table's attention_*_bf16); fp32
 * runs keep attention_fused.cu, the reference on CUDA cores. Head sizes 16,
 * 32 and 64 (attention_bf16_takes); others run attention_fused.cu.
 *
 * Arithmetic (what the self-test's bound follows from): q, k, v and dout are
 * rounded to bf16 once, by a first pass that lays each head out on its own
 * (rows, and where a product needs it transposed); scores and every product
 * sum in fp32; the probabilities (relative to the row's running maximum) and
 * dS are rounded to bf16 before their products; row sums, lse and D = Σ
 * dout·out stay fp32. Deterministic: no atomics, every output element summed
 * in a fixed order (dK, dV by key blocks; dQ by query blocks in a second
 * kernel). Not here: the (B,NH,T,T) probabilities (never made), other head
 * sizes. */
#include "kernels/cuda/cuda_common.cuh"

namespace
{

constexpr int TILE = 64;      /* query rows of a block = key rows of a tile */
static_assert(TILE == GPT2_SCRATCH_ATTENTION_TILE, "gpt2_scratch.c pads T to this tile");
constexpr int WARPS = 4;      /* 16 rows each; 3 blocks an SM (168 registers at most) */
constexpr int LDT = TILE + 8; /* row stride (bf16) of a transposed tile: conflict-free reads */
constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;

/* two floats rounded to bf16 (nearest even) in one register, lo in the low half */
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi)
{
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

/* 2^x, the hardware's approximation (relative error ~2^-22, below bf16's 2^-9) */
__device__ __forceinline__ float fast_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ uint32_t ld32(const uint16_t *p)
{
    return *reinterpret_cast<const uint32_t *>(p);
}

/* c (16x8, fp32) += a (16x16, bf16, row) · b (16x8, bf16, col). Fragments, with
 * g = lane/4 and q = lane%4: a[0] row g cols 2q,2q+1; a[1] row g+8; a[2], a[3]
 * the same at cols +8; b0 k 2q,2q+1 of col g, b1 at k +8; c[0..1] row g cols
 * 2q,2q+1, c[2..3] row g+8. */
__device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* ---- the first pass: one head's rows in bf16 ------------------------------------------ */

/* A head's plane: Tp = T rounded up to TILE, rows past T zeros. rows (B·NH,
 * Tp, HS), cols its transpose (B·NH, HS, Tp); either may be NULL. */
struct plane {
    uint16_t *rows, *cols;
};

/* One block: rows [r0, r0+TILE) of head (b, h) of src (B, T, ·) at column
 * h·HS, row stride `stride`, rounded to bf16 into the plane. */
template <int HS>
__global__ void __launch_bounds__(WARPS * 32)
    tc_prepare_kernel(struct plane p, const float *src, size_t stride, int T, int Tp, int NH)
{
    __shared__ uint16_t t[TILE][HS + 2];
    int bh = blockIdx.y, b = bh / NH, h = bh % NH, r0 = blockIdx.x * TILE;
    const float *base = src + (size_t)b * T * stride + (size_t)h * HS;
    for (int i = threadIdx.x; i < TILE * HS; i += WARPS * 32) {
        int r = i / HS, d = i % HS;
        uint16_t x = r0 + r < T ? cu_bf16_round(base[(size_t)(r0 + r) * stride + d]) : 0;
        t[r][d] = x;
        if (p.rows) p.rows[((size_t)bh * Tp + r0 + r) * HS + d] = x;
    }
    if (!p.cols) return;
    __syncthreads();
    for (int i = threadIdx.x; i < TILE * HS; i += WARPS * 32) {
        int d = i / TILE, r = i % TILE;
        p.cols[((size_t)bh * HS + d) * Tp + r0 + r] = t[r][d];
    }
}

/* ---- tiles in shared memory ----------------------------------------------------------- */

/* rows [r0, r0+TILE) of a head's rows (Tp, HS) into dst (TILE, HS+8) */
template <int HS>
__device__ __forceinline__ void load_rows(uint16_t *dst, const uint16_t *rows, int r0)
{
    const uint16_t *src = rows + (size_t)r0 * HS;
    for (int i = threadIdx.x; i < TILE * HS / 8; i += WARPS * 32) {
        int r = i / (HS / 8), c = i % (HS / 8) * 8;
        *reinterpret_cast<uint4 *>(dst + r * (HS + 8) + c) =
            *reinterpret_cast<const uint4 *>(src + r * HS + c);
    }
}

/* columns [r0, r0+TILE) of a head's cols (HS, Tp) into dst (HS, LDT) */
template <int HS>
__device__ __forceinline__ void load_cols(uint16_t *dst, const uint16_t *cols, int r0, int Tp)
{
    for (int i = threadIdx.x; i < HS * TILE / 8; i += WARPS * 32) {
        int d = i / (TILE / 8), c = i % (TILE / 8) * 8;
        *reinterpret_cast<uint4 *>(dst + d * LDT + c) =
            *reinterpret_cast<const uint4 *>(cols + (size_t)d * Tp + r0 + c);
    }
}

/* The A fragments (16 rows from row0, k = the HS columns) of a (·, HS+8) tile */
template <int HS>
__device__ __forceinline__ void load_a(uint32_t a[HS / 16][4], const uint16_t *tile, int row0)
{
    int g = (threadIdx.x % 32) / 4, q = threadIdx.x % 4;
#pragma unroll
    for (int kk = 0; kk < HS / 16; kk++) {
        const uint16_t *p = tile + (row0 + g) * (HS + 8) + kk * 16 + 2 * q;
        a[kk][0] = ld32(p);
        a[kk][1] = ld32(p + 8 * (HS + 8));
        a[kk][2] = ld32(p + 8);
        a[kk][3] = ld32(p + 8 * (HS + 8) + 8);
    }
}

/* s (16 x 8·NT) = a (16 x HS) · tileᵀ for tile rows [n0, n0 + 8·NT) of a
 * (·, HS+8) tile: b(k = column, n = tile row) */
template <int HS, int NT>
__device__ __forceinline__ void product_rows(float s[NT][4], const uint32_t a[HS / 16][4],
                                             const uint16_t *tile, int n0)
{
    int g = (threadIdx.x % 32) / 4, q = threadIdx.x % 4;
#pragma unroll
    for (int n = 0; n < NT; n++) {
        s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HS / 16; kk++) {
            const uint16_t *p = tile + (n0 + n * 8 + g) * (HS + 8) + kk * 16 + 2 * q;
            mma(s[n], a[kk], ld32(p), ld32(p + 8));
        }
    }
}

/* acc (16 x HS) += p (16 x 16·KT, the C fragments of a product, rounded to
 * bf16 here) · cols' rows [k0, k0 + 16·KT) transposed: cols is a (HS, LDT)
 * transposed tile, b(k = tile row, n = column) */
template <int HS, int KT>
__device__ __forceinline__ void product_cols(float acc[HS / 8][4], const float p[2 * KT][4],
                                             const uint16_t *cols, int k0)
{
    int g = (threadIdx.x % 32) / 4, q = threadIdx.x % 4;
#pragma unroll
    for (int kk = 0; kk < KT; kk++) {
        uint32_t a[4] = {pack_bf16(p[2 * kk][0], p[2 * kk][1]),
                         pack_bf16(p[2 * kk][2], p[2 * kk][3]),
                         pack_bf16(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                         pack_bf16(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
        for (int d = 0; d < HS / 8; d++) {
            const uint16_t *b = cols + (d * 8 + g) * LDT + k0 + kk * 16 + 2 * q;
            mma(acc[d], a, ld32(b), ld32(b + 8));
        }
    }
}

/* ---- the kernels -------------------------------------------------------------------- */

/* One block: TILE query rows of head (b, h), heaviest blocks first; warp w
 * owns rows 16w..16w+15. out (B,T,C) and lse (B,NH,T), natural log. From q
 * and k rows and v cols. */
template <int HS>
__global__ void __launch_bounds__(WARPS * 32, 3)
    tc_forward_kernel(float *out, float *lse, struct plane qp, struct plane kp, struct plane vp,
                      int T, int Tp, int C, int NH, float scale_log2)
{
    __shared__ __align__(16) uint16_t qk[TILE * (HS + 8)]; /* q, then each key tile */
    __shared__ __align__(16) uint16_t vt[HS * LDT];        /* the value tile, transposed */
    int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    int t0 = (gridDim.x - 1 - blockIdx.x) * TILE;
    int warp = threadIdx.x / 32, g = (threadIdx.x % 32) / 4, q = threadIdx.x % 4;
    const uint16_t *qrows = qp.rows + (size_t)bh * Tp * HS;
    const uint16_t *krows = kp.rows + (size_t)bh * Tp * HS;
    const uint16_t *vcols = vp.cols + (size_t)bh * HS * Tp;

    load_rows<HS>(qk, qrows, t0);
    __syncthreads();
    uint32_t qa[HS / 16][4];
    load_a<HS>(qa, qk, warp * 16);

    float o[HS / 8][4] = {};
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    int row[2] = {t0 + warp * 16 + g, t0 + warp * 16 + g + 8};
    int last = min(t0 + TILE, T) - 1;
    for (int j0 = 0; j0 <= last; j0 += TILE) {
        __syncthreads(); /* the previous tiles are consumed (and q is in registers) */
        load_rows<HS>(qk, krows, j0);
        load_cols<HS>(vt, vcols, j0, Tp);
        __syncthreads();
        float s[TILE / 8][4];
        product_rows<HS, TILE / 8>(s, qa, qk, 0);
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int n = 0; n < TILE / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = j0 + n * 8 + 2 * q + (e & 1);
                float v = key > row[e / 2] ? -INFINITY : s[n][e] * scale_log2;
                s[n][e] = v;
                mx[e / 2] = fmaxf(mx[e / 2], v);
            }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            /* key j0 ≤ row, or an earlier tile, makes mx finite (rows past T: keys 0.. are zeros)
             */
            float corr = fast_exp2(m[r] - mx[r]);
            m[r] = mx[r];
            l[r] *= corr;
#pragma unroll
            for (int d = 0; d < HS / 8; d++) {
                o[d][2 * r] *= corr;
                o[d][2 * r + 1] *= corr;
            }
        }
#pragma unroll
        for (int n = 0; n < TILE / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float p = fast_exp2(s[n][e] - m[e / 2]);
                s[n][e] = p;
                l[e / 2] += p;
            }
        product_cols<HS, TILE / 16>(o, s, vt, 0);
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        if (row[r] >= T) continue;
        float inv = 1.0f / l[r];
        float *dst = out + ((size_t)b * T + row[r]) * C + (size_t)h * HS;
#pragma unroll
        for (int d = 0; d < HS / 8; d++) {
            dst[d * 8 + 2 * q] = o[d][2 * r] * inv;
            dst[d * 8 + 2 * q + 1] = o[d][2 * r + 1] * inv;
        }
        if (q == 0) lse[(size_t)bh * T + row[r]] = (m[r] + log2f(l[r])) * LN2;
    }
}

/* One block: TILE key rows j0.. of head (b, h); warp w owns keys 16w..16w+15
 * and sums dK, dV over the query tiles at or below the diagonal, 32 queries
 * at a time, in order. Products are taken transposed (rows = keys):
 * Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ, dV += Pᵀ·dO, dK += dSᵀ·Q. From k and v rows, q
 * and dout rows and cols. */
template <int HS>
__global__ void __launch_bounds__(WARPS * 32, 3)
    tc_dkdv_kernel(float *dqkv, struct plane qp, struct plane kp, struct plane vp, struct plane gp,
                   const float *lse, const float *Dr, int T, int Tp, int C, int NH, float scale)
{
    __shared__ __align__(16) uint16_t qs[TILE * (HS + 8)], qt[HS * LDT];
    __shared__ __align__(16) uint16_t gs[TILE * (HS + 8)], gt[HS * LDT]; /* dout */
    __shared__ float lse2[TILE], dr[TILE];
    int bh = blockIdx.y, b = bh / NH, h = bh % NH, j0 = blockIdx.x * TILE;
    int warp = threadIdx.x / 32, g = (threadIdx.x % 32) / 4, q = threadIdx.x % 4;
    size_t head = (size_t)bh * Tp * HS; /* a head's rows, or cols, in its plane */
    float scale_log2 = scale * LOG2E;

    /* this warp's key and value rows as A fragments (staged through qs, gs) */
    load_rows<HS>(qs, kp.rows + head, j0);
    load_rows<HS>(gs, vp.rows + head, j0);
    __syncthreads();
    uint32_t ka[HS / 16][4], va[HS / 16][4];
    load_a<HS>(ka, qs, warp * 16);
    load_a<HS>(va, gs, warp * 16);

    float dk[HS / 8][4] = {}, dv[HS / 8][4] = {};
    int key[2] = {j0 + warp * 16 + g, j0 + warp * 16 + g + 8};
    for (int q0 = j0; q0 < T; q0 += TILE) {
        __syncthreads(); /* the previous tiles are consumed (k, v in registers) */
        load_rows<HS>(qs, qp.rows + head, q0);
        load_cols<HS>(qt, qp.cols + head, q0, Tp);
        load_rows<HS>(gs, gp.rows + head, q0);
        load_cols<HS>(gt, gp.cols + head, q0, Tp);
        for (int i = threadIdx.x; i < TILE; i += WARPS * 32) {
            bool in = q0 + i < T;
            lse2[i] = in ? lse[(size_t)bh * T + q0 + i] * LOG2E : 0.0f;
            dr[i] = in ? Dr[(size_t)bh * T + q0 + i] : 0.0f;
        }
        __syncthreads();
#pragma unroll 1
        for (int half = 0; half < TILE; half += 32) {
            float p[4][4], ds[4][4];
            product_rows<HS, 4>(p, ka, qs, half);
            product_rows<HS, 4>(ds, va, gs, half);
#pragma unroll
            for (int n = 0; n < 4; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int col = half + n * 8 + 2 * q + (e & 1), query = q0 + col;
                    float pe = key[e / 2] > query || query >= T
                                   ? 0.0f
                                   : fast_exp2(p[n][e] * scale_log2 - lse2[col]);
                    p[n][e] = pe;
                    ds[n][e] = pe * (ds[n][e] - dr[col]);
                }
            product_cols<HS, 2>(dv, p, gt, half);
            product_cols<HS, 2>(dk, ds, qt, half);
        }
    }
    size_t stride = 3 * (size_t)C;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (key[r] >= T) continue;
        float *dst = dqkv + ((size_t)b * T + key[r]) * stride + (size_t)h * HS;
#pragma unroll
        for (int d = 0; d < HS / 8; d++) {
            dst[C + d * 8 + 2 * q] = dk[d][2 * r] * scale;
            dst[C + d * 8 + 2 * q + 1] = dk[d][2 * r + 1] * scale;
            dst[2 * C + d * 8 + 2 * q] = dv[d][2 * r];
            dst[2 * C + d * 8 + 2 * q + 1] = dv[d][2 * r + 1];
        }
    }
}

/* One block: TILE query rows of head (b, h), heaviest first; warp w owns
 * rows 16w.. and sums dQ over the key tiles at or below the diagonal, 32
 * keys at a time, in order: S = Q·Kᵀ, dP = dO·Vᵀ, dQ += dS·K. From q, dout
 * and v rows, k rows and cols. */
template <int HS>
__global__ void __launch_bounds__(WARPS * 32, 3)
    tc_dq_kernel(float *dqkv, struct plane qp, struct plane kp, struct plane vp, struct plane gp,
                 const float *lse, const float *Dr, int T, int Tp, int C, int NH, float scale)
{
    __shared__ __align__(16) uint16_t ks[TILE * (HS + 8)], vs[TILE * (HS + 8)], kt[HS * LDT];
    int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    int t0 = (gridDim.x - 1 - blockIdx.x) * TILE;
    int warp = threadIdx.x / 32, g = (threadIdx.x % 32) / 4, q = threadIdx.x % 4;
    size_t head = (size_t)bh * Tp * HS;
    float scale_log2 = scale * LOG2E;

    /* this warp's query and dout rows as A fragments (staged through ks, vs) */
    load_rows<HS>(ks, qp.rows + head, t0);
    load_rows<HS>(vs, gp.rows + head, t0);
    __syncthreads();
    uint32_t qa[HS / 16][4], ga[HS / 16][4];
    load_a<HS>(qa, ks, warp * 16);
    load_a<HS>(ga, vs, warp * 16);

    int row[2] = {t0 + warp * 16 + g, t0 + warp * 16 + g + 8};
    float rl[2], rd[2]; /* the rows' lse (log2 units) and D */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        bool in = row[r] < T;
        rl[r] = in ? lse[(size_t)bh * T + row[r]] * LOG2E : 0.0f;
        rd[r] = in ? Dr[(size_t)bh * T + row[r]] : 0.0f;
    }
    float dq[HS / 8][4] = {};
    int last = min(t0 + TILE, T) - 1;
    for (int j0 = 0; j0 <= last; j0 += TILE) {
        __syncthreads(); /* the previous tiles are consumed (q, dout in registers) */
        load_rows<HS>(ks, kp.rows + head, j0);
        load_cols<HS>(kt, kp.cols + head, j0, Tp);
        load_rows<HS>(vs, vp.rows + head, j0);
        __syncthreads();
#pragma unroll 1
        for (int half = 0; half < TILE; half += 32) {
            float p[4][4], ds[4][4];
            product_rows<HS, 4>(p, qa, ks, half);
            product_rows<HS, 4>(ds, ga, vs, half);
#pragma unroll
            for (int n = 0; n < 4; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int k = j0 + half + n * 8 + 2 * q + (e & 1), r = e / 2;
                    float pe = k > row[r] ? 0.0f : fast_exp2(p[n][e] * scale_log2 - rl[r]);
                    ds[n][e] = pe * (ds[n][e] - rd[r]);
                }
            product_cols<HS, 2>(dq, ds, kt, half);
        }
    }
    size_t stride = 3 * (size_t)C;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (row[r] >= T) continue;
        float *dst = dqkv + ((size_t)b * T + row[r]) * stride + (size_t)h * HS;
#pragma unroll
        for (int d = 0; d < HS / 8; d++) {
            dst[d * 8 + 2 * q] = dq[d][2 * r] * scale;
            dst[d * 8 + 2 * q + 1] = dq[d][2 * r + 1] * scale;
        }
    }
}

/* ---- launches ----------------------------------------------------------------------- */

/* `arrays` planes' rows or cols in scratch, (B·NH, Tp, HS) = B·Tp·C elements
 * apiece */
static uint16_t *planes_scratch(struct ops_ctx *ctx, int arrays, int B, int Tp, int C)
{
    size_t bytes = (size_t)arrays * B * Tp * C * sizeof(uint16_t);
    return (uint16_t *)cu_scratch(ctx, CU_SCRATCH_ATTENTION, bytes);
}

/* the heads of src (B, T, ·), row stride `stride`, head h at column h·HS, into p */
template <int HS>
static bool prepare(struct ops_ctx *ctx, struct plane p, const float *src, size_t stride, int B,
                    int T, int Tp, int NH)
{
    dim3 grid((unsigned)(Tp / TILE), (unsigned)(B * NH));
    tc_prepare_kernel<HS><<<grid, WARPS * 32, 0, ctx->stream>>>(p, src, stride, T, Tp, NH);
    return LAUNCH_OK(ctx);
}

template <int HS>
void forward(struct ops_ctx *ctx, float *out, float *lse, const float *qkv, int B, int T, int C,
             int NH)
{
    int Tp = (T + TILE - 1) / TILE * TILE;
    size_t one = (size_t)B * Tp * C;
    uint16_t *s = planes_scratch(ctx, 3, B, Tp, C);
    if (!s) return;
    struct plane qp = {s, NULL}, kp = {s + one, NULL}, vp = {NULL, s + 2 * one};
    size_t stride = 3 * (size_t)C;
    if (!prepare<HS>(ctx, qp, qkv, stride, B, T, Tp, NH) ||
        !prepare<HS>(ctx, kp, qkv + C, stride, B, T, Tp, NH) ||
        !prepare<HS>(ctx, vp, qkv + 2 * C, stride, B, T, Tp, NH))
        return;
    dim3 grid((unsigned)(Tp / TILE), (unsigned)(B * NH));
    float scale_log2 = LOG2E / sqrtf((float)HS);
    tc_forward_kernel<HS>
        <<<grid, WARPS * 32, 0, ctx->stream>>>(out, lse, qp, kp, vp, T, Tp, C, NH, scale_log2);
    (void)LAUNCH_OK(ctx);
}

template <int HS>
void backward(struct ops_ctx *ctx, float *dqkv, const float *dout, const float *qkv,
              const float *lse, const float *Dr, int B, int T, int C, int NH)
{
    int Tp = (T + TILE - 1) / TILE * TILE;
    size_t one = (size_t)B * Tp * C;
    uint16_t *s = planes_scratch(ctx, 7, B, Tp, C);
    if (!s) return;
    struct plane qp = {s, s + one}, kp = {s + 2 * one, s + 3 * one}, vp = {s + 4 * one, NULL};
    struct plane gp = {s + 5 * one, s + 6 * one};
    size_t stride = 3 * (size_t)C;
    if (!prepare<HS>(ctx, qp, qkv, stride, B, T, Tp, NH) ||
        !prepare<HS>(ctx, kp, qkv + C, stride, B, T, Tp, NH) ||
        !prepare<HS>(ctx, vp, qkv + 2 * C, stride, B, T, Tp, NH) ||
        !prepare<HS>(ctx, gp, dout, (size_t)C, B, T, Tp, NH))
        return;
    dim3 grid((unsigned)(Tp / TILE), (unsigned)(B * NH));
    float scale = 1.0f / sqrtf((float)HS);
    tc_dkdv_kernel<HS>
        <<<grid, WARPS * 32, 0, ctx->stream>>>(dqkv, qp, kp, vp, gp, lse, Dr, T, Tp, C, NH, scale);
    if (!LAUNCH_OK(ctx)) return;
    tc_dq_kernel<HS>
        <<<grid, WARPS * 32, 0, ctx->stream>>>(dqkv, qp, kp, vp, gp, lse, Dr, T, Tp, C, NH, scale);
    (void)LAUNCH_OK(ctx);
}

} // namespace

bool cu_attention_bf16_takes(int head_size)
{
    return gpt2_scratch_attention_bf16_takes(head_size); /* (the cases below) */
}

void cu_attention_forward_bf16(struct ops_ctx *ctx, float *out, float *lse, const float *qkv, int B,
                               int T, int C, int NH)
{
    if (B <= 0 || T <= 0 || C <= 0) return;
    switch (C / NH) {
    case 16:
        forward<16>(ctx, out, lse, qkv, B, T, C, NH);
        break;
    case 32:
        forward<32>(ctx, out, lse, qkv, B, T, C, NH);
        break;
    case 64:
        forward<64>(ctx, out, lse, qkv, B, T, C, NH);
        break;
    default:
        cu_set_error(ctx, "attention on tensor cores: head size %d is not 16, 32 or 64", C / NH);
    }
}

void cu_attention_backward_bf16(struct ops_ctx *ctx, float *dqkv, const float *dout,
                                const float *qkv, const float *out, const float *lse, int B, int T,
                                int C, int NH)
{
    if (B <= 0 || T <= 0 || C <= 0) return;
    float *Dr = cu_attention_rowdot(ctx, dout, out, B, T, C, NH);
    if (!Dr) return;
    switch (C / NH) {
    case 16:
        backward<16>(ctx, dqkv, dout, qkv, lse, Dr, B, T, C, NH);
        break;
    case 32:
        backward<32>(ctx, dqkv, dout, qkv, lse, Dr, B, T, C, NH);
        break;
    case 64:
        backward<64>(ctx, dqkv, dout, qkv, lse, Dr, B, T, C, NH);
        break;
    default:
        cu_set_error(ctx, "attention on tensor cores: head size %d is not 16, 32 or 64", C / NH);
    }
}
