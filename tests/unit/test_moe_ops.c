/* test_moe_ops.c — a mixture-of-experts block's routing ops (kernels/ops.h:
 * moe_*) on the CPU backend: the router's choices and gates as the
 * definition says (softmax, the k largest with ties to the lower expert,
 * renormalised), capacity dropping in token order, the balance and z losses'
 * values, and the whole block — router product, route, dispatch, gather, one
 * linear map per expert, combine, plus both losses — against central finite
 * differences in double, its float twin against the double one. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kernels/cpu/ops_cpu.h"
#include "kernels/ops.h"
#include "tests/unit/cpu_ctx.h"
#include "tests/unit/fd_check.h"

static struct ops_ctx *cx;

/* ---- the definition, by hand ----------------------------------------------- */

static void test_route_takes_the_largest_ties_to_the_lower_expert(void)
{
    /* token 0: experts 1 and 3 tie for first, 2 next; token 1: all equal */
    double logits[2 * 4] = {0.5, 2.0, 1.0, 2.0, 0, 0, 0, 0}, probs[8], gate[4], lse[2];
    int32_t choice[4];
    cpu_moe_route_f64(cx, probs, choice, gate, lse, logits, 2, 4, 2);
    CHECK(choice[0] == 1 && choice[1] == 3, "token 0 chose %d, %d (want 1, 3)", choice[0],
          choice[1]);
    CHECK(choice[2] == 0 && choice[3] == 1, "token 1 chose %d, %d (want 0, 1)", choice[2],
          choice[3]);
    CHECK(gate[0] == 0.5 && gate[1] == 0.5 && gate[2] == 0.5, "tied gates: %g %g %g", gate[0],
          gate[1], gate[2]);
    double sum = exp(0.5) + 2 * exp(2.0) + exp(1.0);
    CHECK(fabs(probs[1] - exp(2.0) / sum) < 1e-15 && fabs(lse[0] - log(sum)) < 1e-14,
          "softmax %g, logsumexp %g", probs[1], lse[0]);
    /* k = 1: the gate is 1 whatever the probability */
    cpu_moe_route_f64(cx, probs, choice, gate, lse, logits, 1, 4, 1);
    CHECK(choice[0] == 1 && gate[0] == 1.0, "top-1: expert %d, gate %g", choice[0], gate[0]);
}

static void test_capacity_drops_in_token_order(void)
{
    /* 5 tokens, k 2 over 3 experts: expert 0 is every token's first choice */
    int32_t choice[10] = {0, 1, 0, 2, 0, 1, 0, 2, 0, 1}, pos[10], rows[10], counts[3], routed[3];
    int M = cpu_moe_dispatch(cx, pos, rows, counts, routed, choice, NULL, 1, 5, 3, 2, 2);
    CHECK(M == 6, "6 rows kept (2 + 2 + 2), got %d", M);
    CHECK(routed[0] == 5 && routed[1] == 3 && routed[2] == 2, "routed %d %d %d", routed[0],
          routed[1], routed[2]);
    CHECK(counts[0] == 2 && counts[1] == 2 && counts[2] == 2, "counts %d %d %d", counts[0],
          counts[1], counts[2]);
    /* expert 0 keeps tokens 0 and 1 (rows 0, 1); expert 1 tokens 0 and 2 (rows 2, 3);
     * expert 2 tokens 1 and 3 (rows 4, 5); the rest are dropped */
    static const int32_t want[10] = {0, 2, 1, 4, -1, 3, -1, 5, -1, -1};
    CHECK(!memcmp(pos, want, sizeof want), "pos %d %d %d %d %d %d %d %d %d %d", pos[0], pos[1],
          pos[2], pos[3], pos[4], pos[5], pos[6], pos[7], pos[8], pos[9]);
    static const int32_t want_rows[6] = {0, 1, 0, 2, 1, 3};
    CHECK(!memcmp(rows, want_rows, sizeof want_rows), "rows %d %d %d %d %d %d", rows[0], rows[1],
          rows[2], rows[3], rows[4], rows[5]);
    /* without a capacity nothing is dropped */
    M = cpu_moe_dispatch(cx, pos, rows, counts, routed, choice, NULL, 1, 5, 3, 2, 0);
    CHECK(M == 10 && counts[0] == 5 && pos[8] == 4, "no capacity: M %d, counts[0] %d", M,
          counts[0]);
}

