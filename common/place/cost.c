/* cost.c — the arithmetic behind cost.h: what one rank of a tp × cp × pp × dp
 * layout holds in device memory (the plan turned into gpt2_memory's
 * accounting, the one the runtime allocates by), what it sends per optimizer
 * step on each communicator, and a step-time estimate from those. Expert
 * parallelism's traffic (the all-to-all, the routed experts' gradients) is
 * cost_ep.c's. No I/O, no allocation, no knowledge of where the links are
 * (that is place.c's). */
#include "common/place/cost.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/place/comm_memory.h"   // defines: COMM_SHM_RING_BYTES
#include "common/place/cost_internal.h" // defines: what cost.c and cost_ep.c share
#include "common/gpt2/gpt2_memory.h"    // defines: gpt2_memory, the bytes a rank holds
#include "common/gpt2/gpt2_scratch.h"   // defines: gpt2_scratch, a GPU rank's scratch beside it
#include "common/gpt2/gpt2_shard.h"     // defines: gpt2_shard_init, gpt2_stage_layers
#include "common/place/schedule.h"      // defines: schedule_max_in_flight, schedule_moe_lanes

/* Notation (Megatron / Korthikanti): s = seq_len T, b = micro_batch, h = hidden
 * C, a = heads, L = layers, Vp = padded vocab, t = tp, m = grad_accum
 * (micro-batches per step per pipeline), d = dp. A "value" is one tensor
 * element; its width in bytes depends on the precision.
 *
 * Shards are rounded up (ceil(x/t)) where the traffic and time estimates divide:
 * when the degree divides the dimension (as the plan rules require: tp divides
 * heads and padded_vocab) they are exact. */

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

/* Context parallelism's degree: a rank runs 1/cp of each sequence's tokens (its queries;
 * the keys and values of the whole sequence come round the ring), its gradients summed
 * over dp·cp ranks. */
int cost_cp_of(const struct plan *p)
{
    return p->parallel.cp > 1 ? p->parallel.cp : 1;
}

/* Tokens one rank runs per optimizer step: b·s·m/cp (2·cp divides s: the plan rules). */
static double rank_tokens(const struct plan *p)
{
    return (double)p->batch.micro_batch * p->model.seq_len * p->batch.grad_accum / cost_cp_of(p);
}

/* ---- how the model splits --------------------------------------------------------------- */

/* Per-token FLOPs of a forward and backward through one layer and through
 * the head (the tied LM head's product), as stage_flops counts them at tp 1. */
static void split_costs(const struct plan *p, double *layer, double *head)
{
    struct gpt2_config cfg = gpt2_config_of_plan(&p->model);
    double h = p->model.hidden, s = p->model.seq_len, w = gpt2_layer_product_weights(&cfg);
    *layer = 6.0 * w + 12.0 * s * h;
    if (p->recompute == PLAN_RECOMPUTE_SELECTIVE) *layer += 4.0 * s * h;
    if (p->recompute == PLAN_RECOMPUTE_FULL) *layer += 2.0 * w + 4.0 * s * h;
    *head = 6.0 * (double)p->model.padded_vocab * h;
}

void cost_stage_layers(const struct plan *p, int pp, int stage, int *begin, int *end)
{
    int L = p->model.layers;
    if (pp < 1) pp = 1;
    const struct plan_ints *given = &p->parallel.stage_layers;
    if (given->n == pp) { /* the plan's: the parser checked it adds up */
        *begin = 0;
        for (int k = 0; k < stage; k++) *begin += given->v[k];
        *end = *begin + given->v[stage];
        return;
    }
    if (pp == 1 || p->parallel.virtual_stages > 1 || L < pp) {
        gpt2_stage_layers(L, pp, stage, begin, end);
        return;
    }
    /* the last stage takes `last` layers and the head, the others share the
     * rest as evenly as it goes: the `last` whose slowest stage is fastest
     * (ties: the one nearest the even split) */
    double layer, head;
    split_costs(p, &layer, &head);
    int best = 0;
    double best_cost = HUGE_VAL;
    for (int last = 1; last <= L - (pp - 1); last++) {
        int rest = L - last, widest = (rest + pp - 2) / (pp - 1);
        double cost = fmax(widest * layer, last * layer + head);
        bool nearer = abs(last - L / pp) < abs(best - L / pp);
        if (cost < best_cost * (1 - 1e-12) || (cost <= best_cost * (1 + 1e-12) && nearer)) {
            best = last;
            best_cost = cost;
        }
    }
    if (stage == pp - 1) {
        *begin = L - best;
        *end = L;
    } else {
        gpt2_stage_layers(L - best, pp - 1, stage, begin, end);
    }
}

