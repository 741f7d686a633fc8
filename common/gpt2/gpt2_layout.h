/* gpt2_layout.h — the parameters of the GPT family plait trains, GPT-2 and
 * Llama, as llm.c lays out GPT-2's: their shapes, their order in one flat
 * buffer (so llm.c checkpoints load by a straight read), their names and which
 * take weight decay. The one place that counts parameters; the maths is the
 * runtime's (runtime/model.h).
 *
 * A Llama (transformers' LlamaForCausalLM) fills the same tensors: ln1w and
 * ln2w are its RMSNorms' weights, qkvw packs q_proj, k_proj and v_proj
 * ([q: NH heads; k: KV heads; v: KV heads] rows), attprojw is o_proj, fcw
 * packs gate_proj and up_proj ([gate; up] rows), fcprojw is down_proj, lnfw
 * the final norm, lmhead the untied lm_head. A tensor an architecture does
 * not have (a Llama's biases and wpe, a tied model's lmhead) has no
 * elements. */
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
    /* Zero in all of these is GPT-2's values (a struct filled for GPT-2 needs none) */
    bool llama;        /* RMSNorm, rotary positions, SwiGLU, no biases, no wpe */
    int kv_heads;      /* KV, key/value heads (0: NH) */
    int ffn_hidden;    /* F, the MLP's width (0: 4C) */
    bool untied;       /* the LM head is a tensor of its own (lmhead), not wte */
    double rope_theta; /* llama */
    float norm_eps;    /* llama's RMSNorm */
    /* Mixture of experts (plan.h struct plan_moe; experts 0: a dense model): layer l's
     * MLP is an MoE block when l % moe_every == moe_every - 1 */
    int experts;        /* E routed experts */
    int top_k;          /* k */
    int moe_every;      /* an MoE block every this many layers */
    int shared_experts; /* S, after the routed ones in the expert tensors */
    int moe_ffn;        /* Fm, each expert's MLP width */
};

/* Whether a and b have the same tensors of the same shapes (the vocabulary,
 * rotary base and epsilon aside). */
bool gpt2_config_same_tensors(const struct gpt2_config *a, const struct gpt2_config *b);

/* KV and F, with GPT-2's defaults for zeros. */
int gpt2_kv_heads(const struct gpt2_config *cfg);
long long gpt2_ffn(const struct gpt2_config *cfg);
/* The weights of one layer's four products (a forward costs 2 FLOPs each a
 * token): 12C² for GPT-2, C·((NH+2KV)·hs + C + 3F) for a Llama; with mixture of
 * experts the mean over the layers of those a token is multiplied by, an MoE
 * layer's MLP being its router and k + S experts (the active weights). */
double gpt2_layer_product_weights(const struct gpt2_config *cfg);

/* Mixture of experts: the expert parameters a token does not pass through (the
 * E − k routed experts it is not sent to, in every MoE layer); 0 for a dense model.
 * The active parameters are the total less these. */
double gpt2_inactive_expert_params(const struct gpt2_config *cfg);

/* Rows of qkvw's one layer: (NH + 2·KV)·hs; of fcw's: 2F (gate and up) or F. */
long long gpt2_qkv_rows(const struct gpt2_config *cfg);
long long gpt2_fc_rows(const struct gpt2_config *cfg);

/* Mixture of experts: whether the model has MoE blocks, whether layer l's MLP is one,
 * the model's MoE layers (Lm) and those before layer l, and an expert's fc rows (2Fm
 * for a Llama's gate and up, else Fm). */
bool gpt2_moe(const struct gpt2_config *cfg);
bool gpt2_layer_moe(const struct gpt2_config *cfg, int l);
int gpt2_moe_layers(const struct gpt2_config *cfg);
int gpt2_moe_layers_before(const struct gpt2_config *cfg, int l);
long long gpt2_expert_fc_rows(const struct gpt2_config *cfg);

/* The dimensions a plan's model section gives. */
struct gpt2_config gpt2_config_of_plan(const struct plan_model *m);

/* In llm.c order; per-layer tensors are stacked over layers. */
enum gpt2_tensor {
    GPT2_WTE,      /* (Vp, C) */
    GPT2_WPE,      /* (maxT, C) */
    GPT2_LN1W,     /* (L, C) */
    GPT2_LN1B,     /* (L, C) */
    GPT2_QKVW,     /* (L, 3C, C); llama (L, (NH+2KV)·hs, C) */
    GPT2_QKVB,     /* (L, 3C) */
    GPT2_ATTPROJW, /* (L, C, C) */
    GPT2_ATTPROJB, /* (L, C) */
    GPT2_LN2W,     /* (L, C) */
    GPT2_LN2B,     /* (L, C) */
    GPT2_FCW,      /* (L, 4C, C); llama (L, 2F, C) */
    GPT2_FCB,      /* (L, 4C) */
    GPT2_FCPROJW,  /* (L, C, 4C); llama (L, C, F) */
    GPT2_FCPROJB,  /* (L, C) */
    GPT2_LNFW,     /* (C) */
    GPT2_LNFB,     /* (C) */
    GPT2_LMHEAD,   /* (Vp, C) untied only */
    /* mixture of experts (none in a dense model), Lm its MoE layers, whose MLP
     * tensors above hold no instance (those hold the L - Lm other layers'); the
     * S shared experts follow the E routed ones */
    GPT2_ROUTERW,  /* (Lm, E, C) the router, no bias */
    GPT2_EXPFCW,   /* (Lm, E+S, Fm, C); llama (Lm, E+S, 2Fm, C) gate and up */
    GPT2_EXPFCB,   /* (Lm, E+S, Fm) gpt2 only */
    GPT2_EXPPROJW, /* (Lm, E+S, C, Fm) */
    GPT2_EXPPROJB, /* (Lm, E+S, C) gpt2 only */
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

/* AdamW weight decay applies to the 2-D matrices only (the router's and experts' too). */
bool gpt2_tensor_decays(enum gpt2_tensor t);

/* Whether layer l has an instance of per-layer tensor t: the dense MLP's in a
 * layer without an MoE block, the router's and experts' in one with, the rest
 * in every layer. */
bool gpt2_tensor_in_layer(const struct gpt2_config *cfg, enum gpt2_tensor t, int l);
/* The layers in [0, l) with an instance of per-layer tensor t. */
int gpt2_tensor_layers_before(const struct gpt2_config *cfg, enum gpt2_tensor t, int l);

#endif
