/* model_zero3.h — ZeRO 3 inside the model's passes (runtime/model_zero3_pass.c): the
 * units a pass needs gathered into the parameter windows (runtime/zero3.h)
 * just before they are used, the next one prefetched while the current one
 * computes, and released after; each gradient contribution written into a
 * zeroed gradient window, reduce-scattered (this rank's part of the sum into
 * the window's staging buffer) while backward goes on, and added into the
 * rank's grad_slice once that is done (oldest first: the same order, and so
 * the same bits, on every rank).
 * In bf16 a layer's unit is gathered mixed (zero3_fetch_mixed): its
 * matrices in bf16 from the slice's bf16 copy, its norms and biases in fp32.
 * Below ZeRO 3 every call is a no-op, and so is every call on an empty unit
 * (a middle stage has no embeddings): every dp rank of a stage makes the
 * same calls, the collectives' order. */
#ifndef PLAIT_RUNTIME_MODEL_ZERO3_H
#define PLAIT_RUNTIME_MODEL_ZERO3_H

#include <stdint.h>

#include "common/error.h"
#include "runtime/group.h"
#include "runtime/model.h"

/* The two pools over the windows model_init allocated (m->mem says their
 * sizes): the parameters' (m->z3_pwin) over m->params (the slice), the
 * gradients' (m->z3_gwin) over m->grad_slice. dp: the group the slices are
 * over, which must outlive m. */
int mz3_init(struct model *m, const struct group *dp, struct plait_error *err);
void mz3_free(struct model *m);

/* The unit of local layer block b (chunk · n_layers + i), of the
 * embeddings, and the last unit (final norm, untied head). */
int mz3_layer_unit(int b);
#define MZ3_EMBEDDINGS 0
int mz3_last_unit(const struct model *m);

/* Starts unit u's gather (a prefetch); holds it gathered (waiting for it;
 * the copies its window carries are the caller's: runtime/model_zero3_pass.c); releases
 * it, or with m->z3_keep leaves it gathered (its window is its own) for the
 * passes after: the weights stay the same until the step's end. */
int mz3_want(struct model *m, int u, struct plait_error *err);
int mz3_hold(struct model *m, int u, struct plait_error *err);
int mz3_drop(struct model *m, int u, struct plait_error *err);
/* Every parameter window given back (before the weights change: each
 * step's end). */
int mz3_drop_all(struct model *m, struct plait_error *err);
/* A unit still gathered (-1: none): the optimizer refuses to change the
 * weights under a window's copy of them. */
int mz3_gathered(const struct model *m);

/* A zeroed gradient window for unit u (no-op when u has one already), the
 * oldest scatters finished first until one is free; then its contribution
 * reduce-scattered (mz3_grad_give); mz3_grad_settle finishes scatters,
 * oldest first, until at most `keep` are in flight. */
int mz3_grad_take(struct model *m, int u, struct plait_error *err);
int mz3_grad_give(struct model *m, int u, struct plait_error *err);
int mz3_grad_settle(struct model *m, int keep, struct plait_error *err);
bool mz3_grad_taken(const struct model *m, int u);

/* The bf16 copy of gathered element `at`, NULL outside bf16. */
const uint16_t *mz3_at16(const struct model *m, size_t at);

/* The parameter window holding gathered element `at`, -1 when none does. */
int mz3_window_index(const struct model *m, size_t at);

/* The step's accumulated gradient of unit u gathered from the dp ranks'
 * grad_slices into a gradient window (*buf: its first element is the
 * unit's), for a sum the slices cannot take alone (the tied wte's between
 * the pipeline's ends); mz3_unit_grads_back copies this rank's part of the
 * window back into its grad_slice and frees the window. */
int mz3_unit_grads(struct model *m, int u, float **buf, struct plait_error *err);
int mz3_unit_grads_back(struct model *m, int u, struct plait_error *err);

#endif
