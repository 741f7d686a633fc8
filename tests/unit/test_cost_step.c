/* test_cost_step.c — the cost model's traffic and step time against numbers worked out
 * by hand (each in a comment beside it): tp/pp/dp traffic by ZeRO stage and schedule,
 * compute, dp's overlap, the bubble, recompute, context parallelism's ring traffic and
 * its share of a step, the optimizer's pass and a GPU rank's offloaded step on the CPU, a
 * measured CPU rank's attention, memory-bound ops and parallel starts, and the H100
 * calibration against plait's measured step. test_cost.c has the memory. Plans come from
 * JSON text (cost_plans.h); the layout is passed separately, ZeRO set on the struct. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "common/place/cost.h"
#include "common/place/gpu.h"    // gpu_spec_by_pci
#include "common/place/layout.h" // layout_device_tflops, layout_device_memory_gbps
#include "common/plan/plan.h"
#include "tests/unit/check.h"
#include "tests/unit/cost_plans.h" // gpt2_124m, load_plan, even_split, stage_params

static int close_to(double got, double want)
{
    return fabs(got - want) <= 1e-12 * fabs(want);
}

/* ---- traffic ----------------------------------------------------------------------------- */

/* GPT-2 124M, bf16, b = 4, s = 1024, m = 4, tp = pp = dp = 2. One activation
 * s·b·h·2 bytes = 3,145,728·2 = 6,291,456. Ring factor 2(t−1)/t = 1.
 *   tp: stage 0: 4·6 layers + 1 (embedding) = 25 all-reduces per micro-batch;
 *       stage 1: 24 + 1 (LM head backward) = 25. 25·4·6,291,456 = 629,145,600.
 *   pp: each stage sends one way: 4·6,291,456 = 25,165,824.
 *   dp: Ψ = the larger stage at tp = 2, pp = 2: stage 0 = 19,316,736 +
 *       786,432 + 6·3,546,240 = 41,380,608 (stage 1: 40,595,712).
 *       ZeRO 0/1: 2·(1/2)·Ψ·2 = 82,761,216; ZeRO 2, handing each of the 4
 *       micro-batches over (1F1B): 4·(1/2)Ψ·2 + (1/2)Ψ·2 = 206,903,040;
 *       ZeRO 3 (stage 0, the busier): each micro-batch gathers Ψ for forward
 *       and the layers, Ψ_L = 21,277,440, again for backward, and scatters
 *       Ψ: 4·(2Ψ + Ψ_L) = 416,154,624 elements, and the tied wte's sum in
 *       the slices gathers the embeddings' unit (Ψ_e = 19,316,736 + 786,432
 *       = 20,103,168) once: 436,257,792 elements, ·(1/2)·2 bytes =
 *       436,257,792 (stage 1: 4·(2·40,595,712 + Ψ_L) + 19,316,736 =
 *       429,192,192). */
static void test_traffic_tp2_pp2_dp2_by_zero_stage(void)
{
    struct plan *p = load_plan(gpt2_124m, 4, 4, "bf16", "none");
    if (!p) return;
    struct cost_layout l = {2, 2, 2};
    even_split(p, 2);
    static const double want_dp[4] = {82761216, 82761216, 206903040, 436257792};
    for (int zero = 0; zero <= 3; zero++) {
        p->parallel.zero = zero;
        struct cost_traffic t;
        cost_traffic(p, l, &t);
        CHECK(t.tp_bytes == 629145600, "ZeRO %d tp %.0f", zero, t.tp_bytes);
        CHECK(t.pp_bytes == 25165824, "ZeRO %d pp %.0f", zero, t.pp_bytes);
        CHECK(t.dp_bytes == want_dp[zero], "ZeRO %d dp %.0f", zero, t.dp_bytes);
    }
    /* ZeRO 3 with the units kept gathered until the step's end: Ψ gathered
     * once a step, 4 micro-batches' scatters and the tied sum's gather,
     * (Ψ + 4Ψ + Ψ_e)·(1/2)·2 = 227,006,208 */
    p->parallel.reshard_after_forward = false;
    struct cost_traffic t;
    cost_traffic(p, l, &t);
    CHECK(t.dp_bytes == 227006208, "ZeRO 3 kept gathered: dp %.0f", t.dp_bytes);
    plan_free(p);
}

/* pp = 4, m = 4, bf16: a middle stage sends activations forward and gradients
 * back, 2·4·6,291,456 = 50,331,648; tp = dp = 1 send nothing. */
