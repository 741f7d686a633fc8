/* zero3.h — ZeRO 3's parameter windows: a unit of the shard
 * (common/gpt2/gpt2_units.h) is all-gathered from the dp ranks' slices into
 * one of a small fixed pool of unit-sized windows before it is used, and
 * released after. The gather of the next unit may be started (zero3_fetch)
 * while the current one computes. Not the model's passes (they say which
 * unit they need, and when), nor the gradients' reduce-scatter, nor the
 * optimizer (which steps the slice in place). */
#ifndef PLAIT_RUNTIME_ZERO3_H
#define PLAIT_RUNTIME_ZERO3_H

#include <stddef.h>

#include "common/error.h"
#include "common/gpt2/gpt2_shard.h"
#include "common/gpt2/gpt2_units.h"
#include "runtime/group.h"

struct zero3_window {
    float *buf; /* (window_elems) backend memory, the caller's */
    int unit;   /* the unit it holds or is gathering, -1: free */
    void *req;  /* the gather in flight, NULL once waited for */
};

struct zero3 {
    const struct gpt2_shard *shard;
    size_t padded, slice_n; /* the buffer's elements (a multiple of dp) and a slice's */
    const struct group *dp; /* size > 1, with iallgather_v */
    const float *slice;     /* (slice_n) this rank's slice of the parameters */
    int n_windows;
    struct zero3_window *win; /* [n_windows] */
    size_t window_elems;      /* gpt2_unit_max_elems: any unit fits */
    size_t *counts;           /* [dp->size] scratch for a gather's counts */
};

/* A pool of n_windows windows (bufs[i]: window_elems floats each, as
 * zero3_window_elems says, allocated by the caller) over this rank's slice
 * of a padded buffer of `padded` elements. -1 with err when dp cannot gather
 * unevenly or has one rank (ZeRO 3 at dp 1 is ZeRO 0). */
int zero3_init(struct zero3 *z, const struct gpt2_shard *s, size_t padded, const struct group *dp,
               const float *slice, float *const *bufs, int n_windows, struct plait_error *err);
void zero3_free(struct zero3 *z);

/* The elements one window holds: the shard's largest unit. */
size_t zero3_window_elems(const struct gpt2_shard *s, size_t padded);

/* Starts the gather of unit u into a free window; nothing when u is held or
 * on its way. -1 with err when every window is taken (the caller released
 * too little: a bug, named with the units held). */
int zero3_fetch(struct zero3 *z, int u, struct plait_error *err);

/* Unit u's window once its gather is complete (fetching it first when it was
 * not started): element at of the buffer is at window + (at - unit start).
 * NULL with err when it could not be gathered. */
float *zero3_get(struct zero3 *z, int u, struct plait_error *err);

/* Gives unit u's window back (waiting for a gather still in flight); nothing
 * when u is not held. */
int zero3_release(struct zero3 *z, int u, struct plait_error *err);

/* Starts the reduce-scatter of unit u's gradients (grads: the unit's
 * elements, a gradient window) summed over dp: this rank's part of the sum
 * lands in sums (slice_n: the slice's shape) where its part of the unit is,
 * the rest of sums untouched; *req for dp->wait, grads and sums the
 * operation's until then. The step's first micro-batch lands in the grad
 * slice, later ones in staging the caller adds (ZeRO 2's accumulate). */
int zero3_scatter(struct zero3 *z, int u, const float *grads, float *sums, void **req,
                  struct plait_error *err);

/* Where element `at` of the buffer is while its unit is held and gathered:
 * NULL when it is not (using it is a bug: the caller fails loudly). */
float *zero3_at(const struct zero3 *z, size_t at);

#endif
