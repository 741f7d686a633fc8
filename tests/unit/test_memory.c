/* test_memory.c — what `plait check` predicts a rank holds (cost_memory_stage)
 * is what model_init allocates for it, to the byte and kind by kind, over
 * layouts of tp, pp (even and uneven), dp, ZeRO 0/1/2, fp32, bf16 and fp8, each
 * recompute policy and every pipeline schedule (interleaved: v chunks a
 * stage, a slot holding one chunk's layers). The allocations are counted
 * at the backend (a CPU ops table whose alloc adds up every request), not by
 * the model's own bookkeeping; the model is built the way train_setup.c builds it. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "common/place/cost.h"
#include "common/gpt2/gpt2_shard.h"
#include "common/plan/plan.h"
#include "common/place/schedule.h"
#include "kernels/ops.h"
#include "tests/unit/cpu_ctx.h"
#include "runtime/model.h"

/* ---- a backend that counts ----------------------------------------------------------------- */

static uint64_t counted_bytes;
static void *(*cpu_alloc)(struct ops_ctx *ctx, size_t bytes);
static struct ops_ctx *cx; /* the models' context (main opens it) */

static void *counting_alloc(struct ops_ctx *ctx, size_t bytes)
{
    counted_bytes += bytes;
    return cpu_alloc(ctx, bytes);
}

static struct ops counting_ops(void)
{
    struct ops o = *ops_cpu();
    cpu_alloc = o.alloc;
    o.alloc = counting_alloc;
    return o;
}

/* ---- plans ---------------------------------------------------------------------------------- */

static struct plan *plan_of(const char *text)
{
    struct plait_error err = {0};
    struct plan *p = plan_load_text(text, "test_memory", "/", NULL, 0, &err);
    CHECK(p != NULL, "plan_load_text: %s", err.text);
    return p;
}

/* 4 layers, 4 heads of 8, a byte vocabulary (Vp 256), T 16 of a 24-row wpe. */
static struct plan *small_plan(void)
{
    return plan_of("{\"model\": {\"layers\": 4, \"heads\": 4, \"hidden\": 32, \"vocab\": 256,"
                   " \"seq_len\": 16, \"max_seq_len\": 24},"
                   " \"data\": {\"train\": \"train.bin\"},"
                   " \"batch\": {\"micro_batch\": 2, \"grad_accum\": 3},"
                   " \"steps\": 1}");
}

/* The rank (tp_rank, stage, dp_rank) of layout l as train_setup.c builds it: its
 * part, the schedule's slots for its stage. 0, or -1 when model_init refused
 * (err says why). *bytes gets what the backend was asked for. */
static int build_rank(const struct plan *p, struct cost_layout l, int tp_rank, int stage,
                      int dp_rank, const struct ops *ops, struct model *m, uint64_t *bytes,
                      struct plait_error *err)
{
    struct gpt2_config cfg = gpt2_config_of_plan(&p->model);
    struct gpt2_part part = cost_stage_part(p, l.tp, tp_rank, l.pp, stage);
    struct schedule sched;
    if (schedule_make_for_plan(&sched, p, l.pp, err)) return -1;
    struct model_shape shape = {.B = p->batch.micro_batch,
                                .T = p->model.seq_len,
                                .precision = p->precision,
                                .fp8_scaling = p->fp8_scaling,
                                .recompute = p->recompute,
                                .slots = schedule_max_in_flight(&sched, stage),
                                .dp = l.dp,
                                .dp_rank = dp_rank,
                                .zero = p->parallel.zero,
                                .sequence_parallel = p->parallel.sequence_parallel,
                                .split_backward = sched.split_backward,
                                .logits_chunk_mb = p->logits_chunk_mb};
    schedule_free(&sched);
    struct group tp = {.size = l.tp, .rank = tp_rank};
    counted_bytes = 0;
    int rc = model_init(m, &cfg, &part, &tp, ops, cx, &shape, err);
    *bytes = counted_bytes;
    return rc;
}

/* ---- tests ---------------------------------------------------------------------------------- */

