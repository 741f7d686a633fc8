/* test_gpt2_shard.c — the parameter shards of a tp × pp layout: together they
 * cover every parameter of the llm.c model exactly (replicated ones
 * identically, and counted by exactly one rank), extracting and writing back
 * round-trips, each rank's buffer is layer-major, and the Megatron splits
 * take the right rows and columns; with an interleaved schedule's chunks a
 * stage holds layers s, pp + s, ... (in chunks of layers / (pp·v)). */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "common/gpt2/gpt2_shard.h"
#include "common/gpt2/gpt2_units.h"

/* The suite runs for each: GPT-2, then a Llama (grouped-query: 2 key/value
 * heads of 4, an MLP 12 wide whose gate and up are packed, untied head). */
static const struct gpt2_config gpt2_cfg = {
    .max_seq_len = 5, .vocab = 30, .padded_vocab = 32, .layers = 5, .heads = 4, .hidden = 8};
static const struct gpt2_config llama_cfg = {.max_seq_len = 5,
                                             .vocab = 30,
                                             .padded_vocab = 32,
                                             .layers = 5,
                                             .heads = 4,
                                             .hidden = 8,
                                             .llama = true,
                                             .kv_heads = 2,
                                             .ffn_hidden = 12,
                                             .untied = true};
/* Mixture of experts: each with 3 experts (top 2) and a shared one, 4 wide, in layers
 * 1 and 3 (every 2); the other layers keep the dense MLP */
static struct gpt2_config moe_of(struct gpt2_config c)
{
    c.experts = 3, c.top_k = 2, c.moe_every = 2, c.shared_experts = 1, c.moe_ffn = 4;
    return c;
}
static struct gpt2_config cfg;

struct counting {
    const struct gpt2_shard *s;
    const float *shard; /* its values: their indexes in the full model */
    int *counted;       /* (full.total) */
};

static int count_instance(void *ctx, enum gpt2_tensor t, int layer, size_t off, size_t n)
{
    (void)layer;
    struct counting *c = ctx;
    if (gpt2_shard_counts(c->s, t))
        for (size_t i = off; i < off + n; i++) c->counted[(size_t)c->shard[i]]++;
    return 0;
}

/* The shard of part, its values copied out of model (the caller frees them) and written
 * back into back; NULL (a failed check) when the part has no shard. */
static float *copied_out_and_back(struct gpt2_shard *s, const struct gpt2_config *c,
                                  const struct gpt2_part *part, float *model, float *back)
{
    struct plait_error err;
    if (gpt2_shard_init(s, c, part, &err)) {
        CHECK(0, "tp %d pp %d ep %d: %s", part->tp, part->pp, part->ep, err.text);
        return NULL;
    }
    float *shard = malloc(s->total * sizeof *shard);
    gpt2_shard_copy(s, model, shard, true);
    gpt2_shard_copy(s, back, shard, false);
    return shard;
}

