/* test_cost.c — the cost model's memory against numbers worked out by hand (each in a
 * comment beside it): GPT-2 124M parameter shards, the runtime's 18 bytes per parameter
 * in bf16 (16 in fp32), ZeRO slices and padding, fp32 activations by recompute policy,
 * pipeline in-flight micro-batches by schedule and the default split, context
 * parallelism's slices over dp·cp, a GPU rank's offloaded AdamW step's host memory and
 * the fit advice that proposes it. test_cost_step.c has the traffic and step time,
 * test_cost_moe.c expert parallelism's. Plans come from JSON text (cost_plans.h); the
 * layout is passed separately, ZeRO set on the struct. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "common/formats/llmc.h" // llmc_param_count
#include "common/place/cost.h"
#include "common/place/layout.h" // layout_memory_with, layout_fit_advice
#include "common/plan/plan.h"
#include "tests/unit/check.h"
#include "tests/unit/cost_plans.h" // gpt2_124m, load_plan, even_split, stage_params

/* A 7B-like model (LLaMA-7B's shape on the GPT-2 layout): V = Vp = 32000, maxT = T = 4096. */
static const struct model_dims model_7b = {32, 32, 4096, 32000, 4096};

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
    even_split(p, 2);
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
    even_split(p, 5);
    CHECK(stage_params(p, l, 0) == 60683520, "%lld", (long long)stage_params(p, l, 0));
    CHECK(stage_params(p, l, 1) == 21263616, "%lld", (long long)stage_params(p, l, 1));
    CHECK(stage_params(p, l, 2) == 14175744, "%lld", (long long)stage_params(p, l, 2));
    CHECK(stage_params(p, l, 4) == 52810752, "%lld", (long long)stage_params(p, l, 4));
    struct cost_memory m;
    cost_memory_stage(p, l, 5, &m); /* no such stage */
    CHECK(m.total == 0 && m.param_count == 0, "%llu", (unsigned long long)m.total);
    plan_free(p);
}

/* ---- model state: what the runtime allocates, ZeRO --------------------------------------- */

/* 7B-like, C = 4096: wte 32000·4096 = 131,072,000; wpe 4096·4096 = 16,777,216;
 * per layer 12·4096² + 13·4096 = 201,326,592 + 53,248 = 201,379,840, × 32 =
 * 6,444,154,880; final LN 8,192. Ψ = 6,592,012,288.
 * The runtime keeps fp32 weights, gradients and both AdamW moments (16 bytes
 * per parameter) and, in bf16, a 2-byte copy of the weights: 18 bytes.
 * bf16: params 6Ψ = 39,552,073,728, grads 4Ψ = 26,368,049,152, optimizer 8Ψ =
 * 52,736,098,304; 18Ψ = 118,656,221,184. fp32: params 4Ψ = 26,368,049,152,
 * 16Ψ = 105,472,196,608. */
static void test_7b_model_state_is_18_bytes_per_parameter_in_bf16_16_in_fp32(void)
{
    const char *precisions[] = {"bf16", "fp32"};
    const uint64_t want_params[] = {39552073728ull, 26368049152ull};
    const uint64_t want_state[] = {118656221184ull, 105472196608ull};
    for (int i = 0; i < 2; i++) {
        struct plan *p = load_plan(model_7b, 1, 1, precisions[i], "none");
        if (!p) return;
        struct cost_memory m;
        cost_memory_stage(p, (struct cost_layout){1, 1, 1}, 0, &m);
        CHECK(m.param_count == 6592012288, "%lld", (long long)m.param_count);
        uint64_t state = m.params + m.grads + m.optimizer;
        CHECK(state == want_state[i], "%s: %llu", precisions[i], (unsigned long long)state);
        CHECK(m.params == want_params[i] && m.grads == 26368049152ull &&
                  m.optimizer == 52736098304ull,
              "%s %llu %llu %llu", precisions[i], (unsigned long long)m.params,
              (unsigned long long)m.grads, (unsigned long long)m.optimizer);
        CHECK(m.total == state + m.activations, "%s", precisions[i]);
        plan_free(p);
    }
}