static void test_model_allocates_what_plait_check_predicts_for_every_layout(void)
{
    struct plan *p = small_plan();
    if (!p) return;
    struct ops ops = counting_ops();
    static const struct cost_layout layouts[] = {
        {1, 1, 1}, {2, 1, 1}, {4, 1, 1}, {1, 2, 1}, {1, 3, 1}, {1, 4, 1}, {1, 1, 2},
        {1, 1, 3}, {2, 2, 2}, {4, 2, 1}, {2, 3, 3}, {1, 2, 4}, {4, 4, 2},
    };
    /* fp8 twice: tensor and block scaling (its copy's scales differ) */
    const enum plan_precision precisions[] = {PLAN_PRECISION_FP32, PLAN_PRECISION_BF16,
                                              PLAN_PRECISION_FP8, PLAN_PRECISION_FP8};
    const enum plan_fp8_scaling scalings[] = {PLAN_FP8_NONE, PLAN_FP8_NONE, PLAN_FP8_TENSOR,
                                              PLAN_FP8_BLOCK};
    const enum plan_recompute recomputes[] = {PLAN_RECOMPUTE_NONE, PLAN_RECOMPUTE_SELECTIVE,
                                              PLAN_RECOMPUTE_FULL};
    const enum plan_pipeline schedules[] = {PLAN_PIPE_1F1B, PLAN_PIPE_GPIPE, PLAN_PIPE_ZB_H1};
    int ranks = 0, failed = 0, want_ranks = 0;
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++)
        want_ranks += layouts[i].pp * (layouts[i].tp > 1 ? 2 : 1) * 3 * 4 * 3 * 3;
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++)
        for (int sp = 0; sp <= (layouts[i].tp > 1); sp++)
            for (int zero = 0; zero <= 2; zero++)
                for (int pr = 0; pr < 4; pr++)
                    for (int rc = 0; rc < 3; rc++)
                        for (int sc = 0; sc < 3; sc++)
                            for (int stage = 0; stage < layouts[i].pp; stage++) {
                                struct cost_layout l = layouts[i];
                                p->parallel.sequence_parallel = sp;
                                p->parallel.zero = zero;
                                p->precision = precisions[pr];
                                p->fp8_scaling = scalings[pr];
                                p->recompute = recomputes[rc];
                                p->parallel.schedule = schedules[sc];
                                struct cost_memory want;
                                cost_memory_stage(p, l, stage, &want);
                                struct model m;
                                struct plait_error err = {.text = ""};
                                uint64_t bytes;
                                /* the last tp and dp rank: the same sizes as any other */
                                if (build_rank(p, l, l.tp - 1, stage, l.dp - 1, &ops, &m, &bytes,
                                               &err)) {
                                    CHECK(0, "tp %d pp %d dp %d stage %d: %s", l.tp, l.pp, l.dp,
                                          stage, err.text);
                                    failed++;
                                    continue;
                                }
                                const struct model_bytes *a = &m.allocated;
                                bool same = bytes == want.total && a->params == want.params &&
                                            a->grads == want.grads &&
                                            a->optimizer == want.optimizer &&
                                            a->activations == want.activations;
                                if (!same && failed++ < 10)
                                    CHECK(same,
                                          "tp %d pp %d dp %d stage %d, sp %d, ZeRO %d, %s %s, "
                                          "recompute %s, %s: allocated %llu (%llu %llu %llu %llu), "
                                          "predicted "
                                          "%llu (%llu %llu %llu %llu)",
                                          l.tp, l.pp, l.dp, stage, sp, zero,
                                          plan_precision_name(p->precision),
                                          plan_fp8_scaling_name(p->fp8_scaling),
                                          plan_recompute_name(p->recompute),
                                          plan_pipeline_name(p->parallel.schedule),
                                          (unsigned long long)bytes, (unsigned long long)a->params,
                                          (unsigned long long)a->grads,
                                          (unsigned long long)a->optimizer,
                                          (unsigned long long)a->activations,
                                          (unsigned long long)want.total,
                                          (unsigned long long)want.params,
                                          (unsigned long long)want.grads,
                                          (unsigned long long)want.optimizer,
                                          (unsigned long long)want.activations);
                                model_free(&m);
                                ranks++;
                            }
    /* the stages over the layouts (twice where tp > 1: with and without sequence
     * parallelism) × 3 ZeRO × 4 precisions × 3 recomputes × 3 schedules */
    CHECK(ranks == want_ranks && failed == 0, "%d of %d ranks built, %d differ", ranks, want_ranks,
          failed);
    plan_free(p);
}

