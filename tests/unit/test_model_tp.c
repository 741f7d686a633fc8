/* test_model_tp.c — tensor parallelism (Megatron) in the model against the
 * whole model on one rank: tp ranks as threads of this process, joined by
 * tests/unit/thread_group.h (sums in rank order, the same bits on every rank),
 * each holding its shard of the same weights. The loss and every gradient
 * tensor, gathered back into llm.c order, match the one-rank run; with every
 * recompute policy; the gradient norm counts each parameter once, so one
 * clipped AdamW step lands on the same weights; and the same layout twice
 * gives the same bits. */
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "thread_group.h"
#include "common/rng.h"
#include "kernels/ops.h"
#include "runtime/gpt2.h"
#include "runtime/model.h"
#include "runtime/optim.h"

static const struct gpt2_config cfg = {
    .max_seq_len = 8, .vocab = 50, .padded_vocab = 64, .layers = 2, .heads = 4, .hidden = 16};
enum { B = 2, T = 8, N = B * T, MAX_TP = 4 };

/* ---- one rank's run ------------------------------------------------------------------- */

struct job {
    int tp, rank;
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
    struct model_shape shape = {.B = B, .T = T, .recompute = j->recompute, .slots = 1, .dp = 1};
    if (model_init(&m, &cfg, &part, j->tp > 1 ? &tp : NULL, ops_cpu(), &shape, &err)) {
        snprintf(j->error, sizeof j->error, "%s", err.text);
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
        model_backward(&m, B, T, false, &err)) {
        snprintf(j->error, sizeof j->error, "%s", err.text);
    } else {
        j->grads = malloc(m.shard.total * sizeof *j->grads);
        m.ops->download(j->grads, m.grads, m.shard.total * sizeof(float));
        j->shard = m.shard;
        j->params = malloc(m.shard.total * sizeof *j->params);
        struct optim_groups groups = {.mp = &tp};
        if (optim_step(&m, &opt, opt.lr, 1, &groups, &j->norm, &err))
            snprintf(j->error, sizeof j->error, "%s", err.text);
        else
            m.ops->download(j->params, m.params, m.shard.total * sizeof(float));
    }
    free(shard);
    model_free(&m);
    return NULL;
}

/* Trains one micro-batch at tp (threads); the loss and the gradients gathered
 * into llm.c order into full_grads. */
static int run(int tp, enum plan_recompute recompute, const float *params, const int32_t *in,
               const int32_t *tg, double *loss, float *full_grads, double *norm, float *stepped)
{
    struct threads g;
    threads_init(&g, tp);
    struct job jobs[MAX_TP];
    pthread_t threads[MAX_TP];
    for (int r = 0; r < tp; r++) {
        jobs[r] = (struct job){.tp = tp,
                               .rank = r,
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
        free(jobs[r].grads);
        free(jobs[r].params);
    }
    *loss = jobs[0].loss;
    *norm = jobs[0].norm;
    threads_destroy(&g);
    return rc;
}

static void test_tp_matches_one_rank_loss_and_every_gradient(void)
{
    struct gpt2_layout full;
    gpt2_layout(&cfg, &full);
    float *params = malloc(full.total * sizeof *params);
    gpt2_init_weights(&cfg, &full, params, 7);
    int32_t in[N], tg[N];
    struct rng r;
    rng_seed(&r, 11, 0);
    for (int i = 0; i < N; i++) in[i] = (int32_t)rng_below(&r, cfg.vocab);
    for (int i = 0; i < N; i++) tg[i] = (int32_t)rng_below(&r, cfg.vocab);
    const enum plan_recompute policies[] = {PLAN_RECOMPUTE_NONE, PLAN_RECOMPUTE_SELECTIVE,
                                            PLAN_RECOMPUTE_FULL};
    float *ref = calloc(full.total, sizeof *ref), *got = calloc(full.total, sizeof *got);
    float *ref_p = calloc(full.total, sizeof *ref_p), *got_p = calloc(full.total, sizeof *got_p);
    double ref_loss, loss, ref_norm, norm;
    if (run(1, PLAN_RECOMPUTE_NONE, params, in, tg, &ref_loss, ref, &ref_norm, ref_p)) goto out;
    for (int tp = 2; tp <= MAX_TP; tp *= 2)
        for (size_t k = 0; k < 3; k++) {
            memset(got, 0, full.total * sizeof *got);
            if (run(tp, policies[k], params, in, tg, &loss, got, &norm, got_p)) continue;
            CHECK(fabs(loss - ref_loss) <= 1e-6 * fabs(ref_loss), "tp %d: loss %.9g vs %.9g", tp,
                  loss, ref_loss);
            /* the norm counts each parameter once, so the clipping is the same */
            CHECK(fabs(norm - ref_norm) <= 1e-6 * ref_norm, "tp %d: gradient norm %.9g vs %.9g", tp,
                  norm, ref_norm);
            double dp = 0, np = 0;
            for (size_t i = 0; i < full.total; i++) {
                dp += ((double)got_p[i] - ref_p[i]) * ((double)got_p[i] - ref_p[i]);
                np += (double)ref_p[i] * ref_p[i];
            }
            CHECK(sqrt(dp) <= 1e-6 * sqrt(np), "tp %d: parameters after a step off by %.3g", tp,
                  sqrt(dp / np));
            for (int t = 0; t < GPT2_TENSORS; t++) {
                double d = 0, n = 0;
                for (size_t i = 0; i < full.elems[t]; i++) {
                    double a = got[full.offset[t] + i], b = ref[full.offset[t] + i];
                    d += (a - b) * (a - b);
                    n += b * b;
                }
                CHECK(sqrt(d) <= 1e-5 * sqrt(n) + 1e-30,
                      "tp %d recompute %zu: %s off by %.3g relative", tp, k, gpt2_tensor_names[t],
                      n > 0 ? sqrt(d / n) : sqrt(d));
            }
        }
    /* the same layout twice: the same bits */
    float *again = calloc(full.total, sizeof *again);
    double loss2, norm2;
    memset(got, 0, full.total * sizeof *got);
    if (run(2, PLAN_RECOMPUTE_NONE, params, in, tg, &loss, got, &norm, got_p) == 0 &&
        run(2, PLAN_RECOMPUTE_NONE, params, in, tg, &loss2, again, &norm2, got_p) == 0)
        CHECK(loss == loss2 && memcmp(got, again, full.total * sizeof *got) == 0,
              "tp 2 twice: different bits");
    free(again);
out:
    free(params);
    free(ref);
    free(got);
    free(ref_p);
    free(got_p);
}

int main(void)
{
    omp_set_num_threads(1);
    RUN(test_tp_matches_one_rank_loss_and_every_gradient);
    return check_exit_code();
}
