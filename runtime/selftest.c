/* selftest.c — plait-train --selftest: each op of the CUDA backend run against
 * its CPU twin on the same random inputs, at several shapes (odd ones among
 * them), printed as a table of max relative errors (max |gpu - cpu| / max |cpu|
 * per output) with a verdict; every op also runs twice on the GPU and must give
 * the same bits (deterministic reductions). The fp8 ops run at GPT-2 124M's
 * real product shapes too, where cuBLASLt's block-scale layouts show (a grid
 * of one block cannot be laid out wrong). Only through kernels/ops.h. This file
 * is the harness: the shapes, a run's buffers and outputs, the limits, the table
 * of cases and the loop over them; the cases are selftest_gpt2.c's,
 * selftest_attention.c's, selftest_llama_moe.c's, selftest_fused.c's and
 * selftest_act16.c's (the activations stored in bf16, whose bf16 outputs are
 * counted in bf16 ulps instead). */
#include "runtime/selftest.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/place/env.h"
#include "common/rng.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/ops.h"
#include "runtime/selftest_cases.h"

static const struct shape shapes[] = {
    {2, 5, 12, 3, 37, 40, 20, 0, 0, 0, 0, 0},
    {3, 37, 72, 6, 301, 320, 200, 0, 0, 0, 0, 0},
    {4, 128, 256, 4, 1000, 1024, 768, 0, 0, 0, 0, 0},
    /* GPT-2 124M: T 1024, C 768, 12 heads, its vocabulary and the padded one,
     * the MLP's 4·C; two sequences (left out with the CPU twin unless
     * PLAIT_SELFTEST_SHAPES=all: minutes of CPU against itself) */
    {2, 1024, 768, 12, 50257, 50304, 3072, 0, 0, 0, 0, 0},
};
enum { SMALL_SHAPES = 3 };

/* GPT-2 124M's four products of a block on 1024 rows (C → OC): qkv, the
 * attention's projection, the MLP's two; the fp8 ops run at these too */
static const struct shape gpt2_shapes[] = {
    {1, 1024, 768, 12, 50257, 50304, 2304, 0, 0, 0, 0, 0},
    {1, 1024, 768, 12, 50257, 50304, 768, 0, 0, 0, 0, 0},
    {1, 1024, 768, 12, 50257, 50304, 3072, 0, 0, 0, 0, 0},
    {1, 1024, 3072, 12, 50257, 50304, 768, 0, 0, 0, 0, 0},
};

/* The limit of an fp8 product that runs on fp8 tensor cores, against the
 * CPU's fp32 sum of the same quantised values (max |gpu - cpu| / max |cpu|).
 * The fp8 products are exact (4 × 4 significant bits, or 4 × 3); the sum is
 * not. Hopper's fp8 MMA keeps about 14 significant bits in its accumulator
 * (DeepSeek-V3, arXiv:2412.19437 §3.3.2), so an addition errs by up to
 * u = 2^-13 of the running sum; cuBLASLt without
 * CUBLASLT_MATMUL_DESC_FAST_ACCUM (matmul_fp8.cu keeps it 0) promotes the
 * partial sums to fp32 every so often: with block scaling at every 128-deep
 * block at least (each has its own scales), with tensor scaling assumed as
 * often (DeepSeek's N_C = 128; CUTLASS's sm90 fp8 kernels promote every four
 * k32 MMAs). In a chunk of L = 128 products of zero mean and variance σ², the
 * i-th addition errs by at most u·|S_i|, E S_i² = i·σ²: a chunk's error
 * variance is at most u²σ²·L(L+1)/2, K/L chunks' u²σ²·K(L+1)/2, against the
 * sum's K·σ²: an rms relative error of at most u·√((L+1)/2) = 9.8e-4 at any K
 * (256 to 3072 here). The ratio of maxima over the same 10^5 to 3·10^6 entries
 * follows the rms ratio within a small factor (emulating a truncating 14-bit
 * accumulator promoted every 128 on these inputs gives 6e-4 to 7e-4 at K =
 * 256 to 3072); the limit is twice the bound, 2.0e-3. Without the promotion
 * the error would grow as u·√((K+1)/2) and faster with a truncating
 * accumulator's drift (the same emulation: 3.7e-2 at K = 3072), which this
 * limit catches. (A product that cannot run on fp8 tensor cores runs the
 * CPU's own emulation in fp32, within the fp32 limit.) */
static double fp8_tensor_core_limit(void)
{
    const double u = 0x1p-13, L = 128;
    return 2 * u * sqrt((L + 1) / 2);
}

void *selftest_dev(struct run *r, size_t bytes)
{
    void *p = r->n_held < MAX_HELD ? r->o->alloc(r->ctx, bytes) : NULL;
    if (!p) {
        r->broken = true;
        return NULL;
    }
    r->held[r->n_held++] = p;
    return p;
}

/* n random floats, normal·scale (+ shift), uploaded */
float *selftest_rnd(struct run *r, size_t n, float scale, float shift)
{
    float *h = malloc(n * sizeof *h), *d = selftest_dev(r, n * sizeof *h);
    for (size_t i = 0; h && i < n; i++) h[i] = (float)rng_normal(&r->rng) * scale + shift;
    if (h && d)
        r->o->upload(r->ctx, d, h, n * sizeof *h);
    else
        r->broken = true;
    free(h);
    return d;
}

