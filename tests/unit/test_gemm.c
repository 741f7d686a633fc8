/* test_gemm.c — kernels/cpu/gemm.c against naive double-precision loops: every
 * transpose pair, padded leading dimensions, odd sizes, alpha/beta, calls from
 * inside OpenMP parallel regions and from plain threads, bitwise repeatability,
 * bf16 emulated in fp32 (forced here; against native where there is one), and
 * the bf16 rounding rules. Speed is gemm-bench's business, not this file's. */
#include "kernels/cpu/gemm.h"
#include "kernels/ops.h"
#include "tests/unit/cpu_ctx.h"
#include "tests/unit/check.h"

#include <dirent.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ---- */

/* xorshift64, one stream per thread: some tests run in parallel */
static _Thread_local uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rng_u32(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 32);
}

/* uniform in [-1, 1) */
static float rng_float(void)
{
    return (float)(rng_u32() >> 8) * (2.0f / 16777216.0f) - 1.0f;
}

static float f32_from_bits(uint32_t x)
{
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

static uint32_t bits_of(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    return x;
}

static double bf16_value(uint16_t h)
{
    return (double)f32_from_bits((uint32_t)h << 16);
}

/* A matrix of `rows` rows stored with leading dimension ld >= cols; the padding
 * holds a sentinel so that writes past `cols` show. */
#define PAD_SENTINEL 1234.5f

static float *matrix_f32(int rows, int cols, int ld)
{
    float *m = malloc(sizeof(float) * (size_t)(rows ? rows : 1) * ld);
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < ld; j++) m[(size_t)i * ld + j] = j < cols ? rng_float() : PAD_SENTINEL;
    return m;
}

/* Element (i, j) of op(X), where op(X) is X or, with t, Xᵀ of X stored transposed. */
#define AT(X, t, ld, i, j) ((t) ? (X)[(size_t)(j) * (ld) + (i)] : (X)[(size_t)(i) * (ld) + (j)])

/* ref (M×N, dense) = alpha·op(A)·op(B) + beta·C0 in double; absbound = the same
 * with absolute values, which scales every error bound below. */
struct ref {
    double *c, *absbound;
};

static struct ref ref_f32(bool ta, bool tb, int M, int N, int K, double alpha, const float *A,
                          int lda, const float *B, int ldb, double beta, const float *C0, int ldc)
{
    struct ref r = {malloc(sizeof(double) * (size_t)M * N + 8),
                    malloc(sizeof(double) * (size_t)M * N + 8)};
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0, abs_s = 0;
            for (int k = 0; k < K; k++) {
                double p = (double)AT(A, ta, lda, i, k) * AT(B, tb, ldb, k, j);
                s += p;
                abs_s += fabs(p);
            }
            double c0 = beta != 0 ? (double)C0[(size_t)i * ldc + j] : 0;
            r.c[(size_t)i * N + j] = alpha * s + beta * c0;
            r.absbound[(size_t)i * N + j] = fabs(alpha) * abs_s + fabs(beta * c0);
        }
    return r;
}

static void ref_free(struct ref r)
{
    free(r.c);
    free(r.absbound);
}

/* Worst |got - ref| / bound over C, where bound = rel·absbound (+ a tiny floor);
 * <= 1 passes. Also counts padding entries of C that changed. */
static double worst_error(const float *C, int M, int N, int ldc, struct ref r, double rel,
                          int *pad_changed)
{
    double worst = 0;
    *pad_changed = 0;
    for (int i = 0; i < M; i++) {
        for (int j = 0; j < N; j++) {
            double got = C[(size_t)i * ldc + j], want = r.c[(size_t)i * N + j];
            double bound = rel * r.absbound[(size_t)i * N + j] + 1e-30;
            double e = fabs(got - want) / bound;
            if (!(e <= worst)) worst = e; /* also catches NaN */
        }
        for (int j = N; j < ldc; j++) *pad_changed += C[(size_t)i * ldc + j] != PAD_SENTINEL;
    }
    return worst;
}

/* fp32 accumulation of K products: the classic bound γ_K ≈ K·u with u = 2^-24,
 * doubled for the final alpha/beta operations and blocked-sum reassociation. */
static double f32_rel_bound(int K)
{
    return 2.0 * (K + 4) * ldexp(1.0, -24);
}

/* Runs one product against the reference: gemm_f32, or with bf16 gemm_bf16 on
 * the bf16 roundings of the random operands (the reference multiplies the
 * rounded values). C0 random (beta != 0) or NaN (beta == 0: BLAS never reads C
 * then). Returns 0 when it passes, else 1 with a description in msg. With out,
 * C (M×N, ldc N + pad) and the reference are handed to the caller to free.
 * Thread-safe (CHECK is not). */
