/* test_fp8.c — kernels/fp8.h on its own: every code of both formats decodes and
 * encodes back, the rounding, saturation and NaN rules on chosen values, the
 * scale rules, tile edges, and quantising the same matrix with 1 and 2 threads.
 * With arguments it is the driver of tests/golden/fp8_ref.py (the PyTorch
 * referee, run by tests/integration/test_fp8.sh):
 *   test_fp8 quantize IN OUT rows cols tile_rows tile_cols e4m3|e5m2
 *       IN (rows·cols fp32) -> OUT.q codes, OUT.s scales, OUT.d dequantised
 *   test_fp8 matmul DIR N C OC tensor|block
 *       DIR/{x,w,d,b}.f32 -> DIR/{y,dinp,dw}.out through ops_cpu()'s fp8 products
 *       (w through its fp8 copy, quantize_fp8, as the model keeps it) */
#include "kernels/fp8.h"
#include "kernels/fp8_lt.h"
#include "kernels/ops.h"
#include "tests/unit/cpu_ctx.h"
#include "tests/unit/check.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* ---- the self-checks ---- */

static void test_every_code_decodes_and_encodes_back(void)
{
    for (int f = FP8_E4M3; f <= FP8_E5M2; f++)
        for (int c = 0; c < 256; c++) {
            float v = fp8_decode((uint8_t)c, (enum fp8_format)f);
            if (isnan(v) || isinf(v)) continue;
            uint8_t back = fp8_encode(v, (enum fp8_format)f);
            CHECK(back == c, "format %d code 0x%02x -> %g -> 0x%02x", f, c, v, back);
        }
}

static void test_rounding_saturation_and_nan(void)
{
    const struct {
        enum fp8_format f;
        float x;
        uint8_t code;
    } cases[] = {
        {FP8_E4M3, 448.0f, 0x7e},    {FP8_E4M3, 465.0f, 0x7e},   /* beyond the max */
        {FP8_E4M3, -1e30f, 0xfe},    {FP8_E4M3, INFINITY, 0x7e}, /* saturates */
        {FP8_E4M3, NAN, 0x7f},       {FP8_E4M3, 0x1p-9f, 0x01},  /* smallest subnormal */
        {FP8_E4M3, 0x1p-10f, 0x00},                              /* a tie: to even, 0 */
        {FP8_E4M3, 0x1.8p-9f, 0x02},                             /* a tie: to even, 2 */
        {FP8_E4M3, 0x1.ep-7f, 0x08}, /* a subnormal rounding up to the smallest normal */
        {FP8_E4M3, 1.0625f, 0x38},   /* 1 + 1/16: a tie between 1 and 1.125, to even */
        {FP8_E4M3, 1.1875f, 0x3a},   /* 1 + 3/16: a tie, to 1.25 (even) */
        {FP8_E4M3, -0.0f, 0x80},     {FP8_E5M2, 57344.0f, 0x7b}, {FP8_E5M2, 61440.0f, 0x7b},
        {FP8_E5M2, -INFINITY, 0xfb}, {FP8_E5M2, 0x1p-16f, 0x01}, {FP8_E5M2, 0x1p-17f, 0x00},
        {FP8_E5M2, 1.125f, 0x3c}, /* a tie between 1 and 1.25: to even */
        {FP8_E5M2, 1e-45f, 0x00}, /* an fp32 subnormal */
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        uint8_t got = fp8_encode(cases[k].x, cases[k].f);
        CHECK(got == cases[k].code, "format %d: %a -> 0x%02x, want 0x%02x", cases[k].f, cases[k].x,
              got, cases[k].code);
    }
    CHECK(fp8_max(FP8_E4M3) == 448.0f && fp8_max(FP8_E5M2) == 57344.0f, "max");
    CHECK(isnan(fp8_decode(0x7f, FP8_E4M3)) && isnan(fp8_decode(0xff, FP8_E4M3)), "e4m3 NaN");
    CHECK(isinf(fp8_decode(0x7c, FP8_E5M2)) && isnan(fp8_decode(0x7f, FP8_E5M2)), "e5m2 inf, NaN");
}