/* Context parallelism's cut: B sequences of 2·cp chunks of h tokens, cp rank r holding
 * chunks r and 2·cp−1−r of each, its 2B runs each starting from the choices before it in
 * the micro-batch: every rank keeps and drops the choices the whole micro-batch's dispatch
 * keeps and drops, each expert's rows over the ranks those of the whole. */
static void test_runs_keep_what_the_whole_micro_batch_keeps(void)
{
    enum { B = 2, CP = 2, H = 3, E = 3, K = 2, CAP = 5, N = B * 2 * CP * H, NR = N / CP };
    int32_t choice[N * K], pos[N * K], rows[N * K], counts[E], routed[E];
    for (int t = 0; t < N; t++) { /* two different experts a token, expert 0 the busiest */
        choice[t * K] = t % 3 == 2 ? 2 : 0;
        choice[t * K + 1] = choice[t * K] == 0 ? 1 + t % 2 : t % 2;
    }
    int M = cpu_moe_dispatch(cx, pos, rows, counts, routed, choice, NULL, 1, N, E, K, CAP);
    int32_t whole_counts[E];
    memcpy(whole_counts, counts, sizeof counts);
    CHECK(M < N * K, "the case drops nothing (M %d of %d choices): it tests no capacity", M, N * K);
    int kept_over_ranks = 0, rank_counts[E] = {0};
    for (int r = 0; r < CP; r++) {
        int32_t mine[NR * K], mpos[NR * K], mrows[NR * K], before[2 * B * E];
        int32_t first[2 * B]; /* each run's first token in the micro-batch */
        for (int b = 0; b < B; b++)
            for (int half = 0; half < 2; half++)
                first[2 * b + half] = (b * 2 * CP + (half ? 2 * CP - 1 - r : r)) * H;
        for (int j = 0; j < 2 * B; j++) {
            memcpy(mine + j * H * K, choice + first[j] * K, sizeof(int32_t) * H * K);
            for (int e = 0; e < E; e++) before[j * E + e] = 0;
            for (int i = 0; i < first[j] * K; i++) before[j * E + choice[i]]++;
        }
        int Mr =
            cpu_moe_dispatch(cx, mpos, mrows, counts, routed, mine, before, 2 * B, NR, E, K, CAP);
        kept_over_ranks += Mr;
        for (int e = 0; e < E; e++) rank_counts[e] += counts[e];
        for (int t = 0; t < NR; t++)
            for (int j = 0; j < K; j++) {
                int whole_t = first[t / H] + t % H;
                int32_t p = mpos[t * K + j];
                CHECK((p >= 0) == (pos[whole_t * K + j] >= 0),
                      "rank %d's token %d (the micro-batch's %d), choice %d: %s here, %s whole", r,
                      t, whole_t, j, p >= 0 ? "kept" : "dropped",
                      pos[whole_t * K + j] >= 0 ? "kept" : "dropped");
                CHECK(p < 0 || mrows[p] == t, "rank %d: row %d holds token %d, not %d", r, p,
                      p >= 0 ? mrows[p] : -1, t);
            }
    }
    CHECK(kept_over_ranks == M, "the ranks keep %d choices, the whole micro-batch %d",
          kept_over_ranks, M);
    for (int e = 0; e < E; e++)
        CHECK(rank_counts[e] == whole_counts[e], "expert %d: %d rows over the ranks, %d whole", e,
              rank_counts[e], whole_counts[e]);
}

static void test_losses_match_their_definitions(void)
{
    /* balanced routing: aux = aux_coef · E · Σ (1/E)(1/E) = aux_coef */
    double probs[4 * 2] = {0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5}, lse[4] = {1, 2, 3, 4}, out[2];
    int32_t routed[2] = {2, 2};
    cpu_moe_losses_f64(cx, out, probs, lse, routed, 4, 2, 1, 0.01, 0.001);
    CHECK(fabs(out[0] - 0.01) < 1e-17 && fabs(out[1] - 0.001 * 30 / 4) < 1e-17,
          "balanced: aux %.17g (want 0.01), z %.17g (want 0.0075)", out[0], out[1]);
    /* all to expert 0 with p_0 = 0.9: aux = 0.01 · 2 · (1 · 0.9) */
    double skew[4 * 2] = {0.9, 0.1, 0.9, 0.1, 0.9, 0.1, 0.9, 0.1};
    int32_t all0[2] = {4, 0};
    cpu_moe_losses_f64(cx, out, skew, lse, all0, 4, 2, 1, 0.01, 0);
    CHECK(fabs(out[0] - 0.018) < 1e-17 && out[1] == 0, "skewed: aux %.17g (want 0.018)", out[0]);
}

