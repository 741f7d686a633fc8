/* gemm.h — matrix products for the CPU backend. Row-major throughout:
 *     C (M×N) = alpha · op(A) · op(B) + beta · C
 * where op(A) is A (M×K, leading dimension lda) or, with ta, Aᵀ with A stored
 * K×M; likewise op(B) is B (K×N) or, with tb, Bᵀ with B stored N×K.
 *
 * fp32 and bf16 go through oneDNN (AVX-512 and AMX/BF16 kernels chosen at run
 * time; bf16 emulated in fp32 on CPUs without bf16 instructions, see
 * gemm_bf16_emulated);
 * fp64 (the finite-difference test path) through CBLAS. All are safe to
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

/* Whether gemm_bf16 is emulated here; *how (if how is not NULL) gets a static
 * line for logs, "bf16 matrix products native (oneDNN, ISA avx512_core_bf16)"
 * or "bf16 matrix products emulated in fp32 (oneDNN 2.6 has no bf16 matmul for
 * ISA avx2): same results as native bf16 within fp32 rounding, at about fp32
 * speed".
 *   native:   oneDNN's bf16 matmul, on CPUs with bf16 instructions
 *             (AVX512-BF16, AMX).
 *   emulated: the operands are widened to fp32, exactly, and gemm_f32
 *             multiplies them: the result differs from native only in
 *             summation order (within fp32 rounding); the rate is about
 *             gemm_f32's. Where oneDNN cannot make a bf16 matmul (no AVX-512,
 *             or ONEDNN_MAX_CPU_ISA below it); where the CPU has AVX-512 but no
 *             bf16 instructions (oneDNN's bf16 is then slower than this), unless
 *             PLAIT_BF16_EMULATE=0; everywhere with PLAIT_BF16_EMULATE=1.
 *             The widened panels take at most 64 MiB per calling thread.
 * Decided once per process, at the first call of gemm_bf16 or of this. */
bool gemm_bf16_emulated(const char **how);

/* For tests and benchmarks: emulate from now on even where native works (true),
 * or go back to what was decided (false). panel_floats, if not 0, lowers the
 * emulation's bound on its widened panels from 64 MiB to that many floats, so
 * that small products are split as large ones would be. Takes effect at the
 * next call; not meant to be called while products run on other threads. */
void gemm_bf16_force_emulation(bool on, size_t panel_floats);

/* fp32 -> bf16 with round-to-nearest-even (NaN stays NaN); bf16 -> fp32 exact. */
void bf16_from_f32(uint16_t *dst, const float *src, size_t n);
void bf16_to_f32(float *dst, const uint16_t *src, size_t n);

/* The name of the library behind gemm_f32, for run.json and bench output. */
const char *gemm_backend_name(void);

#endif
