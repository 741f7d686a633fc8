/* cost.c — the arithmetic behind cost.h: what one rank of a tp × pp × dp
 * layout holds in device memory (ZeRO paper for the model state, Korthikanti
 * et al. 2022 without dropout for activations), what it sends per optimizer
 * step on each communicator, and a step-time estimate from those. No I/O, no
 * allocation, no knowledge of where the links are (that is place.c's). */
#include "common/cost.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* Notation (Megatron / Korthikanti): s = seq_len T, b = micro_batch, h = hidden
 * C, a = heads, L = layers, Vp = padded vocab, t = tp, m = grad_accum
 * (micro-batches per step per pipeline), d = dp. A "value" is one tensor
 * element; its width in bytes depends on the precision.
 *
 * Shards are rounded up (ceil(x/t)): when the degree divides the dimension (as
 * the plan rules require: tp divides heads and padded_vocab) they are exact;
 * otherwise the result is the largest rank's shard. */

/* ---- saturating unsigned arithmetic: an absurd plan must read as "too big",
 * never wrap around to something that fits ------------------------------------------------ */

static uint64_t mul_sat(uint64_t x, uint64_t y)
{
    uint64_t r;
    return __builtin_mul_overflow(x, y, &r) ? UINT64_MAX : r;
}

static uint64_t add_sat(uint64_t x, uint64_t y)
{
    uint64_t r;
    return __builtin_add_overflow(x, y, &r) ? UINT64_MAX : r;
}

static uint64_t ceil_div(uint64_t x, uint64_t y)
{
    return x / y + (x % y != 0);
}

static uint64_t u(int x) /* plan fields are validated ≥ 1; be safe anyway */
{
    return x > 0 ? (uint64_t)x : 0;
}

/* A degree below 1 would divide by zero; the header asks for concrete
 * degrees, so treat anything else as 1 rather than fail. */
static struct cost_layout layout_sane(struct cost_layout l)
{
    if (l.tp < 1) l.tp = 1;
    if (l.pp < 1) l.pp = 1;
    if (l.dp < 1) l.dp = 1;
    return l;
}

/* ---- how the model splits --------------------------------------------------------------- */

/* Transformer layers of pipeline stage `stage`: L/pp each; when pp does not
 * divide L the first L % pp stages get one more (stage 0 also holds wte, so
 * this front-loads memory; the plan rules may refuse uneven splits anyway). */
static int stage_layers(int layers, int pp, int stage)
{
    return layers / pp + (stage < layers % pp);
}

/* Parameters one rank of `stage` holds: Megatron sharding of the llm.c GPT-2
 * layout (common/gpt2_layout.c). Per layer:
 *   ln1 w,b            (2C)          replicated
 *   qkv W, b           (3C×C), (3C)  column-parallel: / t
 *   attn proj W        (C×C)         row-parallel:    / t
 *   attn proj b        (C)           replicated (added after the all-reduce)
 *   ln2 w,b            (2C)          replicated
 *   fc W, b            (4C×C), (4C)  column-parallel: / t
 *   fc proj W          (C×4C)        row-parallel:    / t
 *   fc proj b          (C)           replicated
 * i.e. 12C²/t + 7C/t + 6C (12C² + 13C at t = 1, llm.c's count). Stage 0 adds
 * wte (Vp×C) vocab-parallel (/ t) and wpe (maxT×C) replicated; the last stage
 * adds the final LayerNorm (2C) and, when pp > 1, its own wte shard for the
 * tied LM head (Megatron keeps the two copies equal with an all-reduce of
 * their gradients between the first and last stage). */
static uint64_t stage_param_count(const struct plan *p, struct cost_layout l, int stage)
{
    uint64_t C = u(p->model.hidden), t = u(l.tp);
    uint64_t C_t = ceil_div(C, t); /* hidden columns of a tp shard */
    uint64_t per_layer = add_sat(mul_sat(12 * C_t, C), 7 * C_t + 6 * C);
    uint64_t n = mul_sat(u(stage_layers(p->model.layers, l.pp, stage)), per_layer);
    uint64_t wte_shard = mul_sat(ceil_div(u(p->model.padded_vocab), t), C); /* (Vp/t, C) */
    if (stage == 0) n = add_sat(n, add_sat(wte_shard, mul_sat(u(p->model.max_seq_len), C)));
    if (stage == l.pp - 1) {
        n = add_sat(n, 2 * C); /* final LayerNorm */
        if (l.pp > 1) n = add_sat(n, wte_shard);
    }
    return n;
}

