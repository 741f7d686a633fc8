/* matmul_fp8.cu — the fp8 matrix products of kernels/ops.h through cuBLASLt:
 * E4M3 (weights, activations) and E5M2 (gradients, tensor scaling) inputs,
 * fp32 accumulation and output. Every product is written as cuBLASLt's "TN"
 * form, the only one fp8 takes on sm_89/sm_90: row-major D (Nb, Ma) =
 * B (Nb, K) · A (Ma, K)ᵀ, both operands with the reduction dimension K
 * contiguous. So the forward takes the weight's copy as it is, dinp the
 * copy's bytes transposed (exact: the same codes, and a 128×128 block's scale
 * serves its transpose), dw both operands quantised transposed.
 *
 * Scales: tensor scaling gives cuBLASLt each operand's 1/scale as its
 * A/B_SCALE_POINTER (SCALAR_32F); block scaling (DeepSeek-V3) gives it the
 * 1/scale of each 1×128 tile (VEC128_32F) or 128×128 block (BLK128x128_32F),
 * rearranged from plait's layout into cuBLASLt's (kernels/fp8_lt.h: 1×128
 * tiles with the outer index fastest, 128×128 blocks with the K blocks
 * fastest and rows padded to 4 blocks), on sm_90 only: NVIDIA ships those
 * modes for Hopper alone. Accumulation: fp32 with cuBLASLt's periodic
 * promotion of the tensor cores' partial sums (CUBLASLT_MATMUL_DESC_FAST_ACCUM
 * off; runtime/selftest.c's limit says what error that leaves).
 *
 * Where a product cannot run in fp8 (a dimension not a multiple of 16, a
 * pointer not 16-byte aligned, block scaling off sm_90, or no cuBLASLt
 * algorithm), its operands are quantised as the CPU does, decoded to fp32 and
 * multiplied in fp32 (matmul.cu): the CPU's emulation, exactly the same
 * numbers within fp32 rounding; cu_fp8_fallback says which and why, once,
 * for the log. */
#include <stdio.h>
#include <string.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/fp8_cuda.cuh"

/* ---- state (the context's: the device's compute capability, the fallback line) ---- */

const char *cu_fp8_fallback(struct ops_ctx *ctx)
{
    return ctx->fp8_fell_back ? ctx->fp8_fallback_line : NULL;
}

/* Notes the first fallback (the reason of later ones is the same kind). */
static void note_fallback(struct ops_ctx *ctx, const char *product, const char *why, int Ma, int Nb,
                          int K)
{
    if (ctx->fp8_fell_back) return;
    ctx->fp8_fell_back = true;
    snprintf(ctx->fp8_fallback_line, sizeof ctx->fp8_fallback_line,
             "fp8 %s product %dx%dx%d runs dequantised in fp32 (the CPU's emulation, slower): %s",
             product, Nb, Ma, K, why);
}

/* ---- one TN product --------------------------------------------------------------- */

/* An operand of a TN product: (outer, K) row-major codes, its format, and
 * its dequantising factors in cuBLASLt's layout and mode. */
struct operand {
    const uint8_t *q;
    enum fp8_format fmt;
    const float *lt_scales;
    cublasLtMatmulMatrixScale_t mode;
};

static cudaDataType_t lt_type(enum fp8_format f)
{
    return f == FP8_E5M2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3;
}

static bool aligned16(const void *p)
{
    return ((uintptr_t)p & 15u) == 0;
}

/* Why a TN product of these shapes cannot run in fp8 here, or NULL. */
static const char *not_fp8(struct ops_ctx *ctx, int Ma, int Nb, int K, bool block, const void *a,
                           const void *b, const void *d)
{
    if (ctx->cc < CU_FP8_MIN_CC) return "no fp8 tensor cores below sm_89";
    if (block && ctx->cc != 90)
        return "cuBLASLt's block scaling (VEC128_32F, BLK128x128_32F) runs on sm_90 only";
    if (Ma % 16 || Nb % 16 || K % 16)
        return "cuBLASLt's fp8 needs every dimension a multiple of 16";
    if (!aligned16(a) || !aligned16(b) || !aligned16(d))
        return "cuBLASLt's fp8 needs 16-byte aligned operands";
    return NULL;
}

