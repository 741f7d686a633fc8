/* gpt2_units.h — the units ZeRO 3 gathers a shard's parameters in, and each
 * dp rank's part of one. Not the gathering itself (the runtime's), only where
 * the units lie in the shard's flat buffer (gpt2_shard.h: layer-major, padded
 * to a multiple of dp) and what each rank's 1/dp slice contributes.
 *
 * A shard of L layer blocks has L + 2 units, in the buffer's order:
 *   0          [0, layers_at)                    the embeddings (wte, wpe; a last
 *                                                stage's tied wte; empty elsewhere)
 *   1 .. L     layer block i - 1                 one layer each (of two sizes
 *                                                with MoE blocks: gpt2_shard.h)
 *   L + 1      [layers_end, padded)              the final norm, an untied head,
 *                                                the padding (possibly empty)
 * so the units tile the buffer: an uneven all-gather of unit u's counts
 * (gpt2_unit_counts) rebuilds it from the dp ranks' slices. */
#ifndef PLAIT_GPT2_UNITS_H
#define PLAIT_GPT2_UNITS_H

#include <stddef.h>

#include "common/gpt2/gpt2_layout.h"
#include "common/gpt2/gpt2_shard.h"

struct gpt2_unit {
    size_t at, elems; /* [at, at + elems) of the padded buffer */
};

/* The units of s (gpt2_shard_layers(s) + 2 of them). */
int gpt2_units_count(const struct gpt2_shard *s);

/* Unit u of s in a buffer of `padded` elements (padded >= s->total). */
struct gpt2_unit gpt2_unit(const struct gpt2_shard *s, size_t padded, int u);

/* The unit holding tensor t of layer l (l ignored for the global tensors),
 * which s must hold. */
int gpt2_unit_of(const struct gpt2_shard *s, enum gpt2_tensor t, int l);

/* The largest unit's elements: the size of a window that holds any unit. */
size_t gpt2_unit_max_elems(const struct gpt2_shard *s, size_t padded);

/* Each of dp ranks' part of unit u, rank r holding the slice
 * [r·slice_n, (r+1)·slice_n) of the buffer: counts[r] elements (0 for a rank
 * whose slice misses the unit), in rank order they tile the unit. *from
 * (NULL: not wanted) gets where rank `rank`'s part starts within its slice. */
void gpt2_unit_counts(struct gpt2_unit u, size_t slice_n, int dp, int rank, size_t *counts,
                      size_t *from);

/* The windows ZeRO 3 gathers a shard's units into, or takes for their
 * gradients: one the size of the embeddings' unit, one of the last unit's
 * (final norm, untied head, padding), `layers` of a layer's, empty ones left
 * out. The gradient windows hold two layers (the layer at work and the next
 * one on its way), the parameter windows as many, or, kept gathered until the
 * step's end (parallel.reshard_after_forward false), one per layer of the
 * shard: every unit at once. */
struct gpt2_zero3_windows {
    size_t first, last, layer; /* elements of the embeddings' unit, the last, a layer's */
    int layers;                /* windows of a layer's size (0: the shard has none) */
};
#define GPT2_ZERO3_GRAD_WINDOWS 4 /* the gradient windows: 2 + two layers' */

/* The windows of s's units with `layers` of a layer's size. */
struct gpt2_zero3_windows gpt2_zero3_windows(const struct gpt2_shard *s, size_t padded, int layers);

/* Their sizes in elements into caps (NULL: only counted); returns how many
 * (at most 2 + w.layers). */
int gpt2_zero3_caps(struct gpt2_zero3_windows w, size_t *caps);

/* Whether a window of cap elements is a layer's (the layers are gathered
 * there; in fp8 each carries its layer's fp8 copy), and how many of w's are. */
bool gpt2_zero3_layer_window(struct gpt2_zero3_windows w, size_t cap);
int gpt2_zero3_layer_windows(struct gpt2_zero3_windows w);

#endif
