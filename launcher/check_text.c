/* check_text.c — plait check's text: the nodes' GPUs and NVLink domains with the layout's
 * groups, the memory table (with ZeRO's stages, context parallelism, offload and MoE), the
 * traffic table with the modelled step and MFU, the rank map, the pipeline schedule and
 * this machine's measured CPU. --json's document is check_json.c's. */
#include <stdio.h>
#include <string.h>

#include "common/gpt2/gpt2_scratch.h" // defines: GPT2_CUDA_CONTEXT_BYTES, the allowance said
#include "common/place/env.h"         // defines: PLAIT_ENV_RANKS_PER_GPU
#include "common/place/topo.h"
#include "launcher/check.h"

/* ---- devices: memory and speed ------------------------------------------------------- */

/* What the GPUs like node GPU g are, on one line: model, PCI id, memory, dense
 * peaks and memory bandwidth, each with where it came from; or that plait
 * does not know them. */
static void print_gpu_kind(const struct topo *t, int g, int count)
{
    const struct topo_gpu *gpu = &t->gpus[g];
    const struct gpu_spec *spec = gpu->spec;
    printf("    %d × ", count);
    if (*gpu->model)
        printf("%s (10de:%04x, named by %s)", gpu->model, gpu->pci_device, gpu->model_source);
    else
        printf("unknown GPU 10de:%04x (no NVML, no hwloc GPU model, not in plait's table)",
               gpu->pci_device);
    if (gpu->memory_bytes) /* GB: 10^9 bytes, as every device memory plait prints */
        printf(", %.2f GB (%s)", gpu->memory_bytes / 1e9, gpu->memory_source);
    else
        printf(", memory unknown");
    if (spec && spec->fp8_tflops > 0)
        printf(", dense peaks bf16 %.0f / fp8 %.0f TFLOP/s, memory %.0f GB/s\n", spec->bf16_tflops,
               spec->fp8_tflops, spec->memory_gbps);
    else if (spec)
        printf(", dense peak bf16 %.0f TFLOP/s (no fp8), memory %.0f GB/s\n", spec->bf16_tflops,
               spec->memory_gbps);
    else
        printf(", peaks unknown (the cost model assumes %.0f TFLOP/s sustained bf16; "
               "--device-tflops T says)\n",
               layout_gpu_tflops(NULL, PLAN_PRECISION_BF16));
}

/* Each kind of GPU of a node (same model, PCI id and memory) once, with its count. */
static void print_gpu_kinds(const struct topo *t)
{
    for (int g = 0; g < t->n_gpus; g++) {
        bool first = true;
        int count = 0;
        for (int k = 0; k < t->n_gpus; k++) {
            const struct topo_gpu *a = &t->gpus[g], *b = &t->gpus[k];
            bool same = a->pci_device == b->pci_device && a->memory_bytes == b->memory_bytes &&
                        strcmp(a->model, b->model) == 0;
            if (same && k < g) first = false;
            count += same;
        }
        if (first) print_gpu_kind(t, g, count);
    }
}

/* ---- this machine's CPU ---------------------------------------------------------------------- */

void check_print_cpu(const struct cost_cpu_rates *cpu, double seconds, const struct layout_eval *e,
                     const struct place_node *nodes)
{
    double cpus;
    struct cost_links r = check_rank_rates(cpu, e, nodes, &cpus);
    printf("this machine's CPU kernels at the plan's shapes (measured in %.2f s), a rank's "
           "%.2f CPU%s:\n  products %.1f GFLOP/s, attention %.1f GFLOP/s, layer ops %.1f GB/s, "
           "parameter pass %.1f GB/s, %.1f µs to start an op\n\n",
           seconds, cpus, cpus == 1 ? "" : "s", 1e3 * r.device_tflops, 1e3 * r.attention_tflops,
           r.activation_gbps, r.device_memory_gbps, 1e6 * r.parallel_op_s);
}

/* ---- the layout and its nodes ------------------------------------------------------------ */

/* Where a communicator's groups sit, in words, by the slowest link they cross. */
static const char *link_where(enum cost_link link)
{
    return link == COST_LINK_NVLINK    ? "inside one NVLink domain"
           : link == COST_LINK_NETWORK ? "across the network"
                                       : "inside one node";
}