/* Interleaved schedules: the stage's chunks in one buffer, as many slots as
 * the schedule holds chunk-micro-batches, each of one chunk's layers. */
static void test_interleaved_allocates_what_plait_check_predicts(void)
{
    struct plan *p = small_plan();
    if (!p) return;
    struct ops ops = counting_ops();
    p->model.layers = 8;
    p->batch.grad_accum = 4;
    p->parallel.schedule = PLAN_PIPE_INTERLEAVED;
    static const struct {
        struct cost_layout l;
        int v;
    } cases[] = {{{1, 2, 1}, 2}, {{1, 2, 1}, 4}, {{1, 4, 1}, 2}, {{2, 2, 2}, 2}, {{4, 4, 2}, 2}};
    int ranks = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int zero = 0; zero <= 1; zero++)
            for (int rc = 0; rc < 3; rc++)
                for (int stage = 0; stage < cases[i].l.pp; stage++) {
                    struct cost_layout l = cases[i].l;
                    p->parallel.virtual_stages = cases[i].v;
                    p->parallel.zero = zero;
                    p->recompute = rc == 0   ? PLAN_RECOMPUTE_NONE
                                   : rc == 1 ? PLAN_RECOMPUTE_SELECTIVE
                                             : PLAN_RECOMPUTE_FULL;
                    struct cost_memory want;
                    cost_memory_stage(p, l, stage, &want);
                    struct model m;
                    struct plait_error err = {.text = ""};
                    uint64_t bytes;
                    if (build_rank(p, l, 0, stage, l.dp - 1, &ops, &m, &bytes, &err)) {
                        CHECK(0, "tp %d pp %d dp %d v %d stage %d: %s", l.tp, l.pp, l.dp,
                              cases[i].v, stage, err.text);
                        continue;
                    }
                    CHECK(m.chunks == cases[i].v && m.n_layers == 8 / (l.pp * cases[i].v),
                          "pp %d v %d: %d chunks of %d layers", l.pp, cases[i].v, m.chunks,
                          m.n_layers);
                    const struct model_bytes *a = &m.allocated;
                    CHECK(bytes == want.total && a->params == want.params &&
                              a->grads == want.grads && a->optimizer == want.optimizer &&
                              a->activations == want.activations,
                          "tp %d pp %d dp %d v %d stage %d, ZeRO %d, recompute %d: allocated "
                          "%llu (activations %llu), predicted %llu (%llu)",
                          l.tp, l.pp, l.dp, cases[i].v, stage, zero, rc, (unsigned long long)bytes,
                          (unsigned long long)a->activations, (unsigned long long)want.total,
                          (unsigned long long)want.activations);
                    model_free(&m);
                    ranks++;
                }
    CHECK(ranks == (2 + 2 + 4 + 2 + 4) * 2 * 3, "%d ranks built", ranks);
    plan_free(p);
}

/* The prediction follows the schedule: GPipe holds every micro-batch of the
 * step on every stage, 1F1B at most pp − stage, and recompute shrinks what a
 * held micro-batch keeps. So the counts differ where they should (the test
 * above would pass if both sides ignored the schedule). */
static void test_memory_grows_with_the_micro_batches_held(void)
{
    struct plan *p = small_plan();
    if (!p) return;
    struct ops ops = counting_ops();
    struct cost_layout l = {1, 2, 1};
    uint64_t act[2][2]; /* [schedule][stage] */
    for (int sc = 0; sc < 2; sc++) {
        p->parallel.schedule = sc ? PLAN_PIPE_GPIPE : PLAN_PIPE_1F1B;
        for (int stage = 0; stage < 2; stage++) {
            struct model m;
            struct plait_error err = {.text = ""};
            uint64_t bytes;
            if (build_rank(p, l, 0, stage, 0, &ops, &m, &bytes, &err)) {
                CHECK(0, "%s", err.text);
                return;
            }
            act[sc][stage] = m.allocated.activations;
            CHECK(m.n_slots == (sc ? 3 : 2 - stage), "schedule %d stage %d: %d slots", sc, stage,
                  m.n_slots);
            model_free(&m);
        }
    }
    CHECK(act[1][0] > act[0][0] && act[1][1] > act[0][1], "GPipe %llu %llu, 1F1B %llu %llu",
          (unsigned long long)act[1][0], (unsigned long long)act[1][1],
          (unsigned long long)act[0][0], (unsigned long long)act[0][1]);
    struct cost_memory none, full;
    p->recompute = PLAN_RECOMPUTE_NONE;
    cost_memory_stage(p, l, 0, &none);
    p->recompute = PLAN_RECOMPUTE_FULL;
    cost_memory_stage(p, l, 0, &full);
    CHECK(full.activations < none.activations && full.params == none.params, "%llu %llu",
          (unsigned long long)full.activations, (unsigned long long)none.activations);
    plan_free(p);
}

