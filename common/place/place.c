/* place.c — rank placement: carving each node's devices into tensor-parallel
 * groups that stay inside NVLink domains, assigning the groups pipeline by
 * pipeline (a stage's cp groups one after another), then NICs, cores, the
 * links each communicator crosses, and the env contract of a rank. Discovery is topo.c's; costs are
 * cost.c's. */
#include "common/place/place.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/place/env.h"
#include "common/place/rank_order.h" // defines: rank_of, rank_dp_fold

/* A tp group carved out of one node: tp GPUs (or tp CPU slots). */
struct carve {
    int node;
    int *gpus; /* [tp] indexes into the node's topo->gpus; NULL for CPU slots */
};

struct carving {
    struct carve *groups;
    int n, cap;
};

static int carving_add(struct carving *c, int node, const int *gpus, int tp)
{
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 16;
        struct carve *bigger = realloc(c->groups, (size_t)cap * sizeof *bigger);
        if (!bigger) return -1;
        c->groups = bigger;
        c->cap = cap;
    }
    struct carve *g = &c->groups[c->n];
    g->node = node;
    g->gpus = NULL;
    if (gpus) {
        if (!(g->gpus = malloc((size_t)tp * sizeof *g->gpus))) return -1;
        memcpy(g->gpus, gpus, (size_t)tp * sizeof *g->gpus);
    }
    c->n++;
    return 0;
}

static void carving_free(struct carving *c)
{
    for (int i = 0; i < c->n; i++) free(c->groups[i].gpus);
    free(c->groups);
}

static bool granted(const struct place_node *n, int gpu)
{
    if (!n->gpus) return true;
    for (int i = 0; i < n->slots; i++)
        if (n->gpus[i] == gpu) return true;
    return false;
}

/* The ranks node n puts on each of its GPUs (PLAIT_RANKS_PER_GPU; 1 unless shared). */
static int per_gpu(const struct place_node *n)
{
    return n->ranks_per_gpu > 1 ? n->ranks_per_gpu : 1;
}

/* The GPU slots of node n the placement may use, grouped by NVLink domain (in
 * domain order, cuda order inside): the granted GPUs, or the first `slots`
 * taking whole domains first. A GPU shared by K ranks is K slots in a row, so
 * slots r·K … r·K+K−1 of the pool are its r-th GPU: the one mapping of slots
 * to GPUs, and ranks sharing a GPU are in its domain. domain_of[i] is
 * pool[i]'s domain; pool has room for t->n_gpus · per_gpu(n). */
static int gpu_pool(const struct place_node *n, int *pool, int *domain_of, struct plait_error *err)
{
    const struct topo *t = n->topo;
    int k_share = per_gpu(n);
    if (n->gpus && k_share > 1)
        return error_set(err, "node %s: %s=%d shares GPUs on one machine only, not granted ones",
                         n->name, PLAIT_ENV_RANKS_PER_GPU, k_share);
    if (n->slots > t->n_gpus * k_share) {
        if (k_share > 1)
            return error_set(err,
                             "node %s: %d slots, but its topology (%s) has %d GPU%s of %d "
                             "ranks each (%s=%d)",
                             n->name, n->slots, t->source, t->n_gpus, t->n_gpus == 1 ? "" : "s",
                             k_share, PLAIT_ENV_RANKS_PER_GPU, k_share);
        return error_set(err, "node %s: %d slots, but its topology (%s) has %d GPUs", n->name,
                         n->slots, t->source, t->n_gpus);
    }
    int count = 0;
    if (n->gpus) {
        for (int i = 0; i < n->slots; i++)
            if (n->gpus[i] < 0 || n->gpus[i] >= t->n_gpus)
                return error_set(err, "node %s: granted GPU %d does not exist (%d GPUs)", n->name,
                                 n->gpus[i], t->n_gpus);
    }
    /* whole domains that fit in what is left first, then the rest in order */
    bool *used = calloc((size_t)t->n_domains, sizeof *used);
    if (!used) return error_set(err, "out of memory");
    for (int pass = 0; pass < 2 && count < n->slots; pass++) {
        for (int d = 0; d < t->n_domains && count < n->slots; d++) {
            if (used[d]) continue;
            const struct topo_domain *dom = &t->domains[d];
            int avail = 0;
            for (int k = 0; k < dom->n_gpus; k++) avail += granted(n, dom->gpus[k]) * k_share;
            if (avail == 0 || (pass == 0 && avail > n->slots - count)) continue;
            used[d] = true;
            for (int k = 0; k < dom->n_gpus && count < n->slots; k++) {
                if (!granted(n, dom->gpus[k])) continue;
                for (int s = 0; s < k_share && count < n->slots; s++, count++) {
                    pool[count] = dom->gpus[k];
                    domain_of[count] = d;
                }
            }
        }
    }
    free(used);
    return count;
}