struct gpt2_part cost_stage_part(const struct plan *p, int tp, int tp_rank, int pp, int stage)
{
    struct gpt2_part part = {.tp = tp,
                             .tp_rank = tp_rank,
                             .pp = pp,
                             .pp_rank = stage,
                             .ep = p->parallel.ep}; /* ep rank 0's: every one's sizes */
    int v = pp > 1 ? p->parallel.virtual_stages : 1;
    if (pp > 1 && p->parallel.schedule == PLAN_PIPE_DUALPIPEV) {
        gpt2_stage_vshape(p->model.layers, pp, stage, &part);
    } else if (v > 1) {
        gpt2_stage_chunks(p->model.layers, pp, v, stage, &part);
    } else {
        cost_stage_layers(p, pp, stage, &part.layer_begin, &part.layer_end);
        part.chunks = 1;
    }
    return part;
}

/* Transformer layers of pipeline stage `stage` (all its chunks'). */
static int stage_layers(const struct plan *p, int pp, int stage)
{
    struct gpt2_part part = cost_stage_part(p, 1, 0, pp, stage);
    return (part.layer_end - part.layer_begin) * (part.chunks > 1 ? part.chunks : 1);
}

/* The part one rank of `stage` holds (gpt2_shard.h: Megatron sharding of the
 * llm.c layout; tp divides everything it splits, so every tp rank's part is
 * the same size and tp rank 0 speaks for all). -1 when the plan's model cannot
 * be split so (the plan rules refuse those layouts). */
int cost_stage_shard(const struct plan *p, struct cost_layout l, int stage, struct gpt2_shard *s)
{
    struct gpt2_config cfg = gpt2_config_of_plan(&p->model);
    struct gpt2_part part = cost_stage_part(p, l.tp, 0, l.pp, stage);
    struct plait_error err;
    return gpt2_shard_init(s, &cfg, &part, &err);
}

/* Parameters one rank of `stage` holds: 12C²/t + 7C/t + 6C per layer (12C² +
 * 13C at t = 1, llm.c's count); stage 0 adds wte (Vp×C)/t and wpe (maxT×C),
 * the last stage the final LayerNorm (2C) and, when pp > 1, its own wte shard
 * for the tied LM head. 0 when the model cannot be split so. */
uint64_t cost_stage_param_count(const struct plan *p, struct cost_layout l, int stage)
{
    struct gpt2_shard s;
    return cost_stage_shard(p, l, stage, &s) ? 0 : s.total;
}

/* 16-bit gradients and parameters in bf16 (and fp8), 32-bit in fp32. */
struct cost_state_widths cost_state_widths(enum plan_precision precision)
{
    if (precision != PLAN_PRECISION_FP32) return (struct cost_state_widths){2, 2}; /* fp8 too */
    return (struct cost_state_widths){4, 4};
}

/* Bytes of one activation value on the wire: 16-bit in bf16 and fp8 training
 * (fp8 quantises inside the products; what layers exchange stays bf16), 4 in fp32. */
static uint64_t activation_bytes(enum plan_precision precision)
{
    return precision == PLAN_PRECISION_FP32 ? 4 : 2;
}

/* ---- memory ------------------------------------------------------------------------------ */

/* Micro-batches (interleaved: model chunks) whose activations `stage` holds at
 * once: the plan's pipeline schedule's (schedule_max_in_flight), which is how
 * many slots the runtime allocates. Without a pipeline, 1F1B and the
 * interleaved schedule hold one, GPipe all m. */
static int stage_in_flight(const struct plan *p, struct cost_layout l, int stage)
{
    struct schedule s = {.pp = l.pp, .m = p->batch.grad_accum};
    schedule_of_plan(p, l.pp, &s.kind, &s.v);
    if (s.kind != SCHED_DUALPIPEV) return schedule_max_in_flight(&s, stage);
    struct plait_error err; /* counted on its list (the plan's rules made it possible) */
    int n = schedule_make(&s, s.kind, s.pp, s.m, s.v, &err) ? 1 : schedule_max_in_flight(&s, stage);
    schedule_free(&s);
    return n;
}

/* How often a step's ZeRO 2 hands a stage's gradients over (a reduce-scatter
 * each): after every micro-batch without a pipeline, else wherever the
 * stage's list leaves its gradients quiescent (schedule_quiescent: every
 * micro-batch for 1F1B, GPipe and ZB-H1, each group of pp interleaved). */
static double zero2_handovers(const struct plan *p, struct cost_layout l, int stage)
{
    int m = p->batch.grad_accum, n = 0;
    if (l.pp < 2) return m;
    struct schedule s;
    struct plait_error err;
    bool *at = calloc((size_t)m + 1, sizeof *at);
    if (!at || schedule_make_for_plan(&s, p, l.pp, &err)) {
        free(at);
        return m; /* the most it can be */
    }
    schedule_quiescent(&s, stage, at);
    for (int k = 1; k <= m; k++) n += at[k];
    schedule_free(&s);
    free(at);
    return n;
}