/* D (Nb, Ma) fp32 row-major = beta·D + B·Aᵀ (+ bias (Ma) on every row), on
 * fp8 tensor cores. false, with nothing computed and nothing recorded, when
 * cuBLASLt has no algorithm for it (with a bias: none with the epilogue);
 * other failures are recorded. */
static bool lt_fp8(struct ops_ctx *ctx, int Ma, int Nb, int K, const struct operand *A,
                   const struct operand *B, float beta, float *D, const float *bias, bool *failed)
{
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasOperation_t opa = CUBLAS_OP_T, opb = CUBLAS_OP_N;
    cublasLtEpilogue_t epi = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    cudaDataType_t bias_type = CUDA_R_32F;
    const void *sa = A->lt_scales, *sb = B->lt_scales;
    float alpha = 1.0f;
    bool ran = false;
    int32_t mode_a = A->mode, mode_b = B->mode;
    int8_t fast_accum = 0; /* the default, said: partial sums promoted to fp32 every so often */
    *failed = true;        /* until the descriptors are made */
    if (!LT_OK(ctx, cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F)) ||
        !LT_OK(ctx,
               cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa)) ||
        !LT_OK(ctx,
               cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb)) ||
        !LT_OK(ctx, cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                                   sizeof epi)) ||
        !LT_OK(ctx, cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accum,
                                                   sizeof fast_accum)) ||
        !LT_OK(ctx, cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode_a,
                                                   sizeof mode_a)) ||
        !LT_OK(ctx, cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode_b,
                                                   sizeof mode_b)) ||
        !LT_OK(ctx, cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa,
                                                   sizeof sa)) ||
        !LT_OK(ctx, cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb,
                                                   sizeof sb)))
        goto out;
    if (bias && (!LT_OK(ctx, cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                            &bias, sizeof bias)) ||
                 !LT_OK(ctx, cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                            &bias_type, sizeof bias_type))))
        goto out;
    /* column-major: A is K × Ma (ld K) taken transposed, B K × Nb (ld K), D Ma × Nb */
    if (!LT_OK(ctx, cublasLtMatrixLayoutCreate(&la, lt_type(A->fmt), K, Ma, K)) ||
        !LT_OK(ctx, cublasLtMatrixLayoutCreate(&lb, lt_type(B->fmt), K, Nb, K)) ||
        !LT_OK(ctx, cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, Ma, Nb, Ma)) ||
        !cu_lt_preference(ctx, A->q, B->q, D, D, &pref))
        goto out;
    *failed = false;
    {
        cublasLtMatmulHeuristicResult_t heur;
        int found = 0;
        cublasStatus_t s =
            cublasLtMatmulAlgoGetHeuristic(ctx->lt, op, la, lb, lc, lc, pref, 1, &heur, &found);
        if (s != CUBLAS_STATUS_SUCCESS || found == 0) goto out; /* the caller falls back */
        ran = LT_OK(ctx, cublasLtMatmul(ctx->lt, op, &alpha, A->q, la, B->q, lb, &beta, D, lc, D,
                                        lc, &heur.algo, ctx->lt_workspace, ctx->lt_workspace_bytes,
                                        ctx->stream));
        *failed = !ran;
    }
out:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (op) cublasLtMatmulDescDestroy(op);
    return ran;
}

/* The product on fp8 tensor cores, the bias fused when cuBLASLt can, else
 * added after; false when it cannot run in fp8 at all (nothing computed). */
