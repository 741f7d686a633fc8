/* cmd_check.c — `plait check PLAN [--nodes N] [--gpus-per-node G] [--k8s-nodes FILE]
 * [--topology FILE.xml ...] [--json]`: validates the plan, resolves "auto"
 * degrees with the cost model, places the ranks on the nodes' topologies and
 * prints the nodes' GPUs (model, memory, dense peaks), the memory table, the
 * traffic table with the modelled step and MFU, and the rank map (or one JSON
 * object). Exits 1 with the reason when the plan cannot run there. */
#include <jansson.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/place/cost.h"
#include "common/place/env.h"
#include "common/place/gpu.h"
#include "common/place/layout.h"
#include "common/log.h"
#include "common/place/place.h"
#include "common/plan/plan.h"
#include "common/place/schedule.h"
#include "common/place/topo.h"
#include "kernels/cpu/cpu_rate.h" // defines: cpu_rate_measure, this machine's CPU rates
#include "launcher/commands.h"
#include "launcher/k8s/k8s.h"
#include "launcher/plan_fit.h"

#define MAX_TOPOLOGIES 64

struct check_args {
    const char *plan_path;
    const char **sets;
    int n_sets;
    int nodes;         /* 0: as many as --topology files, else 1 */
    int gpus_per_node; /* 0: the topology's GPUs (1 CPU rank on a GPU-less node) */
    const char *topologies[MAX_TOPOLOGIES];
    int n_topologies;
    bool json;
    double gpu_memory_gb; /* 0: from the topology */
    double device_tflops; /* 0: from the GPU model */
    struct place_bandwidth bw;
    const char *k8s_nodes; /* kubectl get nodes -o json output, or NULL */
};

enum {
    OPT_NODES,
    OPT_GPUS_PER_NODE,
    OPT_TOPOLOGY,
    OPT_JSON,
    OPT_SET,
    OPT_GPU_MEMORY,
    OPT_DEVICE_TFLOPS,
    OPT_PCIE_GBPS,
    OPT_NETWORK_GBPS,
    OPT_MEMORY_GBPS,
    OPT_K8S_NODES
};
const struct cli_command cmd_check_cli = {
    .name = "check",
    .operands = "PLAN",
    .min_operands = 1,
    .max_operands = 1,
    .summary = "validate a plan, place its ranks, estimate memory and time",
    .description =
        "Validates PLAN, discovers each node's topology with hwloc (this machine, or hwloc\n"
        "XML files), chooses \"auto\" degrees, places the ranks and prints the memory per\n"
        "rank, the traffic per rank per step and the rank map.",
    .options =
        (const struct cli_option[]){
            [OPT_NODES] = {"--nodes", "N",
                           "nodes of the allocation (default: one per --topology, or 1)"},
            [OPT_GPUS_PER_NODE] = {"--gpus-per-node", "G",
                                   "ranks per node (default: the node's GPUs; for CPU ranks,\n"
                                   "the layout's ranks spread over the nodes)"},
            [OPT_TOPOLOGY] = {"--topology", "FILE.xml",
                              "hwloc XML of a node; one file for all nodes, or one per\n"
                              "node (default: this machine)",
                              .repeats = true},
            [OPT_JSON] = {"--json", NULL, "one JSON object instead of tables"},
            [OPT_SET] = {"--set", "path=value", "override a plan field, as for plait train",
                         .repeats = true},
            [OPT_GPU_MEMORY] = {"--gpu-memory", "GB",
                                "device memory, when the topology does not state it"},
            [OPT_DEVICE_TFLOPS] = {"--device-tflops", "T",
                                   "sustained dense matmul rate per device (default: from the\n"
                                   "GPU model, plait's measured share of its dense\n"
                                   "datasheet peak: 0.205 in bf16, 0.065 in fp8; CPU ranks on\n"
                                   "this machine: its CPU kernels measured now; set, nothing\n"
                                   "is measured)"},
            [OPT_PCIE_GBPS] = {"--pcie-gbps", "B",
                               "GPU to GPU bandwidth over PCIe, GB/s (default 25)"},
            [OPT_NETWORK_GBPS] = {"--network-gbps", "B", "bandwidth of one NIC, GB/s (default 50)"},
            [OPT_MEMORY_GBPS] = {"--memory-gbps", "B",
                                 "bandwidth between CPU ranks of a node, GB/s (default 100)"},
            [OPT_K8S_NODES] = {"--k8s-nodes", "FILE",
                               "`kubectl get nodes -o json` output: check the plan on each\n"
                               "kind of GPU node in it and name the nodes it fits on"},
            {0}},
    .epilog = "exit codes: 0 the plan can run there, 1 it cannot (the reason is printed), 2 usage",
};