static int stage_chunks(const struct plan *p, int pp, bool *split);

/* The elements ZeRO 3 moves over dp in a step on `stage`, gathers and
 * reduce-scatters together, as runtime/model_zero3_pass.c runs them, with Ψ the stage's
 * parameters, Ψ_L its layers' and Ψ_e its embeddings' unit (wte and wpe; a
 * last stage's tied wte). A micro-batch's forward gathers every unit and its
 * backward the layers again (the head's units stay from the forward to the
 * backward, and the embeddings' from the embedding to a tied head on the same
 * chunk): Ψ + Ψ_L; kept gathered (reshard_after_forward false), Ψ once a
 * step. Each unit's gradient is scattered once a micro-batch, the layers'
 * twice with a split backward (the input-gradient pass's norms, then the
 * weights). DualPipeV's first stage embeds and ends in the tied head in two
 * chunks: the embeddings' unit is gathered and scattered once more. A tied
 * wte between a pipeline's ends is summed in the slices at the step's end, its
 * unit's gradient gathered once. */
static double zero3_elements(const struct plan *p, struct cost_layout l, int stage)
{
    struct gpt2_shard s;
    if (cost_stage_shard(p, l, stage, &s)) return 0;
    bool split, tied = !s.cfg.untied, v = p->parallel.schedule == PLAN_PIPE_DUALPIPEV;
    stage_chunks(p, l.pp, &split);
    double m = p->batch.grad_accum, all = (double)s.total, e = (double)s.layers_at;
    double layers = (double)(s.layers_end - s.layers_at);
    bool both = tied && s.first && s.last && v; /* embedding and head in two chunks */
    double gathers = p->parallel.reshard_after_forward ? m * (all + layers + (both ? e : 0)) : all;
    double scatters = m * (all + (split ? layers : 0) + (both ? e : 0));
    double tie = tied && l.pp > 1 && !v && (s.first || s.last) ? e : 0;
    return gathers + scatters + tie;
}

/* The model chunks a stage runs (*split: whether its backward is split in two
 * passes): the plan's schedule's (schedule_of_plan). */
static int stage_chunks(const struct plan *p, int pp, bool *split)
{
    enum sched_kind kind;
    int v;
    schedule_of_plan(p, pp, &kind, &v);
    if (split) *split = schedule_kind_splits(kind);
    return v;
}