/* ---- model state: parameters, gradients, optimizer (ZeRO paper) -------------------------- */

/* Bytes per parameter, after Rajbhandari et al. 2020 ("ZeRO: Memory
 * Optimizations Toward Training Trillion Parameter Models"), §3.1: mixed
 * precision Adam keeps 2Ψ (16-bit params) + 2Ψ (16-bit grads) + KΨ optimizer
 * state with K = 12 (fp32 master params, momentum, variance): 16 bytes per
 * parameter. fp32 training keeps 4Ψ params + 4Ψ grads + 8Ψ for the two fp32
 * moments: also 16. */
struct state_widths {
    uint64_t param_bytes, grad_bytes, optimizer_bytes;
};

static struct state_widths state_widths(enum plan_precision precision)
{
    if (precision == PLAN_PRECISION_BF16) return (struct state_widths){2, 2, 12};
    return (struct state_widths){4, 4, 8};
}

/* ZeRO partitions, over the d data-parallel ranks (§5, Figure 1):
 * stage 1 (P_os) the optimizer state, stage 2 (P_os+g) also the gradients,
 * stage 3 (P_os+g+p) also the parameters. A partition is ceil(Ψ/d) values. */
static void model_state(uint64_t psi, enum plan_precision precision, int zero, int dp,
                        struct cost_memory *out)
{
    struct state_widths w = state_widths(precision);
    uint64_t part = dp > 1 ? ceil_div(psi, (uint64_t)dp) : psi;
    out->params = mul_sat(zero >= 3 ? part : psi, w.param_bytes);
    out->grads = mul_sat(zero >= 2 ? part : psi, w.grad_bytes);
    out->optimizer = mul_sat(zero >= 1 ? part : psi, w.optimizer_bytes);
    out->param_count = psi > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)psi;
}

void cost_model_state(int64_t param_count, enum plan_precision precision, int zero, int dp,
                      struct cost_memory *out)
{
    memset(out, 0, sizeof *out);
    model_state(param_count > 0 ? (uint64_t)param_count : 0, precision, zero, dp, out);
    out->total = add_sat(add_sat(out->params, out->grads), out->optimizer);
}

/* ---- activations (Korthikanti et al. 2022, without dropout) ------------------------------ */

/* Bytes of one activation value: 16-bit in bf16 training, 4 bytes in fp32. */
static uint64_t activation_bytes(enum plan_precision precision)
{
    return precision == PLAN_PRECISION_BF16 ? 2 : 4;
}

/* Values one layer keeps for backward per micro-batch on one tp rank.
 *
 * Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
 * Transformer Models", §4.1 (16-bit values, bytes): attention 11sbh + 5as²b
 * (QKV input 2sbh, Q and K 4sbh, softmax output 2as²b, its dropout mask
 * as²b, dropout output 2as²b (the input of softmax·V), V 2sbh, projection
 * input 2sbh, output dropout mask sbh); MLP 19sbh (fc input 2sbh, GeLU input
 * 8sbh, GeLU output 8sbh, dropout mask sbh); two LayerNorm inputs 4sbh: eq. 1,
 * 34sbh + 5as²b; with tensor parallelism and no sequence parallelism (§4.2.1,
 * eq. 2) sbh(10 + 24/t + 5as/(ht)).
 *
 * This GPT-2 has no dropout. That removes the two masks (sbh + as²b) and the
 * dropout output too, since softmax·V then reads the softmax output that is
 * already stored (2as²b): per layer 32sbh + 2as²b bytes, and with tp
 * sbh(8 + 24/t + 2as/(ht)) bytes. In values (÷2), the tensors runtime/model.h
 * struct layer_acts keeps:
 *   replicated over tp:  ln1 input (the layer input), ln1 output (qkv input),
 *                        ln2 input (residual), ln2 output (fc input)     4sbh
 *   column/row shards:   q, k, v 3sbh/t; attention output (proj input) sbh/t;
 *                        GeLU input 4sbh/t; GeLU output 4sbh/t          12sbh/t
 *   attention core:      softmax output (a/t)·s²·b                      as²b/t
 * Selective recompute (§5) recomputes the attention core and drops the as²b
 * term; full recompute keeps only the layer input, sbh values. */
