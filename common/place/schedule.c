/* schedule.c — pipeline schedule generators (GPipe, 1F1B, interleaved 1F1B as
 * Megatron orders it, ZB-H1 by list scheduling), the transfers inserted around
 * the computations, a simulator that checks a list and measures its bubble,
 * and the text timeline. Running a list is the runtime's executor. */
#include "common/place/schedule.h"

#include <stdlib.h>
#include <string.h>

/* the kinds are the plan's schedules, in its order */
_Static_assert((int)SCHED_1F1B == (int)PLAN_PIPE_1F1B && (int)SCHED_GPIPE == (int)PLAN_PIPE_GPIPE &&
                   (int)SCHED_INTERLEAVED == (int)PLAN_PIPE_INTERLEAVED &&
                   (int)SCHED_ZB_H1 == (int)PLAN_PIPE_ZB_H1 &&
                   (int)SCHED_DUALPIPEV == (int)PLAN_PIPE_DUALPIPEV,
               "enum sched_kind follows enum plan_pipeline");

const char *schedule_kind_name(enum sched_kind kind)
{
    return kind >= 0 && kind < SCHED_KINDS ? plan_pipeline_name((enum plan_pipeline)kind) : "?";
}

void schedule_stage_of(const struct schedule *s, int j, int *stage, int *chunk)
{
    if (s->kind == SCHED_DUALPIPEV) {
        *chunk = j >= s->pp;
        *stage = *chunk ? 2 * s->pp - 1 - j : j;
    } else {
        *stage = j % s->pp;
        *chunk = j / s->pp;
    }
}

bool schedule_kind_splits(enum sched_kind kind)
{
    return kind == SCHED_ZB_H1 || kind == SCHED_DUALPIPEV;
}

int schedule_virtual_stage(const struct schedule *s, int stage, int chunk)
{
    if (s->kind == SCHED_DUALPIPEV) return chunk == 0 ? stage : 2 * s->pp - 1 - stage;
    return chunk * s->pp + stage;
}

/* The most chunks with F run and W not yet anywhere in stage's list. */
static int held_on_list(const struct schedule *s, int stage)
{
    int held = 0, most = 0;
    for (int i = 0; i < s->n_ops[stage]; i++) {
        enum sched_op_type t = s->ops[stage][i].type;
        held += t == SCHED_F ? 1 : t == (s->split_backward ? SCHED_W : SCHED_B) ? -1 : 0;
        most = held > most ? held : most;
    }
    return most;
}

void schedule_of_plan(const struct plan *p, int pp, enum sched_kind *kind, int *v)
{
    enum plan_pipeline given = p->parallel.schedule;
    bool chunked = given == PLAN_PIPE_INTERLEAVED || given == PLAN_PIPE_DUALPIPEV;
    *kind = chunked && pp == 1 ? SCHED_1F1B : (enum sched_kind)given; /* one stage: one chunk */
    *v = *kind == SCHED_INTERLEAVED ? p->parallel.virtual_stages : *kind == SCHED_DUALPIPEV ? 2 : 1;
}

bool schedule_moe_lanes(const struct plan *p, int pp, const char **why_not)
{
    enum sched_kind kind;
    int v;
    schedule_of_plan(p, pp, &kind, &v);
    bool pairs = kind == SCHED_DUALPIPEV && p->model.moe.experts > 0 && p->parallel.ep > 1;
    const char *why = NULL;
    if (pairs && p->parallel.zero == 3) why = "ZeRO 3 gathers a pass's units in its order";
    if (why_not) *why_not = why;
    return pairs && !why;
}

int schedule_simulate_textbook(const struct schedule *s, struct sched_sim *out,
                               struct plait_error *err)
{
    double v = s->v, f = 1.0 / v;
    return schedule_simulate(s, f, s->split_backward ? f : 2 * f, s->split_backward ? f : 0, out,
                             err);
}

