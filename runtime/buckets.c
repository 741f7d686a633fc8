/* buckets.c — cutting the gradient buffer into buckets, starting each one's
 * sum over dp (ZeRO 0) or reduce-scatter into the ZeRO slices (1, 2) as soon
 * as backward has made it final, taking in the sums that have arrived (polled
 * during backward, waited for after it: ZeRO 2's adds, the landed hook), then
 * adding the embedding rows that were deferred, summing the LayerNorms over tp
 * and, with ZeRO 2, adding the rest of the micro-batch into the slice. */
#include "runtime/buckets.h"

#include <stdlib.h>
#include <string.h>

/* With expert parallelism, each bucket cut where routed experts' runs begin and end
 * (gpt2_shard_routed_at; only layer blocks have them), the runs in ascending order
 * where the bucket was: -1 when out of memory. */
static int split_routed(struct buckets *bk)
{
    const struct gpt2_shard *s = &bk->m->shard;
    struct bucket *out = NULL;
    int n = 0;
    for (int pass = 0; pass < 2; pass++) {
        n = 0;
        for (int i = 0; i < bk->n; i++) {
            const struct bucket *b = &bk->b[i];
            size_t end = b->at + b->n;
            for (size_t at = b->at, run; at < end; at += run, n++) {
                bool routed = at < s->total && gpt2_shard_routed_at(s, at, &run);
                if (at >= s->total || run > end - at) run = end - at; /* (the padding) */
                if (out)
                    out[n] =
                        (struct bucket){.at = at, .n = run, .layers = b->layers, .routed = routed};
            }
        }
        if (pass == 0 && !(out = calloc((size_t)n, sizeof *out))) return -1;
    }
    free(bk->b);
    bk->b = out;
    bk->n = n;
    return 0;
}

/* The cut made: split by expert parallelism where it applies. */
static int cut_done(struct buckets *bk, struct plait_error *err)
{
    if (bk->m->shard.part.ep > 1 && split_routed(bk)) {
        buckets_free(bk);
        return error_set(err, "out of memory");
    }
    return 0;
}

int buckets_init(struct buckets *bk, struct model *m, const struct group *dp,
                 const struct group *experts, double bucket_mb, struct plait_error *err)
{
    memset(bk, 0, sizeof *bk);
    bk->m = m;
    bk->dp = dp;
    bk->experts = experts;
    bk->sliced = m->zero >= 1;
    if (bk->sliced && !(bk->counts = calloc((size_t)dp->size, sizeof *bk->counts)))
        return error_set(err, "out of memory");
    const struct gpt2_shard *s = &m->shard;
    size_t want = (size_t)(bucket_mb * (1 << 20) / sizeof(float));
    if (want < 1) want = 1;
    /* without a pipeline the embedding's rows of wte are deferred: wte goes first
     * (not with a split backward: its head and embedding run in the input pass,
     * before the weight pass in which the buckets start; not untied: the head
     * writes lmhead, and wte has only the embedding's rows) */
    bk->defer = m->first && m->last && !m->split_backward && !m->cfg.untied;
    int layers = gpt2_shard_layers(s); /* over the stage's chunks */
    if (!(bk->b = calloc((size_t)layers + 2, sizeof *bk->b))) {
        buckets_free(bk);
        return error_set(err, "out of memory");
    }
    bk->watermark = s->total;
    bk->landed_top = bk->landed_from = bk->sliced ? m->slice_n : s->total;
    /* sliced, the top bucket takes the padding to n_padded with it (zeros:
     * every slice element is then some bucket's) */
    size_t top = bk->sliced ? m->n_padded : s->total;
    if (want >= s->total) { /* one bucket: summed after backward, overlapping nothing */
        bk->defer = false;
        bk->b[bk->n++] = (struct bucket){.at = 0, .n = top};
        return cut_done(bk, err);
    }
    size_t wte = gpt2_shard_holds(s, GPT2_WTE) ? gpt2_shard_offset(s, GPT2_WTE, 0) : 0;
    if (bk->defer) bk->b[bk->n++] = (struct bucket){.at = wte, .n = s->elems[GPT2_WTE]};
    size_t hi = top; /* the top bucket takes the final LayerNorm with it */
    for (int i = layers - 1; i >= 0; i--) {
        size_t at = gpt2_shard_block_at(s, i);
        if (hi - at >= want || i == 0) {
            bk->b[bk->n++] = (struct bucket){.at = at, .n = hi - at, .layers = true};
            hi = at;
        }
    }
    /* the rest of the embeddings (all of them with a pipeline) after backward */
    size_t lo = bk->defer ? wte + s->elems[GPT2_WTE] : 0;
    if (s->layers_at > lo) bk->b[bk->n++] = (struct bucket){.at = lo, .n = s->layers_at - lo};
    if (bk->defer) {
        size_t N = (size_t)m->B * (size_t)m->T,
               n = N * (size_t)dp->size; /* model_init checked N·C */
        bk->rows = m->ops->alloc(m->ctx, n * (size_t)m->cfg.hidden * sizeof(float));
        bk->tokens = m->ops->alloc(m->ctx, n * sizeof(int32_t));
        if (!bk->rows || !bk->tokens) {
            buckets_free(bk);
            return error_set(err, "out of memory for the data-parallel embedding rows");
        }
        m->defer_embedding = true;
    }
    return cut_done(bk, err);
}

