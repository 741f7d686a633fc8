/* gpt2_layout.c — GPT-2 tensor sizes and offsets in llm.c order, names,
 * weight-decay membership. Initialisation and loading are runtime/gpt2.c's. */
#include "common/gpt2/gpt2_layout.h"

#include <stdint.h>

#include "common/checked.h"

const char *const gpt2_tensor_names[GPT2_TENSORS] = {
    "wte",  "wpe",  "ln1w", "ln1b", "qkvw",    "qkvb",    "attprojw", "attprojb",
    "ln2w", "ln2b", "fcw",  "fcb",  "fcprojw", "fcprojb", "lnfw",     "lnfb",
};

struct gpt2_config gpt2_config_of_plan(const struct plan_model *m)
{
    return (struct gpt2_config){.max_seq_len = m->max_seq_len,
                                .vocab = m->vocab,
                                .padded_vocab = m->padded_vocab,
                                .layers = m->layers,
                                .heads = m->heads,
                                .hidden = m->hidden};
}

int gpt2_layout(const struct gpt2_config *cfg, struct gpt2_layout *out)
{
    long long C = cfg->hidden, L = cfg->layers;
    size_t *e = out->elems;
    bool ok = ck_size(&e[GPT2_WTE], cfg->padded_vocab, C) &&
              ck_size(&e[GPT2_WPE], cfg->max_seq_len, C) && ck_size(&e[GPT2_LN1W], L, C) &&
              ck_size(&e[GPT2_QKVW], L, 3, C, C) && ck_size(&e[GPT2_QKVB], L, 3, C) &&
              ck_size(&e[GPT2_ATTPROJW], L, C, C) && ck_size(&e[GPT2_FCW], L, 4, C, C);
    e[GPT2_LN1B] = e[GPT2_ATTPROJB] = e[GPT2_LN2W] = e[GPT2_LN2B] = e[GPT2_FCPROJB] = e[GPT2_LN1W];
    e[GPT2_FCB] = 4 * e[GPT2_LN1W]; /* ≤ e[GPT2_FCW] */
    e[GPT2_FCPROJW] = e[GPT2_FCW];
    e[GPT2_LNFW] = e[GPT2_LNFB] = (size_t)C;
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
           t == GPT2_FCW || t == GPT2_FCPROJW;
}