/* A backend with a fused attention (the CUDA one's) holds no (B,NH,T,T)
 * probabilities nor their gradient, only each row's log-sum-exp: what a rank
 * built with it allocates is what plait check predicts for a cuda plan, and
 * the difference from the CPU's is exactly those buffers. */
static void fused_forward(struct ops_ctx *ctx, float *out, float *lse, const float *qkv, int B,
                          int T, int C, int NH)
{
    (void)ctx, (void)out, (void)lse, (void)qkv, (void)B, (void)T, (void)C, (void)NH;
}

static void test_a_fused_attention_holds_no_probabilities(void)
{
    struct plan *p = small_plan();
    if (!p) return;
    struct ops plain = counting_ops(), fused = plain;
    fused.attention_forward_fused = fused_forward;
    struct cost_layout l = {2, 2, 1};
    for (int stage = 0; stage < 2; stage++) {
        struct model m[2];
        uint64_t bytes[2];
        struct plait_error err = {.text = ""};
        if (build_rank(p, l, 0, stage, 0, &plain, &m[0], &bytes[0], &err) ||
            build_rank(p, l, 0, stage, 0, &fused, &m[1], &bytes[1], &err)) {
            CHECK(0, "%s", err.text);
            break;
        }
        struct cost_memory cpu, cuda;
        p->parallel.device = PLAN_DEVICE_CPU;
        cost_memory_stage(p, l, stage, &cpu);
        p->parallel.device = PLAN_DEVICE_CUDA;
        cost_memory_stage(p, l, stage, &cuda);
        CHECK(m[0].allocated.activations == cpu.activations &&
                  m[1].allocated.activations == cuda.activations,
              "stage %d: allocated %llu / %llu, predicted %llu / %llu", stage,
              (unsigned long long)m[0].allocated.activations,
              (unsigned long long)m[1].allocated.activations, (unsigned long long)cpu.activations,
              (unsigned long long)cuda.activations);
        /* B 2, NH/tp 2, T 16: per layer and held micro-batch the probabilities
         * (B·NH/tp·T·T) become B·NH/tp·T log-sum-exps, and the one gradient
         * scratch of B·NH/tp·T·T goes */
        uint64_t B = 2, NH = 2, T = 16, layers = (uint64_t)gpt2_shard_layers(&m[0].shard);
        uint64_t held = (uint64_t)m[0].n_slots * layers;
        uint64_t want = 4 * (held * (B * NH * T * T - B * NH * T) + B * NH * T * T);
        CHECK(cpu.activations - cuda.activations == want, "stage %d: %llu less, want %llu", stage,
              (unsigned long long)(cpu.activations - cuda.activations), (unsigned long long)want);
        model_free(&m[0]);
        model_free(&m[1]);
    }
    plan_free(p);
}

/* The fp8 copy of a model wider than a 128 block (hidden 320: 3C = 960, 4C =
 * 1280, partial blocks at every edge), counted by hand: 12·C² codes a layer
 * (qkvw 3C·C, attprojw C·C, fcw 4C·C, fcprojw C·4C) and 4 bytes a scale,
 * one per matrix with tensor scaling, with block scaling ⌈OC/128⌉·⌈C/128⌉:
 * 8·3 + 3·3 + 10·3 + 3·10 = 93 a layer (tp 2: 4·3 + 3·2 + 5·3 + 3·5 = 48);
 * and on the last stage alone the LM head's bf16 wte, 2·Vp·C/tp bytes (a
 * first stage holds wte for the embedding, in fp32 only). plait check and
 * the model say the same. */
