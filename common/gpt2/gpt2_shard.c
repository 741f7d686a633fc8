/* gpt2_shard.c — which part of each GPT-2 tensor a (tp, pp) rank holds, the
 * layer-major offsets of its buffer, and the copies between that buffer and
 * llm.c's full tensor-major order. What the model computes with them is the
 * runtime's (runtime/model.c). */
#include "common/gpt2/gpt2_shard.h"

#include <stdint.h>
#include <string.h>

#include "common/checked.h"

bool gpt2_tensor_per_layer(enum gpt2_tensor t)
{
    return !(t == GPT2_WTE || t == GPT2_WPE || t == GPT2_LNFW || t == GPT2_LNFB ||
             t == GPT2_LMHEAD);
}

static bool is_global(enum gpt2_tensor t)
{
    return !gpt2_tensor_per_layer(t);
}

/* Whether one of the shard's layers has an MoE block (moe) or the dense MLP (!moe). */
static bool shard_has_layer(const struct gpt2_shard *s, bool moe)
{
    for (int i = 0; i < gpt2_shard_layers(s); i++)
        if (gpt2_layer_moe(&s->cfg, gpt2_shard_layer(s, i)) == moe) return true;
    return false;
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
    case GPT2_LMHEAD:
    case GPT2_EXPFCW:
    case GPT2_EXPFCB:
    case GPT2_EXPPROJW:
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

void gpt2_stage_vshape(int layers, int pp, int stage, struct gpt2_part *part)
{
    int n = layers / (2 * pp);
    part->layer_begin = stage * n;
    part->layer_end = part->layer_begin + n;
    part->chunks = 2;
    part->v_shape = true;
}

int gpt2_part_chunk_stride(const struct gpt2_part *part)
{
    int n = part->layer_end - part->layer_begin;
    return part->v_shape ? (2 * part->pp - 1 - 2 * part->pp_rank) * n : part->pp * n;
}

/* tp must divide what it splits: the heads (and key/value heads), the MLP's
 * width and the padded vocabulary. */
static int check_tp(const struct gpt2_config *cfg, const struct gpt2_part *p,
                    struct plait_error *err)
{
    int tp = p->tp;
    if (gpt2_moe(cfg) && tp > 0 && cfg->moe_ffn % tp)
        return error_set(err, "tensor parallelism %d must divide the experts' width (%d)", tp,
                         cfg->moe_ffn);
    if (tp < 1 || p->tp_rank < 0 || p->tp_rank >= tp || cfg->heads % tp ||
        gpt2_kv_heads(cfg) % tp || gpt2_ffn(cfg) % tp || cfg->padded_vocab % tp)
        return error_set(err,
                         "tensor parallelism %d (rank %d) must divide the heads (%d), the "
                         "key/value heads (%d), the MLP's width (%lld) and the padded vocabulary "
                         "(%d)",
                         p->tp, p->tp_rank, cfg->heads, gpt2_kv_heads(cfg), gpt2_ffn(cfg),
                         cfg->padded_vocab);
    return 0;
}

/* One MoE layer's router (whole on every tp rank) and experts (each split over tp as the
 * dense MLP is: fc by rows, fcproj by columns, its bias whole; the routed ones over ep):
 * none in a dense model, or when no layer of the shard has an MoE block. */
static bool expert_elems(struct gpt2_shard *s)
{
    const struct gpt2_config *cfg = &s->cfg;
    size_t *e = s->elems;
    long long C = cfg->hidden, tp = s->part.tp;
    long long X = gpt2_part_experts(&s->part, cfg) + cfg->shared_experts; /* ep's cut */
    long long held = shard_has_layer(s, true), bias = cfg->llama ? 0 : held;
    long long Fmt = cfg->moe_ffn / tp, FCmt = gpt2_expert_fc_rows(cfg) / tp;
    return ck_size(&e[GPT2_ROUTERW], held, cfg->experts, C) &&
           ck_size(&e[GPT2_EXPFCW], held, X, FCmt, C) && ck_size(&e[GPT2_EXPFCB], bias, X, Fmt) &&
           ck_size(&e[GPT2_EXPPROJW], held, X, C, Fmt) && ck_size(&e[GPT2_EXPPROJB], bias, X, C);
}

/* Elements of one instance of each tensor the part holds (gpt2_shard.h). */
static bool shard_elems(struct gpt2_shard *s)
{
    const struct gpt2_config *cfg = &s->cfg;
    size_t *e = s->elems;
    long long C = cfg->hidden, tp = s->part.tp, Ct = C / tp, Ft = gpt2_ffn(cfg) / tp;
    long long bias = cfg->llama ? 0 : 1, Vt = cfg->padded_vocab / tp;
    bool ok = ck_size(&e[GPT2_WTE], s->first || (s->last && !cfg->untied), Vt, C) &&
              ck_size(&e[GPT2_WPE], s->first && bias, cfg->max_seq_len, C) &&
              ck_size(&e[GPT2_QKVW], gpt2_qkv_rows(cfg) / tp, C) &&
              ck_size(&e[GPT2_QKVB], bias, gpt2_qkv_rows(cfg) / tp) &&
              ck_size(&e[GPT2_ATTPROJW], C, Ct) &&
              ck_size(&e[GPT2_FCW], gpt2_fc_rows(cfg) / tp, C) && ck_size(&e[GPT2_FCB], bias, Ft) &&
              ck_size(&e[GPT2_FCPROJW], C, Ft) &&
              ck_size(&e[GPT2_LMHEAD], s->last && cfg->untied, Vt, C) && expert_elems(s);
    e[GPT2_LN1W] = e[GPT2_LN2W] = (size_t)C;
    e[GPT2_LN1B] = e[GPT2_ATTPROJB] = e[GPT2_LN2B] = e[GPT2_FCPROJB] = bias ? (size_t)C : 0;
    e[GPT2_LNFW] = s->last ? (size_t)C : 0;
    e[GPT2_LNFB] = s->last && bias ? (size_t)C : 0;
    if (!shard_has_layer(s, false)) /* every layer an MoE block: no dense MLP */
        e[GPT2_FCW] = e[GPT2_FCB] = e[GPT2_FCPROJW] = e[GPT2_FCPROJB] = 0;
    return ok;
}

int gpt2_shard_init(struct gpt2_shard *s, const struct gpt2_config *cfg,
                    const struct gpt2_part *part, struct plait_error *err)
{
    memset(s, 0, sizeof *s);
    const struct gpt2_part *p = part;
    if (check_tp(cfg, p, err)) return -1;
    if (p->ep > 1 &&
        (p->ep_rank < 0 || p->ep_rank >= p->ep || !gpt2_moe(cfg) || cfg->experts % p->ep))
        return error_set(err, "expert parallelism %d (rank %d) must divide the experts (%d)", p->ep,
                         p->ep_rank, cfg->experts);
    int chunks = p->chunks < 1 ? 1 : p->chunks;
    long long n = (long long)p->layer_end - p->layer_begin;
    if (p->pp < 1 || p->pp_rank < 0 || p->pp_rank >= p->pp || p->layer_begin < 0 || n < 1 ||
        (p->v_shape && chunks != 2) ||
        p->layer_end + (long long)(chunks - 1) * gpt2_part_chunk_stride(p) > cfg->layers)
        return error_set(err, "pipeline stage %d of %d: %d chunk(s) of layers [%d, %d) of %d",
                         p->pp_rank, p->pp, chunks, p->layer_begin, p->layer_end, cfg->layers);
    s->cfg = *cfg;
    s->part = *p;
    s->part.chunks = chunks;
    s->first = p->pp_rank == 0;
    s->last = p->v_shape ? p->pp_rank == 0 : p->pp_rank == p->pp - 1;
    size_t *e = s->elems;
    bool ok = shard_elems(s);
    /* [wte][wpe][layers...][lnfw][lnfb][lmhead] */
    size_t at = 0, layer = 0, layers = 0;
    s->offset[GPT2_WTE] = at;
    ok = ok && ck_add(at, e[GPT2_WTE], &at);
    s->offset[GPT2_WPE] = at;
    ok = ok && ck_add(at, e[GPT2_WPE], &at);
    size_t moe_layer = 0;
    for (int t = GPT2_LN1W; t <= GPT2_LN2B; t++) {
        s->offset[t] = layer;
        ok = ok && ck_add(layer, e[t], &layer);
    }
    moe_layer = layer; /* an MoE block: the attention's, then the router's and experts' */
    for (int t = GPT2_FCW; t <= GPT2_FCPROJB; t++) {
        s->offset[t] = layer;
        ok = ok && ck_add(layer, e[t], &layer);
    }
    for (int t = GPT2_ROUTERW; t <= GPT2_EXPPROJB; t++) {
        s->offset[t] = moe_layer;
        ok = ok && ck_add(moe_layer, e[t], &moe_layer);
    }
    s->layers_at = at;
    s->layer_elems = layer;
    s->moe_layer_elems = moe_layer;
    for (int i = 0; ok && i < gpt2_shard_layers(s); i++)
        ok = ck_add(layers, gpt2_shard_block_elems(s, i), &layers);
    ok = ok && ck_add(at, layers, &at);
    for (int t = GPT2_LNFW; t <= GPT2_LMHEAD; t++) {
        s->offset[t] = at;
        ok = ok && ck_add(at, e[t], &at);
    }
    ok = ok && at <= SIZE_MAX / 16;
    s->total = at;
    s->layers_end = s->layers_at + layers;
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
    return s->part.layer_begin + i / n * gpt2_part_chunk_stride(&s->part) + i % n;
}

int gpt2_shard_block(const struct gpt2_shard *s, int l)
{
    int n = s->part.layer_end - s->part.layer_begin, d = l - s->part.layer_begin;
    int stride = gpt2_part_chunk_stride(&s->part);
    return d / stride * n + d % stride; /* chunk·n + within */
}

size_t gpt2_shard_offset(const struct gpt2_shard *s, enum gpt2_tensor t, int l)
{
    if (is_global(t)) return s->offset[t];
    return gpt2_shard_block_at(s, gpt2_shard_block(s, l)) + s->offset[t];
}

size_t gpt2_shard_block_max(const struct gpt2_shard *s)
{
    size_t most = 0;
    for (int i = 0; i < gpt2_shard_layers(s); i++)
        most = gpt2_shard_block_elems(s, i) > most ? gpt2_shard_block_elems(s, i) : most;
    return most;
}

size_t gpt2_shard_block_elems(const struct gpt2_shard *s, int i)
{
    return gpt2_layer_moe(&s->cfg, gpt2_shard_layer(s, i)) ? s->moe_layer_elems : s->layer_elems;
}

size_t gpt2_shard_block_at(const struct gpt2_shard *s, int i)
{
    if (!gpt2_moe(&s->cfg)) return s->layers_at + (size_t)i * s->layer_elems;
    size_t at = s->layers_at;
    for (int j = 0; j < i; j++) at += gpt2_shard_block_elems(s, j);
    return at;
}

bool gpt2_shard_has(const struct gpt2_shard *s, enum gpt2_tensor t, int l)
{
    return gpt2_shard_holds(s, t) && (is_global(t) || gpt2_tensor_in_layer(&s->cfg, t, l));
}

/* The shard's layer blocks before block i with an instance of per-layer tensor t. */
static size_t blocks_with(const struct gpt2_shard *s, enum gpt2_tensor t, int i)
{
    size_t n = 0;
    for (int j = 0; j < i; j++) n += gpt2_tensor_in_layer(&s->cfg, t, gpt2_shard_layer(s, j));
    return n;
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
            if (!gpt2_shard_has(s, t, l)) continue;
            int rc = fn(ctx, t, l, gpt2_shard_offset(s, t, l), s->elems[t]);
            if (rc) return rc;
        }
    }
    return 0;
}

