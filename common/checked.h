/* checked.h — sizes and counts computed without silent wrap-around. Every
 * product that sizes an allocation, a file or a rank count goes through these:
 * they return false (and leave *out alone) when the exact result does not fit,
 * so the caller can refuse with the field named instead of allocating 0 bytes. */
#ifndef PLAIT_CHECKED_H
#define PLAIT_CHECKED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* *out = a · b (size_t). */
static inline bool ck_mul(size_t a, size_t b, size_t *out)
{
    size_t r;
    if (__builtin_mul_overflow(a, b, &r)) return false;
    *out = r;
    return true;
}

/* *out = a + b (size_t). */
static inline bool ck_add(size_t a, size_t b, size_t *out)
{
    size_t r;
    if (__builtin_add_overflow(a, b, &r)) return false;
    *out = r;
    return true;
}

/* *out = the product of n factors (size_t); a negative factor is a failure. */
static inline bool ck_product(size_t *out, int n, const long long *factors)
{
    size_t r = 1;
    for (int i = 0; i < n; i++)
        if (factors[i] < 0 || !ck_mul(r, (size_t)factors[i], &r)) return false;
    *out = r;
    return true;
}

/* ck_size(&out, a, b, ...): the product of its (integer) arguments. */
#define ck_size(out, ...)                                                                          \
    ck_product((out), (int)(sizeof((long long[]){__VA_ARGS__}) / sizeof(long long)),               \
               (const long long[]){__VA_ARGS__})

/* *out = a · b (int64_t). */
static inline bool ck_mul_i64(int64_t a, int64_t b, int64_t *out)
{
    int64_t r;
    if (__builtin_mul_overflow(a, b, &r)) return false;
    *out = r;
    return true;
}

#endif
