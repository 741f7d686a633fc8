/* check_figures.c — the figures plait check prints in its tables and its JSON alike that the
 * evaluated layout does not hold: the plan's GPU and its modelled MFU, a CPU rank's rates,
 * hybrid sharding's groups and the simulated pipeline schedule. Printing them is
 * check_text.c's and check_json.c's. */
#include "launcher/check.h"

/* The plan's GPUs: those of its ranks' nodes (NULL for CPU ranks, or when
 * plait does not know the first rank's GPU). */
const struct gpu_spec *check_plan_gpu(const struct layout_eval *e, const struct place_node *nodes)
{
    const struct place_rank *r0 = &e->map.ranks[0];
    if (e->map.world < 1 || r0->gpu < 0) return NULL;
    const struct topo *t = nodes[r0->node].topo;
    return t->gpus[r0->gpu].spec;
}

int check_plan_gpus(const struct layout_eval *e)
{
    int share = e->map.gpu_sharing > 1 ? e->map.gpu_sharing : 1; /* PLAIT_RANKS_PER_GPU */
    return (e->map.world + share - 1) / share;
}

/* The modelled MFU of a GPU plan (a fraction), 0 when the GPU's peak is unknown. */
double check_modelled_mfu(const struct plan *p, const struct layout_eval *e,
                          const struct place_node *nodes)
{
    struct gpt2_config cfg = gpt2_config_of_plan(&p->model);
    double peak = gpu_peak_tflops(check_plan_gpu(e, nodes), p->precision);
    return gpu_mfu(gpu_flops_per_token(&cfg, p->model.seq_len), e->tokens_per_s, peak,
                   check_plan_gpus(e));
}

/* The chosen layout's rank: its CPUs and the rates it gets from the measured ones. */
struct cost_links check_rank_rates(const struct cost_cpu_rates *cpu, const struct layout_eval *e,
                                   const struct place_node *nodes, double *cpus)
{
    struct cost_links links = {0};
    *cpus = layout_cpus_per_rank(&e->map, nodes, cpu->threads);
    layout_cpu_rank_links(cpu, *cpus, false, &links);
    return links;
}

/* Whether the map splits dp into shard groups and their replicas. */
bool check_hybrid(const struct rank_map *m)
{
    return m->dp_shard && m->dp_shard < m->dp;
}

/* A hybrid sharding group's bytes over its own slowest link (not hidden). */
double check_raw_seconds(const struct place_comm *c, double bytes)
{
    return bytes > 0 && c->gbps > 0 ? bytes / (c->gbps * 1e9) : 0;
}

/* The step's pipeline schedule, as the runtime runs it (pp > 1), simulated
 * with a backward twice a forward: its bubble beside the textbook's. */
int check_make_schedule(const struct plan *p, const struct cost_layout *l, struct schedule *s,
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