static void test_traffic_middle_pipeline_stage_sends_both_ways(void)
{
    struct plan *p = load_plan(gpt2_124m, 4, 4, "bf16", "none");
    if (!p) return;
    struct cost_traffic t;
    cost_traffic(p, (struct cost_layout){1, 4, 1}, &t);
    CHECK(t.pp_bytes == 50331648, "%.0f", t.pp_bytes);
    CHECK(t.tp_bytes == 0 && t.dp_bytes == 0, "%.0f %.0f", t.tp_bytes, t.dp_bytes);
    cost_traffic(p, (struct cost_layout){1, 1, 1}, &t);
    CHECK(t.tp_bytes == 0 && t.pp_bytes == 0 && t.dp_bytes == 0, "one rank sends");
    plan_free(p);
}

/* Chunks send more: interleaved pp 2 × v 2, m = 4, each stage sends its two
 * chunks' activations and gradients but the first chunk's gradient (stage 0)
 * or the last chunk's activation (stage 1): 3·4·6,291,456 = 75,497,472;
 * DualPipeV at pp 4: a middle stage both ways through both chunks,
 * 4·8·6,291,456 = 201,326,592 (m = 8), the first and the last 2 a micro-batch. */
static void test_traffic_of_chunked_pipelines(void)
{
    struct plan *p = load_plan(gpt2_124m, 4, 4, "bf16", "none");
    if (!p) return;
    struct cost_traffic t;
    p->parallel.schedule = PLAN_PIPE_INTERLEAVED;
    p->parallel.virtual_stages = 2;
    cost_traffic(p, (struct cost_layout){1, 2, 1}, &t);
    CHECK(t.pp_bytes == 75497472, "interleaved %.0f", t.pp_bytes);
    p->parallel.schedule = PLAN_PIPE_DUALPIPEV;
    p->parallel.virtual_stages = 1;
    p->batch.grad_accum = 8;
    cost_traffic(p, (struct cost_layout){1, 4, 1}, &t);
    CHECK(t.pp_bytes == 201326592, "dualpipev %.0f", t.pp_bytes);
    plan_free(p);
}

/* fp32, tp = 4, pp = 1, m = 1: 4·12 + 1 + 1 = 50 all-reduces of 3,145,728·4 =
 * 12,582,912 bytes, ring factor 2·3/4 = 1.5: 50·1.5·12,582,912 = 943,718,400.
 * Full recompute repeats the forward's 2 per layer: bf16, tp = pp = 2, m = 4:
 * (6·6 + 1)·4·6,291,456 = 931,135,488. */
static void test_traffic_tp_ring_factor_and_full_recompute(void)
{
    struct plan *p = load_plan(gpt2_124m, 4, 1, "fp32", "none");
    if (!p) return;
    struct cost_traffic t;
    cost_traffic(p, (struct cost_layout){4, 1, 1}, &t);
    CHECK(t.tp_bytes == 943718400, "%.0f", t.tp_bytes);
    plan_free(p);

    p = load_plan(gpt2_124m, 4, 4, "bf16", "full");
    if (p) even_split(p, 2);
    if (!p) return;
    cost_traffic(p, (struct cost_layout){2, 2, 1}, &t);
    CHECK(t.tp_bytes == 931135488, "%.0f", t.tp_bytes);
    plan_free(p);
}

/* ---- step time --------------------------------------------------------------------------- */

static const struct cost_links fast_links = {
    .tp = COST_LINK_NVLINK,
    .pp = COST_LINK_NETWORK,
    .dp = COST_LINK_NETWORK,
    .tp_gbps = 300,
    .pp_gbps = 25,
    .dp_gbps = 25,
    .device_tflops = 100,
};

/* GPT-2 124M, b = 4, s = 1024, m = 1, one rank. Matmul weights N = 12·12·768²
 * + 50304·768 = 84,934,656 + 38,633,472 = 123,568,128; attention 12·L·h·s =
 * 12·12·768·1024 = 113,246,208 per token; tokens 4096:
 * (6·123,568,128 + 113,246,208)·4096 = 3,500,666,781,696 FLOPs; at 100 TFLOP/s
 * 0.03500666781696 s. dp = 2, ZeRO 0, bf16: 2·(1/2)·124,475,904·2 =
 * 248,951,808 bytes; at 1 GB/s 0.248951808 s, minus the 2/3 of compute that
 * backward hides (0.02333777854464): 0.22561402945536 s; at 100 GB/s all hidden. */