static void test_scale_rules(void)
{
    CHECK(fp8_scale(0.0f, FP8_E4M3) == 1.0f, "amax 0 -> 1");
    CHECK(fp8_scale(INFINITY, FP8_E4M3) == 1.0f, "amax inf -> 1");
    CHECK(fp8_scale(NAN, FP8_E4M3) == 1.0f, "amax NaN -> 1");
    CHECK(fp8_scale(2.0f, FP8_E4M3) == 224.0f, "448 / 2");
    CHECK(fp8_scale(1e-45f, FP8_E4M3) == 0x1.fffffep127f, "an overflowing scale is FLT_MAX");
    CHECK(fp8_scale(4.0f, FP8_E5M2) == 14336.0f, "57344 / 4");
}

static void test_tiles_at_the_edges(void)
{
    CHECK(fp8_scale_count(300, 130, 1, 128) == 600, "1x128 of 300x130");
    CHECK(fp8_scale_count(300, 130, 128, 1) == 390, "128x1 of 300x130");
    CHECK(fp8_scale_count(300, 130, 128, 128) == 6, "128x128 of 300x130");
    CHECK(fp8_scale_count(300, 130, 0, 0) == 1, "tensor");
    /* a 129-wide row in 1x128 tiles: the second tile is one value, scaled alone */
    float x[129];
    for (int i = 0; i < 129; i++) x[i] = 1.0f;
    x[128] = 1e-3f;
    uint8_t q[129];
    float s[2];
    fp8_quantize(q, s, x, 1, 129, 1, FP8_TILE, FP8_E4M3);
    CHECK(s[0] == 448.0f && s[1] == 448.0f / 1e-3f, "scales %g %g", s[0], s[1]);
    CHECK(q[0] == 0x7e && q[128] == 0x7e, "both tiles reach the max: 0x%02x 0x%02x", q[0], q[128]);
}

static void test_threads_do_not_change_the_result(void)
{
    enum { R = 257, C = 300 };
    float *x = malloc(sizeof(float) * R * C);
    uint8_t *q1 = malloc(R * C), *q2 = malloc(R * C);
    float s1[3 * 3], s2[3 * 3];
    uint64_t state = 42;
    for (int i = 0; i < R * C; i++) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = ((float)(state >> 40) / (float)(1 << 24) - 0.5f) * (float)(i % 97);
    }
    int tilings[][2] = {{0, 0}, {1, FP8_TILE}, {FP8_TILE, 1}, {FP8_TILE, FP8_TILE}};
    for (int t = 0; t < 4; t++) {
        size_t ns = fp8_scale_count(R, C, tilings[t][0], tilings[t][1]);
        float *a = ns > 9 ? malloc(ns * sizeof(float)) : s1,
              *b = ns > 9 ? malloc(ns * sizeof(float)) : s2;
        omp_set_num_threads(1);
        fp8_quantize(q1, a, x, R, C, tilings[t][0], tilings[t][1], FP8_E4M3);
        omp_set_num_threads(2);
        fp8_quantize(q2, b, x, R, C, tilings[t][0], tilings[t][1], FP8_E4M3);
        CHECK(memcmp(q1, q2, R * C) == 0 && memcmp(a, b, ns * sizeof(float)) == 0, "tiling %d", t);
        if (ns > 9) free(a), free(b);
    }
    free(x), free(q1), free(q2);
}

/* ---- cuBLASLt's block-scale layout (kernels/fp8_lt.h), multiplied through ---- */

/* Where cuBLASLt reads the factor of element (o, k) of an operand (outer, K)
 * stored K-contiguous, as NVIDIA's samples, Transformer Engine and PyTorch
 * lay the arrays out for it (fp8_lt.h cites them), written here apart from
 * fp8_lt.h, which must agree: VEC128_32F a (⌈K/128⌉, outer) array with the
 * outer index fastest; BLK128x128_32F (⌈outer/128⌉, round_up(⌈K/128⌉, 4))
 * with the K blocks fastest. */
static size_t lt_read_index(enum fp8_lt_mode mode, int outer, int K, int o, int k)
{
    int kb = k / 128, k_blocks = (K + 127) / 128;
    if (mode == FP8_LT_VEC128) return (size_t)kb * (size_t)outer + (size_t)o;
    return (size_t)(o / 128) * (size_t)((k_blocks + 3) / 4 * 4) + (size_t)kb;
}

/* cuBLASLt's array for operand A (a) or B of product p from plait's scales s */
static float *lt_array(const float *s, enum fp8_product p, bool a, int N, int C, int OC,
                       struct fp8_lt_scales *l)
{
    *l = fp8_lt_block_scales(p, a, N, C, OC);
    float *out = malloc(fp8_lt_count(l) * sizeof(float));
    for (size_t i = 0; out && i < fp8_lt_count(l); i++) out[i] = fp8_lt_entry(s, *l, i);
    return out;
}