void cost_memory_stage(const struct plan *p, struct cost_layout l, int stage,
                       struct cost_memory *out)
{
    memset(out, 0, sizeof *out);
    l = layout_sane(l);
    if (stage < 0 || stage >= l.pp) return; /* no such stage: nothing held */
    bool split;
    int chunks = stage_chunks(p, l.pp, &split);
    int cp = cost_cp_of(p);
    struct gpt2_memory_shape shape = {
        .B = p->batch.micro_batch,
        .T = p->model.seq_len / cp, /* the rank's tokens */
        .cp = cp,
        .precision = p->precision,
        .fp8_scaling = p->fp8_scaling,
        .recompute = p->recompute,
        .slots = stage_in_flight(p, l, stage),
        .chunks = chunks,
        /* ZeRO slices over the shard group's dp·cp ranks (with ep, its expert peers) */
        .dp = plan_zero_slices(&p->parallel, plan_dp_shard(&p->parallel, l.dp) * cp),
        .zero = p->parallel.zero,
        .keep_gathered = !p->parallel.reshard_after_forward,
        .sequence_parallel = p->parallel.sequence_parallel && l.tp > 1,
        .split_backward = split,
        /* the CUDA backend's attention keeps no probabilities */
        .fused_attention = p->parallel.device == PLAN_DEVICE_CUDA,
        .offload_window_mb =
            p->parallel.offload == PLAN_OFFLOAD_NVME ? p->parallel.offload_window_mb : 0,
        /* a GPU rank's offload moves the step to the CPU (a CPU rank's "host" is a no-op) */
        .host_step =
            p->parallel.offload != PLAN_OFFLOAD_NONE && p->parallel.device == PLAN_DEVICE_CUDA,
        .logits_chunk_mb = p->logits_chunk_mb,
        .moe_lanes = schedule_moe_lanes(p, l.pp, NULL)};
    struct gpt2_shard s;
    struct gpt2_memory mem;
    struct plait_error err;
    bool shard = cost_stage_shard(p, l, stage, &s) == 0;
    shape.act16 = shard && gpt2_act16(&s.cfg, p->precision); /* as both backends keep them */
    if (!shard || gpt2_memory(&s, &shape, &mem, &err)) {
        /* an absurd or unsplittable model reads as "too big", never as fitting */
        out->params = out->grads = out->optimizer = out->activations = out->total = UINT64_MAX;
        return;
    }
    out->params = mem.params;
    out->grads = mem.grads;
    out->optimizer = mem.optimizer;
    out->activations = mem.activations;
    out->total = mem.total;
    if (p->parallel.device == PLAN_DEVICE_CUDA) { /* beside the model's buffers */
        struct gpt2_scratch scratch;
        gpt2_scratch(&s, &shape, &mem, gpt2_scratch_attention_bf16(&s.cfg, &shape), &scratch);
        out->scratch = scratch.total;
        out->cuda_context = GPT2_CUBLASLT_WORKSPACE_BYTES + GPT2_CUDA_CONTEXT_BYTES;
        out->total += out->scratch + out->cuda_context;
    }
    out->disk = mem.disk;
    out->host = mem.host;
    out->param_count = (int64_t)s.total; /* gpt2_shard_init keeps it addressable */
    out->slice_count = (int64_t)mem.slice;
    out->logits_rows = (int64_t)mem.logits_rows;
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
double cost_ring_allreduce_bytes(double bytes, int n)
{
    return n > 1 ? 2.0 * (n - 1) / n * bytes : 0.0;
}

/* Bytes one rank of `stage` sends around its cp ring per optimizer step
 * (runtime/ring_attention.c): each layer's forward passes the rank's key/value
 * block, b·(s/cp)·2·h/t fp32 values, on cp−1 times; its backward passes the
 * block and its gradient's partial sum (2× that) cp−1 times and the gradient
 * once more, home; full recompute repeats the forward's. 0 without cp. */
static double cp_ring_bytes(const struct plan *p, struct cost_layout l, int stage)
{
    int cp = cost_cp_of(p);
    if (cp == 1) return 0;
    double h_t = (double)ceil_div(u(p->model.hidden), u(l.tp));
    double block = 4.0 * p->batch.micro_batch * ((double)p->model.seq_len / cp) * 2.0 * h_t;
    double forward = (cp - 1) * block, backward = 2.0 * (cp - 1) * block + block;
    double per_layer = forward + backward + (p->recompute == PLAN_RECOMPUTE_FULL ? forward : 0);
    return per_layer * stage_layers(p, l.pp, stage) * p->batch.grad_accum;
}

/* Bytes ZeRO's collectives send in a step for psi elements sliced over s ranks: at stage 1
 * a reduce-scatter and an all-gather (an all-reduce's), at 2 a reduce-scatter at each
 * hand-over and the all-gather, at 3 zero3_elements' gathers and scatters. */
double cost_zero_bytes(const struct plan *p, struct cost_layout l, int stage, double psi, double s)
{
    struct cost_state_widths w = cost_state_widths(p->precision);
    double share = (s - 1) / s * psi;
    if (p->parallel.zero >= 3) return (s - 1) / s * zero3_elements(p, l, stage) * w.grad_bytes;
    if (p->parallel.zero == 2)
        return zero2_handovers(p, l, stage) * share * w.grad_bytes + share * w.param_bytes;
    return 2 * share * w.grad_bytes;
}

/* Bytes one rank of `stage` sends per optimizer step on each communicator. */
static struct cost_traffic stage_traffic(const struct plan *p, struct cost_layout l, int stage)
{
    struct cost_traffic out = {0};
    double m = p->batch.grad_accum;
    int cp = cost_cp_of(p);
    /* one activation (or its gradient): s·b·h values in the activation precision (a
     * rank's s/cp rows of it with context parallelism) */
    double act_bytes = (double)p->model.seq_len / cp * p->batch.micro_batch * p->model.hidden *
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
        double n = per_layer * stage_layers(p, l.pp, stage);
        if (stage == 0) n += 1;
        if (stage == l.pp - 1) n += 1;
        out.tp_bytes = n * m * cost_ring_allreduce_bytes(act_bytes, l.tp);
    }

    /* pp: each micro-batch's activation goes forward across every stage
     * boundary and its gradient comes back; every tp rank sends the full
     * s·b·h (no scatter/gather optimisation). A middle stage sends both, the
     * first only activations, the last only gradients; with v interleaved
     * chunks each chunk's (the last stage's into the first's next chunk too),
     * 2v less the first chunk's gradient and the last chunk's activation. */
    if (l.pp > 1) {
        int v = stage_chunks(p, l.pp, NULL);
        double sends = 2.0 * v - (stage == 0) - (stage == l.pp - 1);
        if (p->parallel.schedule == PLAN_PIPE_DUALPIPEV) /* both ways through its V; the turn
                                                             on the last stage stays local */
            sends = stage == 0 || stage == l.pp - 1 ? 2 : 4;
        out.pp_bytes = sends * m * act_bytes;
    }