static bool fp8_product(struct ops_ctx *ctx, int Ma, int Nb, int K, const struct operand *A,
                        const struct operand *B, float beta, float *D, const float *bias)
{
    bool failed;
    if (lt_fp8(ctx, Ma, Nb, K, A, B, beta, D, bias, &failed)) return true;
    if (failed || !bias) return false;
    if (!lt_fp8(ctx, Ma, Nb, K, A, B, beta, D, NULL, &failed)) return false;
    cu_add_bias(ctx, D, bias, Nb, Ma);
    return true;
}

/* ---- operands ------------------------------------------------------------------------ */

/* Tiles of an activation or gradient (kernels/cpu/ops_cpu.c's act_tile):
 * tensor 0 × 0; block 1 × 128 along the reduction dimension, its columns,
 * or (reduced along its rows) 128 × 1. */
static void act_tile(bool block, bool reduced_along_rows, int *tr, int *tc)
{
    *tr = !block ? 0 : reduced_along_rows ? FP8_TILE : 1;
    *tc = !block ? 0 : reduced_along_rows ? 1 : FP8_TILE;
}

/* x (rows, cols) quantised as the CPU does into slot's codes (transposed
 * when asked) and slot_s's scales (fp8_quantize's layout), returned. */
static uint8_t *quantize(struct ops_ctx *ctx, int slot, int slot_s, const float *x, int rows,
                         int cols, int tr, int tc, enum fp8_format fmt, bool transposed,
                         float **scales)
{
    size_t n = (size_t)rows * cols, ns = fp8_scale_count(rows, cols, tr, tc);
    uint8_t *q = (uint8_t *)cu_scratch(ctx, slot, n);
    *scales = (float *)cu_scratch(ctx, slot_s, ns * sizeof(float));
    if (!q || !*scales) return NULL;
    cu_fp8_quantize_to(ctx, q, *scales, x, rows, cols, tr, tc, fmt, transposed);
    return q;
}

/* Operand A (a) or B of product p: its codes q (outer, K) in fmt and, in
 * slot, cuBLASLt's factors made from plait's scales s: the one 1/scale of a
 * tensor, or with block scaling s rearranged as kernels/fp8_lt.h says. false
 * when the slot could not be had (the error is recorded). */
static bool operand(struct ops_ctx *ctx, struct operand *op, int slot, const uint8_t *q,
                    enum fp8_format fmt, const float *s, bool block, enum fp8_product p, bool a,
                    int N, int C, int OC)
{
    struct fp8_lt_scales l = block ? fp8_lt_block_scales(p, a, N, C, OC)
                                   : fp8_lt_layout(FP8_LT_VEC128, 1, 1, false); /* a tensor's one */
    float *f = (float *)cu_scratch(ctx, slot, fp8_lt_count(&l) * sizeof(float));
    if (!f) return false;
    cu_fp8_lt_scales(ctx, f, s, &l);
    op->q = q;
    op->fmt = fmt;
    op->lt_scales = f;
    op->mode = !block                    ? CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F
               : l.mode == FP8_LT_BLK128 ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
                                         : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    return true;
}

/* q (rows, cols) with its scales in tiles tr × tc decoded to fp32 in slot */
static float *decoded(struct ops_ctx *ctx, int slot, const uint8_t *q, const float *s, int rows,
                      int cols, int tr, int tc, enum fp8_format fmt)
{
    float *f = (float *)cu_scratch(ctx, slot, (size_t)rows * cols * sizeof(float));
    if (f) cu_fp8_dequantize(ctx, f, q, s, rows, cols, tr, tc, fmt);
    return f;
}

/* ---- the ops --------------------------------------------------------------------------- */