/* Returns CLI_CONTINUE, or the exit code. */
static int parse_args(int argc, char **argv, struct check_args *a)
{
    const struct cli_command *cli = &cmd_check_cli;
    a->bw = (struct place_bandwidth){.pcie_gbps = 25, .network_gbps = 50, .memory_gbps = 100};
    struct cli_args args;
    int rc = cli_parse(cli, argc, argv, &args);
    if (rc != CLI_CONTINUE) return rc;
    a->sets = calloc((size_t)args.n + 1, sizeof *a->sets);
    if (!a->sets) rc = PLAIT_EXIT_ERROR;
    for (int k = 0; k < args.n && rc == CLI_CONTINUE; k++) {
        int opt = args.v[k].opt;
        const char *v = args.v[k].value, *o = opt >= 0 ? cli->options[opt].name : NULL;
        char *end = NULL;
        switch (opt) {
        case OPT_JSON:
            a->json = true;
            break;
        case OPT_SET:
            a->sets[a->n_sets++] = v;
            break;
        case OPT_K8S_NODES:
            a->k8s_nodes = v;
            break;
        case OPT_TOPOLOGY:
            if (a->n_topologies == MAX_TOPOLOGIES)
                rc = cli_usage_error(cli, "at most %d --topology files", MAX_TOPOLOGIES);
            else
                a->topologies[a->n_topologies++] = v;
            break;
        case OPT_NODES:
        case OPT_GPUS_PER_NODE: {
            long n = strtol(v, &end, 10);
            if (*end || n < 1 || n > 1 << 20)
                rc = cli_usage_error(cli, "%s must be a positive integer (got %s)", o, v);
            else
                *(opt == OPT_NODES ? &a->nodes : &a->gpus_per_node) = (int)n;
            break;
        }
        case OPT_GPU_MEMORY:
        case OPT_DEVICE_TFLOPS:
        case OPT_PCIE_GBPS:
        case OPT_NETWORK_GBPS:
        case OPT_MEMORY_GBPS: {
            double x = strtod(v, &end);
            double *dst = opt == OPT_GPU_MEMORY      ? &a->gpu_memory_gb
                          : opt == OPT_DEVICE_TFLOPS ? &a->device_tflops
                          : opt == OPT_PCIE_GBPS     ? &a->bw.pcie_gbps
                          : opt == OPT_NETWORK_GBPS  ? &a->bw.network_gbps
                                                     : &a->bw.memory_gbps;
            if (*end || !(x > 0))
                rc = cli_usage_error(cli, "%s must be a positive number (got %s)", o, v);
            else
                *dst = x;
            break;
        }
        default:
            a->plan_path = v;
        }
    }
    cli_args_free(&args);
    if (rc == CLI_CONTINUE && a->n_topologies > 1 && a->nodes && a->nodes != a->n_topologies)
        rc = cli_usage_error(cli,
                             "%d --topology files for %d nodes: give one file for all nodes or "
                             "one per node",
                             a->n_topologies, a->nodes);
    if (rc == CLI_CONTINUE && a->k8s_nodes && a->n_topologies)
        rc = cli_usage_error(cli,
                             "--k8s-nodes describes the nodes: give it or --topology, not both");
    if (!a->nodes && !a->k8s_nodes) a->nodes = a->n_topologies > 1 ? a->n_topologies : 1;
    return rc;
}

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

/* The plan's GPUs: those of its ranks' nodes (NULL for CPU ranks, or when
 * plait does not know the first rank's GPU). */
static const struct gpu_spec *plan_gpu(const struct layout_eval *e, const struct place_node *nodes)
{
    const struct place_rank *r0 = &e->map.ranks[0];
    if (e->map.world < 1 || r0->gpu < 0) return NULL;
    const struct topo *t = nodes[r0->node].topo;
    return t->gpus[r0->gpu].spec;
}

/* The modelled MFU of a GPU plan (a fraction), 0 when the GPU's peak is unknown. */
static double modelled_mfu(const struct plan *p, const struct layout_eval *e,
                           const struct place_node *nodes)
{
    struct gpt2_config cfg = gpt2_config_of_plan(&p->model);
    double peak = gpu_peak_tflops(plan_gpu(e, nodes), p->precision);
    return gpu_mfu(gpu_flops_per_token(&cfg, p->model.seq_len), e->tokens_per_s, peak,
                   e->map.world);
}

/* ---- this machine's CPU ---------------------------------------------------------------------- */

/* What this machine's CPU kernels reach at the plan's shapes, measured now as
 * plait-train measures them when it starts (kernels/cpu/cpu_rate.h), so that
 * both model the same step: when the ranks run on this machine's CPU and no
 * --device-tflops says how fast (hwloc XML files and --k8s-nodes describe
 * other machines, whose speed is not known here: their CPU ranks keep the
 * assumed rate, and their goldens do not depend on this machine). */