static void test_step_time_compute_and_dp_overlap(void)
{
    struct plan *p = load_plan(gpt2_124m, 4, 1, "bf16", "none");
    if (!p) return;
    struct cost_time t;
    cost_step_time(p, (struct cost_layout){1, 1, 1}, &fast_links, &t);
    CHECK(close_to(t.compute_s, 0.03500666781696), "%.15g", t.compute_s);
    CHECK(t.tp_s == 0 && t.pp_s == 0 && t.dp_s == 0 && t.bubble_s == 0, "one rank");
    CHECK(t.total_s == t.compute_s, "%.15g", t.total_s);

    struct cost_links slow = fast_links;
    slow.dp_gbps = 1;
    cost_step_time(p, (struct cost_layout){1, 1, 2}, &slow, &t);
    CHECK(close_to(t.dp_s, 0.22561402945536), "%.15g", t.dp_s);
    slow.dp_gbps = 100;
    cost_step_time(p, (struct cost_layout){1, 1, 2}, &slow, &t);
    CHECK(t.dp_s == 0, "%.15g", t.dp_s);
    plan_free(p);
}

/* Context parallelism, GPT-2 124M, b = 4, s = 1024, m = 1, bf16, cp 2: a rank's
 * key/value block is b·(s/cp)·2·h fp32 values, 4·4·512·2·768 = 12,582,912
 * bytes; each layer's forward passes it on cp−1 = 1 time, its backward the
 * block and its gradient (2 blocks) once and the gradient home (1): 4 blocks a
 * layer, 12·4·12,582,912 = 603,979,776; full recompute repeats the forward's,
 * 5 blocks, 754,974,720. cp 4 at tp 2: block 4·4·256·2·384 = 3,145,728, 3 + 6
 * + 1 = 10 blocks a layer, 377,487,360. tp's all-reduces carry the rank's s/cp
 * rows: fp32 tp 4 at cp 2 half of the 943,718,400 above, 471,859,200; the
 * gradients are summed over dp·cp: dp 1 × cp
 * 2 at ZeRO 0 moves what dp 2 does, 248,951,808. Compute is the rank's half of
 * the tokens, 0.03500666781696 / 2 = 0.01750333390848 s at 100 TFLOP/s, and
 * the ring's bytes at 100 GB/s, 0.00603979776 s, are added on its link. */
static void test_cp_ring_traffic_and_the_ranks_share_of_the_step(void)
{
    struct plan *p = load_plan(gpt2_124m, 4, 1, "bf16", "none");
    if (!p) return;
    p->parallel.cp = 2;
    struct cost_traffic t;
    cost_traffic(p, (struct cost_layout){1, 1, 1}, &t);
    CHECK(t.cp_bytes == 603979776, "cp 2: %.0f", t.cp_bytes);
    CHECK(t.dp_bytes == 248951808 && t.tp_bytes == 0, "cp 2: dp %.0f tp %.0f", t.dp_bytes,
          t.tp_bytes);
    struct cost_links links = fast_links;
    links.cp = COST_LINK_NVLINK;
    links.cp_gbps = 100;
    links.dp_gbps = 1e9; /* dp all hidden */
    struct cost_time time;
    cost_step_time(p, (struct cost_layout){1, 1, 1}, &links, &time);
    CHECK(close_to(time.compute_s, 0.01750333390848), "%.15g", time.compute_s);
    CHECK(close_to(time.cp_s, 0.00603979776), "%.15g", time.cp_s);
    CHECK(close_to(time.total_s, time.compute_s + time.cp_s), "%.15g", time.total_s);
    p->recompute = PLAN_RECOMPUTE_FULL;
    cost_traffic(p, (struct cost_layout){1, 1, 1}, &t);
    CHECK(t.cp_bytes == 754974720, "cp 2, full recompute: %.0f", t.cp_bytes);
    p->recompute = PLAN_RECOMPUTE_NONE;
    p->parallel.cp = 4;
    cost_traffic(p, (struct cost_layout){2, 1, 1}, &t);
    CHECK(t.cp_bytes == 377487360, "cp 4 tp 2: %.0f", t.cp_bytes);
    p->parallel.cp = 1;
    cost_traffic(p, (struct cost_layout){1, 1, 2}, &t);
    CHECK(t.cp_bytes == 0, "cp 1: %.0f", t.cp_bytes);
    plan_free(p);

    p = load_plan(gpt2_124m, 4, 1, "fp32", "none");
    if (!p) return;
    p->parallel.cp = 2;
    cost_traffic(p, (struct cost_layout){4, 1, 1}, &t);
    CHECK(t.tp_bytes == 471859200, "tp 4 at cp 2: %.0f", t.tp_bytes);
    plan_free(p);
}