/* n tokens in [0, below) */
/* host's n ints uploaded (and freed) */
int32_t *selftest_upload_ints(struct run *r, int32_t *host, size_t n)
{
    int32_t *d = selftest_dev(r, n * sizeof *host);
    if (host && d)
        r->o->upload(r->ctx, d, host, n * sizeof *host);
    else
        r->broken = true;
    free(host);
    return d;
}

int32_t *selftest_tokens(struct run *r, size_t n, int below)
{
    int32_t *h = malloc(n * sizeof *h);
    for (size_t i = 0; h && i < n; i++) h[i] = (int32_t)rng_below(&r->rng, (uint64_t)below);
    return selftest_upload_ints(r, h, n);
}

/* h (n floats, malloc'd, now the run's) kept as output `name` */
static void keep(struct run *r, const char *name, float *h, size_t n)
{
    r->out_name[r->n_out] = name;
    r->out_len[r->n_out] = n;
    r->out[r->n_out++] = h;
}

void selftest_out(struct run *r, const char *name, const void *d, size_t n)
{
    if (r->broken || r->n_out == MAX_OUTS) return;
    float *h = malloc(n * sizeof *h);
    if (!h) {
        r->broken = true;
        return;
    }
    r->o->download(r->ctx, h, d, n * sizeof *h);
    keep(r, name, h, n);
}

/* host values (integers, or doubles the op hands back on the host), as floats: exact
 * up to 2^24, which every count here is */
void selftest_out_host(struct run *r, const char *name, const double *v, size_t n, bool exact)
{
    if (r->broken || r->n_out == MAX_OUTS) return;
    float *h = malloc(n * sizeof *h);
    if (!h) {
        r->broken = true;
        return;
    }
    for (size_t i = 0; i < n; i++) h[i] = (float)v[i];
    r->out_exact[r->n_out] = exact;
    keep(r, name, h, n);
}

/* n int32s of the device, which must be equal */
void selftest_out_ints(struct run *r, const char *name, const int32_t *d, size_t n)
{
    int32_t *h = r->broken ? NULL : malloc(n * sizeof *h);
    double *v = h ? malloc(n * sizeof *v) : NULL;
    if (v) {
        r->o->download(r->ctx, h, d, n * sizeof *h);
        for (size_t i = 0; i < n; i++) v[i] = h[i];
        selftest_out_host(r, name, v, n, true);
    } else {
        r->broken = true;
    }
    free(h);
    free(v);
}

/* an output summed in fp32 by an fp8 op (its bias gradient): the fp32 limit */
void selftest_out_fp32(struct run *r, const char *name, const void *d, size_t n)
{
    int k = r->n_out;
    selftest_out(r, name, d, n);
    if (r->n_out > k) r->out_fp32[k] = true;
}

/* a bf16 output, widened exactly to floats for the comparison */
void selftest_out16(struct run *r, const char *name, const uint16_t *d, size_t n)
{
    if (r->broken || r->n_out == MAX_OUTS) return;
    uint16_t *h16 = malloc(n * sizeof *h16);
    float *h = malloc(n * sizeof *h);
    if (!h || !h16) {
        free(h);
        free(h16);
        r->broken = true;
        return;
    }
    r->o->download(r->ctx, h16, d, n * sizeof *h16);
    for (size_t i = 0; i < n; i++) {
        uint32_t bits = (uint32_t)h16[i] << 16;
        memcpy(&h[i], &bits, sizeof bits);
    }
    free(h16);
    keep(r, name, h, n);
}

/* a bf16 activation (a ..._forward16 op's output), widened exactly, compared in bf16
 * ulps: act16_beyond */
void selftest_out_act16(struct run *r, const char *name, const uint16_t *d, size_t n)
{
    int k = r->n_out;
    selftest_out16(r, name, d, n);
    if (r->n_out > k) r->out_act16[k] = true;
}

/* fp8 codes, each widened to its code number (equal floats: the same bits) */
void selftest_out8(struct run *r, const char *name, const uint8_t *d, size_t n)
{
    if (r->broken || r->n_out == MAX_OUTS) return;
    uint8_t *h8 = malloc(n);
    float *h = malloc(n * sizeof *h);
    if (!h || !h8) {
        free(h);
        free(h8);
        r->broken = true;
        return;
    }
    r->o->download(r->ctx, h8, d, n);
    for (size_t i = 0; i < n; i++) h[i] = (float)h8[i];
    free(h8);
    keep(r, name, h, n);
}

static void run_free(struct run *r)
{
    for (int i = 0; i < r->n_held; i++) r->o->free(r->ctx, r->held[i]);
    for (int i = 0; i < r->n_out; i++) free(r->out[i]);
    memset(r, 0, sizeof *r);
}

static bool has_attention_block(const struct ops *o)
{
    return o->attention_block_forward && o->attention_block_backward;
}

