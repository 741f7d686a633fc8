/* gpt2_scratch.c — the CUDA backend's scratch slots a rank's step needs (gpt2_scratch.h):
 * each op the model runs on a GPU, with its shape, raising the slots it takes to what it
 * asks of them (kernels/cuda's cu_scratch calls, read back into arithmetic). Pure: no
 * CUDA, no allocation; reserving them is runtime/model_scratch.c's. */
#include "common/gpt2/gpt2_scratch.h"

#include <string.h>

#include "kernels/fp8_lt.h" // defines: fp8_lt_block_scales, fp8_lt_count (header only)

/* How a product's operands reach cuBLASLt: fp32 (no scratch), a bf16 copy, the input in bf16
 * already (gpt2_act16: a copy of dout alone), the input and dout in bf16 already (the chunked
 * LM head's with bf16 activations: no copy), fp8 codes. */
enum product_kind { PRODUCT_FP32, PRODUCT_BF16, PRODUCT_BF16_IN, PRODUCT_BF16_BOTH, PRODUCT_FP8 };

/* What the ops take from their context, and the slots they raise. */
struct scratch_run {
    struct gpt2_scratch *out;
    bool block;    /* fp8 block scaling (1×128 and 128×128 tiles), else one scale a tensor */
    bool backward; /* the products' backward runs (a training step) */
};

static void raise(struct scratch_run *r, int slot, uint64_t bytes)
{
    if (bytes > r->out->slot[slot]) r->out->slot[slot] = bytes;
}

static uint64_t ceil_div(uint64_t a, uint64_t b)
{
    return (a + b - 1) / b;
}

/* fp8_scale_count (kernels/fp8.h): scales of (rows, cols) in tr × tc tiles (0: whole) */
static uint64_t scale_count(uint64_t rows, uint64_t cols, uint64_t tr, uint64_t tc)
{
    return ceil_div(rows, tr ? tr : rows) * ceil_div(cols, tc ? tc : cols);
}

/* cuBLASLt's scales of both operands of product p (matmul_fp8.cu's operand) */
static void lt_scales(struct scratch_run *r, enum fp8_product p, int N, int C, int OC)
{
    for (int a = 0; a < 2; a++) {
        uint64_t n = 1; /* a tensor's one factor */
        if (r->block) {
            struct fp8_lt_scales l = fp8_lt_block_scales(p, a == 0, N, C, OC);
            n = fp8_lt_count(&l);
        }
        raise(r, a == 0 ? GPT2_SCRATCH_FP8_LTA : GPT2_SCRATCH_FP8_LTB, 4 * n);
    }
}

/* An fp8 product's forward and backward (matmul_fp8.cu): quantised operands, their
 * scales, the transposed weight (or dout), cuBLASLt's scales, and where a dimension is
 * not a multiple of 16 the fallback's fp32 operands. */
static void fp8_product(struct scratch_run *r, uint64_t N, uint64_t C, uint64_t OC, bool dinp,
                        bool dw)
{
    uint64_t T = FP8_TILE, t1 = r->block ? 1 : 0, tK = r->block ? T : 0;
    bool fallback = N % 16 || C % 16 || OC % 16;
    raise(r, GPT2_SCRATCH_FP8_AMAX, 4 * GPT2_SCRATCH_AMAX_BLOCKS);
    /* forward: x (N,C) in 1×128 tiles along C */
    raise(r, GPT2_SCRATCH_FP8_X, N * C);
    raise(r, GPT2_SCRATCH_FP8_XS, 4 * scale_count(N, C, t1, tK));
    lt_scales(r, FP8_FWD, (int)N, (int)C, (int)OC);
    if (fallback) {
        raise(r, GPT2_SCRATCH_FP8_F32A, 4 * OC * C);
        raise(r, GPT2_SCRATCH_FP8_F32B, 4 * N * C);
    }
    if (!r->backward) return;
    if (dinp) { /* dout (N,OC) along OC, the weight's codes transposed */
        raise(r, GPT2_SCRATCH_FP8_D, N * OC);
        raise(r, GPT2_SCRATCH_FP8_DS, 4 * scale_count(N, OC, t1, tK));
        raise(r, GPT2_SCRATCH_FP8_WT, OC * C);
        lt_scales(r, FP8_DINP, (int)N, (int)C, (int)OC);
        if (fallback) raise(r, GPT2_SCRATCH_FP8_F32B, 4 * N * OC);
    }
    if (dw) { /* both along N (128×1 tiles), transposed; tensor scaling after dinp:
                 dout's codes transposed into WT */
        raise(r, GPT2_SCRATCH_FP8_D, N * OC);
        raise(r, GPT2_SCRATCH_FP8_DS, 4 * scale_count(N, OC, r->block ? T : 0, t1));
        raise(r, GPT2_SCRATCH_FP8_X, N * C);
        raise(r, GPT2_SCRATCH_FP8_XS, 4 * scale_count(N, C, r->block ? T : 0, t1));
        if (!r->block && dinp) raise(r, GPT2_SCRATCH_FP8_WT, N * OC);
        lt_scales(r, FP8_DW, (int)N, (int)C, (int)OC);
        if (fallback) {
            raise(r, GPT2_SCRATCH_FP8_F32A, 4 * N * OC);
            raise(r, GPT2_SCRATCH_FP8_F32B, 4 * N * C);
        }
    }
}

