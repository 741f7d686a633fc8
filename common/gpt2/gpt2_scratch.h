/* gpt2_scratch.h — the device memory a GPU rank holds beside its model's buffers
 * (gpt2_memory.h): the CUDA backend's scratch slots (gpt2_scratch_slots.h), each as large as
 * the largest use the rank's ops make of it in a step, cuBLASLt's workspace, and an
 * allowance for the CUDA context. One count for two readers: the runtime reserves the
 * slots by it when it makes the model (runtime/model_scratch.c), so no slot grows in a
 * step, and the cost model adds it to a GPU rank's memory (common/place/cost.c, what
 * `plait check` prints as "scratch").
 *
 * Per slot, in bytes, the most over the ops a rank runs: N = B·T rows (a product's rows:
 * sequence parallelism gathers them whole), R the residual stream's rows (N, or N/tp), Nh
 * the LM head's rows at once (gpt2_memory's logits_rows with chunked logits, else N), a
 * product (n, in, out) of n rows from in to out columns (qkv N·C→QKV/tp, attproj
 * N·C/tp→C, fc N·C→FC/tp, fcproj N·F/tp→C, the head Nh·C→Vp/tp, an MoE layer's router
 * N·C→E and experts at most ep·N rows C→FCm/tp and Fm/tp→C, the peak measurement's
 * 256·1024→2048):
 *   BF16_A    bf16 products (bf16 precision; the head in fp8 too): 2·n·in forward,
 *             2·n·out backward (the bf16 copy of dout); the head's 2·Nh·Vp/tp is GPT-2's largest
 *   BF16_B    2·n·in, a backward's copy of the input for the weight's gradient
 *   PARTIAL   4·⌈n/64⌉·out a bias gradient's column sums, 4·⌈R/64⌉·C a norm's weight
 *             gradient, 4·B·NH/tp·T a fused attention's row dots, 8·(1024 + a sum per
 *             tensor instance, at most GPT2_TENSORS·(layers + 1)) AdamW's gradient norm
 *   PARTIAL2  4·⌈R/64⌉·C a LayerNorm's bias gradient
 *   INDEX     4·(2·min(N, Vp/tp) + 1 + N) the embedding gradient's rows (first stage)
 *   FP8_*     fp8 precision's four block products (matmul_fp8.cu): X n·in, D n·out codes,
 *             WT max(out·in, n·out), their scales (one a tensor, or one a 1×128 or 128×1
 *             tile), cuBLASLt's scales of each operand (kernels/fp8_lt.h), AMAX 4·264; F32A
 *             and F32B the fp32 fallback's decoded operands only where a dimension is not
 *             a multiple of 16 (the fallbacks a device decides, block scaling off sm_90 or
 *             no cuBLASLt algorithm, are not foreseen: the backend reports their growth)
 *   ATTENTION 2·7·B·Tp·C/tp the bf16 tensor-core attention's backward planes (bf16 and fp8
 *             precision, head size 16, 32 or 64, no cp), Tp = T rounded up to 64
 *   ROPE      8·T·hs/2 a Llama's rotary table
 *   MOE       8·(E + 3) the MoE losses' sums
 * A slot used at all holds at least 1024 bytes (cu_scratch's smallest). */
#ifndef PLAIT_GPT2_SCRATCH_H
#define PLAIT_GPT2_SCRATCH_H

#include <stdbool.h>
#include <stdint.h>

#include "common/gpt2/gpt2_memory.h"
#include "common/gpt2/gpt2_scratch_slots.h"

/* An allowance for the CUDA context of a rank's process, in bytes: an estimate, not a
 * count (the driver's code, kernels and heaps; CUDA 12 loads modules lazily). Issue 19's
 * H200 run of GPT-2 124M bf16 at 16×1024 had 18.35 GB in use after step 1 against 17.78
 * GB its buffers, these slots and cuBLASLt's workspace count: 0.57 GB more, the context
 * and the allocator's rounding; 512 MiB is within that and a CUDA 12 context's usual
 * 0.3–0.6 GB on an H100 or H200. NCCL's own buffers (multi-rank) are not in it. */
#define GPT2_CUDA_CONTEXT_BYTES (512ull << 20)

struct gpt2_scratch {
    uint64_t slot[GPT2_SCRATCH_SLOTS]; /* bytes each slot reaches (0: unused) */
    uint64_t total;                    /* bytes: the slots' sum */
};

/* Whether a rank runs the bf16 tensor-core attention (the CUDA backend's default where it
 * takes the head size, in bf16 and fp8 runs without context parallelism). */
bool gpt2_scratch_attention_bf16(const struct gpt2_config *cfg,
                                 const struct gpt2_memory_shape *shape);

/* The scratch of shard s run as shape says on a GPU, with mem its gpt2_memory (the
 * LM head's rows) and attention_bf16 whether its attention is the bf16 tensor cores'
 * (gpt2_scratch_attention_bf16, or what the runtime chose). Pure arithmetic: every
 * size is bounded by buffers gpt2_memory found addressable. */
void gpt2_scratch(const struct gpt2_shard *s, const struct gpt2_memory_shape *shape,
                  const struct gpt2_memory *mem, bool attention_bf16, struct gpt2_scratch *out);

#endif