int schedule_make_for_plan(struct schedule *s, const struct plan *p, int pp,
                           struct plait_error *err)
{
    enum sched_kind kind;
    int v;
    schedule_of_plan(p, pp, &kind, &v);
    return schedule_make(s, kind, pp, p->batch.grad_accum, v, err);
}

int schedule_max_in_flight(const struct schedule *s, int stage)
{
    int m = s->m, most = m * s->v, n;
    switch (s->kind) {
    case SCHED_GPIPE:
        return m;
    case SCHED_INTERLEAVED:
        n = 2 * (s->pp - stage - 1) + (s->v - 1) * s->pp + 1;
        return n < most ? n : most;
    case SCHED_DUALPIPEV:
        return held_on_list(s, stage);
    default:
        return s->pp - stage < m ? s->pp - stage : m;
    }
}

/* ---- building lists ----------------------------------------------------------------------- */

struct list {
    struct sched_op *ops;
    int n, cap;
};

static int push(struct list *l, enum sched_op_type type, int micro, int chunk)
{
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        struct sched_op *bigger = realloc(l->ops, (size_t)cap * sizeof *bigger);
        if (!bigger) return -1;
        l->ops = bigger;
        l->cap = cap;
    }
    l->ops[l->n++] = (struct sched_op){type, micro, chunk};
    return 0;
}

/* The k-th forward (or backward) of an interleaved stage, as Megatron orders
 * them: groups of pp micro-batches go through chunk 0, then chunk 1, ...; the
 * backward visits the chunks in reverse. */
static void interleaved_op(int k, int pp, int v, bool backward, int *micro, int *chunk)
{
    int in_group = k % (pp * v);
    *micro = k / (pp * v) * pp + k % pp;
    *chunk = backward ? v - 1 - in_group / pp : in_group / pp;
}

/* DualPipeV's list for one stage, as DeepSeek's dualpipev.py orders it in
 * eight steps (r the stage, P the stages): F0 ×2(P-r-1); F0 F1 ×(r+1);
 * B1 W F1 ×(P-r-1); F0 B1 F1 B0 ×(m-2P+r+1), the main step, where DualPipe
 * overlaps each pair; B1 F1 B0 ×(P-r-1); B1 B0 ×(r+1); W B0 ×(P-r-1);
 * W ×(r+1). A backward is split (its W deferred to a first-in first-out
 * queue, zero-bubble style) in step 3, from the middle of step 6 on and in
 * step 7; every other one runs its W right after it. */
struct vlist {
    struct list *l;
    int f[2], b[2]; /* the next micro-batch of each chunk's F and B */
    int wq[4096][2], wq_head, wq_tail; /* the deferred W's (micro, chunk) */
    int rc;
};

static void v_f(struct vlist *v, int c)
{
    v->rc |= push(v->l, SCHED_F, v->f[c]++, c);
}

static void v_b(struct vlist *v, int c, bool defer)
{
    int k = v->b[c]++;
    v->rc |= push(v->l, SCHED_B, k, c);
    if (!defer) {
        v->rc |= push(v->l, SCHED_W, k, c);
    } else if (v->wq_tail - v->wq_head < 4096) {
        v->wq[v->wq_tail % 4096][0] = k;
        v->wq[v->wq_tail++ % 4096][1] = c;
    } else {
        v->rc = -1; /* more deferred than any stage defers (< 2·pp) */
    }
}

static void v_w(struct vlist *v)
{
    if (v->wq_head == v->wq_tail) {
        v->rc = -1;
        return;
    }
    int *w = v->wq[v->wq_head++ % 4096];
    v->rc |= push(v->l, SCHED_W, w[0], w[1]);
}

