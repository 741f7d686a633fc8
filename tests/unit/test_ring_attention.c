/* test_ring_attention.c — attention one key/value block at a time
 * (kernels/ops.h: attention_block_forward and _backward), as context
 * parallelism's ring runs it: each sequence cut into 2·cp chunks, rank i
 * holding chunks i and 2·cp−1−i (the causal load balance), every rank's
 * queries meeting every rank's keys and values in ring order. Merged over the
 * ring, the output and the gradients of q, k and v must be the causal
 * attention of the whole sequence's (cpu_attention_forward and _backward),
 * in double to rounding, the float kernels to float rounding. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kernels/cpu/ops_cpu.h"
#include "kernels/ops.h"
#include "tests/unit/cpu_ctx.h"
#include "tests/unit/fd_check.h"

static struct ops_ctx *cx;

enum { B = 2, T = 24, C = 12, NH = 3, MAXCP = 4 };

struct ring {
    int cp, Tl;                  /* ranks, rows a rank holds of each sequence */
    int32_t pos[MAXCP][T];       /* rank i's rows' positions */
    double *qkv[MAXCP], *kv[MAXCP], *dout[MAXCP], *out[MAXCP], *lse[MAXCP];
    double *dq[MAXCP], *dkv[MAXCP];
};

/* rank i's rows: chunks i and 2·cp−1−i of Tc rows each */
static void ring_split(struct ring *r, const double *qkv, const double *dout)
{
    int Tc = T / (2 * r->cp);
    r->Tl = 2 * Tc;
    for (int i = 0; i < r->cp; i++) {
        for (int j = 0; j < Tc; j++) {
            r->pos[i][j] = i * Tc + j;
            r->pos[i][Tc + j] = (2 * r->cp - 1 - i) * Tc + j;
        }
        size_t rows = (size_t)B * r->Tl;
        r->qkv[i] = zeros(rows * 3 * C), r->kv[i] = zeros(rows * 2 * C);
        r->dout[i] = zeros(rows * C), r->out[i] = zeros(rows * C);
        r->lse[i] = zeros((size_t)B * NH * r->Tl);
        r->dq[i] = zeros(rows * 3 * C), r->dkv[i] = zeros(rows * 2 * C);
        for (int b = 0; b < B; b++)
            for (int t = 0; t < r->Tl; t++) {
                size_t src = (size_t)b * T + r->pos[i][t], dst = (size_t)b * r->Tl + t;
                memcpy(r->qkv[i] + dst * 3 * C, qkv + src * 3 * C, sizeof(double) * 3 * C);
                memcpy(r->kv[i] + dst * 2 * C, qkv + src * 3 * C + C, sizeof(double) * 2 * C);
                memcpy(r->dout[i] + dst * C, dout + src * C, sizeof(double) * C);
            }
    }
}

static void ring_free(struct ring *r)
{
    for (int i = 0; i < r->cp; i++) {
        free(r->qkv[i]), free(r->kv[i]), free(r->dout[i]), free(r->out[i]), free(r->lse[i]);
        free(r->dq[i]), free(r->dkv[i]);
    }
}

/* Rank i's block from rank src at ring step s: forward merges, backward adds
 * into i's dq and src's dkv (the accumulator that travels with src's block). */
static void ring_run(struct ring *r, double *scratch)
{
    for (int i = 0; i < r->cp; i++)
        for (int s = 0; s < r->cp; s++) {
            int src = ((i - s) % r->cp + r->cp) % r->cp;
            cpu_attention_block_forward_f64(cx, r->out[i], r->lse[i], scratch, r->qkv[i], 3 * C,
                                            r->kv[src], r->pos[i], r->pos[src], B, r->Tl, r->Tl,
                                            C, NH, s == 0);
        }
    for (int i = 0; i < r->cp; i++)
        for (int s = 0; s < r->cp; s++) {
            int src = ((i - s) % r->cp + r->cp) % r->cp;
            cpu_attention_block_backward_f64(cx, r->dq[i], r->dkv[src], scratch, r->dout[i],
                                             r->qkv[i], 3 * C, r->kv[src], r->out[i], r->lse[i],
                                             r->pos[i], r->pos[src], B, r->Tl, r->Tl, C, NH);
        }
}

/* The worst relative difference of rank rows against the whole sequence's,
 * over `width` columns from column lcol of the rank's and col of the whole's
 * (lld and ld: the two row strides). */
static double ring_diff(const struct ring *r, double *const *local, int lld, int lcol,
                        const double *whole, int ld, int col, int width)
{
    double worst = 0, scale = 1e-300;
    for (size_t i = 0; i < (size_t)B * T * ld; i++) scale = fmax(scale, fabs(whole[i]));
    for (int i = 0; i < r->cp; i++)
        for (int b = 0; b < B; b++)
            for (int t = 0; t < r->Tl; t++)
                for (int c = 0; c < width; c++) {
                    double got = local[i][((size_t)b * r->Tl + t) * lld + lcol + c];
                    double want = whole[((size_t)b * T + r->pos[i][t]) * ld + col + c];
                    worst = fmax(worst, fabs(got - want) / scale);
                }
    return worst;
}

