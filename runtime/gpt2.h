/* gpt2.h — the GPT-2 parameters: their shapes and order (llm.c's, so llm.c
 * checkpoints load by a straight read), which ones take weight decay, GPT-2
 * initialisation, and loading an llm.c checkpoint. Activations and the maths
 * are in model.h. */
#ifndef PLAIT_RUNTIME_GPT2_H
#define PLAIT_RUNTIME_GPT2_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

struct gpt2_config {
    int max_seq_len;  /* maxT, rows of wpe */
    int vocab;        /* V */
    int padded_vocab; /* Vp, rows of wte */
    int layers;       /* L */
    int heads;        /* NH */
    int hidden;       /* C */
};

/* In llm.c order; per-layer tensors are stacked over layers. */
enum gpt2_tensor {
    GPT2_WTE,      /* (Vp, C) */
    GPT2_WPE,      /* (maxT, C) */
    GPT2_LN1W,     /* (L, C) */
    GPT2_LN1B,     /* (L, C) */
    GPT2_QKVW,     /* (L, 3C, C) */
    GPT2_QKVB,     /* (L, 3C) */
    GPT2_ATTPROJW, /* (L, C, C) */
    GPT2_ATTPROJB, /* (L, C) */
    GPT2_LN2W,     /* (L, C) */
    GPT2_LN2B,     /* (L, C) */
    GPT2_FCW,      /* (L, 4C, C) */
    GPT2_FCB,      /* (L, 4C) */
    GPT2_FCPROJW,  /* (L, C, 4C) */
    GPT2_FCPROJB,  /* (L, C) */
    GPT2_LNFW,     /* (C) */
    GPT2_LNFB,     /* (C) */
    GPT2_TENSORS
};

struct gpt2_layout {
    size_t elems[GPT2_TENSORS];  /* elements of each tensor (all layers) */
    size_t offset[GPT2_TENSORS]; /* element offset in the flat parameter buffer */
    size_t total;                /* all parameters */
};

void gpt2_layout(const struct gpt2_config *cfg, struct gpt2_layout *out);

extern const char *const gpt2_tensor_names[GPT2_TENSORS];

/* AdamW weight decay applies to the 2-D matrices only. */
bool gpt2_tensor_decays(enum gpt2_tensor t);

/* GPT-2 initialisation into a host buffer of layout->total floats: normal
 * σ=0.02, residual projections σ=0.02/√(2L), zero biases, unit LayerNorm,
 * padded vocabulary rows zero. */
void gpt2_init_weights(const struct gpt2_config *cfg, const struct gpt2_layout *layout,
                       float *params, uint64_t seed);

/* Reads an llm.c GPT-2 checkpoint (fp32 or bf16) whose header must match cfg
 * into a host buffer of the layout's size; *crc gets the CRC-32C of the whole
 * file when crc is not NULL. */
int gpt2_read_llmc(const char *path, const struct gpt2_config *cfg, float *params, uint32_t *crc,
                   struct plait_error *err);

/* Model FLOPs per token of one training step (6·N + 12·L·C·T, N without the
 * position table), the numerator of "% of peak". */
double gpt2_flops_per_token(const struct gpt2_config *cfg, int seq_len);

#endif