/* cuBLASLt's TN product as that layout reads it, in double: D (Nb, Ma) =
 * Σ_k A[i][k]·la(i,k) · B[j][k]·lb(j,k), codes A (Ma, K) and B (Nb, K);
 * false if it would read beyond an array */
static bool lt_product(float *D, const uint8_t *A, const float *la, const struct fp8_lt_scales *l_a,
                       const uint8_t *B, const float *lb, const struct fp8_lt_scales *l_b, int Ma,
                       int Nb, int K)
{
    for (int j = 0; j < Nb; j++)
        for (int i = 0; i < Ma; i++) {
            double acc = 0;
            for (int k = 0; k < K; k++) {
                size_t ia = lt_read_index(l_a->mode, Ma, K, i, k);
                size_t ib = lt_read_index(l_b->mode, Nb, K, j, k);
                if (ia >= fp8_lt_count(l_a) || ib >= fp8_lt_count(l_b)) return false;
                acc += (double)fp8_decode(A[(size_t)i * K + k], FP8_E4M3) * la[ia] *
                       (double)fp8_decode(B[(size_t)j * K + k], FP8_E4M3) * lb[ib];
            }
            D[(size_t)j * Ma + i] = (float)acc;
        }
    return true;
}

static uint8_t *transposed(const uint8_t *q, int rows, int cols)
{
    uint8_t *t = malloc((size_t)rows * cols);
    for (int r = 0; t && r < rows; r++)
        for (int c = 0; c < cols; c++) t[(size_t)c * rows + r] = q[(size_t)r * cols + c];
    return t;
}

static double max_rel(const float *a, const float *b, size_t n)
{
    double d = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        m = fmax(m, fabs((double)b[i]));
    }
    return m > 0 ? d / m : d;
}

/* GPT-2's C (6 blocks: rows padded to 8), an OC of 3 blocks (padded to 4)
 * and N of 3 row blocks, the last ones partial: the three block-scaled
 * products through cuBLASLt's layout equal the CPU backend's */