static void test_shards_cover_the_model_exactly(void)
{
    struct gpt2_layout full;
    CHECK(gpt2_layout(&cfg, &full) == 0, "layout");
    float *model = malloc(full.total * sizeof *model), *back = calloc(full.total, sizeof *back);
    int *covered = calloc(full.total, sizeof *covered),
        *counted = calloc(full.total, sizeof *counted);
    for (size_t i = 0; i < full.total; i++) model[i] = (float)i;
    const int layouts[][2] = {{1, 1}, {2, 1}, {4, 1}, {1, 2}, {1, 5}, {2, 2}, {4, 3}, {2, 4}};
    for (size_t k = 0; k < sizeof layouts / sizeof *layouts; k++) {
        int tp = layouts[k][0], pp = layouts[k][1];
        if (gpt2_kv_heads(&cfg) % tp) continue; /* a Llama's 2 key/value heads: tp 1, 2 */
        memset(back, 0, full.total * sizeof *back);
        memset(covered, 0, full.total * sizeof *covered);
        memset(counted, 0, full.total * sizeof *counted);
        for (int st = 0; st < pp; st++)
            for (int r = 0; r < tp; r++) {
                struct gpt2_part part = {.tp = tp, .tp_rank = r, .pp = pp, .pp_rank = st};
                gpt2_stage_layers(cfg.layers, pp, st, &part.layer_begin, &part.layer_end);
                struct gpt2_shard s;
                float *shard = copied_out_and_back(&s, &cfg, &part, model, back);
                if (!shard) continue;
                /* which full elements this shard holds: their values are their indexes */
                for (size_t i = 0; i < s.total; i++) covered[(size_t)shard[i]]++;
                gpt2_shard_each(&s, count_instance, &(struct counting){&s, shard, counted});
                free(shard);
            }
        CHECK(memcmp(back, model, full.total * sizeof *model) == 0,
              "tp %d pp %d: written back differs", tp, pp);
        /* every element held; replicated ones by every tp rank of their stage(s) */
        size_t missing = 0, not_once = 0;
        for (size_t i = 0; i < full.total; i++) {
            missing += covered[i] == 0;
            not_once += counted[i] != 1;
        }
        CHECK(missing == 0, "tp %d pp %d: %zu parameters held by no rank", tp, pp, missing);
        /* sums over the ranks (the gradient norm, the dump) count each one once */
        CHECK(not_once == 0, "tp %d pp %d: %zu parameters not counted exactly once", tp, pp,
              not_once);
        /* a tied wte on the first and last stage: twice when pp > 1, per tp shard once;
         * untied on the first only */
        size_t wte0 = full.offset[GPT2_WTE];
        CHECK(covered[wte0] == (pp > 1 && !cfg.untied ? 2 : 1), "tp %d pp %d: wte[0] held %d times",
              tp, pp, covered[wte0]);
        size_t ln = full.offset[GPT2_LN1W];
        CHECK(covered[ln] == tp, "tp %d pp %d: ln1w held %d times", tp, pp, covered[ln]);
        size_t qkv = full.offset[GPT2_QKVW];
        CHECK(covered[qkv] == 1, "tp %d pp %d: qkvw held %d times", tp, pp, covered[qkv]);
    }
    free(model);
    free(back);
    free(covered);
    free(counted);
}

static void test_whole_model_is_a_layer_major_permutation(void)
{
    struct gpt2_part whole = gpt2_part_whole(&cfg);
    struct gpt2_shard s;
    struct gpt2_layout full;
    struct plait_error err;
    CHECK(gpt2_shard_init(&s, &cfg, &whole, &err) == 0, "%s", err.text);
    gpt2_layout(&cfg, &full);
    CHECK(s.total == full.total, "%zu vs %zu", s.total, full.total);
    /* layer 1's qkvw follows layer 1's ln1b, not layer 0's qkvw */
    CHECK(gpt2_shard_offset(&s, GPT2_QKVW, 1) ==
              gpt2_shard_offset(&s, GPT2_LN1B, 1) + s.elems[GPT2_LN1B],
          "not layer-major");
    CHECK(gpt2_shard_offset(&s, GPT2_LN1W, 1) == gpt2_shard_offset(&s, GPT2_FCPROJB, 0) + 8,
          "layers not contiguous");
}

static void test_megatron_splits_take_heads_and_columns(void)
{
    struct gpt2_layout full;
    gpt2_layout(&cfg, &full);
    float *model = malloc(full.total * sizeof *model);
    for (size_t i = 0; i < full.total; i++) model[i] = (float)i;
    struct gpt2_part part = {.tp = 2, .tp_rank = 1, .pp = 1, .layer_begin = 0, .layer_end = 5};
    struct gpt2_shard s;
    struct plait_error err;
    CHECK(gpt2_shard_init(&s, &cfg, &part, &err) == 0, "%s", err.text);
    float *shard = malloc(s.total * sizeof *shard);
    gpt2_shard_copy(&s, model, shard, true);
    size_t C = 8;
    /* qkvw of layer 0, rank 1: rows 4..7 of q, of k (8+4..), of v (16+4..) */
    const float *q = shard + gpt2_shard_offset(&s, GPT2_QKVW, 0);
    CHECK(q[0] == (float)(full.offset[GPT2_QKVW] + 4 * C), "q row 4: %g", q[0]);
    CHECK(q[4 * C] == (float)(full.offset[GPT2_QKVW] + 12 * C), "k row 12: %g", q[4 * C]);
    CHECK(q[8 * C] == (float)(full.offset[GPT2_QKVW] + 20 * C), "v row 20: %g", q[8 * C]);
    /* attprojw of layer 0: columns 4..7 of each row */
    const float *a = shard + gpt2_shard_offset(&s, GPT2_ATTPROJW, 0);
    CHECK(a[0] == (float)(full.offset[GPT2_ATTPROJW] + 4) &&
              a[4] == (float)(full.offset[GPT2_ATTPROJW] + C + 4),
          "attprojw: %g %g", a[0], a[4]);
    /* wte: vocabulary rows 16..31 */
    CHECK(shard[gpt2_shard_offset(&s, GPT2_WTE, 0)] == (float)(16 * C), "wte row 16");
    free(shard);
    free(model);
}

