/* model_scratch.c — a model's scratch on its backend: the slots common/gpt2/gpt2_scratch.c
 * counts for its shard and shape, reserved when the model is made so that no step grows
 * them (what plait check predicts for a GPU rank). Not the slots' use: the ops' own. */
#include "runtime/model_scratch.h"

#include "common/gpt2/gpt2_scratch.h"

int model_reserve_scratch(struct model *m, struct plait_error *err)
{
    m->scratch_bytes = 0;
    if (!m->ops->reserve_scratch) return 0;
    struct gpt2_scratch s;
    /* the ring's block attention under context parallelism, never the bf16 one */
    gpt2_scratch(&m->shard, &m->mem_shape, &m->mem, m->attention_bf16 && m->cp <= 1, &s);
    if (m->ops->reserve_scratch(m->ctx, s.slot, GPT2_SCRATCH_SLOTS)) {
        char why[512] = "";
        m->ops->take_error(m->ctx, why, sizeof why);
        return error_set(err, "model: reserving %.1f MB of %s scratch: %s", s.total / 1e6,
                         m->ops->name, why);
    }
    m->scratch_bytes = s.total;
    return 0;
}
