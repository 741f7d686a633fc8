/* test_cost.c — the cost model against numbers worked out by hand (each in a
 * comment beside it): GPT-2 124M parameter shards, the ZeRO paper's 7.5B
 * example, 16 bytes per parameter, Korthikanti activations without dropout,
 * pipeline in-flight micro-batches, tp/pp/dp traffic and step time. Plans come
 * from JSON text; the layout is passed separately, ZeRO set on the struct. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "common/cost.h"
#include "common/llmc.h" // llmc_param_count
#include "common/plan.h"
#include "tests/unit/check.h"

/* ---- plans ------------------------------------------------------------------------------- */

struct model_dims {
    int layers, heads, hidden, vocab, seq_len;
};

/* GPT-2 124M as llm.c trains it: Vp = 50304 (50257 rounded up to 128), maxT = T = 1024. */
static const struct model_dims gpt2_124m = {12, 12, 768, 50257, 1024};
/* A 7B-like model (LLaMA-7B's shape on the GPT-2 layout): V = Vp = 32000, maxT = T = 4096. */
static const struct model_dims model_7b = {32, 32, 4096, 32000, 4096};

static struct plan *load_plan(struct model_dims d, int micro_batch, int grad_accum,
                              const char *precision, const char *recompute)
{
    char text[1024];
    snprintf(text, sizeof text,
             "{\"model\": {\"layers\": %d, \"heads\": %d, \"hidden\": %d, \"vocab\": %d, "
             "\"seq_len\": %d},\n"
             " \"data\": {\"train\": \"train.bin\"},\n"
             " \"batch\": {\"micro_batch\": %d, \"grad_accum\": %d},\n"
             " \"precision\": \"%s\", \"recompute\": \"%s\",\n"
             " \"steps\": 10}\n",
             d.layers, d.heads, d.hidden, d.vocab, d.seq_len, micro_batch, grad_accum, precision,
             recompute);
    struct plait_error err = {{0}};
    struct plan *p = plan_load_text(text, "test_cost", "/", NULL, 0, &err);
    CHECK(p != NULL, "plan_load_text: %s", err.text);
    return p;
}

static int64_t stage_params(const struct plan *p, struct cost_layout l, int stage)
{
    struct cost_memory m;
    cost_memory_stage(p, l, stage, &m);
    return m.param_count;
}

static int close_to(double got, double want)
{
    return fabs(got - want) <= 1e-12 * fabs(want);
}

/* ---- parameter shards -------------------------------------------------------------------- */

/* C = 768: wte 50304·768 = 38,633,472; wpe 1024·768 = 786,432;
 * per layer 12C² + 13C = 7,077,888 + 9,984 = 7,087,872, × 12 = 85,054,464;
 * final LN 2C = 1,536. Sum 124,475,904 (llm.c's count with the padded vocab). */
static void test_gpt2_124m_counts_llmc_parameters(void)
{
    struct plan *p = load_plan(gpt2_124m, 4, 1, "fp32", "none");
    if (!p) return;
    CHECK(p->model.padded_vocab == 50304, "Vp %d", p->model.padded_vocab);
    struct cost_layout l = {1, 1, 1};
    int64_t n = stage_params(p, l, 0);
    CHECK(n == 124475904, "%lld", (long long)n);
    CHECK(n == llmc_param_count(1024, 50304, 12, 768), "%lld", (long long)n);
    plan_free(p);
}

/* tp = 2, per layer: qkv W 3·768·768/2 = 884,736, b 3·768/2 = 1,152; proj W
 * 768·768/2 = 294,912, b 768 (replicated); fc W 4·768·768/2 = 1,179,648, b
 * 4·768/2 = 1,536; fc proj W 1,179,648, b 768 (replicated); ln1 + ln2 3,072
 * (replicated): 3,546,240 (= 12C²/2 + 7C/2 + 6C), × 12 = 42,554,880.
 * wte/2 = 25,152·768 = 19,316,736; wpe 786,432 and final LN 1,536 replicated.
 * Sum 62,659,584. */
static void test_tp2_shards_matmuls_and_vocab_not_layernorms(void)
{
    struct plan *p = load_plan(gpt2_124m, 4, 1, "fp32", "none");
    if (!p) return;
    int64_t n = stage_params(p, (struct cost_layout){2, 1, 1}, 0);
    CHECK(n == 62659584, "%lld", (long long)n);
    plan_free(p);
}