/* With ep > 1, where its two groups were placed and why: an ep group of a stage is ep
 * consecutive (folded) dp ranks of one tp rank, so it spans tp·ep consecutive ranks, which
 * placement keeps on one node when they fit; its expert peers are ep ranks apart. */
static void print_ep_groups(const struct rank_map *m, const struct place_node *nodes, int n_nodes)
{
    if (m->ep < 2) return;
    int span = m->tp * m->ep, slots = 0;
    for (int i = 0; i < n_nodes; i++) slots = nodes[i].slots > slots ? nodes[i].slots : slots;
    char why[64];
    if (m->comm_ep.slowest != COST_LINK_NETWORK || span > slots)
        snprintf(why, sizeof why, "%s a node's %d slots", span > slots ? "more than" : "within",
                 slots);
    else
        snprintf(why, sizeof why, "laid across a node's edge");
    printf("  ep groups: %s (each %d consecutive dp ranks of one tp rank, %d ranks apart: tp %d "
           "× ep %d = %d consecutive ranks, %s), an all-to-all of the routed rows, %d of each "
           "rank's %d peer%s over %s\n",
           link_where(m->comm_ep.slowest), m->ep, m->tp, m->tp, m->ep, span, why,
           m->comm_ep.peers_behind, m->ep - 1, m->ep == 2 ? "" : "s",
           m->comm_ep.slowest == COST_LINK_NETWORK ? "the network"
                                                   : cost_link_name(m->comm_ep.slowest));
    int peers = m->dp * m->cp / m->ep;
    if (peers > 1)
        printf("  expert peers: %s (the %d dp ranks holding the same experts, %d ranks apart): "
               "the routed experts' gradients are summed over them, the rest over dp\n",
               link_where(m->comm_experts.slowest), peers, span);
    else
        printf("  expert peers: none (ep is the whole dp): the routed experts' gradients are "
               "not summed\n");
}

/* The layout and each node: its GPUs by kind and its NVLink domains. */
static void print_nodes(const struct layout_eval *e, const struct place_node *nodes, int n_nodes)
{
    const struct rank_map *m = &e->map;
    char hsdp[96] = "";
    if (m->dp_shard && m->dp_shard < m->dp)
        snprintf(hsdp, sizeof hsdp, " (%d replica%s of a shard group of %d)", m->dp / m->dp_shard,
                 m->dp / m->dp_shard == 1 ? "" : "s", m->dp_shard);
    char layout[96];
    printf("layout: %s%s = %d rank%s on %d node%s\n",
           place_layout_text(layout, sizeof layout, m->tp, m->cp, m->pp, m->dp), hsdp, m->world,
           m->world == 1 ? "" : "s", n_nodes, n_nodes == 1 ? "" : "s");
    if (m->cp > 1)
        printf("  cp groups: %s (%d ranks a sequence, each taking 2 of its %d chunks)\n",
               link_where(m->comm_cp.slowest), m->cp, 2 * m->cp);
    print_ep_groups(m, nodes, n_nodes);
    for (int i = 0; i < n_nodes; i++) {
        const struct topo *t = nodes[i].topo;
        printf("  node %d: %s, %d slot%s, %d GPU%s, %d NIC%s (%s)\n", i, nodes[i].name,
               nodes[i].slots, nodes[i].slots == 1 ? "" : "s", t->n_gpus, t->n_gpus == 1 ? "" : "s",
               t->n_nics, t->n_nics == 1 ? "" : "s", t->source);
        print_gpu_kinds(t);
        for (int d = 0; d < t->n_domains; d++) {
            const struct topo_domain *dom = &t->domains[d];
            double least = 0;
            printf("    NVLink domain %d: GPUs {", d);
            for (int k = 0; k < dom->n_gpus; k++) {
                printf("%s%d", k ? "," : "", t->gpus[dom->gpus[k]].cuda_index);
                for (int j = 0; j < k; j++) {
                    double g = t->nvlink_gbps[dom->gpus[j] * t->n_gpus + dom->gpus[k]];
                    if (least == 0 || g < least) least = g;
                }
            }
            if (dom->n_gpus > 1)
                printf("} at %.0f GB/s between any two\n", least);
            else
                printf("} (no NVLink)\n");
        }
    }
}

