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
 * grads_final hook (the data-parallel buckets') is told is final stays so. A
 * step stopped mid-way (the first stage agreeing to stop, or a later stage
 * asking it to) drains: every stage ends with exactly the gradients of the
 * micro-batches before the stop, and no message is left over. Handing the
 * gradients over where the buffer is quiescent (ZeRO 2) does so exactly at
 * schedule_quiescent's points, what the hook called final is final at each
 * hand-over, and the hand-overs sum to the step's gradients. */
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "common/rng.h"
#include "kernels/ops.h"
#include "tests/unit/cpu_ctx.h"
#include "runtime/gpt2.h"
#include "runtime/model.h"
#include "runtime/pipeline.h"

static const struct gpt2_config cfg = {
    .max_seq_len = 8, .vocab = 50, .padded_vocab = 64, .layers = 8, .heads = 4, .hidden = 16};
enum { B = 2, T = 8, N = B * T, MAX_PP = 4, MAX_M = 8 };

/* ---- an in-process link: one mailbox of messages ----------------------------------------- */
/* Sends never wait (as the link's contract says); receives take a stage's
 * messages in the order they were sent, as NCCL pairs them, and fail
 * otherwise. */

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
    bool broken; /* a receive out of order: every waiting receive fails too */
};

struct endpoint {
    struct post *post;
    int stage;
};

static int post_send(void *ctx, int to, uint32_t tag, const float *buf, size_t n, bool on_host,
                     struct plait_error *err)
{
    (void)on_host; /* the CPU: all host memory */
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
            /* NCCL pairs a sender's messages with the receiver's receives in
             * posting order (tags unmatched): an older message between the
             * two stages (later in this newest-first list) must not wait */
            const struct message *older = msg->next;
            while (older && (older->to != e->stage || older->from != from)) older = older->next;
            *p = msg->next;
            if (older) {
                e->post->broken = true;
                pthread_cond_broadcast(&e->post->arrived);
            }
            pthread_mutex_unlock(&e->post->lock);
            int rc = msg->n == n ? 0 : error_set(err, "message of %zu floats, want %zu", msg->n, n);
            if (older)
                rc = error_set(err,
                               "stage %d received tag %#x from stage %d before its older "
                               "message (tag %#x): out of posting order",
                               e->stage, tag, from, older->tag);
            if (rc == 0) memcpy(buf, msg->data, n * sizeof(float));
            free(msg->data);
            free(msg);
            return rc;
        }
        if (e->post->broken) {
            pthread_mutex_unlock(&e->post->lock);
            return error_set(err, "stage %d: another stage received out of posting order",
                             e->stage);
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
    int stop_before; /* first stage: agree to stop before this micro-batch (0: never) */
    int want_after;  /* ask to stop once this many backwards are done (0: never) */
    int agreements, backwards, done;
    struct endpoint end;
    const float *full_params;
    double loss;
    float *grads;
    struct gpt2_shard shard;
    char error[1024];
    int checked;            /* marks found final */
    float *taken;           /* handing over: the sum of what was handed over */
    int handed[MAX_M + 1];  /* and after how many micro-batches each hand-over came */
    int n_handed;
};

static enum plan_recompute recompute; /* of the stages' models */
static bool handing;                  /* the stages hand their gradients over (ZeRO 2) */

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
    j->m->ops->download(j->m->ctx, k->snapshot, j->m->grads + from, n * sizeof(float));
    return 0;
}

/* Every region the hook called final holds its final values (grads) then. */
static void check_marks(struct job *j, const float *grads)
{
    j->checked += j->n_marks;
    for (int i = 0; i < j->n_marks; i++) {
        struct final_mark *k = &j->marks[i];
        size_t n = k->to - k->from;
        CHECK(memcmp(k->snapshot, grads + k->from, n * sizeof(float)) == 0,
              "%s pp %d v %d stage %d: gradients [%zu, %zu) called final changed later",
              schedule_kind_name(j->sched->kind), j->sched->pp, j->sched->v, j->stage, k->from,
              k->to);
        free(k->snapshot);
    }
    j->n_marks = 0;
}

