/* gpt2_layout.c — GPT-2 tensor sizes and offsets in llm.c order, names,
 * weight-decay membership. Initialisation and loading are runtime/gpt2.c's. */
#include "common/gpt2/gpt2_layout.h"

#include <stdint.h>

#include "common/checked.h"

const char *const gpt2_tensor_names[GPT2_TENSORS] = {
    "wte",    "wpe",     "ln1w",   "ln1b",   "qkvw",     "qkvb",     "attprojw", "attprojb",
    "ln2w",   "ln2b",    "fcw",    "fcb",    "fcprojw",  "fcprojb",  "lnfw",     "lnfb",
    "lmhead", "routerw", "expfcw", "expfcb", "expprojw", "expprojb",
};

struct gpt2_config gpt2_config_of_plan(const struct plan_model *m)
{
    bool llama = plan_model_is_llama(m);
    return (struct gpt2_config){.max_seq_len = m->max_seq_len,
                                .vocab = m->vocab,
                                .padded_vocab = m->padded_vocab,
                                .layers = m->layers,
                                .heads = m->heads,
                                .hidden = m->hidden,
                                .llama = llama,
                                .kv_heads = llama ? m->kv_heads : 0,
                                .ffn_hidden = llama ? m->ffn_hidden : 0,
                                .untied = llama && !m->tie_embeddings,
                                .rope_theta = llama ? m->rope_theta : 0,
                                .norm_eps = llama ? (float)m->norm_eps : 0,
                                .experts = m->moe.given ? m->moe.experts : 0,
                                .top_k = m->moe.given ? m->moe.top_k : 0,
                                .moe_every = m->moe.given ? m->moe.every : 0,
                                .shared_experts = m->moe.given ? m->moe.shared_experts : 0,
                                .moe_ffn = m->moe.given ? m->moe.ffn_hidden : 0};
}

bool gpt2_moe(const struct gpt2_config *cfg)
{
    return cfg->experts > 0;
}

bool gpt2_layer_moe(const struct gpt2_config *cfg, int l)
{
    return gpt2_moe(cfg) && l % cfg->moe_every == cfg->moe_every - 1;
}

int gpt2_moe_layers_before(const struct gpt2_config *cfg, int l)
{
    return gpt2_moe(cfg) ? l / cfg->moe_every : 0;
}

int gpt2_moe_layers(const struct gpt2_config *cfg)
{
    return gpt2_moe_layers_before(cfg, cfg->layers);
}

long long gpt2_expert_fc_rows(const struct gpt2_config *cfg)
{
    return (cfg->llama ? 2LL : 1LL) * cfg->moe_ffn;
}

/* The dense MLP's tensors, and the MoE block's. */
static bool dense_mlp(enum gpt2_tensor t)
{
    return t == GPT2_FCW || t == GPT2_FCB || t == GPT2_FCPROJW || t == GPT2_FCPROJB;
}

static bool moe_block(enum gpt2_tensor t)
{
    return t >= GPT2_ROUTERW && t <= GPT2_EXPPROJB;
}

bool gpt2_tensor_in_layer(const struct gpt2_config *cfg, enum gpt2_tensor t, int l)
{
    if (dense_mlp(t)) return !gpt2_layer_moe(cfg, l);
    if (moe_block(t)) return gpt2_layer_moe(cfg, l);
    return true;
}

int gpt2_tensor_layers_before(const struct gpt2_config *cfg, enum gpt2_tensor t, int l)
{
    int moe = gpt2_moe_layers_before(cfg, l);
    if (dense_mlp(t)) return l - moe;
    if (moe_block(t)) return moe;
    return l;
}

bool gpt2_config_same_tensors(const struct gpt2_config *a, const struct gpt2_config *b)
{
    return a->max_seq_len == b->max_seq_len && a->padded_vocab == b->padded_vocab &&
           a->layers == b->layers && a->heads == b->heads && a->hidden == b->hidden &&
           a->llama == b->llama && gpt2_kv_heads(a) == gpt2_kv_heads(b) &&
           gpt2_ffn(a) == gpt2_ffn(b) && a->untied == b->untied && a->experts == b->experts &&
           (!gpt2_moe(a) || (a->moe_every == b->moe_every &&
                             a->shared_experts == b->shared_experts && a->moe_ffn == b->moe_ffn));
}

int gpt2_kv_heads(const struct gpt2_config *cfg)
{
    return cfg->kv_heads ? cfg->kv_heads : cfg->heads;
}

long long gpt2_ffn(const struct gpt2_config *cfg)
{
    return cfg->ffn_hidden ? cfg->ffn_hidden : 4LL * cfg->hidden;
}

long long gpt2_qkv_rows(const struct gpt2_config *cfg)
{
    if (!cfg->llama || !cfg->kv_heads) return 3LL * cfg->hidden; /* GPT-2: q, k, v of C each */
    long long hs = cfg->hidden / cfg->heads;
    return ((long long)cfg->heads + 2LL * gpt2_kv_heads(cfg)) * hs;
}