static int run_case(bool bf16, bool ta, bool tb, int M, int N, int K, float alpha, float beta,
                    int pad, float **out, struct ref *ref_out, char *msg, size_t msg_bytes)
{
    int a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
    int lda = a_cols + pad, ldb = b_cols + 2 * pad, ldc = N + pad;
    float *A = matrix_f32(a_rows, a_cols, lda), *B = matrix_f32(b_rows, b_cols, ldb);
    size_t a_n = (size_t)(a_rows ? a_rows : 1) * lda, b_n = (size_t)(b_rows ? b_rows : 1) * ldb;
    uint16_t *A16 = malloc(sizeof(uint16_t) * a_n), *B16 = malloc(sizeof(uint16_t) * b_n);
    bf16_from_f32(A16, A, a_n);
    bf16_from_f32(B16, B, b_n);
    if (bf16) { /* the values gemm_bf16 multiplies */
        bf16_to_f32(A, A16, a_n);
        bf16_to_f32(B, B16, b_n);
    }
    float *C = matrix_f32(M, N, ldc);
    if (beta == 0)
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) C[(size_t)i * ldc + j] = NAN;
    struct ref r = ref_f32(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    char err[256] = "";
    int rc =
        bf16 ? gemm_bf16(ta, tb, M, N, K, alpha, A16, lda, B16, ldb, beta, C, ldc, err, sizeof err)
             : gemm_f32(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, err, sizeof err);
    int pad_changed = 0;
    double worst = rc ? INFINITY : worst_error(C, M, N, ldc, r, f32_rel_bound(K), &pad_changed);
    int bad = rc != 0 || worst > 1 || pad_changed;
    if (bad)
        snprintf(msg, msg_bytes,
                 "%s %c%c M=%d N=%d K=%d alpha=%g beta=%g pad=%d: rc %d '%s', error %.3g "
                 "of bound, %d padding entries changed",
                 bf16 ? "gemm_bf16" : "gemm_f32", ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha,
                 beta, pad, rc, err, worst, pad_changed);
    if (out) {
        *out = C;
        *ref_out = r;
    } else {
        free(C);
        ref_free(r);
    }
    free(A), free(B), free(A16), free(B16);
    return bad;
}

static int check_f32_case(bool ta, bool tb, int M, int N, int K, float alpha, float beta, int pad)
{
    char msg[512] = "";
    int bad = run_case(false, ta, tb, M, N, K, alpha, beta, pad, NULL, NULL, msg, sizeof msg);
    CHECK(!bad, "%s", msg);
    return bad;
}

static const int odd_sizes[] = {1, 3, 17, 65};
#define N_ODD (int)(sizeof odd_sizes / sizeof odd_sizes[0])

/* ---- fp32 ---- */

static void test_f32_matches_naive_for_all_transposes_and_odd_sizes(void)
{
    int failures = 0;
    for (int t = 0; t < 4; t++)
        for (int mi = 0; mi < N_ODD; mi++)
            for (int ni = 0; ni < N_ODD; ni++)
                for (int ki = 0; ki < N_ODD && failures < 5; ki++) {
                    int M = odd_sizes[mi], N = odd_sizes[ni], K = odd_sizes[ki];
                    failures += check_f32_case(t & 1, t & 2, M, N, K, 1.0f, 0.0f, 0);
                    failures += check_f32_case(t & 1, t & 2, M, N, K, -0.75f, 1.0f, 5);
                }
}

/* Large NT products take the matmul-primitive route (threshold 2^24
 * multiply-adds); the others take dnnl_sgemm at the same size. */
static void test_f32_large_products_match_naive(void)
{
    for (int t = 0; t < 4; t++) {
        check_f32_case(t & 1, t & 2, 256, 320, 256, 1.0f, 0.0f, 0);
        check_f32_case(t & 1, t & 2, 257, 301, 255, 0.5f, 1.0f, 7);
        check_f32_case(t & 1, t & 2, 256, 320, 256, -2.0f, 0.25f, 3);
    }
}

static void test_f32_beta_one_accumulates_into_c(void)
{
    for (int t = 0; t < 4; t++) {
        bool ta = t & 1, tb = t & 2;
        int sizes[][3] = {{17, 65, 3}, {256, 320, 256}};
        for (int s = 0; s < 2; s++) {
            int M = sizes[s][0], N = sizes[s][1], K = sizes[s][2];
            int lda = ta ? M : K, ldb = tb ? K : N;
            float *A = matrix_f32(ta ? K : M, lda, lda), *B = matrix_f32(tb ? N : K, ldb, ldb);
            float *C = malloc(sizeof(float) * (size_t)M * N),
                  *C0 = malloc(sizeof(float) * (size_t)M * N);
            for (size_t i = 0; i < (size_t)M * N; i++) C[i] = C0[i] = (float)(i % 7) - 3.0f;
            char err[256] = "";
            /* C = C0 + AB, then C = C0 + 2·AB: the reference with alpha 2 on C0 */
            int rc = gemm_f32(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 1.0f, C, N, err, sizeof err);
            rc |= gemm_f32(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 1.0f, C, N, err, sizeof err);
            struct ref r = ref_f32(ta, tb, M, N, K, 2.0, A, lda, B, ldb, 1.0, C0, N);
            int pad_changed;
            double worst = worst_error(C, M, N, N, r, 2 * f32_rel_bound(K), &pad_changed);
            CHECK(rc == 0 && worst <= 1, "%c%c %dx%dx%d: rc %d '%s', error %.3g of bound",
                  ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, rc, err, worst);
            ref_free(r);
            free(A);
            free(B);
            free(C);
            free(C0);
        }
    }
}

