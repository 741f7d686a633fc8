/* rng.h — the project's random numbers: small, seeded, reproducible on every
 * platform (no rand()). splitmix64 derives seeds; xoshiro256** draws. */
#ifndef PLAIT_RNG_H
#define PLAIT_RNG_H

#include <math.h>
#include <stdint.h>

struct rng {
    uint64_t s[4];
};

static inline uint64_t rng_splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Seeds from any number of words (seed, epoch, shard...). */
static inline void rng_seed(struct rng *r, uint64_t a, uint64_t b)
{
    uint64_t x = a ^ rng_splitmix64(&b);
    for (int i = 0; i < 4; i++) r->s[i] = rng_splitmix64(&x);
}

static inline uint64_t rng_next(struct rng *r)
{
    uint64_t *s = r->s;
    uint64_t x = s[1] * 5, result = ((x << 7) | (x >> 57)) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = (s[3] << 45) | (s[3] >> 19);
    return result;
}

/* Uniform in [0, 1) with 53 random bits. */
static inline double rng_uniform(struct rng *r)
{
    return (double)(rng_next(r) >> 11) * 0x1.0p-53;
}

/* Uniform integer in [0, n), n > 0, without modulo bias. */
static inline uint64_t rng_below(struct rng *r, uint64_t n)
{
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = rng_next(r);
    while (x >= limit);
    return x % n;
}

/* Standard normal (Box-Muller, one value per call). */
static inline double rng_normal(struct rng *r)
{
    double u1 = rng_uniform(r), u2 = rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

#endif