/* ---- the whole block against finite differences ------------------------- */

struct block {
    int N, C, E, k, capacity;
    double aux, z;
    double *x, *wr, *we;              /* inputs (N,C), router (C,E), experts (E,C,C) */
    double *logits, *probs, *gate, *lse, *packed, *y, *out, *R;
    int32_t *choice, *pos, *rows, *counts, *routed;
    int M;
};

/* y[m] = W_e · packed[m] for the expert e whose rows hold m */
static void experts(struct block *b, const double *in, double *out, bool transposed)
{
    int m = 0;
    for (int e = 0; e < b->E; e++)
        for (int r = 0; r < b->counts[e]; r++, m++)
            for (int i = 0; i < b->C; i++) {
                double s = 0;
                for (int j = 0; j < b->C; j++)
                    s += (transposed ? b->we[((size_t)e * b->C + j) * b->C + i]
                                     : b->we[((size_t)e * b->C + i) * b->C + j]) *
                         in[(size_t)m * b->C + j];
                out[(size_t)m * b->C + i] = s;
            }
}

/* L = Σ out·R + balance loss + z-loss */
static double block_loss(void *p)
{
    struct block *b = p;
    int N = b->N, C = b->C, E = b->E, k = b->k;
    for (int t = 0; t < N; t++)
        for (int e = 0; e < E; e++) {
            double s = 0;
            for (int i = 0; i < C; i++) s += b->x[(size_t)t * C + i] * b->wr[(size_t)i * E + e];
            b->logits[(size_t)t * E + e] = s;
        }
    cpu_moe_route_f64(cx, b->probs, b->choice, b->gate, b->lse, b->logits, N, E, k);
    b->M = cpu_moe_dispatch(cx, b->pos, b->rows, b->counts, b->routed, b->choice, NULL, 1, N, E, k,
                            b->capacity);
    cpu_moe_gather_f64(cx, b->packed, b->x, b->rows, b->M, C);
    experts(b, b->packed, b->y, false);
    cpu_moe_combine_f64(cx, b->out, b->y, b->gate, b->pos, N, k, C, false);
    double losses[2];
    cpu_moe_losses_f64(cx, losses, b->probs, b->lse, b->routed, N, E, k, b->aux, b->z);
    return dot(b->out, b->R, (size_t)N * C) + losses[0] + losses[1];
}

/* The analytic gradients of block_loss: dx, dwr (C,E), dwe (E,C,C). */
static void block_grads(struct block *b, double *dx, double *dwr, double *dwe)
{
    int N = b->N, C = b->C, E = b->E, k = b->k, M = b->M;
    double *dy = zeros((size_t)N * k * C), *dpacked = zeros((size_t)N * k * C),
           *dgate = zeros((size_t)N * k), *dlogits = zeros((size_t)N * E);
    cpu_moe_combine_backward_f64(cx, dy, dgate, b->R, b->y, b->gate, b->pos, N, k, C);
    experts(b, dy, dpacked, true); /* W_eᵀ · dy */
    int m = 0;                     /* dW_e = Σ_rows dy · packedᵀ */
    memset(dwe, 0, sizeof *dwe * (size_t)E * C * C);
    for (int e = 0; e < E; e++)
        for (int r = 0; r < b->counts[e]; r++, m++)
            for (int i = 0; i < C; i++)
                for (int j = 0; j < C; j++)
                    dwe[((size_t)e * C + i) * C + j] +=
                        dy[(size_t)m * C + i] * b->packed[(size_t)m * C + j];
    (void)M;
    cpu_moe_gather_backward_f64(cx, dx, dpacked, b->pos, N, k, C, false);
    cpu_moe_route_backward_f64(cx, dlogits, dgate, b->probs, b->choice, b->gate, b->lse, b->routed,
                               N, E, k, b->aux, b->z);
    memset(dwr, 0, sizeof *dwr * (size_t)C * E);
    for (int t = 0; t < N; t++) /* logits = x·wr */
        for (int i = 0; i < C; i++)
            for (int e = 0; e < E; e++) {
                double d = dlogits[(size_t)t * E + e];
                dx[(size_t)t * C + i] += d * b->wr[(size_t)i * E + e];
                dwr[(size_t)i * E + e] += b->x[(size_t)t * C + i] * d;
            }
    free(dy), free(dpacked), free(dgate), free(dlogits);
}