static void test_f32_k_zero_scales_c_and_beta_zero_ignores_nan(void)
{
    float A[1] = {1}, B[4] = {1, 1, 1, 1}, C[4] = {1, 2, 3, 4};
    char err[256] = "";
    CHECK(gemm_f32(false, false, 2, 2, 0, 1.0f, A, 1, B, 2, 0.5f, C, 2, err, sizeof err) == 0, "%s",
          err);
    CHECK(C[0] == 0.5f && C[3] == 2.0f, "K=0 gave %g %g", C[0], C[3]);
    for (int i = 0; i < 4; i++) C[i] = NAN;
    CHECK(gemm_bf16(false, false, 2, 2, 0, 1.0f, NULL, 1, NULL, 2, 0.0f, C, 2, err, sizeof err) ==
              0,
          "%s", err);
    CHECK(C[0] == 0.0f && C[3] == 0.0f, "K=0, beta=0 gave %g %g", C[0], C[3]);
    CHECK(gemm_f32(false, false, 0, 5, 5, 1.0f, NULL, 5, NULL, 5, 0.0f, NULL, 5, err, sizeof err) ==
              0,
          "M=0: %s", err);
}

static void test_bad_arguments_return_error_with_message(void)
{
    float A[16] = {0}, B[16] = {0}, C[16] = {0};
    char err[256] = "";
    CHECK(gemm_f32(false, false, -1, 2, 2, 1.0f, A, 2, B, 2, 0.0f, C, 2, err, sizeof err) == -1,
          "negative M accepted");
    CHECK(strncmp(err, "plait: gemm_f32", 15) == 0 && strstr(err, "negative"), "message: '%s'",
          err);
    err[0] = 0;
    CHECK(gemm_bf16(false, true, 2, 2, 4, 1.0f, (uint16_t *)A, 3, (uint16_t *)B, 4, 0.0f, C, 2, err,
                    sizeof err) == -1,
          "lda < K accepted");
    CHECK(strstr(err, "leading dimension") != NULL, "message: '%s'", err);
    CHECK(gemm_f64(true, false, 2, 2, 2, 1.0, (double *)A, 2, (double *)B, 2, 0.0, (double *)C, 1,
                   NULL, 0) == -1,
          "ldc < N accepted");
    CHECK(gemm_f32(false, false, 2, 2, 2, 1.0f, NULL, 2, B, 2, 0.0f, C, 2, err, sizeof err) == -1,
          "NULL A accepted");
}

/* ---- fp64 ---- */

static void test_f64_matches_naive_for_all_transposes(void)
{
    for (int t = 0; t < 4; t++)
        for (int s = 0; s < N_ODD; s++) {
            bool ta = t & 1, tb = t & 2;
            int M = odd_sizes[s], N = odd_sizes[(s + 1) % N_ODD], K = odd_sizes[(s + 2) % N_ODD];
            int lda = (ta ? M : K) + 2, ldb = (tb ? K : N) + 1, ldc = N + 3;
            double *A = malloc(sizeof(double) * (size_t)(ta ? K : M) * lda);
            double *B = malloc(sizeof(double) * (size_t)(tb ? N : K) * ldb);
            double *C = malloc(sizeof(double) * (size_t)M * ldc),
                   *C0 = malloc(sizeof(double) * (size_t)M * ldc);
            for (size_t i = 0; i < (size_t)(ta ? K : M) * lda; i++)
                A[i] = rng_float() + 1e-9 * rng_float();
            for (size_t i = 0; i < (size_t)(tb ? N : K) * ldb; i++)
                B[i] = rng_float() + 1e-9 * rng_float();
            for (size_t i = 0; i < (size_t)M * ldc; i++) C[i] = C0[i] = rng_float();
            char err[256] = "";
            int rc = gemm_f64(ta, tb, M, N, K, 0.3, A, lda, B, ldb, -1.5, C, ldc, err, sizeof err);
            double worst = 0;
            for (int i = 0; i < M; i++)
                for (int j = 0; j < N; j++) {
                    double s_ = 0, abs_s = 0;
                    for (int k = 0; k < K; k++) {
                        s_ += AT(A, ta, lda, i, k) * AT(B, tb, ldb, k, j);
                        abs_s += fabs(AT(A, ta, lda, i, k) * AT(B, tb, ldb, k, j));
                    }
                    double want = 0.3 * s_ - 1.5 * C0[(size_t)i * ldc + j];
                    double bound = 4 * (K + 4) * ldexp(1.0, -53) *
                                   (0.3 * abs_s + 1.5 * fabs(C0[(size_t)i * ldc + j]));
                    double e = fabs(C[(size_t)i * ldc + j] - want) / bound;
                    if (!(e <= worst)) worst = e;
                }
            CHECK(rc == 0 && worst <= 1, "gemm_f64 %c%c %dx%dx%d: rc %d '%s', error %.3g of bound",
                  ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, rc, err, worst);
            free(A);
            free(B);
            free(C);
            free(C0);
        }
}

/* ---- bf16 GEMM ---- */

