/* test_model_tp.c — tensor parallelism (Megatron) in the model against the
 * whole model on one rank: tp ranks as threads of this process, joined by
 * tests/unit/thread_group.h (sums in rank order, the same bits on every rank),
 * each holding its shard of the same weights. The loss and every gradient
 * tensor, gathered back into llm.c order, match the one-rank run; with every
 * recompute policy; the gradient norm counts each parameter once, so one
 * clipped AdamW step lands on the same weights; and the same layout twice
 * gives the same bits. The same with sequence parallelism (the residual
 * stream split by rows over the group), which also matches plain tp. */
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "thread_group.h"
#include "common/rng.h"
#include "kernels/ops.h"
#include "tests/unit/cpu_ctx.h"
#include "runtime/gpt2.h"
#include "runtime/model.h"
#include "runtime/optim.h"

static const struct gpt2_config cfg = {
    .max_seq_len = 8, .vocab = 50, .padded_vocab = 64, .layers = 2, .heads = 4, .hidden = 16};
enum { B = 2, T = 8, N = B * T, MAX_TP = 4 };

/* ---- one rank's run ------------------------------------------------------------------- */

struct job {
    int tp, rank;
    bool sp;
    enum plan_recompute recompute;
    struct thread_rank member;
    const float *full_params;
    const int32_t *inputs, *targets;
    double loss, norm;
    float *grads;  /* this rank's gradient buffer (shard order) */
    float *params; /* and its parameters after one AdamW step with clipping */
    struct gpt2_shard shard;
    char error[1024];
};

static void *run_rank(void *arg)
{
    struct job *j = arg;
    struct gpt2_part part = {.tp = j->tp, .tp_rank = j->rank, .pp = 1, .layer_end = cfg.layers};
    struct group tp = thread_group(&j->member);
    struct model m;
    struct plait_error err = {.text = ""};
    struct model_shape shape = {
        .B = B, .T = T, .recompute = j->recompute, .slots = 1, .dp = 1, .sequence_parallel = j->sp};
    struct ops_ctx *cx = test_cpu_open();
    if (model_init(&m, &cfg, &part, j->tp > 1 ? &tp : NULL, ops_cpu(), cx, &shape, &err)) {
        snprintf(j->error, sizeof j->error, "%s", err.text);
        ops_cpu()->close(cx);
        return NULL;
    }
    float *shard = malloc(m.shard.total * sizeof *shard);
    gpt2_shard_copy(&m.shard, (float *)j->full_params, shard, true);
    model_set_params(&m, shard);
    struct plan_optimizer opt = {.lr = 1e-2,
                                 .beta1 = 0.9,
                                 .beta2 = 0.95,
                                 .eps = 1e-8,
                                 .weight_decay = 0.1,
                                 .grad_clip = 0.5};
    if (model_forward(&m, j->inputs, j->targets, B, T, 1.0f / N, &j->loss, &err) ||
        model_backward(&m, B, T, false, &err) || model_sum_layernorm_grads(&m, &err)) {
        snprintf(j->error, sizeof j->error, "%s", err.text);
    } else {
        j->grads = malloc(m.shard.total * sizeof *j->grads);
        m.ops->download(m.ctx, j->grads, m.grads, m.shard.total * sizeof(float));
        j->shard = m.shard;
        j->params = malloc(m.shard.total * sizeof *j->params);
        struct optim_groups groups = {.mp = &tp};
        if (optim_step(&m, &opt, opt.lr, 1, &groups, &j->norm, &err))
            snprintf(j->error, sizeof j->error, "%s", err.text);
        else
            m.ops->download(m.ctx, j->params, m.params, m.shard.total * sizeof(float));
    }
    free(shard);
    model_free(&m);
    ops_cpu()->close(cx);
    return NULL;
}

struct same_replicas {
    const struct job *a, *b;
};

static int same_replica(void *ctx, enum gpt2_tensor t, int layer, size_t off, size_t n)
{
    const struct same_replicas *s = ctx;
    if (!gpt2_tensor_tp_replicated(t)) return 0;
    CHECK(!memcmp(s->a->grads + off, s->b->grads + off, n * sizeof(float)) &&
              !memcmp(s->a->params + off, s->b->params + off, n * sizeof(float)),
          "tp %d: rank %d's %s (layer %d) differs from rank %d's", s->b->tp, s->b->rank,
          gpt2_tensor_names[t], layer, s->a->rank);
    return 0;
}

/* Trains one micro-batch at tp (threads); the loss and the gradients gathered
 * into llm.c order into full_grads. */