static int dualpipev_ops(const struct schedule *s, int r, struct list *l)
{
    int P = s->pp, m = s->m;
    struct vlist *v = calloc(1, sizeof *v);
    if (!v) return -1;
    v->l = l;
    for (int i = 0; i < 2 * (P - r - 1); i++) v_f(v, 0);
    for (int i = 0; i < r + 1; i++) v_f(v, 0), v_f(v, 1);
    for (int i = 0; i < P - r - 1; i++) v_b(v, 1, true), v_w(v), v_f(v, 1);
    for (int i = 0; i < m - 2 * P + r + 1; i++) v_f(v, 0), v_b(v, 1, false), v_f(v, 1), v_b(v, 0, false);
    for (int i = 0; i < P - r - 1; i++) v_b(v, 1, false), v_f(v, 1), v_b(v, 0, false);
    bool split = false;
    for (int i = 0; i < r + 1; i++) {
        if (i == (r + 1) / 2 && r % 2 == 1) split = true;
        v_b(v, 1, split);
        if (i == (r + 1) / 2 && r % 2 == 0) split = true;
        v_b(v, 0, split);
    }
    for (int i = 0; i < P - r - 1; i++) v_w(v), v_b(v, 0, true);
    for (int i = 0; i < r + 1; i++) v_w(v);
    int rc = v->rc || v->wq_head != v->wq_tail ? -1 : 0;
    free(v);
    return rc;
}

/* Computations only (F, B and, split, W) for stage s. */
static int compute_ops(const struct schedule *s, int stage, struct list *l)
{
    int pp = s->pp, m = s->m, v = s->v, rc = 0;
    switch (s->kind) {
    case SCHED_GPIPE:
        for (int k = 0; k < m; k++) rc |= push(l, SCHED_F, k, 0);
        for (int k = 0; k < m; k++) rc |= push(l, SCHED_B, k, 0);
        break;
    case SCHED_1F1B: {
        int warm = pp - stage - 1 < m ? pp - stage - 1 : m;
        for (int k = 0; k < warm; k++) rc |= push(l, SCHED_F, k, 0);
        for (int i = 0; i < m - warm; i++) {
            rc |= push(l, SCHED_F, warm + i, 0);
            rc |= push(l, SCHED_B, i, 0);
        }
        for (int k = m - warm; k < m; k++) rc |= push(l, SCHED_B, k, 0);
        break;
    }
    case SCHED_INTERLEAVED: {
        int total = m * v, warm = (pp - stage - 1) * 2 + (v - 1) * pp, micro, chunk;
        if (warm > total) warm = total;
        for (int k = 0; k < warm; k++) {
            interleaved_op(k, pp, v, false, &micro, &chunk);
            rc |= push(l, SCHED_F, micro, chunk);
        }
        for (int i = 0; i < total - warm; i++) {
            interleaved_op(warm + i, pp, v, false, &micro, &chunk);
            rc |= push(l, SCHED_F, micro, chunk);
            interleaved_op(i, pp, v, true, &micro, &chunk);
            rc |= push(l, SCHED_B, micro, chunk);
        }
        for (int k = total - warm; k < total; k++) {
            interleaved_op(k, pp, v, true, &micro, &chunk);
            rc |= push(l, SCHED_B, micro, chunk);
        }
        break;
    }
    case SCHED_ZB_H1:
        break; /* all stages at once: zb_h1_ops */
    case SCHED_DUALPIPEV:
        return dualpipev_ops(s, stage, l);
    }
    return rc;
}

/* ZB-H1: list scheduling with unit times, input gradients (B) before forwards
 * before weight gradients (W), a W filling a slot where nothing else can run,
 * and at most pp - s micro-batches held per stage (F run, W not yet): the
 * activation memory of 1F1B, counted strictly. */
