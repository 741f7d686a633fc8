/* model_zero3_pass.c — ZeRO 3 along a model's passes (model_zero3.h's calls):
 * which units a forward and a backward gather, prefetch, hold and release, the
 * bf16 and fp8 copies a gathered window carries, and the gradient windows
 * taken and handed to the scatter around each layer's and the head's backward. */
#include "runtime/model_zero3_pass.h"

#include "runtime/model_forward.h" // defines: embeds, heads
#include "runtime/model_weights.h" // defines: model_fp8_weights, model_quantize_weight
#include "runtime/model_zero3.h"
#include "runtime/zero3.h"

/* ---- ZeRO 3's gathers along a pass (model_zero3.h) ------------------------------ */

/* The unit of the slot's local layer i. */
int model_z3_unit(const struct model *m, const struct model_slot *sl, int i)
{
    return mz3_layer_unit(sl->chunk * m->n_layers + i);
}

/* Whether the head's weight is wte, of the embeddings' unit. */
bool model_tied_head(const struct model *m)
{
    return m->head == GPT2_WTE;
}

/* The copies a gathered window carries, made once a gather (the window
 * holds unit u at w): bf16, the whole unit's bf16 copy; fp8, a layer's four
 * matrices quantised into the window's fp8 block (the amax of each whole
 * matrix, as model_refresh_fp8's) and the LM head's bf16 copy. */
static void window_copies(struct model *m, int u, const struct zero3_window *win)
{
    struct gpt2_unit un = gpt2_unit(&m->shard, m->n_padded, u);
    int i = mz3_window_index(m, un.at), L = gpt2_shard_layers(&m->shard);
    float *w = win->buf;
    if (m->precision == PLAN_PRECISION_BF16 && !win->mixed) /* a mixed gather brought it */
        m->ops->to_bf16(m->ctx, m->win16[i], w, un.elems);
    if (m->precision != PLAN_PRECISION_FP8) return;
    for (int k = 0; u >= 1 && u <= L && k < 4; k++) {
        int l = gpt2_shard_layer(&m->shard, u - 1);
        if (gpt2_shard_has(&m->shard, model_fp8_weights[k], l)) /* (not an MoE block's experts) */
            model_quantize_weight(
                m, k, l, w + (gpt2_shard_offset(&m->shard, model_fp8_weights[k], l) - un.at));
    }
    size_t head = gpt2_shard_offset(&m->shard, m->head, 0);
    if (m->wte16 && u == gpt2_unit_of(&m->shard, m->head, 0))
        m->ops->to_bf16(m->ctx, m->wte16, w + (head - un.at), m->mem.lm_head16);
}

/* Unit u held gathered (mz3_hold), with the copies its window carries. */
int model_hold_unit(struct model *m, int u, struct plait_error *err)
{
    if (mz3_hold(m, u, err)) return -1;
    struct zero3_window *w = m->z3 ? zero3_window_of(m->z3, u) : NULL;
    if (w && !w->ready) window_copies(m, u, w);
    if (w) w->ready = true;
    return 0;
}

/* The gathers the pass needs after local layer i (-1: the embedding's;
 * n_layers: the head's) started: forward, layer i + 1's or the head's
 * units; backward, layer i - 1's. */
int model_z3_next(struct model *m, const struct model_slot *sl, int i, bool forward,
                  struct plait_error *err)
{
    if (!m->z3) return 0;
    int j = forward ? i + 1 : i - 1;
    if (j >= 0 && j < m->n_layers) return mz3_want(m, model_z3_unit(m, sl, j), err);
    if (forward && j == m->n_layers && model_heads(m, sl))
        return mz3_want(m, mz3_last_unit(m), err) ||
                       (model_tied_head(m) && mz3_want(m, MZ3_EMBEDDINGS, err))
                   ? -1
                   : 0;
    return 0;
}

/* The head's units (the last; the embeddings' too when tied) held, or
 * dropped. A training forward (grad_scale != 0) leaves them held for its
 * backward, which starts with them: their windows are theirs alone
 * (gpt2_units.h), and the backward drops them. */
int model_z3_head(struct model *m, bool hold, struct plait_error *err)
{
    int (*f)(struct model *, int, struct plait_error *) = hold ? model_hold_unit : mz3_drop;
    return f(m, mz3_last_unit(m), err) || (model_tied_head(m) && f(m, MZ3_EMBEDDINGS, err)) ? -1
                                                                                            : 0;
}

/* ZeRO 3, the head's backward: its units held and their gradient windows
 * taken before (hold), or after it (!hold) the units dropped and their
 * gradients handed to the scatter (the tied wte's kept for the embedding's
 * rows when this slot embeds too). */
int model_z3_head_backward(struct model *m, const struct model_slot *sl, bool hold,
                           struct plait_error *err)
{
    int last = mz3_last_unit(m);
    if (!m->z3) return 0;
    if (hold)
        return model_z3_head(m, true, err) || mz3_grad_take(m, last, err) ||
                       (model_tied_head(m) && mz3_grad_take(m, MZ3_EMBEDDINGS, err)) ||
                       model_z3_next(m, sl, m->n_layers, false, err)
                   ? -1
                   : 0;
    return model_z3_head(m, false, err) || mz3_grad_give(m, last, err) ||
                   (model_tied_head(m) && !model_embeds(m, sl) &&
                    mz3_grad_give(m, MZ3_EMBEDDINGS, err))
               ? -1
               : 0;
}

/* ZeRO 3, local layer i's backward: its unit held (layer i - 1's started)
 * and a gradient window taken before (hold), or after it dropped and its
 * gradient handed to the scatter. */
int model_z3_layer_backward(struct model *m, const struct model_slot *sl, int i, bool hold,
                            struct plait_error *err)
{
    int u = model_z3_unit(m, sl, i);
    if (!m->z3) return 0;
    if (hold)
        return model_z3_next(m, sl, i, false, err) || model_hold_unit(m, u, err) ||
                       mz3_grad_take(m, u, err)
                   ? -1
                   : 0;
    return mz3_drop(m, u, err) || mz3_grad_give(m, u, err) ? -1 : 0;
}
