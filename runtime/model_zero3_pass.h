/* model_zero3_pass.h — ZeRO 3 along a model's passes (model_zero3_pass.c), for
 * model_forward.c and model_backward.c; every call is a no-op below ZeRO 3. */
#ifndef PLAIT_RUNTIME_MODEL_ZERO3_PASS_H
#define PLAIT_RUNTIME_MODEL_ZERO3_PASS_H

#include <stdbool.h>

#include "common/error.h"
#include "runtime/model.h"

/* The unit of the slot's local layer i; whether the head's weight is wte. */
int model_z3_unit(const struct model *m, const struct model_slot *sl, int i);
bool model_tied_head(const struct model *m);
/* Unit u held gathered, with the copies its window carries. */
int model_hold_unit(struct model *m, int u, struct plait_error *err);
/* The gathers the pass needs after local layer i started. */
int model_z3_next(struct model *m, const struct model_slot *sl, int i, bool forward,
                  struct plait_error *err);
/* The head's units held, or dropped. */
int model_z3_head(struct model *m, bool hold, struct plait_error *err);
/* The head's and local layer i's backward: before (hold) and after it. */
int model_z3_head_backward(struct model *m, const struct model_slot *sl, bool hold,
                           struct plait_error *err);
int model_z3_layer_backward(struct model *m, const struct model_slot *sl, int i, bool hold,
                            struct plait_error *err);

#endif