/* Carves node `ni`'s pool into tp groups: inside domains, then (if allowed)
 * across them. *largest gets the largest domain share of the pool. */
static int carve_node(const struct place_node *n, int ni, int tp, bool over_pcie,
                      struct carving *out, int *largest, struct plait_error *err)
{
    const struct topo *t = n->topo;
    *largest = 0;
    if (t->n_gpus == 0 || n->cpu_ranks) { /* CPU ranks: any tp slots of the node form a group */
        *largest = n->slots;
        for (int g = 0; g + tp <= n->slots; g += tp)
            if (carving_add(out, ni, NULL, tp)) return error_set(err, "out of memory");
        return 0;
    }
    size_t gpu_slots = (size_t)t->n_gpus * (size_t)per_gpu(n);
    int *pool = malloc(gpu_slots * sizeof *pool);
    int *domain_of = malloc(gpu_slots * sizeof *domain_of);
    int *left = malloc(gpu_slots * sizeof *left);
    int rc = -1, n_left = 0, count;
    if (!pool || !domain_of || !left) {
        error_set(err, "out of memory");
        goto out;
    }
    if ((count = gpu_pool(n, pool, domain_of, err)) < 0) goto out;
    for (int start = 0; start < count;) {
        int end = start;
        while (end < count && domain_of[end] == domain_of[start]) end++;
        if (end - start > *largest) *largest = end - start;
        int k = start;
        for (; k + tp <= end; k += tp)
            if (carving_add(out, ni, &pool[k], tp)) {
                error_set(err, "out of memory");
                goto out;
            }
        for (; k < end; k++) left[n_left++] = pool[k];
        start = end;
    }
    if (over_pcie)
        for (int k = 0; k + tp <= n_left; k += tp)
            if (carving_add(out, ni, &left[k], tp)) {
                error_set(err, "out of memory");
                goto out;
            }
    rc = 0;
out:
    free(pool);
    free(domain_of);
    free(left);
    return rc;
}

/* The largest tp ≤ limit that divides the heads and the padded vocabulary. */
static int largest_tp(const struct plan *plan, int limit)
{
    for (int t = limit; t > 1; t--)
        if (plan->model.heads % t == 0 && plan->model.padded_vocab % t == 0) return t;
    return 1;
}

/* Why tp groups cannot be carved: the message for err. */
static int refuse_tp(const struct plan *plan, int tp, const struct place_node *nodes, int n_nodes,
                     const int *largest, struct plait_error *err)
{
    int best = 0, max_slots = 0;
    for (int i = 0; i < n_nodes; i++) {
        if (largest[i] > best) best = largest[i];
        if (nodes[i].slots > max_slots) max_slots = nodes[i].slots;
    }
    if (tp > max_slots)
        return error_set(err,
                         "parallel.tp = %d exceeds the %d ranks of the largest node: a "
                         "tensor-parallel group must stay inside one node (largest tp that fits: "
                         "%d)",
                         tp, max_slots, largest_tp(plan, max_slots));
    /* name the domains of the first node where tp does not fit */
    for (int i = 0; i < n_nodes; i++) {
        if (largest[i] >= tp || nodes[i].topo->n_gpus == 0) continue;
        const struct topo *t = nodes[i].topo;
        char doms[512] = "";
        size_t len = 0;
        for (int d = 0; d < t->n_domains && len < sizeof doms - 32; d++) {
            len += (size_t)snprintf(doms + len, sizeof doms - len, "%s{", d ? ", " : "");
            for (int k = 0; k < t->domains[d].n_gpus && len < sizeof doms - 16; k++)
                len += (size_t)snprintf(doms + len, sizeof doms - len, "%s%d", k ? "," : "",
                                        t->gpus[t->domains[d].gpus[k]].cuda_index);
            len += (size_t)snprintf(doms + len, sizeof doms - len, "}");
        }
        return error_set(err,
                         "parallel.tp = %d does not fit in one NVLink domain: node %s (%s) "
                         "has NVLink domains %s (by CUDA index); the largest tp that fits is %d, "
                         "or set parallel.allow_tp_over_pcie to let tensor-parallel groups "
                         "cross PCIe",
                         tp, nodes[i].name, t->source, doms, largest_tp(plan, best));
    }
    return error_set(err, "parallel.tp = %d: the nodes' slots do not divide into groups of %d", tp,
                     tp);
}

