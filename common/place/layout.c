/* layout.c — deciding a layout: evaluating one (placement, memory, traffic,
 * step time) and choosing "auto" degrees by the cost model. Printing the
 * candidates is plait check's; the numbers are cost.c's and place.c's. */
#include "common/place/layout.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/place/elastic_batch.h" // defines: elastic_batch_dp
#include "common/place/env.h"           // defines: PLAIT_ENV_RANKS_PER_GPU
#include "common/place/gpu.h"           // defines: gpu_peak_tflops, struct gpu_spec

/* The share of a GPU's dense datasheet peak the cost model takes as plait's
 * sustained rate over a whole step, by precision: calibrated on plait itself,
 * not on another framework (make gpu-check on an H100 80GB SXM, 2026-11-26).
 * GPT-2 124M in bf16 trained at 230,065 tokens/s at 16×1024 and 242,716 at
 * 32×1024, 71.2 and 135.0 ms a step; cost.c counts 854.7 MFLOP per token and
 * adds AdamW's 4.0 GB at 3,350 GB/s (1.2 ms): 0.205 of 989.4 TFLOP/s models
 * 70.2 and 139.3 ms (1% under, 3% over). fp8 with tensor scaling trained at
 * 148,215 tokens/s at 16×1024 (110.5 ms): 0.065 of 1,978.9 TFLOP/s models it
 * (its products quantise their inputs in passes of their own, so fp8 is slower
 * than bf16 today; block scaling was 10% slower still). fp32 (no TF32, the
 * attention on CUDA cores) was not measured at that size: 0.41 of the TF32
 * peak is a guess. In the same run PyTorch (torch.compile, bf16 autocast, SDPA,
 * fused AdamW) reached 436,633 and 468,344 tokens/s, 0.41 of the bf16 peak:
 * the share plait is to reach (make bench-cuda prints both). */
static double gpu_sustained_share(enum plan_precision prec)
{
    switch (prec) {
    case PLAN_PRECISION_BF16:
        return 0.205;
    case PLAN_PRECISION_FP8:
        return 0.065;
    default:
        return 0.41;
    }
}

double layout_gpu_tflops(const struct gpu_spec *spec, enum plan_precision prec)
{
    double peak = gpu_peak_tflops(spec, prec);
    if (peak > 0) return gpu_sustained_share(prec) * peak;
    return 0.5 * (prec == PLAN_PRECISION_FP32 ? 20 : 100); /* an unknown GPU */
}

double layout_device_tflops(const struct topo *t, enum plan_precision prec)
{
    if (t->n_gpus == 0) return 0.4; /* a CPU rank not measured (layout_cpu_rank_links) */
    return layout_gpu_tflops(t->gpus[0].spec, prec);
}

int layout_node_cpus(const struct topo *t)
{
    int cpus = 0;
    for (int c = 0; c < t->n_cores; c++) cpus += t->cores[c].n_pus > 0 ? t->cores[c].n_pus : 1;
    return cpus > 0 ? cpus : 1;
}

double layout_cpus_per_rank(const struct rank_map *m, const struct place_node *nodes, int threads)
{
    double least = HUGE_VAL;
    for (int i = 0; i < m->n_nodes; i++) {
        int ranks = 0;
        for (int r = 0; r < m->world; r++) ranks += m->ranks[r].node == i;
        if (ranks > 0) least = fmin(least, (double)layout_node_cpus(nodes[i].topo) / ranks);
    }
    if (threads > 0) least = fmin(least, threads);
    return isfinite(least) ? least : 1;
}

void layout_cpu_rank_links(const struct cost_cpu_rates *cpu, double cpus, bool given_tflops,
                           struct cost_links *links)
{
    if (!given_tflops) links->device_tflops = cpu->matmul_gflops * cpus / 1e3;
    links->attention_tflops = cpu->attention_gflops * cpus / 1e3;
    links->activation_gbps = cpu->activation_gbps * cpus;
    links->device_memory_gbps = cpu->memory_gbps * cpus;
    links->parallel_op_s = cpu->parallel_op_us * 1e-6; /* a rank's, whatever its CPUs */
}

double layout_device_memory_gbps(const struct topo *t)
{
    return t->n_gpus > 0 && t->gpus[0].spec ? t->gpus[0].spec->memory_gbps : 0;
}

