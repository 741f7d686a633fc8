/* test_cost_moe.c — the cost model of expert parallelism against numbers worked out by
 * hand (each in a comment beside it): what a rank holds with E/ep routed experts, the ep
 * group's all-to-all of the routed rows (forward, backward, full recompute's forwards, a
 * capacity factor, fp32 rows whatever the precision), the routed experts' gradients summed
 * over their expert peers beside the dense ones over dp (with ZeRO, the slices over the
 * expert peers and the dense part over the ep group), each on its own link in the step, and
 * the socket backend's rings for both groups. test_cost.c has the dense model's. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common/place/cost.h"
#include "common/place/comm_memory.h" // COMM_SHM_RING_BYTES
#include "common/plan/plan.h"
#include "tests/unit/check.h"

/* A small GPT-2 with MoE blocks in layers 1 and 3 (every 2): C = 256, 4 heads, V = 1000
 * (Vp 1024), T = 128; E = 8 experts, top 2, each 512 wide; micro-batch 2, m = 4, fp32. */
static struct plan *moe_plan(const char *precision, const char *recompute, double capacity)
{
    char text[1024];
    snprintf(text, sizeof text,
             "{\"model\": {\"layers\": 4, \"heads\": 4, \"hidden\": 256, \"vocab\": 1000, "
             "\"seq_len\": 128, \"moe\": {\"experts\": 8, \"top_k\": 2, \"every\": 2, "
             "\"ffn_hidden\": 512, \"capacity_factor\": %g}},\n"
             " \"data\": {\"train\": \"train.bin\"},\n"
             " \"batch\": {\"micro_batch\": 2, \"grad_accum\": 4},\n"
             " \"precision\": \"%s\", \"recompute\": \"%s\", \"steps\": 10}\n",
             capacity, precision, recompute);
    struct plait_error err = {0};
    struct plan *p = plan_load_text(text, "test_cost_moe", "/", NULL, 0, &err);
    CHECK(p != NULL, "plan_load_text: %s", err.text);
    return p;
}

static struct cost_traffic traffic_at(struct plan *p, int ep, struct cost_layout l)
{
    struct cost_traffic t;
    p->parallel.ep = ep;
    cost_traffic(p, l, &t);
    return t;
}

static int64_t params_at(struct plan *p, int ep, struct cost_layout l)
{
    struct cost_memory m;
    p->parallel.ep = ep;
    cost_memory_stage(p, l, 0, &m);
    return m.param_count;
}

/* One expert: fc 512·256 = 131,072, fcb 512, proj 256·512 = 131,072, projb 256: 262,912.
 * The rest (dense): wte 1024·256 = 262,144, wpe 128·256 = 32,768, 2 dense layers of
 * 12C² + 13C = 789,760, 2 MoE layers of ln1, qkv, attproj and ln2 (4C² + 8C = 264,192) and
 * the router (E·C = 2,048), the final LayerNorm 512: 2,407,424. A rank holds E/ep of each
 * MoE layer's experts: ep 1 all 8, 2,407,424 + 2·8·262,912 = 6,614,016; ep 2 four,
 * 4,510,720; ep 4 two, 3,459,072. */

static void test_a_rank_holds_its_ep_share_of_the_routed_experts(void)
{
    struct plan *p = moe_plan("fp32", "none", 0);
    if (!p) return;
    struct cost_layout l = {1, 1, 4};
    CHECK(params_at(p, 1, l) == 6614016, "ep 1: %lld", (long long)params_at(p, 1, l));
    CHECK(params_at(p, 2, l) == 4510720, "ep 2: %lld", (long long)params_at(p, 2, l));
    CHECK(params_at(p, 4, l) == 3459072, "ep 4: %lld", (long long)params_at(p, 4, l));
    /* a token passes its k experts wherever they are: the same compute at any ep */
    struct cost_links links = {.device_tflops = 1}; /* (compute alone compared) */
    struct cost_time at1, at4;
    p->parallel.ep = 1;
    cost_step_time(p, l, &links, &at1);
    p->parallel.ep = 4;
    cost_step_time(p, l, &links, &at4);
    CHECK(at1.compute_s > 0 && at1.compute_s == at4.compute_s, "compute %.9g at ep 1, %.9g at ep 4",
          at1.compute_s, at4.compute_s);
    plan_free(p);
}

