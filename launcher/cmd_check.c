/* cmd_check.c — `plait check PLAN [--nodes N] [--gpus-per-node G] [--k8s-nodes FILE]
 * [--topology FILE.xml ...] [--json]`: validates the plan, resolves "auto"
 * degrees with the cost model, places the ranks on the nodes' topologies and
 * prints the nodes' GPUs (model, memory, dense peaks), the memory table, the
 * traffic table with the modelled step and MFU, and the rank map (or one JSON
 * object). Exits 1 with the reason when the plan cannot run there. The tables
 * are check_text.c's, the JSON object check_json.c's (launcher/check.h). */
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
#include "launcher/check.h"
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

/* ---- the command --------------------------------------------------------------------------------
 */

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
        check_print_json(r, best);
    } else {
        if (r->cpu) check_print_cpu(r->cpu, r->cpu_s, best, r->nodes);
        check_print_tables(r->p, best, r->nodes, r->n_nodes, r->gpu_mem);
        check_print_schedule(r->p, &best->layout);
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
    /* GPUs shared by several ranks, as plait train shares them here (PLAIT_RANKS_PER_GPU) */
    int share = 1;
    if (this_machine) gethostname(host, sizeof host - 1);
    if ((this_machine && env_ranks_per_gpu(&share, &err)) ||
        fit_nodes_make(p, a.nodes, a.gpus_per_node, share, topos, n_topo,
                       this_machine ? here : NULL, &fit, &err)) {
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