/* The same 7B over dp = 64, bf16: Ψ = 64 · 103,000,192, so S = 103,000,192.
 *   ZeRO 0: 18Ψ = 118,656,221,184 (dp changes nothing)
 *   ZeRO 1 and 2 (the runtime keeps the whole gradient buffer for backward to
 *   write into at both): params 6Ψ = 39,552,073,728; grads 4Ψ + 4S (the
 *   slice's reduced gradient) = 26,368,049,152 + 412,000,768 = 26,780,049,920;
 *   optimizer 8S moments + 4S staging = 12S = 1,236,002,304; sum 67,568,125,952
 *   ZeRO 3: the slice's weights with their bf16 copy (the layers are gathered
 *   from it in bf16), gradient and moments, 6S + 4S + 8S = 18S =
 *   1,854,003,456, and the windows the units are gathered into, 10 bytes an
 *   element (fp32 weights, their bf16 copy, their gradient): the embeddings'
 *   unit (wte 32000·4096 + wpe 4096·4096 = 147,849,216), the last (lnf, 8192;
 *   no padding: 64 divides Ψ) and two layers (12C² + 13C = 201,379,840 each),
 *   550,617,088 elements, 5,506,170,880 bytes; and each gradient window's
 *   staging, 4 bytes for each of min(window, S) elements: 3S + 8192 =
 *   309,008,768 elements, 1,236,035,072 bytes; sum 8,596,209,408 (the windows
 *   dominate at dp 64: a layer is 1/32 of Ψ)
 * param_count stays the tp × pp shard. */
static void test_zero_slices_the_optimizer_state_over_dp(void)
{
    const uint64_t want[4] = {118656221184ull, 67568125952ull, 67568125952ull, 8596209408ull};
    struct plan *p = load_plan(model_7b, 1, 1, "bf16", "none");
    if (!p) return;
    for (int zero = 0; zero <= 3; zero++) {
        p->parallel.zero = zero;
        struct cost_memory m;
        cost_memory_stage(p, (struct cost_layout){1, 1, 64}, 0, &m);
        uint64_t state = m.params + m.grads + m.optimizer;
        CHECK(state == want[zero], "ZeRO %d: %llu", zero, (unsigned long long)state);
        CHECK(m.param_count == 6592012288, "%lld", (long long)m.param_count);
        if (zero == 1)
            CHECK(m.params == 39552073728ull && m.grads == 26780049920ull &&
                      m.optimizer == 1236002304ull,
                  "%llu %llu %llu", (unsigned long long)m.params, (unsigned long long)m.grads,
                  (unsigned long long)m.optimizer);
    }
    plan_free(p);
}

/* The same 7B at ZeRO 3 over dp 64 with the units kept gathered until the
 * step's end (parallel.reshard_after_forward false): a parameter window for
 * every unit, the embeddings' 147,849,216 + the last 8,192 + 32 layers of
 * 201,379,840 = 6,592,012,288 elements (Ψ: every unit at once), 6 bytes each
 * (fp32, bf16 copy) = 39,552,073,728; the gradient windows stay four,
 * 4 · 550,617,088 = 2,202,468,352, with their staging 1,236,035,072; the
 * slices 18S = 1,854,003,456 (the weights' with their bf16 copy 6S); sum
 * 44,844,580,608. */
static void test_zero3_kept_gathered_holds_a_window_for_every_unit(void)
{
    struct plan *p = load_plan(model_7b, 1, 1, "bf16", "none");
    if (!p) return;
    p->parallel.zero = 3;
    p->parallel.reshard_after_forward = false;
    struct cost_memory m;
    cost_memory_stage(p, (struct cost_layout){1, 1, 64}, 0, &m);
    CHECK(m.params == 1648003072ull / 16 * 6 + 39552073728ull &&
              m.grads == 1648003072ull / 4 + 2202468352ull + 1236035072ull &&
              m.params + m.grads + m.optimizer == 44844580608ull,
          "%llu %llu %llu", (unsigned long long)m.params, (unsigned long long)m.grads,
          (unsigned long long)m.optimizer);
    plan_free(p);
}