/* its head sizes (16, 32, 64), odd lengths that end inside a 64-row tile,
 * and GPT-2 124M's own (T 1024, C 768, 12 heads) */
static const struct shape attention_bf16_shapes[] = {
    {2, 37, 64, 4, 0, 0, 0, 0, 0, 0, 0, 0},
    {3, 100, 96, 3, 0, 0, 0, 0, 0, 0, 0, 0},
    {1, 200, 128, 2, 0, 0, 0, 0, 0, 0, 0, 0},
    {2, 1024, 768, 12, 0, 0, 0, 0, 0, 0, 0, 0},
};

/* GPT-2 124M's width on 4096 tokens: 8 experts with 2 choices, with and without a
 * capacity of 1.25·k·N/E; 64 experts with 1 and 2 (the latter as cp's two runs of a
 * rank's chunks), and small odd ones */
static const struct shape moe_shapes[] = {
    {.B = 4, .T = 1024, .C = 768, .E = 8, .k = 2, .runs = 1},
    {.B = 4, .T = 1024, .C = 768, .E = 8, .k = 2, .capacity = 1280, .runs = 1},
    {.B = 4, .T = 1024, .C = 768, .E = 64, .k = 1, .capacity = 80, .runs = 1},
    {.B = 4, .T = 1024, .C = 768, .E = 64, .k = 2, .capacity = 160, .runs = 2},
    {.B = 2, .T = 19, .C = 72, .E = 5, .k = 3, .capacity = 9, .runs = 2},
};

/* the fused residual add and norm: odd widths, GPT-2 124M's (768), and past the 1024
 * columns a warp keeps in registers (a row's rest read back): 1100, Llama 3 8B's 4096 */
static const struct shape residual_norm_shapes[] = {
    {.B = 2, .T = 5, .C = 12},     {.B = 3, .T = 37, .C = 72},  {.B = 4, .T = 128, .C = 256},
    {.B = 2, .T = 1024, .C = 768}, {.B = 3, .T = 7, .C = 1100}, {.B = 1, .T = 256, .C = 4096},
};

/* rotary positions with the key/value expansion: hs 4 multi-query, hs 12 in groups of 2,
 * hs 8 with NKV = NH (no groups), and Llama 3 8B's heads (32 of 128, 8 key/value) */
static const struct shape rope_kv_shapes[] = {
    {.B = 2, .T = 5, .C = 12, .NH = 3, .NKV = 1},
    {.B = 3, .T = 37, .C = 72, .NH = 6, .NKV = 3},
    {.B = 2, .T = 9, .C = 40, .NH = 5, .NKV = 5},
    {.B = 1, .T = 256, .C = 4096, .NH = 32, .NKV = 8},
};

/* the products that read a bf16 activation (ops.h's matmul_forward16, matmul_backward16):
 * small odd ones, then GPT-2 124M's on 1024 rows: qkv's and the MLP's first (reading the
 * LayerNorms' outputs), the MLP's second (reading GELU's), and the LM head (the final
 * LayerNorm's, into the padded vocabulary) on 256 rows; with PLAIT_SELFTEST_SHAPES=small
 * (and the CPU against itself) the first three */
static const struct shape product16_shapes[] = {
    {2, 5, 12, 3, 37, 40, 20, 0, 0, 0, 0, 0},
    {3, 37, 72, 6, 301, 320, 200, 0, 0, 0, 0, 0},
    {4, 128, 256, 4, 1000, 1024, 768, 0, 0, 0, 0, 0},
    {1, 1024, 768, 12, 50257, 50304, 2304, 0, 0, 0, 0, 0},
    {1, 1024, 768, 12, 50257, 50304, 3072, 0, 0, 0, 0, 0},
    {1, 1024, 3072, 12, 50257, 50304, 768, 0, 0, 0, 0, 0},
    {1, 256, 768, 12, 50257, 50304, 50304, 0, 0, 0, 0, 0},
};

/* the LM head with bf16 activations (ops.h's classifier16, classifier_finish16,
 * matmul_backward_dout16; OC = Vp, the dlogits' width): small odd ones, then GPT-2 124M's
 * on 256 rows (the chunked logits); with PLAIT_SELFTEST_SHAPES=small the first three */
static const struct shape head16_shapes[] = {
    {2, 5, 12, 3, 37, 40, 40, 0, 0, 0, 0, 0},
    {3, 37, 72, 6, 301, 320, 320, 0, 0, 0, 0, 0},
    {4, 128, 256, 4, 1000, 1024, 1024, 0, 0, 0, 0, 0},
    {1, 256, 768, 12, 50257, 50304, 50304, 0, 0, 0, 0, 0},
};

static bool has_residual_layernorm(const struct ops *gpu)
{
    return gpu->residual_layernorm_forward != NULL;
}

static bool has_residual_rmsnorm(const struct ops *gpu)
{
    return gpu->residual_rmsnorm_forward != NULL;
}

static bool has_rope_kv_expand(const struct ops *gpu)
{
    return gpu->rope_kv_expand && gpu->rope_kv_expand_backward;
}