static void block_case(int N, int C, int E, int k, int capacity, double aux, double z)
{
    struct block b = {.N = N, .C = C, .E = E, .k = k, .capacity = capacity, .aux = aux, .z = z};
    size_t NC = (size_t)N * C, Nk = (size_t)N * k;
    b.x = rnd(NC, 1), b.wr = rnd((size_t)C * E, 1), b.we = rnd((size_t)E * C * C, 0.5);
    b.logits = zeros((size_t)N * E), b.probs = zeros((size_t)N * E), b.lse = zeros(N);
    b.gate = zeros(Nk), b.packed = zeros(Nk * C), b.y = zeros(Nk * C), b.out = zeros(NC);
    b.R = rnd(NC, 1);
    b.choice = calloc(Nk, 4), b.pos = calloc(Nk, 4), b.rows = calloc(Nk, 4);
    b.counts = calloc((size_t)E, 4), b.routed = calloc((size_t)E, 4);
    block_loss(&b);
    int dropped = 0;
    for (size_t i = 0; i < Nk; i++) dropped += b.pos[i] < 0;
    CHECK(capacity == 0 ? dropped == 0 : dropped > 0,
          "N %d E %d k %d capacity %d: %d choices dropped", N, E, k, capacity, dropped);
    double *dx = zeros(NC), *dwr = zeros((size_t)C * E), *dwe = zeros((size_t)E * C * C);
    block_grads(&b, dx, dwr, dwe);
    char what[96];
    snprintf(what, sizeof what, "moe E %d k %d capacity %d: dx", E, k, capacity);
    check_fd(what, block_loss, &b, b.x, dx, NC, FD_TOL);
    snprintf(what, sizeof what, "moe E %d k %d capacity %d: router", E, k, capacity);
    check_fd(what, block_loss, &b, b.wr, dwr, (size_t)C * E, FD_TOL);
    snprintf(what, sizeof what, "moe E %d k %d capacity %d: experts", E, k, capacity);
    check_fd(what, block_loss, &b, b.we, dwe, (size_t)E * C * C, FD_TOL);
    /* the float ops against the double ones on the same routing */
    float *fl = to_f32(b.logits, (size_t)N * E), *fp = malloc(sizeof *fp * N * E),
          *fg = malloc(sizeof *fg * Nk), *flse = malloc(sizeof *flse * N),
          *fy = to_f32(b.y, Nk * C), *fo = malloc(sizeof *fo * NC);
    int32_t *fc = calloc(Nk, 4);
    cpu_moe_route_f32(cx, fp, fc, fg, flse, fl, N, E, k);
    CHECK(!memcmp(fc, b.choice, Nk * 4), "float routing chose as double did");
    check_close("moe probs", fp, b.probs, (size_t)N * E, F32_TOL);
    check_close("moe gates", fg, b.gate, Nk, F32_TOL);
    cpu_moe_combine_f32(cx, fo, fy, fg, b.pos, N, k, C, false);
    check_close("moe combine", fo, b.out, NC, F32_TOL);
    free(fl), free(fp), free(fg), free(flse), free(fy), free(fo), free(fc);
    free(b.x), free(b.wr), free(b.we), free(b.logits), free(b.probs), free(b.lse), free(b.gate);
    free(b.packed), free(b.y), free(b.out), free(b.R), free(b.choice), free(b.pos), free(b.rows);
    free(b.counts), free(b.routed), free(dx), free(dwr), free(dwe);
}

/* top-1 and top-2 of 4 and 8 experts, without and with a capacity that
 * drops, with the balance and z losses (their gradients reach the router) */
static void test_block_backward_matches_finite_differences(void)
{
    block_case(9, 5, 4, 1, 0, 0.01, 0.001);
    block_case(9, 5, 4, 2, 0, 0.01, 0.001);
    block_case(12, 4, 8, 2, 0, 0.05, 0.01);
    block_case(12, 4, 4, 2, 4, 0.01, 0.001);
    block_case(16, 3, 8, 1, 1, 0.02, 0);
}

int main(void)
{
    cx = test_cpu_open();
    RUN(test_route_takes_the_largest_ties_to_the_lower_expert);
    RUN(test_capacity_drops_in_token_order);
    RUN(test_runs_keep_what_the_whole_micro_batch_keeps);
    RUN(test_losses_match_their_definitions);
    RUN(test_block_backward_matches_finite_differences);
    ops_cpu()->close(cx);
    return check_exit_code();
}