static void test_ring_matches_whole_sequence_attention(void)
{
    double *qkv = rnd((size_t)B * T * 3 * C, 1), *dout = rnd((size_t)B * T * C, 1);
    double *out = zeros((size_t)B * T * C), *att = zeros((size_t)B * NH * T * T);
    double *dqkv = zeros((size_t)B * T * 3 * C), *datt = zeros((size_t)B * NH * T * T);
    double *scratch = zeros(ATTENTION_BLOCK_SCRATCH(B, NH, T, T, C / NH)); /* (the largest block) */
    cpu_attention_forward_f64(cx, out, att, qkv, B, T, C, NH);
    cpu_attention_backward_f64(cx, dqkv, datt, dout, qkv, att, B, T, C, NH);
    for (int cp = 1; cp <= MAXCP; cp *= 2) {
        struct ring r = {.cp = cp};
        ring_split(&r, qkv, dout);
        ring_run(&r, scratch);
        double e_out = ring_diff(&r, r.out, C, 0, out, C, 0, C);
        double e_dq = ring_diff(&r, r.dq, 3 * C, 0, dqkv, 3 * C, 0, C);
        double e_dk = ring_diff(&r, r.dkv, 2 * C, 0, dqkv, 3 * C, C, C);
        double e_dv = ring_diff(&r, r.dkv, 2 * C, C, dqkv, 3 * C, 2 * C, C);
        CHECK(e_out < 1e-13 && e_dq < 1e-13 && e_dk < 1e-13 && e_dv < 1e-13,
              "cp %d: out %.3g, dq %.3g, dk %.3g, dv %.3g from the whole sequence's", cp, e_out,
              e_dq, e_dk, e_dv);
        ring_free(&r);
    }
    free(qkv), free(dout), free(out), free(att), free(dqkv), free(datt), free(scratch);
}

/* A query that sees no key of a block: the first block leaves it at 0 and
 * -inf, a later one leaves the running output alone. */
static void test_a_block_a_query_cannot_see_changes_nothing(void)
{
    enum { Tq = 2, Tk = 2, c = 2, nh = 1 };
    double q[Tq * c] = {1, 2, 3, 4}, kv[Tk * 2 * c] = {1, 0, 5, 6, 0, 1, 7, 8};
    int32_t qpos[Tq] = {0, 1}, late[Tk] = {5, 6}, early[Tk] = {0, 1};
    double out[Tq * c] = {9, 9, 9, 9}, lse[Tq] = {3, 3},
           scratch[ATTENTION_BLOCK_SCRATCH(1, nh, Tq, Tk, c / nh)];
    cpu_attention_block_forward_f64(cx, out, lse, scratch, q, c, kv, qpos, late, 1, Tq, Tk, c, nh,
                                    true);
    CHECK(out[0] == 0 && out[3] == 0 && lse[0] == -INFINITY && lse[1] == -INFINITY,
          "first, unseen: out %g, lse %g", out[0], lse[0]);
    cpu_attention_block_forward_f64(cx, out, lse, scratch, q, c, kv, qpos, early, 1, Tq, Tk, c, nh,
                                    false);
    CHECK(out[0] == 5 && out[1] == 6, "query 0 sees key 0 alone: %g %g", out[0], out[1]);
    double before[Tq * c], lse0 = lse[0];
    memcpy(before, out, sizeof out);
    cpu_attention_block_forward_f64(cx, out, lse, scratch, q, c, kv, qpos, late, 1, Tq, Tk, c, nh,
                                    false);
    CHECK(!memcmp(before, out, sizeof out) && lse[0] == lse0, "a later unseen block changed out");
}

/* The float kernels against the double ones, cp 2 */
static void test_float_ring_tracks_double(void)
{
    enum { cp = 2, Tc = T / (2 * cp), Tl = 2 * Tc };
    double *q = rnd((size_t)B * Tl * 3 * C, 1), *kv = rnd((size_t)B * Tl * 2 * C, 1);
    double *out = zeros((size_t)B * Tl * C), *lse = zeros((size_t)B * NH * Tl);
    double *scratch = zeros(ATTENTION_BLOCK_SCRATCH(B, NH, Tl, Tl, C / NH));
    int32_t qpos[Tl], kpos[Tl];
    for (int j = 0; j < Tc; j++) { /* rank 1's rows, rank 0's keys */
        qpos[j] = Tc + j, qpos[Tc + j] = 2 * Tc + j;
        kpos[j] = j, kpos[Tc + j] = 3 * Tc + j;
    }
    cpu_attention_block_forward_f64(cx, out, lse, scratch, q, 3 * C, kv, qpos, kpos, B, Tl, Tl, C,
                                    NH, true);
    float *fq = to_f32(q, (size_t)B * Tl * 3 * C), *fkv = to_f32(kv, (size_t)B * Tl * 2 * C);
    float *fo = malloc(sizeof *fo * B * Tl * C), *fl = malloc(sizeof *fl * B * NH * Tl);
    float *fs = malloc(sizeof *fs * ATTENTION_BLOCK_SCRATCH(B, NH, Tl, Tl, C / NH));
    cpu_attention_block_forward_f32(cx, fo, fl, fs, fq, 3 * C, fkv, qpos, kpos, B, Tl, Tl, C, NH,
                                    true);
    check_close("block forward", fo, out, (size_t)B * Tl * C, F32_TOL);
    check_close("block lse", fl, lse, (size_t)B * NH * Tl, F32_TOL);
    free(q), free(kv), free(out), free(lse), free(scratch), free(fq), free(fkv), free(fo), free(fl);
    free(fs);
}

int main(void)
{
    cx = test_cpu_open();
    RUN(test_ring_matches_whole_sequence_attention);
    RUN(test_a_block_a_query_cannot_see_changes_nothing);
    RUN(test_float_ring_tracks_double);
    ops_cpu()->close(cx);
    return check_exit_code();
}
