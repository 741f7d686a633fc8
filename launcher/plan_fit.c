/* plan_fit.c — the nodes a plan is checked on (plan_fit.h): their slots as
 * plait check counts them, and a node described by its GPUs alone for when
 * no hwloc XML of it is at hand (Kubernetes). Choosing the layout is
 * common/place/layout.c's; printing it is the commands'. */
#include "launcher/plan_fit.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/place/env.h" // defines: env_ranks_per_gpu
#include "common/place/gpu.h" // defines: gpu_spec_by_name

int fit_nodes_make(const struct plan *p, int n, int gpus_per_node, int ranks_per_gpu,
                   const struct topo *topos, int n_topos, const char *const *names,
                   struct fit_nodes *out, struct plait_error *err)
{
    memset(out, 0, sizeof *out);
    if (n < 1 || n_topos < 1) return error_set(err, "no nodes to check the plan on");
    out->v = calloc((size_t)n, sizeof *out->v);
    out->names = calloc((size_t)n, sizeof *out->names);
    if (!out->v || !out->names) {
        fit_nodes_free(out);
        return error_set(err, "out of memory");
    }
    out->n = n;
    int slots = 0; /* at most PLAN_MAX_RANKS, checked as it is summed */
    for (int i = 0; i < n; i++) {
        const struct topo *t = &topos[n_topos > 1 ? i : 0];
        snprintf(out->names[i], sizeof out->names[i], "node%d", i);
        /* CPU ranks: as many as the layout has, spread over the nodes (plait train
         * runs them all on this machine) */
        bool cpu = p->parallel.device == PLAN_DEVICE_CPU ||
                   (t->n_gpus == 0 && p->parallel.device != PLAN_DEVICE_CUDA);
        int64_t world = plan_ranks(p); /* tp·cp·pp·dp; 0 with an "auto" degree */
        bool fixed = world > 0;
        int share = ranks_per_gpu > 1 ? ranks_per_gpu : 1; /* (each GPU that many slots) */
        int s = gpus_per_node       ? gpus_per_node
                : cpu && fixed      ? (int)((world + n - 1) / n)
                : t->n_gpus && !cpu ? t->n_gpus * share
                                    : 1;
        out->v[i] = (struct place_node){.name = names ? names[i] : out->names[i],
                                        .topo = t,
                                        .slots = s,
                                        .cpu_ranks = p->parallel.device == PLAN_DEVICE_CPU,
                                        .ranks_per_gpu = share};
        if (s > PLAN_MAX_RANKS - slots) {
            fit_nodes_free(out);
            return error_set(err, "%d nodes × %d slots is more ranks than plait runs (%d)", n, s,
                             PLAN_MAX_RANKS);
        }
        slots += s;
    }
    return 0;
}

int fit_node_here(const struct plan *p, int slots, const struct topo *t, const char *host,
                  struct place_node *out, struct plait_error *err)
{
    int share = 1;
    if (env_ranks_per_gpu(&share, err)) return -1;
    *out = (struct place_node){.name = host,
                               .topo = t,
                               .slots = slots,
                               .cpu_ranks = p->parallel.device == PLAN_DEVICE_CPU ||
                                            (p->parallel.device == PLAN_DEVICE_AUTO &&
                                             t->n_gpus == 0),
                               .ranks_per_gpu = share};
    return 0;
}

void fit_nodes_free(struct fit_nodes *f)
{
    free(f->v);
    free(f->names);
    memset(f, 0, sizeof *f);
}

/* ---- a node described by its GPUs ---------------------------------------------------- */

uint64_t fit_product_memory(const char *product)
{
    /* the digits right before "GB" ("...-80GB-HBM3", "...-SXM4-40GB") */
    for (const char *g = product ? strstr(product, "GB") : NULL; g; g = strstr(g + 1, "GB")) {
        const char *d = g;
        while (d > product && isdigit((unsigned char)d[-1])) d--;
        if (d < g) return (uint64_t)strtoull(d, NULL, 10) << 30; /* HBM comes in GiB */
    }
    return 0;
}