/* The smallest device memory among the nodes (bytes), 0 when unknown. */
uint64_t layout_device_memory(const struct place_node *nodes, int n, double override_gb)
{
    if (override_gb > 0) return (uint64_t)(override_gb * 1e9);
    uint64_t least = 0;
    for (int i = 0; i < n; i++)
        for (int g = 0; g < nodes[i].topo->n_gpus; g++) {
            uint64_t b = nodes[i].topo->gpus[g].memory_bytes;
            if (b == 0) return 0;
            if (!least || b < least) least = b;
        }
    return least;
}

/* ---- evaluating a layout ---------------------------------------------------------------- */

struct plan layout_plan_as_placed(const struct plan *p, const struct rank_map *m)
{
    struct plan placed = *p;
    if (p->parallel.device == PLAN_DEVICE_AUTO && m->world > 0)
        placed.parallel.device = m->ranks[0].gpu >= 0 ? PLAN_DEVICE_CUDA : PLAN_DEVICE_CPU;
    return placed;
}

void layout_evaluate(const struct plan *p, struct cost_layout l, const struct place_node *nodes,
                     int n_nodes, const struct layout_inputs *in, struct layout_eval *e)
{
    uint64_t gpu_mem = in->device_memory_bytes;
    memset(e, 0, sizeof *e);
    e->layout = l;
    struct plait_error err;
    if (place_ranks(p, l.tp, l.pp, l.dp, nodes, n_nodes, &in->bw, &e->map, &err)) {
        snprintf(e->why, sizeof e->why, "%s", err.text);
        return;
    }
    e->placed = true;
    struct plan placed = layout_plan_as_placed(p, &e->map);
    cost_memory(&placed, l, &e->mem, &e->worst_stage);
    cost_traffic(p, l, &e->traffic);
    struct cost_links links = {
        .tp = e->map.comm_tp.slowest,
        .pp = e->map.comm_pp.slowest,
        .dp = e->map.comm_dp.slowest,
        .tp_gbps = e->map.comm_tp.gbps,
        .pp_gbps = e->map.comm_pp.gbps,
        .dp_gbps = e->map.comm_dp.gbps,
        .shard = e->map.comm_shard.slowest,
        .replicas = e->map.comm_replicas.slowest,
        .shard_gbps = e->map.comm_shard.gbps,
        .replicas_gbps = e->map.comm_replicas.gbps,
        .cp = e->map.comm_cp.slowest,
        .cp_gbps = e->map.comm_cp.gbps,
        .ep = e->map.comm_ep.slowest,
        .experts = e->map.comm_experts.slowest,
        .ep_gbps = e->map.comm_ep.gbps,
        .experts_gbps = e->map.comm_experts.gbps,
        .ep_share = e->map.ep > 1 ? (double)e->map.comm_ep.peers_behind / (e->map.ep - 1) : 0,
        .device_tflops = in->device_tflops > 0 ? in->device_tflops
                                               : layout_device_tflops(nodes[0].topo, p->precision),
        .device_memory_gbps = nodes[0].cpu_ranks ? 0 : layout_device_memory_gbps(nodes[0].topo)};
    if (e->map.gpu_sharing > 1) { /* ranks sharing a GPU share its rates */
        links.device_tflops /= e->map.gpu_sharing;
        links.device_memory_gbps /= e->map.gpu_sharing;
    }
    if (in->cpu && e->map.world > 0 && e->map.ranks[0].gpu < 0)
        layout_cpu_rank_links(in->cpu, layout_cpus_per_rank(&e->map, nodes, in->cpu->threads),
                              in->device_tflops > 0, &links);
    cost_step_time(&placed, l, &links, &e->time); /* (a GPU rank's offloaded step) */
    double tokens = (double)p->batch.micro_batch * p->batch.grad_accum * l.dp * p->model.seq_len;
    e->tokens_per_s =
        e->time.total_s > 0 && isfinite(e->time.total_s) ? tokens / e->time.total_s : 0;
    if (e->mem.total == UINT64_MAX) { /* cost_memory's saturation: no figure to print */
        e->fits = false;
        snprintf(e->why, sizeof e->why,
                 "a rank of pipeline stage %d would need more memory than 64 bits count: the "
                 "model or the micro-batch is beyond what plait runs",
                 e->worst_stage);
        return;
    }
    /* K ranks on one GPU (PLAIT_RANKS_PER_GPU): each rank's prediction × K against it */
    uint64_t rank_mem = layout_rank_device_memory(&e->map, gpu_mem);
    e->fits = gpu_mem == 0 || e->mem.total <= rank_mem;
    if (e->fits) return;
    char shared[160] = "";
    if (e->map.gpu_sharing > 1)
        snprintf(shared, sizeof shared, ", the %d on one GPU (%s) %.2f GB,",
                 e->map.gpu_sharing, PLAIT_ENV_RANKS_PER_GPU,
                 (double)e->mem.total * e->map.gpu_sharing / 1e9);
    char cuda[96] = ""; /* a GPU rank's beside the model's buffers */
    if (e->mem.cuda_context)
        snprintf(cuda, sizeof cuda, ", scratch %.2f, CUDA context and workspace %.2f",
                 e->mem.scratch / 1e9, e->mem.cuda_context / 1e9);
    int n = snprintf(e->why, sizeof e->why,
                     "a rank of pipeline stage %d needs %.2f GB%s the GPU has %.2f GB (params "
                     "%.2f, grads %.2f, optimizer %.2f, activations %.2f%s GB): ",
                     e->worst_stage, e->mem.total / 1e9, *shared ? shared : ",", gpu_mem / 1e9,
                     e->mem.params / 1e9, e->mem.grads / 1e9, e->mem.optimizer / 1e9,
                     e->mem.activations / 1e9, cuda);
    layout_fit_advice(&placed, l, rank_mem, e->why + n, sizeof e->why - (size_t)n);
}