double gpt2_layer_product_weights(const struct gpt2_config *cfg)
{
    double C = cfg->hidden, L = cfg->layers, Lm = gpt2_moe_layers(cfg);
    double attention = C * ((double)gpt2_qkv_rows(cfg) + C);
    double dense = C * ((double)gpt2_fc_rows(cfg) + (double)gpt2_ffn(cfg));
    double expert = C * ((double)gpt2_expert_fc_rows(cfg) + cfg->moe_ffn);
    double moe = C * cfg->experts + (double)(cfg->top_k + cfg->shared_experts) * expert;
    return attention + (Lm > 0 ? ((L - Lm) * dense + Lm * moe) / L : dense);
}

double gpt2_inactive_expert_params(const struct gpt2_config *cfg)
{
    struct gpt2_layout l;
    if (!gpt2_moe(cfg) || gpt2_layout(cfg, &l)) return 0;
    double experts = (double)l.elems[GPT2_EXPFCW] + (double)l.elems[GPT2_EXPFCB] +
                     (double)l.elems[GPT2_EXPPROJW] + (double)l.elems[GPT2_EXPPROJB];
    return experts * (cfg->experts - cfg->top_k) / (cfg->experts + cfg->shared_experts);
}

long long gpt2_fc_rows(const struct gpt2_config *cfg)
{
    return (cfg->llama ? 2LL : 1LL) * gpt2_ffn(cfg);
}

/* The router's and experts' tensors of Lm MoE layers (none in a dense model). */
static bool moe_elems(const struct gpt2_config *cfg, size_t *e)
{
    long long C = cfg->hidden, Lm = gpt2_moe_layers(cfg), X = cfg->experts + cfg->shared_experts;
    long long bias = cfg->llama ? 0 : 1, Fm = cfg->moe_ffn;
    return ck_size(&e[GPT2_ROUTERW], Lm, cfg->experts, C) &&
           ck_size(&e[GPT2_EXPFCW], Lm, X, gpt2_expert_fc_rows(cfg), C) &&
           ck_size(&e[GPT2_EXPFCB], bias, Lm, X, Fm) && ck_size(&e[GPT2_EXPPROJW], Lm, X, C, Fm) &&
           ck_size(&e[GPT2_EXPPROJB], bias, Lm, X, C);
}

int gpt2_layout(const struct gpt2_config *cfg, struct gpt2_layout *out)
{
    long long C = cfg->hidden, L = cfg->layers, F = gpt2_ffn(cfg);
    long long Ld = L - gpt2_moe_layers(cfg); /* the layers with the dense MLP */
    long long bias = cfg->llama ? 0 : 1; /* a Llama has no biases, no wpe */
    size_t *e = out->elems;
    bool ok = moe_elems(cfg, e) && ck_size(&e[GPT2_WTE], cfg->padded_vocab, C) &&
              ck_size(&e[GPT2_WPE], bias, cfg->max_seq_len, C) && ck_size(&e[GPT2_LN1W], L, C) &&
              ck_size(&e[GPT2_QKVW], L, gpt2_qkv_rows(cfg), C) &&
              ck_size(&e[GPT2_QKVB], bias, L, gpt2_qkv_rows(cfg)) &&
              ck_size(&e[GPT2_ATTPROJW], L, C, C) &&
              ck_size(&e[GPT2_FCW], Ld, gpt2_fc_rows(cfg), C) &&
              ck_size(&e[GPT2_FCB], bias, Ld, F) && ck_size(&e[GPT2_FCPROJW], Ld, C, F) &&
              ck_size(&e[GPT2_LMHEAD], cfg->untied, cfg->padded_vocab, C);
    e[GPT2_LN2W] = e[GPT2_LN1W];
    e[GPT2_LN1B] = e[GPT2_ATTPROJB] = e[GPT2_LN2B] = bias ? e[GPT2_LN1W] : 0;
    ok = ok && ck_size(&e[GPT2_FCPROJB], bias, Ld, C);
    e[GPT2_LNFW] = (size_t)C;
    e[GPT2_LNFB] = bias ? (size_t)C : 0;
    out->total = 0;
    for (int t = 0; t < GPT2_TENSORS; t++) {
        out->offset[t] = out->total;
        ok = ok && ck_add(out->total, e[t], &out->total);
    }
    /* parameters, gradients and two moments in fp32 must be addressable */
    if (ok && out->total <= SIZE_MAX / 16) return 0;
    out->total = SIZE_MAX;
    return -1;
}

bool gpt2_tensor_decays(enum gpt2_tensor t)
{
    return t == GPT2_WTE || t == GPT2_WPE || t == GPT2_QKVW || t == GPT2_ATTPROJW ||
           t == GPT2_FCW || t == GPT2_FCPROJW || t == GPT2_LMHEAD || t == GPT2_ROUTERW ||
           t == GPT2_EXPFCW || t == GPT2_EXPPROJW;
}