static int zb_h1_ops(const struct schedule *s, struct list *lists)
{
    int pp = s->pp, m = s->m, rc = -1;
    int *f_done = malloc((size_t)pp * m * sizeof *f_done); /* time F(k) ends on stage, or -1 */
    int *b_done = malloc((size_t)pp * m * sizeof *b_done);
    int *state = calloc((size_t)pp * 5, sizeof *state); /* nf, nb, nw, in_flight, busy_until */
    if (!f_done || !b_done || !state) goto out;
    for (int i = 0; i < pp * m; i++) f_done[i] = b_done[i] = -1;
    long left = 3L * pp * m;
    for (int time = 0; left > 0; time++) {
        if (time > 3 * (pp + m) * 4) goto out; /* cannot happen; guards the loop */
        for (int st = 0; st < pp; st++) {
            int *nf = &state[st * 5], *nb = nf + 1, *nw = nf + 2, *held = nf + 3, *busy = nf + 4;
            if (*busy > time) continue;
            int k;
            if ((k = *nb) < *nf && (st == pp - 1 || (b_done[(st + 1) * m + k] >= 0 &&
                                                     b_done[(st + 1) * m + k] <= time))) {
                if (push(&lists[st], SCHED_B, k, 0)) goto out;
                b_done[st * m + k] = time + 1;
                (*nb)++;
            } else if ((k = *nf) < m && *held < pp - st &&
                       (st == 0 ||
                        (f_done[(st - 1) * m + k] >= 0 && f_done[(st - 1) * m + k] <= time))) {
                if (push(&lists[st], SCHED_F, k, 0)) goto out;
                f_done[st * m + k] = time + 1;
                (*nf)++;
                (*held)++;
            } else if (*nw < *nb) {
                if (push(&lists[st], SCHED_W, *nw, 0)) goto out;
                (*nw)++;
                (*held)--;
            } else {
                continue;
            }
            *busy = time + 1;
            left--;
        }
    }
    rc = 0;
out:
    free(f_done);
    free(b_done);
    free(state);
    return rc;
}

/* Computations plus the transfers around them. */
static int with_transfers(const struct schedule *s, int stage, const struct list *c, struct list *l)
{
    int V = s->pp * s->v, rc = 0;
    for (int i = 0; i < c->n; i++) {
        struct sched_op op = c->ops[i];
        int j = schedule_virtual_stage(s, stage, op.chunk);
        if (op.type == SCHED_F && j > 0) rc |= push(l, SCHED_RECV_ACT, op.micro, op.chunk);
        if (op.type == SCHED_B && j < V - 1) rc |= push(l, SCHED_RECV_GRAD, op.micro, op.chunk);
        rc |= push(l, op.type, op.micro, op.chunk);
        if (op.type == SCHED_F && j < V - 1) rc |= push(l, SCHED_SEND_ACT, op.micro, op.chunk);
        if (op.type == SCHED_B && j > 0) rc |= push(l, SCHED_SEND_GRAD, op.micro, op.chunk);
    }
    return rc;
}

int schedule_make(struct schedule *s, enum sched_kind kind, int pp, int m, int v,
                  struct plait_error *err)
{
    memset(s, 0, sizeof *s);
    if (pp < 1 || m < 1 || v < 1)
        return error_set(err, "pipeline schedule: pp %d, %d micro-batches, %d chunks", pp, m, v);
    if (kind == SCHED_DUALPIPEV && (v != 2 || m < 2 * pp))
        return error_set(err,
                         "the dualpipev schedule runs 2 chunks a stage (got %d) and at least "
                         "2·pp = %d micro-batches per step (got %d)",
                         v, 2 * pp, m);
    if (kind != SCHED_INTERLEAVED && kind != SCHED_DUALPIPEV && v != 1)
        return error_set(err, "parallel.virtual_stages: only the interleaved schedule has them");
    if (kind == SCHED_INTERLEAVED && (v < 2 || m % pp != 0))
        return error_set(err,
                         "the interleaved schedule needs virtual_stages >= 2 (got %d) and "
                         "micro-batches per step a multiple of pp (%d %% %d = %d)",
                         v, m, pp, m % pp);
    if ((long long)m * v * pp > 1 << 24)
        return error_set(err, "pipeline schedule: %d micro-batches × %d chunks × pp %d is too long",
                         m, v, pp);
    s->kind = kind;
    s->pp = pp;
    s->m = m;
    s->v = v;
    s->split_backward = schedule_kind_splits(kind);
    s->n_ops = calloc((size_t)pp, sizeof *s->n_ops);
    s->ops = calloc((size_t)pp, sizeof *s->ops);
    struct list *compute = calloc((size_t)pp, sizeof *compute);
    int rc = !s->n_ops || !s->ops || !compute ? -1 : 0;
    if (rc == 0 && kind == SCHED_ZB_H1) rc = zb_h1_ops(s, compute);
    for (int st = 0; st < pp && rc == 0; st++) {
        struct list full = {0};
        if (kind != SCHED_ZB_H1) rc = compute_ops(s, st, &compute[st]);
        if (rc == 0) rc = with_transfers(s, st, &compute[st], &full);
        s->ops[st] = full.ops;
        s->n_ops[st] = full.n;
    }
    for (int st = 0; compute && st < pp; st++) free(compute[st].ops);
    free(compute);
    if (rc) {
        schedule_free(s);
        return error_set(err, "out of memory for a pipeline schedule");
    }
    return 0;
}

