/* test_pipeline.c — pipeline parallelism against the whole model: stages as
 * threads of this process, joined by an in-process link (sends copied into
 * mailboxes, never blocking), each holding its layers of the same weights and
 * running its list of the schedule. The summed loss and every gradient
 * tensor (the tied wte's summed over the first and last stage, as the
 * training loop will) match one rank accumulating the same micro-batches,
 * for GPipe, 1F1B and ZB-H1 (backward split into its input- and
 * weight-gradient passes, with each recompute policy) at several depths, and
 * for the interleaved 1F1B (v model chunks a stage) at several (pp, m, v);
 * stages hold no more micro-batches than the schedule promises, and what the
 * grads_final hook (the data-parallel buckets') is told is final stays so. */
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "common/rng.h"
#include "kernels/ops.h"
#include "runtime/gpt2.h"
#include "runtime/model.h"
#include "runtime/pipeline.h"

static const struct gpt2_config cfg = {
    .max_seq_len = 8, .vocab = 50, .padded_vocab = 64, .layers = 8, .heads = 4, .hidden = 16};
enum { B = 2, T = 8, N = B * T, MAX_PP = 4, MAX_M = 8 };

/* ---- an in-process link: one mailbox of messages ----------------------------------------- */

struct message {
    int to, from;
    uint32_t tag;
    float *data;
    size_t n;
    struct message *next;
};

struct post {
    pthread_mutex_t lock;
    pthread_cond_t arrived;
    struct message *head;
};

struct endpoint {
    struct post *post;
    int stage;
};

static int post_send(void *ctx, int to, uint32_t tag, const float *buf, size_t n,
                     struct plait_error *err)
{
    struct endpoint *e = ctx;
    struct message *msg = malloc(sizeof *msg);
    msg->data = malloc(n * sizeof(float));
    memcpy(msg->data, buf, n * sizeof(float));
    *msg = (struct message){to, e->stage, tag, msg->data, n, NULL};
    pthread_mutex_lock(&e->post->lock);
    msg->next = e->post->head;
    e->post->head = msg;
    pthread_cond_broadcast(&e->post->arrived);
    pthread_mutex_unlock(&e->post->lock);
    (void)err;
    return 0;
}

static int post_recv(void *ctx, int from, uint32_t tag, float *buf, size_t n,
                     struct plait_error *err)
{
    struct endpoint *e = ctx;
    pthread_mutex_lock(&e->post->lock);
    for (;;) {
        for (struct message **p = &e->post->head; *p; p = &(*p)->next) {
            struct message *msg = *p;
            if (msg->to != e->stage || msg->from != from || msg->tag != tag) continue;
            *p = msg->next;
            pthread_mutex_unlock(&e->post->lock);
            int rc = msg->n == n ? 0 : error_set(err, "message of %zu floats, want %zu", msg->n, n);
            if (rc == 0) memcpy(buf, msg->data, n * sizeof(float));
            free(msg->data);
            free(msg);
            return rc;
        }
        pthread_cond_wait(&e->post->arrived, &e->post->lock);
    }
}

/* ---- the data: micro-batch k's tokens and targets -------------------------------------- */

static int32_t data_in[MAX_M][N], data_tg[MAX_M][N];

static int feed_next(void *ctx, int micro, int32_t *tokens, int32_t *targets,
                     struct plait_error *err)
{
    (void)ctx;
    (void)err;
    memcpy(tokens, data_in[micro], sizeof data_in[micro]);
    memcpy(targets, data_tg[micro], sizeof data_tg[micro]);
    return 0;
}

/* ---- a stage ------------------------------------------------------------------------------ */

/* What the grads_final hook was told: gradients [from, to) final, and
 * their values then (each must equal the step's end). */
struct final_mark {
    size_t from, to;
    float *snapshot;
};

struct job {
    const struct schedule *sched;
    struct model *m;
    struct final_mark marks[64];
    int n_marks;
    int stage;
    struct endpoint end;
    const float *full_params;
    double loss;
    float *grads;
    struct gpt2_shard shard;
    char error[1024];
};

static enum plan_recompute recompute; /* of the stages' models */

static int mark_final(void *ctx, size_t from, size_t to, struct plait_error *err)
{
    struct job *j = ctx;
    (void)err;
    if (j->n_marks == 64) return 0;
    size_t n = to - from;
    struct final_mark *k = &j->marks[j->n_marks++];
    k->from = from;
    k->to = to;
    k->snapshot = malloc(n * sizeof(float) + 1);
    j->m->ops->download(k->snapshot, j->m->grads + from, n * sizeof(float));
    return 0;
}

/* Every region the hook called final holds its final values then. */
static void check_marks(struct job *j, const float *grads)
{
    for (int i = 0; i < j->n_marks; i++) {
        struct final_mark *k = &j->marks[i];
        size_t n = k->to - k->from;
        CHECK(memcmp(k->snapshot, grads + k->from, n * sizeof(float)) == 0,
              "%s pp %d v %d stage %d: gradients [%zu, %zu) called final changed later",
              schedule_kind_name(j->sched->kind), j->sched->pp, j->sched->v, j->stage, k->from,
              k->to);
        free(k->snapshot);
    }
    CHECK(j->n_marks > 0, "stage %d: the grads_final hook was never called", j->stage);
}