/* Interleaved chunks (chunk c of stage s: virtual stage c·pp + s) and
 * DualPipeV's V (chunk 1 of stage s: virtual stage 2·pp-1-s, the first
 * stage holding the head too) */
static void test_interleaved_chunks_cover_the_model_exactly(void)
{
    struct gpt2_config c8 = {
        .max_seq_len = 5, .vocab = 30, .padded_vocab = 32, .layers = 8, .heads = 4, .hidden = 8};
    if (gpt2_moe(&cfg)) c8 = cfg, c8.layers = 8; /* layer blocks of two sizes */
    struct gpt2_layout full;
    CHECK(gpt2_layout(&c8, &full) == 0, "layout");
    float *model = malloc(full.total * sizeof *model), *back = calloc(full.total, sizeof *back);
    int *counted = calloc(full.total, sizeof *counted);
    for (size_t i = 0; i < full.total; i++) model[i] = (float)i;
    const int layouts[][4] = {{1, 2, 2, 0}, {2, 2, 2, 0}, {1, 4, 2, 0}, {2, 2, 4, 0},
                              {1, 2, 2, 1}, {2, 2, 2, 1}, {1, 4, 2, 1}}; /* tp, pp, v, V */
    for (size_t k = 0; k < sizeof layouts / sizeof *layouts; k++) {
        int tp = layouts[k][0], pp = layouts[k][1], v = layouts[k][2], n = 8 / (pp * v);
        bool vee = layouts[k][3];
        memset(back, 0, full.total * sizeof *back);
        memset(counted, 0, full.total * sizeof *counted);
        for (int st = 0; st < pp; st++)
            for (int r = 0; r < tp; r++) {
                struct gpt2_part part = {.tp = tp, .tp_rank = r, .pp = pp, .pp_rank = st};
                if (vee)
                    gpt2_stage_vshape(c8.layers, pp, st, &part);
                else
                    gpt2_stage_chunks(c8.layers, pp, v, st, &part);
                struct gpt2_shard s;
                struct plait_error err;
                if (gpt2_shard_init(&s, &c8, &part, &err)) {
                    CHECK(0, "tp %d pp %d v %d: %s", tp, pp, v, err.text);
                    continue;
                }
                CHECK(gpt2_shard_layers(&s) == n * v, "stage %d: %d layers", st,
                      gpt2_shard_layers(&s));
                for (int i = 0; i < n * v; i++) { /* chunk c is virtual stage c·pp + st */
                    int vs = vee ? (i / n ? 2 * pp - 1 - st : st) : i / n * pp + st;
                    int want = vs * n + i % n, l = gpt2_shard_layer(&s, i);
                    CHECK(l == want, "pp %d v %d stage %d: layer %d is %d, want %d", pp, v, st, i,
                          l, want);
                    CHECK(gpt2_shard_offset(&s, GPT2_LN1W, l) == gpt2_shard_block_at(&s, i),
                          "pp %d v %d stage %d: layer %d not block %d", pp, v, st, l, i);
                }
                bool last = vee ? st == 0 : st == pp - 1;
                CHECK(s.first == (st == 0) && s.last == last &&
                          gpt2_shard_holds(&s, GPT2_LNFW) == last,
                      "stage %d: first/last", st);
                float *shard = malloc(s.total * sizeof *shard);
                gpt2_shard_copy(&s, model, shard, true);
                gpt2_shard_copy(&s, back, shard, false);
                gpt2_shard_each(&s, count_instance, &(struct counting){&s, shard, counted});
                free(shard);
            }
        CHECK(memcmp(back, model, full.total * sizeof *model) == 0,
              "tp %d pp %d v %d: written back differs", tp, pp, v);
        size_t not_once = 0;
        for (size_t i = 0; i < full.total; i++) not_once += counted[i] != 1;
        CHECK(not_once == 0, "tp %d pp %d v %d: %zu parameters not counted exactly once", tp, pp, v,
              not_once);
    }
    /* chunks past the model's layers */
    struct gpt2_part p = {
        .tp = 1, .pp = 2, .pp_rank = 1, .layer_begin = 2, .layer_end = 4, .chunks = 3};
    struct gpt2_shard s;
    struct plait_error err;
    CHECK(gpt2_shard_init(&s, &c8, &p, &err) != 0, "3 chunks of 2 layers at pp 2 in 8 layers");
    free(model);
    free(back);
    free(counted);
}

