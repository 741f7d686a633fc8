/* gpt2_shard.c — which part of each GPT-2 tensor a (tp, pp) rank holds, the
 * layer-major offsets of its buffer, and the copies between that buffer and
 * llm.c's full tensor-major order. What the model computes with them is the
 * runtime's (runtime/model.c). */
#include "common/gpt2_shard.h"

#include <stdint.h>
#include <string.h>

#include "common/checked.h"

static bool is_global(enum gpt2_tensor t)
{
    return t == GPT2_WTE || t == GPT2_WPE || t == GPT2_LNFW || t == GPT2_LNFB;
}

bool gpt2_tensor_tp_replicated(enum gpt2_tensor t)
{
    switch (t) {
    case GPT2_WTE:
    case GPT2_QKVW:
    case GPT2_QKVB:
    case GPT2_ATTPROJW:
    case GPT2_FCW:
    case GPT2_FCB:
    case GPT2_FCPROJW:
        return false;
    default:
        return true;
    }
}

struct gpt2_part gpt2_part_whole(const struct gpt2_config *cfg)
{
    return (struct gpt2_part){.tp = 1, .pp = 1, .layer_begin = 0, .layer_end = cfg->layers};
}

void gpt2_stage_layers(int layers, int pp, int stage, int *begin, int *end)
{
    int base = layers / pp, extra = layers % pp;
    *begin = stage * base + (stage < extra ? stage : extra);
    *end = *begin + base + (stage < extra ? 1 : 0);
}

void gpt2_stage_chunks(int layers, int pp, int chunks, int stage, struct gpt2_part *part)
{
    gpt2_stage_layers(layers, pp * chunks, stage, &part->layer_begin, &part->layer_end);
    part->chunks = chunks;
}

int gpt2_shard_init(struct gpt2_shard *s, const struct gpt2_config *cfg,
                    const struct gpt2_part *part, struct plait_error *err)
{
    memset(s, 0, sizeof *s);
    const struct gpt2_part *p = part;
    long long C = cfg->hidden, tp = p->tp;
    if (tp < 1 || p->tp_rank < 0 || p->tp_rank >= tp || cfg->heads % tp || cfg->padded_vocab % tp)
        return error_set(err,
                         "tensor parallelism %d (rank %d) must divide the heads (%d) and the "
                         "padded vocabulary (%d)",
                         p->tp, p->tp_rank, cfg->heads, cfg->padded_vocab);
    int chunks = p->chunks < 1 ? 1 : p->chunks;
    long long n = (long long)p->layer_end - p->layer_begin;
    if (p->pp < 1 || p->pp_rank < 0 || p->pp_rank >= p->pp || p->layer_begin < 0 || n < 1 ||
        p->layer_end + (long long)(chunks - 1) * p->pp * n > cfg->layers)
        return error_set(err, "pipeline stage %d of %d: %d chunk(s) of layers [%d, %d) of %d",
                         p->pp_rank, p->pp, chunks, p->layer_begin, p->layer_end, cfg->layers);
    s->cfg = *cfg;
    s->part = *p;
    s->part.chunks = chunks;
    s->first = p->pp_rank == 0;
    s->last = p->pp_rank == p->pp - 1;
    size_t *e = s->elems;
    long long Ct = C / tp; /* heads % tp == 0, so tp divides C */
    bool ok = ck_size(&e[GPT2_WTE], s->first || s->last, cfg->padded_vocab / tp, C) &&
              ck_size(&e[GPT2_WPE], s->first, cfg->max_seq_len, C) &&
              ck_size(&e[GPT2_QKVW], 3, Ct, C) && ck_size(&e[GPT2_ATTPROJW], C, Ct) &&
              ck_size(&e[GPT2_FCW], 4, Ct, C) && ck_size(&e[GPT2_FCPROJW], C, 4, Ct);
    e[GPT2_LN1W] = e[GPT2_LN1B] = e[GPT2_ATTPROJB] = e[GPT2_LN2W] = e[GPT2_LN2B] = e[GPT2_FCPROJB] =
        (size_t)C;
    e[GPT2_QKVB] = 3 * (size_t)Ct;
    e[GPT2_FCB] = 4 * (size_t)Ct;
    e[GPT2_LNFW] = e[GPT2_LNFB] = s->last ? (size_t)C : 0;
    /* [wte][wpe][layers...][lnfw][lnfb] */
    size_t at = 0, layer = 0, layers = 0;
    s->offset[GPT2_WTE] = at;
    ok = ok && ck_add(at, e[GPT2_WTE], &at);
    s->offset[GPT2_WPE] = at;
    ok = ok && ck_add(at, e[GPT2_WPE], &at);
    for (int t = GPT2_LN1W; t <= GPT2_FCPROJB; t++) {
        s->offset[t] = layer;
        ok = ok && ck_add(layer, e[t], &layer);
    }
    s->layers_at = at;
    s->layer_elems = layer;
    ok = ok && ck_mul(layer, (size_t)gpt2_shard_layers(s), &layers) && ck_add(at, layers, &at);
    s->offset[GPT2_LNFW] = at;
    ok = ok && ck_add(at, e[GPT2_LNFW], &at);
    s->offset[GPT2_LNFB] = at;
    ok = ok && ck_add(at, e[GPT2_LNFB], &at) && at <= SIZE_MAX / 16;
    s->total = at;
    if (!ok) return error_set(err, "the model's shard is too large to address");
    return 0;
}

