/* test_gpt2_scratch.c — the CUDA backend's scratch slots a rank needs (gpt2_scratch.c), at
 * GPT-2 124M's shapes with micro-batch 16×1024 (issue 19's bench: N = 16,384 rows, C = 768,
 * Vp = 50,304, 12 heads of 64), each slot's bytes worked out here from the kernels' own
 * sizes (kernels/cuda's cu_scratch calls), and what plait check adds for a GPU rank. */
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "common/gpt2/gpt2_scratch.h"
#include "common/place/cost.h"
#include "common/plan/plan.h"

static const struct gpt2_config gpt2_124m = {.max_seq_len = 1024,
                                             .vocab = 50257,
                                             .padded_vocab = 50304,
                                             .layers = 12,
                                             .heads = 12,
                                             .hidden = 768};

enum { N = 16 * 1024, C = 768, VP = 50304, NH = 12, B = 16, T = 1024 };

/* The optimizer's tables (optimizer.cu): at most one part of each tensor instance,
 * GPT2_TENSORS of each of 12 layers and of the model's own, 64 bytes an AdamW segment
 * and 16 a tensor summed for the norm: 286 parts, 18,304 and 4,576 bytes. */
enum { PARTS = GPT2_TENSORS * 13 };

static void want_optimizer_tables(uint64_t *want)
{
    want[GPT2_SCRATCH_ADAMW] = 64ull * PARTS;
    want[GPT2_SCRATCH_SUMSQ] = 16ull * PARTS;
}

/* GPT-2 124M on tp ranks (rank 0, one stage), 16×1024, in `precision`, with whole logits
 * (logits_chunk_mb 0), its products' inputs in fp32 or (act16) bf16; its scratch in *out. */
static int scratch_of(enum plan_precision precision, enum plan_fp8_scaling scaling, int tp,
                      bool act16, struct gpt2_scratch *out)
{
    struct gpt2_part part = gpt2_part_whole(&gpt2_124m);
    part.tp = tp;
    struct gpt2_shard s;
    struct gpt2_memory mem;
    struct plait_error err = {.text = ""};
    struct gpt2_memory_shape shape = {.B = B,
                                      .T = T,
                                      .cp = 1,
                                      .precision = precision,
                                      .fp8_scaling = scaling,
                                      .recompute = PLAN_RECOMPUTE_NONE,
                                      .slots = 1,
                                      .chunks = 1,
                                      .dp = 1,
                                      .fused_attention = true,
                                      .act16 = act16};
    if (gpt2_shard_init(&s, &gpt2_124m, &part, &err) || gpt2_memory(&s, &shape, &mem, &err)) {
        CHECK(0, "%s", err.text);
        return -1;
    }
    gpt2_scratch(&s, &shape, &mem, gpt2_scratch_attention_bf16(&s.cfg, &shape), out);
    uint64_t sum = 0;
    for (int i = 0; i < GPT2_SCRATCH_SLOTS; i++) sum += out->slot[i];
    CHECK(out->total == sum, "total %llu, the slots sum to %llu", (unsigned long long)out->total,
          (unsigned long long)sum);
    return 0;
}

/* Each slot against want (0: unused), naming the first that differs. */
static void check_slots(const char *what, const struct gpt2_scratch *got, const uint64_t *want)
{
    for (int i = 0; i < GPT2_SCRATCH_SLOTS; i++)
        CHECK(got->slot[i] == want[i], "%s: slot %s holds %llu bytes, want %llu", what,
              gpt2_scratch_slot_name(i), (unsigned long long)got->slot[i],
              (unsigned long long)want[i]);
}

/* bf16: BF16_A the head's backward copy of dlogits 2·N·Vp = 1,648,361,472 (the 1.65 GB of
 * issue 19); BF16_B fcproj's input 2·N·4C = 100,663,296; PARTIAL fc's bias gradient
 * 4·⌈N/64⌉·4C = 3,145,728 (above the row dots' 4·B·NH·T = 786,432 and the LayerNorms'
 * 4·256·C = 786,432); PARTIAL2 a LayerNorm bias's 786,432; INDEX 4·(2N + 1 + N) =
 * 196,612 (N < Vp); ATTENTION the tensor-core backward's 2·7·B·T·C = 176,160,768;
 * the optimizer's tables 22,880. 1,929,337,188 bytes in all. */
static void test_gpt2_124m_bf16_scratch_is_the_heads_bf16_dlogits_and_the_rest(void)
{
    struct gpt2_scratch s;
    if (scratch_of(PLAN_PRECISION_BF16, PLAN_FP8_NONE, 1, false, &s)) return;
    uint64_t want[GPT2_SCRATCH_SLOTS] = {0};
    want[GPT2_SCRATCH_BF16_A] = 2ull * N * VP;
    want[GPT2_SCRATCH_BF16_B] = 2ull * N * 4 * C;
    want[GPT2_SCRATCH_PARTIAL] = 4ull * (N / 64) * 4 * C;
    want[GPT2_SCRATCH_PARTIAL2] = 4ull * (N / 64) * C;
    want[GPT2_SCRATCH_INDEX] = 4ull * (2 * N + 1 + N);
    want[GPT2_SCRATCH_ATTENTION] = 2ull * 7 * B * T * C;
    want_optimizer_tables(want);
    check_slots("bf16", &s, want);
    CHECK(want[GPT2_SCRATCH_BF16_A] == 1648361472ull && s.total == 1929337188ull, "total %llu",
          (unsigned long long)s.total);
}