/* A Llama's packed tensors split per band: q, k, v by their own heads, gate
 * and up each by rows. */
static void test_llama_splits_take_each_band(void)
{
    struct gpt2_layout full;
    gpt2_layout(&llama_cfg, &full);
    float *model = malloc(full.total * sizeof *model);
    for (size_t i = 0; i < full.total; i++) model[i] = (float)i;
    struct gpt2_part part = {.tp = 2, .tp_rank = 1, .pp = 1, .layer_begin = 0, .layer_end = 5};
    struct gpt2_shard s;
    struct plait_error err;
    CHECK(gpt2_shard_init(&s, &llama_cfg, &part, &err) == 0, "%s", err.text);
    float *shard = malloc(s.total * sizeof *shard);
    gpt2_shard_copy(&s, model, shard, true);
    size_t C = 8;
    /* qkvw (16 rows: q 8, k 4, v 4), rank 1: q rows 4..7, k rows 10..11, v rows 14..15 */
    const float *q = shard + gpt2_shard_offset(&s, GPT2_QKVW, 0);
    CHECK(q[0] == (float)(full.offset[GPT2_QKVW] + 4 * C), "q row 4: %g", q[0]);
    CHECK(q[4 * C] == (float)(full.offset[GPT2_QKVW] + 10 * C), "k row 10: %g", q[4 * C]);
    CHECK(q[6 * C] == (float)(full.offset[GPT2_QKVW] + 14 * C), "v row 14: %g", q[6 * C]);
    CHECK(s.elems[GPT2_QKVW] == 8 * C, "qkvw shard of %zu", s.elems[GPT2_QKVW]);
    /* fcw (24 rows: gate 12, up 12), rank 1: gate rows 6..11, then up rows 18..23 */
    const float *fc = shard + gpt2_shard_offset(&s, GPT2_FCW, 0);
    CHECK(fc[0] == (float)(full.offset[GPT2_FCW] + 6 * C), "gate row 6: %g", fc[0]);
    CHECK(fc[6 * C] == (float)(full.offset[GPT2_FCW] + 18 * C), "up row 18: %g", fc[6 * C]);
    /* fcprojw (8, 12): columns 6..11 */
    const float *d = shard + gpt2_shard_offset(&s, GPT2_FCPROJW, 0);
    CHECK(d[0] == (float)(full.offset[GPT2_FCPROJW] + 6) &&
              d[6] == (float)(full.offset[GPT2_FCPROJW] + 12 + 6),
          "fcprojw: %g %g", d[0], d[6]);
    /* no biases, no wpe; the head its own vocabulary shard (rows 16..31) */
    CHECK(!gpt2_shard_holds(&s, GPT2_QKVB) && !gpt2_shard_holds(&s, GPT2_WPE) &&
              !gpt2_shard_holds(&s, GPT2_LN1B),
          "a Llama holds no biases");
    CHECK(shard[gpt2_shard_offset(&s, GPT2_LMHEAD, 0)] ==
              (float)(full.offset[GPT2_LMHEAD] + 16 * C),
          "lmhead row 16");
    free(shard);
    free(model);
}

static void test_impossible_parts_are_refused(void)
{
    struct gpt2_shard s;
    struct plait_error err;
    struct gpt2_part p = {.tp = 3, .pp = 1, .layer_end = 5};
    CHECK(gpt2_shard_init(&s, &cfg, &p, &err) != 0, "tp 3 of 4 heads");
    p = (struct gpt2_part){.tp = 1, .pp = 2, .pp_rank = 1, .layer_begin = 5, .layer_end = 5};
    CHECK(gpt2_shard_init(&s, &cfg, &p, &err) != 0, "an empty stage");
    int b, e, total = 0;
    for (int st = 0; st < 3; st++) {
        gpt2_stage_layers(5, 3, st, &b, &e);
        CHECK(b == total && e - b == (st < 2 ? 2 : 1), "stage %d: [%d, %d)", st, b, e);
        total = e;
    }
}