/* The pipeline's hand_over: what the hook called final since the last one
 * is final now; the buffer's values are added to the sum taken away. */
static int take_away(void *ctx, int micros, struct plait_error *err)
{
    struct job *j = ctx;
    size_t n = j->m->shard.total;
    float *now = malloc(n * sizeof *now);
    if (!now) return error_set(err, "out of memory");
    j->m->ops->download(j->m->ctx, now, j->m->grads, n * sizeof(float));
    check_marks(j, now);
    for (size_t i = 0; i < n; i++) j->taken[i] += now[i];
    free(now);
    if (j->n_handed <= MAX_M) j->handed[j->n_handed++] = micros;
    return 0;
}

/* Where a stage handed over: every quiescent point of its list, in order. */
static void check_hand_overs(const struct job *j)
{
    const struct schedule *s = j->sched;
    bool at[MAX_M + 1];
    schedule_quiescent(s, j->stage, at);
    int k = 0;
    for (int n = 1; n <= s->m; n++) {
        if (!at[n]) continue;
        CHECK(k < j->n_handed && j->handed[k] == n, "%s pp %d m %d v %d stage %d: no hand-over at %d",
              schedule_kind_name(s->kind), s->pp, s->m, s->v, j->stage, n);
        k++;
    }
    CHECK(k == j->n_handed, "stage %d: %d hand-overs, %d quiescent points", j->stage, j->n_handed, k);
}

static int count_backward(void *ctx, int micro, struct plait_error *err)
{
    struct job *j = ctx;
    (void)micro;
    (void)err;
    j->backwards++;
    return 0;
}

static int agree_stop(void *ctx, int *stop, struct plait_error *err)
{
    struct job *j = ctx;
    (void)err;
    /* the agreements come before micro-batches 1, 2, ... in turn */
    *stop = *stop || ++j->agreements == j->stop_before ||
            (j->want_after && j->backwards >= j->want_after);
    return 0;
}

static bool wants_stop(void *ctx)
{
    struct job *j = ctx;
    return j->want_after && j->backwards >= j->want_after;
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
    struct ops_ctx *cx = test_cpu_open();
    if (model_init(&m, &cfg, &part, NULL, ops_cpu(), cx, &shape, &err)) {
        snprintf(j->error, sizeof j->error, "%s", err.text);
        ops_cpu()->close(cx);
        return NULL;
    }
    float *shard = malloc(m.shard.total * sizeof *shard);
    gpt2_shard_copy(&m.shard, (float *)j->full_params, shard, true);
    model_set_params(&m, shard);
    struct pipe_link link = {post_send, post_recv, NULL, &j->end};
    struct pipe_feed feed = {feed_next, NULL};
    struct pipe_times times;
    j->m = &m;
    j->taken = handing ? calloc(m.shard.total, sizeof *j->taken) : NULL;
    struct pipe_step how = {.B = B,
                            .T = T,
                            .grad_scale = 1.0f / (N * s->m),
                            .after_backward = count_backward,
                            .agree_stop = agree_stop,
                            .wants_stop = wants_stop,
                            .ctx = j,
                            .hand_over = handing ? take_away : NULL,
                            .grads_final = mark_final,
                            .grads_ctx = j};
    if (pipeline_step(&m, s, j->stage, &link, &feed, &how, &j->loss, &j->done, &times, &err)) {
        snprintf(j->error, sizeof j->error, "%s", err.text);
        free(j->taken);
    } else if (handing) {
        j->grads = j->taken; /* all of it handed over: the step's end is quiescent */
        j->shard = m.shard;
        check_hand_overs(j);
    } else {
        j->grads = malloc(m.shard.total * sizeof *j->grads);
        m.ops->download(m.ctx, j->grads, m.grads, m.shard.total * sizeof(float));
        j->shard = m.shard;
        check_marks(j, j->grads);
    }
    /* a step run to its end makes its gradients final (a stopped one does not) */
    CHECK(j->error[0] || j->checked > 0 || j->done < s->m,
          "stage %d: the grads_final hook was never called", j->stage);
    free(shard);
    model_free(&m);
    ops_cpu()->close(cx);
    return NULL;
}