int fit_topo_synthetic(struct topo *t, const struct fit_node_spec *s, struct plait_error *err)
{
    memset(t, 0, sizeof *t);
    int g = s->n_gpus, per = s->cores_per_gpu > 0 ? s->cores_per_gpu : 4;
    if (g < 0 || g > 1024) return error_set(err, "%s: %d GPUs per node", s->source, g);
    int cores = g ? g * per : per, nics = g && s->rdma ? g : 1;
    t->source = strdup(s->source);
    t->cores = calloc((size_t)cores, sizeof *t->cores);
    t->gpus = calloc((size_t)(g ? g : 1), sizeof *t->gpus);
    t->nvlink_gbps = calloc((size_t)(g ? g * g : 1), sizeof *t->nvlink_gbps);
    t->domains = calloc((size_t)(g ? g : 1), sizeof *t->domains);
    t->nics = calloc((size_t)nics, sizeof *t->nics);
    t->gpu_nic = calloc((size_t)(g ? g * nics : 1), sizeof *t->gpu_nic);
    if (!t->source || !t->cores || !t->gpus || !t->nvlink_gbps || !t->domains || !t->nics ||
        !t->gpu_nic)
        goto oom;
    t->n_numa = 1;
    for (int c = 0; c < cores; c++) {
        t->cores[c] = (struct topo_core){.os_index = c, .n_pus = 1, .numa = 0, .package = 0};
        t->n_cores = c + 1;
        if (!(t->cores[c].pus = malloc(sizeof(int)))) goto oom;
        t->cores[c].pus[0] = c;
    }
    for (int i = 0; i < g; i++) {
        struct topo_gpu *gpu = &t->gpus[i];
        t->n_gpus = i + 1;
        snprintf(gpu->busid, sizeof gpu->busid, "0000:%02x:00.0", 0x10 + i);
        gpu->cuda_index = i;
        gpu->numa = 0;
        gpu->memory_bytes = s->memory_bytes;
        snprintf(gpu->model, sizeof gpu->model, "%s", s->product ? s->product : "");
        gpu->model_source = *gpu->model ? "nvidia.com/gpu.product" : "";
        gpu->memory_source = gpu->memory_bytes ? "node labels" : "";
        gpu->spec = gpu_spec_by_name(gpu->model); /* "NVIDIA-H100-80GB-HBM3" */
        gpu->domain = s->nvlink ? 0 : i;
        if (!(gpu->local_cores = malloc((size_t)per * sizeof(int)))) goto oom;
        gpu->n_local_cores = per;
        for (int k = 0; k < per; k++) gpu->local_cores[k] = i * per + k;
        for (int j = 0; j < g; j++)
            t->nvlink_gbps[i * g + j] = s->nvlink && i != j ? 450 : 0; /* NVLink 4, one way */
        for (int k = 0; k < nics; k++)
            t->gpu_nic[i * nics + k] = k == i ? TOPO_SAME_PCIE_SWITCH : TOPO_SAME_NUMA;
    }
    int n_domains = g == 0 ? 0 : s->nvlink ? 1 : g;
    for (int d = 0; d < n_domains; d++) {
        int members = s->nvlink ? g : 1;
        t->n_domains = d + 1;
        if (!(t->domains[d].gpus = malloc((size_t)members * sizeof(int)))) goto oom;
        t->domains[d].n_gpus = members;
        for (int k = 0; k < members; k++) t->domains[d].gpus[k] = s->nvlink ? k : d;
    }
    for (int k = 0; k < nics; k++) {
        struct topo_nic *nic = &t->nics[k];
        bool ib = g && s->rdma;
        snprintf(nic->name, sizeof nic->name, ib ? "mlx5_%d" : "eth%d", k);
        nic->kind = ib ? TOPO_NIC_INFINIBAND : TOPO_NIC_ETHERNET;
        nic->numa = 0;
    }
    t->n_nics = nics;
    return 0;
oom:
    topo_free(t);
    return error_set(err, "%s: out of memory", s->source);
}
