/* gpt2_experts.c — expert parallelism's cut of the experts' tensors (gpt2_shard.h): which
 * routed experts an ep rank holds, where an element of its instance sits in the instance
 * at ep 1, and which elements of its buffer are a routed expert's. Tensor parallelism's
 * cut within each expert is gpt2_shard.c's. */
#include "common/gpt2/gpt2_shard.h"

static int ep_of(int ep)
{
    return ep < 1 ? 1 : ep;
}

int gpt2_part_experts(const struct gpt2_part *p, const struct gpt2_config *cfg)
{
    return cfg->experts / ep_of(p->ep);
}

bool gpt2_tensor_ep_cut(enum gpt2_tensor t)
{
    return t == GPT2_EXPFCW || t == GPT2_EXPFCB || t == GPT2_EXPPROJW || t == GPT2_EXPPROJB;
}

size_t gpt2_ep_to_all(const struct gpt2_config *cfg, enum gpt2_tensor t, int ep, int ep_rank,
                      size_t i, size_t elems, size_t *all, size_t *run)
{
    size_t E = (size_t)cfg->experts, S = (size_t)cfg->shared_experts;
    if (!gpt2_tensor_ep_cut(t) || ep_of(ep) == 1) {
        *all = elems;
        *run = elems - i;
        return i;
    }
    size_t El = E / (size_t)ep, block = elems / (El + S), j = i / block, within = i % block;
    size_t x = j < El ? (size_t)ep_rank * El + j : E + (j - El); /* the expert */
    *all = (E + S) * block;
    *run = block - within;
    return x * block + within;
}

int gpt2_ep_owner(const struct gpt2_config *cfg, enum gpt2_tensor t, int ep, size_t a, size_t all,
                  size_t *local, size_t *run)
{
    size_t E = (size_t)cfg->experts, S = (size_t)cfg->shared_experts;
    if (!gpt2_tensor_ep_cut(t) || ep_of(ep) == 1) {
        *local = a;
        *run = all - a;
        return 0;
    }
    size_t El = E / (size_t)ep, block = all / (E + S), x = a / block, within = a % block;
    int owner = x < E ? (int)(x / El) : 0;
    size_t j = x < E ? x % El : El + (x - E); /* the block on its owner */
    *local = j * block + within;
    *run = block - within;
    return owner;
}

size_t gpt2_shard_to_whole(const struct gpt2_shard *s, enum gpt2_tensor t, size_t i, size_t elems,
                           size_t *run)
{
    size_t all, ep_run, tp_run;
    size_t a = gpt2_ep_to_all(&s->cfg, t, s->part.ep, s->part.ep_rank, i, elems, &all, &ep_run);
    size_t g = gpt2_tp_to_whole(&s->cfg, t, s->part.tp, s->part.tp_rank, a, all, &tp_run);
    *run = ep_run < tp_run ? ep_run : tp_run;
    return g;
}

/* From element rel of an MoE block (block_elems of them): whether it is a routed
 * expert's, and the run to where that changes (or the block's end). */
static bool routed_in_block(const struct gpt2_shard *s, size_t rel, size_t block_elems, size_t *run)
{
    size_t El = (size_t)gpt2_part_experts(&s->part, &s->cfg);
    size_t X = El + (size_t)s->cfg.shared_experts, edge = block_elems;
    for (int t = GPT2_EXPFCW; t <= GPT2_EXPPROJB; t++) {
        if (!gpt2_shard_holds(s, t)) continue;
        size_t lo = s->offset[t], hi = lo + s->elems[t] / X * El; /* its routed blocks */
        if (rel < lo) {
            edge = lo;
            break;
        }
        if (rel < hi) {
            *run = hi - rel;
            return true;
        }
    }
    *run = edge - rel;
    return false;
}

bool gpt2_shard_routed_at(const struct gpt2_shard *s, size_t at, size_t *run)
{
    *run = s->total - at;
    if (ep_of(s->part.ep) == 1) return false;
    if (at < s->layers_at) {
        *run = s->layers_at - at;
        return false;
    }
    if (at >= s->layers_end) return false;
    for (int i = 0; i < gpt2_shard_layers(s); i++) {
        size_t lo = gpt2_shard_block_at(s, i), n = gpt2_shard_block_elems(s, i);
        if (at >= lo + n) continue;
        if (gpt2_layer_moe(&s->cfg, gpt2_shard_layer(s, i)))
            return routed_in_block(s, at - lo, n, run);
        *run = lo + n - at;
        return false;
    }
    return false;
}