/* pp = 4, m = 8: the last stage is the slowest: 3 layers 3·12·768² =
 * 21,233,664 + LM head 38,633,472 = 59,867,136 weights, ×6 = 359,202,816, +
 * attention 3·12·1024·768 = 28,311,552: 387,514,368 FLOPs per token × 4·1024·8
 * = 32,768 tokens = 12,698,070,810,624; 0.12698070810624 s at 100 TFLOP/s.
 * Bubble (pp−1)/m = 3/8 of it: 0.04761776553984 s. */
static void test_step_time_bubble_is_pp_minus_1_over_m_of_compute(void)
{
    struct plan *p = load_plan(gpt2_124m, 4, 8, "bf16", "none");
    if (!p) return;
    even_split(p, 4);
    struct cost_time t;
    cost_step_time(p, (struct cost_layout){1, 4, 1}, &fast_links, &t);
    CHECK(close_to(t.compute_s, 0.12698070810624), "%.15g", t.compute_s);
    CHECK(close_to(t.bubble_s, 0.04761776553984), "%.15g", t.bubble_s);
    CHECK(close_to(t.bubble_s, t.compute_s * 3 / 8), "%.15g", t.bubble_s);
    CHECK(close_to(t.total_s, t.compute_s + t.tp_s + t.pp_s + t.bubble_s + t.dp_s), "sum");
    plan_free(p);
}

/* Full recompute adds one forward of the layers (not the LM head): 2·84,934,656
 * + 4·12·1024·768 = 169,869,312 + 37,748,736 = 207,618,048 per token; ×4096 =
 * 850,403,524,608; total 4,351,070,306,304 FLOPs, 0.04351070306304 s.
 * Selective adds the attention core's forward only: 37,748,736·4096 =
 * 154,618,822,656; 3,655,285,604,352 FLOPs, 0.03655285604352 s. */
static void test_step_time_recompute_adds_forward_work(void)
{
    static const struct {
        const char *recompute;
        double compute_s;
    } cases[] = {{"full", 0.04351070306304}, {"selective", 0.03655285604352}};
    for (int i = 0; i < 2; i++) {
        struct plan *p = load_plan(gpt2_124m, 4, 1, "bf16", cases[i].recompute);
        if (!p) return;
        struct cost_time t;
        cost_step_time(p, (struct cost_layout){1, 1, 1}, &fast_links, &t);
        CHECK(close_to(t.compute_s, cases[i].compute_s), "%s %.15g", cases[i].recompute,
              t.compute_s);
        plan_free(p);
    }
}

static void test_more_bandwidth_is_never_slower(void)
{
    struct plan *p = load_plan(gpt2_124m, 4, 4, "bf16", "none");
    if (!p) return;
    struct cost_layout l = {2, 2, 2};
    for (int zero = 0; zero <= 3; zero += 3) {
        p->parallel.zero = zero;
        for (int which = 0; which < 4; which++) {
            double prev = HUGE_VAL;
            for (double rate = 0.5; rate < 1e5; rate *= 3) {
                struct cost_links links = fast_links;
                double *knob[4] = {&links.tp_gbps, &links.pp_gbps, &links.dp_gbps,
                                   &links.device_tflops};
                *knob[which] = rate;
                struct cost_time t;
                cost_step_time(p, l, &links, &t);
                CHECK(t.total_s <= prev, "zero %d knob %d rate %g: %.9g > %.9g", zero, which, rate,
                      t.total_s, prev);
                CHECK(t.total_s > 0 && isfinite(t.total_s), "%.9g", t.total_s);
                prev = t.total_s;
            }
        }
    }
    plan_free(p);
}