/* GPT-2 124M (P = 124,475,904) over dp = 5: P = 5·24,895,180 + 4, so the
 * buffers are padded to Pp = 124,475,905 and S = 24,895,181. fp32, ZeRO 1:
 * params 4Pp = 497,903,620; grads 4Pp + 4S = 597,484,344; optimizer 12S =
 * 298,742,172. ZeRO 0 keeps the moments of the unpadded P: 8P = 995,807,232
 * (the weights and gradients are padded all the same). */
static void test_zero_pads_the_buffers_to_a_multiple_of_dp(void)
{
    struct plan *p = load_plan(gpt2_124m, 4, 1, "fp32", "none");
    if (!p) return;
    struct cost_memory m;
    p->parallel.zero = 1;
    cost_memory_stage(p, (struct cost_layout){1, 1, 5}, 0, &m);
    CHECK(m.params == 497903620ull && m.grads == 597484344ull && m.optimizer == 298742172ull,
          "%llu %llu %llu", (unsigned long long)m.params, (unsigned long long)m.grads,
          (unsigned long long)m.optimizer);
    p->parallel.zero = 0;
    cost_memory_stage(p, (struct cost_layout){1, 1, 5}, 0, &m);
    CHECK(m.params == 497903620ull && m.grads == 497903620ull && m.optimizer == 995807232ull,
          "%llu %llu %llu", (unsigned long long)m.params, (unsigned long long)m.grads,
          (unsigned long long)m.optimizer);
    plan_free(p);
}

/* ---- activations ------------------------------------------------------------------------- */

/* GPT-2 124M, b = 4, s = 1024: N = 4096 rows, C = 768, a = 12, Vp = 50304; the
 * runtime keeps activations in fp32 (4 bytes each), but in bf16 precision the products'
 * inputs (ln1, ln2, the GeLU output, lnf: gpt2_act16) in bf16, 2 bytes each.
 * Values per layer of a held micro-batch (runtime/model.h struct layer_acts):
 *   ln1, res2, ln2 3NC; their means and rstds 4N; qkv 3NC/t; atty NC/t;
 *   fch 4NC/t: N(3C + 4 + 8C/t)    t=1: 34,619,392  t=4: 15,745,024
 *   att (a/t)·b·s² and GeLU output 4NC/t, kept without recompute only:
 *                                    t=1: 50,331,648 + 12,582,912; t=4: 12,582,912 + 3,145,728
 *   res3 (the layer's output) NC, always: 3,145,728
 * Selective recompute shares one att and GeLU buffer among all layers; full
 * shares everything but res3. Per micro-batch: the input NC, tokens N (first
 * stage), targets N, lnf NC + 2N and logits N·Vp/t (last stage): t=1
 * 3,145,728 + 4,096 + 4,096 + 3,145,728 + 8,192 + 206,045,184 = 212,353,024,
 * t=4 57,819,136. Scratch: proj, dres, dC 3NC; losses N; the vocabulary-
 * parallel loss's 3N (t > 1); d3C 3NC/t; d4C 4NC/t; datt (a/t)·b·s²: t=1
 * 81,793,024, t=4 27,541,504. Bytes: 4·(12·kept + shared + slot + scratch), less in
 * bf16 2 bytes for each value of ln1 and ln2 (2NC a copy), the GeLU output (4NC/t) and
 * lnf (NC), in NC = 3,145,728: without recompute 12 copies of each, t=1 73, t=4 37;
 * selective 12 of ln1 and ln2, one GeLU output: 29 and 26; full one of each: 7 and 4.
 * The logits whole (logits_chunk_mb 0; test_memory.c counts them in chunks). */