/* One step of schedule s over stages as threads: the loss and the gradients
 * summed over the stages (wte: first + last) into full_grads. The first
 * stage agrees to stop before micro-batch stop_before (0: never); stage
 * want_stage asks to stop after its want_after-th backward (0: never);
 * *done: the micro-batches every stage completed (-1 if they differ). */
static int run_stopped(const struct schedule *s, const float *params, int stop_before,
                       int want_stage, int want_after, double *loss, float *full_grads,
                       size_t full_total, int *done)
{
    struct post post = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, false};
    struct job jobs[MAX_PP];
    pthread_t threads[MAX_PP];
    for (int st = 0; st < s->pp; st++) {
        jobs[st] = (struct job){.sched = s,
                                .stage = st,
                                .stop_before = st == 0 ? stop_before : 0,
                                .want_after = st == want_stage ? want_after : 0,
                                .end = {&post, st},
                                .full_params = params};
        pthread_create(&threads[st], NULL, run_stage, &jobs[st]);
    }
    for (int st = 0; st < s->pp; st++) pthread_join(threads[st], NULL);
    int rc = 0;
    *done = jobs[0].done;
    for (int st = 0; st < s->pp; st++)
        if (jobs[st].done != *done || jobs[st].backwards != *done) *done = -1;
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

static int run(const struct schedule *s, const float *params, double *loss, float *full_grads,
               size_t full_total)
{
    int done;
    int rc = run_stopped(s, params, 0, 0, 0, loss, full_grads, full_total, &done);
    CHECK(rc || done == s->m, "%s pp %d m %d: %d micro-batches done", schedule_kind_name(s->kind),
          s->pp, s->m, done);
    return rc;
}

/* The reference, without the executor: one rank, the whole model, the first
 * `count` of a step's m micro-batches accumulated by hand. */
static int reference_of(int count, int m, const float *params, double *loss, float *full_grads,
                        size_t full_total)
{
    struct gpt2_part whole = gpt2_part_whole(&cfg);
    struct model md;
    struct plait_error err;
    struct model_shape shape = {.B = B, .T = T, .slots = 1, .dp = 1};
    struct ops_ctx *cx = test_cpu_open();
    if (model_init(&md, &cfg, &whole, NULL, ops_cpu(), cx, &shape, &err)) {
        CHECK(0, "%s", err.text);
        ops_cpu()->close(cx);
        return -1;
    }
    float *shard = malloc(md.shard.total * sizeof *shard);
    gpt2_shard_copy(&md.shard, (float *)params, shard, true);
    model_set_params(&md, shard);
    *loss = 0;
    int rc = 0;
    for (int k = 0; k < count && rc == 0; k++) {
        double l;
        rc = model_forward(&md, data_in[k], data_tg[k], B, T, 1.0f / (N * m), &l, &err) ||
                     model_backward(&md, B, T, k > 0, &err)
                 ? -1
                 : 0;
        *loss += l;
    }
    if (rc == 0) {
        md.ops->download(md.ctx, shard, md.grads, md.shard.total * sizeof(float));
        memset(full_grads, 0, full_total * sizeof *full_grads);
        gpt2_shard_copy(&md.shard, full_grads, shard, false);
    } else {
        CHECK(0, "%s", err.text);
    }
    free(shard);
    model_free(&md);
    ops_cpu()->close(cx);
    return rc;
}