/* ---- NICs and cores -------------------------------------------------------------- */

static bool nic_usable(const struct topo_nic *nic, bool want_fabric)
{
    return want_fabric ? nic->kind != TOPO_NIC_ETHERNET : nic->kind == TOPO_NIC_ETHERNET;
}

/* The nearest NIC of the node for a rank, spreading ranks over equally near
 * ones. InfiniBand/RoCE devices when the node has any, plain interfaces else. */
static int choose_nic(const struct topo *t, const struct place_rank *r, int *load)
{
    bool fabric = false;
    for (int k = 0; k < t->n_nics; k++) fabric |= t->nics[k].kind != TOPO_NIC_ETHERNET;
    int best = -1, best_aff = 0;
    for (int k = 0; k < t->n_nics; k++) {
        if (!nic_usable(&t->nics[k], fabric)) continue;
        int aff = r->gpu >= 0 ? (int)t->gpu_nic[r->gpu * t->n_nics + k]
                              : (t->nics[k].numa == r->numa ? 0 : 1);
        if (best < 0 || aff < best_aff || (aff == best_aff && load[k] < load[best])) {
            best = k;
            best_aff = aff;
        }
    }
    if (best >= 0) load[best]++;
    return best;
}

static bool same_cores(const int *a, int na, const int *b, int nb)
{
    return na == nb && memcmp(a, b, (size_t)na * sizeof *a) == 0;
}

/* Splits cores among the ranks of one node: the ranks whose GPUs share a set
 * of local cores divide that set evenly, without overlap (CPU ranks divide
 * all cores). With more ranks than cores in a set, each rank gets one core,
 * round-robin (ranks then share a core whole, never part of a set), and
 * shared gets the first such set's ranks and cores. */
static int assign_cores(const struct topo *t, struct place_rank **on_node, int n, int shared[2],
                        struct plait_error *err)
{
    int *all = malloc((size_t)(t->n_cores ? t->n_cores : 1) * sizeof *all);
    bool *taken = calloc((size_t)(t->n_cores ? t->n_cores : 1), sizeof *taken);
    bool *done = calloc((size_t)(n ? n : 1), sizeof *done);
    int *avail = malloc((size_t)(t->n_cores ? t->n_cores : 1) * sizeof *avail);
    int rc = -1;
    if (!all || !taken || !done || !avail) {
        error_set(err, "out of memory");
        goto out;
    }
    /* all cores, by NUMA node then index: what CPU ranks share */
    int n_all = 0;
    for (int numa = -1; numa < 1024 && n_all < t->n_cores; numa++)
        for (int c = 0; c < t->n_cores; c++)
            if (t->cores[c].numa == numa) all[n_all++] = c;
    for (int c = 0; c < t->n_cores && n_all < t->n_cores; c++) /* any NUMA index beyond */
        if (t->cores[c].numa >= 1024) all[n_all++] = c;
    for (int i = 0; i < n; i++) {
        if (done[i]) continue;
        const struct place_rank *r = on_node[i];
        const int *set = r->gpu >= 0 ? t->gpus[r->gpu].local_cores : all;
        int n_set = r->gpu >= 0 ? t->gpus[r->gpu].n_local_cores : n_all;
        /* the ranks sharing this set, in local order */
        int members[1024], k = 0;
        for (int j = i; j < n && k < 1024; j++) {
            const struct place_rank *q = on_node[j];
            const int *qs = q->gpu >= 0 ? t->gpus[q->gpu].local_cores : all;
            int nq = q->gpu >= 0 ? t->gpus[q->gpu].n_local_cores : n_all;
            if (!done[j] && same_cores(set, n_set, qs, nq)) members[k++] = j;
        }
        int n_avail = 0;
        for (int c = 0; c < n_set; c++)
            if (!taken[set[c]]) avail[n_avail++] = set[c];
        for (int m = 0; m < k; m++) {
            struct place_rank *q = on_node[members[m]];
            int lo = (int)((long)m * n_avail / k), hi = (int)((long)(m + 1) * n_avail / k);
            const int *from = avail + lo;
            int count = hi - lo;
            if (k > n_avail) { /* more ranks than cores: one core each, round-robin */
                from = n_avail ? &avail[m % n_avail] : &set[m % (n_set ? n_set : 1)];
                count = n_avail || n_set ? 1 : 0;
                if (!shared[0]) shared[0] = k, shared[1] = n_avail;
            }
            q->cores = malloc((size_t)(count ? count : 1) * sizeof *q->cores);
            if (!q->cores) {
                error_set(err, "out of memory");
                goto out;
            }
            memcpy(q->cores, from, (size_t)count * sizeof *q->cores);
            q->n_cores = count;
            for (int c = 0; c < count; c++) taken[from[c]] = true;
            if (q->gpu < 0) q->numa = count ? t->cores[from[0]].numa : -1;
            done[members[m]] = true;
        }
    }
    rc = 0;
out:
    free(all);
    free(taken);
    free(done);
    free(avail);
    return rc;
}