static void test_activations_by_recompute_and_tp_the_products_inputs_in_bf16(void)
{
    static const struct {
        const char *recompute;
        int tp;
        uint64_t kept, shared, slot, scratch, in_bf16_nc;
    } cases[] = {
        {"none", 1, 100679680, 0, 212353024, 81793024, 73},
        {"none", 4, 34619392, 0, 57819136, 27541504, 37},
        {"selective", 1, 37765120, 62914560, 212353024, 81793024, 29},
        {"selective", 4, 18890752, 15728640, 57819136, 27541504, 26},
        {"full", 1, 3145728, 97533952, 212353024, 81793024, 7},
        {"full", 4, 3145728, 31473664, 57819136, 27541504, 4},
    };
    const char *precisions[] = {"bf16", "fp32"};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int k = 0; k < 2; k++) {
            struct plan *p = load_plan(gpt2_124m, 4, 1, precisions[k], cases[i].recompute);
            if (!p) return;
            p->logits_chunk_mb = 0;
            struct cost_memory m;
            cost_memory_stage(p, (struct cost_layout){cases[i].tp, 1, 1}, 0, &m);
            uint64_t want =
                4 * (12 * cases[i].kept + cases[i].shared + cases[i].slot + cases[i].scratch) -
                (k == 0 ? 2 * cases[i].in_bf16_nc * 3145728 : 0);
            CHECK(m.activations == want, "%s %s tp=%d: %llu, want %llu", precisions[k],
                  cases[i].recompute, cases[i].tp, (unsigned long long)m.activations,
                  (unsigned long long)want);
            plan_free(p);
        }
}

/* pp = 4 over 12 layers (3 each), no recompute, t = 1: a held micro-batch
 * keeps 3·100,679,680 values of layers plus its stage's per-micro-batch ones:
 * stage 0 3,149,824 (input, tokens), 1 and 2 3,145,728, 3 212,348,928 (input,
 * targets, lnf, logits); scratch 81,793,024. Held at once (schedule.h):
 * 1F1B min(4 − k, m), GPipe m. Bytes 4·(held·(302,039,040 + slot) + scratch),
 * and on stages 0-2 the input gradient the next stage sends back (4·1024·768
 * values: 12,582,912 bytes; the last stage receives none):
 *   1F1B m = 8: 5,222,776,832  4,001,972,224  2,781,233,152  2,384,723,968
 *   1F1B m = 2: 2,781,265,920  2,781,233,152  2,781,233,152  2,384,723,968
 *   GPipe m = 8: 10,105,798,656  10,105,667,584  10,105,667,584  16,787,587,072
 * Worst, 1F1B m = 8: stage 0, params 38,633,472 + 786,432 + 3·7,087,872 =
 * 60,683,520 × 18 (bf16) = 1,092,303,360, + 5,222,776,832 = 6,315,080,192
 * (stage 3: 59,898,624 × 18 + 2,384,723,968 = 3,462,899,200). Logits whole, as above.
 * In bf16 (this test's precision) each held micro-batch keeps 18·NC of those values in bf16
 * (3 layers' ln1, ln2 and GeLU output, NC = 3,145,728; 19·NC on stage 3 with lnf), 2
 * bytes less each: 1F1B m = 8 stage 0 −4·36·NC = −452,984,832, so 4,769,792,000 and the
 * worst total 5,862,095,360. */