size_t gpt2_shard_instance_at(const struct gpt2_shard *s, enum gpt2_tensor t, int l)
{
    size_t at = 0;
    int n = gpt2_shard_layers(s);
    for (int u = 0; u < (int)t; u++) at += s->elems[u] * (is_global(u) ? 1 : blocks_with(s, u, n));
    if (is_global(t)) return at;
    return at + blocks_with(s, t, gpt2_shard_block(s, l)) * s->elems[t];
}

/* How tensor parallelism cuts one instance of t (gpt2_shard.h): the whole
 * instance as rows × `width` columns. By columns, each rank holds a block of
 * `cols` columns starting at column tp_rank·cols. By rows, the rows are in
 * bands (q, k, v are three; a Llama's gate and up two) and each rank holds,
 * of each band b, band_rows[b]/tp rows starting at tp_rank·band_rows[b]/tp
 * within it. */
struct tp_cut {
    size_t width;        /* columns of the whole instance */
    int bands;           /* row bands (by rows) */
    size_t band_rows[3]; /* rows of each band of the whole instance */
    size_t uniform_rows; /* > 0: every band this many rows instead (the experts' bands: each
                            expert's fc, a Llama's gate and up of each) */
    size_t cols;         /* columns a rank holds (by columns) */
    bool by_columns;
};