/* out (n,OC) = in (n,C) · wᵀ (+ bias), and with backward its gradients (the input's
 * where dinp, the weight's, the bias's where bias): matmul.cu's bf16 copies, the bias
 * gradient's column sums (elementwise.cu). */
static void product(struct scratch_run *r, enum product_kind kind, uint64_t n, uint64_t C,
                    uint64_t OC, bool bias, bool dinp)
{
    if (!n || !C || !OC) return;
    if (kind == PRODUCT_FP8) fp8_product(r, n, C, OC, dinp, true);
    if (kind == PRODUCT_BF16) {
        raise(r, GPT2_SCRATCH_BF16_A, 2 * n * C);
        if (r->backward) raise(r, GPT2_SCRATCH_BF16_B, 2 * n * C);
    }
    if ((kind == PRODUCT_BF16 || kind == PRODUCT_BF16_IN) && r->backward)
        raise(r, GPT2_SCRATCH_BF16_A, 2 * n * OC);
    if (r->backward && bias)
        raise(r, GPT2_SCRATCH_PARTIAL, 4 * ceil_div(n, GPT2_SCRATCH_CHUNK_ROWS) * OC);
}

/* A norm's backward over R rows of C: the weight's partial column sums, and a
 * LayerNorm's bias's (layernorm.cu, llama.cu's RMSNorm). */
static void norm(struct scratch_run *r, uint64_t R, uint64_t C, bool layernorm)
{
    uint64_t bytes = 4 * ceil_div(R, GPT2_SCRATCH_CHUNK_ROWS) * C;
    raise(r, GPT2_SCRATCH_PARTIAL, bytes);
    if (layernorm) raise(r, GPT2_SCRATCH_PARTIAL2, bytes);
}

bool gpt2_scratch_attention_bf16(const struct gpt2_config *cfg,
                                 const struct gpt2_memory_shape *shape)
{
    return shape->fused_attention && shape->cp <= 1 && shape->precision != PLAN_PRECISION_FP32 &&
           gpt2_scratch_attention_bf16_takes(cfg->hidden / cfg->heads);
}

/* The attention's backward: the row dots of every fused one (attention_fused.cu,
 * attention_block.cu, attention_tc.cu), the bf16 one's planes of q, k, v, dout. */
static void attention(struct scratch_run *r, const struct gpt2_shard *s,
                      const struct gpt2_memory_shape *h, bool bf16)
{
    const struct gpt2_config *cfg = &s->cfg;
    uint64_t B = (uint64_t)h->B, T = (uint64_t)h->T, tp = (uint64_t)s->part.tp;
    uint64_t NHt = (uint64_t)cfg->heads / tp, Ct = (uint64_t)cfg->hidden / tp;
    uint64_t tile = GPT2_SCRATCH_ATTENTION_TILE, Tp = ceil_div(T, tile) * tile;
    if (h->fused_attention || h->cp > 1) raise(r, GPT2_SCRATCH_PARTIAL, 4 * B * NHt * T);
    if (bf16) raise(r, GPT2_SCRATCH_ATTENTION, 2 * 7 * B * Tp * Ct);
}

/* An MoE layer's router and experts: bf16 products in bf16 precision, else fp32 (fp8
 * keeps no bf16 copy of them); an expert's rows at most ep·N (a token picks an expert
 * once, from each ep rank), a shared expert's N; the losses' sums (moe.cu). */
static void moe(struct scratch_run *r, const struct gpt2_shard *s, enum plan_precision precision,
                uint64_t N)
{
    const struct gpt2_config *cfg = &s->cfg;
    uint64_t tp = (uint64_t)s->part.tp, ep = s->part.ep > 1 ? (uint64_t)s->part.ep : 1;
    uint64_t C = (uint64_t)cfg->hidden, E = (uint64_t)cfg->experts;
    uint64_t Fm = (uint64_t)cfg->moe_ffn / tp, FCm = (uint64_t)gpt2_expert_fc_rows(cfg) / tp;
    enum product_kind kind = precision == PLAN_PRECISION_BF16 ? PRODUCT_BF16 : PRODUCT_FP32;
    bool fcb = gpt2_shard_holds(s, GPT2_EXPFCB), projb = gpt2_shard_holds(s, GPT2_EXPPROJB);
    product(r, kind, N, C, E, false, true);
    product(r, kind, ep * N, C, FCm, fcb, true);
    product(r, kind, ep * N, Fm, C, projb, true);
    raise(r, GPT2_SCRATCH_MOE, 8 * (E + 3));
}