/* N = 2·128 = 256 tokens a micro-batch, k·N = 512 rows of C = 256 fp32 values, 1,024 bytes
 * a row. At ep 2 half the rows leave the rank: 256 rows, 262,144 bytes an exchange, and
 * half the 8 int64 counts, 32 bytes. A forward sends counts, rows out and results back,
 * a backward gradients out and back: 32 + 4·262,144 = 1,048,608 a layer and micro-batch,
 * × 2 MoE layers × 4 micro-batches = 8,388,864 — at tp 2 too (each tp rank has its own ep
 * group and sends the rows whole), in bf16 too (the runtime's rows are fp32), under
 * selective recompute (which reruns the attention alone), and with a capacity factor of
 * 1.25 (balanced routing drops nothing). At ep 4, 3/4 leave: 384 rows, 393,216 bytes an
 * exchange, 48 of counts: (48 + 4·393,216)·8 = 12,583,296. Full recompute runs the block's
 * forward again before its backward: 2·(32 + 2·262,144) + 2·262,144 = 1,572,928 a layer,
 * 12,583,424 a step; with a split backward (ZB-H1 at pp 2, one MoE layer a stage) the
 * input pass reruns it and the weight pass only the attention: 1,572,928 × 4 = 6,291,712.
 * A capacity factor of 0.5 lets an expert take ceil(0.5·2·256/8) = 32 rows: 8·32 = 256 of
 * the 512, 131,072 bytes an exchange: (32 + 4·131,072)·8 = 4,194,560. */
static void test_the_all_to_all_sends_the_rows_that_leave_out_and_back(void)
{
    const struct {
        const char *precision, *recompute;
        double capacity;
        bool split; /* ZB-H1 over 2 even stages */
        int tp, ep;
        double want;
    } cases[] = {
        {"fp32", "none", 0, false, 1, 2, 8388864},
        {"fp32", "none", 0, false, 2, 2, 8388864},
        {"bf16", "none", 0, false, 1, 2, 8388864},
        {"fp32", "selective", 0, false, 1, 2, 8388864},
        {"fp32", "none", 1.25, false, 1, 2, 8388864},
        {"fp32", "none", 0, false, 1, 4, 12583296},
        {"fp32", "full", 0, false, 1, 2, 12583424},
        {"fp32", "full", 0, true, 1, 2, 6291712},
        {"fp32", "none", 0.5, false, 1, 2, 4194560},
        {"fp32", "none", 0, false, 1, 1, 0},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        struct plan *p = moe_plan(cases[k].precision, cases[k].recompute, cases[k].capacity);
        if (!p) return;
        struct cost_layout l = {cases[k].tp, 1, 4};
        if (cases[k].split) {
            p->parallel.schedule = PLAN_PIPE_ZB_H1;
            p->parallel.stage_layers.n = 2;
            p->parallel.stage_layers.v[0] = p->parallel.stage_layers.v[1] = 2;
            l.pp = 2;
        }
        struct cost_traffic t = traffic_at(p, cases[k].ep, l);
        CHECK(t.ep_bytes == cases[k].want, "%s, %s, capacity %g%s, tp %d, ep %d: %.0f, want %.0f",
              cases[k].precision, cases[k].recompute, cases[k].capacity,
              cases[k].split ? ", split backward" : "", cases[k].tp, cases[k].ep, t.ep_bytes,
              cases[k].want);
        plan_free(p);
    }
}

/* ZeRO 0, fp32 gradients at dp 4: the dense 2,407,424 are all-reduced over all 4 ranks,
 * 2·(3/4)·DENSE·4 = 14,444,544 bytes; at ep 2 the 2·4·EXPERT = 2,103,296 routed ones over
 * the 2 ranks holding the same experts, 2·(1/2)·2,103,296·4 = 8,413,184: dp 22,857,728
 * (summed over all 4 it would be 2·(3/4)·4,510,720·4 = 27,064,320). At dp 8 the routed over
 * 4 peers, 2·(3/4)·2,103,296·4 = 12,619,776. At ep 4 = dp each rank's experts are its own:
 * nothing routed is summed, dp is the dense part alone. */