static bool measure_cpu(const struct plan *p, const struct check_args *a,
                        const struct place_node *node, struct cost_cpu_rates *out, double *seconds)
{
    const struct plan_parallel *par = &p->parallel;
    const struct topo *t = node->topo;
    if (a->n_topologies || a->k8s_nodes || a->device_tflops > 0) return false;
    if (t->n_gpus > 0 && par->device != PLAN_DEVICE_CPU) return false;
    /* on the threads a rank gets: the node's CPUs over its ranks (at least
     * one), no more than OMP_NUM_THREADS, as plait train binds them */
    int cpus = layout_node_cpus(t), threads = omp_get_max_threads();
    if (node->slots > 0 && cpus / node->slots < threads) threads = cpus / node->slots;
    struct cpu_rate_shape shape = cpu_rate_shape_of(
        p->batch.micro_batch, p->model.seq_len, p->model.hidden, p->model.heads, p->model.layers,
        p->model.padded_vocab, par->tp == PLAN_AUTO ? 1 : par->tp,
        par->pp == PLAN_AUTO ? 1 : par->pp, p->precision != PLAN_PRECISION_FP32);
    struct cpu_rate r;
    char why[256];
    if (cpu_rate_measure(&shape, threads > 0 ? threads : 1, &r, why, sizeof why)) {
        log_warn("%s: CPU ranks are modelled at an assumed rate", why);
        return false;
    }
    *out = (struct cost_cpu_rates){r.matmul_gflops, r.attention_gflops, r.activation_gbps,
                                   r.memory_gbps,   r.parallel_op_us,   omp_get_max_threads()};
    *seconds = r.seconds;
    return true;
}

/* The chosen layout's rank: its CPUs and the rates it gets from the measured ones. */
static struct cost_links rank_rates(const struct cost_cpu_rates *cpu, const struct layout_eval *e,
                                    const struct place_node *nodes, double *cpus)
{
    struct cost_links links = {0};
    *cpus = layout_cpus_per_rank(&e->map, nodes, cpu->threads);
    layout_cpu_rank_links(cpu, *cpus, false, &links);
    return links;
}

static void print_cpu(const struct cost_cpu_rates *cpu, double seconds, const struct layout_eval *e,
                      const struct place_node *nodes)
{
    double cpus;
    struct cost_links r = rank_rates(cpu, e, nodes, &cpus);
    printf("this machine's CPU kernels at the plan's shapes (measured in %.2f s), a rank's "
           "%.2f CPU%s:\n  products %.1f GFLOP/s, attention %.1f GFLOP/s, layer ops %.1f GB/s, "
           "parameter pass %.1f GB/s, %.1f µs to start an op\n\n",
           seconds, cpus, cpus == 1 ? "" : "s", 1e3 * r.device_tflops, 1e3 * r.attention_tflops,
           r.activation_gbps, r.device_memory_gbps, 1e6 * r.parallel_op_s);
}

static json_t *cpu_json(const struct cost_cpu_rates *cpu, double seconds,
                        const struct layout_eval *e, const struct place_node *nodes)
{
    double cpus;
    struct cost_links r = rank_rates(cpu, e, nodes, &cpus);
    return json_pack("{s:f,s:f,s:{s:f,s:f,s:f,s:f,s:f}}", "measured_s", seconds, "cpus_per_rank",
                     cpus, "rank", "matmul_gflops", 1e3 * r.device_tflops, "attention_gflops",
                     1e3 * r.attention_tflops, "activation_gbps", r.activation_gbps, "memory_gbps",
                     r.device_memory_gbps, "parallel_op_us", 1e6 * r.parallel_op_s);
}

/* ---- output ---------------------------------------------------------------------------------- */

/* Each "auto" candidate: a table row (unless --json) and a JSON record. */
struct candidates {
    json_t *list;
    FILE *out;
};

static void show_candidate(void *ctx, const struct layout_eval *e)
{
    struct candidates *c = ctx;
    const struct cost_layout *l = &e->layout;
    bool ok = e->placed && e->fits && e->tokens_per_s > 0;
    if (c->out && e->placed && e->mem.total == UINT64_MAX)
        fprintf(c->out, "  %4d %4d %4d  %10s  %10s  %12s  beyond 64-bit counts\n", l->tp, l->pp,
                l->dp, "-", "-", "-");
    else if (c->out && e->placed)
        fprintf(c->out, "  %4d %4d %4d  %10.2f  %10.3f  %12.0f  %s\n", l->tp, l->pp, l->dp,
                e->mem.total / 1e9, e->time.total_s, e->tokens_per_s, ok ? "" : "does not fit");
    else if (c->out)
        fprintf(c->out, "  %4d %4d %4d  %10s  %10s  %12s  cannot be placed\n", l->tp, l->pp, l->dp,
                "-", "-", "-");
    json_array_append_new(c->list,
                          json_pack("{s:i,s:i,s:i,s:b,s:b,s:I,s:f,s:f,s:s}", "tp", l->tp, "pp",
                                    l->pp, "dp", l->dp, "placed", e->placed, "fits", e->fits,
                                    "memory_bytes", (json_int_t)e->mem.total, "step_s",
                                    e->placed && isfinite(e->time.total_s) ? e->time.total_s : -1.0,
                                    "tokens_per_s", e->tokens_per_s, "why", e->why));
}