static void test_fp8_copy_is_a_byte_a_weight_its_scales_and_a_bf16_lm_head(void)
{
    struct plan *p = plan_of("{\"model\": {\"layers\": 2, \"heads\": 4, \"hidden\": 320, "
                             "\"vocab\": 256, \"seq_len\": 16},"
                             " \"data\": {\"train\": \"train.bin\"},"
                             " \"batch\": {\"micro_batch\": 2, \"grad_accum\": 1},"
                             " \"steps\": 1}");
    struct plait_error err = {0};
    if (!p) return;
    struct ops ops = counting_ops();
    const long long C = 320, Vp = gpt2_config_of_plan(&p->model).padded_vocab;
    /* tp, pp, stage */
    static const int ranks[][3] = {{1, 1, 0}, {2, 1, 0}, {1, 2, 0}, {1, 2, 1}};
    for (size_t r = 0; r < sizeof ranks / sizeof ranks[0]; r++) {
        int tp = ranks[r][0], pp = ranks[r][1], stage = ranks[r][2];
        struct cost_layout l = {tp, pp, 1};
        long long layers = 2 / pp, head = stage == pp - 1 ? 2 * Vp * C / tp : 0;
        const long long scales[3] = {0, 4, tp == 1 ? 93 : 48}; /* fp32, tensor, block */
        uint64_t params[3];
        for (int k = 0; k < 3; k++) {
            p->precision = k ? PLAN_PRECISION_FP8 : PLAN_PRECISION_FP32;
            p->fp8_scaling = k == 0 ? PLAN_FP8_NONE : k == 1 ? PLAN_FP8_TENSOR : PLAN_FP8_BLOCK;
            struct cost_memory want;
            cost_memory_stage(p, l, stage, &want);
            struct model m;
            uint64_t bytes;
            if (build_rank(p, l, tp - 1, stage, 0, &ops, &m, &bytes, &err)) {
                CHECK(0, "tp %d pp %d stage %d: %s", tp, pp, stage, err.text);
                continue;
            }
            params[k] = m.allocated.params;
            CHECK(params[k] == want.params && bytes == want.total,
                  "tp %d pp %d stage %d, scaling %d: allocated %llu (params %llu), predicted %llu "
                  "(%llu)",
                  tp, pp, stage, k, (unsigned long long)bytes, (unsigned long long)params[k],
                  (unsigned long long)want.total, (unsigned long long)want.params);
            CHECK((m.wte16 != NULL) == (k && head), "tp %d pp %d stage %d, scaling %d: wte16 %p",
                  tp, pp, stage, k, (void *)m.wte16);
            model_free(&m);
            long long copy = layers * (12 * C * C / tp + 4 * scales[k]) + head;
            CHECK(k == 0 || params[k] - params[0] == (uint64_t)copy,
                  "tp %d pp %d stage %d, scaling %d: the fp8 copies take %llu bytes, want %lld", tp,
                  pp, stage, k, (unsigned long long)(params[k] - params[0]), copy);
        }
    }
    plan_free(p);
}

/* Whether two lanes hold a second copy of buffer a under recompute policy r: what an MoE
 * block keeps across its all-to-all (MOE_EP, MOE_DY and, sequence parallel, WHOLE), and
 * what recompute reruns in one copy and a pass reads across a block's exchange: selective,
 * the attention's probabilities; full, the layer's buffers (a dense MLP's but, whose layer
 * exchanges nothing) and the MoE block's. */
static bool second_copy(int a, enum plan_recompute r)
{
    switch (a) {
    case GPT2_ACT_MOE_EP:
    case GPT2_ACT_MOE_DY:
    case GPT2_ACT_WHOLE:
        return true;
    case GPT2_ACT_ATT:
        return r != PLAN_RECOMPUTE_NONE;
    case GPT2_ACT_LN1:
    case GPT2_ACT_LN1_MEAN:
    case GPT2_ACT_LN1_RSTD:
    case GPT2_ACT_QKV:
    case GPT2_ACT_ATTY:
    case GPT2_ACT_RES2:
    case GPT2_ACT_LN2:
    case GPT2_ACT_LN2_MEAN:
    case GPT2_ACT_LN2_RSTD:
        return r == PLAN_RECOMPUTE_FULL;
    default:
        return r == PLAN_RECOMPUTE_FULL && a >= GPT2_ACT_FIRST_MOE &&
               a < GPT2_ACT_FIRST_MOE_SCRATCH;
    }
}