static void test_zero_bandwidth_with_traffic_takes_forever(void)
{
    struct plan *p = load_plan(gpt2_124m, 4, 4, "bf16", "none");
    if (!p) return;
    struct cost_time t;
    struct cost_links links = fast_links;
    links.tp_gbps = 0;
    cost_step_time(p, (struct cost_layout){2, 1, 1}, &links, &t);
    CHECK(t.tp_s == HUGE_VAL && t.total_s == HUGE_VAL, "%g %g", t.tp_s, t.total_s);
    /* no tp traffic: no link needed */
    cost_step_time(p, (struct cost_layout){1, 2, 2}, &links, &t);
    CHECK(t.tp_s == 0 && isfinite(t.total_s), "%g %g", t.tp_s, t.total_s);

    links = fast_links;
    links.dp_gbps = 0;
    cost_step_time(p, (struct cost_layout){1, 1, 2}, &links, &t);
    CHECK(t.dp_s == HUGE_VAL && t.total_s == HUGE_VAL, "%g %g", t.dp_s, t.total_s);

    links = fast_links;
    links.device_tflops = 0; /* unknown device: compute, bubble infinite, nothing NaN */
    cost_step_time(p, (struct cost_layout){2, 2, 2}, &links, &t);
    CHECK(t.compute_s == HUGE_VAL && t.bubble_s == HUGE_VAL && t.total_s == HUGE_VAL, "%g %g %g",
          t.compute_s, t.bubble_s, t.total_s);
    CHECK(!isnan(t.dp_s) && !isnan(t.total_s), "%g", t.dp_s);
    plan_free(p);
}

static void test_link_names(void)
{
    CHECK(strcmp(cost_link_name(COST_LINK_NONE), "none") == 0, "none");
    CHECK(strcmp(cost_link_name(COST_LINK_NVLINK), "NVLink") == 0, "NVLink");
    CHECK(strcmp(cost_link_name(COST_LINK_MEMORY), "memory") == 0, "memory");
    CHECK(strcmp(cost_link_name(COST_LINK_PCIE), "PCIe") == 0, "PCIe");
    CHECK(strcmp(cost_link_name(COST_LINK_NETWORK), "network") == 0, "network");
    CHECK(strcmp(cost_link_name(COST_LINKS), "unknown") == 0, "out of range");
}

/* A GPU's memory bandwidth adds AdamW's pass: GPT-2 124M, bf16, one rank holds params
 * 124,475,904·6 = 746,855,424 bytes (fp32 and bf16), grads ·4 = 497,903,616, moments ·8 =
 * 995,807,232; 2·(746,855,424 + 995,807,232) + 497,903,616 = 3,983,228,928 bytes, at
 * 3,350 GB/s 0.00118902356059701 s. Without a bandwidth (CPU ranks) nothing is added. */
static void test_optimizer_pass_at_memory_bandwidth(void)
{
    struct plan *p = load_plan(gpt2_124m, 4, 1, "bf16", "none");
    if (!p) return;
    struct cost_links gpu = fast_links;
    gpu.device_memory_gbps = 3350;
    struct cost_time t, cpu;
    cost_step_time(p, (struct cost_layout){1, 1, 1}, &gpu, &t);
    cost_step_time(p, (struct cost_layout){1, 1, 1}, &fast_links, &cpu);
    CHECK(close_to(t.optimizer_s, 3983228928.0 / 3350e9), "%.15g", t.optimizer_s);
    CHECK(close_to(t.total_s, t.compute_s + t.optimizer_s), "%.15g", t.total_s);
    CHECK(cpu.optimizer_s == 0 && cpu.total_s == cpu.compute_s, "%.15g", cpu.optimizer_s);
    plan_free(p);
}

/* ---- a GPU rank's offloaded step --------------------------------------------------------- */

/* The offloaded step's time, GPT-2 124M, bf16, one GPU rank (S = P = 124,475,904): the
 * gradient down and the weights up, 8S = 995,807,232 bytes at 25 GB/s, 0.03983228928 s,
 * and the CPU's pass, 28S = 3,485,325,312 bytes at 50 GB/s, 0.06970650624 s: 0.10953879552
 * s beside the device's pass, now without the moments, 2·(746,855,424 + 0) + 497,903,616 =
 * 1,991,614,464 bytes at 3,350 GB/s (test_optimizer_pass_at_memory_bandwidth). Without
 * offload, or on CPU ranks, no host step. */