/* ---- memory ------------------------------------------------------------------------------ */

/* With dp > 1, the most loaded rank's memory under each ZeRO stage, and, when
 * the plan's own fits, whether a cheaper one (less traffic) would too. */
static void print_zero_stages(const struct plan *placed, struct cost_layout l, uint64_t gpu_mem)
{
    int cp = placed->parallel.cp;
    if (l.dp * cp < 2) return; /* ZeRO slices over dp·cp ranks */
    double unit = layout_memory_at_zero(placed, l, 0) >= 1e9 ? 1e9 : 1e6;
    char cps[32] = "";
    if (cp > 1) snprintf(cps, sizeof cps, " × cp %d", cp);
    printf("  the most loaded rank by ZeRO stage at dp %d%s:", l.dp, cps);
    int lo = layout_zero_lowest(placed, l);
    for (int z = lo; z <= LAYOUT_ZERO_MAX; z++)
        printf("%s %d %.2f %s", z > lo ? "," : "", z, layout_memory_at_zero(placed, l, z) / unit,
               unit == 1e9 ? "GB" : "MB");
    printf("\n");
    int z = layout_zero_to_fit(placed, l, gpu_mem);
    if (z >= 0 && z < placed->parallel.zero)
        printf("  parallel.zero %d would fit too (%.2f GB), with no more data-parallel traffic\n",
               z, layout_memory_at_zero(placed, l, z) / 1e9);
}

/* With cp > 1, what a rank would hold without it: whether cp is what makes the plan fit. */
static void print_cp_fit(const struct plan *placed, const struct layout_eval *e, uint64_t gpu_mem)
{
    if (placed->parallel.cp < 2) return;
    struct plan whole = *placed; /* every sequence on one rank */
    whole.parallel.cp = 1;
    struct cost_memory mem;
    cost_memory(&whole, e->layout, &mem, NULL);
    bool only_cp = gpu_mem && e->fits && mem.total > gpu_mem;
    printf("  at cp 1 a rank would hold %.2f GB (activations %.2f)%s\n", mem.total / 1e9,
           mem.activations / 1e9,
           only_cp ? ": context parallelism is what makes the plan fit" : "");
}

/* Where parallel.offload puts the optimizer's state, in words (placed: the plan as placed,
 * whose device says whether the ranks are GPUs, whose step then runs on the CPU). */
static void print_offload(const struct plan *placed, const struct layout_eval *e, double unit)
{
    const struct plan_parallel *par = &placed->parallel;
    const char *u = unit == 1e9 ? "GB" : "MB";
    bool gpu = par->device == PLAN_DEVICE_CUDA;
    if (par->offload == PLAN_OFFLOAD_NVME && gpu)
        printf("  parallel.offload \"nvme\": the AdamW step runs on the CPU; the moments are on "
               "disk under %s (the most loaded rank: %.2f %s), two windows of up to %g MiB of "
               "each, the slice's fp32 master weights and its gradient in host memory (%.2f %s, "
               "the \"host\" column); the device holds none of the AdamW state\n",
               par->offload_dir, e->mem.disk / unit, u, par->offload_window_mb, e->mem.host / unit,
               u);
    else if (par->offload == PLAN_OFFLOAD_NVME)
        printf("  the AdamW moments are on disk under %s (the most loaded rank: %.2f %s), two "
               "windows of up to %g MiB of each in memory (in \"optimizer\")\n",
               par->offload_dir, e->mem.disk / unit, u, par->offload_window_mb);
    else if (par->offload == PLAN_OFFLOAD_HOST && gpu)
        printf("  parallel.offload \"host\": the AdamW step runs on the CPU; the moments, the "
               "slice's fp32 master weights and its gradient are in host memory (the most "
               "loaded rank: %.2f %s, the \"host\" column, beside the device's total); the device "
               "holds none of the AdamW state\n",
               e->mem.host / unit, u);
    else if (par->offload == PLAN_OFFLOAD_HOST)
        printf("  parallel.offload \"host\": on CPU ranks the optimizer state is in host memory "
               "already; nothing moves\n");
    if (e->time.host_step_s > 0)
        printf("  the step on the CPU is modelled at %.3f s: the slice's gradient down and its "
               "weights up over PCIe at %.0f GB/s, AdamW's pass at %.0f GB/s of host memory\n",
               e->time.host_step_s, COST_HOST_LINK_GBPS, COST_HOST_MEMORY_GBPS);
}

