/* model_zero3.c — the model's ZeRO 3 windows (model_zero3.h): gathers,
 * releases and the gradients' reduce-scatters, over runtime/zero3.c's pools. */
#include "runtime/model_zero3.h"

#include <stdlib.h>

#include "runtime/zero3.h"

int mz3_init(struct model *m, const struct group *dp, struct plait_error *err)
{
    size_t gcaps[GPT2_ZERO3_GRAD_WINDOWS];
    int ng = gpt2_zero3_caps(m->mem.zero3_grads, gcaps), rc = -1;
    size_t *pcaps = calloc((size_t)m->z3_n_pwin + 1, sizeof *pcaps);
    if (!pcaps || !(m->z3 = calloc(1, sizeof *m->z3)) || !(m->z3g = calloc(1, sizeof *m->z3g))) {
        error_set(err, "out of memory");
        goto out;
    }
    gpt2_zero3_caps(m->mem.zero3_params, pcaps);
    if (zero3_init(m->z3, &m->shard, m->n_padded, dp, m->params, m->z3_pwin, pcaps, m->z3_n_pwin,
                   err) ||
        zero3_init(m->z3g, &m->shard, m->n_padded, dp, m->grad_slice, m->z3_gwin, gcaps, ng, err)) {
        error_prefix(err, "parallel.zero 3: ");
        goto out;
    }
    for (int i = 0; m->slice16 && i < m->z3_n_pwin; i++) zero3_window16(m->z3, i, m->win16[i]);
    rc = 0;
out:
    free(pcaps);
    return rc;
}

void mz3_free(struct model *m)
{
    if (m->z3) zero3_free(m->z3);
    if (m->z3g) zero3_free(m->z3g);
    free(m->z3);
    free(m->z3g);
    m->z3 = m->z3g = NULL;
}

int mz3_layer_unit(int b)
{
    return 1 + b;
}

int mz3_last_unit(const struct model *m)
{
    return gpt2_units_count(&m->shard) - 1;
}

/* Whether u is a unit that needs nothing done: no ZeRO 3, or an empty unit. */
static bool idle(const struct model *m, int u)
{
    return !m->z3 || gpt2_unit(&m->shard, m->n_padded, u).elems == 0;
}

/* The fp32 runs of layer unit u, the tensors its passes read in fp32 (the
 * norms' weights and the biases: all but the four matrices), adjacent ones
 * merged, in the buffer's order: how many (at most ZERO3_RUNS). */
static int fp32_runs(const struct model *m, int u, struct gpt2_unit runs[ZERO3_RUNS])
{
    const struct gpt2_shard *s = &m->shard;
    int l = gpt2_shard_layer(s, u - 1), n = 0;
    struct gpt2_unit un = gpt2_unit(s, m->n_padded, u);
    size_t block = un.at, end = un.at + un.elems;
    for (size_t at = block; at < end;) { /* walk the block tensor by tensor */
        enum gpt2_tensor t = GPT2_TENSORS;
        for (int k = 0; k < GPT2_TENSORS; k++)
            if (gpt2_tensor_per_layer(k) && gpt2_shard_has(s, k, l) &&
                gpt2_shard_offset(s, k, l) == at)
                t = k;
        if (t == GPT2_TENSORS) return -1; /* not a tensor's start: a bug */
        size_t e = s->elems[t];
        if (!gpt2_tensor_decays(t) && n > 0 && runs[n - 1].at + runs[n - 1].elems == at)
            runs[n - 1].elems += e;
        else if (!gpt2_tensor_decays(t) && n < ZERO3_RUNS)
            runs[n++] = (struct gpt2_unit){at, e};
        else if (!gpt2_tensor_decays(t))
            return -1;
        at += e;
    }
    return n;
}

/* Starts unit u's gather: a layer's in bf16 with its fp32 runs where the
 * model keeps a bf16 copy of its slice (precision bf16) and the group gathers
 * bf16, else all of it in fp32. */
static int fetch(struct model *m, int u, struct plait_error *err)
{
    struct gpt2_unit runs[ZERO3_RUNS];
    int L = gpt2_shard_layers(&m->shard), n = -1;
    if (m->slice16 && m->z3->dp->iallgather16_v && u >= 1 && u <= L) n = fp32_runs(m, u, runs);
    int rc = n >= 0 ? zero3_fetch_mixed(m->z3, u, m->slice16, runs, n, err)
                    : zero3_fetch(m->z3, u, err);
    return rc ? error_prefix(err, "parameter gather: ") : 0;
}

int mz3_want(struct model *m, int u, struct plait_error *err)
{
    if (idle(m, u) || m->z3_no_prefetch) return 0;
    return fetch(m, u, err);
}