static int run(int tp, bool sp, enum plan_recompute recompute, const float *params,
               const int32_t *in, const int32_t *tg, double *loss, float *full_grads, double *norm,
               float *stepped)
{
    struct threads g;
    threads_init(&g, tp);
    struct job jobs[MAX_TP];
    pthread_t threads[MAX_TP];
    for (int r = 0; r < tp; r++) {
        jobs[r] = (struct job){.tp = tp,
                               .rank = r,
                               .sp = sp,
                               .recompute = recompute,
                               .member = {&g, r},
                               .full_params = params,
                               .inputs = in,
                               .targets = tg};
        pthread_create(&threads[r], NULL, run_rank, &jobs[r]);
    }
    int rc = 0;
    for (int r = 0; r < tp; r++) pthread_join(threads[r], NULL);
    for (int r = 0; r < tp; r++) {
        if (jobs[r].error[0]) {
            CHECK(0, "tp %d rank %d: %s", tp, r, jobs[r].error);
            rc = -1;
            continue;
        }
        gpt2_shard_copy(&jobs[r].shard, full_grads, jobs[r].grads, false);
        gpt2_shard_copy(&jobs[r].shard, stepped, jobs[r].params, false);
        if (r > 0)
            CHECK(jobs[r].loss == jobs[0].loss && jobs[r].norm == jobs[0].norm,
                  "tp %d: rank %d's loss or gradient norm differs", tp, r);
        /* a tensor every rank holds whole has the same gradient and update on each */
        if (r > 0 && !jobs[0].error[0]) {
            struct same_replicas same = {&jobs[0], &jobs[r]};
            gpt2_shard_each(&jobs[r].shard, same_replica, &same);
        }
    }
    for (int r = 0; r < tp; r++) {
        free(jobs[r].grads);
        free(jobs[r].params);
    }
    *loss = jobs[0].loss;
    *norm = jobs[0].norm;
    threads_destroy(&g);
    return rc;
}

/* The model's weights and one micro-batch of tokens and targets. */
struct fixture {
    struct gpt2_layout full;
    float *params;
    int32_t in[N], tg[N];
};

static void fixture_init(struct fixture *f)
{
    gpt2_layout(&cfg, &f->full);
    f->params = malloc(f->full.total * sizeof *f->params);
    gpt2_init_weights(&cfg, &f->full, f->params, 7);
    struct rng r;
    rng_seed(&r, 11, 0);
    for (int i = 0; i < N; i++) f->in[i] = (int32_t)rng_below(&r, cfg.vocab);
    for (int i = 0; i < N; i++) f->tg[i] = (int32_t)rng_below(&r, cfg.vocab);
}

/* The largest difference of a tensor of got from ref, relative to ref's norm. */
static double worst_tensor(const struct gpt2_layout *full, const float *got, const float *ref,
                           int *which)
{
    double worst = 0;
    for (int t = 0; t < GPT2_TENSORS; t++) {
        double d = 0, n = 0;
        for (size_t i = 0; i < full->elems[t]; i++) {
            double a = got[full->offset[t] + i], b = ref[full->offset[t] + i];
            d += (a - b) * (a - b);
            n += b * b;
        }
        double rel = n > 0 ? sqrt(d / n) : sqrt(d) * 1e30;
        if (rel > worst) {
            worst = rel;
            *which = t;
        }
    }
    return worst;
}

/* tp 2 and 4, every recompute policy, plain tp or sequence parallel, against
 * one rank: the loss, the gradient norm, every gradient tensor and the
 * parameters after a clipped AdamW step; then the same layout twice. With
 * plain (non-NULL), the gradients of plain tp at each tp, to compare with. */