void schedule_free(struct schedule *s)
{
    for (int st = 0; s->ops && st < s->pp; st++) free(s->ops[st]);
    free(s->ops);
    free(s->n_ops);
    memset(s, 0, sizeof *s);
}

void schedule_quiescent(const struct schedule *s, int stage, bool *at)
{
    int v = s->v, b[64] = {0}, w[64] = {0};
    for (int n = 0; n <= s->m; n++) at[n] = n == s->m;
    for (int i = 0; i < s->n_ops[stage] && v <= 64; i++) {
        struct sched_op op = s->ops[stage][i];
        if (op.type == SCHED_B) b[op.chunk]++;
        else if (op.type == SCHED_W) w[op.chunk]++;
        else continue;
        int n = b[0];
        bool still = n > 0;
        for (int c = 0; c < v; c++)
            if (b[c] != n || (s->split_backward && w[c] != n)) still = false;
        if (still) at[n] = true;
    }
}

bool schedule_may_stop(const struct schedule *s, int k)
{
    if (s->kind == SCHED_DUALPIPEV) return false; /* its V is whole micro-batches of 2·pp */
    return k > 0 && k < s->m && k % (s->v > 1 ? s->pp : 1) == 0;
}

/* ---- simulation --------------------------------------------------------------------------- */

static const char *op_name(enum sched_op_type t)
{
    static const char *const names[] = {"F",        "B",         "W",        "send-act",
                                        "recv-act", "send-grad", "recv-grad"};
    return names[t];
}

/* Per (virtual stage, micro) bookkeeping: when each event happened, -1 before. */
struct sim_state {
    int V, m;
    double *sent_act, *sent_grad;          /* keyed by the receiving virtual stage */
    int *f, *b, *w, *recv_act, *recv_grad; /* counts per virtual stage and micro */
};