/* ---- links -------------------------------------------------------------------------- */

/* The link between two ranks, and its bandwidth. */
static enum cost_link link_between(const struct place_rank *a, const struct place_rank *b,
                                   const struct place_node *nodes, const struct place_bandwidth *bw,
                                   double *gbps)
{
    if (a->node != b->node) {
        *gbps = bw->network_gbps;
        return COST_LINK_NETWORK;
    }
    const struct topo *t = nodes[a->node].topo;
    /* CPU ranks, or two ranks sharing a GPU (PLAIT_RANKS_PER_GPU): the socket backend
     * moves their bytes through host memory (a shared GPU is in its own NVLink domain) */
    if (a->gpu < 0 || b->gpu < 0 || a->gpu == b->gpu) {
        *gbps = bw->memory_gbps;
        return COST_LINK_MEMORY;
    }
    double nv = t->nvlink_gbps[a->gpu * t->n_gpus + b->gpu];
    if (nv > 0) {
        *gbps = nv;
        return COST_LINK_NVLINK;
    }
    *gbps = bw->pcie_gbps;
    return COST_LINK_PCIE;
}

/* The most peers one member of the group from rank `first` (degree members, stride apart)
 * reaches over a link as slow as `worst` at `gbps`. */
static int peers_behind(const struct rank_map *m, const struct place_node *nodes,
                        const struct place_bandwidth *bw, int first, int degree, int stride,
                        enum cost_link worst, double gbps)
{
    int most = 0;
    for (int i = 0; i < degree; i++) {
        int n = 0;
        for (int j = 0; j < degree; j++) {
            double g;
            enum cost_link l = link_between(&m->ranks[first + i * stride],
                                            &m->ranks[first + j * stride], nodes, bw, &g);
            n += j != i && l == worst && g == gbps;
        }
        most = n > most ? n : most;
    }
    return most;
}

/* For each group of a communicator (ranks that differ only in its
 * coordinate), the slowest link its members use: every pair for tp, cp, dp and
 * ep (rings, all-reduces and all-to-alls), neighbouring stages for pp. which: 0
 * tp, 1 pp, 2 dp (the folded dp coordinate: the dp·cp ranks a gradient is
 * summed over), 3 a shard group (dp_shard·cp ranks of the folded dp
 * coordinate), 4 the replicas (hybrid sharding: rank_order.h), 5 cp, 6 an ep
 * group (ep consecutive ranks of the folded dp coordinate, as parallel.c splits
 * them), 7 the expert peers (its ranks ep apart). */
