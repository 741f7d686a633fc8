/* plan_check.h — what plan.c's loader and plan_rules.c's rules share; not an
 * interface of the plan (plan.h is). A loading context knows where each value
 * came from (the plan's line, or a --set override), so a refusal names it. */
#ifndef PLAIT_PLAN_CHECK_H
#define PLAIT_PLAN_CHECK_H

#include <jansson.h>

#include "common/plan/plan.h"

struct plan_ctx; /* plan_origin.h's */

#define PLAN_GOT_MAX 72 /* longest literal echoed in a message, with "..." */

/* wsd's decay: the last fifth of the steps after warmup, as in MiniCPM's report (Hu et al.,
 * 2024); optimizer.decay_fraction's default */
#define WSD_DECAY_FRACTION 0.2

/* An error about the value at path (a dotted JSON path), located where that
 * value (or its parent) came from; -1. */
int plan_fail(struct plan_ctx *c, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* An error of a rule between fields: at path's place, unless an override set
 * one of the fields the rule also reads (also: space-separated paths) after
 * path's own value was given; then it names that override and where path's
 * value came from; -1. */
int plan_fail_rule(struct plan_ctx *c, const char *path, const char *also, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The value at path as written ("-3e-4", "\"fp16\""), shortened into buf. */
const char *plan_got_text(const struct plan_ctx *c, const char *path, const json_t *v,
                          char buf[PLAN_GOT_MAX]);

/* The value at section.key (section NULL: top level), NULL when absent or null. */
json_t *plan_given(json_t *root, const char *section, const char *key);

/* Every rule between fields (plan_rules.c), after the fields were decoded:
 * model.init's dimensions, the derived defaults, the architecture's fields,
 * the layout's splits, the schedules, ZeRO, the batch. */
int plan_check_rules(struct plan_ctx *c, json_t *root, struct plan *p);

#endif