static void *run_stage(void *arg)
{
    struct job *j = arg;
    const struct schedule *s = j->sched;
    struct gpt2_part part = {.tp = 1, .pp = s->pp, .pp_rank = j->stage};
    gpt2_stage_chunks(cfg.layers, s->pp, s->v, j->stage, &part);
    struct model m;
    struct plait_error err = {.text = ""};
    struct model_shape shape = {.B = B,
                                .T = T,
                                .slots = schedule_max_in_flight(s, j->stage),
                                .dp = 1,
                                .recompute = recompute,
                                .split_backward = s->split_backward};
    if (model_init(&m, &cfg, &part, NULL, ops_cpu(), &shape, &err)) {
        snprintf(j->error, sizeof j->error, "%s", err.text);
        return NULL;
    }
    float *shard = malloc(m.shard.total * sizeof *shard);
    gpt2_shard_copy(&m.shard, (float *)j->full_params, shard, true);
    model_set_params(&m, shard);
    struct pipe_link link = {post_send, post_recv, &j->end};
    struct pipe_feed feed = {feed_next, NULL};
    struct pipe_times times;
    j->m = &m;
    struct pipe_step how = {
        .B = B, .T = T, .grad_scale = 1.0f / (N * s->m), .grads_final = mark_final, .grads_ctx = j};
    int done;
    if (pipeline_step(&m, s, j->stage, &link, &feed, &how, &j->loss, &done, &times, &err)) {
        snprintf(j->error, sizeof j->error, "%s", err.text);
    } else {
        j->grads = malloc(m.shard.total * sizeof *j->grads);
        m.ops->download(j->grads, m.grads, m.shard.total * sizeof(float));
        j->shard = m.shard;
        check_marks(j, j->grads);
    }
    free(shard);
    model_free(&m);
    return NULL;
}

/* One step of schedule s over stages as threads: the loss and the gradients
 * summed over the stages (wte: first + last) into full_grads. */
static int run(const struct schedule *s, const float *params, double *loss, float *full_grads,
               size_t full_total)
{
    struct post post = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL};
    struct job jobs[MAX_PP];
    pthread_t threads[MAX_PP];
    for (int st = 0; st < s->pp; st++) {
        jobs[st] = (struct job){.sched = s, .stage = st, .end = {&post, st}, .full_params = params};
        pthread_create(&threads[st], NULL, run_stage, &jobs[st]);
    }
    for (int st = 0; st < s->pp; st++) pthread_join(threads[st], NULL);
    int rc = 0;
    float *one = calloc(full_total, sizeof *one);
    memset(full_grads, 0, full_total * sizeof *full_grads);
    for (int st = 0; st < s->pp; st++) {
        if (jobs[st].error[0]) {
            CHECK(0, "%s pp %d m %d v %d stage %d: %s", schedule_kind_name(s->kind), s->pp, s->m,
                  s->v, st, jobs[st].error);
            rc = -1;
            continue;
        }
        memset(one, 0, full_total * sizeof *one);
        gpt2_shard_copy(&jobs[st].shard, one, jobs[st].grads, false);
        for (size_t i = 0; i < full_total; i++) full_grads[i] += one[i];
        free(jobs[st].grads);
    }
    *loss = jobs[s->pp - 1].loss;
    CHECK(post.head == NULL, "messages left undelivered");
    free(one);
    return rc;
}

/* The reference, without the executor: one rank, the whole model, m
 * micro-batches accumulated by hand. */
static int reference(int m, const float *params, double *loss, float *full_grads, size_t full_total)
{
    struct gpt2_part whole = gpt2_part_whole(&cfg);
    struct model md;
    struct plait_error err;
    struct model_shape shape = {.B = B, .T = T, .slots = 1, .dp = 1};
    if (model_init(&md, &cfg, &whole, NULL, ops_cpu(), &shape, &err)) {
        CHECK(0, "%s", err.text);
        return -1;
    }
    float *shard = malloc(md.shard.total * sizeof *shard);
    gpt2_shard_copy(&md.shard, (float *)params, shard, true);
    model_set_params(&md, shard);
    *loss = 0;
    int rc = 0;
    for (int k = 0; k < m && rc == 0; k++) {
        double l;
        rc = model_forward(&md, data_in[k], data_tg[k], B, T, 1.0f / (N * m), &l, &err) ||
                     model_backward(&md, B, T, k > 0, &err)
                 ? -1
                 : 0;
        *loss += l;
    }
    if (rc == 0) {
        md.ops->download(shard, md.grads, md.shard.total * sizeof(float));
        memset(full_grads, 0, full_total * sizeof *full_grads);
        gpt2_shard_copy(&md.shard, full_grads, shard, false);
    } else {
        CHECK(0, "%s", err.text);
    }
    free(shard);
    model_free(&md);
    return rc;
}

