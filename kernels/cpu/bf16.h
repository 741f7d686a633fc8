/* bf16.h — one float rounded to bf16 (the bit pattern), inline so that loops
 * that produce floats can write their bf16 copy in the same pass. */
#ifndef PLAIT_KERNELS_CPU_BF16_H
#define PLAIT_KERNELS_CPU_BF16_H

#include <stdint.h>
#include <string.h>

/* Round to nearest even on the bit pattern. A NaN keeps its sign and top payload
 * bits and is made quiet, so that it cannot round into infinity. (Not the
 * AVX512_BF16 instruction: that one flushes subnormals to zero.) */
static inline uint16_t bf16_round(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    uint32_t quiet_nan = (x >> 16) | 0x40u;
    return (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

#endif
