/* gpt2_scratch_slots.h — the CUDA backend's scratch slots (kernels/cuda's cu_scratch) and
 * the kernel constants their sizes follow, named once for the two that need them: the
 * backend (kernels/cuda/cuda_common.cuh's slots and CU_CHUNK_ROWS are these; attention_tc.cu,
 * optimizer.cu and fp8_quant.cu static_assert theirs against them) and the pure count of
 * their sizes (gpt2_scratch.h). C and C++ (nvcc reads it): an enum, constants and one
 * inline rule, nothing else. */
#ifndef PLAIT_GPT2_SCRATCH_SLOTS_H
#define PLAIT_GPT2_SCRATCH_SLOTS_H

#include <stdbool.h>

/* One device buffer each, reused by every op that takes it (a slot's size is the largest
 * use): the sizes of each are gpt2_scratch.c's. */
enum gpt2_scratch_slot {
    GPT2_SCRATCH_BF16_A,   /* matmul.cu: the bf16 copy of a product's input, or of dout */
    GPT2_SCRATCH_BF16_B,   /* matmul.cu: the bf16 copy of the input, for the weight's gradient */
    GPT2_SCRATCH_PARTIAL,  /* column sums' partials, attention's row dots, AdamW's norm */
    GPT2_SCRATCH_PARTIAL2, /* layernorm.cu: the bias gradient's partials */
    GPT2_SCRATCH_INDEX,    /* encoder.cu: the embedding gradient's rows and their tokens */
    GPT2_SCRATCH_FP8_X,    /* matmul_fp8.cu: an activation's codes, (N,C) */
    GPT2_SCRATCH_FP8_XS,   /* its scales */
    GPT2_SCRATCH_FP8_D,    /* a gradient's codes, (N,OC) */
    GPT2_SCRATCH_FP8_DS,   /* its scales */
    GPT2_SCRATCH_FP8_WT,   /* the weight's codes transposed, (C,OC), or dout's (OC,N) */
    GPT2_SCRATCH_FP8_LTA,  /* cuBLASLt's scales of A */
    GPT2_SCRATCH_FP8_LTB,  /* ... and B */
    GPT2_SCRATCH_FP8_F32A, /* the fallback's decoded operands (fp32) */
    GPT2_SCRATCH_FP8_F32B,
    GPT2_SCRATCH_FP8_AMAX,  /* fp8_quant.cu: partial maxima of a tensor's amax */
    GPT2_SCRATCH_ATTENTION, /* attention_tc.cu: q, k, v (and dout) in bf16, per head */
    GPT2_SCRATCH_ROPE,      /* llama.cu: the rotary angles' cos and sin, (T, hs/2) */
    GPT2_SCRATCH_MOE,       /* moe.cu: the losses' sums */
    GPT2_SCRATCH_ADAMW,     /* optimizer.cu: adamw_multi's segment table */
    GPT2_SCRATCH_SUMSQ,     /* optimizer.cu: sum_squares' tensor table */
    GPT2_SCRATCH_SLOTS
};

/* The slot's name, for messages ("BF16_A"). */
static inline const char *gpt2_scratch_slot_name(int slot)
{
    static const char *const names[GPT2_SCRATCH_SLOTS] = {
        "BF16_A",   "BF16_B",   "PARTIAL",  "PARTIAL2",  "INDEX",   "FP8_X",
        "FP8_XS",   "FP8_D",    "FP8_DS",   "FP8_WT",    "FP8_LTA", "FP8_LTB",
        "FP8_F32A", "FP8_F32B", "FP8_AMAX", "ATTENTION", "ROPE",    "MOE",
        "ADAMW",    "SUMSQ"};
    return slot >= 0 && slot < GPT2_SCRATCH_SLOTS ? names[slot] : "?";
}

enum {
    GPT2_SCRATCH_MIN_BYTES = 1024,    /* cu_scratch's smallest buffer */
    GPT2_SCRATCH_CHUNK_ROWS = 64,     /* CU_CHUNK_ROWS: rows of a column sum's partial */
    GPT2_SCRATCH_ATTENTION_TILE = 64, /* attention_tc.cu's TILE: T is padded to it */
    GPT2_SCRATCH_SUM_BLOCKS = 1024,   /* optimizer.cu's SUM_BLOCKS: sum_squares' partials */
    GPT2_SCRATCH_SUM_TENSORS = 256,   /* optimizer.cu's SUM_TENSORS: tensors a launch sums */
    GPT2_SCRATCH_ADAMW_ROW_BYTES = 64, /* optimizer.cu's struct adamw_row */
    GPT2_SCRATCH_SUM_ROW_BYTES = 16,   /* optimizer.cu's struct sum_row */
    GPT2_SCRATCH_AMAX_BLOCKS = 264,   /* fp8_quant.cu's AMAX_BLOCKS */
    /* the product runtime/device.c's device_peak_gflops times, (N,C)·(OC,C)ᵀ */
    GPT2_PEAK_PRODUCT_N = 256,
    GPT2_PEAK_PRODUCT_C = 1024,
    GPT2_PEAK_PRODUCT_OC = 2048
};

/* Bytes of cuBLASLt's workspace, one per CUDA context (backend.cu's cuda_open). */
#define GPT2_CUBLASLT_WORKSPACE_BYTES (32ull << 20)

/* Whether the backend's bf16 tensor-core attention takes this head size
 * (attention_tc.cu: its kernels are instantiated for these). */
static inline bool gpt2_scratch_attention_bf16_takes(int head_size)
{
    return head_size == 16 || head_size == 32 || head_size == 64;
}

#endif
