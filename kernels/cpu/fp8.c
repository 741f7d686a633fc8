/* fp8.c — the FP8 quantiser of kernels/fp8.h on the CPU: the E4M3 and E5M2
 * casts (round to nearest even, saturating, on the fp32 bit pattern), the
 * scale of a tile from its amax, and quantising/dequantising a matrix in
 * tiles. The emulated fp8 matrix products that use it are in ops_cpu.c. */
#include "kernels/fp8.h"

#include <float.h>
#include <math.h>
#include <string.h>

/* What differs between the two formats. */
struct fmt {
    int mant_bits;     /* M */
    int bias;          /* exponent bias */
    uint8_t max_code;  /* the largest finite magnitude's code */
    float max;         /* its value */
    float min_normal;  /* 2^(1 - bias) */
    float subnormal_q; /* 2^(M - 1 + bias): |x| · this counts the subnormal steps */
};

static const struct fmt formats[] = {
    [FP8_E4M3] = {3, 7, 0x7e, 448.0f, 0x1p-6f, 0x1p9f},
    [FP8_E5M2] = {2, 15, 0x7b, 57344.0f, 0x1p-14f, 0x1p16f},
};

#define NAN_CODE 0x7f /* the canonical NaN of both formats (sign dropped, as cvt does) */

float fp8_max(enum fp8_format fmt)
{
    return formats[fmt].max;
}

uint8_t fp8_encode(float x, enum fp8_format fmt)
{
    const struct fmt *f = &formats[fmt];
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    u &= 0x7fffffffu;
    if (u > 0x7f800000u) return NAN_CODE;
    float a;
    memcpy(&a, &u, sizeof a);
    if (a >= f->max) return sign | f->max_code; /* saturate (infinity too) */
    if (a < f->min_normal) /* a subnormal (or zero): count steps of 2^(1-bias-M), exactly scaled */
        return sign | (uint8_t)rintf(a * f->subnormal_q); /* 2^M steps is the smallest normal */
    int shift = 23 - f->mant_bits;
    uint32_t r = (u + (1u << (shift - 1)) - 1u + ((u >> shift) & 1u)) >> shift;
    uint32_t code = r - ((uint32_t)(127 - f->bias) << f->mant_bits);
    return sign | (uint8_t)(code > f->max_code ? f->max_code : code);
}

float fp8_decode(uint8_t code, enum fp8_format fmt)
{
    const struct fmt *f = &formats[fmt];
    int M = f->mant_bits;
    uint32_t e = (code & 0x7fu) >> M, m = code & ((1u << M) - 1u);
    uint32_t sign = (uint32_t)(code & 0x80u) << 24;
    float v;
    if (fmt == FP8_E4M3 && (code & 0x7fu) == 0x7fu) return NAN;
    if (fmt == FP8_E5M2 && e == 31) {
        if (m) return NAN;
        v = INFINITY;
    } else if (e == 0) {
        v = (float)m / f->subnormal_q; /* a power of two: exact */
    } else {
        uint32_t bits = ((e - (uint32_t)f->bias + 127u) << 23) | (m << (23 - M));
        memcpy(&v, &bits, sizeof v);
    }
    uint32_t out;
    memcpy(&out, &v, sizeof out);
    out |= sign;
    memcpy(&v, &out, sizeof v);
    return v;
}

float fp8_scale(float amax, enum fp8_format fmt)
{
    if (!(amax > 0.0f) || !isfinite(amax)) return 1.0f;
    float s = formats[fmt].max / amax;
    return isinf(s) ? FLT_MAX : s;
}

size_t fp8_scale_count(int rows, int cols, int tile_rows, int tile_cols)
{
    size_t tr = tile_rows > 0 ? (size_t)tile_rows : (size_t)(rows > 0 ? rows : 1);
    size_t tc = tile_cols > 0 ? (size_t)tile_cols : (size_t)(cols > 0 ? cols : 1);
    return (((size_t)rows + tr - 1) / tr) * (((size_t)cols + tc - 1) / tc);
}