/* Random fp32 values f (rows×ld) and h, their bf16 roundings. */
static void matrix_bf16_pair(int rows, int ld, uint16_t **h, float **f)
{
    size_t n = (size_t)(rows ? rows : 1) * ld;
    *f = malloc(sizeof(float) * n);
    *h = malloc(sizeof(uint16_t) * n);
    for (size_t i = 0; i < n; i++) (*f)[i] = rng_float();
    bf16_from_f32(*h, *f, n);
}

/* Two bounds. Against the product of the bf16 values themselves, only fp32
 * accumulation errs (f32_rel_bound). Against the product of the unrounded fp32
 * inputs, each input also carries a relative rounding error of at most
 * u = 2^-8 (bf16 keeps 8 significant bits; round to nearest halves the 2^-7
 * spacing), so each product a·b is off by at most (1+u)² - 1 = 2u + u² of |a·b|:
 * |C - C_exact| <= (2u + u²)·|alpha|·Σ|a||b| + fp32 accumulation. */
static void test_bf16_matches_naive_within_bound(void)
{
    const double u = ldexp(1.0, -8);
    for (int t = 0; t < 4; t++)
        for (int s = 0; s < N_ODD + 2; s++) {
            bool ta = t & 1, tb = t & 2;
            int M, N, K;
            if (s < N_ODD)
                M = odd_sizes[s], N = odd_sizes[(s + 3) % N_ODD], K = odd_sizes[(s + 2) % N_ODD];
            else
                M = 64 + 3 * s, N = 200, K = 96 + s; /* a multi-block, multi-thread case */
            float alpha = s & 1 ? -0.5f : 1.0f, beta = s & 1 ? 1.0f : 0.0f;
            int lda = (ta ? M : K) + s, ldb = (tb ? K : N) + 2, ldc = N + 1;
            uint16_t *A16, *B16;
            float *A, *B;
            matrix_bf16_pair(ta ? K : M, lda, &A16, &A);
            matrix_bf16_pair(tb ? N : K, ldb, &B16, &B);
            float *C = matrix_f32(M, N, ldc);
            float *Ar = malloc(sizeof(float) * (size_t)(ta ? K : M) * lda);
            float *Br = malloc(sizeof(float) * (size_t)(tb ? N : K) * ldb);
            bf16_to_f32(Ar, A16, (size_t)(ta ? K : M) * lda);
            bf16_to_f32(Br, B16, (size_t)(tb ? N : K) * ldb);
            struct ref exact = ref_f32(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
            struct ref rounded = ref_f32(ta, tb, M, N, K, alpha, Ar, lda, Br, ldb, beta, C, ldc);
            char err[256] = "";
            int rc = gemm_bf16(ta, tb, M, N, K, alpha, A16, lda, B16, ldb, beta, C, ldc, err,
                               sizeof err);
            int pad1, pad2;
            double w_rounded = worst_error(C, M, N, ldc, rounded, f32_rel_bound(K), &pad1);
            double w_exact =
                worst_error(C, M, N, ldc, exact, 2 * u + u * u + f32_rel_bound(K), &pad2);
            CHECK(rc == 0 && w_rounded <= 1 && w_exact <= 1 && pad1 == 0,
                  "gemm_bf16 %c%c %dx%dx%d: rc %d '%s', error %.3g of fp32 bound (bf16 inputs), "
                  "%.3g of bf16 bound (fp32 inputs), %d padding changed",
                  ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, rc, err, w_rounded, w_exact, pad1);
            ref_free(exact);
            ref_free(rounded);
            free(A16);
            free(B16);
            free(A);
            free(B);
            free(Ar);
            free(Br);
            free(C);
        }
}

static void test_bf16_general_beta(void)
{
    int M = 33, N = 40, K = 50;
    uint16_t *A16, *B16;
    float *A, *B;
    matrix_bf16_pair(M, K, &A16, &A);
    matrix_bf16_pair(N, K, &B16, &B);
    float *C = matrix_f32(M, N, N), *Ar = malloc(sizeof(float) * M * K),
          *Br = malloc(sizeof(float) * N * K);
    bf16_to_f32(Ar, A16, (size_t)M * K);
    bf16_to_f32(Br, B16, (size_t)N * K);
    struct ref r = ref_f32(false, true, M, N, K, 2.0, Ar, K, Br, K, -0.5, C, N);
    char err[256] = "";
    int rc = gemm_bf16(false, true, M, N, K, 2.0f, A16, K, B16, K, -0.5f, C, N, err, sizeof err);
    int pad;
    double worst = worst_error(C, M, N, N, r, f32_rel_bound(K), &pad);
    CHECK(rc == 0 && worst <= 1, "rc %d '%s', error %.3g of bound", rc, err, worst);
    ref_free(r);
    free(A16), free(B16), free(A), free(B), free(Ar), free(Br), free(C);
}

/* ---- threads ---- */

static int task_count(void)
{
    DIR *d = opendir("/proc/self/task");
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* One product per kind, sized by `seed`, computed and checked; 0 on success. */
static int run_mixed_products(int seed, char *err, size_t err_bytes)
{
    int M = 17 + seed, N = 64 + 3 * seed, K = 65 + seed, bad = 0;
    bad += run_case(false, false, true, M, N, K, 0.125f, 0.0f, 2304 - K, NULL, NULL, err,
                    err_bytes); /* attention strides */
    bad +=
        run_case(false, seed & 1, !(seed & 1), M, N, K, 1.0f, 1.0f, 3, NULL, NULL, err, err_bytes);
    /* large enough for the primitive route and for a multi-thread partition */
    bad += run_case(false, false, true, 256, 256 + seed, 256, 1.0f, 1.0f, 0, NULL, NULL, err,
                    err_bytes);
    uint16_t *A16, *B16;
    float *A, *B;
    matrix_bf16_pair(256, 256, &A16, &A);
    matrix_bf16_pair(256, 256, &B16, &B);
    float *C = malloc(sizeof(float) * 256 * 256);
    float *Ar = malloc(sizeof(float) * 256 * 256), *Br = malloc(sizeof(float) * 256 * 256);
    bf16_to_f32(Ar, A16, 256 * 256);
    bf16_to_f32(Br, B16, 256 * 256);
    bool ta = seed & 1;
    struct ref r = ref_f32(ta, false, 256, 256, 256, 1.0, Ar, 256, Br, 256, 0.0, C, 256);
    if (gemm_bf16(ta, false, 256, 256, 256, 1.0f, A16, 256, B16, 256, 0.0f, C, 256, err, err_bytes))
        bad++;
    int pad;
    if (worst_error(C, 256, 256, 256, r, f32_rel_bound(256), &pad) > 1) {
        snprintf(err, err_bytes, "gemm_bf16 %c%c 256x256x256: wrong result", ta ? 'T' : 'N', 'N');
        bad++;
    }
    double dA[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, dC[9];
    if (gemm_f64(false, true, 3, 3, 3, 1.0, dA, 3, dA, 3, 0.0, dC, 3, err, err_bytes)) bad++;
    bad += dC[1] != 32 || dC[8] != 194;
    ref_free(r);
    free(A16), free(B16), free(A), free(B), free(Ar), free(Br), free(C);
    return bad;
}

/* Inside a parallel region each call runs on its own thread only (no new
 * threads), next to other threads' calls of other shapes, and after the same
 * shapes were made outside the region for all threads. */
static void test_calls_inside_omp_parallel_region_with_different_shapes(void)
{
    char err[256] = "";
    CHECK(run_mixed_products(0, err, sizeof err) == 0, "outside a parallel region: '%s'", err);
    CHECK(run_mixed_products(1, err, sizeof err) == 0, "outside a parallel region: '%s'", err);
#pragma omp parallel
    {
        (void)0;
    }
    int tasks_before = task_count(), failures = 0;
#pragma omp parallel reduction(+ : failures)
    {
        char terr[256] = "";
        for (int rep = 0; rep < 3; rep++) {
            int bad = run_mixed_products(omp_get_thread_num() + rep, terr, sizeof terr);
            if (bad)
                printf("  thread %d rep %d: %d failures '%s'\n", omp_get_thread_num(), rep, bad,
                       terr);
            failures += bad;
        }
    }
    CHECK(failures == 0, "%d failures inside the parallel region", failures);
    int tasks_after = task_count();
    CHECK(tasks_after == tasks_before, "threads: %d before, %d after", tasks_before, tasks_after);
}

static void *thread_body(void *arg)
{
    char err[256] = "";
    int *failures = arg;
    for (int rep = 0; rep < 4; rep++) *failures += run_mixed_products(3, err, sizeof err);
    return NULL;
}

/* Plain threads (not OpenMP workers) share the cached primitives that the main
 * thread made; oneDNN's own scratchpads would tie them to their maker. */
static void test_calls_from_plain_threads_share_cached_primitives(void)
{
    char err[256] = "";
    CHECK(run_mixed_products(3, err, sizeof err) == 0, "main thread: '%s'", err);
    pthread_t th[3];
    int failures[3] = {0};
    for (int i = 0; i < 3; i++)
        CHECK(pthread_create(&th[i], NULL, thread_body, &failures[i]) == 0, "pthread_create");
    for (int i = 0; i < 3; i++) {
        pthread_join(th[i], NULL);
        CHECK(failures[i] == 0, "thread %d: %d failures", i, failures[i]);
    }
}

/* ---- determinism ---- */

static void test_repeated_calls_are_bitwise_identical(void)
{
    /* (ta, tb, M, N, K, beta): forward NT (primitive), backward NN and TN (dnnl_sgemm) */
    int cases[][6] = {{0, 1, 256, 768, 768, 0},
                      {0, 0, 256, 768, 768, 0},
                      {1, 0, 768, 768, 256, 1},
                      {0, 1, 64, 64, 64, 0}};
    for (int c = 0; c < 4; c++) {
        bool ta = cases[c][0], tb = cases[c][1];
        int M = cases[c][2], N = cases[c][3], K = cases[c][4];
        float beta = (float)cases[c][5];
        int lda = ta ? M : K, ldb = tb ? K : N;
        float *A = matrix_f32(ta ? K : M, lda, lda), *B = matrix_f32(tb ? N : K, ldb, ldb);
        uint16_t *A16 = malloc(sizeof(uint16_t) * (size_t)M * K),
                 *B16 = malloc(sizeof(uint16_t) * (size_t)K * N);
        bf16_from_f32(A16, A, (size_t)M * K);
        bf16_from_f32(B16, B, (size_t)K * N);
        float *C0 = matrix_f32(M, N, N), *C[2], *D[2];
        for (int r = 0; r < 2; r++) {
            C[r] = malloc(sizeof(float) * (size_t)M * N);
            D[r] = malloc(sizeof(float) * (size_t)M * N);
        }
        int differ = 0, rc = 0;
        char err[256] = "";
        for (int rep = 0; rep < 6; rep++) {
            int r = rep ? 1 : 0;
            memcpy(C[r], C0, sizeof(float) * (size_t)M * N);
            memcpy(D[r], C0, sizeof(float) * (size_t)M * N);
            rc |= gemm_f32(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C[r], N, err, sizeof err);
            rc |= gemm_bf16(ta, tb, M, N, K, 1.0f, A16, lda, B16, ldb, beta, D[r], N, err,
                            sizeof err);
            if (rep) differ += memcmp(C[0], C[1], sizeof(float) * (size_t)M * N) != 0;
            if (rep) differ += memcmp(D[0], D[1], sizeof(float) * (size_t)M * N) != 0;
        }
        CHECK(rc == 0 && differ == 0, "%c%c %dx%dx%d: rc %d '%s', %d of 10 repeats differ",
              ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, rc, err, differ);
        free(A), free(B), free(A16), free(B16), free(C0);
        for (int r = 0; r < 2; r++) free(C[r]), free(D[r]);
    }
}

/* ---- bf16 emulated in fp32 ---- */

/* Emulation forced on this machine: the same cases as the native test pass,
 * and the decision is reported as emulated. */
static void test_bf16_emulated_matches_naive_within_bound(void)
{
    gemm_bf16_force_emulation(true, 0);
    const char *how = NULL;
    CHECK(gemm_bf16_emulated(&how) && how && strstr(how, "emulated in fp32"), "reported '%s'",
          how ? how : "(null)");
    test_bf16_matches_naive_within_bound();
    test_bf16_general_beta();
    gemm_bf16_force_emulation(false, 0);
}

/* With a small bound on the widened panels, products split along M, N and K
 * (each alone and together) still match: panel offsets, which panels are
 * widened again, beta only on the first K panel, C's padding untouched. */
static void test_bf16_emulated_in_panels_matches_naive(void)
{
    const struct {
        int M, N, K;
        size_t panel_floats;
    } cases[] = {
        {50, 60, 700, 3000},    /* K in 26 panels */
        {1500, 40, 10, 11000},  /* M in 2 panels; op(B) widened once */
        {40, 1500, 10, 11000},  /* N in 2 panels; op(A) kept across them */
        {1300, 1200, 8, 16384}, /* M and N in 2 panels each */
        {1100, 40, 30, 20000},  /* M and K in 2 panels each */
        {130, 120, 20, 100},    /* everything in tiny panels */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        gemm_bf16_force_emulation(true, cases[c].panel_floats);
        for (int t = 0; t < 4; t++) {
            char msg[512] = "";
            bool ta = t & 1, tb = t & 2;
            float beta = t == 1 ? 0.0f : t == 2 ? 1.0f : -0.5f;
            int bad = run_case(true, ta, tb, cases[c].M, cases[c].N, cases[c].K, t ? 0.75f : 1.0f,
                               beta, t, NULL, NULL, msg, sizeof msg);
            CHECK(!bad, "panels of %zu floats: %s", cases[c].panel_floats, msg);
        }
    }
    gemm_bf16_force_emulation(false, 0);
}

/* Native and emulated products of the same bf16 operands both pass the fp32
 * bound against the exact product, and differ from each other by no more than
 * fp32 rounding allows (the largest difference is printed). Where this CPU has
 * no native bf16 (or PLAIT_BF16_EMULATE=1) there is nothing to compare: skipped. */
static void test_bf16_emulated_agrees_with_native(void)
{
    const char *how = NULL;
    if (gemm_bf16_emulated(&how)) {
        SKIP("%s", how);
    }
    /* (ta, tb, M, N, K): a layer's forward, input-gradient and weight-gradient
     * products at 128 tokens, C 256, OC 384; then a bigger and a tiny one */
    const int shapes[][5] = {{0, 1, 128, 384, 256},
                             {0, 0, 128, 256, 384},
                             {1, 0, 384, 256, 128},
                             {0, 1, 256, 768, 512},
                             {1, 1, 17, 65, 3}};
    /* in units of the fp32 bound: native and emulated against the exact
     * product, and against each other; and the plain relative difference */
    double worst_vs_exact[2] = {0, 0}, worst_bound = 0, worst_rel = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        bool ta = shapes[s][0], tb = shapes[s][1];
        int M = shapes[s][2], N = shapes[s][3], K = shapes[s][4];
        float *C[2] = {NULL, NULL};
        struct ref r[2];
        char msg[512] = "";
        uint64_t seed = rng_state;
        for (int e = 0; e < 2; e++) { /* native, then emulated, on the same operands */
            rng_state = seed;
            gemm_bf16_force_emulation(e, 0);
            int bad = run_case(true, ta, tb, M, N, K, 1.0f, 0.0f, 0, &C[e], &r[e], msg, sizeof msg);
            CHECK(!bad, "%s: %s", e ? "emulated" : "native", msg);
        }
        gemm_bf16_force_emulation(false, 0);
        for (size_t i = 0; i < (size_t)M * N; i++) {
            double bound = f32_rel_bound(K) * r[0].absbound[i] + 1e-30;
            for (int e = 0; e < 2; e++) {
                double x = fabs(C[e][i] - r[0].c[i]) / bound;
                if (!(x <= worst_vs_exact[e])) worst_vs_exact[e] = x;
            }
            double d = fabs((double)C[0][i] - C[1][i]), rel = d / (fabs((double)C[0][i]) + 1e-30);
            if (!(d / bound <= worst_bound)) worst_bound = d / bound;
            /* (where the sum does not cancel to near 0) */
            if (fabs(r[0].c[i]) > 1e-3 * r[0].absbound[i] && !(rel <= worst_rel)) worst_rel = rel;
        }
        for (int e = 0; e < 2; e++) free(C[e]), ref_free(r[e]);
    }
    printf("  worst error of the fp32 bound: native %.3g, emulated %.3g against the exact "
           "product, %.3g between them; largest relative difference %.3g\n",
           worst_vs_exact[0], worst_vs_exact[1], worst_bound, worst_rel);
    CHECK(worst_bound <= 2, "emulated and native differ by %.3g of the fp32 bound", worst_bound);
}

/* Emulated products keep gemm_bf16's promises: repeatable to the bit, safe from
 * OpenMP workers and plain threads at once (each with its own fp32 panels). */
static void test_bf16_emulated_is_repeatable_and_thread_safe(void)
{
    gemm_bf16_force_emulation(true, 40000); /* 256×256×256 products in panels */
    test_repeated_calls_are_bitwise_identical();
    test_calls_inside_omp_parallel_region_with_different_shapes();
    test_calls_from_plain_threads_share_cached_primitives();
    gemm_bf16_force_emulation(false, 0);
}

/* The backend says "emulated" (why, and the cost) exactly when it emulates. */
static void test_ops_report_bf16_emulation(void)
{
    const struct ops *o = ops_cpu();
    CHECK(o->bf16_emulation != NULL, "no bf16_emulation in the CPU ops");
    if (!o->bf16_emulation) return;
    struct ops_ctx *cx = test_cpu_open();
    const char *line = o->bf16_emulation(cx);
    CHECK(gemm_bf16_emulated(NULL) == (line != NULL), "gemm says %d, ops say '%s'",
          gemm_bf16_emulated(NULL), line ? line : "(null)");
    gemm_bf16_force_emulation(true, 0);
    line = o->bf16_emulation(cx);
    CHECK(line && strstr(line, "emulated in fp32") && strstr(line, "fp32 speed"), "forced: '%s'",
          line ? line : "(null)");
    gemm_bf16_force_emulation(false, 0);
    o->close(cx);
}

/* ---- bf16 conversions ---- */

/* The reference: of the two bf16 neighbours of x (truncation and the next one
 * up in magnitude), take the nearer in exact arithmetic, the even one on a tie. */
static uint16_t bf16_reference(uint32_t x)
{
    float f = f32_from_bits(x);
    if (isnan(f)) return (uint16_t)((x >> 16) | 0x40);
    uint32_t lo = x & 0xffff0000u, hi = lo + 0x10000u;
    if (lo == x) return (uint16_t)(x >> 16);
    double dlo = fabs((double)f - (double)f32_from_bits(lo));
    double dhi =
        (hi & 0x7fffffffu) >= 0x7f800000u
            ? fabs(ldexp(1.0, 128) - fabs((double)f)) /* rounding up overflows: inf sits at 2^128 */
            : fabs((double)f32_from_bits(hi) - (double)f);
    if (dlo < dhi) return (uint16_t)(lo >> 16);
    if (dhi < dlo) return (uint16_t)(hi >> 16);
    return (uint16_t)(((lo >> 16) & 1) ? hi >> 16 : lo >> 16);
}

static void test_bf16_rounds_to_nearest_even(void)
{
    struct {
        uint32_t in;
        uint16_t out;
        const char *what;
    } cases[] = {
        {0x3f800000, 0x3f80, "1"},
        {0x3f808000, 0x3f80, "tie, even below: down"},
        {0x3f818000, 0x3f82, "tie, odd below: up"},
        {0x3f808001, 0x3f81, "just above a tie"},
        {0x3f807fff, 0x3f80, "just below a tie"},
        {0xbf818000, 0xbf82, "negative tie: up in magnitude"},
        {0x00000000, 0x0000, "+0"},
        {0x80000000, 0x8000, "-0"},
        {0x7f800000, 0x7f80, "+inf"},
        {0xff800000, 0xff80, "-inf"},
        {0x7f7fffff, 0x7f80, "FLT_MAX rounds to inf"},
        {0x7f7f7fff, 0x7f7f, "largest value that stays finite"},
        {0x7f7f8000, 0x7f80, "tie at the top rounds to inf (odd below)"},
        {0x00000001, 0x0000, "smallest subnormal"},
        {0x00008000, 0x0000, "subnormal tie: down"},
        {0x00018000, 0x0002, "subnormal tie: up"},
        {0x007fffff, 0x0080, "largest subnormal rounds to the smallest normal"},
        {0x7fc00000, 0x7fc0, "quiet NaN"},
        {0x7f800001, 0x7fc0, "signalling NaN with low payload stays NaN"},
        {0xff800001, 0xffc0, "negative signalling NaN"},
        {0x7fffffff, 0x7fff, "NaN with all payload bits"},
    };
    int n = (int)(sizeof cases / sizeof cases[0]);
    for (int i = 0; i < n; i++) {
        float f = f32_from_bits(cases[i].in);
        uint16_t got;
        bf16_from_f32(&got, &f, 1);
        CHECK(got == cases[i].out, "%s: 0x%08x -> 0x%04x, want 0x%04x", cases[i].what, cases[i].in,
              got, cases[i].out);
        CHECK(bf16_reference(cases[i].in) == cases[i].out, "reference disagrees on %s",
              cases[i].what);
    }
}

static void test_bf16_matches_reference_on_random_bits_and_every_length(void)
{
    enum { COUNT = 1 << 20 };
    float *src = malloc(sizeof(float) * COUNT);
    uint16_t *dst = malloc(sizeof(uint16_t) * (COUNT + 1));
    for (int i = 0; i < COUNT; i++) {
        uint32_t x = rng_u32();
        if (i % 4 == 1) x = (x & 0xffff0000u) | 0x8000u; /* plenty of ties */
        src[i] = f32_from_bits(x);
    }
    /* every tail length of the vector loops, then the whole array */
    int mismatches = 0;
    for (int len = 0; len <= 70; len++) {
        dst[len] = 0xabcd;
        bf16_from_f32(dst, src + len, len);
        for (int i = 0; i < len; i++) mismatches += dst[i] != bf16_reference(bits_of(src[len + i]));
        mismatches += dst[len] != 0xabcd; /* wrote past the end */
    }
    bf16_from_f32(dst, src, COUNT);
    for (int i = 0; i < COUNT; i++) {
        uint16_t want = bf16_reference(bits_of(src[i]));
        if (dst[i] != want && mismatches++ < 3)
            printf("  0x%08x -> 0x%04x, want 0x%04x\n", bits_of(src[i]), dst[i], want);
    }
    CHECK(mismatches == 0, "%d mismatches", mismatches);
    free(src);
    free(dst);
}

static void test_bf16_to_f32_is_exact_and_round_trips(void)
{
    enum { ALL = 1 << 16 };
    uint16_t *h = malloc(sizeof(uint16_t) * ALL), *back = malloc(sizeof(uint16_t) * ALL);
    float *f = malloc(sizeof(float) * ALL);
    for (int i = 0; i < ALL; i++) h[i] = (uint16_t)i;
    bf16_to_f32(f, h, ALL);
    bf16_from_f32(back, f, ALL);
    int bad = 0;
    for (int i = 0; i < ALL; i++) {
        bool nan = (i & 0x7f80) == 0x7f80 && (i & 0x7f);
        bad += bits_of(f[i]) != (uint32_t)i << 16;
        bad += back[i] != (nan ? (i | 0x40) : i);
    }
    CHECK(bad == 0, "%d of 65536 bf16 values do not convert exactly and back", bad);
    CHECK(bf16_value(0x3f80) == 1.0 && bf16_value(0xc040) == -3.0, "1 and -3");
    free(h);
    free(back);
    free(f);
}

static void test_backend_has_a_name(void)
{
    const char *name = gemm_backend_name();
    CHECK(name && strstr(name, "oneDNN"), "'%s'", name ? name : "(null)");
}

int main(void)
{
    RUN(test_bf16_rounds_to_nearest_even);
    RUN(test_bf16_matches_reference_on_random_bits_and_every_length);
    RUN(test_bf16_to_f32_is_exact_and_round_trips);
    RUN(test_f32_matches_naive_for_all_transposes_and_odd_sizes);
    RUN(test_f32_large_products_match_naive);
    RUN(test_f32_beta_one_accumulates_into_c);
    RUN(test_f32_k_zero_scales_c_and_beta_zero_ignores_nan);
    RUN(test_bad_arguments_return_error_with_message);
    RUN(test_f64_matches_naive_for_all_transposes);
    RUN(test_bf16_matches_naive_within_bound);
    RUN(test_bf16_general_beta);
    RUN(test_calls_inside_omp_parallel_region_with_different_shapes);
    RUN(test_calls_from_plain_threads_share_cached_primitives);
    RUN(test_repeated_calls_are_bitwise_identical);
    RUN(test_bf16_emulated_matches_naive_within_bound);
    RUN(test_bf16_emulated_in_panels_matches_naive);
    RUN(test_bf16_emulated_agrees_with_native);
    RUN(test_bf16_emulated_is_repeatable_and_thread_safe);
    RUN(test_ops_report_bf16_emulation);
    RUN(test_backend_has_a_name);
    return check_exit_code();
}