static json_t *rank_json(const struct rank_map *m, const struct place_node *nodes, int r)
{
    const struct place_rank *pr = &m->ranks[r];
    const struct topo *t = nodes[pr->node].topo;
    char cpus[4096];
    topo_cpu_list(t, pr->cores, pr->n_cores, cpus, sizeof cpus);
    json_t *o = json_pack("{s:i,s:i,s:i,s:i,s:i,s:i}", "rank", r, "node", pr->node, "local_rank",
                          pr->local_rank, "tp", pr->tp, "pp", pr->pp, "dp", pr->dp);
    if (m->cp > 1) json_object_set_new(o, "cp", json_integer(pr->cp));
    if (pr->gpu >= 0) {
        json_object_set_new(o, "gpu_busid", json_string(t->gpus[pr->gpu].busid));
        json_object_set_new(o, "gpu_index", json_integer(t->gpus[pr->gpu].cuda_index));
        json_object_set_new(o, "nvlink_domain", json_integer(t->gpus[pr->gpu].domain));
    } else {
        json_object_set_new(o, "gpu_busid", json_null());
        json_object_set_new(o, "gpu_index", json_null());
        json_object_set_new(o, "nvlink_domain", json_null());
    }
    json_object_set_new(o, "nic", pr->nic >= 0 ? json_string(t->nics[pr->nic].name) : json_null());
    json_object_set_new(o, "cpus", json_string(cpus));
    json_object_set_new(o, "numa", json_integer(pr->numa));
    json_t *env = json_object();
    char **vars = place_rank_env(m, nodes, r);
    for (char **v = vars; v && *v; v++) {
        char *eq = strchr(*v, '=');
        *eq = '\0';
        json_object_set_new(env, *v, json_string(eq + 1));
    }
    place_env_free(vars);
    json_object_set_new(o, "env", env);
    return o;
}

static json_t *comm_json(const struct place_comm *c, double bytes, double seconds)
{
    json_t *crossing = json_object();
    for (int k = 1; k < COST_LINKS; k++)
        if (c->crossing[k])
            json_object_set_new(crossing, cost_link_name(k), json_integer(c->crossing[k]));
    return json_pack("{s:s,s:f,s:i,s:o,s:f,s:f}", "link", cost_link_name(c->slowest), "gbps",
                     c->gbps, "groups", c->groups, "crossing", crossing, "bytes_per_step", bytes,
                     "seconds", seconds);
}

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
        printf("  parallel.zero %d would fit too (%.2f GB), with no more data-parallel traffic\n", z,
               layout_memory_at_zero(placed, l, z) / 1e9);
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

/* Where parallel.offload puts the optimizer's state, in words. */
static void print_offload(const struct plan *p, const struct layout_eval *e, double unit)
{
    const char *u = unit == 1e9 ? "GB" : "MB";
    if (p->parallel.offload == PLAN_OFFLOAD_NVME)
        printf("  the AdamW moments are on disk under %s (the most loaded rank: %.2f %s), two "
               "windows of up to %g MiB of each in memory (in \"optimizer\")\n",
               p->parallel.offload_dir, e->mem.disk / unit, u, p->parallel.offload_window_mb);
    else if (p->parallel.offload == PLAN_OFFLOAD_HOST)
        printf("  parallel.offload \"host\": on CPU ranks the optimizer state is in host memory "
               "already; nothing moves\n");
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
    printf("  %5s %9s %12s %8s %8s %10s %12s %8s\n", "stage", "layers", "parameters", "params",
           "grads", "optimizer", "activations", "total");
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
        printf("  %5d %9s %12lld %8.2f %8.2f %10.2f %12.2f %8.2f\n", s, layers,
               (long long)mem.param_count, mem.params / unit, mem.grads / unit,
               mem.optimizer / unit, mem.activations / unit, mem.total / unit);
    }
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
    print_offload(p, e, unit);
    print_moe(p);
    if (fp8)
        printf("  fp8 keeps an E4M3 copy of each layer's four weight matrices beside the fp32 "
               "weights (params: + 1 byte a weight, + 4 a scale, one per %s) and on the last "
               "stage a bf16 copy of wte for the LM head (+ 2 bytes a weight)\n",
               p->fp8_scaling == PLAN_FP8_BLOCK ? "128×128 block" : "matrix");
    if (gpu_mem)
        printf("  device memory %.2f GB: %s\n", gpu_mem / 1e9, e->fits ? "fits" : "DOES NOT FIT");
    else
        printf("  device memory unknown (give --gpu-memory GB to check the fit)\n");
    print_cp_fit(&placed, e, gpu_mem);
    print_zero_stages(&placed, e->layout, gpu_mem);
}

/* Whether the map splits dp into shard groups and their replicas. */
static bool hybrid(const struct rank_map *m)
{
    return m->dp_shard && m->dp_shard < m->dp;
}

/* A hybrid sharding group's bytes over its own slowest link (not hidden). */
static double raw_seconds(const struct place_comm *c, double bytes)
{
    return bytes > 0 && c->gbps > 0 ? bytes / (c->gbps * 1e9) : 0;
}

