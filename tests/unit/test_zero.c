/* test_zero.c — data parallelism and ZeRO against one rank: dp ranks as
 * threads (tests/unit/thread_group.h), each with the whole model and its own
 * micro-batches; after one clipped AdamW step, at ZeRO 0, 1 and 2 and with dp
 * not dividing the parameter count, every rank holds the same parameters, and
 * they are those of one rank accumulating all the micro-batches, as is the
 * gradient norm. Each stage also with the reduction in per-layer buckets
 * started during the last backward (ZeRO 2: every backward; runtime/buckets.h):
 * wte's (its embedding rows deferred) and every layer's bucket start before
 * backward returns, wpe's after it; with ZeRO 1 and 2 each bucket is
 * reduce-scattered unevenly into the slices, and dp 3 cuts buckets there. In buckets
 * the landed hook (what a GPU rank's offloaded step brings down early) is told only in the
 * step's own reduction (ZeRO 2: not its earlier hand-overs), from the slice's top down,
 * and what it was told is the step's gradient when the step takes it. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "common/rng.h"
#include "kernels/ops.h"
#include "tests/unit/cpu_ctx.h"
#include "runtime/buckets.h"
#include "runtime/gpt2.h"
#include "runtime/model.h"
#include "runtime/optim.h"
#include "thread_group.h"

static const struct gpt2_config cfg = {
    .max_seq_len = 8, .vocab = 50, .padded_vocab = 64, .layers = 2, .heads = 2, .hidden = 8};
enum { B = 2, T = 8, N = B * T, A = 2, MAX_DP = 3 };
static int32_t data_in[MAX_DP * A][N], data_tg[MAX_DP * A][N];
static const struct plan_optimizer opt = {
    .lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .grad_clip = 0.3};

/* What the landed hook was told: a copy of the gradient as each range landed. */
struct landing {
    const float *grad; /* the step's gradient: the buffer (ZeRO 0) or the slice */
    float *copy;       /* its landed ranges, copied when they landed */
    size_t top, from;  /* the slice's top, and [from, top) landed so far */
    int calls;
    bool out_of_order; /* a range not reaching the top, or not below what landed before */
};

static int record_landed(void *ctx, size_t from, size_t to, bool after_backward,
                         struct plait_error *err)
{
    struct landing *l = ctx;
    (void)after_backward, (void)err;
    if (to != l->top || from >= l->from) {
        l->out_of_order = true;
        return 0;
    }
    memcpy(l->copy + from, l->grad + from, (l->from - from) * sizeof(float));
    l->from = from, l->calls++;
    return 0;
}

struct job {
    int dp, rank, zero;
    bool bucketed;
    int started_in_backward, n_buckets; /* bucketed: how many started before backward returned */
    bool landed_right;                  /* bucketed: told, in order, what the step then takes */
    struct thread_rank me;
    const float *full;
    float *params; /* after the step, the shard's order */
    double norm;
    char error[1024];
};