static bool has_moe_ops(const struct ops *gpu)
{
    return gpu->moe_route && gpu->moe_dispatch && gpu->moe_gather && gpu->moe_gather_backward &&
           gpu->moe_combine && gpu->moe_combine_backward && gpu->moe_route_backward &&
           gpu->moe_losses;
}

static bool has_attention_bf16(const struct ops *gpu)
{
    return gpu->attention_forward_bf16 != NULL;
}

static bool has_adamw_multi(const struct ops *gpu)
{
    return gpu->adamw_multi != NULL;
}

/* the activations stored in bf16, an op each (ops.h: NULL where a backend has none) */
static bool has_layernorm16(const struct ops *gpu)
{
    return gpu->layernorm_forward16 != NULL;
}

static bool has_rmsnorm16(const struct ops *gpu)
{
    return gpu->rmsnorm_forward16 != NULL;
}

static bool has_gelu16(const struct ops *gpu)
{
    return gpu->gelu_forward16 != NULL;
}

static bool has_swiglu16(const struct ops *gpu)
{
    return gpu->swiglu_forward16 != NULL;
}

static bool has_matmul_forward16(const struct ops *gpu)
{
    return gpu->matmul_forward16 != NULL;
}

static bool has_matmul_backward16(const struct ops *gpu)
{
    return gpu->matmul_backward16 != NULL;
}

static bool has_matmul_gelu16(const struct ops *gpu)
{
    return gpu->matmul_forward_gelu16 != NULL;
}

static bool has_residual_layernorm16(const struct ops *gpu)
{
    return gpu->residual_layernorm_forward16 != NULL;
}

static bool has_residual_rmsnorm16(const struct ops *gpu)
{
    return gpu->residual_rmsnorm_forward16 != NULL;
}

static bool has_classifier16(const struct ops *gpu)
{
    return gpu->classifier16 != NULL;
}

static bool has_classifier_finish16(const struct ops *gpu)
{
    return gpu->classifier_finish16 != NULL;
}

static bool has_matmul_backward_dout16(const struct ops *gpu)
{
    return gpu->matmul_backward_dout16 != NULL;
}

static bool has_llama_ops(const struct ops *gpu)
{
    return gpu->rmsnorm_forward && gpu->rmsnorm_backward && gpu->rope_forward &&
           gpu->rope_backward && gpu->kv_expand && gpu->kv_expand_backward && gpu->swiglu_forward &&
           gpu->swiglu_backward;
}

/* what of fp8 a case runs (all need fp8 tensor cores: sm_89 and later) */
enum case_fp8 { NO_FP8, FP8_QUANTISER, FP8_PRODUCTS_TENSOR, FP8_PRODUCTS_BLOCK };

