/* gpt2_layout.h — the GPT-2 parameters as llm.c lays them out: their shapes,
 * their order in one flat buffer (so llm.c checkpoints load by a straight
 * read), their names and which take weight decay. The one place that counts
 * parameters; the maths is the runtime's (runtime/model.h). */
#ifndef PLAIT_GPT2_LAYOUT_H
#define PLAIT_GPT2_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>

#include "common/plan/plan.h"

struct gpt2_config {
    int max_seq_len;  /* maxT, rows of wpe */
    int vocab;        /* V */
    int padded_vocab; /* Vp, rows of wte */
    int layers;       /* L */
    int heads;        /* NH */
    int hidden;       /* C */
};

/* The dimensions a plan's model section gives. */
struct gpt2_config gpt2_config_of_plan(const struct plan_model *m);

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

/* Fills out; -1 (and total = SIZE_MAX) when a size does not fit in size_t or
 * the parameters, gradients and two moments in fp32 (16 bytes each) would not
 * be addressable. The plan refuses such models, naming the field. */
int gpt2_layout(const struct gpt2_config *cfg, struct gpt2_layout *out);

extern const char *const gpt2_tensor_names[GPT2_TENSORS];

/* AdamW weight decay applies to the 2-D matrices only. */
bool gpt2_tensor_decays(enum gpt2_tensor t);

#endif