/* Mixture of experts: its blocks and the parameters a token passes through (what the
 * model's FLOPs count), beside all of them. */
static void print_moe(const struct plan *p)
{
    struct gpt2_config cfg = gpt2_config_of_plan(&p->model);
    struct gpt2_layout l;
    if (!gpt2_moe(&cfg) || gpt2_layout(&cfg, &l)) return;
    const struct plan_moe *e = &p->model.moe;
    double total = (double)l.total, active = total - gpt2_inactive_expert_params(&cfg);
    printf("  model.moe: %d experts (top %d, %d shared) %d wide in %d of %d layers; %.0f "
           "parameters, %.0f of them active (%.0f%%: a token passes its k experts)\n",
           e->experts, e->top_k, e->shared_experts, e->ffn_hidden, gpt2_moe_layers(&cfg),
           cfg.layers, total, active, 100 * active / total);
    int ep = p->parallel.ep;
    if (ep > 1)
        printf("  parallel.ep %d: each MoE layer's experts over ep groups of %d consecutive %s "
               "ranks, %d routed a rank (and every shared one), their rows exchanged by "
               "all-to-all\n",
               ep, ep, p->parallel.cp > 1 ? "dp·cp" : "dp", e->experts / ep);
    const struct plan_parallel *par = &p->parallel;
    int slices = plan_zero_slices(par, plan_dp_shard(par, par->dp) * par->cp);
    if (ep > 1 && par->zero > 0 && slices > 1)
        printf("  ZeRO %d with parallel.ep: each rank's part sliced over its %d expert peers in "
               "the shard group, the dense slices summed over the ep group too\n",
               par->zero, slices);
    else if (ep > 1 && par->zero > 0)
        printf("  ZeRO %d with parallel.ep: a shard group's expert peers are one rank each, so "
               "nothing is sliced; the gradients are summed as at ZeRO 0\n",
               par->zero);
}

/* The stage with the loss (the last; DualPipeV's first): its logits in chunks, and what
 * that saves; nothing when it holds them whole. */
static void print_logits(const struct plan *placed, const struct layout_eval *e, double unit)
{
    struct cost_memory chunked, whole;
    struct plan at_once = *placed;
    at_once.logits_chunk_mb = 0;
    int s = 0;
    for (; s < e->layout.pp; s++) {
        cost_memory_stage(placed, e->layout, s, &chunked);
        if (chunked.logits_rows) break;
    }
    if (s == e->layout.pp) return;
    cost_memory_stage(&at_once, e->layout, s, &whole);
    printf("  stage %d computes its logits %lld rows at a time (logits_chunk_mb %g), the LM "
           "head's gradients made as it goes: its activations %.2f %s, against %.2f with each "
           "micro-batch's logits whole\n",
           s, (long long)chunked.logits_rows, placed->logits_chunk_mb, chunked.activations / unit,
           unit == 1e9 ? "GB" : "MB", whole.activations / unit);
}

