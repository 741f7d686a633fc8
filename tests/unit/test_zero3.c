/* test_zero3.c — ZeRO 3's unit windows (runtime/zero3.h) over dp ranks as
 * threads (tests/unit/thread_group.h): each rank holding only its slice of a
 * shard's padded buffer, every unit gathered into a window is that unit of
 * the whole buffer to the bit (prefetched and fetched on use, over GPT-2 and
 * pipeline shards, at dp 2 to 4), and each unit's gradients reduce-scattered
 * in a backward's order land as the rank's slice of their sum; a full pool
 * and an unknown unit are errors naming them; zero3_at finds an element only
 * while its unit is held; a slice initialised alone (what a ZeRO 3 rank
 * does) is that slice of the whole model's initialisation, to the bit. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "runtime/gpt2.h"
#include "runtime/zero3.h"
#include "thread_group.h"

static const struct gpt2_config cfg = {
    .max_seq_len = 8, .vocab = 50, .padded_vocab = 64, .layers = 4, .heads = 2, .hidden = 8};
enum { WINDOWS = 3 };

struct job {
    struct thread_rank me;
    const struct gpt2_shard *s;
    size_t padded;
    const float *whole; /* (padded) the buffer every rank's slice is cut from */
    char error[1200];
};

#define FAIL(j, ...) (snprintf((j)->error, sizeof(j)->error, __VA_ARGS__), (void *)NULL)

/* Unit u's window against the whole buffer, to the bit. */
static bool window_is_unit(const struct job *j, const float *w, int u)
{
    struct gpt2_unit un = gpt2_unit(j->s, j->padded, u);
    return un.elems == 0 || memcmp(w, j->whole + un.at, un.elems * sizeof *w) == 0;
}

/* A backward's order, last unit first: rank r's gradient of element i is
 * (r + 1) times the buffer's element i, each unit reduce-scattered into a
 * slice-shaped buffer, which must end as this rank's slice of the sum
 * (exact: small multiples of half-integers). NULL, or what was wrong. */
static const char *scatter_backward(const struct job *j, struct zero3 *z, const struct group *dp,
                                    size_t slice_n)
{
    static _Thread_local char why[300];
    struct plait_error err = {.text = ""};
    float *sums = malloc(slice_n * sizeof *sums), *g = malloc(z->window_elems * sizeof *g);
    for (size_t i = 0; i < slice_n; i++) sums[i] = -7.0f;
    const char *out = NULL;
    for (int u = gpt2_units_count(j->s) - 1; u >= 0 && !out; u--) {
        struct gpt2_unit un = gpt2_unit(j->s, j->padded, u);
        for (size_t i = 0; i < un.elems; i++) g[i] = (float)(dp->rank + 1) * j->whole[un.at + i];
        void *req;
        if (zero3_scatter(z, u, g, sums, &req, &err) || dp->wait(req, &err))
            out = (snprintf(why, sizeof why, "scatter %d: %.200s", u, err.text), why);
    }
    float times = (float)(dp->size * (dp->size + 1) / 2);
    for (size_t i = 0; i < slice_n && !out; i++)
        if (sums[i] != times * j->whole[(size_t)dp->rank * slice_n + i])
            out = (snprintf(why, sizeof why, "the summed slice's [%zu] = %g", i, sums[i]), why);
    free(sums);
    free(g);
    return out;
}

/* A forward's order: each unit prefetched while the one before is used,
 * then released; the head takes unit 0 again beside the last. */
static void *run_rank(void *arg)
{
    struct job *j = arg;
    struct group dp = thread_group(&j->me);
    size_t slice_n = j->padded / (size_t)dp.size, elems = zero3_window_elems(j->s, j->padded);
    float *bufs[WINDOWS];
    for (int i = 0; i < WINDOWS; i++) bufs[i] = malloc(elems * sizeof(float));
    struct zero3 z;
    struct plait_error err = {.text = ""};
    int n = gpt2_units_count(j->s);
    if (zero3_init(&z, j->s, j->padded, &dp, j->whole + (size_t)dp.rank * slice_n, bufs, NULL,
                   WINDOWS, &err))
        return FAIL(j, "init: %s", err.text);
    for (int u = 0; u < n; u++) {
        if (u + 1 < n && zero3_fetch(&z, u + 1, &err))
            return FAIL(j, "prefetch %d: %s", u + 1, err.text);
        float *w = zero3_get(&z, u, &err);
        if (!w) return FAIL(j, "unit %d: %s", u, err.text);
        if (!window_is_unit(j, w, u)) return FAIL(j, "unit %d's window is not the unit", u);
        struct gpt2_unit un = gpt2_unit(j->s, j->padded, u);
        if (un.elems && zero3_at(&z, un.at + un.elems - 1) != w + un.elems - 1)
            return FAIL(j, "unit %d: its last element is not found in its window", u);
        if (u == n - 1) { /* the tied head: unit 0 again, beside the last */
            float *w0 = zero3_get(&z, 0, &err);
            if (!w0 || !window_is_unit(j, w0, 0)) return FAIL(j, "unit 0 again: %s", err.text);
            if (zero3_fetch(&z, 1, &err) || zero3_fetch(&z, 2, &err) == 0)
                return FAIL(j, "a fourth unit in three windows was not refused");
            if (!strstr(err.text, "unit 2 (") || !strstr(err.text, "has no window"))
                return FAIL(j, "the full pool's error: %s", err.text);
            if (zero3_release(&z, 0, &err) || zero3_release(&z, 1, &err))
                return FAIL(j, "release: %s", err.text);
        }
        if (zero3_release(&z, u, &err)) return FAIL(j, "release %d: %s", u, err.text);
        if (un.elems && zero3_at(&z, un.at)) return FAIL(j, "unit %d found after its release", u);
    }
    if (zero3_fetch(&z, n, &err) == 0 || !strstr(err.text, "unit"))
        return FAIL(j, "unit %d of %d was not refused", n, n);
    const char *bad = scatter_backward(j, &z, &dp, slice_n);
    if (bad) return FAIL(j, "%s", bad);
    zero3_free(&z);
    for (int i = 0; i < WINDOWS; i++) free(bufs[i]);
    return NULL;
}