static const struct selftest_case {
    const char *name;
    void (*run)(struct run *r);
    double tolerance; /* of max |gpu - cpu| / max |cpu| (fp8 products: see limit()) */
    enum case_fp8 fp8;
    const struct shape *shapes; /* its own shapes (n_shapes), or NULL: the common ones */
    size_t n_shapes;
    int n_small; /* of its own shapes, those run where only the small ones are (0: all) */
    bool (*present)(const struct ops *gpu); /* NULL, or whether the GPU's table has the op */
    const char *once; /* run once, with inputs of its own (this in the shape column) */
} cases[] = {
    {.name = "encoder_forward", .run = selftest_encoder_forward, .tolerance = 1e-6},
    {.name = "encoder_backward", .run = selftest_encoder_backward, .tolerance = 1e-6},
    {.name = "layernorm", .run = selftest_layernorm, .tolerance = 1e-5},
    {.name = "matmul_forward fp32", .run = selftest_matmul_forward_f32, .tolerance = 1e-5},
    {.name = "matmul_forward bf16", .run = selftest_matmul_forward_bf16, .tolerance = 1e-5},
    {.name = "matmul+gelu fp32", .run = selftest_matmul_gelu_f32, .tolerance = 1e-5},
    {.name = "matmul+gelu bf16", .run = selftest_matmul_gelu_bf16, .tolerance = 1e-5},
    {.name = "gelu epilogue fp32",
     .run = selftest_gelu_epilogue_f32,
     .tolerance = 5e-6,
     .once = "x in [-8,8], 2^20"},
    {.name = "gelu epilogue bf16",
     .run = selftest_gelu_epilogue_bf16,
     .tolerance = 5e-6,
     .once = "x in [-8,8], 2^20"},
    {.name = "matmul_backward fp32", .run = selftest_matmul_backward_f32, .tolerance = 1e-5},
    {.name = "matmul_backward bf16", .run = selftest_matmul_backward_bf16, .tolerance = 1e-5},
    /* fp8: the quantiser the same bits; the products take the same codes and
     * scales, fp8_tensor_core_limit() on tensor cores */
    {.name = "quantize_fp8 e4m3",
     .run = selftest_quantize_e4m3,
     .tolerance = 0,
     .fp8 = FP8_QUANTISER},
    {.name = "quantize_fp8 e5m2",
     .run = selftest_quantize_e5m2,
     .tolerance = 0,
     .fp8 = FP8_QUANTISER},
    {.name = "matmul_fwd fp8 tensor",
     .run = selftest_matmul_forward_fp8_tensor,
     .tolerance = 1e-5,
     .fp8 = FP8_PRODUCTS_TENSOR},
    {.name = "matmul_fwd fp8 block",
     .run = selftest_matmul_forward_fp8_block,
     .tolerance = 1e-5,
     .fp8 = FP8_PRODUCTS_BLOCK},
    {.name = "matmul_bwd fp8 tensor",
     .run = selftest_matmul_backward_fp8_tensor,
     .tolerance = 1e-5,
     .fp8 = FP8_PRODUCTS_TENSOR},
    {.name = "matmul_bwd fp8 block",
     .run = selftest_matmul_backward_fp8_block,
     .tolerance = 1e-5,
     .fp8 = FP8_PRODUCTS_BLOCK},
    {.name = "attention", .run = selftest_attention, .tolerance = 1e-5},
    {.name = "attention fused", .run = selftest_attention_fused, .tolerance = 1e-5},
    {.name = "attention block (cp)",
     .run = selftest_attention_block,
     .tolerance = 1e-5,
     .present = has_attention_block},
    {.name = "attention bf16 tc",
     .run = selftest_attention_bf16,
     .tolerance = 1e-2,
     .shapes = attention_bf16_shapes,
     .n_shapes = sizeof attention_bf16_shapes / sizeof *attention_bf16_shapes,
     .present = has_attention_bf16},
    {.name = "gelu/residual/bias/copies", .run = selftest_elementwise, .tolerance = 1e-5},
    /* the Llama family's; kv_expand moves values and adds them in the CPU's
     * order: the same bits */
    {.name = "rmsnorm", .run = selftest_rmsnorm, .tolerance = 1e-5, .present = has_llama_ops},
    {.name = "rope", .run = selftest_rope, .tolerance = 1e-5, .present = has_llama_ops},
    {.name = "kv_expand", .run = selftest_kv_expand, .tolerance = 0, .present = has_llama_ops},
    {.name = "swiglu", .run = selftest_swiglu, .tolerance = 1e-5, .present = has_llama_ops},
/* the fused ops against the CPU's composition of the ops they fuse (selftest_fused.c),
 * within their neighbours' limits, at shapes of their own */
#define SHAPED_SMALL_CASE(n, f, own, small, has)                                                   \
    {                                                                                              \
        .name = n, .run = f, .tolerance = 1e-5, .shapes = own,                                     \
        .n_shapes = sizeof own / sizeof *own, .n_small = small, .present = has                     \
    }
#define SHAPED_CASE(n, f, own, has) SHAPED_SMALL_CASE(n, f, own, 0, has)
/* where only the first 3 shapes are small (PLAIT_SELFTEST_SHAPES=small, the CPU twin) */
#define SMALL3_CASE(n, f, own, has) SHAPED_SMALL_CASE(n, f, own, 3, has)
    SHAPED_CASE("residual+layernorm", selftest_residual_layernorm, residual_norm_shapes,
                has_residual_layernorm),
    SHAPED_CASE("residual+rmsnorm", selftest_residual_rmsnorm, residual_norm_shapes,
                has_residual_rmsnorm),
    SHAPED_CASE("rope+kv_expand", selftest_rope_kv_expand, rope_kv_shapes, has_rope_kv_expand),
    /* the activations stored in bf16 (selftest_act16.c), against the CPU's contract (the
     * namesake, then to_bf16) and its own op where it has one: a bf16 output within one
     * bf16 ulp (act16_beyond), fp32 ones within 1e-5 as their namesakes' */
    {.name = "layernorm16",
     .run = selftest_layernorm16,
     .tolerance = 1e-5,
     .present = has_layernorm16},
    {.name = "rmsnorm16", .run = selftest_rmsnorm16, .tolerance = 1e-5, .present = has_rmsnorm16},
    {.name = "gelu16", .run = selftest_gelu16, .tolerance = 1e-5, .present = has_gelu16},
    {.name = "swiglu16", .run = selftest_swiglu16, .tolerance = 1e-5, .present = has_swiglu16},
    SHAPED_CASE("residual+layernorm16", selftest_residual_layernorm16, residual_norm_shapes,
                has_residual_layernorm16),
    SHAPED_CASE("residual+rmsnorm16", selftest_residual_rmsnorm16, residual_norm_shapes,
                has_residual_rmsnorm16),
    SMALL3_CASE("matmul_forward16", selftest_matmul_forward16, product16_shapes,
                has_matmul_forward16),
    SMALL3_CASE("matmul_backward16", selftest_matmul_backward16, product16_shapes,
                has_matmul_backward16),
    {.name = "matmul+gelu16",
     .run = selftest_matmul_gelu16,
     .tolerance = 1e-5,
     .present = has_matmul_gelu16},
    /* the LM head's (selftest_act16.c): dlogits16 in bf16 ulps, the losses and the
     * products' gradients within 1e-5 as their namesakes' */
    SMALL3_CASE("classifier16", selftest_classifier16, head16_shapes, has_classifier16),
    SMALL3_CASE("classifier_finish16", selftest_classifier_finish16, head16_shapes,
                has_classifier_finish16),
    SMALL3_CASE("matmul_backward_dout16", selftest_matmul_backward_dout16, head16_shapes,
                has_matmul_backward_dout16),
/* a mixture of experts' routing: the choices, rows and counts equal (tolerance 0 for
 * every integer output), the floats within 1e-5 */
#define MOE_CASE(n, f) SHAPED_CASE(n, f, moe_shapes, has_moe_ops)
    MOE_CASE("moe route", selftest_moe_route),
    MOE_CASE("moe dispatch", selftest_moe_dispatch),
    MOE_CASE("moe gather/combine", selftest_moe_rows),
    MOE_CASE("moe route bwd/losses", selftest_moe_route_backward),
#undef MOE_CASE
#undef SHAPED_CASE
#undef SMALL3_CASE
#undef SHAPED_SMALL_CASE
    {.name = "classifier", .run = selftest_classifier, .tolerance = 1e-5},
    {.name = "classifier bad target", .run = selftest_classifier_bad_target, .tolerance = 1e-5},
    {.name = "classifier parts", .run = selftest_classifier_parts, .tolerance = 1e-5},
    /* adamw and to_bf16: the same bits */
    {.name = "adamw/bf16/sumsq", .run = selftest_optimizer, .tolerance = 1e-6},
    /* one launch for many tensors: adamw's bits, and the sums per tensor as before */
    {.name = "adamw multi",
     .run = selftest_adamw_multi,
     .tolerance = 0,
     .present = has_adamw_multi},
    {.name = "sumsq many", .run = selftest_sum_squares_many, .tolerance = 1e-6},
};