/* Device memory per rank of each stage, as model_init allocates it. */
static void print_memory(const struct plan *p, const struct layout_eval *e, uint64_t gpu_mem)
{
    const struct rank_map *m = &e->map;
    const struct plan placed = layout_plan_as_placed(p, m); /* what the ranks hold */
    /* what model_init will allocate on each rank of a stage (every tp and dp rank
     * of a stage holds the same): GB, or MB for models that small */
    double unit = e->mem.total >= 1e9 ? 1e9 : 1e6;
    bool fp8 = p->precision == PLAN_PRECISION_FP8;
    printf("\nmemory per rank, %s, as the runtime allocates it (%s%s%s, ZeRO %d, recompute %s):\n",
           unit == 1e9 ? "GB" : "MB", plan_precision_name(p->precision),
           fp8 ? " with scaling per " : "", fp8 ? plan_fp8_scaling_name(p->fp8_scaling) : "",
           p->parallel.zero, plan_recompute_name(p->recompute));
    bool host = e->mem.host > 0; /* a GPU rank's offloaded step: its host memory, a column */
    bool gpu = e->mem.cuda_context > 0; /* a GPU rank's scratch and CUDA context, two */
    printf("  %5s %9s %12s %8s %8s %10s %12s%s %8s%s\n", "stage", "layers", "parameters", "params",
           "grads", "optimizer", "activations", gpu ? "  scratch     cuda" : "", "total",
           host ? "     host" : "");
    for (int s = 0; s < m->pp; s++) {
        struct cost_memory mem;
        cost_memory_stage(&placed, e->layout, s, &mem);
        struct gpt2_part part = cost_stage_part(p, 1, 0, m->pp, s);
        char layers[32];
        if (part.chunks > 1) /* interleaved: chunks of the even split */
            snprintf(layers, sizeof layers, "%d×%d", part.chunks,
                     part.layer_end - part.layer_begin);
        else
            snprintf(layers, sizeof layers, "%d-%d", part.layer_begin, part.layer_end - 1);
        printf("  %5d %9s %12lld %8.2f %8.2f %10.2f %12.2f", s, layers, (long long)mem.param_count,
               mem.params / unit, mem.grads / unit, mem.optimizer / unit, mem.activations / unit);
        if (gpu) printf(" %8.2f %8.2f", mem.scratch / unit, mem.cuda_context / unit);
        printf(" %8.2f", mem.total / unit);
        if (host) printf(" %8.2f", mem.host / unit);
        printf("\n");
    }
    if (gpu)
        printf("  scratch: the CUDA backend's buffers at their largest in a step; cuda: "
               "cuBLASLt's workspace (%.0f MiB) and the CUDA context (%.0f MiB, an estimate)\n",
               GPT2_CUBLASLT_WORKSPACE_BYTES / 1048576.0, GPT2_CUDA_CONTEXT_BYTES / 1048576.0);
    if (m->world > 1 && m->ranks[0].gpu < 0) { /* CPU ranks: the socket backend's rings */
        uint64_t rings = 0;
        for (int s = 0; s < m->pp; s++) {
            uint64_t b = cost_comm_ring_bytes(p, e->layout, s);
            rings = b > rings ? b : rings;
        }
        printf("  + up to %.2f %s of host memory a rank for the collectives' shared-memory "
               "rings (peers on its node)\n",
               rings / unit, unit == 1e9 ? "GB" : "MB");
    }
    print_offload(&placed, e, unit);
    print_logits(&placed, e, unit);
    print_moe(p);
    if (fp8)
        printf("  fp8 keeps an E4M3 copy of each layer's four weight matrices beside the fp32 "
               "weights (params: + 1 byte a weight, + 4 a scale, one per %s) and on the last "
               "stage a bf16 copy of wte for the LM head (+ 2 bytes a weight)\n",
               p->fp8_scaling == PLAN_FP8_BLOCK ? "128×128 block" : "matrix");
    uint64_t rank_mem = layout_rank_device_memory(m, gpu_mem); /* (its share of a GPU) */
    if (gpu_mem && m->gpu_sharing > 1)
        printf("  device memory %.2f GB, shared by %d ranks (%s): %.2f GB a rank: %s\n",
               gpu_mem / 1e9, m->gpu_sharing, PLAIT_ENV_RANKS_PER_GPU, rank_mem / 1e9,
               e->fits ? "fits" : "DOES NOT FIT");
    else if (gpu_mem)
        printf("  device memory %.2f GB: %s\n", gpu_mem / 1e9, e->fits ? "fits" : "DOES NOT FIT");
    else
        printf("  device memory unknown (give --gpu-memory GB to check the fit)\n");
    print_cp_fit(&placed, e, rank_mem);
    print_zero_stages(&placed, e->layout, rank_mem);
}

/* ---- traffic, the rank map --------------------------------------------------------------- */