static void run_layout(int pp, int stage, int dp)
{
    struct gpt2_part part = {.tp = 1, .pp = pp, .pp_rank = stage};
    gpt2_stage_layers(cfg.layers, pp, stage, &part.layer_begin, &part.layer_end);
    struct gpt2_shard s;
    struct plait_error err;
    if (gpt2_shard_init(&s, &cfg, &part, &err)) {
        CHECK(0, "pp %d stage %d: %s", pp, stage, err.text);
        return;
    }
    size_t padded = (s.total + (size_t)dp - 1) / (size_t)dp * (size_t)dp;
    float *whole = malloc(padded * sizeof *whole);
    for (size_t i = 0; i < padded; i++) whole[i] = i < s.total ? 0.5f + (float)i : 0.0f;
    struct threads t;
    threads_init(&t, dp);
    struct job jobs[THREAD_GROUP_MAX];
    pthread_t th[THREAD_GROUP_MAX];
    for (int r = 0; r < dp; r++) {
        jobs[r] = (struct job){.me = {&t, r}, .s = &s, .padded = padded, .whole = whole};
        pthread_create(&th[r], NULL, run_rank, &jobs[r]);
    }
    for (int r = 0; r < dp; r++) {
        pthread_join(th[r], NULL);
        CHECK(!jobs[r].error[0], "pp %d stage %d dp %d rank %d: %s", pp, stage, dp, r,
              jobs[r].error);
    }
    threads_destroy(&t);
    free(whole);
}

static void test_units_gather_and_scatter_to_the_bit_over_the_slices(void)
{
    for (int dp = 2; dp <= 4; dp++) {
        run_layout(1, 0, dp);
        run_layout(2, 0, dp);
        run_layout(2, 1, dp);
    }
}

static void test_one_rank_is_refused(void)
{
    struct gpt2_part whole = gpt2_part_whole(&cfg);
    struct gpt2_shard s;
    struct plait_error err;
    CHECK(gpt2_shard_init(&s, &cfg, &whole, &err) == 0, "%s", err.text);
    struct group one = {.size = 1};
    struct zero3 z;
    float *bufs[1] = {NULL};
    CHECK(zero3_init(&z, &s, s.total, &one, NULL, bufs, NULL, 1, &err) == -1 &&
              strstr(err.text, "dp 1"),
          "dp 1: %s", err.text);
}

/* A slice initialised alone (gpt2_init_shard_range, what a ZeRO 3 rank
 * does) is that slice of the whole model's initialisation cut to the shard,
 * to the bit: over tp and pp parts, interleaved chunks, GPT-2 and a Llama
 * with an untied head, for ranges that start and end inside tensors, and the
 * padding past the shard zero. */
static void test_a_slice_initialises_as_the_whole_model(void)
{
    struct gpt2_config llama = cfg;
    llama.llama = true, llama.untied = true, llama.kv_heads = 2, llama.ffn_hidden = 12;
    const struct gpt2_config *cfgs[2] = {&cfg, &llama};
    const int parts[][5] = {{1, 0, 1, 0, 1}, {2, 1, 1, 0, 1}, {1, 0, 2, 1, 1}, {2, 0, 2, 0, 2}};
    for (int c = 0; c < 2; c++)
        for (size_t k = 0; k < sizeof parts / sizeof *parts; k++) {
            const int *q = parts[k];
            struct gpt2_part part = gpt2_part_whole(cfgs[c]);
            part.tp = q[0], part.tp_rank = q[1], part.pp = q[2], part.pp_rank = q[3];
            part.chunks = q[4];
            int per = cfgs[c]->layers / (q[2] * q[4]);
            part.layer_begin = q[3] * per, part.layer_end = part.layer_begin + per;
            struct gpt2_shard s;
            struct plait_error err = {.text = ""};
            if (gpt2_shard_init(&s, cfgs[c], &part, &err)) {
                CHECK(0, "part %zu: %s", k, err.text);
                continue;
            }
            struct gpt2_layout full;
            gpt2_layout(cfgs[c], &full);
            float *whole = malloc(full.total * sizeof(float)),
                  *want = calloc(s.total + 8, sizeof(float)),
                  *got = malloc((s.total + 8) * sizeof(float));
            gpt2_init_weights(cfgs[c], &full, whole, 42);
            gpt2_shard_copy(&s, whole, want, true);
            size_t cuts[][2] = {{0, s.total}, {3, s.total / 2 + 5}, {s.total / 3, s.total + 8}};
            for (int r = 0; r < 3; r++) {
                size_t lo = cuts[r][0], hi = cuts[r][1];
                memset(got, 0xff, (hi - lo) * sizeof(float));
                CHECK(gpt2_init_shard_range(&s, lo, hi, got, 42, &err) == 0, "%s", err.text);
                CHECK(memcmp(got, want + lo, (hi - lo) * sizeof(float)) == 0,
                      "%s part %zu: elements [%zu, %zu) differ from the whole model's",
                      c ? "llama" : "gpt2", k, lo, hi);
            }
            free(whole);
            free(want);
            free(got);
        }
}

int main(void)
{
    RUN(test_a_slice_initialises_as_the_whole_model);
    RUN(test_units_gather_and_scatter_to_the_bit_over_the_slices);
    RUN(test_one_rank_is_refused);
    return check_exit_code();
}
