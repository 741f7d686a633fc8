/* zero3.h — ZeRO 3's unit windows: a unit of the shard
 * (common/gpt2/gpt2_units.h) is all-gathered from the dp ranks' slices into
 * one of a pool of windows (a few, or one per unit when units stay gathered
 * until the step's end) before it is used, and released after. The gather of the next unit may be started (zero3_fetch) while the
 * current one computes. A pool of gradient windows is the same table: a
 * window taken for a unit (zero3_take) is filled by backward, then
 * reduce-scattered into the slices (zero3_scatter_window) and released once
 * that is done. Not the model's passes (they say which unit they need, and
 * when), nor the optimizer (which steps the slice in place). */
#ifndef PLAIT_RUNTIME_ZERO3_H
#define PLAIT_RUNTIME_ZERO3_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "common/gpt2/gpt2_shard.h"
#include "common/gpt2/gpt2_units.h"
#include "runtime/group.h"

#define ZERO3_RUNS 8 /* fp32 runs a mixed gather may take beside its bf16 copy */

struct zero3_window {
    float *buf;       /* (cap) backend memory, the caller's */
    uint16_t *buf16;  /* (cap) its bf16 copy, the caller's (zero3_fetch_mixed); NULL: none */
    void *more[ZERO3_RUNS]; /* a mixed gather's fp32 runs in flight */
    int n_more;
    bool mixed;       /* gathered mixed: buf16 whole, buf only in the runs */
    size_t cap;   /* the elements it holds: units up to that size */
    int unit;     /* the unit it holds, is gathering or scattering; -1: free */
    void *req;    /* the gather or scatter in flight, NULL once waited for */
    bool scatter; /* req is a reduce-scatter out of the window (a gradient window) */
    bool ready;   /* the caller's: its copies (bf16, fp8) are made (reset by each fetch) */
};

struct zero3 {
    const struct gpt2_shard *shard;
    size_t padded, slice_n; /* the buffer's elements (a multiple of dp) and a slice's */
    const struct group *dp; /* size > 1, with iallgather_v */
    const float *slice;     /* (slice_n) this rank's slice of the parameters */
    int n_windows;
    struct zero3_window *win; /* [n_windows] */
    size_t window_elems;      /* gpt2_unit_max_elems: any unit fits a window this big */
    size_t *counts;           /* [dp->size] scratch for a gather's counts */
};

/* A pool of n_windows windows (bufs[i]: caps[i] floats, allocated by the
 * caller; caps NULL: window_elems each, as zero3_window_elems says) over
 * this rank's slice of a padded buffer of `padded` elements (NULL for a pool
 * that only scatters). A unit goes to the smallest free window it fits. -1
 * with err when dp cannot gather unevenly or has one rank (ZeRO 3 at dp 1 is
 * ZeRO 0). */
int zero3_init(struct zero3 *z, const struct gpt2_shard *s, size_t padded, const struct group *dp,
               const float *slice, float *const *bufs, const size_t *caps, int n_windows,
               struct plait_error *err);
void zero3_free(struct zero3 *z);

/* The elements one window holds: the shard's largest unit. */
size_t zero3_window_elems(const struct gpt2_shard *s, size_t padded);

/* Starts the gather of unit u into a free window; nothing when u is held or
 * on its way. -1 with err when every window is taken (the caller released
 * too little: a bug, named with the units held). */
int zero3_fetch(struct zero3 *z, int u, struct plait_error *err);

/* Starts unit u's gather in two precisions into a free window that has a
 * bf16 copy (zero3_window16): the whole unit's bf16 values from slice16 (this
 * rank's slice of a bf16 copy of the buffer) into the window's buf16, and
 * fp32 values from the slice into buf only in the n_runs runs given (the
 * rest of buf stale): a unit whose matrices the passes read in bf16 and the
 * rest in fp32 moves 2 bytes an element. Nothing when u is held or on its
 * way; the same errors as zero3_fetch. */
int zero3_fetch_mixed(struct zero3 *z, int u, const uint16_t *slice16,
                      const struct gpt2_unit *runs, int n_runs, struct plait_error *err);

/* Window i's bf16 copy (cap elements, the caller's). */
void zero3_window16(struct zero3 *z, int i, uint16_t *buf16);

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

/* A free window for unit u, without a gather (a gradient window the caller
 * fills): its first elements hold the unit. NULL with err when none fits
 * (every window taken: a bug, named). */
float *zero3_take(struct zero3 *z, int u, struct plait_error *err);

/* Starts the reduce-scatter of unit u's window (taken) summed over dp: this
 * rank's part of the sum (zero3_part's n elements) lands in recv. The window
 * stays u's until zero3_release, which waits for the scatter. */
int zero3_scatter_window(struct zero3 *z, int u, float *recv, struct plait_error *err);

/* This rank's part of unit u: elements [*from, *from + *n) of its slice. */
void zero3_part(struct zero3 *z, int u, size_t *from, size_t *n);

/* The window holding unit u (gathered or taken), NULL when none. */
struct zero3_window *zero3_window_of(const struct zero3 *z, int u);

/* The window holding element `at` of the buffer (gathered, or taken and
 * not scattering), *within its place there; -1 when none does. */
int zero3_window_at(const struct zero3 *z, size_t at, size_t *within);

/* Where element `at` of the buffer is while its unit is held and gathered:
 * NULL when it is not (using it is a bug: the caller fails loudly). */
float *zero3_at(const struct zero3 *z, size_t at);

#endif
