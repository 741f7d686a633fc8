/* cost_plans.h — what the cost model's tests (test_cost.c: memory; test_cost_step.c:
 * traffic and step time) share: GPT-2 124M's dimensions, a plan loaded from JSON text
 * with them, the even pipeline split the hand counts assume, and a stage's parameters. */
#ifndef PLAIT_TESTS_COST_PLANS_H
#define PLAIT_TESTS_COST_PLANS_H

#include <stdint.h>
#include <stdio.h>

#include "common/place/cost.h"
#include "common/plan/plan.h"
#include "tests/unit/check.h"

struct model_dims {
    int layers, heads, hidden, vocab, seq_len;
};

/* GPT-2 124M as llm.c trains it: Vp = 50304 (50257 rounded up to 128), maxT = T = 1024. */
static const struct model_dims gpt2_124m = {12, 12, 768, 50257, 1024};

static inline struct plan *load_plan(struct model_dims d, int micro_batch, int grad_accum,
                                     const char *precision, const char *recompute)
{
    char text[1024];
    snprintf(text, sizeof text,
             "{\"model\": {\"layers\": %d, \"heads\": %d, \"hidden\": %d, \"vocab\": %d, "
             "\"seq_len\": %d},\n"
             " \"data\": {\"train\": \"train.bin\"},\n"
             " \"batch\": {\"micro_batch\": %d, \"grad_accum\": %d},\n"
             " \"precision\": \"%s\", \"recompute\": \"%s\",\n"
             " \"steps\": 10}\n",
             d.layers, d.heads, d.hidden, d.vocab, d.seq_len, micro_batch, grad_accum, precision,
             recompute);
    struct plait_error err = {0};
    struct plan *p = plan_load_text(text, "test_cost", "/", NULL, 0, &err);
    CHECK(p != NULL, "plan_load_text: %s", err.text);
    return p;
}

/* An explicit even split (parallel.stage_layers), the first L % pp stages
 * taking one more: the split the tests' hand counts were derived for (the
 * default balances the head; test_default_split_balances_the_head). */
static inline void even_split(struct plan *p, int pp)
{
    int L = p->model.layers;
    p->parallel.stage_layers.n = pp;
    for (int k = 0; k < pp; k++) p->parallel.stage_layers.v[k] = L / pp + (k < L % pp);
}

static inline int64_t stage_params(const struct plan *p, struct cost_layout l, int stage)
{
    struct cost_memory m;
    cost_memory_stage(p, l, stage, &m);
    return m.param_count;
}

#endif