/* Where this step's slice sums land: the slice, or (ZeRO 2 adding a
 * micro-batch to it) its staging. */
static float *slice_sums(const struct buckets *bk)
{
    return bk->accumulate ? bk->m->slice_tmp : bk->m->grad_slice;
}

/* The group a bucket is summed over: the expert peers for a routed expert's run. */
static const struct group *group_of(const struct buckets *bk, const struct bucket *b)
{
    return b->routed ? bk->experts : bk->dp;
}

static int start(struct buckets *bk, struct bucket *b, struct plait_error *err)
{
    b->started = true;
    bk->next++;
    const struct model *m = bk->m;
    int rc;
    if (bk->sliced) { /* each rank's part of [at, at + n): where it meets that rank's slice */
        size_t S = m->slice_n, end = b->at + b->n;
        for (int r = 0; r < bk->dp->size; r++) {
            size_t lo = (size_t)r * S, hi = lo + S;
            size_t a = b->at > lo ? b->at : lo, z = end < hi ? end : hi;
            bk->counts[r] = z > a ? z - a : 0;
        }
        size_t a = b->at > m->slice_at ? b->at : m->slice_at;
        float *recv = bk->counts[bk->dp->rank] ? slice_sums(bk) + (a - m->slice_at) : NULL;
        rc = bk->dp->ireduce_scatter_v(bk->dp->ctx, m->grads + b->at, recv, bk->counts, &b->req,
                                       err);
    } else {
        const struct group *g = group_of(bk, b);
        if (g->size == 1) return b->started = false, 0; /* ep = dp: nobody else has them */
        rc = g->iallreduce(g->ctx, m->grads + b->at, b->n, &b->req, err);
    }
    if (rc)
        return error_prefix(err, "data-parallel gradient %s of elements [%zu, %zu): ",
                            bk->sliced ? "reduce-scatter" : "sum", b->at, b->at + b->n);
    b->in_flight = true;
    return 0;
}

/* Whether nothing after its sums arrive changes a bucket's: whole layers (the deferred
 * rows and a pipeline's tied sum are wte's), unless the LayerNorms' sums over tp follow
 * (sequence parallelism). */
static bool final_on_arrival(const struct buckets *bk, const struct bucket *b)
{
    return b->layers && !bk->m->sp;
}

/* b's part of this rank's slice (ZeRO 0: of the buffer), as the slice's elements [*lo, *hi) */
static void slice_part(const struct buckets *bk, const struct bucket *b, size_t *lo, size_t *hi)
{
    size_t a = b->at, z = b->at + b->n;
    if (bk->sliced) {
        size_t s0 = bk->m->slice_at, s1 = s0 + bk->m->slice_n;
        a = a < s0 ? 0 : a > s1 ? s1 - s0 : a - s0;
        z = z < s0 ? 0 : z > s1 ? s1 - s0 : z - s0;
    }
    *lo = a, *hi = z;
}

/* ZeRO 2 adding a micro-batch: b's part of its sums (in the staging) added into the
 * slice, element by element (the same bits as the whole slice at once). */
