/* gpt2.c — GPT-2 initialisation and llm.c checkpoint reading (model FLOPs are
 * common/place/gpu.c's; the layout is common/gpt2/gpt2_layout.c). Writing checkpoints (with their
 * manifests) is ckpt.c's. */
#include "runtime/gpt2.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/crc32c.h"
#include "common/fsutil.h"
#include "common/formats/llmc.h"
#include "common/rng.h"

/* How tensor t starts: every element 1 (the norms' weights), 0 (biases),
 * or its first *drawn elements from its random stream with σ *std (the rest,
 * padded vocabulary rows, 0). */
enum init_kind { INIT_ONE, INIT_ZERO, INIT_NORMAL };
static enum init_kind init_of(const struct gpt2_config *cfg, enum gpt2_tensor t, size_t elems,
                              double *std, size_t *drawn)
{
    if (t == GPT2_LN1W || t == GPT2_LN2W || t == GPT2_LNFW) return INIT_ONE;
    if (!gpt2_tensor_decays(t)) return INIT_ZERO;
    /* GPT-2 scales its residual projections by 1/sqrt(2L); transformers'
     * Llama draws every matrix with initializer_range 0.02 */
    double residual_std = cfg->llama ? 0.02 : 0.02 / sqrt(2.0 * cfg->layers);
    *std = (t == GPT2_ATTPROJW || t == GPT2_FCPROJW || t == GPT2_EXPPROJW) ? residual_std : 0.02;
    *drawn = elems;
    if (t == GPT2_WTE || t == GPT2_LMHEAD) /* padded rows stay zero */
        *drawn = elems ? (size_t)cfg->vocab * cfg->hidden : 0;
    return INIT_NORMAL;
}

void gpt2_init_weights(const struct gpt2_config *cfg, const struct gpt2_layout *layout,
                       float *params, uint64_t seed)
{
    memset(params, 0, layout->total * sizeof(float));
    for (int t = 0; t < GPT2_TENSORS; t++) {
        float *p = params + layout->offset[t];
        double std = 0;
        size_t n = layout->elems[t];
        enum init_kind k = init_of(cfg, t, n, &std, &n);
        for (size_t i = 0; k == INIT_ONE && i < n; i++) p[i] = 1.0f;
        if (k != INIT_NORMAL) continue;
        struct rng r;
        rng_seed(&r, seed, (uint64_t)t + 1); /* one stream per tensor */
        for (size_t i = 0; i < n; i++) p[i] = (float)(std * rng_normal(&r));
    }
}

/* A run of the range: `count` elements of a tensor's whole (llm.c order,
 * from element `at` of the tensor) that land at out[to]. */
struct init_run {
    size_t at, to, count;
};

struct range_ctx {
    const struct gpt2_shard *s;
    enum gpt2_tensor t;
    size_t lo, hi, per_layer;
    struct init_run *runs;
    size_t n, cap;
    bool oom;
};

/* The runs of instance (t, l) inside [lo, hi). */
static int range_runs(void *ctx, enum gpt2_tensor t, int l, size_t off, size_t elems)
{
    struct range_ctx *c = ctx;
    if (t != c->t || off >= c->hi || off + elems <= c->lo) return 0;
    size_t a = off >= c->lo ? 0 : c->lo - off, b = off + elems < c->hi ? elems : c->hi - off;
    for (size_t i = a, run; i < b; i += run) {
        size_t g = gpt2_shard_to_whole(c->s, t, i, elems, &run);
        if (run > b - i) run = b - i;
        if (c->n == c->cap) {
            size_t cap = c->cap ? 2 * c->cap : 64;
            struct init_run *more = realloc(c->runs, cap * sizeof *more);
            if (!more) return c->oom = true, 1;
            c->runs = more, c->cap = cap;
        }
        size_t before = (size_t)gpt2_tensor_layers_before(&c->s->cfg, t, l); /* its instance */
        c->runs[c->n++] = (struct init_run){before * c->per_layer + g, off + i - c->lo, run};
    }
    return 0;
}

static int by_at(const void *x, const void *y)
{
    const struct init_run *a = x, *b = y;
    return (a->at > b->at) - (a->at < b->at);
}