static void test_gpu_offload_models_the_step_on_the_cpu(void)
{
    struct plan *p = load_plan(gpt2_124m, 4, 1, "bf16", "none");
    if (!p) return;
    struct cost_links gpu = fast_links;
    gpu.device_memory_gbps = 3350;
    struct cost_layout l = {1, 1, 1};
    p->parallel.device = PLAN_DEVICE_CUDA;
    p->parallel.offload = PLAN_OFFLOAD_HOST;
    struct cost_time t, cpu;
    cost_step_time(p, l, &gpu, &t);
    CHECK(close_to(t.host_step_s, 0.10953879552), "%.15g", t.host_step_s);
    CHECK(close_to(t.optimizer_s, 1991614464.0 / 3350e9 + 0.10953879552), "%.15g", t.optimizer_s);
    CHECK(close_to(t.total_s, t.compute_s + t.optimizer_s), "%.15g", t.total_s);
    p->parallel.device = PLAN_DEVICE_CPU;
    cost_step_time(p, l, &gpu, &cpu);
    CHECK(cpu.host_step_s == 0 && close_to(cpu.optimizer_s, 3983228928.0 / 3350e9), "%.15g",
          cpu.optimizer_s);
    plan_free(p);
}

/* ---- a measured CPU's terms ------------------------------------------------------------ */

/* A model small enough to count by hand: 2 layers, C = 8, 2 heads, V = Vp = 16,
 * T = maxT = 4, micro-batch 2, one micro-batch a step: 8 tokens, fp32. */
static struct plan *tiny_plan(void)
{
    const char *text = "{\"model\": {\"layers\": 2, \"heads\": 2, \"hidden\": 8, \"vocab\": 16, "
                       "\"padded_vocab\": 16, \"seq_len\": 4, \"max_seq_len\": 4},\n"
                       " \"data\": {\"train\": \"train.bin\"}, \"batch\": {\"micro_batch\": 2},\n"
                       " \"steps\": 10}\n";
    struct plait_error err = {0};
    struct plan *p = plan_load_text(text, "test_cost", "/", NULL, 0, &err);
    CHECK(p != NULL, "plan_load_text: %s", err.text);
    return p;
}

/* The tiny model on one CPU rank, its machine measured. Products: 6·(12·C²·L
 * + Vp·C) = 6·(1,536 + 128) = 9,984 FLOPs a token, 79,872 a step, at 1 MFLOP/s
 * 0.079872 s; attention 12·T·C·L = 768 a token, 6,144 a step, at 0.5 MFLOP/s
 * 0.012288 s: compute 0.09216 s. Memory-bound values a token: each layer
 * 18·C + 20·C/t = 304 (2 LayerNorms 2C + 4C each, 2 adds 3C each, GELU 5
 * values an element of 4C), ×2 = 608; the embedding 8·C = 64; the final
 * LayerNorm 6·C = 48 and the cross-entropy 4·Vp = 64: 784 values, ×4 bytes ×8
 * tokens = 25,088 bytes, at 1 MB/s 0.025088 s. Parameters: wte 128 + wpe 32 +
 * 2·(12·64 + 13·8) + 2·8 = 1,920; AdamW 2·(4 + 8)·1,920 + 4·1,920 = 53,760
 * bytes and the gradient norm's read 4·1,920 = 7,680: 0.06144 s at 1 MB/s.
 * tp 2 (h/t = 4, LayerNorms and adds whole on each rank): 2·(144 + 80) + 64 +
 * 48 + 4·8 = 592 values, 18,944 bytes, 0.018944 s. Without the CPU's rates
 * (a GPU, an unmeasured CPU) none of this is added. */
static void test_cpu_rank_counts_attention_and_memory_bound_ops_apart(void)
{
    struct plan *p = tiny_plan();
    if (!p) return;
    struct cost_links cpu = {.device_tflops = 1e-6,
                             .attention_tflops = 5e-7,
                             .activation_gbps = 1e-3,
                             .device_memory_gbps = 1e-3};
    struct cost_time t;
    cost_step_time(p, (struct cost_layout){1, 1, 1}, &cpu, &t);
    CHECK(stage_params(p, (struct cost_layout){1, 1, 1}, 0) == 1920, "parameters");
    CHECK(close_to(t.compute_s, 0.09216), "%.15g", t.compute_s);
    CHECK(close_to(t.memory_s, 0.025088), "%.15g", t.memory_s);
    CHECK(close_to(t.optimizer_s, 0.06144), "%.15g", t.optimizer_s);
    CHECK(close_to(t.total_s, 0.09216 + 0.025088 + 0.06144), "%.15g", t.total_s);
    cost_step_time(p, (struct cost_layout){2, 1, 1}, &cpu, &t);
    CHECK(close_to(t.memory_s, 0.018944), "%.15g", t.memory_s);

    struct cost_links plain = {.device_tflops = 1e-6, .device_memory_gbps = 1e-3};
    cost_step_time(p, (struct cost_layout){1, 1, 1}, &plain, &t);
    CHECK(close_to(t.compute_s, (79872.0 + 6144.0) / 1e6), "%.15g", t.compute_s);
    CHECK(t.memory_s == 0 && close_to(t.optimizer_s, 0.05376), "%.15g %.15g", t.memory_s,
          t.optimizer_s);
    plan_free(p);
}