void gpt2_scratch(const struct gpt2_shard *s, const struct gpt2_memory_shape *shape,
                  const struct gpt2_memory *mem, bool attention_bf16, struct gpt2_scratch *out)
{
    const struct gpt2_config *cfg = &s->cfg;
    const struct gpt2_memory_shape *h = shape;
    memset(out, 0, sizeof *out);
    struct scratch_run r = {.out = out,
                            .block = h->precision == PLAN_PRECISION_FP8 &&
                                     h->fp8_scaling == PLAN_FP8_BLOCK,
                            .backward = true};
    uint64_t tp = (uint64_t)s->part.tp, B = (uint64_t)h->B, T = (uint64_t)h->T, N = B * T;
    uint64_t R = h->sequence_parallel ? N / tp : N, C = (uint64_t)cfg->hidden, Ct = C / tp;
    uint64_t QKVt = (uint64_t)gpt2_qkv_rows(cfg) / tp, FCt = (uint64_t)gpt2_fc_rows(cfg) / tp;
    uint64_t Ft = (uint64_t)gpt2_ffn(cfg) / tp, Vpt = (uint64_t)cfg->padded_vocab / tp;
    enum product_kind kind = h->precision == PLAN_PRECISION_BF16  ? PRODUCT_BF16
                             : h->precision == PLAN_PRECISION_FP8 ? PRODUCT_FP8
                                                                  : PRODUCT_FP32;
    /* a layer's products (runtime/model_forward.c, model_backward.c, model_tp.c), their
     * inputs in bf16 already but the attention's output (gpt2_act16) */
    enum product_kind in16 = h->act16 ? PRODUCT_BF16_IN : kind;
    product(&r, in16, N, C, QKVt, gpt2_shard_holds(s, GPT2_QKVB), true);
    product(&r, kind, N, Ct, C, gpt2_shard_holds(s, GPT2_ATTPROJB), true);
    if (gpt2_shard_holds(s, GPT2_FCW)) { /* a dense MLP in some layer */
        product(&r, in16, N, C, FCt, gpt2_shard_holds(s, GPT2_FCB), true);
        product(&r, in16, N, Ft, C, gpt2_shard_holds(s, GPT2_FCPROJB), true);
    }
    if (gpt2_chunk_moe_layers(s)) moe(&r, s, h->precision, N);
    norm(&r, R, C, !cfg->llama);
    attention(&r, s, h, attention_bf16);
    /* the rotary table of every position of a sequence (cp's chunks sit anywhere in it) */
    uint64_t positions = (uint64_t)T * (uint64_t)(h->cp > 1 ? h->cp : 1);
    if (cfg->llama)
        raise(&r, GPT2_SCRATCH_ROPE, 8 * positions * (uint64_t)(cfg->hidden / cfg->heads / 2));
    if (s->first) /* the embedding's gradient rows: each token's, the distinct ones' */
        raise(&r, GPT2_SCRATCH_INDEX, 4 * (2 * (N < Vpt ? N : Vpt) + 1 + N));
    if (s->last) { /* the LM head, in bf16 but in fp32 runs, a chunk of rows at a time */
        uint64_t Nh = mem->logits_rows ? (uint64_t)mem->logits_rows : N;
        enum product_kind head = kind == PRODUCT_FP32           ? PRODUCT_FP32
                                 : h->act16 && mem->logits_rows ? PRODUCT_BF16_BOTH
                                 : h->act16                     ? PRODUCT_BF16_IN
                                                                : PRODUCT_BF16;
        product(&r, head, Nh, C, Vpt, false, true);
    }
    /* the optimizer (optimizer.cu), over at most one part of each tensor instance: the
     * gradient norm's partials (SUM_BLOCKS per tensor, SUM_TENSORS tensors a launch) and a
     * sum per instance, its table of instances, and adamw_multi's of segments */
    uint64_t parts = (uint64_t)GPT2_TENSORS * (gpt2_shard_layers(s) + 1u);
    uint64_t group = parts < GPT2_SCRATCH_SUM_TENSORS ? parts : GPT2_SCRATCH_SUM_TENSORS;
    raise(&r, GPT2_SCRATCH_PARTIAL, 8 * (group * GPT2_SCRATCH_SUM_BLOCKS + parts));
    raise(&r, GPT2_SCRATCH_SUMSQ, GPT2_SCRATCH_SUM_ROW_BYTES * parts);
    raise(&r, GPT2_SCRATCH_ADAMW, GPT2_SCRATCH_ADAMW_ROW_BYTES * parts);
    /* runtime/device.c's peak measurement, a forward */
    r.backward = false;
    product(&r, kind, GPT2_PEAK_PRODUCT_N, GPT2_PEAK_PRODUCT_C, GPT2_PEAK_PRODUCT_OC, false, false);
    for (int i = 0; i < GPT2_SCRATCH_SLOTS; i++) {
        if (out->slot[i] && out->slot[i] < GPT2_SCRATCH_MIN_BYTES)
            out->slot[i] = GPT2_SCRATCH_MIN_BYTES;
        out->total += out->slot[i];
    }
}