static void test_routed_gradients_are_summed_over_the_expert_peers(void)
{
    struct plan *p = moe_plan("fp32", "none", 0);
    if (!p) return;
    struct cost_traffic t = traffic_at(p, 2, (struct cost_layout){1, 1, 4});
    CHECK(t.experts_bytes == 8413184, "dp 4, ep 2: experts %.0f", t.experts_bytes);
    CHECK(t.dp_bytes == 22857728, "dp 4, ep 2: dp %.0f", t.dp_bytes);
    t = traffic_at(p, 2, (struct cost_layout){1, 1, 8});
    CHECK(t.experts_bytes == 12619776, "dp 8, ep 2: experts %.0f", t.experts_bytes);
    t = traffic_at(p, 4, (struct cost_layout){1, 1, 4});
    CHECK(t.experts_bytes == 0 && t.dp_bytes == 14444544, "dp 4, ep 4: experts %.0f, dp %.0f",
          t.experts_bytes, t.dp_bytes);
    plan_free(p);
}

/* ZeRO with ep slices each rank's part (Ψ = 4,510,720 at ep 2) over its Z = dp/ep expert
 * peers, then sums the slice's dense part over the ep group. dp 4, ep 2, ZeRO 1 (Z 2): the
 * peers' reduce-scatter and all-gather 2·(1/2)·Ψ·4 = 18,042,880, the dense slice
 * 2,407,424/2 all-reduced over 2 ranks, 2·(1/2)·1,203,712·4 = 4,814,848: dp 22,857,728.
 * ZeRO 2: a reduce-scatter at each of the 4 micro-batches and the all-gather,
 * 5·(1/2)·Ψ·4 = 45,107,200, dp 49,922,048. Hybrid sharding 4 × 2 at ep 2, ZeRO 1: both in
 * the shard group, 22,857,728, and the slice Ψ/2 over the 2 replicas, 2·(1/2)·2,255,360·4 =
 * 9,021,440. ep 4 at dp 4 (Z 1): nothing sliced, ZeRO 0's dense sum over all 4, 14,444,544. */
static void test_zero_with_ep_slices_over_the_expert_peers(void)
{
    struct plan *p = moe_plan("fp32", "none", 0);
    if (!p) return;
    p->parallel.zero = 1;
    struct cost_traffic t = traffic_at(p, 2, (struct cost_layout){1, 1, 4});
    CHECK(t.experts_bytes == 18042880 && t.dp_bytes == 22857728, "ZeRO 1: experts %.0f, dp %.0f",
          t.experts_bytes, t.dp_bytes);
    p->parallel.zero = 2;
    t = traffic_at(p, 2, (struct cost_layout){1, 1, 4});
    CHECK(t.experts_bytes == 45107200 && t.dp_bytes == 49922048, "ZeRO 2: experts %.0f, dp %.0f",
          t.experts_bytes, t.dp_bytes);
    p->parallel.zero = 1;
    p->parallel.dp_shard = 4;
    t = traffic_at(p, 2, (struct cost_layout){1, 1, 8});
    CHECK(t.shard_bytes == 22857728 && t.replicas_bytes == 9021440 && t.dp_bytes == 31879168,
          "HSDP: shard %.0f, replicas %.0f, dp %.0f", t.shard_bytes, t.replicas_bytes, t.dp_bytes);
    p->parallel.dp_shard = PLAN_AUTO;
    t = traffic_at(p, 4, (struct cost_layout){1, 1, 4});
    CHECK(t.experts_bytes == 0 && t.dp_bytes == 14444544, "ep 4: experts %.0f, dp %.0f",
          t.experts_bytes, t.dp_bytes);
    plan_free(p);
}

/* Each on its own link: the all-to-all on the critical path, its share to the peers behind
 * the slowest link at that link's rate (8,388,864 bytes at 1 GB/s, half of them behind:
 * 0.004194432 s); the experts' 8,413,184 at 1 GB/s, 0.008413184 s, beside dp's dense part
 * at 1e6 GB/s (dp 4, ep 2; compute negligible at 1e6 TFLOP/s, so nothing hides them). */
