/* gpt2_layout.c — GPT-2 tensor sizes and offsets in llm.c order, names,
 * weight-decay membership. Initialisation and loading are runtime/gpt2.c's. */
#include "common/gpt2_layout.h"

const char *const gpt2_tensor_names[GPT2_TENSORS] = {
    "wte",  "wpe",  "ln1w", "ln1b", "qkvw",    "qkvb",    "attprojw", "attprojb",
    "ln2w", "ln2b", "fcw",  "fcb",  "fcprojw", "fcprojb", "lnfw",     "lnfb",
};

void gpt2_layout(const struct gpt2_config *cfg, struct gpt2_layout *out)
{
    size_t C = (size_t)cfg->hidden, L = (size_t)cfg->layers;
    size_t *e = out->elems;
    e[GPT2_WTE] = (size_t)cfg->padded_vocab * C;
    e[GPT2_WPE] = (size_t)cfg->max_seq_len * C;
    e[GPT2_LN1W] = e[GPT2_LN1B] = L * C;
    e[GPT2_QKVW] = L * 3 * C * C;
    e[GPT2_QKVB] = L * 3 * C;
    e[GPT2_ATTPROJW] = L * C * C;
    e[GPT2_ATTPROJB] = L * C;
    e[GPT2_LN2W] = e[GPT2_LN2B] = L * C;
    e[GPT2_FCW] = L * 4 * C * C;
    e[GPT2_FCB] = L * 4 * C;
    e[GPT2_FCPROJW] = L * C * 4 * C;
    e[GPT2_FCPROJB] = L * C;
    e[GPT2_LNFW] = e[GPT2_LNFB] = C;
    out->total = 0;
    for (int t = 0; t < GPT2_TENSORS; t++) {
        out->offset[t] = out->total;
        out->total += e[t];
    }
}

bool gpt2_tensor_decays(enum gpt2_tensor t)
{
    return t == GPT2_WTE || t == GPT2_WPE || t == GPT2_QKVW || t == GPT2_ATTPROJW ||
           t == GPT2_FCW || t == GPT2_FCPROJW;
}