/* Where each element of a rank's instance sits in the whole instance, and
 * back: the mapping and its inverse agree element by element, and every run
 * they report is contiguous on both sides (resharding reads by runs). */
static void test_tp_mapping_and_its_inverse_agree(void)
{
    struct gpt2_layout full;
    gpt2_layout(&cfg, &full);
    for (int tp = 1; tp <= 4; tp *= 2)
        for (int t = 0; t < GPT2_TENSORS; t++) {
            bool layered = gpt2_tensor_per_layer(t);
            size_t layers = (size_t)gpt2_tensor_layers_before(&cfg, t, cfg.layers);
            if (!full.elems[t]) continue; /* none in this model */
            size_t whole = full.elems[t] / (layered ? layers : 1);
            size_t local = gpt2_tensor_tp_replicated(t) ? whole : whole / (size_t)tp;
            int *seen = calloc(whole, sizeof *seen);
            for (int r = 0; r < tp; r++)
                for (size_t i = 0; i < local; i++) {
                    size_t run, run2, back;
                    size_t g = gpt2_tp_to_whole(&cfg, t, tp, r, i, local, &run);
                    int owner = gpt2_tp_owner(&cfg, t, tp, g, whole, &back, &run2);
                    bool replicated = gpt2_tensor_tp_replicated(t);
                    CHECK(g < whole && run >= 1 && i + run <= local, "%s tp %d: element %zu",
                          gpt2_tensor_names[t], tp, i);
                    CHECK(back == i && owner == (replicated ? 0 : r) && run2 >= 1 &&
                              g + run2 <= whole,
                          "%s tp %d rank %d: element %zu -> %zu -> rank %d element %zu",
                          gpt2_tensor_names[t], tp, r, i, g, owner, back);
                    if (i + 1 < local && run > 1) {
                        size_t next_run,
                            next = gpt2_tp_to_whole(&cfg, t, tp, r, i + 1, local, &next_run);
                        CHECK(next == g + 1 && next_run == run - 1, "%s: a run breaks at %zu",
                              gpt2_tensor_names[t], i);
                    }
                    if (!replicated || r == 0) seen[g]++;
                }
            for (size_t g = 0; g < whole; g++)
                CHECK(seen[g] == 1, "%s tp %d: element %zu held %d times", gpt2_tensor_names[t], tp,
                      g, seen[g]);
            free(seen);
        }
}

struct order_ctx {
    const struct gpt2_shard *s;
    size_t at;
};

static int check_order(void *ctx, enum gpt2_tensor t, int layer, size_t off, size_t n)
{
    (void)off;
    struct order_ctx *o = ctx;
    CHECK(gpt2_shard_instance_at(o->s, t, layer) == o->at, "%s layer %d in file order",
          gpt2_tensor_names[t], layer);
    o->at += n;
    return 0;
}

static void test_instances_in_file_order(void)
{
    struct plait_error err;
    struct gpt2_part p = {.tp = 2, .tp_rank = 1, .pp = 2, .pp_rank = 0, .chunks = 1};
    gpt2_stage_chunks(4, 2, 2, 0, &p);
    struct gpt2_config c4 = cfg;
    c4.layers = 4;
    p.tp = 2, p.tp_rank = 1, p.pp = 2;
    struct gpt2_shard s;
    CHECK(gpt2_shard_init(&s, &c4, &p, &err) == 0, "%s", err.text);
    struct order_ctx o = {&s, 0};
    gpt2_shard_each(&s, check_order, &o);
    CHECK(o.at == s.total, "the instances cover the shard");
}

/* Checks one instance against ZeRO 3's units: inside the unit it is in. */
struct unit_check {
    const struct gpt2_shard *s;
    size_t padded;
};

static int instance_in_its_unit(void *ctx, enum gpt2_tensor t, int layer, size_t off, size_t n)
{
    struct unit_check *c = ctx;
    int u = gpt2_unit_of(c->s, t, layer);
    struct gpt2_unit un = gpt2_unit(c->s, c->padded, u);
    CHECK(u >= 0 && u < gpt2_units_count(c->s) && off >= un.at && off + n <= un.at + un.elems,
          "tensor %d layer %d [%zu, +%zu) outside its unit %d [%zu, +%zu)", (int)t, layer, off, n,
          u, un.at, un.elems);
    CHECK(gpt2_tensor_per_layer(t) == (u > 0 && u < gpt2_units_count(c->s) - 1),
          "tensor %d in unit %d", (int)t, u);
    return 0;
}