static struct tp_cut tp_cut_of(const struct gpt2_config *cfg, enum gpt2_tensor t, int tp)
{
    size_t C = (size_t)cfg->hidden, T = (size_t)tp, F = (size_t)gpt2_ffn(cfg);
    size_t hs = C / (size_t)cfg->heads, kv = (size_t)gpt2_kv_heads(cfg) * hs;
    size_t Vp = (size_t)cfg->padded_vocab, fc_bands = cfg->llama ? 2 : 1;
    size_t X = (size_t)(cfg->experts + cfg->shared_experts), Fm = (size_t)cfg->moe_ffn;
    switch (t) {
    case GPT2_WTE:
    case GPT2_LMHEAD:
        return (struct tp_cut){C, 1, {Vp}, 0, 0, false};
    case GPT2_QKVW:
    case GPT2_QKVB:
        return (struct tp_cut){t == GPT2_QKVW ? C : 1, 3, {C, kv, kv}, 0, 0, false};
    case GPT2_FCW:
    case GPT2_FCB:
        return (struct tp_cut){t == GPT2_FCW ? C : 1, (int)fc_bands, {F, F}, 0, 0, false};
    case GPT2_ATTPROJW:
        return (struct tp_cut){C, 0, {0}, 0, C / T, true};
    case GPT2_FCPROJW:
        return (struct tp_cut){F, 0, {0}, 0, F / T, true};
    case GPT2_EXPFCW: /* each expert's fc as the dense one's: bands of Fm rows */
    case GPT2_EXPFCB:
        return (struct tp_cut){t == GPT2_EXPFCW ? C : 1, (int)(X * fc_bands), {0}, Fm, 0, false};
    case GPT2_EXPPROJW: /* (X·C rows, Fm columns) */
        return (struct tp_cut){Fm, 0, {0}, 0, Fm / T, true};
    default:
        return (struct tp_cut){0, 0, {0}, 0, 0, false}; /* whole on every rank */
    }
}