void cu_matmul_forward_fp8(struct ops_ctx *ctx, float *out, const float *inp, const uint8_t *w8,
                           const float *w_scales, const float *bias, int N, int C, int OC,
                           enum fp8_scaling scaling)
{
    bool block = scaling == FP8_SCALING_BLOCK;
    int tr, tc, we = fp8_weight_tile(scaling);
    float *xs;
    act_tile(block, false, &tr, &tc);
    const uint8_t *x8 = quantize(ctx, CU_FP8_X, CU_FP8_XS, inp, N, C, tr, tc, FP8_E4M3, false, &xs);
    if (!x8) return;
    /* out (N, OC) = x8 (N, C) · w8 (OC, C)ᵀ: Ma = OC, Nb = N, K = C */
    const char *why = not_fp8(ctx, OC, N, C, block, w8, x8, out);
    if (!why) {
        struct operand A, B;
        if (!operand(ctx, &A, CU_FP8_LTA, w8, FP8_E4M3, w_scales, block, FP8_FWD, true, N, C, OC) ||
            !operand(ctx, &B, CU_FP8_LTB, x8, FP8_E4M3, xs, block, FP8_FWD, false, N, C, OC))
            return;
        if (fp8_product(ctx, OC, N, C, &A, &B, 0.0f, out, bias)) return;
        why = "cuBLASLt has no fp8 algorithm for it";
    }
    note_fallback(ctx, "forward", why, OC, N, C);
    float *wf = decoded(ctx, CU_FP8_F32A, w8, w_scales, OC, C, we, we, FP8_E4M3);
    float *xf = decoded(ctx, CU_FP8_F32B, x8, xs, N, C, tr, tc, FP8_E4M3);
    if (wf && xf) cu_matmul_forward(ctx, out, xf, wf, NULL, bias, N, C, OC);
}

/* dinp (N, C) = dout (N, OC) · w (OC, C) = d8 · (w8ᵀ (C, OC))ᵀ: Ma = C, Nb = N, K = OC */
static void dinp_fp8(struct ops_ctx *ctx, float *dinp, const uint8_t *d8, const float *ds,
                     enum fp8_format grad, const uint8_t *w8, const float *w_scales, int N, int C,
                     int OC, bool block)
{
    int we = block ? FP8_TILE : 0, tr = block ? 1 : 0, tc = block ? FP8_TILE : 0;
    uint8_t *wt8 = (uint8_t *)cu_scratch(ctx, CU_FP8_WT, (size_t)OC * C);
    if (!wt8) return;
    const char *why = not_fp8(ctx, C, N, OC, block, wt8, d8, dinp);
    if (!why) {
        cu_fp8_transpose(ctx, wt8, w8, OC, C);
        /* block: wᵀ's scales are w's blocks transposed (fp8_lt_block_scales) */
        struct operand A, B;
        if (!operand(ctx, &A, CU_FP8_LTA, wt8, FP8_E4M3, w_scales, block, FP8_DINP, true, N, C,
                     OC) ||
            !operand(ctx, &B, CU_FP8_LTB, d8, grad, ds, block, FP8_DINP, false, N, C, OC))
            return;
        if (fp8_product(ctx, C, N, OC, &A, &B, 0.0f, dinp, NULL)) return;
        why = "cuBLASLt has no fp8 algorithm for it";
    }
    note_fallback(ctx, "input-gradient", why, C, N, OC);
    float *wf = decoded(ctx, CU_FP8_F32A, w8, w_scales, OC, C, we, we, FP8_E4M3);
    float *df = decoded(ctx, CU_FP8_F32B, d8, ds, N, OC, tr, tc, grad);
    if (wf && df) cu_matmul_backward(ctx, dinp, NULL, NULL, df, NULL, wf, NULL, N, C, OC, false);
}

/* dw (OC, C) = dw·accumulate + doutᵀ (OC, N) · inp (N, C), both quantised
 * along N (128 × 1 tiles with block scaling): Ma = C, Nb = OC, K = N, the
 * operands doutᵀ and inpᵀ (C, N) */