static uint64_t layer_activation_values(const struct plan *p, struct cost_layout l)
{
    uint64_t s = u(p->model.seq_len), b = u(p->batch.micro_batch), h = u(p->model.hidden);
    uint64_t t = u(l.tp);
    uint64_t sb = mul_sat(s, b);
    if (p->recompute == PLAN_RECOMPUTE_FULL) return mul_sat(sb, h);
    uint64_t n = mul_sat(sb, add_sat(4 * h, 12 * ceil_div(h, t)));
    if (p->recompute == PLAN_RECOMPUTE_NONE)
        n = add_sat(n, mul_sat(ceil_div(u(p->model.heads), t), mul_sat(mul_sat(s, s), b)));
    return n;
}

/* Micro-batches whose activations stage `stage` holds at once under 1F1B:
 * stage k runs pp − k forwards before its first backward, so it holds
 * min(pp − k, m) (Narayanan et al. 2021, PipeDream-Flush / Megatron 1F1B);
 * pp = 1 (plain gradient accumulation) holds one. */
static uint64_t stage_in_flight(const struct plan *p, struct cost_layout l, int stage)
{
    int n = l.pp - stage, m = p->batch.grad_accum;
    return u(n < m ? n : m);
}

/* Activations of one rank of `stage` at its peak, in bytes: in-flight
 * micro-batches × its layers × the per-layer values above; the last stage
 * adds, for the one micro-batch it works on, the final LayerNorm's input and
 * output (2sbh values; not recomputed) and the logits, b·s·Vp/t values kept in
 * fp32 (4 bytes) for the loss and its gradient (cf. Korthikanti §4.3). The
 * first stage's token ids (b·s int32) are left out: 1/h of a layer input. */
static uint64_t stage_activation_bytes(const struct plan *p, struct cost_layout l, int stage)
{
    uint64_t w = activation_bytes(p->precision);
    uint64_t values = mul_sat(
        mul_sat(stage_in_flight(p, l, stage), u(stage_layers(p->model.layers, l.pp, stage))),
        layer_activation_values(p, l));
    uint64_t bytes = mul_sat(values, w);
    if (stage == l.pp - 1) {
        uint64_t sb = mul_sat(u(p->model.seq_len), u(p->batch.micro_batch));
        uint64_t lnf = mul_sat(mul_sat(2 * sb, u(p->model.hidden)), w);
        uint64_t logits = mul_sat(mul_sat(sb, ceil_div(u(p->model.padded_vocab), u(l.tp))), 4);
        bytes = add_sat(bytes, add_sat(lnf, logits));
    }
    return bytes;
}

/* ---- memory ------------------------------------------------------------------------------ */

void cost_memory_stage(const struct plan *p, struct cost_layout l, int stage,
                       struct cost_memory *out)
{
    memset(out, 0, sizeof *out);
    l = layout_sane(l);
    if (stage < 0 || stage >= l.pp) return; /* no such stage: nothing held */
    model_state(stage_param_count(p, l, stage), p->precision, p->parallel.zero, l.dp, out);
    out->activations = stage_activation_bytes(p, l, stage);
    out->total =
        add_sat(add_sat(out->params, out->grads), add_sat(out->optimizer, out->activations));
}

void cost_memory(const struct plan *p, struct cost_layout l, struct cost_memory *out, int *stage)
{
    l = layout_sane(l);
    int worst = 0;
    cost_memory_stage(p, l, 0, out);
    for (int k = 1; k < l.pp; k++) {
        struct cost_memory m;
        cost_memory_stage(p, l, k, &m);
        if (m.total > out->total) {
            *out = m;
            worst = k;
        }
    }
    if (stage) *stage = worst;
}

/* ---- traffic ----------------------------------------------------------------------------- */

/* Bytes a ring all-reduce of `bytes` sends from each of n ranks: a
 * reduce-scatter and an all-gather, each (n−1)/n of the buffer (Patarasuk &
 * Yuan 2009; what NCCL's ring does). */
static double ring_allreduce_bytes(double bytes, int n)
{
    return n > 1 ? 2.0 * (n - 1) / n * bytes : 0.0;
}