static int reference(int m, const float *params, double *loss, float *full_grads, size_t full_total)
{
    return reference_of(m, m, params, loss, full_grads, full_total);
}

/* The loss within 1e-6 and every tensor within 1e-5 of the reference's. */
static void compare(const char *what, const struct gpt2_layout *full, double loss, double ref_loss,
                    const float *got, const float *ref)
{
    CHECK(fabs(loss - ref_loss) <= 1e-6 * fabs(ref_loss), "%s: loss %.9g vs %.9g", what, loss,
          ref_loss);
    for (int t = 0; t < GPT2_TENSORS; t++) {
        double d = 0, n = 0;
        for (size_t i = 0; i < full->elems[t]; i++) {
            double a = got[full->offset[t] + i], b = ref[full->offset[t] + i];
            d += (a - b) * (a - b);
            n += b * b;
        }
        CHECK(sqrt(d) <= 1e-5 * sqrt(n) + 1e-30, "%s: %s off by %.3g", what, gpt2_tensor_names[t],
              n > 0 ? sqrt(d / n) : sqrt(d));
    }
}

/* The weights and the micro-batches of every test. */
static float *make_inputs(struct gpt2_layout *full)
{
    gpt2_layout(&cfg, full);
    float *params = malloc(full->total * sizeof *params);
    gpt2_init_weights(&cfg, full, params, 5);
    struct rng r;
    rng_seed(&r, 3, 0);
    for (int k = 0; k < MAX_M; k++)
        for (int i = 0; i < N; i++) {
            data_in[k][i] = (int32_t)rng_below(&r, cfg.vocab);
            data_tg[k][i] = (int32_t)rng_below(&r, cfg.vocab);
        }
    return params;
}

/* One step of kind over pp stages (m micro-batches, v chunks) against one
 * rank accumulating the same micro-batches. */
static void check_case(enum sched_kind kind, int pp, int m, int v, const float *params,
                       const struct gpt2_layout *full, float *ref, float *got)
{
    struct schedule s;
    struct plait_error err;
    double ref_loss, loss;
    if (reference(m, params, &ref_loss, ref, full->total)) return;
    if (schedule_make(&s, kind, pp, m, v, &err)) {
        CHECK(0, "%s", err.text);
        return;
    }
    char what[96];
    snprintf(what, sizeof what, "%s (recompute %d) pp %d m %d v %d", schedule_kind_name(kind),
             (int)recompute, pp, m, v);
    if (run(&s, params, &loss, got, full->total) == 0)
        compare(what, full, loss, ref_loss, got, ref);
    schedule_free(&s);
}

static void test_pipeline_matches_one_rank_for_gpipe_1f1b_and_zb_h1(void)
{
    struct gpt2_layout full;
    float *params = make_inputs(&full);
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
            check_case(kinds[k], cases[c][0], cases[c][1], 1, params, &full, ref, got);
        }
    free(params);
    free(ref);
    free(got);
}

/* A stop agreed by the first stage before micro-batch k (each k of the step)
 * leaves every stage with the gradients of micro-batches 0..k-1, for each
 * schedule; a wish to stop from the last stage, after its first backward,
 * reaches the first stage and stops every stage at the same micro-batch,
 * before the step's end where the schedule sends gradients up while
 * micro-batches still enter (1F1B, ZB-H1; GPipe sends none before its last
 * forward). */