/* pp = 2, 6 layers each = 42,527,232.
 * stage 0: wte 38,633,472 + wpe 786,432 + 42,527,232 = 81,947,136;
 * stage 1: 42,527,232 + final LN 1,536 + its wte copy 38,633,472 = 81,162,240. */
static void test_pp2_last_stage_holds_its_own_wte_for_the_head(void)
{
    struct plan *p = load_plan(gpt2_124m, 4, 1, "fp32", "none");
    if (!p) return;
    struct cost_layout l = {1, 2, 1};
    CHECK(stage_params(p, l, 0) == 81947136, "%lld", (long long)stage_params(p, l, 0));
    CHECK(stage_params(p, l, 1) == 81162240, "%lld", (long long)stage_params(p, l, 1));
    plan_free(p);
}

/* pp = 5 over 12 layers: 12 = 5·2 + 2, so stages 0 and 1 get 3 layers, 2..4 get 2.
 * stage 0: 38,633,472 + 786,432 + 3·7,087,872 = 60,683,520;
 * stage 1: 21,263,616; stage 2: 2·7,087,872 = 14,175,744;
 * stage 4: 14,175,744 + 1,536 + 38,633,472 = 52,810,752. */
static void test_uneven_pp_gives_first_stages_one_more_layer(void)
{
    struct plan *p = load_plan(gpt2_124m, 4, 1, "fp32", "none");
    if (!p) return;
    struct cost_layout l = {1, 5, 1};
    CHECK(stage_params(p, l, 0) == 60683520, "%lld", (long long)stage_params(p, l, 0));
    CHECK(stage_params(p, l, 1) == 21263616, "%lld", (long long)stage_params(p, l, 1));
    CHECK(stage_params(p, l, 2) == 14175744, "%lld", (long long)stage_params(p, l, 2));
    CHECK(stage_params(p, l, 4) == 52810752, "%lld", (long long)stage_params(p, l, 4));
    struct cost_memory m;
    cost_memory_stage(p, l, 5, &m); /* no such stage */
    CHECK(m.total == 0 && m.param_count == 0, "%llu", (unsigned long long)m.total);
    plan_free(p);
}

/* ---- model state: 16 bytes per parameter, ZeRO ------------------------------------------- */

/* 7B-like, C = 4096: wte 32000·4096 = 131,072,000; wpe 4096·4096 = 16,777,216;
 * per layer 12·4096² + 13·4096 = 201,326,592 + 53,248 = 201,379,840, × 32 =
 * 6,444,154,880; final LN 8,192. Ψ = 6,592,012,288; 16Ψ = 105,472,196,608.
 * bf16: 2Ψ = 13,184,024,576 params and grads, 12Ψ = 79,104,147,456 optimizer;
 * fp32: 4Ψ = 26,368,049,152 params and grads, 8Ψ = 52,736,098,304 optimizer. */
static void test_7b_model_state_is_16_bytes_per_parameter(void)
{
    const char *precisions[] = {"bf16", "fp32"};
    for (int i = 0; i < 2; i++) {
        struct plan *p = load_plan(model_7b, 1, 1, precisions[i], "none");
        if (!p) return;
        struct cost_memory m;
        cost_memory_stage(p, (struct cost_layout){1, 1, 1}, 0, &m);
        CHECK(m.param_count == 6592012288, "%lld", (long long)m.param_count);
        uint64_t state = m.params + m.grads + m.optimizer;
        CHECK(state == 105472196608ull, "%s: %llu", precisions[i], (unsigned long long)state);
        CHECK(state == 16ull * (uint64_t)m.param_count, "%s", precisions[i]);
        CHECK(m.total == state + m.activations, "%s", precisions[i]);
        if (i == 0)
            CHECK(m.params == 13184024576ull && m.grads == 13184024576ull &&
                      m.optimizer == 79104147456ull,
                  "bf16 %llu %llu %llu", (unsigned long long)m.params, (unsigned long long)m.grads,
                  (unsigned long long)m.optimizer);
        else
            CHECK(m.params == 26368049152ull && m.grads == 26368049152ull &&
                      m.optimizer == 52736098304ull,
                  "fp32 %llu %llu %llu", (unsigned long long)m.params, (unsigned long long)m.grads,
                  (unsigned long long)m.optimizer);
        plan_free(p);
    }
}