static void test_pipeline_stages_hold_what_their_schedule_keeps_in_flight(void)
{
    static const struct {
        const char *schedule;
        int m;
        uint64_t want[4]; /* in fp32 */
        int held[4];
    } cases[] = {
        {"1f1b", 8, {5222776832ull, 4001972224ull, 2781233152ull, 2384723968ull}, {4, 3, 2, 1}},
        {"1f1b", 2, {2781265920ull, 2781233152ull, 2781233152ull, 2384723968ull}, {2, 2, 2, 1}},
        {"gpipe",
         8,
         {10105798656ull, 10105667584ull, 10105667584ull, 16787587072ull},
         {8, 8, 8, 8}},
    };
    struct cost_layout l = {1, 4, 1};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct plan *p = load_plan(gpt2_124m, 4, cases[i].m, "bf16", "none");
        if (!p) return;
        p->logits_chunk_mb = 0;
        p->parallel.schedule =
            !strcmp(cases[i].schedule, "gpipe") ? PLAN_PIPE_GPIPE : PLAN_PIPE_1F1B;
        even_split(p, 4);
        for (int k = 0; k < 4; k++) {
            struct cost_memory m;
            cost_memory_stage(p, l, k, &m);
            uint64_t in_bf16 = (uint64_t)cases[i].held[k] * (k == 3 ? 19 : 18) * 3145728;
            CHECK(m.activations == cases[i].want[k] - 2 * in_bf16, "%s m=%d stage %d: %llu",
                  cases[i].schedule, cases[i].m, k, (unsigned long long)m.activations);
        }
        if (i == 0) {
            struct cost_memory worst;
            int stage = -1;
            cost_memory(p, l, &worst, &stage);
            CHECK(stage == 0, "worst stage %d", stage);
            CHECK(worst.total == 5862095360ull, "%llu", (unsigned long long)worst.total);
        }
        plan_free(p);
    }
}

/* The default split weighs the LM head: for GPT-2 124M at T = 1024 one
 * layer is 6·12·768² + 12·1024·768 = 51,904,512 FLOPs a token forward and
 * backward, the head 6·50,304·768 = 231,800,832 (4.47 layers). pp 2: the
 * last stage takes 4 layers and the head (439M) and the first 8 (415M),
 * where the even 6 + 6 puts 543M on the last; pp 3: 6, 5 and 1 + the head;
 * pp 4: 4, 4, 3 and 1 + the head. The slowest stage is faster than with the
 * even split, and a plan's own stage_layers wins over both. */
static void test_default_split_balances_the_head(void)
{
    struct plan *p = load_plan(gpt2_124m, 4, 1, "fp32", "none");
    if (!p) return;
    static const struct {
        int pp, layers[4];
    } cases[] = {{2, {8, 4}}, {4, {4, 4, 3, 1}}, {3, {6, 5, 1}}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int pp = cases[i].pp, at = 0;
        for (int k = 0; k < pp; k++) {
            int b, e;
            cost_stage_layers(p, pp, k, &b, &e);
            CHECK(b == at && e - b == cases[i].layers[k], "pp %d stage %d: layers [%d, %d)", pp, k,
                  b, e);
            at = e;
        }
        CHECK(at == 12, "pp %d: %d layers", pp, at);
        struct cost_links links = {.device_tflops = 1, .tp_gbps = 1, .pp_gbps = 1, .dp_gbps = 1};
        struct cost_time balanced, even;
        cost_step_time(p, (struct cost_layout){1, pp, 1}, &links, &balanced);
        even_split(p, pp);
        cost_step_time(p, (struct cost_layout){1, pp, 1}, &links, &even);
        p->parallel.stage_layers.n = 0;
        CHECK(balanced.compute_s < even.compute_s, "pp %d: %g s balanced, %g s even", pp,
              balanced.compute_s, even.compute_s);
    }
    p->parallel.stage_layers = (struct plan_ints){.n = 2, .v = {5, 7}};
    int b, e;
    cost_stage_layers(p, 2, 1, &b, &e);
    CHECK(b == 5 && e == 12, "stage_layers [5, 7]: stage 1 holds [%d, %d)", b, e);
    plan_free(p);
}

/* ZeRO slices over the dp·cp ranks: at ZeRO 1, dp 1 × cp 2 holds the parameters,
 * gradients and moments dp 2 does; its activations are those of s/cp tokens,
 * fewer than dp 2's whole sequences. */