static int sim_event(const struct schedule *s, struct sim_state *z, int stage, int pos,
                     double *clock, double d[3], int *held, int *peak, struct plait_error *err)
{
    struct sched_op op = s->ops[stage][pos];
    int j = schedule_virtual_stage(s, stage, op.chunk), k = op.micro, V = z->V, m = z->m;
    if (op.micro < 0 || op.micro >= m || op.chunk < 0 || op.chunk >= s->v)
        return error_set(err, "stage %d op %d: %s of micro-batch %d chunk %d is out of range",
                         stage, pos, op_name(op.type), op.micro, op.chunk);
    int at = j * m + k;
    switch (op.type) {
    case SCHED_RECV_ACT:
        if (j == 0) return error_set(err, "stage %d op %d: the first stage receives", stage, pos);
        if (z->sent_act[at] < 0) return 1; /* not yet */
        if (*clock < z->sent_act[at]) *clock = z->sent_act[at];
        z->recv_act[at]++;
        return 0;
    case SCHED_RECV_GRAD:
        if (j == V - 1)
            return error_set(err, "stage %d op %d: the last stage receives", stage, pos);
        if (z->sent_grad[at] < 0) return 1;
        if (*clock < z->sent_grad[at]) *clock = z->sent_grad[at];
        z->recv_grad[at]++;
        return 0;
    case SCHED_SEND_ACT:
        if (j == V - 1 || z->f[at] != 1)
            return error_set(err, "stage %d op %d: send-act of micro-batch %d before its F", stage,
                             pos, k);
        z->sent_act[at + m] = *clock;
        return 0;
    case SCHED_SEND_GRAD:
        if (j == 0 || z->b[at] != 1)
            return error_set(err, "stage %d op %d: send-grad of micro-batch %d before its B", stage,
                             pos, k);
        z->sent_grad[at - m] = *clock;
        return 0;
    case SCHED_F:
        if (j > 0 && z->recv_act[at] != 1)
            return error_set(err, "stage %d op %d: F of micro-batch %d without its activations",
                             stage, pos, k);
        *clock += d[0];
        z->f[at]++;
        if (++*held > *peak) *peak = *held;
        return 0;
    case SCHED_B:
        if (z->f[at] != 1 || (j < V - 1 && z->recv_grad[at] != 1))
            return error_set(err, "stage %d op %d: B of micro-batch %d before its F or gradient",
                             stage, pos, k);
        *clock += s->split_backward ? d[1] : d[1] + d[2];
        z->b[at]++;
        if (!s->split_backward) --*held;
        return 0;
    case SCHED_W:
        if (!s->split_backward || z->b[at] != 1)
            return error_set(err, "stage %d op %d: W of micro-batch %d before its B", stage, pos,
                             k);
        *clock += d[2];
        z->w[at]++;
        --*held;
        return 0;
    }
    return error_set(err, "stage %d op %d: unknown operation", stage, pos);
}

/* Runs the lists; start[stage][pos] (if given) gets each op's start time. */
static int simulate(const struct schedule *s, double t_f, double t_b, double t_w,
                    struct sched_sim *out, double **start, struct plait_error *err)
{
    int pp = s->pp, m = s->m, V = pp * s->v;
    size_t n = (size_t)V * m;
    struct sim_state z = {.V = V, .m = m};
    double *clock = calloc((size_t)pp, sizeof *clock);
    int *pos = calloc((size_t)pp, sizeof *pos), *held = calloc((size_t)pp, sizeof *held);
    int *peak = calloc((size_t)pp, sizeof *peak);
    z.sent_act = malloc(n * sizeof(double));
    z.sent_grad = malloc(n * sizeof(double));
    int *counts = calloc(5 * n, sizeof(int));
    int rc = -1;
    if (!clock || !pos || !held || !peak || !z.sent_act || !z.sent_grad || !counts) {
        error_set(err, "out of memory simulating a pipeline schedule");
        goto out;
    }
    z.f = counts, z.b = counts + n, z.w = counts + 2 * n, z.recv_act = counts + 3 * n;
    z.recv_grad = counts + 4 * n;
    for (size_t i = 0; i < n; i++) z.sent_act[i] = z.sent_grad[i] = -1;
    double d[3] = {t_f, t_b, t_w}, busy = 0;
    for (bool moved = true; moved;) {
        moved = false;
        for (int st = 0; st < pp; st++)
            while (pos[st] < s->n_ops[st]) {
                double before = clock[st];
                int r = sim_event(s, &z, st, pos[st], &clock[st], d, &held[st], &peak[st], err);
                if (r < 0) goto out;
                if (r > 0) break;
                enum sched_op_type t = s->ops[st][pos[st]].type;
                if (t == SCHED_F || t == SCHED_B || t == SCHED_W) {
                    double dt = t == SCHED_F        ? t_f
                                : t == SCHED_W      ? t_w
                                : s->split_backward ? t_b
                                                    : t_b + t_w;
                    if (start) start[st][pos[st]] = clock[st] - dt;
                    busy += dt;
                    (void)before;
                }
                pos[st]++;
                moved = true;
            }
    }
    for (int st = 0; st < pp; st++)
        if (pos[st] < s->n_ops[st]) {
            struct sched_op op = s->ops[st][pos[st]];
            error_set(err, "stage %d waits forever at op %d: %s of micro-batch %d chunk %d", st,
                      pos[st], op_name(op.type), op.micro, op.chunk);
            goto out;
        }
    for (int j = 0; j < V; j++)
        for (int k = 0; k < m; k++) {
            int at = j * m + k;
            if (z.f[at] != 1 || z.b[at] != 1 || z.w[at] != (s->split_backward ? 1 : 0)) {
                error_set(err,
                          "virtual stage %d runs micro-batch %d's F %d times, B %d times, W %d "
                          "times",
                          j, k, z.f[at], z.b[at], z.w[at]);
                goto out;
            }
        }
    memset(out, 0, sizeof *out);
    for (int st = 0; st < pp; st++) {
        if (clock[st] > out->makespan) out->makespan = clock[st];
        if (st < 64) out->peak_in_flight[st] = peak[st];
    }
    out->busy_per_stage = busy / pp;
    out->bubble = out->makespan > 0 ? 1.0 - busy / (pp * out->makespan) : 0;
    rc = 0;
out:
    free(clock);
    free(pos);
    free(held);
    free(peak);
    free(z.sent_act);
    free(z.sent_grad);
    free(counts);
    return rc;
}