int mz3_hold(struct model *m, int u, struct plait_error *err)
{
    if (idle(m, u)) return 0;
    if (!zero3_window_of(m->z3, u) && fetch(m, u, err)) return -1;
    return zero3_get(m->z3, u, err) ? 0 : error_prefix(err, "parameter gather: ");
}

/* Gives unit u's window back. */
static int release(struct model *m, int u, struct plait_error *err)
{
    return zero3_release(m->z3, u, err) ? error_prefix(err, "parameter gather: ") : 0;
}

int mz3_drop(struct model *m, int u, struct plait_error *err)
{
    return idle(m, u) || m->z3_keep ? 0 : release(m, u, err);
}

int mz3_drop_all(struct model *m, struct plait_error *err)
{
    for (int i = 0; m->z3 && i < m->z3->n_windows; i++)
        if (m->z3->win[i].unit >= 0 && release(m, m->z3->win[i].unit, err)) return -1;
    return 0;
}

int mz3_gathered(const struct model *m)
{
    for (int i = 0; m->z3 && i < m->z3->n_windows; i++)
        if (m->z3->win[i].unit >= 0) return m->z3->win[i].unit;
    return -1;
}

bool mz3_grad_taken(const struct model *m, int u)
{
    return !idle(m, u) && zero3_window_of(m->z3g, u) != NULL;
}

/* The oldest scatter in flight finished: its part of the staging slice
 * added into grad_slice. */
static int settle_oldest(struct model *m, struct plait_error *err)
{
    int u = m->z3_pending[0];
    m->z3_n_pending--;
    for (int i = 0; i < m->z3_n_pending; i++) m->z3_pending[i] = m->z3_pending[i + 1];
    const float *part = m->z3_stage[zero3_window_of(m->z3g, u) - m->z3g->win];
    if (zero3_release(m->z3g, u, err)) return error_prefix(err, "gradient reduce-scatter: ");
    size_t from, n;
    zero3_part(m->z3g, u, &from, &n);
    if (n)
        m->ops->residual_forward(m->ctx, m->grad_slice + from, m->grad_slice + from, part, n);
    return 0;
}

int mz3_grad_settle(struct model *m, int keep, struct plait_error *err)
{
    while (m->z3_n_pending > keep)
        if (settle_oldest(m, err)) return -1;
    return 0;
}

int mz3_grad_take(struct model *m, int u, struct plait_error *err)
{
    if (idle(m, u)) return 0;
    struct zero3_window *w;
    while ((w = zero3_window_of(m->z3g, u)) && w->scatter) /* its last contribution's */
        if (settle_oldest(m, err)) return -1;
    if (w) return 0;
    float *buf;
    struct plait_error quiet = {.text = ""};
    while (!(buf = zero3_take(m->z3g, u, &quiet)))
        if (m->z3_n_pending == 0 || settle_oldest(m, err)) /* none to wait for: a bug */
            return m->z3_n_pending == 0 ? error_set(err, "%s", quiet.text) : -1;
    m->ops->zero(m->ctx, buf, gpt2_unit(&m->shard, m->n_padded, u).elems * sizeof(float));
    return 0;
}

int mz3_grad_give(struct model *m, int u, struct plait_error *err)
{
    if (idle(m, u)) return 0;
    float *part = m->z3_stage[zero3_window_of(m->z3g, u) - m->z3g->win];
    if (zero3_scatter_window(m->z3g, u, part, err))
        return error_prefix(err, "gradient reduce-scatter: ");
    m->z3_pending[m->z3_n_pending++] = u;
    return 0;
}

const uint16_t *mz3_at16(const struct model *m, size_t at)
{
    size_t within;
    int i = m->precision == PLAN_PRECISION_BF16 ? zero3_window_at(m->z3, at, &within) : -1;
    return i < 0 ? NULL : m->win16[i] + within;
}

int mz3_window_index(const struct model *m, size_t at)
{
    size_t within;
    return zero3_window_at(m->z3, at, &within);
}

int mz3_unit_grads(struct model *m, int u, float **buf, struct plait_error *err)
{
    if (mz3_grad_settle(m, 0, err)) return -1;
    if (!(*buf = zero3_get(m->z3g, u, err))) return error_prefix(err, "gradient gather: ");
    return 0;
}

int mz3_unit_grads_back(struct model *m, int u, struct plait_error *err)
{
    struct zero3_window *w = zero3_window_of(m->z3g, u);
    size_t from, n;
    zero3_part(m->z3g, u, &from, &n);
    struct gpt2_unit un = gpt2_unit(&m->shard, m->n_padded, u);
    size_t at = m->slice_at + from; /* the buffer's element of this rank's part */
    if (n) m->ops->copy(m->ctx, m->grad_slice + from, w->buf + (at - un.at), n * sizeof(float));
    return zero3_release(m->z3g, u, err);
}