/* Bytes one rank of `stage` sends per optimizer step on each communicator. */
static struct cost_traffic stage_traffic(const struct plan *p, struct cost_layout l, int stage)
{
    struct cost_traffic out = {0, 0, 0};
    double m = p->batch.grad_accum;
    /* one activation (or its gradient): s·b·h values in the activation precision */
    double act_bytes = (double)p->model.seq_len * p->batch.micro_batch * p->model.hidden *
                       (double)activation_bytes(p->precision);

    /* tp (Megatron-LM, Shoeybi et al. 2019, §3, no sequence parallelism): each
     * layer all-reduces the s·b·h output of the attention block and of the MLP
     * in forward (g) and their input gradients in backward (f): 4 per layer
     * per micro-batch; full recompute repeats the forward's 2. The
     * vocab-parallel embedding adds 1 forward all-reduce on the first stage;
     * the LM head (column-parallel over the vocabulary) 1 backward all-reduce
     * of its input gradient on the last stage. The vocab-parallel
     * cross-entropy's all-reduces of s·b values (max, sum, target logit) are
     * 1/h of one of those and left out. */
    if (l.tp > 1) {
        double per_layer = p->recompute == PLAN_RECOMPUTE_FULL ? 6 : 4;
        double n = per_layer * stage_layers(p->model.layers, l.pp, stage);
        if (stage == 0) n += 1;
        if (stage == l.pp - 1) n += 1;
        out.tp_bytes = n * m * ring_allreduce_bytes(act_bytes, l.tp);
    }

    /* pp: each micro-batch's activation goes forward across every stage
     * boundary and its gradient comes back; every tp rank sends the full
     * s·b·h (no scatter/gather optimisation). A middle stage sends both, the
     * first only activations, the last only gradients. */
    if (l.pp > 1) {
        double sends = (stage < l.pp - 1) + (stage > 0);
        out.pp_bytes = sends * m * act_bytes;
    }

    /* dp, once per optimizer step on this rank's Ψ (its tp × pp shard), values
     * as wide as the gradients (2 bytes bf16 per the ZeRO paper, 4 fp32),
     * after ZeRO §7: stage 0 and 1 all-reduce the gradients, 2(d−1)/d·Ψ;
     * stage 2 reduce-scatters gradients and all-gathers the updated
     * parameters, (d−1)/d·Ψ each; stage 3 all-gathers the parameters for
     * forward and again for backward and reduce-scatters the gradients,
     * 3(d−1)/d·Ψ (1.5× the all-reduce). This is the floor: implementations
     * that reduce or gather per micro-batch send up to m times as much. */
    if (l.dp > 1) {
        struct state_widths w = state_widths(p->precision);
        double psi = (double)stage_param_count(p, l, stage), d = l.dp;
        double share = (d - 1) / d * psi;
        if (p->parallel.zero >= 3)
            out.dp_bytes = 3 * share * (double)w.grad_bytes;
        else if (p->parallel.zero == 2)
            out.dp_bytes = share * (double)w.grad_bytes + share * (double)w.param_bytes;
        else
            out.dp_bytes = 2 * share * (double)w.grad_bytes;
    }
    return out;
}

/* Each communicator's busiest rank, taken separately (the tp peak and the dp
 * peak may sit on different stages). */
void cost_traffic(const struct plan *p, struct cost_layout l, struct cost_traffic *out)
{
    l = layout_sane(l);
    *out = (struct cost_traffic){0, 0, 0};
    for (int k = 0; k < l.pp; k++) {
        struct cost_traffic t = stage_traffic(p, l, k);
        out->tp_bytes = fmax(out->tp_bytes, t.tp_bytes);
        out->pp_bytes = fmax(out->pp_bytes, t.pp_bytes);
        out->dp_bytes = fmax(out->dp_bytes, t.dp_bytes);
    }
}

/* ---- step time --------------------------------------------------------------------------- */

