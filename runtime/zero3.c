/* zero3.c — ZeRO 3's pool of unit windows (zero3.h): which window holds which
 * unit, the uneven all-gathers that fill them, the lookups into them. The
 * units themselves are common/gpt2/gpt2_units.c's. */
#include "runtime/zero3.h"

#include <stdio.h>
#include <stdlib.h>

size_t zero3_window_elems(const struct gpt2_shard *s, size_t padded)
{
    return gpt2_unit_max_elems(s, padded);
}

int zero3_init(struct zero3 *z, const struct gpt2_shard *s, size_t padded, const struct group *dp,
               const float *slice, float *const *bufs, const size_t *caps, int n_windows,
               struct plait_error *err)
{
    *z = (struct zero3){.shard = s, .padded = padded, .dp = dp, .slice = slice};
    if (dp->size < 2 || !dp->iallgather_v || !dp->ireduce_scatter_v || !dp->wait ||
        padded % (size_t)dp->size)
        return error_set(err,
                         "ZeRO 3 over dp %d: needs at least 2 ranks that gather and reduce-scatter "
                         "unevenly, and "
                         "a buffer (%zu elements) that splits evenly over them",
                         dp->size, padded);
    z->slice_n = padded / (size_t)dp->size;
    z->window_elems = zero3_window_elems(s, padded);
    z->win = calloc((size_t)n_windows, sizeof *z->win);
    z->counts = calloc((size_t)dp->size, sizeof *z->counts);
    if (!z->win || !z->counts) {
        zero3_free(z);
        return error_errno(err, "ZeRO 3: allocating the windows' table");
    }
    z->n_windows = n_windows;
    for (int i = 0; i < n_windows; i++)
        z->win[i] = (struct zero3_window){
            .buf = bufs[i], .cap = caps ? caps[i] : z->window_elems, .unit = -1};
    return 0;
}

void zero3_free(struct zero3 *z)
{
    free(z->win);
    free(z->counts);
    z->win = NULL;
    z->counts = NULL;
}

static struct zero3_window *holding(const struct zero3 *z, int u)
{
    for (int i = 0; i < z->n_windows; i++)
        if (z->win[i].unit == u) return &z->win[i];
    return NULL;
}

struct zero3_window *zero3_window_of(const struct zero3 *z, int u)
{
    return u < 0 ? NULL : holding(z, u);
}

/* The smallest free window unit u fits; NULL with err naming what the
 * windows hold when none is. */
static struct zero3_window *free_window(struct zero3 *z, int u, struct plait_error *err)
{
    size_t elems = gpt2_unit(z->shard, z->padded, u).elems;
    struct zero3_window *best = NULL;
    for (int i = 0; i < z->n_windows; i++) {
        struct zero3_window *w = &z->win[i];
        if (w->unit < 0 && w->cap >= elems && (!best || w->cap < best->cap)) best = w;
    }
    if (best) return best;
    char held[160] = "";
    size_t n = 0;
    for (int i = 0; i < z->n_windows && n < sizeof held; i++)
        n += (size_t)snprintf(held + n, sizeof held - n, " %d", z->win[i].unit);
    error_set(err, "ZeRO 3: unit %d (%zu elements) has no window: the %d hold units%s", u, elems,
              z->n_windows, held);
    return NULL;
}

/* Unit u's counts over dp into z->counts, and where this rank's part is in
 * its slice: -1 with err for a unit the shard does not have. */
static int unit_counts(struct zero3 *z, int u, size_t *from, struct plait_error *err)
{
    if (u < 0 || u >= gpt2_units_count(z->shard))
        return error_set(err, "ZeRO 3: unit %d of a shard of %d", u, gpt2_units_count(z->shard));
    *from = 0;
    gpt2_unit_counts(gpt2_unit(z->shard, z->padded, u), z->slice_n, z->dp->size, z->dp->rank,
                     z->counts, from);
    return 0;
}

int zero3_fetch(struct zero3 *z, int u, struct plait_error *err)
{
    size_t from;
    if (unit_counts(z, u, &from, err)) return -1;
    if (holding(z, u)) return 0;
    struct zero3_window *w = free_window(z, u, err);
    if (!w) return -1;
    if (z->dp->iallgather_v(z->dp->ctx, z->slice + from, w->buf, z->counts, &w->req, err))
        return -1;
    w->unit = u;
    w->scatter = false;
    w->ready = false;
    w->mixed = false;
    return 0;
}

/* Waits for w's gather (and a mixed gather's runs) or scatter: on failure
 * the window is free again. */
static int settle(struct zero3_window *w, const struct group *dp, struct plait_error *err)
{
    int rc = 0;
    if (w->req && dp->wait(w->req, err)) rc = -1;
    w->req = NULL;
    for (int i = 0; i < w->n_more; i++)
        if (dp->wait(w->more[i], rc ? &(struct plait_error){.text = ""} : err)) rc = -1;
    w->n_more = 0;
    if (rc) w->unit = -1;
    return rc;
}