static void comm_links(struct rank_map *m, const struct place_node *nodes,
                       const struct place_bandwidth *bw, int which, struct place_comm *out)
{
    memset(out, 0, sizeof *out);
    int S = m->dp_shard, cp = m->cp, ep = m->ep;
    const int degrees[] = {m->tp, m->pp, m->dp * cp, S * cp, m->dp / S, cp, ep, m->dp * cp / ep};
    const int strides[] = {1,     m->tp * cp * m->dp, m->tp, m->tp, m->tp * S * cp, m->tp,
                           m->tp, m->tp * ep};
    int degree = degrees[which], stride = strides[which];
    if (degree == 1) return;
    for (int r = 0; r < m->world; r++) {
        const struct place_rank *first = &m->ranks[r];
        int folded = rank_dp_fold(first->dp, cp, first->cp);
        const int coords[] = {first->tp,
                              first->pp,
                              folded,
                              folded % (S * cp),
                              rank_replica_of(first->dp, S),
                              first->cp,
                              rank_shard_of(folded, ep),
                              rank_replica_of(folded, ep)};
        int coord = coords[which];
        if (coord != 0) continue; /* each group once, by its first member */
        enum cost_link worst = COST_LINK_NONE;
        double worst_gbps = 0;
        for (int i = 0; i < degree; i++)
            for (int j = i + 1; j < degree; j++) {
                if (which == 1 && j != i + 1) continue;
                double g;
                enum cost_link l = link_between(&m->ranks[r + i * stride],
                                                &m->ranks[r + j * stride], nodes, bw, &g);
                if (l > worst || (l == worst && g < worst_gbps)) {
                    worst = l;
                    worst_gbps = g;
                }
            }
        out->groups++;
        out->crossing[worst]++;
        int behind = which == 6 ? peers_behind(m, nodes, bw, r, degree, stride, worst, worst_gbps)
                                : 0; /* (an all-to-all's alone) */
        if (worst > out->slowest || (worst == out->slowest && worst_gbps < out->gbps)) {
            out->slowest = worst;
            out->gbps = worst_gbps;
            out->peers_behind = behind;
        } else if (worst == out->slowest && worst_gbps == out->gbps && behind > out->peers_behind) {
            out->peers_behind = behind;
        }
    }
}

/* ---- the map ------------------------------------------------------------------------- */

/* Whether the degrees, the device and the slots allow a map at all; *world its ranks. */
static int check_degrees(const struct plan *plan, int tp, int cp, int pp, int dp,
                         const struct place_node *nodes, int n_nodes, int *world,
                         struct plait_error *err)
{
    if (tp < 1 || cp < 1 || pp < 1 || dp < 1)
        return error_set(err, "placement needs concrete degrees (tp %d, cp %d, pp %d, dp %d)", tp,
                         cp, pp, dp);
    if (n_nodes < 1) return error_set(err, "placement needs at least one node");
    for (int i = 0; i < n_nodes; i++)
        if (plan->parallel.device == PLAN_DEVICE_CUDA && nodes[i].topo->n_gpus == 0)
            return error_set(err,
                             "parallel.device is \"cuda\" but node %s has no GPU (%s): use "
                             "\"cpu\" or \"auto\" to train on its cores",
                             nodes[i].name, nodes[i].topo->source);
    for (int i = 0; i < n_nodes; i++)
        if (plan->parallel.backend == PLAN_BACKEND_NCCL &&
            (nodes[i].topo->n_gpus == 0 || nodes[i].cpu_ranks))
            return error_set(err,
                             "parallel.backend: \"nccl\" moves GPU memory, but the ranks on node "
                             "%s train on its CPU (%s): use \"socket\" or \"auto\", or "
                             "parallel.device \"cuda\" where the nodes have GPUs",
                             nodes[i].name,
                             nodes[i].topo->n_gpus == 0 ? "it has no GPU" : "CPU ranks");
    for (int i = 0; i < n_nodes; i++)
        if (plan->parallel.backend == PLAN_BACKEND_NCCL && per_gpu(&nodes[i]) > 1 &&
            nodes[i].topo->n_gpus > 0 && !nodes[i].cpu_ranks)
            return error_set(err,
                             "%s=%d puts %d ranks on each GPU of node %s, but parallel.backend "
                             "\"nccl\" takes one rank per GPU: use \"socket\" or \"auto\" "
                             "(which chooses \"socket\" then), or %s=1",
                             PLAIT_ENV_RANKS_PER_GPU, per_gpu(&nodes[i]), per_gpu(&nodes[i]),
                             nodes[i].name, PLAIT_ENV_RANKS_PER_GPU);
    long long world_ll = (long long)tp * cp * pp * dp;
    if (world_ll > 1 << 24)
        return error_set(err, "tp × cp × pp × dp = %lld ranks is too many", world_ll);
    int slots = 0;
    for (int i = 0; i < n_nodes; i++) slots += nodes[i].slots;
    *world = (int)world_ll;
    char text[96];
    if (*world > slots)
        return error_set(err, "the layout %s needs %d ranks; the allocation has %d (%d node%s)",
                         place_layout_text(text, sizeof text, tp, cp, pp, dp), *world, slots,
                         n_nodes, n_nodes == 1 ? "" : "s");
    return 0;
}