/* DualPipeV's two lanes (schedule_moe_lanes: dualpipev, experts over ep ranks, not ZeRO 3)
 * hold a second copy of what a pass keeps across an MoE block's all-to-all in one copy every
 * slot shares (second_copy), under each recompute policy; nothing else changes. plait check
 * predicts the lanes' (cost_memory_stage; test_dualpipe_moe holds model_init's allocation to
 * it). */
static void test_two_lanes_hold_a_second_copy_of_what_crosses_an_exchange(void)
{
    struct plan *p = plan_of(
        "{\"model\": {\"layers\": 4, \"heads\": 4, \"hidden\": 32, \"vocab\": 256,"
        " \"seq_len\": 16, \"moe\": {\"experts\": 4, \"top_k\": 2, \"every\": 2,"
        " \"ffn_hidden\": 48}}, \"data\": {\"train\": \"train.bin\"},"
        " \"batch\": {\"micro_batch\": 2, \"grad_accum\": 4},"
        " \"parallel\": {\"tp\": 2, \"pp\": 2, \"dp\": 2, \"ep\": 2, \"schedule\": \"dualpipev\","
        " \"sequence_parallel\": true}, \"steps\": 1}");
    if (!p) return;
    const char *why = "";
    CHECK(schedule_moe_lanes(p, 2, &why) && why == NULL, "no lanes (%s)", why ? why : "");
    CHECK(!schedule_moe_lanes(p, 1, &why) && why == NULL, "lanes without a pipeline");
    struct gpt2_config cfg = gpt2_config_of_plan(&p->model);
    struct gpt2_part part = cost_stage_part(p, 2, 0, 2, 0); /* layers 0 and 3, an MoE block */
    struct gpt2_shard s;
    struct schedule sched;
    struct plait_error err = {.text = ""};
    struct gpt2_memory_shape shape = {
        .B = 2, .T = 16, .chunks = 2, .dp = 2, .sequence_parallel = true, .split_backward = true};
    struct gpt2_memory one, two;
    if (schedule_make_for_plan(&sched, p, 2, &err)) goto fail;
    shape.slots = schedule_max_in_flight(&sched, 0); /* as plait check holds them */
    schedule_free(&sched);
    if (gpt2_shard_init(&s, &cfg, &part, &err)) goto fail;
    const enum plan_recompute policies[] = {PLAN_RECOMPUTE_NONE, PLAN_RECOMPUTE_SELECTIVE,
                                            PLAN_RECOMPUTE_FULL};
    for (int r = 0; r < 3; r++) {
        p->recompute = shape.recompute = policies[r];
        CHECK(schedule_moe_lanes(p, 2, &why) && why == NULL, "recompute %d: no lanes (%s)", r,
              why ? why : "");
        shape.moe_lanes = false;
        if (gpt2_memory(&s, &shape, &one, &err)) goto fail;
        shape.moe_lanes = true;
        if (gpt2_memory(&s, &shape, &two, &err)) goto fail;
        uint64_t extra = 0;
        for (int a = 0; a < GPT2_ACTS; a++) {
            bool second = second_copy(a, policies[r]) && one.act[a].copies;
            CHECK(!second || one.act[a].copies == 1, "recompute %d, buffer %d: %zu copies", r, a,
                  one.act[a].copies);
            CHECK(two.act[a].copies == one.act[a].copies * (second ? 2 : 1) &&
                      two.act[a].lanes == (second ? 2u : 1u),
                  "recompute %d, buffer %d: %zu, %zu copies in %zu lanes", r, a, one.act[a].copies,
                  two.act[a].copies, two.act[a].lanes);
            if (second) extra += one.act[a].elems * one.act[a].elem_bytes;
        }
        CHECK(two.activations - one.activations == extra, "recompute %d: %llu more, want %llu", r,
              (unsigned long long)(two.activations - one.activations), (unsigned long long)extra);
        struct cost_memory check;
        cost_memory_stage(p, (struct cost_layout){2, 2, 2}, 0, &check);
        CHECK(check.activations == two.activations, "recompute %d: plait check %llu, lanes %llu", r,
              (unsigned long long)check.activations, (unsigned long long)two.activations);
    }
    p->recompute = PLAN_RECOMPUTE_NONE;
    p->parallel.schedule = PLAN_PIPE_1F1B;
    CHECK(!schedule_moe_lanes(p, 2, &why) && why == NULL, "lanes at 1f1b");
    plan_free(p);
    return;
fail:
    CHECK(0, "%s", err.text);
    plan_free(p);
}