/* Traffic per rank per step by communicator, the modelled step and MFU. */
static void print_traffic(const struct plan *p, const struct layout_eval *e,
                          const struct place_node *nodes)
{
    const struct rank_map *m = &e->map;
    int width = check_hybrid(m) ? 8 : m->ep > 1 ? 7 : 4; /* "replicas", "experts" */
    printf("\ntraffic per rank per step:\n  %*s %14s %9s %10s %8s  %s\n", width, "comm", "bytes",
           "link", "GB/s", "seconds", "groups by link");
    const struct {
        const char *name;
        const struct place_comm *c;
        double bytes, s;
    } rows[] = {{"tp", &m->comm_tp, e->traffic.tp_bytes, e->time.tp_s},
                {"pp", &m->comm_pp, e->traffic.pp_bytes, e->time.pp_s},
                {"dp", &m->comm_dp, e->traffic.dp_bytes, e->time.dp_s},
                /* hybrid sharding: the dp row's two parts, each over its own groups */
                {"shard", &m->comm_shard, e->traffic.shard_bytes,
                 check_raw_seconds(&m->comm_shard, e->traffic.shard_bytes)},
                {"replicas", &m->comm_replicas, e->traffic.replicas_bytes,
                 check_raw_seconds(&m->comm_replicas, e->traffic.replicas_bytes)},
                /* context parallelism's ring */
                {"cp", &m->comm_cp, e->traffic.cp_bytes, e->time.cp_s},
                /* expert parallelism: the all-to-all, and the dp row's routed experts' part */
                {"ep", &m->comm_ep, e->traffic.ep_bytes, e->time.ep_s},
                {"experts", &m->comm_experts, e->traffic.experts_bytes,
                 check_raw_seconds(&m->comm_experts, e->traffic.experts_bytes)}};
    for (size_t k = 0; k < sizeof rows / sizeof *rows; k++) {
        if ((k == 3 || k == 4) && !check_hybrid(m)) continue;
        if (k == 5 && m->cp < 2) continue;
        if (k >= 6 && rows[k].c->groups == 0) continue; /* (ep 1; no expert peers) */
        char by[128] = "";
        size_t len = 0;
        for (int l = 1; l < COST_LINKS; l++)
            if (rows[k].c->crossing[l])
                len += (size_t)snprintf(by + len, sizeof by - len, "%s%d %s", len ? ", " : "",
                                        rows[k].c->crossing[l], cost_link_name(l));
        printf("  %*s %14.0f %9s %10.1f %8.4f  %s\n", width, rows[k].name, rows[k].bytes,
               cost_link_name(rows[k].c->slowest), rows[k].c->gbps, rows[k].s, by);
    }
    char optimizer[64] = "", memory[96] = ""; /* AdamW's pass; a measured CPU's own terms */
    if (e->time.optimizer_s > 0)
        snprintf(optimizer, sizeof optimizer, ", optimizer %.3f", e->time.optimizer_s);
    if (e->time.memory_s > 0)
        snprintf(memory, sizeof memory, ", memory-bound ops %.3f, op starts %.3f", e->time.memory_s,
                 e->time.parallel_s);
    char cp[64] = "";
    if (m->cp > 1) snprintf(cp, sizeof cp, ", cp %.3f", e->time.cp_s);
    if (m->ep > 1) snprintf(cp + strlen(cp), sizeof cp - strlen(cp), ", ep %.3f", e->time.ep_s);
    printf("  modelled step: %.3f s (compute %.3f%s, tp %.3f%s, pp %.3f + bubble %.3f, dp exposed "
           "%.3f%s); %.0f tokens/s\n",
           e->time.total_s, e->time.compute_s, memory, e->time.tp_s, cp, e->time.pp_s,
           e->time.bubble_s, e->time.dp_s, optimizer, e->tokens_per_s);
    if (m->ep > 1)
        printf("  ep: each MoE layer's routed rows to their experts' ranks and back in forward "
               "and backward (again in full recompute's forward, twice with a split "
               "backward), fp32 as the CPU backend sends them (the CUDA backend refuses MoE), "
               "balanced routing; its seconds the share to peers over the slowest link; "
               "serial in the step (no overlap with compute modelled, DualPipeV's included). "
               "dp: the dense gradients over dp, and the experts row\n");
    const struct gpu_spec *gpu = check_plan_gpu(e, nodes);
    if (gpu) {
        struct gpt2_config cfg = gpt2_config_of_plan(&p->model);
        printf("  modelled MFU: %.1f%% of %d × %s's dense %s peak, %.0f TFLOP/s each "
               "(%.1f MFLOP per token: 6·N + 12·L·C·T)\n",
               100 * check_modelled_mfu(p, e, nodes), check_plan_gpus(e), gpu->name,
               p->precision == PLAN_PRECISION_FP8 && gpu->fp8_tflops > 0 ? "fp8"
               : p->precision == PLAN_PRECISION_FP32                     ? "tf32"
                                                                         : "bf16",
               gpu_peak_tflops(gpu, p->precision),
               gpu_flops_per_token(&cfg, p->model.seq_len) / 1e6);
    } else if (m->world > 0 && m->ranks[0].gpu >= 0) {
        printf("  modelled MFU: unknown (plait does not know this GPU's peak)\n");
    }
}