/* The tp ranks of carved group c at coordinates at (its tp coordinate aside). */
static void place_group(struct rank_map *out, const struct carve *c, const struct place_node *nodes,
                        struct place_rank at)
{
    int folded = rank_dp_fold(at.dp, out->cp, at.cp);
    for (int t = 0; t < out->tp; t++) {
        int r = (int)rank_of(out->tp, out->dp * out->cp, (struct rank_coords){t, at.pp, folded});
        out->ranks[r] = (struct place_rank){.rank = r,
                                            .node = c->node,
                                            .tp = t,
                                            .cp = at.cp,
                                            .pp = at.pp,
                                            .dp = at.dp,
                                            .gpu = c->gpus ? c->gpus[t] : -1,
                                            .nic = -1,
                                            .numa = -1};
        if (c->gpus) out->ranks[r].numa = nodes[c->node].topo->gpus[c->gpus[t]].numa;
    }
}

/* The ranks of each carved group, pipeline by pipeline and a stage's cp groups one after
 * another, so that a cp group, then one pipeline's stages, share a node whenever they fit. */
static void ranks_of_groups(struct rank_map *out, const struct carving *carving,
                            const struct place_node *nodes)
{
    int g = 0;
    for (int d = 0; d < out->dp; d++)
        for (int s = 0; s < out->pp; s++)
            for (int k = 0; k < out->cp; k++, g++)
                place_group(out, &carving->groups[g], nodes,
                            (struct place_rank){.cp = k, .pp = s, .dp = d});
}

/* The most ranks the map puts on one GPU of node i (0: CPU ranks or none). */
static int most_on_one_gpu(const struct rank_map *m, const struct place_node *nodes, int i)
{
    int n_gpus = nodes[i].topo->n_gpus, most = 0;
    int *on = calloc((size_t)(n_gpus > 0 ? n_gpus : 1), sizeof *on);
    if (!on) return per_gpu(&nodes[i]); /* (the most it may be) */
    for (int r = 0; r < m->world; r++)
        if (m->ranks[r].node == i && m->ranks[r].gpu >= 0 && ++on[m->ranks[r].gpu] > most)
            most = on[m->ranks[r].gpu];
    free(on);
    return most;
}

/* Node i's ranks: their local numbers, NICs and cores. on_node: room for every rank. */
static int place_on_node(struct rank_map *out, const struct place_node *nodes, int i,
                         struct place_rank **on_node, struct plait_error *err)
{
    const struct topo *t = nodes[i].topo;
    int n = 0;
    for (int r = 0; r < out->world; r++)
        if (out->ranks[r].node == i) on_node[n++] = &out->ranks[r];
    int *load = calloc((size_t)(t->n_nics ? t->n_nics : 1), sizeof *load);
    if (!load) return error_set(err, "out of memory");
    for (int k = 0; k < n; k++) {
        on_node[k]->local_rank = k;
        if (on_node[k]->gpu >= 0) on_node[k]->nic = choose_nic(t, on_node[k], load);
    }
    int shared[2] = {0, 0};
    if (assign_cores(t, on_node, n, shared, err)) {
        free(load);
        return -1;
    }
    if (shared[0] && out->shared_node < 0) {
        out->shared_node = i;
        out->shared_ranks = shared[0];
        out->shared_cores = shared[1];
    }
    for (int k = 0; k < n; k++) /* CPU ranks know their NUMA node only now */
        if (on_node[k]->gpu < 0) on_node[k]->nic = choose_nic(t, on_node[k], load);
    free(load);
    return 0;
}