/* The tiny model's parallel starts (a CPU's ops, each an OpenMP region): per
 * micro-batch 2 layers × (14 forward + 18 backward) + the head's 7 + the
 * embedding's 2 = 73; per step 2 × 28 parameter tensors (12 a layer, wte, wpe,
 * the final LayerNorm's 2) = 56: 129, at 1 ms 0.129 s. grad_accum 3: 73·3 +
 * 56 = 275. Full recompute: 14 more a layer, 101 + 56 = 157. */
static void test_cpu_rank_counts_its_parallel_ops(void)
{
    struct plan *p = tiny_plan();
    if (!p) return;
    struct cost_links cpu = {.device_tflops = 1e-6, .parallel_op_s = 1e-3};
    struct cost_time t;
    cost_step_time(p, (struct cost_layout){1, 1, 1}, &cpu, &t);
    CHECK(close_to(t.parallel_s, 0.129), "%.15g", t.parallel_s);
    CHECK(close_to(t.total_s, t.compute_s + 0.129), "%.15g", t.total_s);
    p->batch.grad_accum = 3;
    cost_step_time(p, (struct cost_layout){1, 1, 1}, &cpu, &t);
    CHECK(close_to(t.parallel_s, 0.275), "%.15g", t.parallel_s);
    p->batch.grad_accum = 1;
    p->recompute = PLAN_RECOMPUTE_FULL;
    cost_step_time(p, (struct cost_layout){1, 1, 1}, &cpu, &t);
    CHECK(close_to(t.parallel_s, 0.157), "%.15g", t.parallel_s);
    plan_free(p);
}

/* The pipeline's bubble idles the memory-bound ops too: pp 2, m 1:
 * the slowest stage's work (compute + memory) times (pp − 1)/m. */
static void test_cpu_bubble_counts_the_memory_bound_ops(void)
{
    struct plan *p = tiny_plan();
    if (!p) return;
    struct cost_links cpu = {.device_tflops = 1e-6,
                             .attention_tflops = 5e-7,
                             .activation_gbps = 1e-3,
                             .tp_gbps = 1,
                             .pp_gbps = 1,
                             .dp_gbps = 1};
    struct cost_time t;
    cost_step_time(p, (struct cost_layout){1, 2, 1}, &cpu, &t);
    CHECK(t.memory_s > 0 && close_to(t.bubble_s, t.compute_s + t.memory_s), "%.15g %.15g %.15g",
          t.bubble_s, t.compute_s, t.memory_s);
    cpu.parallel_op_s = 1e-3; /* and the parallel starts */
    cost_step_time(p, (struct cost_layout){1, 2, 1}, &cpu, &t);
    CHECK(t.parallel_s > 0 && close_to(t.bubble_s, t.compute_s + t.memory_s + t.parallel_s),
          "%.15g %.15g", t.bubble_s, t.parallel_s);
    plan_free(p);
}

/* A CPU rank gets its node's hardware threads over the node's ranks (a share
 * below one when ranks share cores), at most its OpenMP threads; its rates
 * are the measured ones per CPU times that. */
