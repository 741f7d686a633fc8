/* vmath.h — exp and tanh for float that the compiler can vectorise (libm's
 * expf/tanhf are scalar calls): no branches, no calls. Accuracy: exp within 2
 * ulp on [-87.3, 88] (inputs are clamped to that range), tanh within 2e-7
 * absolute, which is what GELU and softmax need. The double kernels (the
 * finite-difference tests) use libm instead. */
#ifndef PLAIT_KERNELS_CPU_VMATH_H
#define PLAIT_KERNELS_CPU_VMATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* nvcc compiles them for the device too: kernels/cuda/moe.cu's router takes
 * the CPU's exp, bit for bit */
#ifdef __CUDACC__
#define VMATH_FN static inline __host__ __device__
#else
#define VMATH_FN static inline
#endif

/* e^x: x = n·ln2 + r with |r| ≤ ln2/2, e^r by Cephes' degree-6 polynomial, 2^n
 * through the exponent bits. */
VMATH_FN float vexpf(float x)
{
    float nan = x; /* NaN in, NaN out; the integer path below sees 0 instead (no UB) */
    x = x == x ? x : 0.0f;
    x = x < -87.33654f ? -87.33654f : x; /* (not fminf/fmaxf: they do not vectorise) */
    x = x > 88.0f ? 88.0f : x;
    const float round = 12582912.0f; /* 1.5·2^23: adding it rounds to an integer */
    float n = (x * 1.44269504088896341f + round) - round;
    float r = x - n * 0.693359375f; /* ln2 high part, exact in float */
    r = r - n * -2.12194440e-4f;    /* ln2 low part */
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    uint32_t e = (uint32_t)((int32_t)n + 127) << 23; /* n in [-126, 127] */
    float scale;
    memcpy(&scale, &e, sizeof scale);
    return nan == nan ? p * scale : nan;
}

/* tanh(x) = sign(x)·(1 - e)/(1 + e), e = exp(-2|x|). */
VMATH_FN float vtanhf(float x)
{
    float e = vexpf(-2.0f * fabsf(x));
    return copysignf((1.0f - e) / (1.0f + e), x);
}

#endif
