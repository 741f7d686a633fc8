/* matmul.cu — the matrix products through cuBLASLt: fp32 (CUBLAS_COMPUTE_32F,
 * no TF32: the CPU's results within fp32 rounding) and bf16 in / fp32 out (an
 * fp32 input rounded into scratch first, or a bf16 activation or dout as it is:
 * the ...16 ops), the bias fused as an epilogue where cuBLASLt offers it (else a
 * kernel), and the MLP's first product with its GELU in the same epilogue
 * (GELU_AUX_BIAS: the output, fp32 or bf16, and the fp32 pre-activation the
 * backward needs, in one pass); the bias gradient a deterministic column sum
 * (BGRAD epilogues overwrite; ops.h accumulates). */
#include <stdio.h>

#include "kernels/cuda/cuda_common.cuh"

bool cu_lt_preference(struct ops_ctx *ctx, const void *a, const void *b, const void *c,
                      const void *d, cublasLtMatmulPreference_t *pref)
{
    uint32_t align[4] = {cu_alignment_bytes(a), cu_alignment_bytes(b), cu_alignment_bytes(c),
                         cu_alignment_bytes(d)};
    const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    *pref = NULL;
    if (!LT_OK(ctx, cublasLtMatmulPreferenceCreate(pref)) ||
        !LT_OK(ctx, cublasLtMatmulPreferenceSetAttribute(
                        *pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ctx->lt_workspace_bytes,
                        sizeof ctx->lt_workspace_bytes)))
        return false;
    for (int i = 0; i < 4; i++)
        if (!LT_OK(ctx, cublasLtMatmulPreferenceSetAttribute(*pref, align_attr[i], &align[i],
                                                             sizeof align[i])))
            return false;
    return true;
}

/* Row-major C (M×N) = op(A)·op(B) + beta·C, as kernels/cpu/gemm.h: op(A) is A
 * (M×K, lda) or with ta Aᵀ stored K×M; op(B) is B (K×N, ldb) or with tb Bᵀ
 * stored N×K. cuBLASLt is column-major, so it computes Cᵀ = op(B)ᵀ·op(A)ᵀ.
 * A and B are in_type; C is out_type, fp32 or bf16 (then beta 0: cuBLASLt's C
 * and D are one buffer of one type). bias (N, fp32) or NULL: added to every
 * row by the epilogue. gelu_pre (M×N, ldc, fp32) or NULL: the epilogue then
 * writes C = gelu(product + bias) and gelu_pre = product + bias
 * (GELU_AUX_BIAS; cuBLASLt's GELU is the tanh approximation, as kernels/cpu's).
 * Returns false if no algorithm takes the epilogue, or cuBLASLt refuses it as
 * it runs (NOT_SUPPORTED or INVALID_VALUE: cublasLt.h says an unsupported aux
 * type is refused there): nothing was computed and the error is not recorded;
 * false after recording any other failure. */
static bool lt_gemm(struct ops_ctx *ctx, bool ta, bool tb, int M, int N, int K, const void *A,
                    int lda, const void *B, int ldb, float beta, void *C, int ldc,
                    cudaDataType_t in_type, cudaDataType_t out_type, const float *bias,
                    float *gelu_pre, bool *no_epilogue)
{
    *no_epilogue = false;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N; /* cuBLAS's A is our B */
    cublasOperation_t opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtEpilogue_t epi =
        gelu_pre ? (bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX)
        : bias   ? CUBLASLT_EPILOGUE_BIAS
                 : CUBLASLT_EPILOGUE_DEFAULT;
    int64_t aux_ld = ldc;
    int32_t aux_type = CUDA_R_32F;
    cudaDataType_t bias_type = CUDA_R_32F;
    float alpha = 1.0f;
    bool ok = false;
    /* column-major shapes: cuBLAS A = our B: (tb ? K×N : N×K) stored; B = our A */
    if (!LT_OK(ctx, cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F)) ||
        !LT_OK(ctx,
               cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa)) ||
        !LT_OK(ctx,
               cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb)) ||
        !LT_OK(ctx,
               cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi)))
        goto out;
    if (bias && (!LT_OK(ctx, cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                            &bias, sizeof bias)) ||
                 !LT_OK(ctx, cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                            &bias_type, sizeof bias_type))))
        goto out;
    if (gelu_pre &&
        (!LT_OK(ctx, cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                    &gelu_pre, sizeof gelu_pre)) ||
         !LT_OK(ctx, cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                    &aux_ld, sizeof aux_ld)) ||
         !LT_OK(ctx, cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE,
                                                    &aux_type, sizeof aux_type))))
        goto out;
    if (!LT_OK(ctx, cublasLtMatrixLayoutCreate(&la, in_type, tb ? K : N, tb ? N : K, ldb)) ||
        !LT_OK(ctx, cublasLtMatrixLayoutCreate(&lb, in_type, ta ? M : K, ta ? K : M, lda)) ||
        !LT_OK(ctx, cublasLtMatrixLayoutCreate(&lc, out_type, N, M, ldc)) ||
        !cu_lt_preference(ctx, B, A, C, C, &pref)) /* cuBLAS's A is our B, its B our A */
        goto out;
    {
        cublasLtMatmulHeuristicResult_t heur;
        int found = 0;
        cublasStatus_t s =
            cublasLtMatmulAlgoGetHeuristic(ctx->lt, op, la, lb, lc, lc, pref, 1, &heur, &found);
        if (s != CUBLAS_STATUS_SUCCESS || found == 0) {
            if (bias || gelu_pre) {
                *no_epilogue = true;
                goto out;
            }
            cu_set_error(ctx,
                         "%s:%d: cuBLASLt has no algorithm for %c%c %dx%dx%d (%s in, %s out): %s",
                         __FILE__, __LINE__, ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K,
                         in_type == CUDA_R_16BF ? "bf16" : "fp32",
                         out_type == CUDA_R_16BF ? "bf16" : "fp32", cublasLtGetStatusString(s));
            goto out;
        }
        /* A is cuBLAS's A (our B), B is cuBLAS's B (our A); C = D in place */
        s = cublasLtMatmul(ctx->lt, op, &alpha, B, la, A, lb, &beta, C, lc, C, lc, &heur.algo,
                           ctx->lt_workspace, ctx->lt_workspace_bytes, ctx->stream);
        if ((bias || gelu_pre) &&
            (s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE)) {
            *no_epilogue = true;
            goto out;
        }
        ok = !cu_fail_lt(ctx, s, "cublasLtMatmul", __FILE__, __LINE__);
    }
out:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (op) cublasLtMatmulDescDestroy(op);
    return ok;
}

/* The product, with the bias fused when cuBLASLt can, else added after. */
static void gemm(struct ops_ctx *ctx, bool ta, bool tb, int M, int N, int K, const void *A, int lda,
                 const void *B, int ldb, float beta, float *C, int ldc, cudaDataType_t in_type,
                 const float *bias)
{
    if (M <= 0 || N <= 0) return;
    if (K <= 0) { /* an empty sum: C = beta·C (+ bias) */
        if (beta == 0.0f)
            CUDA_TRY(ctx, cudaMemset2DAsync(C, (size_t)ldc * sizeof(float), 0,
                                            (size_t)N * sizeof(float), M, ctx->stream));
        if (bias) cu_add_bias(ctx, C, bias, M, N); /* ldc == N for every caller with a bias */
        return;
    }
    bool no_epilogue = true;
    /* the epilogue reads the bias in vectors: only from an aligned one */
    if (!bias || cu_alignment_bytes(bias) >= 16) {
        if (lt_gemm(ctx, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, in_type, CUDA_R_32F, bias,
                    NULL, &no_epilogue))
            return;
        if (!no_epilogue || !bias) return;
    }
    if (lt_gemm(ctx, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, in_type, CUDA_R_32F, NULL, NULL,
                &no_epilogue))
        cu_add_bias(ctx, C, bias, M, N);
}

static const uint16_t *bf16_copy(struct ops_ctx *ctx, int slot, const float *src, size_t n)
{
    uint16_t *dst = (uint16_t *)cu_scratch(ctx, slot, n * sizeof(uint16_t));
    if (dst) cu_to_bf16(ctx, dst, src, n);
    return dst;
}

/* out (N,OC) = inp16 · w16ᵀ + bias: the bf16 activation as it is (ops.h matmul_forward16) */
void cu_matmul_forward16(struct ops_ctx *ctx, float *out, const uint16_t *inp, const uint16_t *w16,
                         const float *bias, int N, int C, int OC)
{
    gemm(ctx, false, true, N, OC, C, inp, C, w16, C, 0.0f, out, OC, CUDA_R_16BF, bias);
}

void cu_matmul_forward(struct ops_ctx *ctx, float *out, const float *inp, const float *w,
                       const uint16_t *w16, const float *bias, int N, int C, int OC)
{
    if (!w16) {
        gemm(ctx, false, true, N, OC, C, inp, C, w, C, 0.0f, out, OC, CUDA_R_32F, bias);
        return;
    }
    const uint16_t *x16 = bf16_copy(ctx, CU_SCRATCH_BF16_A, inp, (size_t)N * C);
    if (x16) cu_matmul_forward16(ctx, out, x16, w16, bias, N, C, OC);
}

/* out = gelu(pre), pre = x·wᵀ + bias, x and w of in_type, out of out_type (fp32, or bf16
 * rounded once), pre fp32: one cuBLASLt call with the GELU_AUX_BIAS epilogue where it
 * applies (the aux leading dimension a multiple of 8, every pointer 16-byte aligned, an
 * algorithm found that takes these types), else the product into pre and the GELU kernel
 * (gelu_forward's or gelu_forward16's). */