/* Units tile the padded buffer in order; each dp rank's parts of them tile
 * the unit in rank order and, unit after unit, its whole slice. */
static void check_units(const struct gpt2_shard *s, int dp)
{
    size_t padded = (s->total + (size_t)dp - 1) / (size_t)dp * (size_t)dp, slice = padded / dp;
    struct unit_check c = {.s = s, .padded = padded};
    gpt2_shard_each(s, instance_in_its_unit, &c);
    size_t at = 0, most = 0, taken[8] = {0}, counts[8];
    for (int u = 0; u < gpt2_units_count(s); u++) {
        struct gpt2_unit un = gpt2_unit(s, padded, u);
        CHECK(un.at == at, "dp %d: unit %d starts at %zu, not %zu", dp, u, un.at, at);
        at += un.elems;
        if (un.elems > most) most = un.elems;
        size_t sum = 0;
        for (int r = 0; r < dp; r++) {
            size_t from = 99;
            gpt2_unit_counts(un, slice, dp, r, counts, &from);
            CHECK(counts[r] == 0 || (from == taken[r] && un.at + sum == (size_t)r * slice + from),
                  "dp %d unit %d rank %d: its part starts at %zu of its slice, not %zu", dp, u, r,
                  from, taken[r]);
            taken[r] += counts[r];
            sum += counts[r];
        }
        CHECK(sum == un.elems, "dp %d unit %d: the parts sum to %zu of %zu", dp, u, sum, un.elems);
    }
    CHECK(at == padded, "dp %d: the units cover %zu of %zu", dp, at, padded);
    CHECK(most == gpt2_unit_max_elems(s, padded), "dp %d: the largest unit", dp);
    for (int r = 0; r < dp; r++)
        CHECK(taken[r] == slice, "dp %d rank %d: its parts cover %zu of its slice's %zu", dp, r,
              taken[r], slice);
}

static void test_zero3_units_tile_the_buffer_and_the_slices(void)
{
    const struct gpt2_config c8 = {
        .max_seq_len = 5, .vocab = 30, .padded_vocab = 32, .layers = 8, .heads = 4, .hidden = 8};
    const int layouts[][3] = {{1, 1, 1}, {2, 1, 1}, {1, 2, 1}, {1, 2, 2}, {2, 4, 1}}; /* tp pp v */
    for (size_t k = 0; k < sizeof layouts / sizeof *layouts; k++) {
        int tp = layouts[k][0], pp = layouts[k][1], v = layouts[k][2];
        if (gpt2_kv_heads(&cfg) % tp) continue;
        for (int st = 0; st < pp; st++) {
            struct gpt2_part part = {.tp = tp, .tp_rank = tp - 1, .pp = pp, .pp_rank = st};
            gpt2_stage_chunks(c8.layers, pp, v, st, &part);
            struct gpt2_config mc = c8;
            if (cfg.llama || gpt2_moe(&cfg)) { /* (MoE: units of two sizes) */
                mc = cfg;
                mc.layers = 8;
            }
            struct gpt2_shard s;
            struct plait_error err;
            if (gpt2_shard_init(&s, &mc, &part, &err)) {
                CHECK(0, "tp %d pp %d v %d: %s", tp, pp, v, err.text);
                continue;
            }
            CHECK(gpt2_units_count(&s) == 8 / pp + 2, "pp %d: %d units", pp, gpt2_units_count(&s));
            for (int dp = 1; dp <= 5; dp++) check_units(&s, dp);
        }
    }
}

/* Expert parallelism's cut (gpt2_experts.c): over ep ranks (and tp), every element of the
 * model is held and copied out and back; the cut and its owner agree element by element (a
 * routed expert's on its ep rank, a shared one's on rank 0's copy); and what
 * gpt2_shard_routed_at calls routed is exactly the E/ep routed experts' elements. */