    /* dp, once per optimizer step on this rank's Ψ (its tp × pp shard), values
     * as wide as the gradients (2 bytes bf16 per the ZeRO paper, 4 fp32),
     * after ZeRO §7: stage 0 and 1 all-reduce the gradients, 2(d−1)/d·Ψ;
     * stage 2 reduce-scatters gradients and all-gathers the updated
     * parameters, (d−1)/d·Ψ each; stage 3 all-gathers the parameters for
     * forward and again for backward and reduce-scatters the gradients,
     * 3(d−1)/d·Ψ a micro-batch (1.5× the all-reduce; zero3_elements: what
     * plait moves). Plait's ZeRO 2 reduce-scatters at each hand-over of the
     * step (zero2_handovers), not once: m times the floor's gradient share
     * without a pipeline or with 1F1B. */
    out.cp_bytes = cp_ring_bytes(p, l, stage) + cost_cp_moe_count_bytes(p, l, stage);

    /* with context parallelism the gradients are summed over the dp·cp ranks, and a shard
     * group is dp_shard·cp of them (the cp ranks of each shard rank) */
    int S = plan_dp_shard(&p->parallel, l.dp) * cp, D = l.dp * cp;
    int Z = plan_zero_slices(&p->parallel, S); /* the ranks ZeRO slices over */
    if (D > 1 && Z < S) {
        cost_ep_zero_traffic(p, l, stage, S, D, &out);
    } else if (D > 1 && S < D && p->parallel.zero >= 1) {
        /* hybrid sharding: ZeRO's within the shard group on Ψ, then the slice Ψ/S
         * all-reduced over the R replicas (2(R−1)/R · Ψ/S) */
        struct cost_state_widths w = cost_state_widths(p->precision);
        double psi = (double)cost_stage_param_count(p, l, stage), s = S, r = (double)D / S;
        out.shard_bytes = cost_zero_bytes(p, l, stage, psi, s);
        out.replicas_bytes = 2 * (r - 1) / r * psi / s * (double)w.grad_bytes;
        out.dp_bytes = out.shard_bytes + out.replicas_bytes;
    } else if (D > 1) {
        struct cost_state_widths w = cost_state_widths(p->precision);
        double psi = (double)cost_stage_param_count(p, l, stage), d = D;
        if (p->parallel.zero >= 2) {
            out.dp_bytes = cost_zero_bytes(p, l, stage, psi, d);
        } else {
            /* with expert parallelism at ZeRO 0 (above 0: cost_ep_zero_traffic) the routed
             * experts' Ψ_r is summed over the D/ep ranks holding the same experts, the
             * rest over all D */
            struct gpt2_shard s;
            double routed =
                cost_ep_of(p) > 1 && !cost_stage_shard(p, l, stage, &s) ? cost_routed_elems(&s) : 0;
            out.experts_bytes =
                cost_ring_allreduce_bytes(routed * (double)w.grad_bytes, D / cost_ep_of(p));
            out.dp_bytes =
                2 * ((d - 1) / d * (psi - routed)) * (double)w.grad_bytes + out.experts_bytes;
        }
    }
    out.ep_bytes = cost_ep_alltoall_bytes(p, l, stage);
    return out;
}

uint64_t cost_comm_ring_bytes(const struct plan *p, struct cost_layout l, int stage)
{
    l = layout_sane(l);
    if (stage < 0 || stage >= l.pp) return 0;
    struct cost_traffic t = stage_traffic(p, l, stage);
    double ring = (double)COMM_SHM_RING_BYTES, rings = 0;
    /* tp, cp, dp: out to the next rank of the ring and in from the previous */
    rings += 2 * fmin(ring, t.tp_bytes) + 2 * fmin(ring, t.cp_bytes);
    if (t.shard_bytes + t.replicas_bytes > 0) /* hybrid sharding: a ring in each group */
        rings += 2 * fmin(ring, t.shard_bytes) + 2 * fmin(ring, t.replicas_bytes);
    else /* (with ep the routed experts' sum is a ring of the expert peers) */
        rings += 2 * fmin(ring, t.dp_bytes - t.experts_bytes) + 2 * fmin(ring, t.experts_bytes);
    int ep = cost_ep_of(p); /* the all-to-all: a link to each other rank of the ep group */
    if (ep > 1) rings += 2 * (ep - 1) * fmin(ring, t.ep_bytes / (ep - 1));
    if (l.pp > 1) {
        /* each neighbour stage: activations one way, gradients the other; an
         * interleaved schedule also wraps from the last stage to the first */
        int v = stage_chunks(p, l.pp, NULL);
        bool vee = p->parallel.schedule == PLAN_PIPE_DUALPIPEV; /* no wrap, no tied sum */
        double act_bytes = (double)p->model.seq_len / cost_cp_of(p) * p->batch.micro_batch *
                           p->model.hidden * (double)activation_bytes(p->precision);
        double per_way = fmin(ring, p->batch.grad_accum * v * act_bytes);
        int neighbours = v > 1 && !vee ? (l.pp > 2 ? 2 : 1) : (stage > 0) + (stage < l.pp - 1);
        rings += 2 * neighbours * per_way;
        struct gpt2_shard s;
        if (!vee && (stage == 0 || stage == l.pp - 1) && !cost_stage_shard(p, l, stage, &s))
            rings += 2 * fmin(ring, 4.0 * (double)s.elems[GPT2_WTE]); /* fp32, each way */
    }
    return (uint64_t)rings;
}

