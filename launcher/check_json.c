/* check_json.c — plait check --json's document: the layout, its nodes and their GPUs, every
 * rank (its place, env and memory), the memory by stage and by ZeRO stage (with offload's
 * disk and host bytes), each communicator's link, bytes and seconds, the modelled step, the
 * pipeline schedule and this machine's measured CPU. The tables are check_text.c's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/place/topo.h"
#include "launcher/check.h"

static json_t *cpu_json(const struct cost_cpu_rates *cpu, double seconds,
                        const struct layout_eval *e, const struct place_node *nodes)
{
    double cpus;
    struct cost_links r = check_rank_rates(cpu, e, nodes, &cpus);
    return json_pack("{s:f,s:f,s:{s:f,s:f,s:f,s:f,s:f}}", "measured_s", seconds, "cpus_per_rank",
                     cpus, "rank", "matmul_gflops", 1e3 * r.device_tflops, "attention_gflops",
                     1e3 * r.attention_tflops, "activation_gbps", r.activation_gbps, "memory_gbps",
                     r.device_memory_gbps, "parallel_op_us", 1e6 * r.parallel_op_s);
}

/* parallel.offload's bytes beside a memory object's device ones, where there are any:
 * "disk" (nvme's moments in files), "host" (a GPU rank's offloaded step in host memory);
 * neither is in "total". */
static void add_offload_bytes(json_t *o, const struct cost_memory *mem)
{
    if (mem->disk) json_object_set_new(o, "disk", json_integer((json_int_t)mem->disk));
    if (mem->host) json_object_set_new(o, "host", json_integer((json_int_t)mem->host));
    /* a GPU rank's beside its model's buffers, in the total */
    if (mem->scratch) json_object_set_new(o, "scratch", json_integer((json_int_t)mem->scratch));
    if (mem->cuda_context)
        json_object_set_new(o, "cuda_context", json_integer((json_int_t)mem->cuda_context));
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

static json_t *schedule_json(const struct plan *p, const struct cost_layout *l)
{
    struct schedule s;
    struct sched_sim sim;
    if (check_make_schedule(p, l, &s, &sim)) return NULL;
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
        add_offload_bytes(json_array_get(stages, (size_t)s), &mem);
    }
    json_t *o =
        json_pack("{s:i,s:i,s:i,s:i,s:o,s:o,s:{s:I,s:I,s:I,s:I,s:I},s:o,s:{s:f,s:f,s:f}}",
                  "world_size", m->world, "tp", m->tp, "pp", m->pp, "dp", m->dp, "nodes", node_list,
                  "ranks", ranks, "memory_bytes_per_rank", "params", (json_int_t)e->mem.params,
                  "grads", (json_int_t)e->mem.grads, "optimizer", (json_int_t)e->mem.optimizer,
                  "activations", (json_int_t)e->mem.activations, "total", (json_int_t)e->mem.total,
                  "memory_by_stage", stages, "comm_bytes_per_step", "tp", e->traffic.tp_bytes, "pp",
                  e->traffic.pp_bytes, "dp", e->traffic.dp_bytes);
    add_offload_bytes(json_object_get(o, "memory_bytes_per_rank"), &e->mem);
    json_object_set_new(o, "device_memory_bytes",
                        gpu_mem ? json_integer((json_int_t)gpu_mem) : json_null());
    json_object_set_new(o, "fits", json_boolean(e->fits));
    json_t *by_zero = json_array();
    for (int z = 0; z <= LAYOUT_ZERO_MAX && m->dp * m->cp > 1; z++)
        json_array_append_new(
            by_zero, json_integer((json_int_t)layout_memory_at_zero(&placed, e->layout, z)));
    json_object_set_new(o, "memory_bytes_by_zero", by_zero);
    if (m->gpu_sharing > 1) /* PLAIT_RANKS_PER_GPU: the fit is of a rank's share */
        json_object_set_new(o, "ranks_per_gpu", json_integer(m->gpu_sharing));
    int fit_zero = layout_zero_to_fit(&placed, e->layout, layout_rank_device_memory(m, gpu_mem));
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
    if (check_hybrid(m)) { /* its two groups: where they were placed, and their traffic */
        json_object_set_new(o, "dp_shard", json_integer(m->dp_shard));
        json_object_set_new(o, "dp_replicate", json_integer(m->dp / m->dp_shard));
        json_t *links = json_object_get(o, "links"),
               *bytes = json_object_get(o, "comm_bytes_per_step");
        json_object_set_new(links, "shard",
                            comm_json(&m->comm_shard, e->traffic.shard_bytes,
                                      check_raw_seconds(&m->comm_shard, e->traffic.shard_bytes)));
        json_object_set_new(
            links, "replicas",
            comm_json(&m->comm_replicas, e->traffic.replicas_bytes,
                      check_raw_seconds(&m->comm_replicas, e->traffic.replicas_bytes)));
        json_object_set_new(bytes, "shard", json_real(e->traffic.shard_bytes));
        json_object_set_new(bytes, "replicas", json_real(e->traffic.replicas_bytes));
    }
    json_object_set_new(o, "step_time_s",
                        json_pack("{s:f,s:f,s:f,s:f,s:f,s:f}", "compute", e->time.compute_s, "tp",
                                  e->time.tp_s, "pp", e->time.pp_s, "bubble", e->time.bubble_s,
                                  "dp", e->time.dp_s, "total", e->time.total_s));
    if (m->cp > 1)
        json_object_set_new(json_object_get(o, "step_time_s"), "cp", json_real(e->time.cp_s));
    if (e->time.host_step_s > 0) /* part of "optimizer": a GPU rank's step on the CPU */
        json_object_set_new(json_object_get(o, "step_time_s"), "host_step",
                            json_real(e->time.host_step_s));
    if (m->ep > 1) { /* expert parallelism: its two groups, the all-to-all's time */
        json_t *links = json_object_get(o, "links"),
               *bytes = json_object_get(o, "comm_bytes_per_step");
        json_object_set_new(o, "ep", json_integer(m->ep));
        json_t *ep = comm_json(&m->comm_ep, e->traffic.ep_bytes, e->time.ep_s);
        json_object_set_new(ep, "peers_over_slowest", json_integer(m->comm_ep.peers_behind));
        json_object_set_new(links, "ep", ep);
        json_object_set_new(
            links, "experts",
            comm_json(&m->comm_experts, e->traffic.experts_bytes,
                      check_raw_seconds(&m->comm_experts, e->traffic.experts_bytes)));
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
        json_object_set_new(o, "modelled_mfu", real_or_null(check_modelled_mfu(p, e, nodes)));
    }
    return o;
}

void check_print_json(const struct check_result *r, const struct layout_eval *best)
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