bool gpt2_shard_holds(const struct gpt2_shard *s, enum gpt2_tensor t)
{
    return s->elems[t] > 0;
}

bool gpt2_shard_counts(const struct gpt2_shard *s, enum gpt2_tensor t)
{
    if (!gpt2_shard_holds(s, t)) return false;
    if (gpt2_tensor_tp_replicated(t) && s->part.tp_rank != 0) return false;
    return t != GPT2_WTE || s->first;
}

int gpt2_shard_layers(const struct gpt2_shard *s)
{
    return (s->part.layer_end - s->part.layer_begin) * s->part.chunks;
}

int gpt2_shard_layer(const struct gpt2_shard *s, int i)
{
    int n = s->part.layer_end - s->part.layer_begin;
    return s->part.layer_begin + i / n * s->part.pp * n + i % n;
}

size_t gpt2_shard_offset(const struct gpt2_shard *s, enum gpt2_tensor t, int l)
{
    if (is_global(t)) return s->offset[t];
    int n = s->part.layer_end - s->part.layer_begin, d = l - s->part.layer_begin;
    int i = d / (s->part.pp * n) * n + d % (s->part.pp * n); /* its block: chunk·n + within */
    return s->layers_at + (size_t)i * s->layer_elems + s->offset[t];
}

int gpt2_shard_each(const struct gpt2_shard *s,
                    int (*fn)(void *ctx, enum gpt2_tensor t, int layer, size_t offset,
                              size_t elems),
                    void *ctx)
{
    for (int t = 0; t < GPT2_TENSORS; t++) {
        if (!gpt2_shard_holds(s, t)) continue;
        int n = is_global(t) ? 1 : gpt2_shard_layers(s);
        for (int i = 0; i < n; i++) {
            int l = is_global(t) ? 0 : gpt2_shard_layer(s, i);
            int rc = fn(ctx, t, l, gpt2_shard_offset(s, t, l), s->elems[t]);
            if (rc) return rc;
        }
    }
    return 0;
}

/* rows × cols at full[row·full_cols + col0 ...] <-> shard (dense rows × cols). */
static void copy_block(float *full, size_t full_cols, size_t col0, float *shard, size_t rows,
                       size_t cols, bool to_shard)
{
    for (size_t r = 0; r < rows; r++) {
        float *f = full + r * full_cols + col0, *sh = shard + r * cols;
        if (to_shard)
            memcpy(sh, f, cols * sizeof *f);
        else
            memcpy(f, sh, cols * sizeof *f);
    }
}

struct copy_ctx {
    const struct gpt2_shard *s;
    struct gpt2_layout full;
    float *full_buf, *shard_buf;
    bool to_shard;
};

static int copy_instance(void *ctx, enum gpt2_tensor t, int l, size_t offset, size_t elems)
{
    struct copy_ctx *c = ctx;
    const struct gpt2_shard *s = c->s;
    size_t C = (size_t)s->cfg.hidden, tp = (size_t)s->part.tp, tr = (size_t)s->part.tp_rank;
    size_t Ct = C / tp;
    size_t per_layer = is_global(t) ? 0 : c->full.elems[t] / (size_t)s->cfg.layers;
    float *full = c->full_buf + c->full.offset[t] + (size_t)l * per_layer;
    float *shard = c->shard_buf + offset;
    switch (t) {
    case GPT2_WTE: { /* a block of rows */
        size_t rows = (size_t)s->cfg.padded_vocab / tp;
        copy_block(full + tr * rows * C, C, 0, shard, rows, C, c->to_shard);
        break;
    }
    case GPT2_QKVW: /* this rank's rows of each of q, k, v */
    case GPT2_QKVB: {
        size_t width = t == GPT2_QKVW ? C : 1;
        for (size_t j = 0; j < 3; j++)
            copy_block(full + (j * C + tr * Ct) * width, width, 0, shard + j * Ct * width, Ct,
                       width, c->to_shard);
        break;
    }
    case GPT2_FCW:
    case GPT2_FCB: {
        size_t width = t == GPT2_FCW ? C : 1;
        copy_block(full + tr * 4 * Ct * width, width, 0, shard, 4 * Ct, width, c->to_shard);
        break;
    }
    case GPT2_ATTPROJW: /* columns */
        copy_block(full, C, tr * Ct, shard, C, Ct, c->to_shard);
        break;
    case GPT2_FCPROJW:
        copy_block(full, 4 * C, tr * 4 * Ct, shard, C, 4 * Ct, c->to_shard);
        break;
    default: /* whole */
        copy_block(full, elems, 0, shard, 1, elems, c->to_shard);
        break;
    }
    return 0;
}

void gpt2_shard_copy(const struct gpt2_shard *s, float *full, float *shard, bool to_shard)
{
    struct copy_ctx c = {.s = s, .full_buf = full, .shard_buf = shard, .to_shard = to_shard};
    gpt2_layout(&s->cfg, &c.full); /* addressable: the shard of it was */
    gpt2_shard_each(s, copy_instance, &c);
}