/* 7e9 × (2 + 2 + 12) = 1.12e11 bytes = 112 GB before activations. */
static void test_7e9_bf16_parameters_take_112_gb(void)
{
    struct cost_memory m;
    cost_model_state(7000000000, PLAN_PRECISION_BF16, 0, 1, &m);
    CHECK(m.total == 112000000000ull, "%llu", (unsigned long long)m.total);
    CHECK(m.activations == 0 && m.param_count == 7000000000, "%lld", (long long)m.param_count);
    cost_model_state(7000000000, PLAN_PRECISION_FP32, 0, 1, &m);
    CHECK(m.total == 112000000000ull, "fp32 %llu", (unsigned long long)m.total);
}

/* ZeRO paper, Figure 1: Ψ = 7.5B, K = 12, Nd = 64, GB = 1e9.
 *   baseline (2 + 2 + 12)Ψ                 = 120e9           → 120 GB
 *   P_os     (2 + 2)Ψ + 12Ψ/64 = 30e9 + 1.40625e9 = 31.40625e9 → 31.4 GB
 *   P_os+g   2Ψ + (2 + 12)Ψ/64 = 15e9 + 1.640625e9 = 16.640625e9 → 16.6 GB
 *   P_os+g+p 16Ψ/64            = 1.875e9          → 1.9 GB
 * (7.5e9/64 = 117,187,500 exactly, so the byte counts are exact.) */
static void test_zero_stages_reproduce_the_papers_7_5b_example(void)
{
    const uint64_t want_bytes[4] = {120000000000ull, 31406250000ull, 16640625000ull, 1875000000ull};
    const int want_tenths_gb[4] = {1200, 314, 166, 19}; /* the figure's 120, 31.4, 16.6, 1.9 */
    for (int zero = 0; zero <= 3; zero++) {
        struct cost_memory m;
        cost_model_state(7500000000, PLAN_PRECISION_BF16, zero, 64, &m);
        CHECK(m.total == want_bytes[zero], "ZeRO %d: %llu", zero, (unsigned long long)m.total);
        int tenths = (int)lround((double)m.total / 1e8);
        CHECK(tenths == want_tenths_gb[zero], "ZeRO %d: %.1f GB", zero, tenths / 10.0);
    }
}

/* Through a plan: the 7B-like Ψ = 6,592,012,288 = 64 · 103,000,192; ZeRO 3 over
 * dp = 64 keeps 16 · 103,000,192 = 1,648,003,072 bytes of state; param_count
 * stays the tp × pp shard. ZeRO 1 (bf16): 4Ψ + 12·103,000,192 =
 * 26,368,049,152 + 1,236,002,304 = 27,604,051,456. */
static void test_zero_through_a_plan_divides_by_dp(void)
{
    struct plan *p = load_plan(model_7b, 1, 1, "bf16", "none");
    if (!p) return;
    struct cost_layout l = {1, 1, 64};
    struct cost_memory m;
    p->parallel.zero = 3;
    cost_memory_stage(p, l, 0, &m);
    CHECK(m.params + m.grads + m.optimizer == 1648003072ull, "%llu",
          (unsigned long long)(m.params + m.grads + m.optimizer));
    CHECK(m.param_count == 6592012288, "%lld", (long long)m.param_count);
    p->parallel.zero = 1;
    cost_memory_stage(p, l, 0, &m);
    CHECK(m.params + m.grads + m.optimizer == 27604051456ull, "%llu",
          (unsigned long long)(m.params + m.grads + m.optimizer));
    plan_free(p);
}

/* ---- activations ------------------------------------------------------------------------- */

/* GPT-2 124M, b = 4, s = 1024, h = 768, a = 12, m = 1, pp = 1: sb = 4,096,
 * sbh = 3,145,728, as²b = 12·1024²·4 = 50,331,648. Values per layer
 * (no dropout): sb·(4h + 12h/t) + (a/t)·s²·b.
 *   none, t=1: 4096·12288 + 50,331,648 = 100,663,296
 *              (bytes in 16-bit 201,326,592 = sbh·(32 + 2as/h) = 3,145,728·64;
 *               Korthikanti's with dropout would be sbh·(34 + 5·16) = 3,145,728·114)
 *   none, t=4: 4096·(3072 + 2304) + 3·1024²·4 = 22,020,096 + 12,582,912 = 34,603,008
 *              (16-bit: sbh·(8 + 24/4 + 2·12·1024/(768·4)) = 3,145,728·22 = 69,206,016)
 *   selective, t=1: 4096·12288 = 50,331,648;  t=4: 22,020,096
 *   full (any t): sbh = 3,145,728
 * × 2 bytes (bf16) or 4 (fp32), × 12 layers; the last stage adds the final
 * LN's input and output, 2sbh = 6,291,456 values (bf16 12,582,912, fp32
 * 25,165,824 bytes), and fp32 logits b·s·Vp/t·4 = 4096·50304·4 = 824,180,736
 * (t = 1) or 4096·12576·4 = 206,045,184 (t = 4). */