uint64_t layout_rank_device_memory(const struct rank_map *m, uint64_t gpu_bytes)
{
    return m->gpu_sharing > 1 ? gpu_bytes / (uint64_t)m->gpu_sharing : gpu_bytes;
}

/* ---- what would make a layout fit ------------------------------------------------------- */

void layout_memory_with(const struct plan *p, struct cost_layout l, int zero,
                        enum plan_offload offload, struct cost_memory *out)
{
    struct plan q = *p;
    q.parallel.zero = zero;
    q.parallel.offload = offload;
    cost_memory(&q, l, out, NULL);
}

uint64_t layout_memory_at_zero(const struct plan *p, struct cost_layout l, int zero)
{
    struct cost_memory mem;
    layout_memory_with(p, l, zero, p->parallel.offload, &mem);
    return mem.total;
}

int layout_zero_lowest(const struct plan *p, struct cost_layout l)
{
    return plan_dp_shard(&p->parallel, l.dp) < l.dp ? 1 : 0; /* replicas take ZeRO >= 1 */
}

/* The lowest ZeRO stage from `from` up with which every rank of l fits in device_bytes
 * with the moments where `offload` puts them; -1 when none does. */
static int zero_to_fit_from(const struct plan *p, struct cost_layout l, int from,
                            enum plan_offload offload, uint64_t device_bytes)
{
    for (int z = from; z <= LAYOUT_ZERO_MAX; z++) {
        struct cost_memory mem;
        layout_memory_with(p, l, z, offload, &mem);
        if (mem.total <= device_bytes) return z;
    }
    return -1;
}

int layout_zero_to_fit(const struct plan *p, struct cost_layout l, uint64_t device_bytes)
{
    /* ZeRO shards over the dp·cp ranks: nothing to shard, or no limit known */
    if ((int64_t)l.dp * p->parallel.cp < 2 || device_bytes == 0) return -1;
    return zero_to_fit_from(p, l, layout_zero_lowest(p, l), p->parallel.offload, device_bytes);
}

int layout_host_offload_to_fit(const struct plan *p, struct cost_layout l, uint64_t device_bytes)
{
    if (p->parallel.device != PLAN_DEVICE_CUDA || p->parallel.offload != PLAN_OFFLOAD_NONE ||
        device_bytes == 0)
        return -1;
    int lowest = layout_zero_lowest(p, l), from = p->parallel.zero;
    return zero_to_fit_from(p, l, from > lowest ? from : lowest, PLAN_OFFLOAD_HOST, device_bytes);
}

/* "parallel.offload "host" [with parallel.zero Z] fits with ... (...)" into buf, when the
 * step on the CPU makes l fit (layout_host_offload_to_fit); else nothing, false. */
