/* sample.c — a run's samples: the model's parameters in host memory, through
 * the sampler. */
#include "runtime/sample.h"

#include <stdlib.h>

#include "kernels/ops.h"

/* The whole model's parameters in host memory: the CPU backend's own buffer, else a copy
 * (*copy, for the caller to free). NULL when the model is a part (tp, pp or ep > 1). */
static const float *host_params(const struct model *m, float **copy, struct plait_error *err)
{
    *copy = NULL;
    if (m->shard.part.tp != 1 || m->shard.part.ep > 1 || !m->shard.first || !m->shard.last) {
        error_set(err, "sampling needs the whole model on one rank; this rank holds a part");
        return NULL;
    }
    if (m->ops == ops_cpu()) return m->params;
    if (!(*copy = malloc(m->shard.total * sizeof **copy))) {
        error_set(err, "out of memory copying the model to host memory");
        return NULL;
    }
    m->ops->download(m->ctx, *copy, m->params, m->shard.total * sizeof **copy);
    return *copy;
}

int sample_text(struct model *m, const struct plan_sample *s, const struct tokenizer *tok,
                struct rng *r, FILE *out, struct plait_error *err)
{
    float *copy;
    const float *params = host_params(m, &copy, err);
    int rc = params ? sample_tokens(&m->shard, params, s, tok, r, out, err) : -1;
    free(copy);
    return rc;
}