/* logits_chunk_mb: the stage with the loss holds one chunk of logits (0.005 MiB: 5 rows
 * of Vp/tp 256, 10 of 128 with tp 2) and, per held micro-batch, the head's input and
 * weight gradients, (Vp/tp + N)·C, instead of its N·Vp/tp logits (N = 8·16): predicted
 * = allocated, and the difference that; the other stages hold the same either way. */
static void test_logits_in_chunks_hold_a_chunk_and_the_heads_gradients(void)
{
    struct plan *p = small_plan();
    if (!p) return;
    p->batch.micro_batch = 8;
    struct ops ops = counting_ops();
    static const struct cost_layout layouts[] = {{1, 1, 1}, {2, 1, 1}, {1, 2, 1}, {2, 2, 2}};
    const enum plan_pipeline schedules[] = {PLAN_PIPE_1F1B, PLAN_PIPE_ZB_H1};
    int checked = 0;
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++)
        for (int sc = 0; sc < 2; sc++)
            for (int stage = 0; stage < layouts[i].pp; stage++) {
                struct cost_layout l = layouts[i];
                p->parallel.schedule = schedules[sc];
                p->parallel.sequence_parallel = l.tp > 1;
                struct cost_memory want[2];
                struct model m[2];
                uint64_t bytes[2];
                struct plait_error err = {.text = ""};
                const double mb[2] = {0, 0.005};
                for (int k = 0; k < 2; k++) {
                    p->logits_chunk_mb = mb[k];
                    cost_memory_stage(p, l, stage, &want[k]);
                    if (build_rank(p, l, 0, stage, 0, &ops, &m[k], &bytes[k], &err)) {
                        CHECK(0, "tp %d pp %d stage %d: %s", l.tp, l.pp, stage, err.text);
                        plan_free(p);
                        return;
                    }
                    CHECK(bytes[k] == want[k].total &&
                              m[k].allocated.activations == want[k].activations,
                          "tp %d pp %d stage %d, logits_chunk_mb %g: allocated %llu, predicted "
                          "%llu",
                          l.tp, l.pp, stage, mb[k], (unsigned long long)bytes[k],
                          (unsigned long long)want[k].total);
                }
                uint64_t N = 8 * 16, C = 32, Vpt = 256 / (uint64_t)l.tp, rows = 5 * (uint64_t)l.tp;
                uint64_t slots = (uint64_t)m[0].n_slots;
                bool last = stage == l.pp - 1;
                uint64_t saved =
                    last ? 4 * (slots * N * Vpt - rows * Vpt - slots * (Vpt + N) * C) : 0;
                CHECK(want[0].activations - want[1].activations == saved &&
                          m[1].logits_rows == (last ? (int)rows : 0) &&
                          want[1].logits_rows == m[1].logits_rows,
                      "tp %d pp %d stage %d: %llu fewer bytes (want %llu), %d rows at a time", l.tp,
                      l.pp, stage, (unsigned long long)(want[0].activations - want[1].activations),
                      (unsigned long long)saved, m[1].logits_rows);
                model_free(&m[0]);
                model_free(&m[1]);
                checked++;
            }
    CHECK(checked == 2 * (1 + 1 + 2 + 2), "%d stages checked", checked);
    plan_free(p);
}

int main(void)
{
    cx = test_cpu_open();
    RUN(test_model_allocates_what_plait_check_predicts_for_every_layout);
    RUN(test_memory_grows_with_the_micro_batches_held);
    RUN(test_interleaved_allocates_what_plait_check_predicts);
    RUN(test_a_fused_attention_holds_no_probabilities);
    RUN(test_fp8_copy_is_a_byte_a_weight_its_scales_and_a_bf16_lm_head);
    RUN(test_two_lanes_hold_a_second_copy_of_what_crosses_an_exchange);
    RUN(test_logits_in_chunks_hold_a_chunk_and_the_heads_gradients);
    ops_cpu()->close(cx);
    return check_exit_code();
}