int place_ranks(const struct plan *plan, int tp, int pp, int dp, const struct place_node *nodes,
                int n_nodes, const struct place_bandwidth *bw, struct rank_map *out,
                struct plait_error *err)
{
    memset(out, 0, sizeof *out);
    int world = 0, cp = plan->parallel.cp > 1 ? plan->parallel.cp : 1;
    if (check_degrees(plan, tp, cp, pp, dp, nodes, n_nodes, &world, err)) return -1;
    struct carving carving = {0};
    int *largest = calloc((size_t)(unsigned)n_nodes, sizeof *largest);
    struct place_rank **on_node = NULL;
    int rc = -1;
    if (!largest) {
        error_set(err, "out of memory");
        goto out;
    }
    for (int i = 0; i < n_nodes; i++)
        if (carve_node(&nodes[i], i, tp, plan->parallel.allow_tp_over_pcie, &carving, &largest[i],
                       err))
            goto out;
    if (carving.n < cp * pp * dp) {
        refuse_tp(plan, tp, nodes, n_nodes, largest, err);
        goto out;
    }
    *out = (struct rank_map){.world = world,
                             .tp = tp,
                             .cp = cp,
                             .pp = pp,
                             .dp = dp,
                             .dp_shard = plan_dp_shard(&plan->parallel, dp),
                             .ep = plan->parallel.ep,
                             .n_nodes = n_nodes,
                             .shared_node = -1};
    if (out->dp_shard < 1 || dp % out->dp_shard) out->dp_shard = dp;
    if (out->ep < 1 || (dp * cp) % out->ep) out->ep = 1; /* (the plan rules refuse it) */
    out->ranks = calloc((size_t)(unsigned)world, sizeof *out->ranks);
    on_node = malloc((size_t)(unsigned)world * sizeof *on_node);
    if (!out->ranks || !on_node) {
        error_set(err, "out of memory");
        goto out;
    }
    ranks_of_groups(out, &carving, nodes);
    for (int i = 0; i < n_nodes; i++) {
        int most = most_on_one_gpu(out, nodes, i);
        if (most > out->gpu_sharing) out->gpu_sharing = most;
    }
    for (int i = 0; i < n_nodes; i++)
        if (place_on_node(out, nodes, i, on_node, err)) goto out;
    comm_links(out, nodes, bw, 0, &out->comm_tp);
    comm_links(out, nodes, bw, 1, &out->comm_pp);
    comm_links(out, nodes, bw, 2, &out->comm_dp);
    comm_links(out, nodes, bw, 5, &out->comm_cp);
    if (out->dp_shard < dp) {
        comm_links(out, nodes, bw, 3, &out->comm_shard);
        comm_links(out, nodes, bw, 4, &out->comm_replicas);
    }
    if (out->ep > 1) {
        comm_links(out, nodes, bw, 6, &out->comm_ep);
        comm_links(out, nodes, bw, 7, &out->comm_experts);
    }
    rc = 0;
out:
    free(on_node);
    carving_free(&carving);
    free(largest);
    if (rc) rank_map_free(out);
    return rc;
}

void place_shared_cores_text(const struct rank_map *m, const struct place_node *nodes, char *buf,
                             size_t bytes)
{
    if (bytes == 0) return;
    buf[0] = '\0';
    if (m->shared_node < 0) return;
    snprintf(buf, bytes,
             "node %s has %d core%s for %d ranks: each rank gets one core, round-robin, and "
             "ranks share cores (slower than a core or more per rank)",
             nodes[m->shared_node].name, m->shared_cores, m->shared_cores == 1 ? "" : "s",
             m->shared_ranks);
}

void rank_map_free(struct rank_map *m)
{
    if (m->ranks)
        for (int r = 0; r < m->world; r++) free(m->ranks[r].cores);
    free(m->ranks);
    memset(m, 0, sizeof *m);
}

char *place_layout_text(char *buf, size_t bytes, int tp, int cp, int pp, int dp)
{
    char cps[32] = "", dps[32] = "";
    if (cp > 1) snprintf(cps, sizeof cps, " × cp %d", cp);
    if (dp > 0) snprintf(dps, sizeof dps, " × dp %d", dp);
    snprintf(buf, bytes, "tp %d%s × pp %d%s", tp, cps, pp, dps);
    return buf;
}

/* ---- the env contract of a rank ------------------------------------------------------- */