static void test_activations_without_dropout_by_recompute_tp_and_precision(void)
{
    static const struct {
        const char *precision, *recompute;
        int tp;
        uint64_t layer_bytes, lnf_bytes, logits_bytes;
    } cases[] = {
        {"bf16", "none", 1, 201326592, 12582912, 824180736},
        {"bf16", "none", 4, 69206016, 12582912, 206045184},
        {"bf16", "selective", 1, 100663296, 12582912, 824180736},
        {"bf16", "selective", 4, 44040192, 12582912, 206045184},
        {"bf16", "full", 1, 6291456, 12582912, 824180736},
        {"bf16", "full", 4, 6291456, 12582912, 206045184},
        {"fp32", "none", 1, 402653184, 25165824, 824180736},
        {"fp32", "none", 4, 138412032, 25165824, 206045184},
        {"fp32", "selective", 1, 201326592, 25165824, 824180736},
        {"fp32", "selective", 4, 88080384, 25165824, 206045184},
        {"fp32", "full", 1, 12582912, 25165824, 824180736},
        {"fp32", "full", 4, 12582912, 25165824, 206045184},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct plan *p = load_plan(gpt2_124m, 4, 1, cases[i].precision, cases[i].recompute);
        if (!p) return;
        struct cost_memory m;
        cost_memory_stage(p, (struct cost_layout){cases[i].tp, 1, 1}, 0, &m);
        uint64_t want = 12 * cases[i].layer_bytes + cases[i].lnf_bytes + cases[i].logits_bytes;
        CHECK(m.activations == want, "%s %s tp=%d: %llu, want %llu", cases[i].precision,
              cases[i].recompute, cases[i].tp, (unsigned long long)m.activations,
              (unsigned long long)want);
        plan_free(p);
    }
}

/* pp = 4 over 12 layers (3 each), bf16, no recompute, 201,326,592 bytes per
 * layer per micro-batch. 1F1B: stage k holds min(4 − k, m).
 *   m = 8: stage 0 4·3·201,326,592 = 2,415,919,104; stage 1 3·3· = 1,811,939,328;
 *          stage 2 2·3· = 1,207,959,552; stage 3 1·3· = 603,979,776 + final LN
 *          12,582,912 + logits 824,180,736 = 1,440,743,424.
 *   m = 2: stages 0..2 hold 2: 1,207,959,552 each; stage 3 as above.
 * Worst (m = 8) is stage 0: params 38,633,472 + 786,432 + 3·7,087,872 =
 * 60,683,520, × 16 = 970,936,320, + 2,415,919,104 = 3,386,855,424. */
static void test_pipeline_stage_k_holds_min_of_pp_minus_k_and_m_micro_batches(void)
{
    static const uint64_t want_m8[4] = {2415919104ull, 1811939328ull, 1207959552ull, 1440743424ull};
    static const uint64_t want_m2[4] = {1207959552ull, 1207959552ull, 1207959552ull, 1440743424ull};
    struct cost_layout l = {1, 4, 1};
    for (int pass = 0; pass < 2; pass++) {
        struct plan *p = load_plan(gpt2_124m, 4, pass == 0 ? 8 : 2, "bf16", "none");
        if (!p) return;
        const uint64_t *want = pass == 0 ? want_m8 : want_m2;
        for (int k = 0; k < 4; k++) {
            struct cost_memory m;
            cost_memory_stage(p, l, k, &m);
            CHECK(m.activations == want[k], "m=%d stage %d: %llu", p->batch.grad_accum, k,
                  (unsigned long long)m.activations);
        }
        if (pass == 0) {
            struct cost_memory worst;
            int stage = -1;
            cost_memory(p, l, &worst, &stage);
            CHECK(stage == 0, "worst stage %d", stage);
            CHECK(worst.total == 3386855424ull, "%llu", (unsigned long long)worst.total);
        }
        plan_free(p);
    }
}

