/* gpt2.h — GPT-2 parameters at run time: initialisation, loading an llm.c
 * checkpoint (model FLOPs: common/place/gpu.h). Their layout is common/gpt2/gpt2_layout.h; activations
 * and the maths are in model.h. */
#ifndef PLAIT_RUNTIME_GPT2_H
#define PLAIT_RUNTIME_GPT2_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "common/gpt2/gpt2_layout.h"
#include "common/gpt2/gpt2_shard.h"

/* GPT-2 initialisation into a host buffer of layout->total floats: normal
 * σ=0.02, residual projections σ=0.02/√(2L), zero biases, unit LayerNorm,
 * padded vocabulary rows zero. */
void gpt2_init_weights(const struct gpt2_config *cfg, const struct gpt2_layout *layout,
                       float *params, uint64_t seed);

/* The same initialisation for elements [lo, hi) of a shard's layer-major
 * buffer alone (zeros past the shard's end: ZeRO's padding), into out (hi -
 * lo floats): the values gpt2_init_weights then gpt2_shard_copy give, to the
 * bit, without the whole model in memory (each tensor's random stream is
 * drawn through once, its values kept where the range needs them). */
int gpt2_init_shard_range(const struct gpt2_shard *s, size_t lo, size_t hi, float *out,
                          uint64_t seed, struct plait_error *err);

/* Reads an llm.c GPT-2 checkpoint (fp32 or bf16) whose header must match cfg
 * into a host buffer of the layout's size; *crc gets the CRC-32C of the whole
 * file when crc is not NULL. */
int gpt2_read_llmc(const char *path, const struct gpt2_config *cfg, float *params, uint32_t *crc,
                   struct plait_error *err);

#endif