static void test_block_scales_reach_cublaslt_as_it_reads_them(void)
{
    enum { N = 272, C = 768, OC = 336 };
    uint64_t state = 7;
    float *x = malloc(sizeof(float) * N * C), *w = malloc(sizeof(float) * OC * C),
          *d = malloc(sizeof(float) * N * OC);
    for (size_t i = 0; i < (size_t)N * C + (size_t)OC * C + (size_t)N * OC; i++) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        float v = ((float)(state >> 40) / (float)(1 << 24) - 0.5f) * (float)(1 + i % 13);
        if (i < (size_t)N * C)
            x[i] = v;
        else if (i < (size_t)N * C + (size_t)OC * C)
            w[i - (size_t)N * C] = 0.1f * v;
        else
            d[i - (size_t)N * C - (size_t)OC * C] = v;
    }
    /* the operands as the CUDA backend quantises them (matmul_fp8.cu) */
    uint8_t *w8 = malloc((size_t)OC * C), *x8 = malloc((size_t)N * C), *d8 = malloc((size_t)N * OC),
            *xc8 = malloc((size_t)N * C), *dc8 = malloc((size_t)N * OC);
    float *ws = malloc(fp8_scale_count(OC, C, FP8_TILE, FP8_TILE) * sizeof(float)),
          *xs = malloc(fp8_scale_count(N, C, 1, FP8_TILE) * sizeof(float)),
          *ds = malloc(fp8_scale_count(N, OC, 1, FP8_TILE) * sizeof(float)),
          *xcs = malloc(fp8_scale_count(N, C, FP8_TILE, 1) * sizeof(float)),
          *dcs = malloc(fp8_scale_count(N, OC, FP8_TILE, 1) * sizeof(float));
    fp8_quantize(w8, ws, w, OC, C, FP8_TILE, FP8_TILE, FP8_E4M3);
    fp8_quantize(x8, xs, x, N, C, 1, FP8_TILE, FP8_E4M3);
    fp8_quantize(d8, ds, d, N, OC, 1, FP8_TILE, FP8_E4M3);
    fp8_quantize(xc8, xcs, x, N, C, FP8_TILE, 1, FP8_E4M3); /* dw: reduced along N */
    fp8_quantize(dc8, dcs, d, N, OC, FP8_TILE, 1, FP8_E4M3);
    uint8_t *wt8 = transposed(w8, OC, C), *xt8 = transposed(xc8, N, C),
            *dt8 = transposed(dc8, N, OC);
    /* the CPU backend's products of the same copy and inputs */
    const struct ops *o = ops_cpu();
    struct ops_ctx *cx = test_cpu_open();
    float *y = malloc(sizeof(float) * N * OC), *dinp = malloc(sizeof(float) * N * C),
          *dw = malloc(sizeof(float) * OC * C), *got = malloc(sizeof(float) * OC * C * 2);
    o->matmul_forward_fp8(cx, y, x, w8, ws, NULL, N, C, OC, FP8_SCALING_BLOCK);
    o->matmul_backward_fp8(cx, dinp, dw, NULL, d, x, w8, ws, N, C, OC, false, FP8_SCALING_BLOCK);
    CHECK(!o->take_error(cx, NULL, 0), "the CPU products");
    o->close(cx);
    const struct {
        enum fp8_product p;
        const uint8_t *A, *B;
        const float *sa, *sb, *want;
        int Ma, Nb, K;
        const char *name;
    } products[] = {
        {FP8_FWD, w8, x8, ws, xs, y, OC, N, C, "forward"},
        {FP8_DINP, wt8, d8, ws, ds, dinp, C, N, OC, "dinp"},
        {FP8_DW, xt8, dt8, xcs, dcs, dw, C, OC, N, "dw"},
    };
    for (int k = 0; k < 3; k++) {
        struct fp8_lt_scales la, lb;
        float *a = lt_array(products[k].sa, products[k].p, true, N, C, OC, &la);
        float *b = lt_array(products[k].sb, products[k].p, false, N, C, OC, &lb);
        bool inside = lt_product(got, products[k].A, a, &la, products[k].B, b, &lb, products[k].Ma,
                                 products[k].Nb, products[k].K);
        CHECK(inside, "%s: cuBLASLt would read beyond the scale arrays", products[k].name);
        double e = inside ? max_rel(got, products[k].want, (size_t)products[k].Ma * products[k].Nb)
                          : INFINITY;
        CHECK(e < 1e-5, "%s: max |cuBLASLt layout - cpu| / max |cpu| = %.3g", products[k].name, e);
        free(a), free(b);
    }
    /* the shapes cuBLASLt then reads: w's rows of 6 blocks padded to 8 */
    struct fp8_lt_scales l = fp8_lt_block_scales(FP8_FWD, true, 1024, 768, 2304);
    CHECK(l.mode == FP8_LT_BLK128 && l.out_rows == 18 && l.ld == 8 && !l.transposed,
          "forward w: %d rows of %d", l.out_rows, l.ld);
    l = fp8_lt_block_scales(FP8_DINP, true, 1024, 768, 2304);
    CHECK(l.mode == FP8_LT_BLK128 && l.out_rows == 6 && l.ld == 20 && l.transposed,
          "dinp wᵀ: %d rows of %d", l.out_rows, l.ld);
    l = fp8_lt_block_scales(FP8_FWD, false, 1024, 768, 2304);
    CHECK(l.mode == FP8_LT_VEC128 && l.out_rows == 6 && l.ld == 1024 && l.transposed,
          "forward x: %d rows of %d", l.out_rows, l.ld);
    l = fp8_lt_block_scales(FP8_DW, true, 1024, 768, 2304);
    CHECK(l.mode == FP8_LT_VEC128 && l.out_rows == 8 && l.ld == 768 && !l.transposed,
          "dw xᵀ: %d rows of %d", l.out_rows, l.ld);
    free(x), free(w), free(d), free(w8), free(x8), free(d8), free(xc8), free(dc8);
    free(ws), free(xs), free(ds), free(xcs), free(dcs), free(wt8), free(xt8), free(dt8);
    free(y), free(dinp), free(dw), free(got);
}

/* ---- the referee's driver ---- */

static void *read_file(const char *path, size_t bytes)
{
    FILE *f = fopen(path, "rb");
    void *p = malloc(bytes ? bytes : 1);
    if (!f || !p || fread(p, 1, bytes, f) != bytes) {
        fprintf(stderr, "test_fp8: cannot read %zu bytes from %s\n", bytes, path);
        exit(2);
    }
    fclose(f);
    return p;
}

static void write_file(const char *path, const void *p, size_t bytes)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, bytes, f) != bytes || fclose(f) != 0) {
        fprintf(stderr, "test_fp8: cannot write %s\n", path);
        exit(2);
    }
}