static bool host_offload_advice(const struct plan *p, struct cost_layout l, uint64_t device_bytes,
                                char *buf, size_t n)
{
    int z = layout_host_offload_to_fit(p, l, device_bytes);
    if (z < 0) return false;
    struct cost_memory mem;
    layout_memory_with(p, l, z, PLAN_OFFLOAD_HOST, &mem);
    char zero[32] = "";
    if (z != p->parallel.zero && (int64_t)l.dp * p->parallel.cp > 1)
        snprintf(zero, sizeof zero, " with parallel.zero %d", z);
    snprintf(buf, n,
             "parallel.offload \"host\"%s fits with %.2f GB of %.2f per GPU (the AdamW step on "
             "the CPU: the moments, the slice's master weights and gradient, %.2f GB, in host "
             "memory)",
             zero, mem.total / 1e9, device_bytes / 1e9, mem.host / 1e9);
    return true;
}

void layout_fit_advice(const struct plan *p, struct cost_layout l, uint64_t device_bytes, char *buf,
                       size_t n)
{
    const char *rest = "raise tp or pp, recompute, or a smaller batch.micro_batch";
    int z = layout_zero_to_fit(p, l, device_bytes);
    bool no_dp = (int64_t)l.dp * p->parallel.cp < 2;
    if (!no_dp && z > p->parallel.zero) {
        /* the cheapest stage that fits (least traffic), beside the one below it (the
         * plan's own or above: a stage the layout may run) */
        snprintf(buf, n, "parallel.zero %d fits with %.2f GB of %.2f per GPU; zero %d needs %.2f",
                 z, layout_memory_at_zero(p, l, z) / 1e9, device_bytes / 1e9, z - 1,
                 layout_memory_at_zero(p, l, z - 1) / 1e9);
        return;
    }
    /* no ZeRO stage fits: a GPU rank's step on the CPU may */
    size_t len = host_offload_advice(p, l, device_bytes, buf, n) ? strlen(buf) : 0;
    const char *sep = len ? "; or " : "";
    if (no_dp)
        snprintf(buf + len, n - len, "%s%s (ZeRO shards over data-parallel ranks, and dp is 1)",
                 sep, rest);
    else if (len)
        snprintf(buf + len, n - len, "; no ZeRO stage fits without it");
    else
        snprintf(buf, n, "not even parallel.zero %d fits (%.2f GB): %s", LAYOUT_ZERO_MAX,
                 layout_memory_at_zero(p, l, LAYOUT_ZERO_MAX) / 1e9, rest);
}

void layout_eval_free(struct layout_eval *e)
{
    rank_map_free(&e->map);
}

/* "auto" tp/pp: tp dividing the heads, key/value heads, the MLP's width and the
 * padded vocabulary, pp dividing
 * the layers (even stages), and — with dp "auto" filling the allocation —
 * tp·pp dividing the slots. The layout that can be placed, fits in memory and
 * has the most modelled tokens per second wins. */
static int choose_auto(const struct plan *p, const struct place_node *nodes, int n_nodes, int slots,
                       const struct layout_inputs *in,
                       void (*visit)(void *ctx, const struct layout_eval *candidate), void *ctx,
                       struct layout_eval *best)
{
    int tps[64], n_tp = 0, pps[64], n_pp = 0;
    for (int t = p->parallel.sequence_parallel ? 2 : 1; t <= slots && n_tp < 64; t++)
        if ((p->parallel.tp == PLAN_AUTO || p->parallel.tp == t) && p->model.heads % t == 0 &&
            p->model.kv_heads % t == 0 && p->model.ffn_hidden % t == 0 &&
            p->model.padded_vocab % t == 0)
            tps[n_tp++] = t;
    for (int s = 1; s <= p->model.layers && s <= slots && n_pp < 64; s++)
        if ((p->parallel.pp == PLAN_AUTO && p->model.layers % s == 0) || p->parallel.pp == s)
            pps[n_pp++] = s;
    bool found = false;
    for (int i = 0; i < n_tp; i++)
        for (int j = 0; j < n_pp; j++) {
            int tp = tps[i], pp = pps[j];
            /* a replica's ranks, cp as the plan fixes it (tp, pp <= slots <= PLAN_MAX_RANKS) */
            int64_t tpp = (int64_t)tp * p->parallel.cp * pp;
            if (p->parallel.dp == PLAN_AUTO && slots % tpp != 0) continue;
            int64_t dp64 = p->parallel.dp != PLAN_AUTO
                               ? p->parallel.dp
                               : elastic_batch_dp(p, (int)(slots / tpp), pp, in->resumed);
            if (dp64 < 1 || tpp > slots / dp64) continue;
            struct layout_eval e;
            layout_evaluate(p, (struct cost_layout){tp, pp, (int)dp64}, nodes, n_nodes, in, &e);
            if (visit) visit(ctx, &e);
            bool ok = e.placed && e.fits && e.tokens_per_s > 0;
            if (ok && (!found || e.tokens_per_s > best->tokens_per_s)) {
                if (found) layout_eval_free(best);
                *best = e;
                found = true;
            } else {
                layout_eval_free(&e);
            }
        }
    return found ? 0 : -1;
}

