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
    return check_exit_code();
}