static void test_cp_memory_slices_over_dp_times_cp(void)
{
    struct plan *p = load_plan(gpt2_124m, 4, 1, "bf16", "none");
    if (!p) return;
    p->parallel.zero = 1;
    struct cost_memory dp2, cp2;
    cost_memory(p, (struct cost_layout){1, 1, 2}, &dp2, NULL);
    p->parallel.cp = 2;
    cost_memory(p, (struct cost_layout){1, 1, 1}, &cp2, NULL);
    CHECK(cp2.params == dp2.params && cp2.grads == dp2.grads && cp2.optimizer == dp2.optimizer,
          "params %llu/%llu optimizer %llu/%llu", (unsigned long long)cp2.params,
          (unsigned long long)dp2.params, (unsigned long long)cp2.optimizer,
          (unsigned long long)dp2.optimizer);
    CHECK(cp2.activations < dp2.activations, "activations %llu, dp 2's %llu",
          (unsigned long long)cp2.activations, (unsigned long long)dp2.activations);
    plan_free(p);
}

/* ---- a GPU rank's offloaded step --------------------------------------------------------- */

/* GPT-2 124M, fp32, ZeRO 1 over dp 5 (test_zero_pads_the_buffers_to_a_multiple_of_dp):
 * S = 24,895,181, the device's optimizer 12S = 298,742,172 (8S moments, 4S staging).
 * On GPU ranks parallel.offload "host" takes the moments off the device, 8S = 199,161,448
 * (optimizer 4S = 99,580,724), and holds 16S = 398,322,896 in host memory: the moments and
 * the slice's master weights and gradient, 4S each; "nvme" with a 1 MiB window (262,144
 * floats) holds two windows of each moment, 16·262,144 = 4,194,304, and the master and
 * gradient, 8S: 203,355,752 in host memory, the moments' 8S on disk. On CPU ranks "host"
 * changes nothing. */
static void test_gpu_offload_puts_the_moments_and_the_step_in_host_memory(void)
{
    const uint64_t S = 24895181;
    struct plan *p = load_plan(gpt2_124m, 4, 1, "fp32", "none");
    if (!p) return;
    struct cost_layout l = {1, 1, 5};
    p->parallel.zero = 1;
    p->parallel.device = PLAN_DEVICE_CUDA;
    struct cost_memory none, host, nvme, cpu_none, cpu_host;
    cost_memory_stage(p, l, 0, &none);
    p->parallel.offload = PLAN_OFFLOAD_HOST;
    cost_memory_stage(p, l, 0, &host);
    p->parallel.offload = PLAN_OFFLOAD_NVME;
    p->parallel.offload_window_mb = 1;
    cost_memory_stage(p, l, 0, &nvme);
    CHECK(none.slice_count == (int64_t)S && none.optimizer == 12 * S && none.host == 0, "%lld %llu",
          (long long)none.slice_count, (unsigned long long)none.optimizer);
    CHECK(host.optimizer == none.optimizer - 8 * S && host.optimizer == 99580724 &&
              host.total == none.total - 8 * S && host.host == 16 * S && host.disk == 0,
          "%llu %llu %llu", (unsigned long long)host.optimizer, (unsigned long long)host.total,
          (unsigned long long)host.host);
    CHECK(nvme.optimizer == 4 * S && nvme.total == host.total && nvme.host == 16 * 262144 + 8 * S &&
              nvme.host == 203355752 && nvme.disk == 8 * S,
          "%llu %llu %llu", (unsigned long long)nvme.optimizer, (unsigned long long)nvme.host,
          (unsigned long long)nvme.disk);
    p->parallel.device = PLAN_DEVICE_CPU;
    p->parallel.offload = PLAN_OFFLOAD_NONE;
    cost_memory_stage(p, l, 0, &cpu_none);
    p->parallel.offload = PLAN_OFFLOAD_HOST;
    cost_memory_stage(p, l, 0, &cpu_host);
    CHECK(memcmp(&cpu_none, &cpu_host, sizeof cpu_none) == 0 && cpu_host.host == 0 &&
              cpu_host.optimizer == 12 * S,
          "%llu %llu", (unsigned long long)cpu_host.optimizer, (unsigned long long)cpu_host.host);
    plan_free(p);
}