static void forward_gelu(struct ops_ctx *ctx, void *out, cudaDataType_t out_type, float *pre,
                         const void *x, const void *w, cudaDataType_t in_type, const float *bias,
                         int N, int C, int OC)
{
    bool no_epilogue = true;
    if (N > 0 && OC > 0 && C > 0 && OC % 8 == 0 && cu_alignment_bytes(out) >= 16 &&
        cu_alignment_bytes(pre) >= 16 && (!bias || cu_alignment_bytes(bias) >= 16)) {
        if (lt_gemm(ctx, false, true, N, OC, C, x, C, w, C, 0.0f, out, OC, in_type, out_type, bias,
                    pre, &no_epilogue))
            return;
        if (!no_epilogue) return; /* a failure, recorded */
    }
    gemm(ctx, false, true, N, OC, C, x, C, w, C, 0.0f, pre, OC, in_type, bias);
    if (out_type == CUDA_R_16BF)
        cu_gelu_forward16(ctx, (uint16_t *)out, pre, (size_t)N * OC);
    else
        cu_gelu_forward(ctx, (float *)out, pre, (size_t)N * OC);
}

/* ops.h matmul_forward_gelu: fp32 out; with w16 the input rounded into scratch first */
void cu_matmul_forward_gelu(struct ops_ctx *ctx, float *out, float *pre, const float *inp,
                            const float *w, const uint16_t *w16, const float *bias, int N, int C,
                            int OC)
{
    if (!w16) {
        forward_gelu(ctx, out, CUDA_R_32F, pre, inp, w, CUDA_R_32F, bias, N, C, OC);
        return;
    }
    const uint16_t *x16 = bf16_copy(ctx, CU_SCRATCH_BF16_A, inp, (size_t)N * C);
    if (x16) forward_gelu(ctx, out, CUDA_R_32F, pre, x16, w16, CUDA_R_16BF, bias, N, C, OC);
}

/* ops.h matmul_forward_gelu16: the bf16 activation as it is, out in bf16, pre fp32 */
void cu_matmul_forward_gelu16(struct ops_ctx *ctx, uint16_t *out, float *pre, const uint16_t *inp,
                              const uint16_t *w16, const float *bias, int N, int C, int OC)
{
    forward_gelu(ctx, out, CUDA_R_16BF, pre, inp, w16, CUDA_R_16BF, bias, N, C, OC);
}

/* The three products of a backward, d (N,OC) x (N,C) and w (OC,C) of type (fp32; bf16:
 * d dout rounded, or a bf16 dout itself), x read only where dw; dbias dout's fp32 column
 * sum (NULL with dout NULL) */
static void backward(struct ops_ctx *ctx, float *dinp, float *dw, float *dbias, const float *dout,
                     const void *d, const void *x, const void *w, cudaDataType_t type, int N, int C,
                     int OC, bool accumulate)
{
    if (dinp) gemm(ctx, false, false, N, C, OC, d, OC, w, C, 0.0f, dinp, C, type, NULL);
    if (!dw) return;
    gemm(ctx, true, false, OC, C, N, d, OC, x, C, accumulate ? 1.0f : 0.0f, dw, C, type, NULL);
    if (dbias) cu_column_sum(ctx, dbias, dout, N, OC, accumulate);
}

void cu_matmul_backward(struct ops_ctx *ctx, float *dinp, float *dw, float *dbias,
                        const float *dout, const float *inp, const float *w, const uint16_t *w16,
                        int N, int C, int OC, bool accumulate)
{
    if (!w16) {
        backward(ctx, dinp, dw, dbias, dout, dout, inp, w, CUDA_R_32F, N, C, OC, accumulate);
        return;
    }
    const uint16_t *d16 = bf16_copy(ctx, CU_SCRATCH_BF16_A, dout, (size_t)N * OC);
    const uint16_t *x16 = dw ? bf16_copy(ctx, CU_SCRATCH_BF16_B, inp, (size_t)N * C) : NULL;
    if (!d16 || (dw && !x16)) return;
    backward(ctx, dinp, dw, dbias, dout, d16, x16, w16, CUDA_R_16BF, N, C, OC, accumulate);
}

/* ops.h matmul_backward16: dout rounded into scratch as matmul_backward's, the bf16
 * activation as it is (no copy of it) */
void cu_matmul_backward16(struct ops_ctx *ctx, float *dinp, float *dw, float *dbias,
                          const float *dout, const uint16_t *inp, const uint16_t *w16, int N, int C,
                          int OC, bool accumulate)
{
    const uint16_t *d16 = bf16_copy(ctx, CU_SCRATCH_BF16_A, dout, (size_t)N * OC);
    if (d16) backward(ctx, dinp, dw, dbias, dout, d16, inp, w16, CUDA_R_16BF, N, C, OC, accumulate);
}

/* ops.h matmul_backward_dout16: dout in bf16 already (the classifier's dlogits16), so no
 * copy of it and no scratch; no bias (its column sum would want an fp32 dout) */
void cu_matmul_backward_dout16(struct ops_ctx *ctx, float *dinp, float *dw, const uint16_t *dout,
                               const uint16_t *inp, const uint16_t *w16, int N, int C, int OC,
                               bool accumulate)
{
    backward(ctx, dinp, dw, NULL, NULL, dout, inp, w16, CUDA_R_16BF, N, C, OC, accumulate);
}