/* Rows of band b of the whole instance. */
static size_t band_rows_of(const struct tp_cut *c, int b)
{
    return c->uniform_rows ? c->uniform_rows : c->band_rows[b];
}

size_t gpt2_tp_to_whole(const struct gpt2_config *cfg, enum gpt2_tensor t, int tp, int tp_rank,
                        size_t i, size_t elems, size_t *run)
{
    struct tp_cut c = tp_cut_of(cfg, t, tp);
    size_t r = (size_t)tp_rank;
    if (c.width == 0 || tp == 1) {
        *run = elems - i;
        return i;
    }
    if (c.by_columns) { /* row i / cols of the rank's block */
        size_t row = i / c.cols, col = i % c.cols;
        *run = c.cols - col;
        return row * c.width + r * c.cols + col;
    }
    size_t local = 0, whole = 0; /* the band's first element here, its first row whole */
    for (int b = 0;; b++) {
        size_t rows = band_rows_of(&c, b) / (size_t)tp, n = rows * c.width;
        if (i < local + n || b == c.bands - 1) {
            *run = local + n - i;
            return (whole + r * rows) * c.width + (i - local);
        }
        local += n;
        whole += band_rows_of(&c, b);
    }
}

int gpt2_tp_owner(const struct gpt2_config *cfg, enum gpt2_tensor t, int tp, size_t g, size_t elems,
                  size_t *local, size_t *run)
{
    struct tp_cut c = tp_cut_of(cfg, t, tp);
    if (c.width == 0 || tp == 1) {
        *local = g;
        *run = elems - g;
        return 0;
    }
    size_t row = g / c.width, col = g % c.width;
    if (c.by_columns) {
        size_t r = col / c.cols, within = col % c.cols;
        *local = row * c.cols + within;
        *run = c.cols - within;
        return (int)r;
    }
    size_t local_row = 0; /* the band's first row on its rank */
    for (int b = 0;; b++) {
        size_t rows = band_rows_of(&c, b) / (size_t)tp;
        if (row < band_rows_of(&c, b) || b == c.bands - 1) {
            size_t r = row / rows, rank_row = row % rows;
            *local = (local_row + rank_row) * c.width + col;
            *run = (rows - rank_row) * c.width - col;
            return (int)r;
        }
        row -= band_rows_of(&c, b);
        local_row += rows;
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
    size_t per_layer = is_global(t) ? 0 : elems; /* tp 1 with experts: an instance whole */
    if (!is_global(t) && c->full.elems[t])
        per_layer = c->full.elems[t] / (size_t)gpt2_tensor_layers_before(&s->cfg, t, s->cfg.layers);
    float *full = c->full_buf + c->full.offset[t] +
                  (size_t)gpt2_tensor_layers_before(&s->cfg, t, l) * per_layer;
    float *shard = c->shard_buf + offset;
    for (size_t i = 0, run; i < elems; i += run) {
        size_t g = gpt2_shard_to_whole(s, t, i, elems, &run);
        if (c->to_shard)
            memcpy(shard + i, full + g, run * sizeof *full);
        else
            memcpy(full + g, shard + i, run * sizeof *full);
    }
    return 0;
}

void gpt2_shard_copy(const struct gpt2_shard *s, float *full, float *shard, bool to_shard)
{
    struct copy_ctx c = {.s = s, .full_buf = full, .shard_buf = shard, .to_shard = to_shard};
    gpt2_layout(&s->cfg, &c.full); /* addressable: the shard of it was */
    gpt2_shard_each(s, copy_instance, &c);
}