static void test_each_group_takes_its_own_link_in_the_step(void)
{
    struct plan *p = moe_plan("fp32", "none", 0);
    if (!p) return;
    p->parallel.ep = 2;
    struct cost_links links = {
        .dp_gbps = 1e6, .ep_gbps = 1, .ep_share = 0.5, .experts_gbps = 1, .device_tflops = 1e6};
    struct cost_time t;
    cost_step_time(p, (struct cost_layout){1, 1, 4}, &links, &t);
    CHECK(fabs(t.ep_s - 0.004194432) < 1e-12, "ep %.12g", t.ep_s);
    CHECK(fabs(t.dp_s - 0.008413184) < 1e-6, "dp %.12g", t.dp_s);
    CHECK(fabs(t.total_s - (t.compute_s + t.ep_s + t.dp_s + t.optimizer_s)) < 1e-12, "total %.12g",
          t.total_s);
    links.ep_share = 0; /* not given: every byte over it */
    cost_step_time(p, (struct cost_layout){1, 1, 4}, &links, &t);
    CHECK(fabs(t.ep_s - 0.008388864) < 1e-12, "ep %.12g", t.ep_s);
    plan_free(p);
}

/* CPU ranks: the dp ring carries the dense part (14,444,544 bytes), the expert peers' ring
 * the routed (8,413,184) and the all-to-all its 8,388,864 to the one other ep rank, each
 * beyond a ring's 4 MiB: 2·3·4 MiB each way in all; at ep 1 the dp ring alone, 2·4 MiB. */
static void test_the_socket_rings_of_both_groups(void)
{
    struct plan *p = moe_plan("fp32", "none", 0);
    if (!p) return;
    double ring = (double)COMM_SHM_RING_BYTES;
    p->parallel.ep = 2;
    uint64_t two = cost_comm_ring_bytes(p, (struct cost_layout){1, 1, 4}, 0);
    p->parallel.ep = 1;
    uint64_t one = cost_comm_ring_bytes(p, (struct cost_layout){1, 1, 4}, 0);
    CHECK(two == (uint64_t)(6 * ring) && one == (uint64_t)(2 * ring), "ep 2 %llu, ep 1 %llu",
          (unsigned long long)two, (unsigned long long)one);
    plan_free(p);
}

/* Context parallelism's routing: each forward of an MoE block sums a table of b·2cp·E
 * choice counts (doubles) over the cp group: at cp 2, b 2, E 8, 2·4·8 = 64 of them,
 * 512 bytes, a ring all-reduce of 2·(1/2)·512 = 512 bytes; 2 MoE layers, m = 4: 4,096 bytes
 * a step on top of the dense model's ring (full recompute: twice the forwards, 8,192). */
static void test_cp_sums_the_routing_counts_over_its_group(void)
{
    struct plan *p = moe_plan("fp32", "none", 0);
    p->parallel.cp = 2;
    struct cost_layout l = {1, 1, 1};
    double moe = traffic_at(p, 1, l).cp_bytes;
    p->model.moe.given = false;
    double dense = traffic_at(p, 1, l).cp_bytes;
    CHECK(fabs(moe - dense - 4096) < 1e-6, "cp bytes %.0f, dense %.0f: want 4,096 more", moe,
          dense);
    p->model.moe.given = true;
    p->recompute = PLAN_RECOMPUTE_FULL;
    moe = traffic_at(p, 1, l).cp_bytes;
    p->model.moe.given = false;
    dense = traffic_at(p, 1, l).cp_bytes;
    CHECK(fabs(moe - dense - 8192) < 1e-6,
          "full recompute: cp bytes %.0f, dense %.0f: want "
          "8,192 more",
          moe, dense);
    plan_free(p);
}

int main(void)
{
    RUN(test_a_rank_holds_its_ep_share_of_the_routed_experts);
    RUN(test_the_all_to_all_sends_the_rows_that_leave_out_and_back);
    RUN(test_routed_gradients_are_summed_over_the_expert_peers);
    RUN(test_zero_with_ep_slices_over_the_expert_peers);
    RUN(test_each_group_takes_its_own_link_in_the_step);
    RUN(test_the_socket_rings_of_both_groups);
    RUN(test_cp_sums_the_routing_counts_over_its_group);
    return check_exit_code();
}