static void test_ep_spreads_the_routed_experts_once(void)
{
    struct gpt2_config c = moe_of(cfg);
    c.experts = 4;
    struct gpt2_layout full;
    CHECK(gpt2_layout(&c, &full) == 0, "layout");
    float *model = malloc(full.total * sizeof *model), *back = calloc(full.total, sizeof *back);
    int *held = calloc(full.total, sizeof *held);
    for (size_t i = 0; i < full.total; i++) model[i] = (float)i;
    for (int ep = 2; ep <= 4; ep *= 2)
        for (int tp = 1; tp <= 2; tp++) {
            memset(back, 0, full.total * sizeof *back);
            memset(held, 0, full.total * sizeof *held);
            size_t routed = 0, want = 0;
            for (int e = 0; e < ep; e++)
                for (int r = 0; r < tp; r++) {
                    struct gpt2_part part = {.tp = tp,
                                             .tp_rank = r,
                                             .pp = 1,
                                             .layer_end = c.layers,
                                             .ep = ep,
                                             .ep_rank = e};
                    struct gpt2_shard sh;
                    float *shard = copied_out_and_back(&sh, &c, &part, model, back);
                    if (!shard) continue;
                    for (size_t i = 0; i < sh.total; i++) held[(size_t)shard[i]]++;
                    for (size_t at = 0, run; at < sh.total; at += run)
                        routed += gpt2_shard_routed_at(&sh, at, &run) ? run : 0;
                    for (int t = GPT2_EXPFCW; t <= GPT2_EXPPROJB; t++) {
                        size_t n = sh.elems[t], X = 4 / (size_t)ep + 1, block = n / X, all, run;
                        want +=
                            n ? block * (X - 1) * (size_t)gpt2_moe_layers_before(&c, c.layers) : 0;
                        for (size_t i = 0; i < n; i++) {
                            size_t a = gpt2_ep_to_all(&c, t, ep, e, i, n, &all, &run), local, run2;
                            int owner = gpt2_ep_owner(&c, t, ep, a, all, &local, &run2);
                            bool shared = i / block == X - 1;
                            CHECK(a < all && run >= 1 && run2 >= 1 && owner == (shared ? 0 : e) &&
                                      local == i,
                                  "%s ep %d rank %d: element %zu -> %zu -> rank %d element %zu",
                                  gpt2_tensor_names[t], ep, e, i, a, owner, local);
                        }
                    }
                    free(shard);
                }
            CHECK(memcmp(back, model, full.total * sizeof *model) == 0,
                  "ep %d tp %d: written back differs", ep, tp);
            CHECK(routed == want, "ep %d tp %d: %zu elements called routed, %zu are", ep, tp,
                  routed, want);
            size_t missing = 0;
            for (size_t i = 0; i < full.total; i++) missing += held[i] == 0;
            CHECK(missing == 0, "ep %d tp %d: %zu elements held by no rank", ep, tp, missing);
        }
    free(model);
    free(back);
    free(held);
}

/* What an MoE config (cfg) must keep, over GPT-2's and a Llama's experts */
static void run_moe_checks(void)
{
    RUN(test_tp_mapping_and_its_inverse_agree);
    RUN(test_instances_in_file_order);
    RUN(test_shards_cover_the_model_exactly);
    RUN(test_interleaved_chunks_cover_the_model_exactly);
    RUN(test_zero3_units_tile_the_buffer_and_the_slices);
    RUN(test_ep_spreads_the_routed_experts_once);
}

int main(void)
{
    cfg = gpt2_cfg;
    RUN(test_tp_mapping_and_its_inverse_agree);
    RUN(test_instances_in_file_order);
    RUN(test_shards_cover_the_model_exactly);
    RUN(test_whole_model_is_a_layer_major_permutation);
    RUN(test_megatron_splits_take_heads_and_columns);
    RUN(test_interleaved_chunks_cover_the_model_exactly);
    RUN(test_impossible_parts_are_refused);
    RUN(test_zero3_units_tile_the_buffer_and_the_slices);
    cfg = llama_cfg; /* the same over a Llama's tensors */
    RUN(test_tp_mapping_and_its_inverse_agree);
    RUN(test_instances_in_file_order);
    RUN(test_shards_cover_the_model_exactly);
    RUN(test_interleaved_chunks_cover_the_model_exactly);
    RUN(test_llama_splits_take_each_band);
    RUN(test_zero3_units_tile_the_buffer_and_the_slices);
    cfg = moe_of(gpt2_cfg); /* experts (each split over tp as the MLP) in some layers */
    run_moe_checks();
    cfg = moe_of(llama_cfg); /* a Llama's experts: gate and up bands of each */
    run_moe_checks();
    return check_exit_code();
}