static void *run_rank(void *arg)
{
    struct job *j = arg;
    struct gpt2_part whole = gpt2_part_whole(&cfg);
    struct model m;
    struct plait_error err = {.text = ""};
    struct model_shape shape = {
        .B = B, .T = T, .slots = 1, .dp = j->dp, .dp_rank = j->rank, .zero = j->zero};
    struct ops_ctx *cx = test_cpu_open();
    if (model_init(&m, &cfg, &whole, NULL, ops_cpu(), cx, &shape, &err)) {
        snprintf(j->error, sizeof j->error, "%s", err.text);
        ops_cpu()->close(cx);
        return NULL;
    }
    float *host = malloc(m.shard.total * sizeof *host);
    gpt2_shard_copy(&m.shard, (float *)j->full, host, true);
    model_set_params(&m, host);
    struct group dp = thread_group(&j->me);
    struct optim_groups g = {.dp = &dp, .summed = j->bucketed};
    struct buckets bk;
    int rc =
        j->bucketed ? buckets_init(&bk, &m, &dp, NULL, 1e-9, &err) : 0; /* a bucket per layer */
    size_t top = m.zero ? m.slice_n : m.shard.total;
    struct landing l = {.grad = m.zero ? m.grad_slice : m.grads,
                        .copy = calloc(top, sizeof(float)),
                        .top = top,
                        .from = top};
    if (j->bucketed) bk.landed = record_landed, bk.landed_ctx = &l;
    /* this rank's micro-batches of the global batch of A·dp */
    for (int k = 0; k < A && rc == 0; k++) {
        int micro = k * j->dp + j->rank;
        bool acc = m.zero == 2 ? false : k > 0;
        bool each = j->bucketed && m.zero == 2; /* ZeRO 2: every micro-batch in buckets */
        if (j->bucketed && (k == A - 1 || each)) {
            m.grads_final = buckets_ready;
            m.grads_final_ctx = &bk;
            bk.accumulate = m.zero == 2 && k > 0;
            bk.final = k == A - 1; /* (the pipeline's grads_at_end) */
        }
        rc = model_forward(&m, data_in[micro], data_tg[micro], B, T, 1.0f / (N * A * j->dp), NULL,
                           &err) ||
                     model_backward(&m, B, T, acc, &err)
                 ? -1
                 : 0;
        m.grads_final = NULL;
        if (j->bucketed && (k == A - 1 || each)) {
            j->started_in_backward = bk.next;
            j->n_buckets = bk.n;
        }
        if (rc == 0 && each) rc = buckets_finish(&bk, B, T, true, &err);
        if (rc == 0 && !j->bucketed) rc = optim_reduce_micro(&m, &g, k > 0, &err);
    }
    if (j->bucketed) {
        if (rc == 0 && m.zero < 2) rc = buckets_finish(&bk, B, T, true, &err);
        buckets_free(&bk);
        j->landed_right =
            !l.out_of_order && l.calls > 0 && l.from < top &&
            memcmp(l.copy + l.from, l.grad + l.from, (top - l.from) * sizeof(float)) == 0;
    }
    free(l.copy);
    if (rc == 0) rc = optim_step(&m, &opt, opt.lr, 1, &g, &j->norm, &err);
    if (rc) {
        snprintf(j->error, sizeof j->error, "%s", err.text);
    } else {
        j->params = malloc(m.shard.total * sizeof *j->params);
        m.ops->download(m.ctx, j->params, m.params, m.shard.total * sizeof(float));
    }
    free(host);
    model_free(&m);
    ops_cpu()->close(cx);
    return NULL;
}

/* One step at (dp, zero): rank 0's parameters and norm; every rank's the same. */
static int run(int dp, int zero, bool bucketed, const float *full, float *params, double *norm,
               size_t total)
{
    struct threads t;
    threads_init(&t, dp);
    struct job jobs[MAX_DP];
    pthread_t th[MAX_DP];
    for (int r = 0; r < dp; r++) {
        jobs[r] = (struct job){
            .dp = dp, .rank = r, .zero = zero, .bucketed = bucketed, .me = {&t, r}, .full = full};
        pthread_create(&th[r], NULL, run_rank, &jobs[r]);
    }
    for (int r = 0; r < dp; r++) pthread_join(th[r], NULL);
    int rc = 0;
    for (int r = 0; r < dp; r++) {
        if (jobs[r].error[0]) {
            CHECK(0, "dp %d zero %d rank %d: %s", dp, zero, r, jobs[r].error);
            rc = -1;
        } else if (bucketed && (jobs[r].n_buckets != cfg.layers + 2 ||
                                jobs[r].started_in_backward != cfg.layers + 1)) {
            CHECK(0, "dp %d rank %d: %d of %d buckets started during backward, want %d of %d", dp,
                  r, jobs[r].started_in_backward, jobs[r].n_buckets, cfg.layers + 1,
                  cfg.layers + 2);
            rc = -1;
        } else if (bucketed && !jobs[r].landed_right) {
            CHECK(0,
                  "dp %d zero %d rank %d: the landed hook was told ranges out of order, none, "
                  "or ones the step's gradient then differs in",
                  dp, zero, r);
            rc = -1;
        } else if (r > 0) {
            CHECK(memcmp(jobs[r].params, jobs[0].params, total * sizeof(float)) == 0 &&
                      jobs[r].norm == jobs[0].norm,
                  "dp %d zero %d: rank %d's parameters differ from rank 0's", dp, zero, r);
        }
    }
    if (rc == 0) {
        memcpy(params, jobs[0].params, total * sizeof(float));
        *norm = jobs[0].norm;
    }
    for (int r = 0; r < dp; r++) free(jobs[r].params);
    threads_destroy(&t);
    return rc;
}