/* The fit advice on GPU ranks: GPT-2 124M at dp 1 in device memory that holds it only
 * without its moments hears of parallel.offload "host" with the figure; a byte less and
 * the other levers alone. At dp 4 where no ZeRO stage fits but ZeRO 3 with the step on
 * the CPU does, both are named; CPU ranks hear of no offload (theirs moves nothing). */
static void test_fit_advice_proposes_host_offload_on_gpu_ranks(void)
{
    struct plan *p = load_plan(gpt2_124m, 4, 1, "bf16", "none");
    if (!p) return;
    p->parallel.device = PLAN_DEVICE_CUDA;
    struct cost_layout one = {1, 1, 1}, four = {1, 1, 4};
    struct cost_memory with;
    layout_memory_with(p, one, 0, PLAN_OFFLOAD_HOST, &with);
    CHECK(with.total == layout_memory_at_zero(p, one, 0) - 8 * 124475904ull &&
              with.host == 16 * 124475904ull,
          "%llu %llu", (unsigned long long)with.total, (unsigned long long)with.host);
    char got[512], want[512];
    layout_fit_advice(p, one, with.total, got, sizeof got);
    snprintf(want, sizeof want,
             "parallel.offload \"host\" fits with %.2f GB of %.2f per GPU (the AdamW step on the "
             "CPU: the moments, the slice's master weights and gradient, 1.99 GB, in host "
             "memory); or raise tp or pp, recompute, or a smaller batch.micro_batch (ZeRO "
             "shards over data-parallel ranks, and dp is 1)",
             with.total / 1e9, with.total / 1e9);
    CHECK(strcmp(got, want) == 0, "\n  got  %s\n  want %s", got, want);
    CHECK(layout_host_offload_to_fit(p, one, with.total - 1) == -1, "a byte less");
    layout_fit_advice(p, one, with.total - 1, got, sizeof got);
    CHECK(strstr(got, "raise tp or pp") == got, "%s", got);

    layout_memory_with(p, four, 3, PLAN_OFFLOAD_HOST, &with);
    CHECK(layout_zero_to_fit(p, four, with.total) == -1 &&
              layout_host_offload_to_fit(p, four, with.total) == 3,
          "%d %d", layout_zero_to_fit(p, four, with.total),
          layout_host_offload_to_fit(p, four, with.total));
    layout_fit_advice(p, four, with.total, got, sizeof got);
    const char *zero3 = "parallel.offload \"host\" with parallel.zero 3 fits with ";
    CHECK(strncmp(got, zero3, strlen(zero3)) == 0 &&
              strstr(got, "; no ZeRO stage fits without it") != NULL,
          "%s", got);
    p->parallel.device = PLAN_DEVICE_CPU;
    CHECK(layout_host_offload_to_fit(p, four, with.total) == -1, "CPU ranks");
    layout_fit_advice(p, four, with.total, got, sizeof got);
    CHECK(strstr(got, "not even parallel.zero 3 fits") == got, "%s", got);
    plan_free(p);
}

int main(void)
{
    RUN(test_gpt2_124m_counts_llmc_parameters);
    RUN(test_tp2_shards_matmuls_and_vocab_not_layernorms);
    RUN(test_pp2_last_stage_holds_its_own_wte_for_the_head);
    RUN(test_uneven_pp_gives_first_stages_one_more_layer);
    RUN(test_7b_model_state_is_18_bytes_per_parameter_in_bf16_16_in_fp32);
    RUN(test_zero_slices_the_optimizer_state_over_dp);
    RUN(test_zero3_kept_gathered_holds_a_window_for_every_unit);
    RUN(test_zero_pads_the_buffers_to_a_multiple_of_dp);
    RUN(test_activations_by_recompute_and_tp_the_products_inputs_in_bf16);
    RUN(test_pipeline_stages_hold_what_their_schedule_keeps_in_flight);
    RUN(test_default_split_balances_the_head);
    RUN(test_gpu_offload_puts_the_moments_and_the_step_in_host_memory);
    RUN(test_fit_advice_proposes_host_offload_on_gpu_ranks);
    RUN(test_cp_memory_slices_over_dp_times_cp);
    return check_exit_code();
}