static void test_cpu_rank_rates_divide_the_node_cpus(void)
{
    struct topo_core cores[3] = {{.n_pus = 2}, {.n_pus = 2}, {.n_pus = 2}};
    struct topo t = {.cores = cores, .n_cores = 3};
    struct place_node node = {.name = "n", .topo = &t, .slots = 12, .cpu_ranks = true};
    struct place_rank ranks[12] = {{0}};
    struct rank_map m = {.world = 4, .n_nodes = 1, .ranks = ranks};
    CHECK(layout_cpus_per_rank(&m, &node, 0) == 1.5, "%g", layout_cpus_per_rank(&m, &node, 0));
    CHECK(layout_cpus_per_rank(&m, &node, 1) == 1, "%g", layout_cpus_per_rank(&m, &node, 1));
    m.world = 12;
    CHECK(layout_cpus_per_rank(&m, &node, 8) == 0.5, "%g", layout_cpus_per_rank(&m, &node, 8));

    struct cost_cpu_rates per_cpu = {.matmul_gflops = 100,
                                     .attention_gflops = 50,
                                     .activation_gbps = 10,
                                     .memory_gbps = 20,
                                     .parallel_op_us = 30};
    struct cost_links l = {.device_tflops = 7};
    layout_cpu_rank_links(&per_cpu, 1.5, false, &l);
    CHECK(close_to(l.device_tflops, 0.15) && close_to(l.attention_tflops, 0.075) &&
              close_to(l.activation_gbps, 15) && close_to(l.device_memory_gbps, 30),
          "%g %g %g %g", l.device_tflops, l.attention_tflops, l.activation_gbps,
          l.device_memory_gbps);
    CHECK(close_to(l.parallel_op_s, 30e-6), "%g: a rank's, not per CPU", l.parallel_op_s);
    l.device_tflops = 7; /* --device-tflops given: it stands */
    layout_cpu_rank_links(&per_cpu, 1.5, true, &l);
    CHECK(l.device_tflops == 7, "%g", l.device_tflops);
}

/* The calibration (layout.c): GPT-2 124M on one H100 80GB SXM (known by its PCI id)
 * models plait's own step within 25% of what make gpu-check measured on one
 * (2026-11-26): bf16 at 230,065 tokens/s at 16×1024 and 242,716 at 32×1024, fp8
 * (tensor scaling) at 148,215 at 16×1024. */
static void test_gpt2_124m_on_h100_models_plaits_measured_step(void)
{
    struct topo_gpu h100 = {.spec = gpu_spec_by_pci(0x10de, 0x2330)};
    struct topo node = {.gpus = &h100, .n_gpus = 1};
    CHECK(h100.spec, "H100 SXM5 in the table");
    const struct {
        int micro_batch;
        const char *precision;
        double tokens_per_s;
    } anchors[] = {{16, "bf16", 230065}, {32, "bf16", 242716}, {16, "fp8", 148215}};
    for (size_t k = 0; k < 3 && h100.spec; k++) {
        struct plan *p =
            load_plan(gpt2_124m, anchors[k].micro_batch, 1, anchors[k].precision, "none");
        if (!p) return;
        struct cost_links links = {.device_tflops = layout_device_tflops(&node, p->precision),
                                   .device_memory_gbps = layout_device_memory_gbps(&node)};
        struct cost_time t;
        cost_step_time(p, (struct cost_layout){1, 1, 1}, &links, &t);
        double measured_s = anchors[k].micro_batch * 1024 / anchors[k].tokens_per_s;
        double ratio = t.total_s / measured_s;
        CHECK(ratio > 0.75 && ratio < 1.25, "%s %d×1024: modelled %.4f s, measured %.4f s (%.2f)",
              anchors[k].precision, anchors[k].micro_batch, t.total_s, measured_s, ratio);
        plan_free(p);
    }
}

int main(void)
{
    RUN(test_traffic_tp2_pp2_dp2_by_zero_stage);
    RUN(test_traffic_middle_pipeline_stage_sends_both_ways);
    RUN(test_traffic_of_chunked_pipelines);
    RUN(test_traffic_tp_ring_factor_and_full_recompute);
    RUN(test_step_time_compute_and_dp_overlap);
    RUN(test_step_time_bubble_is_pp_minus_1_over_m_of_compute);
    RUN(test_step_time_recompute_adds_forward_work);
    RUN(test_more_bandwidth_is_never_slower);
    RUN(test_zero_bandwidth_with_traffic_takes_forever);
    RUN(test_link_names);
    RUN(test_optimizer_pass_at_memory_bandwidth);
    RUN(test_gpu_offload_models_the_step_on_the_cpu);
    RUN(test_cpu_rank_counts_attention_and_memory_bound_ops_apart);
    RUN(test_cpu_rank_counts_its_parallel_ops);
    RUN(test_cpu_bubble_counts_the_memory_bound_ops);
    RUN(test_cpu_rank_rates_divide_the_node_cpus);
    RUN(test_gpt2_124m_on_h100_models_plaits_measured_step);
    RUN(test_cp_ring_traffic_and_the_ranks_share_of_the_step);
    return check_exit_code();
}