/* Traffic per rank per step by communicator, the modelled step and MFU. */
static void print_traffic(const struct plan *p, const struct layout_eval *e,
                          const struct place_node *nodes)
{
    const struct rank_map *m = &e->map;
    int width = hybrid(m) ? 8 : m->ep > 1 ? 7 : 4; /* "replicas", "experts" */
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
                 raw_seconds(&m->comm_shard, e->traffic.shard_bytes)},
                {"replicas", &m->comm_replicas, e->traffic.replicas_bytes,
                 raw_seconds(&m->comm_replicas, e->traffic.replicas_bytes)},
                /* context parallelism's ring */
                {"cp", &m->comm_cp, e->traffic.cp_bytes, e->time.cp_s},
                /* expert parallelism: the all-to-all, and the dp row's routed experts' part */
                {"ep", &m->comm_ep, e->traffic.ep_bytes, e->time.ep_s},
                {"experts", &m->comm_experts, e->traffic.experts_bytes,
                 raw_seconds(&m->comm_experts, e->traffic.experts_bytes)}};
    for (size_t k = 0; k < sizeof rows / sizeof *rows; k++) {
        if ((k == 3 || k == 4) && !hybrid(m)) continue;
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
    const struct gpu_spec *gpu = plan_gpu(e, nodes);
    if (gpu) {
        struct gpt2_config cfg = gpt2_config_of_plan(&p->model);
        printf("  modelled MFU: %.1f%% of %d × %s's dense %s peak, %.0f TFLOP/s each "
               "(%.1f MFLOP per token: 6·N + 12·L·C·T)\n",
               100 * modelled_mfu(p, e, nodes), m->world, gpu->name,
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

static void print_tables(const struct plan *p, const struct layout_eval *e,
                         const struct place_node *nodes, int n_nodes, uint64_t gpu_mem)
{
    print_nodes(e, nodes, n_nodes);
    print_memory(p, e, gpu_mem);
    print_traffic(p, e, nodes);
    print_rank_map(e, nodes);
}

/* A number, or null when 0 (unknown). */
static json_t *real_or_null(double x)
{
    return x > 0 ? json_real(x) : json_null();
}

/* What each GPU of a node is (by CUDA index): model, PCI id, memory, peaks. */
static json_t *gpu_models_json(const struct topo *t)
{
    json_t *list = json_array();
    for (int g = 0; g < t->n_gpus; g++) {
        const struct topo_gpu *gpu = &t->gpus[g];
        const struct gpu_spec *spec = gpu->spec;
        char pci_id[16];
        snprintf(pci_id, sizeof pci_id, "10de:%04x", gpu->pci_device);
        json_t *o =
            json_pack("{s:i,s:s,s:o,s:s,s:o,s:s}", "gpu_index", gpu->cuda_index, "pci_id", pci_id,
                      "model", *gpu->model ? json_string(gpu->model) : json_null(), "model_source",
                      gpu->model_source, "memory_bytes",
                      gpu->memory_bytes ? json_integer((json_int_t)gpu->memory_bytes) : json_null(),
                      "memory_source", gpu->memory_source);
        json_object_set_new(o, "dense_peak_tflops",
                            spec ? json_pack("{s:f,s:o,s:f}", "bf16", spec->bf16_tflops, "fp8",
                                             real_or_null(spec->fp8_tflops), "tf32",
                                             spec->tf32_tflops)
                                 : json_null());
        json_object_set_new(o, "memory_gbps", real_or_null(spec ? spec->memory_gbps : 0));
        json_array_append_new(list, o);
    }
    return list;
}

/* A node: its GPUs' NVLink domains (by CUDA index) and GPU-to-GPU bandwidth. */
static json_t *node_json(const struct place_node *n)
{
    const struct topo *t = n->topo;
    json_t *domains = json_array(), *gbps = json_array(), *nics = json_array();
    for (int d = 0; d < t->n_domains; d++) {
        json_t *members = json_array();
        for (int k = 0; k < t->domains[d].n_gpus; k++)
            json_array_append_new(members, json_integer(t->gpus[t->domains[d].gpus[k]].cuda_index));
        json_array_append_new(domains, members);
    }
    for (int a = 0; a < t->n_gpus; a++) {
        json_t *row = json_array();
        for (int b = 0; b < t->n_gpus; b++)
            json_array_append_new(row, json_real(t->nvlink_gbps[a * t->n_gpus + b]));
        json_array_append_new(gbps, row);
    }
    static const char *const kinds[] = {"infiniband", "roce", "ethernet"};
    for (int k = 0; k < t->n_nics; k++)
        json_array_append_new(nics, json_pack("{s:s,s:s,s:s}", "name", t->nics[k].name, "kind",
                                              kinds[t->nics[k].kind], "busid", t->nics[k].busid));
    json_t *o = json_pack("{s:s,s:s,s:i,s:i,s:o,s:o,s:o}", "name", n->name, "topology", t->source,
                          "slots", n->slots, "gpus", t->n_gpus, "nvlink_domains", domains,
                          "nvlink_gbps", gbps, "nics", nics);
    if (t->n_gpus > 0) json_object_set_new(o, "gpu_models", gpu_models_json(t));
    return o;
}

/* The step's pipeline schedule, as the runtime runs it (pp > 1), simulated
 * with a backward twice a forward: its bubble beside the textbook's. */
static int make_schedule(const struct plan *p, const struct cost_layout *l, struct schedule *s,
                         struct sched_sim *sim)
{
    struct plait_error err;
    if (l->pp < 2) return -1;
    if (schedule_make_for_plan(s, p, l->pp, &err)) return -1;
    if (schedule_simulate_textbook(s, sim, &err)) {
        schedule_free(s);
        return -1;
    }
    return 0;
}

static json_t *schedule_json(const struct plan *p, const struct cost_layout *l)
{
    struct schedule s;
    struct sched_sim sim;
    if (make_schedule(p, l, &s, &sim)) return NULL;
    json_t *j = json_pack("{s:s,s:i,s:i,s:i,s:f}", "kind", schedule_kind_name(s.kind), "stages",
                          s.pp, "micro_batches", s.m, "virtual_stages", s.v, "bubble", sim.bubble);
    double bubble[SCHED_KINDS];
    schedule_bubbles(s.pp, s.m, p->parallel.virtual_stages, bubble);
    json_t *each = json_object();
    for (int k = 0; k < SCHED_KINDS; k++)
        json_object_set_new(each, schedule_kind_name((enum sched_kind)k),
                            bubble[k] >= 0 ? json_real(bubble[k]) : json_null());
    json_object_set_new(j, "bubble_by_schedule", each);
    schedule_free(&s);
    return j;
}

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

static void print_schedule(const struct plan *p, const struct cost_layout *l)
{
    struct schedule s;
    struct sched_sim sim;
    if (make_schedule(p, l, &s, &sim)) return;
    printf("\npipeline: %s over %d stages, %d micro-batch%s per step%s: bubble %.1f%% "
           "(simulated, backward = 2 × forward)\n",
           schedule_kind_name(s.kind), s.pp, s.m, s.m == 1 ? "" : "es",
           s.kind == SCHED_INTERLEAVED ? ", interleaved" : s.v > 1 ? ", two chunks a stage in a V" : "", 100 * sim.bubble);
    print_other_schedules(&s, p->parallel.virtual_stages);
    schedule_print(&s, stdout, 100);
    schedule_free(&s);
}

static json_t *result_json(const struct plan *p, const struct layout_eval *e,
                           const struct place_node *nodes, int n_nodes, uint64_t gpu_mem)
{
    const struct rank_map *m = &e->map;
    const struct plan placed = layout_plan_as_placed(p, m); /* what the ranks hold */
    json_t *ranks = json_array(), *node_list = json_array(), *stages = json_array();
    for (int r = 0; r < m->world; r++) { /* what its stage's model_init will allocate */
        json_t *rank = rank_json(m, nodes, r);
        struct cost_memory mem;
        cost_memory_stage(&placed, e->layout, m->ranks[r].pp, &mem);
        json_object_set_new(rank, "memory_bytes", json_integer((json_int_t)mem.total));
        json_array_append_new(ranks, rank);
    }
    for (int i = 0; i < n_nodes; i++) json_array_append_new(node_list, node_json(&nodes[i]));
    for (int s = 0; s < m->pp; s++) {
        struct cost_memory mem;
        cost_memory_stage(&placed, e->layout, s, &mem);
        struct gpt2_part part = cost_stage_part(p, 1, 0, m->pp, s);
        int n_layers = (part.layer_end - part.layer_begin) * (part.chunks > 1 ? part.chunks : 1);
        json_array_append_new(
            stages,
            json_pack("{s:i,s:i,s:I,s:I,s:I,s:I,s:I,s:I}", "stage", s, "layers", n_layers,
                      "parameters", (json_int_t)mem.param_count, "params", (json_int_t)mem.params,
                      "grads", (json_int_t)mem.grads, "optimizer", (json_int_t)mem.optimizer,
                      "activations", (json_int_t)mem.activations, "total", (json_int_t)mem.total));
    }
    json_t *o =
        json_pack("{s:i,s:i,s:i,s:i,s:o,s:o,s:{s:I,s:I,s:I,s:I,s:I},s:o,s:{s:f,s:f,s:f}}",
                  "world_size", m->world, "tp", m->tp, "pp", m->pp, "dp", m->dp, "nodes", node_list,
                  "ranks", ranks, "memory_bytes_per_rank", "params", (json_int_t)e->mem.params,
                  "grads", (json_int_t)e->mem.grads, "optimizer", (json_int_t)e->mem.optimizer,
                  "activations", (json_int_t)e->mem.activations, "total", (json_int_t)e->mem.total,
                  "memory_by_stage", stages, "comm_bytes_per_step", "tp", e->traffic.tp_bytes, "pp",
                  e->traffic.pp_bytes, "dp", e->traffic.dp_bytes);
    json_object_set_new(o, "device_memory_bytes",
                        gpu_mem ? json_integer((json_int_t)gpu_mem) : json_null());
    json_object_set_new(o, "fits", json_boolean(e->fits));
    json_t *by_zero = json_array();
    for (int z = 0; z <= LAYOUT_ZERO_MAX && m->dp * m->cp > 1; z++)
        json_array_append_new(by_zero,
                              json_integer((json_int_t)layout_memory_at_zero(&placed, e->layout, z)));
    json_object_set_new(o, "memory_bytes_by_zero", by_zero);
    int fit_zero = layout_zero_to_fit(&placed, e->layout, gpu_mem);
    json_object_set_new(o, "zero_to_fit", fit_zero >= 0 ? json_integer(fit_zero) : json_null());
    json_object_set_new(o, "allow_tp_over_pcie", json_boolean(p->parallel.allow_tp_over_pcie));
    json_object_set_new(o, "links",
                        json_pack("{s:o,s:o,s:o}", "tp",
                                  comm_json(&m->comm_tp, e->traffic.tp_bytes, e->time.tp_s), "pp",
                                  comm_json(&m->comm_pp, e->traffic.pp_bytes, e->time.pp_s), "dp",
                                  comm_json(&m->comm_dp, e->traffic.dp_bytes, e->time.dp_s)));
    if (m->cp > 1) { /* context parallelism: its degree, its ring's link, bytes and time */
        json_object_set_new(o, "cp", json_integer(m->cp));
        json_object_set_new(json_object_get(o, "links"), "cp",
                            comm_json(&m->comm_cp, e->traffic.cp_bytes, e->time.cp_s));
        json_object_set_new(json_object_get(o, "comm_bytes_per_step"), "cp",
                            json_real(e->traffic.cp_bytes));
    }
    if (hybrid(m)) { /* its two groups: where they were placed, and their traffic */
        json_object_set_new(o, "dp_shard", json_integer(m->dp_shard));
        json_object_set_new(o, "dp_replicate", json_integer(m->dp / m->dp_shard));
        json_t *links = json_object_get(o, "links"), *bytes = json_object_get(o, "comm_bytes_per_step");
        json_object_set_new(links, "shard",
                            comm_json(&m->comm_shard, e->traffic.shard_bytes,
                                      raw_seconds(&m->comm_shard, e->traffic.shard_bytes)));
        json_object_set_new(links, "replicas",
                            comm_json(&m->comm_replicas, e->traffic.replicas_bytes,
                                      raw_seconds(&m->comm_replicas, e->traffic.replicas_bytes)));
        json_object_set_new(bytes, "shard", json_real(e->traffic.shard_bytes));
        json_object_set_new(bytes, "replicas", json_real(e->traffic.replicas_bytes));
    }
    json_object_set_new(o, "step_time_s",
                        json_pack("{s:f,s:f,s:f,s:f,s:f,s:f}", "compute", e->time.compute_s, "tp",
                                  e->time.tp_s, "pp", e->time.pp_s, "bubble", e->time.bubble_s,
                                  "dp", e->time.dp_s, "total", e->time.total_s));
    if (m->cp > 1)
        json_object_set_new(json_object_get(o, "step_time_s"), "cp", json_real(e->time.cp_s));
    if (m->ep > 1) { /* expert parallelism: its two groups, the all-to-all's time */
        json_t *links = json_object_get(o, "links"),
               *bytes = json_object_get(o, "comm_bytes_per_step");
        json_object_set_new(o, "ep", json_integer(m->ep));
        json_t *ep = comm_json(&m->comm_ep, e->traffic.ep_bytes, e->time.ep_s);
        json_object_set_new(ep, "peers_over_slowest", json_integer(m->comm_ep.peers_behind));
        json_object_set_new(links, "ep", ep);
        json_object_set_new(links, "experts",
                            comm_json(&m->comm_experts, e->traffic.experts_bytes,
                                      raw_seconds(&m->comm_experts, e->traffic.experts_bytes)));
        json_object_set_new(bytes, "ep", json_real(e->traffic.ep_bytes));
        json_object_set_new(bytes, "experts", json_real(e->traffic.experts_bytes));
        json_object_set_new(json_object_get(o, "step_time_s"), "ep", json_real(e->time.ep_s));
    }
    if (m->world > 0 && m->ranks[0].gpu >= 0) { /* a GPU plan */
        struct gpt2_config cfg = gpt2_config_of_plan(&p->model);
        json_object_set_new(json_object_get(o, "step_time_s"), "optimizer",
                            json_real(e->time.optimizer_s));
        json_object_set_new(o, "flops_per_token",
                            json_real(gpu_flops_per_token(&cfg, p->model.seq_len)));
        json_object_set_new(o, "modelled_mfu", real_or_null(modelled_mfu(p, e, nodes)));
    }
    return o;
}

/* ---- the command --------------------------------------------------------------------------------
 */

/* What the command found, for its output. */
struct check_result {
    const struct plan *p;
    const struct place_node *nodes;
    int n_nodes;
    uint64_t gpu_mem;
    const struct cost_cpu_rates *cpu; /* this machine's CPU, measured; NULL: not */
    double cpu_s;                     /* how long measuring it took */
    json_t *candidates;               /* "auto": each candidate's record; else NULL */
};

static void print_json(const struct check_result *r, const struct layout_eval *best)
{
    json_t *o = result_json(r->p, best, r->nodes, r->n_nodes, r->gpu_mem);
    json_t *sched = schedule_json(r->p, &best->layout);
    if (sched) json_object_set_new(o, "schedule", sched);
    if (r->candidates) json_object_set(o, "auto_candidates", r->candidates);
    if (r->cpu) { /* a measured CPU's terms: its rates, memory-bound ops, optimizer */
        json_object_set_new(o, "cpu_rates", cpu_json(r->cpu, r->cpu_s, best, r->nodes));
        json_t *step = json_object_get(o, "step_time_s");
        json_object_set_new(step, "memory", json_real(best->time.memory_s));
        json_object_set_new(step, "parallel", json_real(best->time.parallel_s));
        json_object_set_new(step, "optimizer", json_real(best->time.optimizer_s));
    }
    char *text = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(12));
    printf("%s\n", text);
    free(text);
    json_decref(o);
}

/* The layout of the plan on the nodes ("auto" candidates printed as they are
 * evaluated, unless --json), then the result: 0, or -1 when no layout can be
 * placed (said) or the chosen one does not fit (said, after the tables). */
static int choose_and_show(struct check_result *r, const struct check_args *a,
                           struct layout_eval *best)
{
    const struct plan_parallel *par = &r->p->parallel;
    bool is_auto = par->tp == PLAN_AUTO || par->pp == PLAN_AUTO;
    struct layout_inputs in = {.device_memory_bytes = r->gpu_mem,
                               .device_tflops = a->device_tflops,
                               .cpu = r->cpu,
                               .bw = a->bw};
    struct candidates seen = {.list = r->candidates, .out = a->json || !is_auto ? NULL : stdout};
    if (!a->json) printf("plan: %s is valid\n", r->p->source);
    if (seen.out)
        fprintf(seen.out, "candidate layouts (\"auto\"):\n  %4s %4s %4s  %10s  %10s  %12s  %s\n",
                "tp", "pp", "dp", "GB/rank", "step s", "tokens/s", "");
    struct plait_error err;
    if (layout_choose(r->p, r->nodes, r->n_nodes, &in, is_auto ? show_candidate : NULL, &seen, best,
                      &err)) {
        log_error("%s%s", err.text, is_auto ? " (see the candidates above)" : "");
        return -1;
    }
    char shared[256];
    place_shared_cores_text(&best->map, r->nodes, shared, sizeof shared);
    if (*shared) log_warn("%s", shared);
    if (is_auto && !a->json)
        printf("chose tp %d, pp %d, dp %d: of the layouts that can be placed and fit in "
               "memory, the most modelled tokens per second\n\n",
               best->layout.tp, best->layout.pp, best->layout.dp);
    if (best->mem.total == UINT64_MAX) { /* no figure to print: only why */
        log_error("%s", best->why);
        return -1;
    }
    if (!is_auto) r->candidates = NULL;
    if (a->json) {
        print_json(r, best);
    } else {
        if (r->cpu) print_cpu(r->cpu, r->cpu_s, best, r->nodes);
        print_tables(r->p, best, r->nodes, r->n_nodes, r->gpu_mem);
        print_schedule(r->p, &best->layout);
    }
    if (!best->fits) log_error("%s", best->why);
    return best->fits ? 0 : -1;
}

int cmd_check(int argc, char **argv)
{
    struct check_args a = {0};
    int parsed = parse_args(argc, argv, &a);
    if (parsed != CLI_CONTINUE) {
        free(a.sets);
        return parsed;
    }
    struct plait_error err;
    int rc = PLAIT_EXIT_ERROR, n_topo = a.n_topologies ? a.n_topologies : 1;
    struct topo topos[MAX_TOPOLOGIES] = {0};
    struct fit_nodes fit = {0};
    struct plan *p = plan_load(a.plan_path, a.sets, a.n_sets, &err);
    struct layout_eval best = {0};
    json_t *candidates = json_array();
    if (!p) {
        log_error("%s", err.text);
        goto out;
    }
    if (a.k8s_nodes) {
        struct layout_inputs in = {.device_memory_bytes = (uint64_t)(a.gpu_memory_gb * 1e9),
                                   .device_tflops = a.device_tflops,
                                   .bw = a.bw};
        rc = k8s_nodes_check(p, a.k8s_nodes, a.nodes, a.gpus_per_node, &in, a.json);
        goto out;
    }
    for (int i = 0; i < n_topo; i++)
        if (topo_load(&topos[i], a.n_topologies ? a.topologies[i] : NULL, &err)) {
            log_error("%s", err.text);
            goto out;
        }
    /* this machine alone is named as plait train names it (its host name), so that
     * a refusal of a node reads the same from both */
    char host[64] = "localhost";
    const char *here[] = {host};
    bool this_machine = !a.n_topologies && a.nodes == 1;
    if (this_machine) gethostname(host, sizeof host - 1);
    if (fit_nodes_make(p, a.nodes, a.gpus_per_node, topos, n_topo, this_machine ? here : NULL,
                       &fit, &err)) {
        log_error("check: %s", err.text);
        goto out;
    }
    struct cost_cpu_rates cpu;
    struct check_result r = {.p = p, .nodes = fit.v, .n_nodes = a.nodes, .candidates = candidates};
    r.gpu_mem = layout_device_memory(fit.v, a.nodes, a.gpu_memory_gb);
    if (measure_cpu(p, &a, &fit.v[0], &cpu, &r.cpu_s)) r.cpu = &cpu;
    rc = choose_and_show(&r, &a, &best) ? PLAIT_EXIT_ERROR : PLAIT_EXIT_OK;
out:
    layout_eval_free(&best);
    json_decref(candidates);
    for (int i = 0; i < n_topo; i++) topo_free(&topos[i]);
    fit_nodes_free(&fit);
    free(a.sets);
    plan_free(p);
    return rc;
}