void zero3_window16(struct zero3 *z, int i, uint16_t *buf16)
{
    z->win[i].buf16 = buf16;
}

int zero3_fetch_mixed(struct zero3 *z, int u, const uint16_t *slice16,
                      const struct gpt2_unit *runs, int n_runs, struct plait_error *err)
{
    size_t from;
    if (unit_counts(z, u, &from, err)) return -1;
    if (holding(z, u)) return 0;
    struct zero3_window *w = free_window(z, u, err);
    if (!w) return -1;
    if (!w->buf16 || !z->dp->iallgather16_v || n_runs > ZERO3_RUNS)
        return error_set(err, "ZeRO 3: unit %d cannot be gathered in bf16 here (a bug)", u);
    if (z->dp->iallgather16_v(z->dp->ctx, slice16 + from, w->buf16, z->counts, &w->req, err))
        return -1;
    w->unit = u, w->scatter = false, w->ready = false, w->mixed = true;
    struct gpt2_unit un = gpt2_unit(z->shard, z->padded, u);
    for (int i = 0; i < n_runs; i++) {
        size_t at = 0;
        gpt2_unit_counts(runs[i], z->slice_n, z->dp->size, z->dp->rank, z->counts, &at);
        if (z->dp->iallgather_v(z->dp->ctx, z->slice + at, w->buf + (runs[i].at - un.at),
                                z->counts, &w->more[w->n_more], err)) {
            settle(w, z->dp, &(struct plait_error){.text = ""});
            w->unit = -1;
            return -1;
        }
        w->n_more++;
    }
    return 0;
}

float *zero3_get(struct zero3 *z, int u, struct plait_error *err)
{
    if (zero3_fetch(z, u, err)) return NULL;
    struct zero3_window *w = holding(z, u);
    if (w->scatter) {
        error_set(err, "ZeRO 3: unit %d's window is a gradient being reduce-scattered", u);
        return NULL;
    }
    return settle(w, z->dp, err) ? NULL : w->buf;
}

float *zero3_take(struct zero3 *z, int u, struct plait_error *err)
{
    size_t from;
    if (unit_counts(z, u, &from, err)) return NULL;
    if (holding(z, u)) {
        error_set(err, "ZeRO 3: unit %d's gradient window is taken twice", u);
        return NULL;
    }
    struct zero3_window *w = free_window(z, u, err);
    if (!w) return NULL;
    w->unit = u;
    w->req = NULL;
    w->scatter = false;
    return w->buf;
}

int zero3_scatter_window(struct zero3 *z, int u, float *recv, struct plait_error *err)
{
    size_t from;
    struct zero3_window *w = holding(z, u);
    if (unit_counts(z, u, &from, err)) return -1;
    if (!w || w->req) return error_set(err, "ZeRO 3: unit %d has no gradient window to scatter", u);
    if (z->dp->ireduce_scatter_v(z->dp->ctx, w->buf, recv, z->counts, &w->req, err))
        return -1;
    w->scatter = true;
    return 0;
}

void zero3_part(struct zero3 *z, int u, size_t *from, size_t *n)
{
    *from = 0;
    gpt2_unit_counts(gpt2_unit(z->shard, z->padded, u), z->slice_n, z->dp->size, z->dp->rank,
                     z->counts, from);
    *n = z->counts[z->dp->rank];
}

int zero3_release(struct zero3 *z, int u, struct plait_error *err)
{
    struct zero3_window *w = holding(z, u);
    if (!w) return 0;
    int rc = settle(w, z->dp, err);
    w->unit = -1;
    w->scatter = false;
    return rc;
}

int zero3_scatter(struct zero3 *z, int u, const float *grads, float *sums, void **req,
                  struct plait_error *err)
{
    size_t from;
    *req = NULL;
    if (unit_counts(z, u, &from, err)) return -1;
    return z->dp->ireduce_scatter_v(z->dp->ctx, grads, sums + from, z->counts, req, err);
}

int zero3_window_at(const struct zero3 *z, size_t at, size_t *within)
{
    for (int i = 0; i < z->n_windows; i++) {
        const struct zero3_window *w = &z->win[i];
        if (w->unit < 0 || w->req || w->n_more) continue;
        struct gpt2_unit un = gpt2_unit(z->shard, z->padded, w->unit);
        if (at >= un.at && at < un.at + un.elems) {
            *within = at - un.at;
            return i;
        }
    }
    return -1;
}

float *zero3_at(const struct zero3 *z, size_t at)
{
    size_t within;
    int i = zero3_window_at(z, at, &within);
    return i < 0 ? NULL : z->win[i].buf + within;
}