/* The loss and every tensor of got against ref (the one-rank run). */
static void compare(const struct schedule *s, const struct gpt2_layout *full, double loss,
                    double ref_loss, const float *got, const float *ref)
{
    const char *kind = schedule_kind_name(s->kind);
    CHECK(fabs(loss - ref_loss) <= 1e-6 * fabs(ref_loss),
          "%s (recompute %d) pp %d m %d v %d: loss %.9g vs %.9g", kind, (int)recompute, s->pp, s->m,
          s->v, loss, ref_loss);
    for (int t = 0; t < GPT2_TENSORS; t++) {
        double d = 0, n = 0;
        for (size_t i = 0; i < full->elems[t]; i++) {
            double a = got[full->offset[t] + i], b = ref[full->offset[t] + i];
            d += (a - b) * (a - b);
            n += b * b;
        }
        CHECK(sqrt(d) <= 1e-5 * sqrt(n) + 1e-30,
              "%s (recompute %d) pp %d m %d v %d: %s off by %.3g", kind, (int)recompute, s->pp,
              s->m, s->v, gpt2_tensor_names[t], n > 0 ? sqrt(d / n) : sqrt(d));
    }
}

static float *params;

static void setup_data(const struct gpt2_layout *full)
{
    params = malloc(full->total * sizeof *params);
    gpt2_init_weights(&cfg, full, params, 5);
    struct rng r;
    rng_seed(&r, 3, 0);
    for (int k = 0; k < MAX_M; k++)
        for (int i = 0; i < N; i++) {
            data_in[k][i] = (int32_t)rng_below(&r, cfg.vocab);
            data_tg[k][i] = (int32_t)rng_below(&r, cfg.vocab);
        }
}

/* One step of kind over pp stages (m micro-batches, v chunks) against one
 * rank accumulating the same micro-batches. */
static void check_case(enum sched_kind kind, int pp, int m, int v, const struct gpt2_layout *full,
                       float *ref, float *got)
{
    struct schedule s;
    struct plait_error err;
    double ref_loss, loss;
    if (reference(m, params, &ref_loss, ref, full->total)) return;
    if (schedule_make(&s, kind, pp, m, v, &err)) {
        CHECK(0, "%s", err.text);
        return;
    }
    if (run(&s, params, &loss, got, full->total) == 0) compare(&s, full, loss, ref_loss, got, ref);
    schedule_free(&s);
}

static void test_pipeline_matches_one_rank_for_gpipe_1f1b_and_zb_h1(void)
{
    struct gpt2_layout full;
    gpt2_layout(&cfg, &full);
    setup_data(&full);
    float *ref = malloc(full.total * sizeof *ref), *got = malloc(full.total * sizeof *got);
    const int cases[][2] = {{2, 4}, {4, 4}, {4, 8}, {3, 5}, {1, 3}};
    const enum sched_kind kinds[] = {SCHED_GPIPE, SCHED_1F1B, SCHED_ZB_H1, SCHED_ZB_H1,
                                     SCHED_ZB_H1};
    const enum plan_recompute policies[] = {PLAN_RECOMPUTE_NONE, PLAN_RECOMPUTE_NONE,
                                            PLAN_RECOMPUTE_NONE, PLAN_RECOMPUTE_SELECTIVE,
                                            PLAN_RECOMPUTE_FULL};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++)
        for (int k = 0; k < 5; k++) {
            recompute = policies[k];
            check_case(kinds[k], cases[c][0], cases[c][1], 1, &full, ref, got);
        }
    free(params);
    free(ref);
    free(got);
}

/* Interleaved 1F1B: stage s holds chunks s, pp + s, ... of the 8 layers;
 * chunk c of stage pp-1 feeds chunk c+1 of stage 0. */
static void test_interleaved_pipeline_matches_one_rank(void)
{
    struct gpt2_layout full;
    gpt2_layout(&cfg, &full);
    setup_data(&full);
    float *ref = malloc(full.total * sizeof *ref), *got = malloc(full.total * sizeof *got);
    const int cases[][3] = {{2, 2, 2}, {2, 4, 2}, {2, 6, 4}, {4, 4, 2}, {4, 8, 2}}; /* pp, m, v */
    const enum plan_recompute policies[] = {PLAN_RECOMPUTE_NONE, PLAN_RECOMPUTE_SELECTIVE,
                                            PLAN_RECOMPUTE_NONE, PLAN_RECOMPUTE_FULL,
                                            PLAN_RECOMPUTE_NONE};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        recompute = policies[c];
        check_case(SCHED_INTERLEAVED, cases[c][0], cases[c][1], cases[c][2], &full, ref, got);
    }
    free(params);
    free(ref);
    free(got);
}

int main(void)
{
    omp_set_num_threads(1);
    RUN(test_pipeline_matches_one_rank_for_gpipe_1f1b_and_zb_h1);
    RUN(test_interleaved_pipeline_matches_one_rank);
    return check_exit_code();
}