static void compare_with_one_rank(bool sp, float *plain[MAX_TP + 1])
{
    struct fixture f;
    fixture_init(&f);
    const struct gpt2_layout *full = &f.full;
    const enum plan_recompute policies[] = {PLAN_RECOMPUTE_NONE, PLAN_RECOMPUTE_SELECTIVE,
                                            PLAN_RECOMPUTE_FULL};
    float *ref = calloc(full->total, sizeof *ref), *got = calloc(full->total, sizeof *got);
    float *ref_p = calloc(full->total, sizeof *ref_p), *got_p = calloc(full->total, sizeof *got_p);
    double ref_loss, loss, ref_norm, norm, worst_loss = 0, worst_norm = 0, worst_grad = 0;
    const char *what = sp ? "sequence parallel tp" : "tp";
    if (run(1, false, PLAN_RECOMPUTE_NONE, f.params, f.in, f.tg, &ref_loss, ref, &ref_norm, ref_p))
        goto out;
    for (int tp = 2; tp <= MAX_TP; tp *= 2)
        for (size_t k = 0; k < 3; k++) {
            memset(got, 0, full->total * sizeof *got);
            if (run(tp, sp, policies[k], f.params, f.in, f.tg, &loss, got, &norm, got_p)) continue;
            worst_loss = fmax(worst_loss, fabs(loss - ref_loss) / fabs(ref_loss));
            worst_norm = fmax(worst_norm, fabs(norm - ref_norm) / ref_norm);
            CHECK(fabs(loss - ref_loss) <= 1e-6 * fabs(ref_loss), "%s %d: loss %.9g vs %.9g", what,
                  tp, loss, ref_loss);
            /* the norm counts each parameter once, so the clipping is the same */
            CHECK(fabs(norm - ref_norm) <= 1e-6 * ref_norm, "%s %d: gradient norm %.9g vs %.9g",
                  what, tp, norm, ref_norm);
            double dp = 0, np = 0;
            for (size_t i = 0; i < full->total; i++) {
                dp += ((double)got_p[i] - ref_p[i]) * ((double)got_p[i] - ref_p[i]);
                np += (double)ref_p[i] * ref_p[i];
            }
            CHECK(sqrt(dp) <= 1e-6 * sqrt(np), "%s %d: parameters after a step off by %.3g", what,
                  tp, sqrt(dp / np));
            int t = 0;
            double rel = worst_tensor(full, got, ref, &t);
            worst_grad = fmax(worst_grad, rel);
            CHECK(rel <= 1e-5, "%s %d recompute %zu: %s off by %.3g relative", what, tp, k,
                  gpt2_tensor_names[t], rel);
            if (plain && plain[tp] && k == 0) { /* the same sums in another order */
                rel = worst_tensor(full, got, plain[tp], &t);
                CHECK(rel <= 1e-6, "%s %d: %s off plain tp's by %.3g relative", what, tp,
                      gpt2_tensor_names[t], rel);
            }
            if (!sp && plain && k == 0) {
                plain[tp] = malloc(full->total * sizeof *got);
                memcpy(plain[tp], got, full->total * sizeof *got);
            }
        }
    printf("# %s against one rank: loss %.3g, norm %.3g, gradients %.3g relative at worst\n", what,
           worst_loss, worst_norm, worst_grad);
    /* the same layout twice: the same bits */
    float *again = calloc(full->total, sizeof *again);
    double loss2, norm2;
    memset(got, 0, full->total * sizeof *got);
    if (run(2, sp, PLAN_RECOMPUTE_NONE, f.params, f.in, f.tg, &loss, got, &norm, got_p) == 0 &&
        run(2, sp, PLAN_RECOMPUTE_NONE, f.params, f.in, f.tg, &loss2, again, &norm2, got_p) == 0)
        CHECK(loss == loss2 && norm == norm2 && memcmp(got, again, full->total * sizeof *got) == 0,
              "%s 2 twice: different bits", what);
    free(again);
out:
    free(f.params);
    free(ref);
    free(got);
    free(ref_p);
    free(got_p);
}

static float *plain_grads[MAX_TP + 1];

static void test_tp_matches_one_rank_loss_and_every_gradient(void)
{
    compare_with_one_rank(false, plain_grads);
}

/* The residual stream, the LayerNorms and the row-parallel biases on N/tp
 * rows a rank; the LayerNorms' gradients summed over the group after
 * backward: one rank's numbers, and plain tp's up to the order of sums. */
static void test_sequence_parallel_matches_one_rank_and_plain_tp(void)
{
    compare_with_one_rank(true, plain_grads);
}

/* B·T rows that tp does not divide: refused at init, and at a forward of a
 * smaller micro-batch, saying why. */
static void test_sequence_parallel_refuses_rows_that_do_not_split(void)
{
    struct threads g;
    threads_init(&g, 2);
    struct thread_rank me = {&g, 0};
    struct group tp = thread_group(&me);
    struct gpt2_part part = {.tp = 2, .tp_rank = 0, .pp = 1, .layer_end = cfg.layers};
    struct model_shape shape = {.B = 1, .T = 7, .slots = 1, .dp = 1, .sequence_parallel = true};
    struct model m;
    struct plait_error err = {.text = ""};
    struct ops_ctx *cx = test_cpu_open();
    CHECK(model_init(&m, &cfg, &part, &tp, ops_cpu(), cx, &shape, &err) == -1 &&
              strstr(err.text, "batch.micro_batch 1 × model.seq_len 7 = 7 rows do not split "
                               "evenly over parallel.tp 2"),
          "init: %s", err.text);
    shape.T = 8;
    if (model_init(&m, &cfg, &part, &tp, ops_cpu(), cx, &shape, &err) == 0) {
        int32_t tokens[8] = {0};
        CHECK(model_forward(&m, tokens, NULL, 1, 5, 0.0f, NULL, &err) == -1 &&
                  strstr(err.text, "micro-batch 1×5: 5 rows do not split over the 2 ranks"),
              "forward: %s", err.text);
        model_free(&m);
    } else {
        CHECK(0, "init: %s", err.text);
    }
    ops_cpu()->close(cx);
    threads_destroy(&g);
}

int main(void)
{
    omp_set_num_threads(1);
    RUN(test_tp_matches_one_rank_loss_and_every_gradient);
    RUN(test_sequence_parallel_matches_one_rank_and_plain_tp);
    RUN(test_sequence_parallel_refuses_rows_that_do_not_split);
    for (int tp = 0; tp <= MAX_TP; tp++) free(plain_grads[tp]);
    return check_exit_code();
}