/* bf16 activations (gpt2_act16, as the model keeps them): the products take the norms'
 * outputs and the GeLU output in bf16 as they are, so BF16_B holds only attproj's copy of
 * its input (the attention's output, fp32), 2·N·C = 25,165,824: 75,497,472 bytes less,
 * 1,853,839,716 in all. BF16_A keeps the head's dlogits. */
static void test_bf16_activations_leave_only_the_attention_outputs_copy(void)
{
    struct gpt2_scratch s;
    if (scratch_of(PLAN_PRECISION_BF16, PLAN_FP8_NONE, 1, true, &s)) return;
    CHECK(s.slot[GPT2_SCRATCH_BF16_B] == 2ull * N * C &&
              s.slot[GPT2_SCRATCH_BF16_A] == 2ull * N * VP,
          "BF16_B %llu, BF16_A %llu", (unsigned long long)s.slot[GPT2_SCRATCH_BF16_B],
          (unsigned long long)s.slot[GPT2_SCRATCH_BF16_A]);
    CHECK(s.total == 1853839716ull, "total %llu", (unsigned long long)s.total);
}

/* tp 2: the head's vocabulary shard halves BF16_A (N·Vp/2 in bf16), the attention's heads
 * half of C; fc's 4C/2 columns halve fcproj's input (BF16_B) and fc's bias sums, which
 * then fall below the gradient norm's partials: 8·(256·1024 + 286) = 2,099,440 bytes
 * (its 256 tensors a launch, a sum for each of its 286). */
static void test_tp_shards_the_heads_copy_and_the_attention(void)
{
    struct gpt2_scratch s;
    if (scratch_of(PLAN_PRECISION_BF16, PLAN_FP8_NONE, 2, false, &s)) return;
    CHECK(s.slot[GPT2_SCRATCH_BF16_A] == 2ull * N * (VP / 2), "BF16_A %llu",
          (unsigned long long)s.slot[GPT2_SCRATCH_BF16_A]);
    CHECK(s.slot[GPT2_SCRATCH_BF16_B] == 2ull * N * (4 * C / 2), "BF16_B %llu",
          (unsigned long long)s.slot[GPT2_SCRATCH_BF16_B]);
    CHECK(s.slot[GPT2_SCRATCH_ATTENTION] == 2ull * 7 * B * T * (C / 2), "ATTENTION %llu",
          (unsigned long long)s.slot[GPT2_SCRATCH_ATTENTION]);
    CHECK(4ull * (N / 64) * (4 * C / 2) < 2099440 &&
              s.slot[GPT2_SCRATCH_PARTIAL] == 8ull * (256 * 1024 + PARTS),
          "PARTIAL %llu", (unsigned long long)s.slot[GPT2_SCRATCH_PARTIAL]);
}

/* fp32: no bf16 copies, no tensor-core attention; the fused fp32 attention's row dots and
 * the column sums remain. */
static void test_fp32_takes_no_bf16_copies(void)
{
    struct gpt2_scratch s;
    if (scratch_of(PLAN_PRECISION_FP32, PLAN_FP8_NONE, 1, false, &s)) return;
    uint64_t want[GPT2_SCRATCH_SLOTS] = {0};
    want[GPT2_SCRATCH_PARTIAL] = 4ull * (N / 64) * 4 * C;
    want[GPT2_SCRATCH_PARTIAL2] = 4ull * (N / 64) * C;
    want[GPT2_SCRATCH_INDEX] = 4ull * (2 * N + 1 + N);
    want_optimizer_tables(want);
    check_slots("fp32", &s, want);
}

/* fp8 with one scale a tensor: the codes of the largest input (fcproj's N·4C), of the
 * largest dout (fc's N·4C) and of fc's dout transposed for its weight gradient (WT,
 * N·4C, above a weight's 4C·C); a scale each (the 1024-byte floor), the amax partials
 * 4·264; the head still in bf16 (its 2·N·Vp and 2·N·C), the attention on tensor cores;
 * no fallback (every dimension a multiple of 16). */
