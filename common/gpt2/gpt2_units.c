/* gpt2_units.c — where ZeRO 3's gather units lie in a shard's buffer and each
 * dp rank's part of one (gpt2_units.h). Arithmetic on offsets only: nothing
 * here allocates or moves data. */
#include "common/gpt2/gpt2_units.h"

int gpt2_units_count(const struct gpt2_shard *s)
{
    return gpt2_shard_layers(s) + 2;
}

struct gpt2_unit gpt2_unit(const struct gpt2_shard *s, size_t padded, int u)
{
    int L = gpt2_shard_layers(s);
    size_t after = s->layers_end;
    if (u == 0) return (struct gpt2_unit){0, s->layers_at};
    if (u <= L)
        return (struct gpt2_unit){gpt2_shard_block_at(s, u - 1), gpt2_shard_block_elems(s, u - 1)};
    return (struct gpt2_unit){after, padded - after};
}

int gpt2_unit_of(const struct gpt2_shard *s, enum gpt2_tensor t, int l)
{
    if (!gpt2_tensor_per_layer(t))
        return t == GPT2_WTE || t == GPT2_WPE ? 0 : gpt2_units_count(s) - 1;
    return 1 + gpt2_shard_block(s, l);
}

size_t gpt2_unit_max_elems(const struct gpt2_shard *s, size_t padded)
{
    size_t most = 0;
    for (int u = 0; u < gpt2_units_count(s); u++) {
        size_t n = gpt2_unit(s, padded, u).elems;
        if (n > most) most = n;
    }
    return most;
}

void gpt2_unit_counts(struct gpt2_unit u, size_t slice_n, int dp, int rank, size_t *counts,
                      size_t *from)
{
    size_t end = u.at + u.elems;
    for (int r = 0; r < dp; r++) {
        size_t lo = (size_t)r * slice_n, hi = lo + slice_n;
        size_t a = u.at > lo ? u.at : lo, b = end < hi ? end : hi;
        counts[r] = a < b ? b - a : 0;
        if (r == rank && from) *from = a < b ? a - lo : 0;
    }
}

struct gpt2_zero3_windows gpt2_zero3_windows(const struct gpt2_shard *s, size_t padded, int layers)
{
    int L = gpt2_shard_layers(s);
    return (struct gpt2_zero3_windows){.first = gpt2_unit(s, padded, 0).elems,
                                       .last = gpt2_unit(s, padded, L + 1).elems,
                                       .layer = gpt2_shard_block_max(s), /* (two sizes with
                                                                            MoE blocks) */
                                       .layers = L > 0 && gpt2_shard_block_max(s) ? layers : 0};
}

int gpt2_zero3_caps(struct gpt2_zero3_windows w, size_t *caps)
{
    const size_t ends[2] = {w.first, w.last};
    int n = 0;
    for (int k = 0; k < 2 + w.layers; k++) {
        size_t elems = k < 2 ? ends[k] : w.layer;
        if (!elems) continue;
        if (caps) caps[n] = elems;
        n++;
    }
    return n;
}

bool gpt2_zero3_layer_window(struct gpt2_zero3_windows w, size_t cap)
{
    return w.layer && cap == w.layer;
}

int gpt2_zero3_layer_windows(struct gpt2_zero3_windows w)
{
    size_t caps[2] = {w.first, w.last};
    int n = w.layer ? w.layers : 0;
    for (int k = 0; k < 2; k++) n += caps[k] && gpt2_zero3_layer_window(w, caps[k]);
    return n;
}