static bool fp8_products(const struct selftest_case *c)
{
    return c->fp8 == FP8_PRODUCTS_TENSOR || c->fp8 == FP8_PRODUCTS_BLOCK;
}

/* The limit of output k of case c at shape s: an fp8 product's where cuBLASLt
 * can take it (every dimension a multiple of 16), else the case's own. */
static double limit(const struct selftest_case *c, const struct shape *s, const struct run *r,
                    int k)
{
    bool tensor_cores = N_ROWS(s) % 16 == 0 && s->C % 16 == 0 && s->OC % 16 == 0;
    if (r->out_exact[k] || r->out_act16[k]) return 0; /* act16: a count (act16_beyond) */
    if (fp8_products(c) && tensor_cores && !r->out_fp32[k]) return fp8_tensor_core_limit();
    return c->tolerance;
}

/* max |a - b| / max |b| (0 when both are all zero; inf on a NaN in one only) */
static double rel_error(const float *a, const float *b, size_t n)
{
    double diff = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) != isnan(b[i])) return INFINITY;
        if (isnan(a[i])) continue;
        double d = fabs((double)a[i] - (double)b[i]);
        diff = d > diff ? d : diff;
        scale = fabs((double)b[i]) > scale ? fabs((double)b[i]) : scale;
    }
    return diff == 0 ? 0 : scale == 0 ? INFINITY : diff / scale;
}

/* The spacing of bf16 values just above |v|, v itself a bf16 value: 8 significant bits,
 * 2^-133 below the normal range */
static double bf16_ulp(double v)
{
    int e;
    if (v == 0) return 0x1p-133;
    (void)frexp(fabs(v), &e); /* |v| = m·2^e, m in [0.5, 1) */
    return ldexp(1.0, (e < -125 ? -125 : e) - 8);
}

/* A bf16 output against the CPU's (both bf16 values, widened): how many elements are
 * further apart than one bf16 ulp of the smaller, plus tolerance × max |b|. One ulp: an
 * fp32 value a hair from the CPU's (the namesakes' sums in another order) may round the
 * other way; the fp32 slack: where a value cancels to near 0 (LayerNorm's bias, GELU's
 * 1 + tanh) the namesake's own fp32 limit is more than an ulp there. A NaN on one side
 * only counts. */
static double act16_beyond(const float *a, const float *b, size_t n, double tolerance)
{
    double scale = 0, beyond = 0;
    for (size_t i = 0; i < n; i++)
        if (!isnan(b[i]) && fabs((double)b[i]) > scale) scale = fabs((double)b[i]);
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(b[i])) {
            beyond += isnan(a[i]) != isnan(b[i]);
            continue;
        }
        double x = a[i], y = b[i], d = fabs(x - y); /* inf - inf: NaN, not beyond */
        double ulp = bf16_ulp(fabs(x) < fabs(y) ? x : y);
        beyond += d > ulp + tolerance * scale;
    }
    return beyond;
}

/* One case at one shape (the shape_no-th, which seeds its inputs) on one
 * backend (the CPU's reference run where reference); false with the backend's error. */
static bool run_case(struct run *r, const struct ops *o, struct ops_ctx *ctx, const struct shape *s,
                     int shape_no, const struct selftest_case *c, bool reference, char *why,
                     size_t why_bytes)
{
    memset(r, 0, sizeof *r);
    r->o = o;
    r->ctx = ctx;
    r->s = s;
    r->reference = reference;
    rng_seed(&r->rng, 20261123, (uint64_t)(c - cases) * 131 + (uint64_t)shape_no);
    c->run(r);
    if (o->take_error(ctx, why, why_bytes)) return false;
    if (r->broken) {
        snprintf(why, why_bytes, "%s: out of memory for the case's buffers", o->name);
        return false;
    }
    return true;
}