static void dw_fp8(struct ops_ctx *ctx, float *dw, const float *dout, const float *inp,
                   enum fp8_format grad, int N, int C, int OC, bool accumulate, bool block,
                   bool tensor_d8_made)
{
    int tr, tc;
    float beta = accumulate ? 1.0f : 0.0f, *ds, *xs;
    act_tile(block, true, &tr, &tc);
    /* both transposed for the TN product, unless it cannot run in fp8 */
    const char *why = not_fp8(ctx, C, OC, N, block, dw, dw, dw);
    bool t = why == NULL;
    const uint8_t *d8;
    if (t && tensor_d8_made) { /* dout's codes for dinp, one tile: transposed, the same codes */
        uint8_t *dt8 = (uint8_t *)cu_scratch(ctx, CU_FP8_WT, (size_t)N * OC);
        ds = (float *)cu_scratch(ctx, CU_FP8_DS, sizeof(float)); /* its scale, kept there */
        if (dt8)
            cu_fp8_transpose(ctx, dt8, (const uint8_t *)cu_scratch(ctx, CU_FP8_D, (size_t)N * OC),
                             N, OC);
        d8 = dt8;
    } else
        d8 = quantize(ctx, CU_FP8_D, CU_FP8_DS, dout, N, OC, tr, tc, grad, t, &ds);
    const uint8_t *x8 = quantize(ctx, CU_FP8_X, CU_FP8_XS, inp, N, C, tr, tc, FP8_E4M3, t, &xs);
    if (!d8 || !x8) return;
    if (t) {
        struct operand A, B;
        if (!operand(ctx, &A, CU_FP8_LTA, x8, FP8_E4M3, xs, block, FP8_DW, true, N, C, OC) ||
            !operand(ctx, &B, CU_FP8_LTB, d8, grad, ds, block, FP8_DW, false, N, C, OC))
            return;
        if (fp8_product(ctx, C, OC, N, &A, &B, beta, dw, NULL)) return;
        /* no algorithm: quantise again in the orientation the fallback reads */
        d8 = quantize(ctx, CU_FP8_D, CU_FP8_DS, dout, N, OC, tr, tc, grad, false, &ds);
        x8 = quantize(ctx, CU_FP8_X, CU_FP8_XS, inp, N, C, tr, tc, FP8_E4M3, false, &xs);
        if (!d8 || !x8) return;
        why = "cuBLASLt has no fp8 algorithm for it";
    }
    note_fallback(ctx, "weight-gradient", why, C, OC, N);
    float *df = decoded(ctx, CU_FP8_F32A, d8, ds, N, OC, tr, tc, grad);
    float *xf = decoded(ctx, CU_FP8_F32B, x8, xs, N, C, tr, tc, FP8_E4M3);
    if (df && xf) cu_matmul_backward(ctx, NULL, dw, NULL, df, xf, NULL, NULL, N, C, OC, accumulate);
}

void cu_matmul_backward_fp8(struct ops_ctx *ctx, float *dinp, float *dw, float *dbias,
                            const float *dout, const float *inp, const uint8_t *w8,
                            const float *w_scales, int N, int C, int OC, bool accumulate,
                            enum fp8_scaling scaling)
{
    bool block = scaling == FP8_SCALING_BLOCK;
    enum fp8_format grad = block ? FP8_E4M3 : FP8_E5M2;
    bool tensor_d8_made = false; /* dout quantised whole in CU_FP8_D, its scale in CU_FP8_DS */
    if (dinp) {
        int tr, tc;
        float *ds;
        act_tile(block, false, &tr, &tc);
        const uint8_t *d8 =
            quantize(ctx, CU_FP8_D, CU_FP8_DS, dout, N, OC, tr, tc, grad, false, &ds);
        if (!d8) return;
        dinp_fp8(ctx, dinp, d8, ds, grad, w8, w_scales, N, C, OC, block);
        tensor_d8_made = !block;
    }
    if (!dw) return;
    dw_fp8(ctx, dw, dout, inp, grad, N, C, OC, accumulate, block, tensor_d8_made);
    if (dbias) cu_column_sum(ctx, dbias, dout, N, OC, accumulate);
}
