/* test_schedule.c — the pipeline schedule generators: every list is a valid
 * order (the simulator runs it to the end: no receive before its send, F
 * before B before W, each exactly once), holds no more micro-batches than it
 * promises, and its simulated bubble is the known one: (p-1)/(m+p-1) for GPipe
 * and 1F1B, (p-1)/(v·m+p-1) interleaved, lower again for ZB-H1, and lower
 * again for DualPipeV, which holds 2p+1 half-stage chunks. Broken lists
 * are caught with the operation named. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "common/place/schedule.h"

static const int shapes[][3] = {{1, 1, 1}, {1, 5, 1}, {2, 1, 1},  {2, 4, 1}, {3, 7, 1},
                                {4, 4, 1}, {4, 8, 1}, {4, 16, 1}, {8, 8, 1}, {8, 32, 1}};

static void check_valid_and_bubble(enum sched_kind kind, int pp, int m, int v, double want_bubble)
{
    struct schedule s;
    struct plait_error err;
    if (schedule_make(&s, kind, pp, m, v, &err) != 0) {
        CHECK(0, "%s pp %d m %d v %d: %s", schedule_kind_name(kind), pp, m, v, err.text);
        return;
    }
    struct sched_sim sim;
    /* the per-chunk times: a chunk is 1/v of a stage's layers; backward twice forward */
    double f = 1.0 / v, b = kind == SCHED_ZB_H1 ? 1.0 / v : 1.0 / v, w = 1.0 / v;
    if (schedule_simulate(&s, f, b, w, &sim, &err) != 0) {
        CHECK(0, "%s pp %d m %d v %d: %s", schedule_kind_name(kind), pp, m, v, err.text);
    } else {
        if (want_bubble >= 0)
            CHECK(fabs(sim.bubble - want_bubble) < 1e-9,
                  "%s pp %d m %d v %d: bubble %.6f, want %.6f", schedule_kind_name(kind), pp, m, v,
                  sim.bubble, want_bubble);
        for (int st = 0; st < pp; st++)
            CHECK(sim.peak_in_flight[st] <= schedule_max_in_flight(&s, st),
                  "%s pp %d m %d v %d stage %d: holds %d, promises %d", schedule_kind_name(kind),
                  pp, m, v, st, sim.peak_in_flight[st], schedule_max_in_flight(&s, st));
        /* the same list runs with any timing: backward three times forward, slow W */
        CHECK(schedule_simulate(&s, 1.0, 3.0, 2.5, &sim, &err) == 0, "%s", err.text);
    }
    schedule_free(&s);
}

static void test_gpipe_and_1f1b_bubble_is_p_minus_1_over_m_plus_p_minus_1(void)
{
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        int pp = shapes[i][0], m = shapes[i][1];
        double want = (pp - 1.0) / (m + pp - 1.0);
        check_valid_and_bubble(SCHED_GPIPE, pp, m, 1, want);
        check_valid_and_bubble(SCHED_1F1B, pp, m, 1, want);
    }
}

static void test_interleaved_bubble_is_p_minus_1_over_vm_plus_p_minus_1(void)
{
    const int cases[][3] = {{2, 2, 2}, {2, 4, 2},  {4, 4, 2},  {4, 8, 2},
                            {4, 8, 3}, {4, 12, 4}, {8, 16, 2}, {3, 9, 3}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int pp = cases[i][0], m = cases[i][1], v = cases[i][2];
        check_valid_and_bubble(SCHED_INTERLEAVED, pp, m, v, (pp - 1.0) / (v * m + pp - 1.0));
    }
}

static void test_zb_h1_bubble_is_below_1f1b_with_the_same_memory(void)
{
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        int pp = shapes[i][0], m = shapes[i][1];
        check_valid_and_bubble(SCHED_ZB_H1, pp, m, 1, -1);
        struct schedule zb, ob;
        struct sched_sim zs, os;
        struct plait_error err;
        if (schedule_make(&zb, SCHED_ZB_H1, pp, m, 1, &err) ||
            schedule_make(&ob, SCHED_1F1B, pp, m, 1, &err)) {
            CHECK(0, "%s", err.text);
            continue;
        }
        /* F, B (input gradient) and W take one unit each; 1F1B's backward is B + W */
        if (schedule_simulate(&zb, 1, 1, 1, &zs, &err) == 0 &&
            schedule_simulate(&ob, 1, 1, 1, &os, &err) == 0) {
            if (pp > 1)
                CHECK(zs.bubble < os.bubble - 1e-9, "pp %d m %d: zb-h1 bubble %.4f, 1f1b %.4f", pp,
                      m, zs.bubble, os.bubble);
            else
                CHECK(zs.bubble == 0 && os.bubble == 0, "pp 1 has a bubble");
            for (int st = 0; st < pp; st++)
                CHECK(schedule_max_in_flight(&zb, st) == schedule_max_in_flight(&ob, st),
                      "stage %d: zb-h1 promises more memory than 1f1b", st);
        } else {
            CHECK(0, "%s", err.text);
        }
        schedule_free(&zb);
        schedule_free(&ob);
    }
}