/* The reference: one rank, all A·dp micro-batches. */
static void reference(int dp, const float *full, float *params, double *norm)
{
    struct gpt2_part whole = gpt2_part_whole(&cfg);
    struct model m;
    struct plait_error err;
    struct model_shape shape = {.B = B, .T = T, .slots = 1, .dp = 1};
    struct ops_ctx *cx = test_cpu_open();
    CHECK(model_init(&m, &cfg, &whole, NULL, ops_cpu(), cx, &shape, &err) == 0, "%s", err.text);
    float *host = malloc(m.shard.total * sizeof *host);
    gpt2_shard_copy(&m.shard, (float *)full, host, true);
    model_set_params(&m, host);
    for (int k = 0; k < A * dp; k++) {
        model_forward(&m, data_in[k], data_tg[k], B, T, 1.0f / (N * A * dp), NULL, &err);
        model_backward(&m, B, T, k > 0, &err);
    }
    optim_step(&m, &opt, opt.lr, 1, NULL, norm, &err);
    m.ops->download(m.ctx, params, m.params, m.shard.total * sizeof(float));
    free(host);
    model_free(&m);
    ops_cpu()->close(cx);
}

static void test_dp_and_zero_step_as_one_rank(void)
{
    struct gpt2_layout full;
    gpt2_layout(&cfg, &full);
    float *weights = malloc(full.total * sizeof *weights);
    gpt2_init_weights(&cfg, &full, weights, 9);
    struct rng r;
    rng_seed(&r, 4, 0);
    for (int k = 0; k < MAX_DP * A; k++)
        for (int i = 0; i < N; i++) {
            data_in[k][i] = (int32_t)rng_below(&r, cfg.vocab);
            data_tg[k][i] = (int32_t)rng_below(&r, cfg.vocab);
        }
    float *ref = malloc(full.total * sizeof *ref), *got = malloc(full.total * sizeof *got);
    CHECK(full.total % 2 == 0 && full.total % 3 != 0, "the count must not divide by 3 (%zu)",
          full.total);
    for (int dp = 2; dp <= MAX_DP; dp++) {
        double ref_norm = 0, norm = 0;
        reference(dp, weights, ref, &ref_norm);
        for (int i = 0; i < 6; i++) { /* each ZeRO stage after backward, then in buckets */
            int zero = i % 3;
            if (run(dp, zero, i >= 3, weights, got, &norm, full.total)) continue;
            CHECK(fabs(norm - ref_norm) <= 1e-6 * ref_norm, "dp %d zero %d%s: norm %.9g vs %.9g",
                  dp, zero, i >= 3 ? " in buckets" : "", norm, ref_norm);
            double d = 0, n = 0;
            for (size_t e = 0; e < full.total; e++) {
                d += ((double)got[e] - ref[e]) * ((double)got[e] - ref[e]);
                n += (double)ref[e] * ref[e];
            }
            CHECK(sqrt(d) <= 1e-6 * sqrt(n), "dp %d zero %d%s: parameters off by %.3g", dp, zero,
                  i >= 3 ? " in buckets" : "", sqrt(d / n));
        }
    }
    free(weights);
    free(ref);
    free(got);
}

int main(void)
{
    omp_set_num_threads(1);
    RUN(test_dp_and_zero_step_as_one_rank);
    return check_exit_code();
}