static void add_part(struct buckets *bk, struct bucket *b)
{
    struct model *m = bk->m;
    size_t lo, hi;
    slice_part(bk, b, &lo, &hi);
    if (hi > lo)
        m->ops->residual_forward(m->ctx, m->grad_slice + lo, m->grad_slice + lo, m->slice_tmp + lo,
                                 hi - lo);
    b->added = true;
}

/* b's sums are in. Final ones are added into the slice now (ZeRO 2 adding), and in the
 * step's own reduction the slice from its top down to b's part is landed where all of it
 * is final (the buckets above it arrived first). */
static int arrive(struct buckets *bk, struct bucket *b, bool after_backward,
                  struct plait_error *err)
{
    b->arrived = true;
    if (!final_on_arrival(bk, b)) return 0;
    if (bk->sliced && bk->accumulate) add_part(bk, b);
    size_t lo, hi;
    slice_part(bk, b, &lo, &hi);
    if (!bk->landed || !bk->final || hi < bk->landed_from || lo >= bk->landed_from) return 0;
    bk->landed_from = lo;
    return bk->landed(bk->landed_ctx, lo, bk->landed_top, after_backward, err);
}

/* During backward: the started buckets whose sums have arrived, taken in the order started
 * (the order they complete in) up to the first still in flight, never blocking; a group
 * that cannot tell (no test) leaves them to buckets_finish. */
static int take_arrived(struct buckets *bk, struct plait_error *err)
{
    for (int i = 0; i < bk->next; i++) {
        struct bucket *b = &bk->b[i];
        if (b->arrived) continue;
        if (b->in_flight) {
            const struct group *g = group_of(bk, b);
            bool done = false;
            if (!g->test) return 0;
            int rc = g->test(b->req, &done, err);
            if (done) b->in_flight = false; /* req freed, failed or not */
            if (rc)
                return error_prefix(err, "data-parallel gradient %s of elements [%zu, %zu): ",
                                    bk->sliced ? "reduce-scatter" : "sum", b->at, b->at + b->n);
            if (!done) return 0;
        }
        if (arrive(bk, b, false, err)) return -1;
    }
    return 0;
}

/* After backward: every started bucket's sums waited for in the order started, each taken
 * in as it arrives. */
static int arrive_all(struct buckets *bk, struct plait_error *err)
{
    for (int i = 0; i < bk->next; i++) {
        struct bucket *b = &bk->b[i];
        if (b->arrived) continue;
        if (b->in_flight) {
            b->in_flight = false; /* req freed, failed or not */
            if (group_of(bk, b)->wait(b->req, err)) return -1;
        }
        if (arrive(bk, b, true, err)) return -1;
    }
    return 0;
}

int buckets_ready(void *ctx, size_t from, size_t to, struct plait_error *err)
{
    struct buckets *bk = ctx;
    if (to == bk->m->shard.total && from < bk->watermark) bk->watermark = from;
    for (int i = 0; i < bk->n; i++)
        if (!bk->b[i].layers && bk->b[i].at == from && bk->b[i].n == to - from)
            bk->b[i].final = true;
    while (bk->next < bk->n) {
        struct bucket *b = &bk->b[bk->next];
        if (!(b->final || (b->layers && b->at >= bk->watermark))) break;
        if (start(bk, b, err)) return -1;
    }
    return bk->landed && bk->final ? take_arrived(bk, err) : 0;
}

/* Every rank's deferred embedding rows and tokens, gathered over dp (the
 * tokens' bits travel as floats: nothing adds them). */
static int gather_rows(struct buckets *bk, int B, int T, struct plait_error *err)
{
    const float *rows;
    const int32_t *tokens;
    size_t N = (size_t)B * (size_t)T;
    if (model_deferred_rows(bk->m, B, T, &rows, &tokens, err)) return -1;
    const struct group *dp = bk->dp;
    float *tok_bits = (float *)bk->tokens;
    /* the last of the gathered blocks is scratch for this rank's own tokens */
    float *mine = (float *)bk->rows + N * (size_t)bk->m->cfg.hidden * (size_t)(dp->size - 1);
    bk->m->ops->copy(bk->m->ctx, mine, tokens, N * sizeof(int32_t));
    if (dp->allgather(dp->ctx, mine, tok_bits, N, err)) return -1;
    return dp->allgather(dp->ctx, rows, bk->rows, N * (size_t)bk->m->cfg.hidden, err);
}