/* ---- traffic ----------------------------------------------------------------------------- */

/* GPT-2 124M, bf16, b = 4, s = 1024, m = 4, tp = pp = dp = 2. One activation
 * s·b·h·2 bytes = 3,145,728·2 = 6,291,456. Ring factor 2(t−1)/t = 1.
 *   tp: stage 0: 4·6 layers + 1 (embedding) = 25 all-reduces per micro-batch;
 *       stage 1: 24 + 1 (LM head backward) = 25. 25·4·6,291,456 = 629,145,600.
 *   pp: each stage sends one way: 4·6,291,456 = 25,165,824.
 *   dp: Ψ = the larger stage at tp = 2, pp = 2: stage 0 = 19,316,736 +
 *       786,432 + 6·3,546,240 = 41,380,608 (stage 1: 40,595,712).
 *       ZeRO 0/1: 2·(1/2)·Ψ·2 = 82,761,216; ZeRO 2: (1/2)Ψ·2 + (1/2)Ψ·2 =
 *       82,761,216; ZeRO 3: 3·(1/2)·Ψ·2 = 124,141,824. */
static void test_traffic_tp2_pp2_dp2_by_zero_stage(void)
{
    struct plan *p = load_plan(gpt2_124m, 4, 4, "bf16", "none");
    if (!p) return;
    struct cost_layout l = {2, 2, 2};
    static const double want_dp[4] = {82761216, 82761216, 82761216, 124141824};
    for (int zero = 0; zero <= 3; zero++) {
        p->parallel.zero = zero;
        struct cost_traffic t;
        cost_traffic(p, l, &t);
        CHECK(t.tp_bytes == 629145600, "ZeRO %d tp %.0f", zero, t.tp_bytes);
        CHECK(t.pp_bytes == 25165824, "ZeRO %d pp %.0f", zero, t.pp_bytes);
        CHECK(t.dp_bytes == want_dp[zero], "ZeRO %d dp %.0f", zero, t.dp_bytes);
    }
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

/* pp = 4, m = 8: the last stage is the slowest: 3 layers 3·12·768² =
 * 21,233,664 + LM head 38,633,472 = 59,867,136 weights, ×6 = 359,202,816, +
 * attention 3·12·1024·768 = 28,311,552: 387,514,368 FLOPs per token × 4·1024·8
 * = 32,768 tokens = 12,698,070,810,624; 0.12698070810624 s at 100 TFLOP/s.
 * Bubble (pp−1)/m = 3/8 of it: 0.04761776553984 s. */
static void test_step_time_bubble_is_pp_minus_1_over_m_of_compute(void)
{
    struct plan *p = load_plan(gpt2_124m, 4, 8, "bf16", "none");
    if (!p) return;
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

int main(void)
{
    RUN(test_gpt2_124m_counts_llmc_parameters);
    RUN(test_tp2_shards_matmuls_and_vocab_not_layernorms);
    RUN(test_pp2_last_stage_holds_its_own_wte_for_the_head);
    RUN(test_uneven_pp_gives_first_stages_one_more_layer);
    RUN(test_7b_model_state_is_16_bytes_per_parameter);
    RUN(test_7e9_bf16_parameters_take_112_gb);
    RUN(test_zero_stages_reproduce_the_papers_7_5b_example);
    RUN(test_zero_through_a_plan_divides_by_dp);
    RUN(test_activations_without_dropout_by_recompute_tp_and_precision);
    RUN(test_pipeline_stage_k_holds_min_of_pp_minus_k_and_m_micro_batches);
    RUN(test_traffic_tp2_pp2_dp2_by_zero_stage);
    RUN(test_traffic_middle_pipeline_stage_sends_both_ways);
    RUN(test_traffic_tp_ring_factor_and_full_recompute);
    RUN(test_step_time_compute_and_dp_overlap);
    RUN(test_step_time_bubble_is_pp_minus_1_over_m_of_compute);
    RUN(test_step_time_recompute_adds_forward_work);
    RUN(test_more_bandwidth_is_never_slower);
    RUN(test_zero_bandwidth_with_traffic_takes_forever);
    RUN(test_link_names);
    return check_exit_code();
}