/* DualPipeV's V: the lists run (every receive after its send, the turn on
 * the last stage from its chunk 0 to its own chunk 1), every stage holds 2p+1
 * chunks of half a stage (p + 1/2 stages' activations), and with the same
 * work per stage (a chunk's F, B and W half of a stage's) the bubble is below
 * ZB-H1's, itself below 1F1B's */
static void test_dualpipev_runs_its_v_below_zb_h1s_bubble(void)
{
    const int cases[][2] = {{2, 4}, {2, 8}, {3, 6}, {3, 7}, {4, 8}, {4, 9}, {4, 16}, {8, 16}, {8, 32}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int pp = cases[i][0], m = cases[i][1];
        check_valid_and_bubble(SCHED_DUALPIPEV, pp, m, 2, -1);
        struct schedule dv, zb;
        struct sched_sim ds, zs;
        struct plait_error err;
        if (schedule_make(&dv, SCHED_DUALPIPEV, pp, m, 2, &err) ||
            schedule_make(&zb, SCHED_ZB_H1, pp, m, 1, &err)) {
            CHECK(0, "%s", err.text);
            continue;
        }
        CHECK(schedule_virtual_stage(&dv, pp - 1, 0) == pp - 1 &&
                  schedule_virtual_stage(&dv, pp - 1, 1) == pp &&
                  schedule_virtual_stage(&dv, 0, 1) == 2 * pp - 1,
              "pp %d: the V's virtual stages", pp);
        if (schedule_simulate(&dv, 0.5, 0.5, 0.5, &ds, &err) == 0 &&
            schedule_simulate(&zb, 1, 1, 1, &zs, &err) == 0) {
            CHECK(ds.bubble < zs.bubble, "pp %d m %d: dualpipev bubble %.3f, zb-h1 %.3f", pp, m,
                  ds.bubble, zs.bubble);
            for (int st = 0; st < pp; st++)
                CHECK(ds.peak_in_flight[st] == 2 * pp + 1 &&
                          schedule_max_in_flight(&dv, st) == 2 * pp + 1,
                      "pp %d m %d stage %d: holds %d chunks, promises %d (want %d)", pp, m, st,
                      ds.peak_in_flight[st], schedule_max_in_flight(&dv, st), 2 * pp + 1);
        } else {
            CHECK(0, "%s", err.text);
        }
        schedule_free(&dv);
        schedule_free(&zb);
    }
}

static void test_1f1b_holds_p_minus_stage_micro_batches(void)
{
    struct schedule s;
    struct sched_sim sim;
    struct plait_error err;
    CHECK(schedule_make(&s, SCHED_1F1B, 4, 8, 1, &err) == 0, "%s", err.text);
    CHECK(schedule_simulate(&s, 1, 2, 0, &sim, &err) == 0, "%s", err.text);
    for (int st = 0; st < 4; st++)
        CHECK(sim.peak_in_flight[st] == 4 - st, "stage %d holds %d", st, sim.peak_in_flight[st]);
    schedule_free(&s);
    CHECK(schedule_make(&s, SCHED_GPIPE, 4, 8, 1, &err) == 0, "%s", err.text);
    CHECK(schedule_simulate(&s, 1, 2, 0, &sim, &err) == 0, "%s", err.text);
    for (int st = 0; st < 4; st++)
        CHECK(sim.peak_in_flight[st] == 8, "gpipe stage %d holds %d", st, sim.peak_in_flight[st]);
    schedule_free(&s);
}

static void test_broken_lists_are_caught_naming_the_op(void)
{
    struct schedule s;
    struct sched_sim sim;
    struct plait_error err;
    CHECK(schedule_make(&s, SCHED_1F1B, 2, 2, 1, &err) == 0, "%s", err.text);
    /* stage 1: recv-act F send... B: swap its first two ops (F before its receive) */
    struct sched_op t = s.ops[1][0];
    s.ops[1][0] = s.ops[1][1];
    s.ops[1][1] = t;
    CHECK(schedule_simulate(&s, 1, 2, 0, &sim, &err) != 0, "F before its receive ran");
    CHECK(strstr(err.text, "stage 1 op 0: F of micro-batch 0 without its activations") != NULL,
          "%s", err.text);
    schedule_free(&s);
    /* a stage that waits for a send that never comes */
    CHECK(schedule_make(&s, SCHED_1F1B, 2, 2, 1, &err) == 0, "%s", err.text);
    for (int i = 0; i < s.n_ops[0]; i++)
        if (s.ops[0][i].type == SCHED_SEND_ACT && s.ops[0][i].micro == 1)
            s.ops[0][i].micro = 0; /* sends micro-batch 0 twice, 1 never */
    CHECK(schedule_simulate(&s, 1, 2, 0, &sim, &err) != 0, "ran without micro-batch 1's data");
    CHECK(strstr(err.text, "waits forever") != NULL, "%s", err.text);
    schedule_free(&s);
}