static void test_fp8_tensor_quantises_into_codes_and_keeps_the_head_in_bf16(void)
{
    struct gpt2_scratch s;
    if (scratch_of(PLAN_PRECISION_FP8, PLAN_FP8_TENSOR, 1, false, &s)) return;
    uint64_t want[GPT2_SCRATCH_SLOTS] = {0};
    want[GPT2_SCRATCH_BF16_A] = 2ull * N * VP;
    want[GPT2_SCRATCH_BF16_B] = 2ull * N * C;
    want[GPT2_SCRATCH_PARTIAL] = 4ull * (N / 64) * 4 * C;
    want[GPT2_SCRATCH_PARTIAL2] = 4ull * (N / 64) * C;
    want[GPT2_SCRATCH_INDEX] = 4ull * (2 * N + 1 + N);
    want[GPT2_SCRATCH_ATTENTION] = 2ull * 7 * B * T * C;
    want[GPT2_SCRATCH_FP8_X] = want[GPT2_SCRATCH_FP8_D] = want[GPT2_SCRATCH_FP8_WT] =
        1ull * N * 4 * C;
    want[GPT2_SCRATCH_FP8_XS] = want[GPT2_SCRATCH_FP8_DS] = want[GPT2_SCRATCH_FP8_LTA] =
        want[GPT2_SCRATCH_FP8_LTB] = GPT2_SCRATCH_MIN_BYTES;
    want[GPT2_SCRATCH_FP8_AMAX] = 4 * 264;
    want_optimizer_tables(want);
    check_slots("fp8 tensor", &s, want);
}

/* fp8 in 1×128 tiles: an input's scales N·⌈4C/128⌉ = 24 a row (fcproj's, forward) in
 * fp32, the weight's transposed codes only 4C·C (dout's are quantised anew) */
static void test_fp8_block_scales_a_tile_of_128(void)
{
    struct gpt2_scratch s;
    if (scratch_of(PLAN_PRECISION_FP8, PLAN_FP8_BLOCK, 1, false, &s)) return;
    CHECK(s.slot[GPT2_SCRATCH_FP8_XS] == 4ull * N * (4 * C / 128), "XS %llu",
          (unsigned long long)s.slot[GPT2_SCRATCH_FP8_XS]);
    CHECK(s.slot[GPT2_SCRATCH_FP8_WT] == 4ull * C * C, "WT %llu",
          (unsigned long long)s.slot[GPT2_SCRATCH_FP8_WT]);
}

/* plait check: a GPU rank holds its scratch, cuBLASLt's 32 MiB and the CUDA context's
 * allowance beside its model's buffers, in its total; a CPU rank none of them. The plan's
 * default logits_chunk_mb (512 MiB) runs the head ⌊512 MiB / (4·Vp)⌋ = 2,668 rows at a
 * time, and with bf16 activations the classifier writes each chunk's dlogits in bf16 (an
 * activation buffer, DLOGITS16), which the head's backward reads as they are: BF16_A then
 * holds no copy of dlogits, only the largest other, fc's dout 2·N·4C = 100,663,296 bytes in
 * place of the whole logits' 2·N·Vp; the rest as with whole logits and bf16 activations:
 * 306,141,540 bytes in all. */
static void test_plait_check_counts_a_gpu_ranks_scratch_and_cuda_context(void)
{
    struct plait_error err = {.text = ""};
    struct plan *p = plan_load_text(
        "{\"model\": {\"layers\": 12, \"heads\": 12, \"hidden\": 768, \"vocab\": 50257,"
        " \"seq_len\": 1024, \"max_seq_len\": 1024},"
        " \"data\": {\"train\": \"train.bin\"}, \"precision\": \"bf16\","
        " \"batch\": {\"micro_batch\": 16, \"grad_accum\": 1}, \"steps\": 1}",
        "test_gpt2_scratch", "/", NULL, 0, &err);
    CHECK(p != NULL, "%s", err.text);
    if (!p) return;
    struct cost_layout one = {1, 1, 1};
    struct cost_memory cpu, gpu;
    p->parallel.device = PLAN_DEVICE_CPU;
    cost_memory_stage(p, one, 0, &cpu);
    p->parallel.device = PLAN_DEVICE_CUDA;
    cost_memory_stage(p, one, 0, &gpu);
    CHECK(cpu.scratch == 0 && cpu.cuda_context == 0 &&
              cpu.total == cpu.params + cpu.grads + cpu.optimizer + cpu.activations,
          "a CPU rank: scratch %llu, context %llu", (unsigned long long)cpu.scratch,
          (unsigned long long)cpu.cuda_context);
    uint64_t chunked = 1853839716ull - 2ull * N * VP + 2ull * N * 4 * C;
    CHECK(chunked == 306141540ull && gpu.scratch == chunked &&
              gpu.cuda_context == (32ull + 512) << 20 &&
              gpu.total == gpu.params + gpu.grads + gpu.optimizer + gpu.activations + gpu.scratch +
                               gpu.cuda_context,
          "a GPU rank: scratch %llu, context %llu, total %llu", (unsigned long long)gpu.scratch,
          (unsigned long long)gpu.cuda_context, (unsigned long long)gpu.total);
    plan_free(p);
}

int main(void)
{
    RUN(test_gpt2_124m_bf16_scratch_is_the_heads_bf16_dlogits_and_the_rest);
    RUN(test_bf16_activations_leave_only_the_attention_outputs_copy);
    RUN(test_tp_shards_the_heads_copy_and_the_attention);
    RUN(test_fp32_takes_no_bf16_copies);
    RUN(test_fp8_tensor_quantises_into_codes_and_keeps_the_head_in_bf16);
    RUN(test_fp8_block_scales_a_tile_of_128);
    RUN(test_plait_check_counts_a_gpu_ranks_scratch_and_cuda_context);
    return check_exit_code();
}