static void test_a_stopped_step_drains_to_the_micro_batches_before_the_stop(void)
{
    struct gpt2_layout full;
    float *params = make_inputs(&full);
    float *ref = malloc(full.total * sizeof *ref), *got = malloc(full.total * sizeof *got);
    const int cases[][2] = {{2, 4}, {4, 8}, {3, 5}, {1, 3}};
    const enum sched_kind kinds[] = {SCHED_GPIPE, SCHED_1F1B, SCHED_ZB_H1};
    recompute = PLAN_RECOMPUTE_NONE;
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        int pp = cases[c][0], m = cases[c][1];
        for (size_t kind = 0; kind < sizeof kinds / sizeof *kinds; kind++) {
            struct schedule s;
            struct plait_error err;
            if (schedule_make(&s, kinds[kind], pp, m, 1, &err)) {
                CHECK(0, "%s", err.text);
                continue;
            }
            for (int k = 0; k <= m; k++) { /* k = m: the last stage's wish */
                double loss, ref_loss;
                int done;
                bool asked = k == m;
                if (run_stopped(&s, params, asked ? 0 : k, asked ? pp - 1 : 0, asked ? 1 : 0, &loss,
                                got, full.total, &done))
                    continue;
                char what[96];
                snprintf(what, sizeof what, "%s pp %d m %d, stopped %s %d",
                         schedule_kind_name(s.kind), pp, m, asked ? "by the last stage at" : "at",
                         done);
                CHECK(asked || done == (k ? k : m), "%s: %d done, want %d", what, done, k);
                CHECK(!asked || (done >= 1 && (done < m || s.kind == SCHED_GPIPE || m <= pp)),
                      "%s: the last stage's wish stopped nothing", what);
                if (done >= 1 && reference_of(done, m, params, &ref_loss, ref, full.total) == 0)
                    compare(what, &full, loss, ref_loss, got, ref);
            }
            schedule_free(&s);
        }
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
    float *params = make_inputs(&full);
    float *ref = malloc(full.total * sizeof *ref), *got = malloc(full.total * sizeof *got);
    const int cases[][3] = {{2, 2, 2}, {2, 4, 2}, {2, 6, 4}, {4, 4, 2}, {4, 8, 2}}; /* pp, m, v */
    const enum plan_recompute policies[] = {PLAN_RECOMPUTE_NONE, PLAN_RECOMPUTE_SELECTIVE,
                                            PLAN_RECOMPUTE_NONE, PLAN_RECOMPUTE_FULL,
                                            PLAN_RECOMPUTE_NONE};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        recompute = policies[c];
        check_case(SCHED_INTERLEAVED, cases[c][0], cases[c][1], cases[c][2], params, &full, ref,
                   got);
    }
    free(params);
    free(ref);
    free(got);
}

/* ZeRO 2's hand-overs: 1F1B and ZB-H1 after every micro-batch, interleaved
 * after each group of pp; what the hook said was final is at each, and what
 * was handed over adds up to one rank's gradients of the step. */
static void test_hand_overs_come_where_the_buffer_is_quiescent(void)
{
    struct gpt2_layout full;
    float *params = make_inputs(&full);
    float *ref = malloc(full.total * sizeof *ref), *got = malloc(full.total * sizeof *got);
    const int cases[][4] = {{SCHED_1F1B, 2, 4, 1},        {SCHED_ZB_H1, 2, 4, 1},
                            {SCHED_ZB_H1, 4, 8, 1},       {SCHED_GPIPE, 3, 5, 1},
                            {SCHED_INTERLEAVED, 2, 4, 2}, {SCHED_INTERLEAVED, 2, 8, 2},
                            {SCHED_INTERLEAVED, 4, 8, 2}};
    recompute = PLAN_RECOMPUTE_NONE;
    handing = true;
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++)
        check_case((enum sched_kind)cases[c][0], cases[c][1], cases[c][2], cases[c][3], params,
                   &full, ref, got);
    handing = false;
    free(params);
    free(ref);
    free(got);
}

int main(void)
{
    omp_set_num_threads(1);
    RUN(test_pipeline_matches_one_rank_for_gpipe_1f1b_and_zb_h1);
    RUN(test_a_stopped_step_drains_to_the_micro_batches_before_the_stop);
    RUN(test_interleaved_pipeline_matches_one_rank);
    RUN(test_hand_overs_come_where_the_buffer_is_quiescent);
    return check_exit_code();
}