static const char *join(char *buf, size_t n, const char *a, const char *b)
{
    snprintf(buf, n, "%s%s", a, b);
    return buf;
}

static int drive_quantize(char **argv)
{
    int rows = atoi(argv[4]), cols = atoi(argv[5]), tr = atoi(argv[6]), tc = atoi(argv[7]);
    enum fp8_format fmt = strcmp(argv[8], "e5m2") == 0 ? FP8_E5M2 : FP8_E4M3;
    size_t n = (size_t)rows * cols, ns = fp8_scale_count(rows, cols, tr, tc);
    float *x = read_file(argv[2], n * sizeof(float)), *s = malloc(ns * sizeof(float)),
          *d = malloc(n * sizeof(float));
    uint8_t *q = malloc(n);
    fp8_quantize(q, s, x, rows, cols, tr, tc, fmt);
    fp8_dequantize(d, q, tr == 0 && tc == 0 ? NULL : s, rows, cols, tr, tc, fmt);
    char path[4096];
    write_file(join(path, sizeof path, argv[3], ".q"), q, n);
    write_file(join(path, sizeof path, argv[3], ".s"), s, ns * sizeof(float));
    write_file(join(path, sizeof path, argv[3], ".d"), d, n * sizeof(float));
    free(x), free(s), free(d), free(q);
    return 0;
}

static int drive_matmul(char **argv)
{
    const char *dir = argv[2];
    int N = atoi(argv[3]), C = atoi(argv[4]), OC = atoi(argv[5]);
    enum fp8_scaling scaling =
        strcmp(argv[6], "block") == 0 ? FP8_SCALING_BLOCK : FP8_SCALING_TENSOR;
    char path[4096];
    float *x = read_file(join(path, sizeof path, dir, "/x.f32"), sizeof(float) * N * C);
    float *w = read_file(join(path, sizeof path, dir, "/w.f32"), sizeof(float) * OC * C);
    float *d = read_file(join(path, sizeof path, dir, "/d.f32"), sizeof(float) * N * OC);
    float *b = read_file(join(path, sizeof path, dir, "/b.f32"), sizeof(float) * OC);
    float *y = malloc(sizeof(float) * N * OC), *dinp = malloc(sizeof(float) * N * C),
          *dw = malloc(sizeof(float) * OC * C), *db = malloc(sizeof(float) * OC);
    /* the weight's fp8 copy, as the optimizer step writes it */
    int e = fp8_weight_tile(scaling);
    uint8_t *w8 = malloc((size_t)OC * C);
    float *w_scales = malloc(fp8_scale_count(OC, C, e, e) * sizeof(float));
    const struct ops *o = ops_cpu();
    struct ops_ctx *cx = test_cpu_open();
    o->quantize_fp8(cx, w8, w_scales, w, OC, C, e, e, FP8_E4M3);
    o->matmul_forward_fp8(cx, y, x, w8, w_scales, b, N, C, OC, scaling);
    o->matmul_backward_fp8(cx, dinp, dw, db, d, x, w8, w_scales, N, C, OC, false, scaling);
    char msg[256];
    int failed = o->take_error(cx, msg, sizeof msg);
    o->close(cx);
    if (failed) {
        fprintf(stderr, "test_fp8: %s\n", msg);
        return 2;
    }
    write_file(join(path, sizeof path, dir, "/y.out"), y, sizeof(float) * N * OC);
    write_file(join(path, sizeof path, dir, "/dinp.out"), dinp, sizeof(float) * N * C);
    write_file(join(path, sizeof path, dir, "/dw.out"), dw, sizeof(float) * OC * C);
    free(x), free(w), free(d), free(b), free(y), free(dinp), free(dw), free(db);
    free(w8), free(w_scales);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 9 && strcmp(argv[1], "quantize") == 0) return drive_quantize(argv);
    if (argc == 7 && strcmp(argv[1], "matmul") == 0) return drive_matmul(argv);
    if (argc != 1) {
        fprintf(stderr, "usage: test_fp8 [quantize IN OUT rows cols tile_rows tile_cols "
                        "e4m3|e5m2 | matmul DIR N C OC tensor|block]\n");
        return 2;
    }
    RUN(test_every_code_decodes_and_encodes_back);
    RUN(test_rounding_saturation_and_nan);
    RUN(test_scale_rules);
    RUN(test_tiles_at_the_edges);
    RUN(test_threads_do_not_change_the_result);
    RUN(test_block_scales_reach_cublaslt_as_it_reads_them);
    return check_exit_code();
}