static void print_rank_map(const struct layout_eval *e, const struct place_node *nodes)
{
    const struct rank_map *m = &e->map;
    bool cp = m->cp > 1; /* its column only where the layout has it */
    printf("\nrank map:\n  %5s %4s %5s %3s %s%3s %3s %13s %4s %6s %8s %5s  %s\n", "rank", "node",
           "local", "tp", cp ? " cp " : "", "pp", "dp", "gpu", "idx", "domain", "nic", "numa",
           "cpus");
    for (int r = 0; r < m->world; r++) {
        const struct place_rank *pr = &m->ranks[r];
        const struct topo *t = nodes[pr->node].topo;
        char cpus[4096], cp_rank[16] = "";
        topo_cpu_list(t, pr->cores, pr->n_cores, cpus, sizeof cpus);
        if (cp) snprintf(cp_rank, sizeof cp_rank, "%3d ", pr->cp);
        printf("  %5d %4d %5d %3d %s%3d %3d %13s %4d %6d %8s %5d  %s\n", r, pr->node,
               pr->local_rank, pr->tp, cp_rank, pr->pp, pr->dp,
               pr->gpu >= 0 ? t->gpus[pr->gpu].busid : "cpu",
               pr->gpu >= 0 ? t->gpus[pr->gpu].cuda_index : -1,
               pr->gpu >= 0 ? t->gpus[pr->gpu].domain : -1,
               pr->nic >= 0 ? t->nics[pr->nic].name : "-", pr->numa, cpus);
    }
}

void check_print_tables(const struct plan *p, const struct layout_eval *e,
                        const struct place_node *nodes, int n_nodes, uint64_t gpu_mem)
{
    print_nodes(e, nodes, n_nodes);
    print_memory(p, e, gpu_mem);
    print_traffic(p, e, nodes);
    print_rank_map(e, nodes);
}

/* ---- the pipeline schedule --------------------------------------------------------------- */

/* Every schedule's bubble at the plan's stages and micro-batches, on one line. */
static void print_other_schedules(const struct schedule *s, int virtual_stages)
{
    double bubble[SCHED_KINDS];
    schedule_bubbles(s->pp, s->m, virtual_stages, bubble);
    printf("  beside it, the same work a stage:");
    for (int k = 0; k < SCHED_KINDS; k++) {
        printf("%s %s", k ? "," : "", schedule_kind_name((enum sched_kind)k));
        if (k == SCHED_INTERLEAVED) printf(" ×%d", virtual_stages < 2 ? 2 : virtual_stages);
        if (bubble[k] >= 0)
            printf(" %.1f%%", 100 * bubble[k]);
        else
            printf(" -");
    }
    printf("\n");
}

void check_print_schedule(const struct plan *p, const struct cost_layout *l)
{
    struct schedule s;
    struct sched_sim sim;
    if (check_make_schedule(p, l, &s, &sim)) return;
    printf("\npipeline: %s over %d stages, %d micro-batch%s per step%s: bubble %.1f%% "
           "(simulated, backward = 2 × forward)\n",
           schedule_kind_name(s.kind), s.pp, s.m, s.m == 1 ? "" : "es",
           s.kind == SCHED_INTERLEAVED ? ", interleaved"
           : s.v > 1                   ? ", two chunks a stage in a V"
                                       : "",
           100 * sim.bubble);
    print_other_schedules(&s, p->parallel.virtual_stages);
    schedule_print(&s, stdout, 100);
    schedule_free(&s);
}