static int env_add(char ***env, int *n, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int env_add(char ***env, int *n, const char *name, const char *fmt, ...)
{
    char value[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(value, sizeof value, fmt, ap);
    va_end(ap);
    char **bigger = realloc(*env, (size_t)(*n + 2) * sizeof **env);
    if (!bigger) return -1;
    *env = bigger;
    size_t len = strlen(name) + strlen(value) + 2;
    if (!((*env)[*n] = malloc(len))) return -1;
    snprintf((*env)[*n], len, "%s=%s", name, value);
    (*env)[++*n] = NULL;
    return 0;
}

char **place_rank_env(const struct rank_map *m, const struct place_node *nodes, int rank)
{
    const struct place_rank *r = &m->ranks[rank];
    const struct place_node *node = &nodes[r->node];
    const struct topo *t = node->topo;
    int local_world = 0;
    for (int k = 0; k < m->world; k++) local_world += m->ranks[k].node == r->node;
    char **env = NULL;
    int n = 0;
    char cpus[4096];
    topo_cpu_list(t, r->cores, r->n_cores, cpus, sizeof cpus);
    bool ok = !env_add(&env, &n, PLAIT_ENV_RANK, "%d", rank) &&
              !env_add(&env, &n, PLAIT_ENV_WORLD_SIZE, "%d", m->world) &&
              !env_add(&env, &n, PLAIT_ENV_LOCAL_RANK, "%d", r->local_rank) &&
              !env_add(&env, &n, PLAIT_ENV_LOCAL_WORLD_SIZE, "%d", local_world) &&
              !env_add(&env, &n, PLAIT_ENV_NODE_RANK, "%d", r->node) &&
              !env_add(&env, &n, PLAIT_ENV_NODES, "%d", m->n_nodes) &&
              !env_add(&env, &n, PLAIT_ENV_TP, "%d", m->tp) &&
              !env_add(&env, &n, PLAIT_ENV_PP, "%d", m->pp) &&
              !env_add(&env, &n, PLAIT_ENV_DP, "%d", m->dp) &&
              !env_add(&env, &n, PLAIT_ENV_TP_RANK, "%d", r->tp) &&
              !env_add(&env, &n, PLAIT_ENV_PP_RANK, "%d", r->pp) &&
              !env_add(&env, &n, PLAIT_ENV_DP_RANK, "%d", r->dp) &&
              (m->cp == 1 || /* optional in the contract: absent, 1 and 0 */
               (!env_add(&env, &n, PLAIT_ENV_CP, "%d", m->cp) &&
                !env_add(&env, &n, PLAIT_ENV_CP_RANK, "%d", r->cp))) &&
              !env_add(&env, &n, PLAIT_ENV_CPUS, "%s", cpus) &&
              !env_add(&env, &n, PLAIT_ENV_NUMA, "%d", r->numa);
    if (ok && r->gpu >= 0) {
        /* every GPU of the node stays visible (hiding peers breaks NCCL's NVLink
         * paths); the rank picks its own by index, in PCI bus order */
        char visible[1024] = "";
        size_t len = 0;
        for (int k = 0; k < t->n_gpus && len < sizeof visible - 8; k++)
            if (granted(node, k))
                len += (size_t)snprintf(visible + len, sizeof visible - len, "%s%d", len ? "," : "",
                                        t->gpus[k].cuda_index);
        ok = !env_add(&env, &n, PLAIT_ENV_DEVICE, "%d", t->gpus[r->gpu].cuda_index) &&
             !env_add(&env, &n, PLAIT_ENV_GPU_BUSID, "%s", t->gpus[r->gpu].busid) &&
             (per_gpu(node) == 1 || /* optional in the contract: absent, 1 */
              !env_add(&env, &n, PLAIT_ENV_GPU_SHARED_BY, "%d", per_gpu(node))) &&
             !env_add(&env, &n, "CUDA_DEVICE_ORDER", "PCI_BUS_ID") &&
             !env_add(&env, &n, "CUDA_VISIBLE_DEVICES", "%s", visible);
    } else if (ok) {
        ok = !env_add(&env, &n, PLAIT_ENV_DEVICE, "cpu");
    }
    if (ok && r->nic >= 0) {
        const struct topo_nic *nic = &t->nics[r->nic];
        if (nic->kind == TOPO_NIC_ETHERNET)
            ok = !env_add(&env, &n, "NCCL_SOCKET_IFNAME", "=%s", nic->name);
        else /* "=": exactly this HCA, not every name it prefixes */
            ok = !env_add(&env, &n, "NCCL_IB_HCA", "=%s", nic->name);
        ok = ok && !env_add(&env, &n, PLAIT_ENV_NIC, "%s", nic->name);
    }
    if (!ok) {
        place_env_free(env);
        return NULL;
    }
    return env;
}

void place_env_free(char **env)
{
    if (!env) return;
    for (char **e = env; *e; e++) free(*e);
    free(env);
}
