/* gemm.h — matrix products for the CPU backend. Row-major throughout:
 *     C (M×N) = alpha · op(A) · op(B) + beta · C
 * where op(A) is A (M×K, leading dimension lda) or, with ta, Aᵀ with A stored
 * K×M; likewise op(B) is B (K×N) or, with tb, Bᵀ with B stored N×K.
 *
 * fp32 and bf16 go through oneDNN (AVX-512 and AMX/BF16 kernels chosen at run
 * time); fp64 (the finite-difference test path) through CBLAS. All are safe to
 * call from several threads at once; inside an OpenMP parallel region a call
 * runs on the calling thread only. Results are deterministic for a given
 * shape and thread count. */
#ifndef PLAIT_KERNELS_CPU_GEMM_H
#define PLAIT_KERNELS_CPU_GEMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Returns 0, or -1 after writing the library's message into errbuf. Failure
 * means the library could not run (out of memory, bad dimensions): a bug or
 * resource problem, never a numerical condition. */
int gemm_f32(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
             const float *B, int ldb, float beta, float *C, int ldc, char *errbuf,
             size_t errbuf_bytes);

int gemm_f64(bool ta, bool tb, int M, int N, int K, double alpha, const double *A, int lda,
             const double *B, int ldb, double beta, double *C, int ldc, char *errbuf,
             size_t errbuf_bytes);

/* bf16 inputs (uint16 bit patterns), fp32 accumulation and output. */
int gemm_bf16(bool ta, bool tb, int M, int N, int K, float alpha, const uint16_t *A, int lda,
              const uint16_t *B, int ldb, float beta, float *C, int ldc, char *errbuf,
              size_t errbuf_bytes);

/* fp32 -> bf16 with round-to-nearest-even (NaN stays NaN); bf16 -> fp32 exact. */
void bf16_from_f32(uint16_t *dst, const float *src, size_t n);
void bf16_to_f32(float *dst, const uint16_t *src, size_t n);

/* The name of the library behind gemm_f32, for run.json and bench output. */
const char *gemm_backend_name(void);

#endif