int gpt2_init_shard_range(const struct gpt2_shard *s, size_t lo, size_t hi, float *out,
                          uint64_t seed, struct plait_error *err)
{
    struct gpt2_layout full;
    gpt2_layout(&s->cfg, &full);
    memset(out, 0, (hi - lo) * sizeof(float));
    struct range_ctx c = {.s = s, .lo = lo, .hi = hi};
    for (int t = 0; t < GPT2_TENSORS; t++) {
        double std = 0;
        size_t drawn = 0;
        enum init_kind k = init_of(&s->cfg, t, full.elems[t], &std, &drawn);
        c.t = t, c.n = 0;
        if (k == INIT_ZERO || !full.elems[t]) continue;
        c.per_layer =
            gpt2_tensor_per_layer(t)
                ? full.elems[t] / (size_t)gpt2_tensor_layers_before(&s->cfg, t, s->cfg.layers)
                : 0;
        if (gpt2_shard_each(s, range_runs, &c)) break; /* out of memory */
        if (c.n == 0) continue;                             /* none of it in the range */
        qsort(c.runs, c.n, sizeof *c.runs, by_at);
        struct rng r;
        rng_seed(&r, seed, (uint64_t)t + 1); /* gpt2_init_weights's stream */
        size_t pos = 0;                       /* the stream's next element */
        for (size_t i = 0; i < c.n; i++) {
            const struct init_run *u = &c.runs[i];
            for (size_t j = 0; j < u->count; j++) {
                size_t at = u->at + j;
                if (k == INIT_ONE) {
                    out[u->to + j] = 1.0f;
                    continue;
                }
                if (at >= drawn) break; /* padded rows: zero */
                for (; pos < at; pos++) /* rng_normal's two draws, skipped */
                    (void)rng_uniform(&r), (void)rng_uniform(&r);
                out[u->to + j] = (float)(std * rng_normal(&r));
                pos++;
            }
        }
    }
    free(c.runs);
    return c.oom ? error_set(err, "out of memory initialising the parameters") : 0;
}

int gpt2_read_llmc(const char *path, const struct gpt2_config *cfg, float *params, uint32_t *crc,
                   struct plait_error *err)
{
    struct llmc_model_header h;
    if (llmc_read_model_header(path, &h, err)) return -1;
    struct gpt2_config file = llmc_model_config(&h);
    if (!gpt2_config_same_tensors(&file, cfg) || h.vocab != cfg->vocab)
        return error_set(err,
                         "%s: model is maxT %d V %d Vp %d L %d NH %d C %d, the plan wants maxT "
                         "%d V %d Vp %d L %d NH %d C %d",
                         path, h.max_seq_len, h.vocab, h.padded_vocab, h.layers, h.heads, h.hidden,
                         cfg->max_seq_len, cfg->vocab, cfg->padded_vocab, cfg->layers, cfg->heads,
                         cfg->hidden);
    struct gpt2_layout layout;
    gpt2_layout(cfg, &layout);
    FILE *f = fs_fopen_regular(path, err);
    if (!f) return -1;
    int32_t header[LLMC_HEADER_INTS];
    int rc = -1;
    uint16_t *buf16 = NULL;
    if (fread(header, 4, LLMC_HEADER_INTS, f) != LLMC_HEADER_INTS) {
        error_set(err, "%s: short read of the header", path);
        goto out;
    }
    uint32_t c = crc32c_update(0, header, sizeof header);
    if (h.version != LLMC_MODEL_VERSION_BF16) {
        if (fread(params, sizeof(float), layout.total, f) != layout.total) {
            error_set(err, "%s: short read of the parameters", path);
            goto out;
        }
        c = crc32c_update(c, params, layout.total * sizeof(float));
    } else { /* bf16: widen in chunks */
        enum { CHUNK = 1 << 20 };
        buf16 = malloc(CHUNK * sizeof(uint16_t));
        if (!buf16) {
            error_set(err, "%s: out of memory", path);
            goto out;
        }
        for (size_t done = 0; done < layout.total;) {
            size_t n = layout.total - done < CHUNK ? layout.total - done : CHUNK;
            if (fread(buf16, sizeof(uint16_t), n, f) != n) {
                error_set(err, "%s: short read of the parameters", path);
                goto out;
            }
            c = crc32c_update(c, buf16, n * sizeof(uint16_t));
            for (size_t i = 0; i < n; i++) {
                uint32_t bits = (uint32_t)buf16[i] << 16;
                memcpy(&params[done + i], &bits, sizeof bits);
            }
            done += n;
        }
    }
    if (crc) *crc = c;
    rc = 0;
out:
    free(buf16);
    fclose(f);
    return rc;
}