/* Waits for every sum still in flight (the first failure into err, unless rc says
 * one happened already) and readies the buckets for the next step. */
static int settle(struct buckets *bk, int rc, struct plait_error *err)
{
    struct plait_error later; /* after the first failure: what the others say */
    for (int i = 0; i < bk->n; i++) {
        struct bucket *b = &bk->b[i];
        if (b->in_flight && group_of(bk, b)->wait(b->req, rc ? &later : err) && rc == 0) rc = -1;
        *b = (struct bucket){.at = b->at, .n = b->n, .layers = b->layers, .routed = b->routed};
    }
    bk->next = 0;
    bk->final = false; /* until the pipeline says the next is the step's end */
    bk->landed_from = bk->landed_top;
    if (bk->m) {
        bk->watermark = bk->m->shard.total;
        bk->m->deferred_slot = -1;
    }
    return rc;
}

/* Adds every rank's deferred rows, in rank order, to the summed wte: the
 * whole (ZeRO 0), or the slice's part of it, staged for the adds at its own
 * place in the gradient buffer (whose wte is this rank's own until then). */
static void add_rows(struct buckets *bk, int B, int T)
{
    struct model *m = bk->m;
    size_t N = (size_t)B * (size_t)T, C = (size_t)m->cfg.hidden;
    size_t wte = gpt2_shard_offset(&m->shard, GPT2_WTE, 0), end = wte + m->shard.elems[GPT2_WTE];
    size_t a = wte > m->slice_at ? wte : m->slice_at,
           z = end < m->slice_at + m->slice_n ? end : m->slice_at + m->slice_n;
    bool part = bk->sliced && z > a;
    float *sums = slice_sums(bk);
    if (part) m->ops->copy(m->ctx, m->grads + a, sums + (a - m->slice_at), (z - a) * sizeof(float));
    for (int r = 0; r < bk->dp->size; r++)
        model_add_embedding_rows(m, bk->rows + (size_t)r * N * C, bk->tokens + (size_t)r * N, B, T);
    if (part) m->ops->copy(m->ctx, sums + (a - m->slice_at), m->grads + a, (z - a) * sizeof(float));
}

int buckets_finish(struct buckets *bk, int B, int T, bool layernorms, struct plait_error *err)
{
    struct model *m = bk->m;
    bool deferred = bk->defer && m->deferred_slot >= 0;
    int rc = 0;
    while (rc == 0 && bk->next < bk->n) rc = start(bk, &bk->b[bk->next], err);
    /* the sums taken in as they arrive, the rows' gather (behind them on the same
     * communicator) after */
    if (rc == 0) rc = arrive_all(bk, err);
    if (rc == 0 && deferred) rc = gather_rows(bk, B, T, err);
    if (rc) {
        settle(bk, rc, err);
        return error_prefix(err,
                            "data-parallel gradient %s: ", bk->sliced ? "reduce-scatter" : "sum");
    }
    if (deferred) add_rows(bk, B, T); /* in rank order: the same bits */
    if (layernorms &&
        (bk->sliced ? model_sum_layernorm_grads_in(m, slice_sums(bk), m->slice_at, m->slice_n, err)
                    : model_sum_layernorm_grads(m, err)))
        rc = -1;
    for (int i = 0; rc == 0 && bk->sliced && bk->accumulate && i < bk->n; i++)
        if (!bk->b[i].added) add_part(bk, &bk->b[i]); /* what arrival did not add */
    return settle(bk, rc, err);
}

void buckets_drop(struct buckets *bk)
{
    struct plait_error ignored;
    settle(bk, -1, &ignored);
}

void buckets_free(struct buckets *bk)
{
    buckets_drop(bk);
    if (bk->m && bk->rows) bk->m->ops->free(bk->m->ctx, bk->rows);
    if (bk->m && bk->tokens) bk->m->ops->free(bk->m->ctx, bk->tokens);
    if (bk->m) bk->m->defer_embedding = false;
    free(bk->b);
    free(bk->counts);
    memset(bk, 0, sizeof *bk);
}