/* What selftest_run compares with what, and its counts. */
struct bench {
    FILE *f;
    const struct ops *gpu, *cpu;
    struct ops_ctx *cpu_ctx;
    int failures, checks;
};

/* Case c at shape s (the shape_no-th): the CPU once, the GPU (in gpu_ctx)
 * twice; a row an output. */
static void compare(struct bench *b, struct ops_ctx *gpu_ctx, const struct selftest_case *c,
                    const struct shape *s, int shape_no)
{
    char why[512] = "", sh[40];
    snprintf(sh, sizeof sh, "%d,%d,%d,%d,%d,%d,%d", s->B, s->T, s->C, s->NH, s->V, s->Vp, s->OC);
    if (c->once) snprintf(sh, sizeof sh, "%s", c->once);
    if (s->E)
        snprintf(sh, sizeof sh, "N%zu C%d E%d k%d cap%d runs%d", N_ROWS(s), s->C, s->E, s->k,
                 s->capacity, s->runs);
    if (s->NKV) snprintf(sh, sizeof sh, "%d,%d,%d,%d NKV %d", s->B, s->T, s->C, s->NH, s->NKV);
    struct run rc = {0}, rg = {0}, rg2 = {0};
    bool ok_c = run_case(&rc, b->cpu, b->cpu_ctx, s, shape_no, c, true, why, sizeof why);
    bool ok_g = ok_c && run_case(&rg, b->gpu, gpu_ctx, s, shape_no, c, false, why, sizeof why);
    bool ok_g2 = ok_g && run_case(&rg2, b->gpu, gpu_ctx, s, shape_no, c, false, why, sizeof why);
    if (!ok_g2) {
        fprintf(b->f, "%-22s %-30s %-14s %10s %8s %-7s FAIL: %s\n", c->name, sh, "-", "-", "-", "-",
                why);
        b->failures++;
    }
    for (int k = 0; ok_g2 && k < rc.n_out; k++) {
        bool same_n = rg.n_out == rc.n_out && rg2.n_out == rc.n_out;
        bool act16 = rc.out_act16[k];
        double e = !same_n ? INFINITY
                   : act16 ? act16_beyond(rg.out[k], rc.out[k], rc.out_len[k], c->tolerance)
                           : rel_error(rg.out[k], rc.out[k], rc.out_len[k]);
        bool repeat = same_n && !memcmp(rg.out[k], rg2.out[k], rc.out_len[k] * 4);
        double lim = limit(c, s, &rc, k);
        bool pass = e <= lim && repeat;
        char name[40];
        snprintf(name, sizeof name, "%s%s", rc.out_name[k], act16 ? " (ulp)" : "");
        fprintf(b->f, "%-22s %-30s %-14s %10.2e %8.0e %-7s %s\n", c->name, sh, name, e, lim,
                repeat ? "same" : "DIFFERS", pass ? "ok" : "FAIL");
        b->failures += !pass;
        b->checks++;
    }
    run_free(&rc);
    run_free(&rg);
    run_free(&rg2);
}

enum {
    N_SHAPES = sizeof shapes / sizeof *shapes,
    N_GPT2 = sizeof gpt2_shapes / sizeof *gpt2_shapes
};

/* The fp8 products of one scaling at GPT-2's shapes, in a GPU context of
 * their own, so that its fallback line (ops.h's fp8_fallback) speaks of
 * these shapes alone: every dimension is a multiple of 16, so a product that
 * still fell back to fp32 did not test the tensor cores. With tensor scaling
 * that fails a check; block scaling runs on sm_90 only (matmul_fp8.cu), so
 * its line is a note (on an H100 it means the block products went untested). */
static void compare_gpt2_fp8(struct bench *b, int device, enum case_fp8 scaling)
{
    char why[512] = "";
    const char *what = scaling == FP8_PRODUCTS_TENSOR ? "tensor" : "block";
    struct ops_ctx *ctx = b->gpu->open(device, why, sizeof why);
    if (!ctx) {
        fprintf(b->f, "plait-train --selftest: fp8 %s products: a context of their own: %s\n", what,
                why);
        b->failures++;
        b->checks++;
        return;
    }
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++)
        for (int si = 0; cases[ci].fp8 == scaling && si < N_GPT2; si++)
            compare(b, ctx, &cases[ci], &gpt2_shapes[si], N_SHAPES + si);
    if (b->gpu->fp8_fallback) { /* (the CPU has none: it emulates them all) */
        const char *line = b->gpu->fp8_fallback(ctx);
        bool fail = line && scaling == FP8_PRODUCTS_TENSOR;
        fprintf(b->f, "%-22s %-30s %-14s %10s %8s %-7s %s%s%s\n", "fp8 on tensor cores",
                "GPT-2 124M", what, "-", "-", "-",
                !line  ? "ok"
                : fail ? "FAIL"
                       : "note",
                line ? ": " : "", line ? line : "");
        b->failures += fail;
        b->checks += scaling == FP8_PRODUCTS_TENSOR;
    }
    b->gpu->close(ctx);
}