int64_t layout_fixed_dp(const struct plan *p, int64_t slots, const struct ckpt_batch *resumed)
{
    const struct plan_parallel *par = &p->parallel;
    if (par->dp != PLAN_AUTO) return par->dp;
    int64_t most = slots / ((int64_t)par->tp * par->cp * par->pp);
    if (most < 1) return 0;
    /* more replicas than plait runs ranks: counted only, for the caller to refuse */
    return most > PLAN_MAX_RANKS ? most : elastic_batch_dp(p, (int)most, par->pp, resumed);
}

int layout_choose(const struct plan *p, const struct place_node *nodes, int n_nodes,
                  const struct layout_inputs *in,
                  void (*visit)(void *ctx, const struct layout_eval *candidate), void *ctx,
                  struct layout_eval *best, struct plait_error *err)
{
    memset(best, 0, sizeof *best);
    int64_t slots = 0;
    for (int i = 0; i < n_nodes; i++) slots += nodes[i].slots;
    if (slots < 1 || slots > PLAN_MAX_RANKS)
        return error_set(err, "%lld slots: plait runs 1 to %d ranks", (long long)slots,
                         PLAN_MAX_RANKS);
    const struct plan_parallel *par = &p->parallel;
    if (par->tp == PLAN_AUTO || par->pp == PLAN_AUTO) {
        if (choose_auto(p, nodes, n_nodes, (int)slots, in, visit, ctx, best))
            return error_set(err, "no layout of tp and pp fits these %lld slots", (long long)slots);
        return 0;
    }
    int64_t tpp = (int64_t)par->tp * par->cp * par->pp; /* <= PLAN_MAX_RANKS (plan_load) */
    int64_t dp = layout_fixed_dp(p, slots, in->resumed);
    char text[96];
    if (dp < 1)
        return error_set(err, "%s needs %lld ranks; the allocation has %lld slots",
                         place_layout_text(text, sizeof text, par->tp, par->cp, par->pp, 0),
                         (long long)tpp, (long long)slots);
    layout_evaluate(p, (struct cost_layout){par->tp, par->pp, (int)dp}, nodes, n_nodes, in, best);
    if (visit) visit(ctx, best);
    if (!best->placed) return error_set(err, "%s", best->why);
    return 0;
}

double layout_modelled_tokens_per_s(const struct plan *p, const struct cost_cpu_rates *cpu)
{
    struct topo topo = {0};
    struct plait_error err;
    double rate = 0;
    if (topo_load(&topo, NULL, &err) == 0) {
        const struct plan_parallel *par = &p->parallel;
        struct cost_layout l = {par->tp == PLAN_AUTO ? 1 : par->tp,
                                par->pp == PLAN_AUTO ? 1 : par->pp,
                                par->dp == PLAN_AUTO ? 1 : par->dp};
        struct place_node node = {.name = "localhost",
                                  .topo = &topo,
                                  .slots = l.tp * p->parallel.cp * l.pp * l.dp,
                                  .cpu_ranks = p->parallel.device != PLAN_DEVICE_CUDA};
        struct layout_inputs in = {.cpu = cpu,
                                   .bw = {.pcie_gbps = 25, .network_gbps = 50, .memory_gbps = 100}};
        struct layout_eval e;
        layout_evaluate(p, l, &node, 1, &in, &e);
        rate = e.placed ? e.tokens_per_s : 0;
        layout_eval_free(&e);
    }
    topo_free(&topo);
    return rate;
}