/* Each communicator's busiest rank, taken separately (the tp peak and the dp
 * peak may sit on different stages). */
void cost_traffic(const struct plan *p, struct cost_layout l, struct cost_traffic *out)
{
    l = layout_sane(l);
    *out = (struct cost_traffic){0};
    for (int k = 0; k < l.pp; k++) {
        struct cost_traffic t = stage_traffic(p, l, k);
        out->tp_bytes = fmax(out->tp_bytes, t.tp_bytes);
        out->pp_bytes = fmax(out->pp_bytes, t.pp_bytes);
        out->dp_bytes = fmax(out->dp_bytes, t.dp_bytes);
        out->cp_bytes = fmax(out->cp_bytes, t.cp_bytes);
        out->shard_bytes = fmax(out->shard_bytes, t.shard_bytes);
        out->replicas_bytes = fmax(out->replicas_bytes, t.replicas_bytes);
        out->ep_bytes = fmax(out->ep_bytes, t.ep_bytes);
        out->experts_bytes = fmax(out->experts_bytes, t.experts_bytes);
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
 * divided by t (heads are split). Tokens per rank per step: b·s·m/cp (with
 * context parallelism a rank runs s/cp of each sequence, each token still
 * attending over all s).
 * Recompute adds forward work: selective the attention core's 4·s·h/t per
 * layer per token (Korthikanti §5; the softmax itself is not counted); full
 * the whole layer forward, 2·12h²/t + 4·s·h/t (the layers' part ×4/3; the LM
 * head is not recomputed). */
static double stage_flops(const struct plan *p, struct cost_layout l, int stage)
{
    double h = p->model.hidden, s = p->model.seq_len;
    double h_t = (double)ceil_div(u(p->model.hidden), u(l.tp)); /* h/t */
    double layers = stage_layers(p, l.pp, stage);
    double tokens = rank_tokens(p); /* each attends over all s (cp: round the ring) */
    struct gpt2_config cfg = gpt2_config_of_plan(&p->model);
    double layer_weights = layers * gpt2_layer_product_weights(&cfg) * (h_t / h);
    double head_weights =
        stage == l.pp - 1 ? (double)ceil_div(u(p->model.padded_vocab), u(l.tp)) * h : 0.0;
    double attention = layers * 12.0 * s * h_t;
    double per_token = 6.0 * (layer_weights + head_weights) + attention;
    if (p->recompute == PLAN_RECOMPUTE_SELECTIVE) per_token += layers * 4.0 * s * h_t;
    if (p->recompute == PLAN_RECOMPUTE_FULL)
        per_token += 2.0 * layer_weights + layers * 4.0 * s * h_t;
    return per_token * tokens;
}

/* The attention core's part of stage_flops: 12·s·h/t per layer per token, and
 * recompute's forward again (4·s·h/t, selective or full). */
static double stage_attention_flops(const struct plan *p, struct cost_layout l, int stage)
{
    double s = p->model.seq_len, h_t = (double)ceil_div(u(p->model.hidden), u(l.tp));
    double tokens = rank_tokens(p);
    double per_layer = p->recompute == PLAN_RECOMPUTE_NONE ? 12.0 : 16.0;
    return stage_layers(p, l.pp, stage) * per_layer * s * h_t * tokens;
}

/* Bytes the memory-bound ops of one rank of `stage` move per optimizer step,
 * in 4-byte values (activations are fp32 whatever the precision), per token:
 * each layer's 2 LayerNorms, forward reading and writing a row (2·C), backward
 * reading the gradient and the input and updating the input's gradient (4·C);
 * its 2 residual adds, reading two rows and writing one (3·C); GELU over the
 * MLP's 4·h/t, forward 2 and backward 3 values an element: 18·C + 20·h/t (the
 * same count kernels/cpu/cpu_rate.c measures a bandwidth by; sequence parallel
 * runs the LayerNorms and adds on 1/t of the rows); full recompute runs the
 * forward's again, 10·C + 8·h/t. The first stage's embedding reads a wte and
 * a wpe row and writes one, and backward adds into both: 8·C. The last
 * stage's final LayerNorm (6·C) and softmax cross-entropy over its Vp/t
 * logits: a pass for the maximum, one for the sum of exponentials, one that
 * reads and rewrites them as their gradient (4·Vp/t). The attention's
 * probabilities are counted in its own rate (cost_links.attention_tflops). */
static double stage_activation_bytes(const struct plan *p, struct cost_layout l, int stage)
{
    double C = p->model.hidden, h_t = (double)ceil_div(u(p->model.hidden), u(l.tp));
    double rows_c = p->parallel.sequence_parallel && l.tp > 1 ? C / l.tp : C;
    /* a Llama's SwiGLU reads 2F/t and writes F/t forward, reads 3F/t and writes 2F/t
     * backward: 8·F/t, 3·F/t again under full recompute */
    double f_t = (double)p->model.ffn_hidden / l.tp;
    bool llama = plan_model_is_llama(&p->model);
    double per_layer = 18.0 * rows_c + (llama ? 8.0 * f_t : 20.0 * h_t);
    if (p->recompute == PLAN_RECOMPUTE_FULL)
        per_layer += 10.0 * rows_c + (llama ? 3.0 * f_t : 8.0 * h_t);
    double values = stage_layers(p, l.pp, stage) * per_layer;
    if (stage == 0) values += 8.0 * C;
    if (stage == l.pp - 1)
        values += 6.0 * C + 4.0 * (double)ceil_div(u(p->model.padded_vocab), u(l.tp));
    return 4.0 * values * rank_tokens(p);
}

/* OpenMP parallel regions one CPU rank of `stage` starts per optimizer step:
 * each CPU op is one (kernels/cpu) and waits for its threads to wake (plait
 * runs them with OMP_WAIT_POLICY=PASSIVE, asleep between ops). Per layer per
 * micro-batch, forward 14 (2 LayerNorms, 2 residual adds, GELU, the
 * attention, 4 products of a bias copy and a GEMM each), backward 18 (4
 * products of 2 GEMMs and a bias sum each, GELU, the attention, 2 LayerNorms
 * of 2 passes each); full recompute repeats the forward's 14, selective the
 * attention's 1. Per micro-batch the last stage's head 7 (the final LayerNorm
 * 1 + 2, the LM head's GEMMs 1 + 2, the cross-entropy 1) and the first
 * stage's embedding 2. Per step the optimizer's 2 per parameter tensor (the
 * norm's sum of squares, AdamW): 12 a layer, wte and wpe on the first stage,
 * the final LayerNorm's 2 (and its own wte under a pipeline) on the last. The
 * fp32 path's count (bf16's conversions add a few). */
static double stage_parallel_ops(const struct plan *p, struct cost_layout l, int stage)
{
    double layers = stage_layers(p, l.pp, stage);
    bool first = stage == 0, last = stage == l.pp - 1;
    double per_layer = 32.0 + (p->recompute == PLAN_RECOMPUTE_FULL        ? 14
                               : p->recompute == PLAN_RECOMPUTE_SELECTIVE ? 1
                                                                          : 0);
    double micro = layers * per_layer + (last ? 7 : 0) + (first ? 2 : 0);
    double tensors = layers * 12 + (first ? 2 : 0) + (last ? (l.pp > 1 ? 3 : 2) : 0);
    return micro * p->batch.grad_accum + 2 * tensors;
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

/* The slowest stage's compute (its products at device_tflops, its attention
 * at attention_tflops when given), memory-bound ops (at activation_gbps) and
 * parallel starts (at parallel_op_s, when given) into out: the pipeline runs
 * at its slowest stage. */
static void slowest_stage(const struct plan *p, struct cost_layout l,
                          const struct cost_links *links, struct cost_time *out)
{
    for (int k = 0; k < l.pp; k++) {
        double flops = stage_flops(p, l, k), c, m = 0;
        if (links->attention_tflops > 0) {
            double attention = stage_attention_flops(p, l, k);
            c = seconds(flops - attention, links->device_tflops * 1e12) +
                seconds(attention, links->attention_tflops * 1e12);
        } else {
            c = seconds(flops, links->device_tflops * 1e12);
        }
        if (links->activation_gbps > 0)
            m = seconds(stage_activation_bytes(p, l, k), links->activation_gbps * 1e9);
        double o =
            links->parallel_op_s > 0 ? stage_parallel_ops(p, l, k) * links->parallel_op_s : 0;
        if (k == 0 || c + m + o > out->compute_s + out->memory_s + out->parallel_s)
            out->compute_s = c, out->memory_s = m, out->parallel_s = o;
    }
}

/* Seconds one stage's gradient sums take on their links: hybrid sharding's two groups, or
 * dp's dense part and the routed experts' over their expert peers (ep > 1), one after the
 * other. */
static double dp_seconds(const struct cost_traffic *t, const struct cost_links *links)
{
    if (t->shard_bytes + t->replicas_bytes > 0)
        return seconds(t->shard_bytes, links->shard_gbps * 1e9) +
               seconds(t->replicas_bytes, links->replicas_gbps * 1e9);
    return seconds(t->dp_bytes - t->experts_bytes, links->dp_gbps * 1e9) +
           seconds(t->experts_bytes, links->experts_gbps * 1e9);
}

/* compute, memory-bound ops and parallel starts: the slowest stage's
 * (slowest_stage). tp:
 * all-reduces sit between the layer's matmuls, on the critical path. pp: the
 * p2p sends, counted in full. bubble: 1F1B idles (pp−1)/m of the work
 * (Narayanan et al. 2021, §2.2). dp: gradient reduction runs in buckets during
 * backward, so only what exceeds the backward share of the compute (2 of the
 * 6N: 2/3) shows. optimizer: AdamW is memory-bound (a few FLOPs per byte): it
 * reads and writes the weights (fp32 and their 16-bit copy) and both moments
 * and reads the gradients, 2·(params + optimizer) + grads bytes of the most
 * loaded stage at the device's memory bandwidth (under ZeRO an upper bound:
 * the weights outside a rank's slice are only written by the all-gather); on a
 * measured CPU (activation_gbps given) also the gradient norm's read of the
 * gradients, 4 bytes a parameter, which a GPU's calibrated share covers. A GPU
 * rank's offloaded step (host_step_s, cost.h's COST_HOST_*) adds the slice's trip
 * to host memory and back and the CPU's pass; the device's pass keeps the weights
 * and gradients (its "optimizer" bytes, the moments gone, are ZeRO's staging). */
void cost_step_time(const struct plan *p, struct cost_layout l, const struct cost_links *links,
                    struct cost_time *out)
{
    l = layout_sane(l);
    memset(out, 0, sizeof *out);
    slowest_stage(p, l, links, out);

    struct cost_traffic t;
    cost_traffic(p, l, &t);
    out->tp_s = seconds(t.tp_bytes, links->tp_gbps * 1e9);
    out->cp_s = seconds(t.cp_bytes, links->cp_gbps * 1e9);
    out->pp_s = seconds(t.pp_bytes, links->pp_gbps * 1e9);
    /* the all-to-all's bytes to peers behind the slowest link bound it */
    double ep_share = links->ep_share > 0 ? links->ep_share : 1;
    out->ep_s = seconds(t.ep_bytes * ep_share, links->ep_gbps * 1e9);
    double work_s = out->compute_s + out->memory_s + out->parallel_s;
    out->bubble_s = l.pp > 1 ? work_s * (l.pp - 1) / p->batch.grad_accum : 0.0;
    double dp_raw_s = 0; /* the busiest stage's gradient sums, each group's bytes on its link */
    for (int k = 0; k < l.pp; k++) {
        struct cost_traffic st = stage_traffic(p, l, k);
        dp_raw_s = fmax(dp_raw_s, dp_seconds(&st, links));
    }
    double overlap_s = out->compute_s * 2.0 / 3.0;
    if (isinf(dp_raw_s))
        out->dp_s = HUGE_VAL;
    else
        out->dp_s = isinf(overlap_s) ? 0.0 : fmax(0.0, dp_raw_s - overlap_s);
    struct cost_memory mem;
    cost_memory(p, l, &mem, NULL);
    if (links->device_memory_gbps > 0) {
        double bytes = 2.0 * ((double)mem.params + (double)mem.optimizer) + (double)mem.grads;
        if (links->activation_gbps > 0) bytes += 4.0 * (double)mem.param_count;
        out->optimizer_s = seconds(bytes, links->device_memory_gbps * 1e9);
    }
    if (mem.host > 0) { /* a GPU rank's step on the CPU */
        double S = (double)mem.slice_count;
        out->host_step_s = seconds(COST_HOST_LINK_BYTES * S, COST_HOST_LINK_GBPS * 1e9) +
                           seconds(COST_HOST_STEP_BYTES * S, COST_HOST_MEMORY_GBPS * 1e9);
        out->optimizer_s += out->host_step_s;
    }
    out->total_s = work_s + out->tp_s + out->cp_s + out->ep_s + out->pp_s + out->bubble_s +
                   out->dp_s + out->optimizer_s;
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