int schedule_simulate(const struct schedule *s, double t_f, double t_b, double t_w,
                      struct sched_sim *out, struct plait_error *err)
{
    return simulate(s, t_f, t_b, t_w, out, NULL, err);
}

void schedule_bubbles(int pp, int m, int v, double bubble[SCHED_KINDS])
{
    for (int k = 0; k < SCHED_KINDS; k++) {
        int chunks = k == SCHED_INTERLEAVED ? (v < 2 ? 2 : v) : k == SCHED_DUALPIPEV ? 2 : 1;
        struct schedule s;
        struct sched_sim sim;
        struct plait_error err;
        bubble[k] = -1;
        if (schedule_make(&s, (enum sched_kind)k, pp, m, chunks, &err)) continue;
        if (schedule_simulate_textbook(&s, &sim, &err) == 0) bubble[k] = sim.bubble;
        schedule_free(&s);
    }
}

/* ---- the timeline ------------------------------------------------------------------------- */

void schedule_print(const struct schedule *s, FILE *out, int max_columns)
{
    struct sched_sim sim;
    struct plait_error err;
    double **start = calloc((size_t)s->pp, sizeof *start);
    bool ok = start != NULL;
    for (int st = 0; ok && st < s->pp; st++)
        ok = (start[st] = calloc((size_t)s->n_ops[st] + 1, sizeof **start)) != NULL;
    /* unit times; a combined backward takes two units */
    if (ok && simulate(s, 1, 1, 1, &sim, start, &err) != 0) {
        fprintf(out, "  (schedule does not run: %s)\n", err.text);
        ok = false;
    }
    int cols = ok ? (int)(sim.makespan + 0.5) : 0;
    char *row = ok ? malloc((size_t)cols + 1) : NULL;
    for (int st = 0; row && st < s->pp; st++) {
        memset(row, '.', (size_t)cols);
        row[cols] = '\0';
        for (int i = 0; i < s->n_ops[st]; i++) {
            struct sched_op op = s->ops[st][i];
            if (op.type > SCHED_W) continue;
            int t0 = (int)(start[st][i] + 0.5);
            int len = op.type == SCHED_B && !s->split_backward ? 2 : 1;
            char c = op.type == SCHED_F   ? (char)('0' + op.micro % 10)
                     : op.type == SCHED_B ? (char)('a' + op.micro % 10)
                                          : 'w';
            for (int t = t0; t < t0 + len && t < cols; t++) row[t] = c;
        }
        fprintf(out, "  stage %-2d %.*s%s\n", st, max_columns, row, cols > max_columns ? "…" : "");
    }
    free(row);
    for (int st = 0; start && st < s->pp; st++) free(start[st]);
    free(start);
}