int selftest_run(FILE *f)
{
    char why[512] = "";
    const char *env = getenv(PLAIT_ENV_DEVICE), *twin = getenv("PLAIT_SELFTEST_TWIN");
    int device = env && *env >= '0' && *env <= '9' ? atoi(env) : 0;
    struct bench b = {.f = f, .cpu = ops_cpu()};
    struct ops_ctx *gpu_ctx = NULL;
    if (!(b.cpu_ctx = b.cpu->open(0, why, sizeof why))) {
        fprintf(f, "plait-train --selftest: the cpu backend: %s\n", why);
        return PLAIT_EXIT_ERROR;
    }
    if (twin && !strcmp(twin, "cpu")) { /* the harness itself, without a GPU (make test) */
        b.gpu = b.cpu;
        fprintf(f, "plait-train --selftest: PLAIT_SELFTEST_TWIN=cpu: the CPU against itself\n");
    } else if (ops_cuda_device_count(why, sizeof why) == 0) {
        fprintf(f, "plait-train --selftest: skipped: %s (exit %d)\n", why, PLAIT_EXIT_SKIPPED);
        b.cpu->close(b.cpu_ctx);
        return PLAIT_EXIT_SKIPPED;
    } else if (!(b.gpu = ops_cuda(why, sizeof why))) {
        fprintf(f, "plait-train --selftest: the CUDA backend: %s\n", why);
        b.cpu->close(b.cpu_ctx);
        return PLAIT_EXIT_ERROR;
    } else {
        fprintf(f, "plait-train --selftest: each CUDA op (device %d) against kernels/cpu\n",
                device);
    }
    if (!(gpu_ctx = b.gpu->open(device, why, sizeof why))) {
        fprintf(f, "plait-train --selftest: the %s backend on device %d: %s\n", b.gpu->name, device,
                why);
        b.cpu->close(b.cpu_ctx);
        return PLAIT_EXIT_ERROR;
    }
    fprintf(f,
            "error = max |gpu - cpu| / max |cpu|; repeat = a second GPU run gives the same bits\n");
    fprintf(f, "(ulp): a bf16 output; error = its elements more than one bf16 ulp (plus the "
               "case's fp32 limit of max |cpu|) from the CPU's\n");
    fprintf(f, "%-22s %-30s %-14s %10s %8s %-7s %s\n", "op", "shape B,T,C,NH,V,Vp,OC", "output",
            "error", "limit", "repeat", "verdict");
    /* GPT-2's shape with the CPU twin is the CPU against itself for minutes */
    const char *which = getenv("PLAIT_SELFTEST_SHAPES"); /* "all" or "small" */
    int n_shapes = N_SHAPES;
    if (which ? !strcmp(which, "small") : b.gpu == b.cpu) n_shapes = SMALL_SHAPES;
    bool fp8 = b.gpu->matmul_forward_fp8 && b.gpu->quantize_fp8;
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        const struct selftest_case *c = &cases[ci];
        if (c->fp8 != NO_FP8 && !fp8) {
            fprintf(f, "%-22s %-30s %-14s %10s %8s %-7s skipped: no fp8 tensor cores (sm_89+)\n",
                    c->name, "-", "-", "-", "-", "-");
            continue;
        }
        if (c->present && !c->present(b.gpu)) {
            fprintf(f, "%-22s %-30s %-14s %10s %8s %-7s skipped: not in the %s backend\n", c->name,
                    "-", "-", "-", "-", "-", b.gpu->name);
            continue;
        }
        const struct shape *own = c->shapes ? c->shapes : shapes;
        int n_own = c->shapes ? (int)c->n_shapes : c->once ? 1 : n_shapes;
        if (c->shapes && c->n_small && n_shapes == SMALL_SHAPES) n_own = c->n_small;
        for (int si = 0; si < n_own; si++) compare(&b, gpu_ctx, c, &own[si], si);
        for (int si = 0; c->fp8 == FP8_QUANTISER && si < N_GPT2; si++)
            compare(&b, gpu_ctx, c, &gpt2_shapes[si], N_SHAPES + si);
    }
    if (fp8) {
        compare_gpt2_fp8(&b, device, FP8_PRODUCTS_TENSOR);
        compare_gpt2_fp8(&b, device, FP8_PRODUCTS_BLOCK);
    }
    fprintf(f, "plait-train --selftest: %s: %d of %d checks failed\n",
            b.failures ? "FAILED" : "passed", b.failures, b.checks);
    if (b.gpu->fp8_fallback && b.gpu->fp8_fallback(gpu_ctx)) /* the small shapes do, by design */
        fprintf(f, "plait-train --selftest: %s\n", b.gpu->fp8_fallback(gpu_ctx));
    b.gpu->close(gpu_ctx);
    b.cpu->close(b.cpu_ctx);
    return b.failures ? PLAIT_EXIT_ERROR : PLAIT_EXIT_OK;
}