static void test_impossible_combinations_are_refused(void)
{
    struct schedule s;
    struct plait_error err;
    CHECK(schedule_make(&s, SCHED_INTERLEAVED, 4, 6, 2, &err) != 0, "m not a multiple of pp");
    CHECK(strstr(err.text, "multiple of pp (6 % 4 = 2)") != NULL, "%s", err.text);
    CHECK(schedule_make(&s, SCHED_INTERLEAVED, 4, 8, 1, &err) != 0, "v 1 interleaved");
    CHECK(schedule_make(&s, SCHED_1F1B, 4, 8, 2, &err) != 0, "v 2 with 1f1b");
    CHECK(schedule_make(&s, SCHED_DUALPIPEV, 4, 7, 2, &err) != 0, "dualpipev with m < 2pp");
    CHECK(strstr(err.text, "at least 2·pp = 8 micro-batches per step (got 7)") != NULL, "%s",
          err.text);
    CHECK(schedule_make(&s, SCHED_DUALPIPEV, 4, 8, 3, &err) != 0, "dualpipev with 3 chunks");
}

static void test_timeline_shows_the_1f1b_shape(void)
{
    struct schedule s;
    struct plait_error err;
    CHECK(schedule_make(&s, SCHED_1F1B, 2, 3, 1, &err) == 0, "%s", err.text);
    char buf[1024] = "";
    FILE *f = fmemopen(buf, sizeof buf, "w");
    schedule_print(&s, f, 80);
    fclose(f);
    /* F = 1 unit, B = 2 units: stage 1 runs F0 B0 F1 B1 F2 B2 back to back; stage 0
     * waits for each gradient */
    CHECK(strstr(buf, "stage 0  01..aa2bb.cc\n") != NULL &&
              strstr(buf, "stage 1  .0aa1bb2cc..\n") != NULL,
          "\n%s", buf);
    schedule_free(&s);
}

/* ZeRO 2 hands a stage's gradients over where its buffer is quiescent
 * (schedule_quiescent); a step stopped at k and resumed runs 0..k-1 through
 * the whole step's list drained, then k..m-1 through a list of m-k. For the
 * same sums as the step that never stopped: every k a stop may come at is
 * quiescent on every stage, and the rest's list is quiescent exactly where
 * the whole step's is (shifted by k). Interleaved: the multiples of pp;
 * otherwise every micro-batch. */
static void test_stops_land_where_the_gradients_are_quiescent(void)
{
    struct plait_error err;
    static const int cases[][4] = {{SCHED_INTERLEAVED, 2, 8, 2}, {SCHED_INTERLEAVED, 4, 8, 2},
                                   {SCHED_INTERLEAVED, 2, 12, 3}, {SCHED_INTERLEAVED, 4, 16, 4},
                                   {SCHED_ZB_H1, 2, 8, 1},        {SCHED_ZB_H1, 4, 8, 1},
                                   {SCHED_ZB_H1, 3, 7, 1},        {SCHED_ZB_H1, 8, 32, 1},
                                   {SCHED_1F1B, 4, 8, 1},         {SCHED_GPIPE, 3, 5, 1}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int kind = cases[i][0], pp = cases[i][1], m = cases[i][2], v = cases[i][3];
        struct schedule s, rest;
        bool at[64], rest_at[64];
        CHECK(schedule_make(&s, kind, pp, m, v, &err) == 0, "%s", err.text);
        for (int st = 0; st < pp; st++) {
            schedule_quiescent(&s, st, at);
            for (int n = 1; n <= m; n++)
                CHECK(at[n] == (n % (v > 1 ? pp : 1) == 0), "%s pp %d m %d stage %d: at[%d] %d",
                      schedule_kind_name(kind), pp, m, st, n, at[n]);
            for (int k = 1; k < m; k++) {
                if (!schedule_may_stop(&s, k)) continue;
                CHECK(at[k], "%s pp %d m %d stage %d: a stop at %d is not quiescent",
                      schedule_kind_name(kind), pp, m, st, k);
                CHECK(schedule_make(&rest, kind, pp, m - k, v, &err) == 0, "%s", err.text);
                schedule_quiescent(&rest, st, rest_at);
                for (int n = 1; n <= m - k; n++)
                    CHECK(rest_at[n] == at[k + n], "%s pp %d m %d stage %d stop %d: at %d",
                          schedule_kind_name(kind), pp, m, st, k, k + n);
                schedule_free(&rest);
            }
        }
        schedule_free(&s);
    }
}

int main(void)
{
    RUN(test_gpipe_and_1f1b_bubble_is_p_minus_1_over_m_plus_p_minus_1);
    RUN(test_interleaved_bubble_is_p_minus_1_over_vm_plus_p_minus_1);
    RUN(test_zb_h1_bubble_is_below_1f1b_with_the_same_memory);
    RUN(test_dualpipev_runs_its_v_below_zb_h1s_bubble);
    RUN(test_1f1b_holds_p_minus_stage_micro_batches);
    RUN(test_broken_lists_are_caught_naming_the_op);
    RUN(test_impossible_combinations_are_refused);
    RUN(test_timeline_shows_the_1f1b_shape);
    RUN(test_stops_land_where_the_gradients_are_quiescent);
    return check_exit_code();
}
