/* matmul.cu — the matrix products through cuBLASLt: fp32 (CUBLAS_COMPUTE_32F,
 * no TF32: the CPU's results within fp32 rounding) and bf16 in / fp32 out,
 * the bias fused as an epilogue where cuBLASLt offers it (else a kernel), the
 * bias gradient a deterministic column sum (BGRAD epilogues overwrite; ops.h
 * accumulates). ops.h has no matmul+GELU op, so no GELU epilogue yet. */
#include <stdio.h>

#include "kernels/cuda/cuda_common.cuh"

/* Row-major C (M×N) = op(A)·op(B) + beta·C, as kernels/cpu/gemm.h: op(A) is A
 * (M×K, lda) or with ta Aᵀ stored K×M; op(B) is B (K×N, ldb) or with tb Bᵀ
 * stored N×K. cuBLASLt is column-major, so it computes Cᵀ = op(B)ᵀ·op(A)ᵀ.
 * bias (N) or NULL: added to every row by the epilogue. Returns false if no
 * algorithm takes the bias epilogue (nothing was computed; the error is not
 * recorded), after recording any other failure. */
static bool lt_gemm(bool ta, bool tb, int M, int N, int K, const void *A, int lda, const void *B,
                    int ldb, float beta, float *C, int ldc, cudaDataType_t in_type,
                    const float *bias, bool *no_epilogue)
{
    *no_epilogue = false;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N; /* cuBLAS's A is our B */
    cublasOperation_t opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtEpilogue_t epi = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    cudaDataType_t bias_type = CUDA_R_32F;
    float alpha = 1.0f;
    bool ok = false;
    /* cuBLAS's A is our B, its B our A, C and D the output */
    uint32_t align[4] = {cu_alignment_bytes(B), cu_alignment_bytes(A), cu_alignment_bytes(C),
                         cu_alignment_bytes(C)};
    const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    /* column-major shapes: cuBLAS A = our B: (tb ? K×N : N×K) stored; B = our A */
    if (!LT_OK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F)) ||
        !LT_OK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa)) ||
        !LT_OK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb)) ||
        !LT_OK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi)))
        goto out;
    if (bias && (!LT_OK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                       sizeof bias)) ||
                 !LT_OK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                       &bias_type, sizeof bias_type))))
        goto out;
    if (!LT_OK(cublasLtMatrixLayoutCreate(&la, in_type, tb ? K : N, tb ? N : K, ldb)) ||
        !LT_OK(cublasLtMatrixLayoutCreate(&lb, in_type, ta ? M : K, ta ? K : M, lda)) ||
        !LT_OK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, N, M, ldc)) ||
        !LT_OK(cublasLtMatmulPreferenceCreate(&pref)) ||
        !LT_OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &cu_lt_workspace_bytes,
                                                    sizeof cu_lt_workspace_bytes)))
        goto out;
    for (int i = 0; i < 4; i++)
        if (!LT_OK(cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &align[i],
                                                        sizeof align[i])))
            goto out;
    {
        cublasLtMatmulHeuristicResult_t heur;
        int found = 0;
        cublasStatus_t s =
            cublasLtMatmulAlgoGetHeuristic(cu_lt, op, la, lb, lc, lc, pref, 1, &heur, &found);
        if (s != CUBLAS_STATUS_SUCCESS || found == 0) {
            if (bias) {
                *no_epilogue = true;
                goto out;
            }
            cu_set_error("%s:%d: cuBLASLt has no algorithm for %c%c %dx%dx%d (%s): %s", __FILE__,
                         __LINE__, ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K,
                         in_type == CUDA_R_16BF ? "bf16" : "fp32", cublasLtGetStatusString(s));
            goto out;
        }
        /* A is cuBLAS's A (our B), B is cuBLAS's B (our A); C = D in place */
        ok = LT_OK(cublasLtMatmul(cu_lt, op, &alpha, B, la, A, lb, &beta, C, lc, C, lc, &heur.algo,
                                  cu_lt_workspace, cu_lt_workspace_bytes, cu_stream));
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
static void gemm(bool ta, bool tb, int M, int N, int K, const void *A, int lda, const void *B,
                 int ldb, float beta, float *C, int ldc, cudaDataType_t in_type, const float *bias)
{
    if (M <= 0 || N <= 0) return;
    if (K <= 0) { /* an empty sum: C = beta·C (+ bias) */
        if (beta == 0.0f)
            CUDA_TRY(cudaMemset2DAsync(C, (size_t)ldc * sizeof(float), 0, (size_t)N * sizeof(float),
                                       M, cu_stream));
        if (bias) cu_add_bias(C, bias, M, N); /* ldc == N for every caller with a bias */
        return;
    }
    bool no_epilogue = true;
    /* the epilogue reads the bias in vectors: only from an aligned one */
    if (!bias || cu_alignment_bytes(bias) >= 16) {
        if (lt_gemm(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, in_type, bias, &no_epilogue))
            return;
        if (!no_epilogue || !bias) return;
    }
    if (lt_gemm(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, in_type, NULL, &no_epilogue))
        cu_add_bias(C, bias, M, N);
}

static const uint16_t *bf16_copy(int slot, const float *src, size_t n)
{
    uint16_t *dst = (uint16_t *)cu_scratch(slot, n * sizeof(uint16_t));
    if (dst) cu_to_bf16(dst, src, n);
    return dst;
}

void cu_matmul_forward(float *out, const float *inp, const float *w, const uint16_t *w16,
                       const float *bias, int N, int C, int OC)
{
    if (!w16) {
        gemm(false, true, N, OC, C, inp, C, w, C, 0.0f, out, OC, CUDA_R_32F, bias);
        return;
    }
    const uint16_t *x16 = bf16_copy(CU_SCRATCH_BF16_A, inp, (size_t)N * C);
    if (!x16) return;
    gemm(false, true, N, OC, C, x16, C, w16, C, 0.0f, out, OC, CUDA_R_16BF, bias);
}

void cu_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                        const float *w, const uint16_t *w16, int N, int C, int OC, bool accumulate)
{
    float beta = accumulate ? 1.0f : 0.0f;
    if (!w16) {
        if (dinp) gemm(false, false, N, C, OC, dout, OC, w, C, 0.0f, dinp, C, CUDA_R_32F, NULL);
        if (!dw) return;
        gemm(true, false, OC, C, N, dout, OC, inp, C, beta, dw, C, CUDA_R_32F, NULL);
        if (dbias) cu_column_sum(dbias, dout, N, OC, accumulate);
        return;
    }
    const uint16_t *d16 = bf16_copy(CU_SCRATCH_BF16_A, dout, (size_t)N * OC);
    const uint16_t *x16 = dw ? bf16_copy(CU_SCRATCH_BF16_B, inp, (size_t)N * C) : NULL;
    if (!d16 || (dw && !x16)) return;
    if (dinp) gemm(false, false, N, C, OC, d16, OC, w16, C, 0.0f, dinp, C, CUDA_R_16BF, NULL);
    if (!dw) return;
    gemm(true, false, OC, C, N, d16, OC, x16, C, beta, dw, C, CUDA_R_16BF, NULL);
    if (dbias) cu_column_sum(dbias, dout, N, OC, accumulate);
}