/* Model FLOPs one rank of `stage` does per optimizer step. Per token, a
 * matmul with N weights costs 2N forward and 4N backward: 6N (Kaplan et al.
 * 2020, §2.1); attention's two s×s products (Q·Kᵀ and softmax·V) cost
 * 2·2·s·h per layer forward, 12·s·h forward and backward (PaLM, Chowdhery et
 * al. 2022, App. B: 6N + 12·L·h·s). Here N is the rank's matmul weights:
 * 12h²/t per layer, plus the LM head Vp·h/t on the last stage (the embedding
 * lookup and biases, LayerNorms are not matmuls), and the attention term is
 * divided by t (heads are split). Tokens per rank per step: b·s·m.
 * Recompute adds forward work: selective the attention core's 4·s·h/t per
 * layer per token (Korthikanti §5; the softmax itself is not counted); full
 * the whole layer forward, 2·12h²/t + 4·s·h/t (the layers' part ×4/3; the LM
 * head is not recomputed). */
static double stage_flops(const struct plan *p, struct cost_layout l, int stage)
{
    double h = p->model.hidden, s = p->model.seq_len;
    double h_t = (double)ceil_div(u(p->model.hidden), u(l.tp)); /* h/t */
    double layers = stage_layers(p->model.layers, l.pp, stage);
    double tokens = (double)p->batch.micro_batch * s * p->batch.grad_accum;
    double layer_weights = layers * 12.0 * h * h_t;
    double head_weights =
        stage == l.pp - 1 ? (double)ceil_div(u(p->model.padded_vocab), u(l.tp)) * h : 0.0;
    double attention = layers * 12.0 * s * h_t;
    double per_token = 6.0 * (layer_weights + head_weights) + attention;
    if (p->recompute == PLAN_RECOMPUTE_SELECTIVE) per_token += layers * 4.0 * s * h_t;
    if (p->recompute == PLAN_RECOMPUTE_FULL)
        per_token += 2.0 * layer_weights + layers * 4.0 * s * h_t;
    return per_token * tokens;
}

/* Seconds for `work` units at `rate` units/s: no work takes no time whatever
 * the rate, work at no rate (a missing link, an unknown device) takes forever
 * (HUGE_VAL, which callers reject). */
static double seconds(double work, double rate)
{
    if (work <= 0) return 0.0;
    if (!(rate > 0)) return HUGE_VAL;
    return work / rate;
}

/* compute: the slowest stage's FLOPs at the device's sustained rate (the
 * pipeline runs at its slowest stage). tp: all-reduces sit between the
 * layer's matmuls, on the critical path. pp: the p2p sends, counted in full.
 * bubble: 1F1B idles (pp−1)/m of the compute (Narayanan et al. 2021, §2.2).
 * dp: gradient reduction runs in buckets during backward, so only what
 * exceeds the backward share of the compute (2 of the 6N: 2/3) shows. */
void cost_step_time(const struct plan *p, struct cost_layout l, const struct cost_links *links,
                    struct cost_time *out)
{
    l = layout_sane(l);
    memset(out, 0, sizeof *out);
    double flops = 0;
    for (int k = 0; k < l.pp; k++) flops = fmax(flops, stage_flops(p, l, k));
    out->compute_s = seconds(flops, links->device_tflops * 1e12);

    struct cost_traffic t;
    cost_traffic(p, l, &t);
    out->tp_s = seconds(t.tp_bytes, links->tp_gbps * 1e9);
    out->pp_s = seconds(t.pp_bytes, links->pp_gbps * 1e9);
    out->bubble_s = l.pp > 1 ? out->compute_s * (l.pp - 1) / p->batch.grad_accum : 0.0;
    double dp_raw_s = seconds(t.dp_bytes, links->dp_gbps * 1e9);
    double overlap_s = out->compute_s * 2.0 / 3.0;
    if (isinf(dp_raw_s))
        out->dp_s = HUGE_VAL;
    else
        out->dp_s = isinf(overlap_s) ? 0.0 : fmax(0.0, dp_raw_s - overlap_s);
    out->total_s = out->compute_s + out->tp_s + out->pp_s + out->bubble_s + out->dp_s;
}

const char *cost_link_name(enum cost_link link)
{
    switch (link) {
    case COST_LINK_NONE:
        return "none";
    case COST_LINK_NVLINK:
        return "NVLink";
    case COST_LINK_MEMORY:
        return "memory";
    case COST_LINK_PCIE:
        return "PCIe";
    case COST_LINK_NETWORK:
        return "network";
    case COST_LINKS:
        break;
    }
    return "unknown";
}