/* A tiling resolved: tile edges (0 = whole) made concrete, tile counts. */
struct tiling {
    size_t rows, cols, tr, tc, nbr, nbc;
};

static struct tiling tiling(int rows, int cols, int tile_rows, int tile_cols)
{
    struct tiling t = {.rows = (size_t)rows, .cols = (size_t)cols};
    t.tr = tile_rows > 0 ? (size_t)tile_rows : (rows > 0 ? t.rows : 1);
    t.tc = tile_cols > 0 ? (size_t)tile_cols : (cols > 0 ? t.cols : 1);
    t.nbr = (t.rows + t.tr - 1) / t.tr;
    t.nbc = (t.cols + t.tc - 1) / t.tc;
    return t;
}

/* amax (nbr, nbc) of each tile; NaN never wins a comparison, so it is ignored.
 * A maximum does not depend on the order: the result is the same for any
 * thread count. */
static void tile_amax(float *amax, const float *x, const struct tiling *t)
{
    if (t->nbr * t->nbc == 1) {
        size_t n = t->rows * t->cols;
        float m = 0.0f;
#pragma omp parallel for reduction(max : m) schedule(static)
        for (size_t i = 0; i < n; i++) {
            float a = fabsf(x[i]);
            if (a > m) m = a;
        }
        amax[0] = m;
        return;
    }
    long tiles = (long)(t->nbr * t->nbc);
#pragma omp parallel for schedule(static)
    for (long k = 0; k < tiles; k++) {
        size_t br = (size_t)k / t->nbc, bc = (size_t)k % t->nbc;
        size_t r1 = br * t->tr + t->tr, c0 = bc * t->tc, c1 = c0 + t->tc;
        if (r1 > t->rows) r1 = t->rows;
        if (c1 > t->cols) c1 = t->cols;
        float m = 0.0f;
        for (size_t r = br * t->tr; r < r1; r++)
            for (size_t c = c0; c < c1; c++) {
                float a = fabsf(x[r * t->cols + c]);
                if (a > m) m = a;
            }
        amax[k] = m;
    }
}

void fp8_quantize(uint8_t *q, float *scales, const float *x, int rows, int cols, int tile_rows,
                  int tile_cols, enum fp8_format fmt)
{
    struct tiling t = tiling(rows, cols, tile_rows, tile_cols);
    tile_amax(scales, x, &t);
    for (size_t k = 0; k < t.nbr * t.nbc; k++) scales[k] = fp8_scale(scales[k], fmt);
#pragma omp parallel for schedule(static)
    for (size_t r = 0; r < t.rows; r++) {
        const float *s = scales + (r / t.tr) * t.nbc;
        for (size_t bc = 0, c0 = 0; bc < t.nbc; bc++, c0 += t.tc) {
            size_t c1 = c0 + t.tc < t.cols ? c0 + t.tc : t.cols;
            for (size_t c = c0; c < c1; c++)
                q[r * t.cols + c] = fp8_encode(x[r * t.cols + c] * s[bc], fmt);
        }
    }
}

void fp8_dequantize(float *x, const uint8_t *q, const float *scales, int rows, int cols,
                    int tile_rows, int tile_cols, enum fp8_format fmt)
{
    struct tiling t = tiling(rows, cols, tile_rows, tile_cols);
    float table[256];
    for (int c = 0; c < 256; c++) table[c] = fp8_decode((uint8_t)c, fmt);
#pragma omp parallel for schedule(static)
    for (size_t r = 0; r < t.rows; r++) {
        const float *s = scales ? scales + (r / t.tr) * t.nbc : NULL;
        for (size_t bc = 0, c0 = 0; bc < t.nbc; bc++, c0 += t.tc) {
            size_t c1 = c0 + t.tc < t.cols ? c0 + t.tc : t.cols;
            if (s)
                for (size_t c = c0; c < c1; c++)
                    x[r * t.cols + c] = table[q[r * t.cols + c]] / s[bc];
            else
                for (size_t c = c0; c < c1; c++) x[r * t.cols + c] = table[q[r * t.cols + c]];
        }
    }
}
