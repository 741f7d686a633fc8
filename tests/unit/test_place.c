/* test_place.c — rank placement on hand-built topologies (no hwloc here; the
 * golden tests in tests/topo/ run the same code on real hwloc fixtures):
 * Megatron rank order, tp groups inside NVLink domains even when domain
 * indices interleave, refusals with reasons, pipelines kept on one node,
 * NIC spreading, disjoint CPU sets, the links each communicator crosses,
 * context parallelism's cp groups next to tp and their env contract. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "common/place/env.h"
#include "common/place/place.h"

/* A node: n_gpus GPUs, domain_of[g] (or -1: all one domain), n_numa NUMA
 * nodes of cores_per_numa cores (GPU g local to NUMA g*n_numa/n_gpus), and
 * n_nics InfiniBand NICs, NIC k in the same PCIe switch as GPU k*n_gpus/n_nics. */
static struct topo *make_topo(int n_gpus, const int *domain_of, int n_numa, int cores_per_numa,
                              int n_nics)
{
    struct topo *t = calloc(1, sizeof *t);
    t->source = strdup("synthetic");
    t->n_numa = n_numa;
    t->n_cores = n_numa * cores_per_numa;
    t->cores = calloc((size_t)t->n_cores, sizeof *t->cores);
    for (int c = 0; c < t->n_cores; c++) {
        t->cores[c].os_index = c;
        t->cores[c].numa = t->cores[c].package = c / cores_per_numa;
        t->cores[c].n_pus = 1;
        t->cores[c].pus = malloc(sizeof(int));
        t->cores[c].pus[0] = c;
    }
    t->n_gpus = n_gpus;
    t->gpus = calloc((size_t)(n_gpus ? n_gpus : 1), sizeof *t->gpus);
    t->nvlink_gbps = calloc((size_t)(n_gpus * n_gpus + 1), sizeof *t->nvlink_gbps);
    int n_dom = 0;
    for (int g = 0; g < n_gpus; g++) {
        int d = domain_of ? domain_of[g] : 0;
        if (d + 1 > n_dom) n_dom = d + 1;
    }
    t->n_domains = n_dom;
    t->domains = calloc((size_t)(n_dom ? n_dom : 1), sizeof *t->domains);
    for (int g = 0; g < n_gpus; g++) {
        struct topo_gpu *gpu = &t->gpus[g];
        snprintf(gpu->busid, sizeof gpu->busid, "0000:%02x:00.0", 0x10 + g);
        gpu->cuda_index = g;
        gpu->numa = g * n_numa / n_gpus;
        gpu->n_local_cores = cores_per_numa;
        gpu->local_cores = malloc((size_t)cores_per_numa * sizeof(int));
        for (int c = 0; c < cores_per_numa; c++)
            gpu->local_cores[c] = gpu->numa * cores_per_numa + c;
        gpu->domain = domain_of ? domain_of[g] : 0;
        struct topo_domain *dom = &t->domains[gpu->domain];
        dom->gpus = realloc(dom->gpus, (size_t)(dom->n_gpus + 1) * sizeof(int));
        dom->gpus[dom->n_gpus++] = g;
        for (int h = 0; h < n_gpus; h++)
            if (h != g && (domain_of ? domain_of[h] : 0) == gpu->domain)
                t->nvlink_gbps[g * n_gpus + h] = 450;
    }
    t->n_nics = n_nics;
    t->nics = calloc((size_t)(n_nics ? n_nics : 1), sizeof *t->nics);
    t->gpu_nic = calloc((size_t)(n_gpus * n_nics + 1), sizeof *t->gpu_nic);
    for (int k = 0; k < n_nics; k++) {
        snprintf(t->nics[k].name, sizeof t->nics[k].name, "mlx5_%d", k);
        t->nics[k].kind = TOPO_NIC_INFINIBAND;
        t->nics[k].numa = n_gpus ? (k * n_gpus / n_nics) * n_numa / n_gpus : 0;
        for (int g = 0; g < n_gpus; g++)
            t->gpu_nic[g * n_nics + k] = g == k * n_gpus / n_nics ? TOPO_SAME_PCIE_SWITCH
                                         : t->gpus[g].numa == t->nics[k].numa ? TOPO_SAME_NUMA
                                                                              : TOPO_OTHER;
    }
    return t;
}

static void free_topo(struct topo *t)
{
    for (int c = 0; c < t->n_cores; c++) free(t->cores[c].pus);
    for (int g = 0; g < t->n_gpus; g++) free(t->gpus[g].local_cores);
    for (int d = 0; d < t->n_domains; d++) free(t->domains[d].gpus);
    free(t->cores), free(t->gpus), free(t->domains), free(t->nics), free(t->gpu_nic);
    free(t->nvlink_gbps), free(t->source), free(t);
}

static struct plan *make_plan_cp(int heads, bool over_pcie, int cp)
{
    char text[512];
    snprintf(text, sizeof text,
             "{\"model\": {\"layers\": 8, \"heads\": %d, \"hidden\": %d, \"vocab\": 256, "
             "\"seq_len\": 16}, \"data\": {\"train\": \"x\"}, \"steps\": 1, "
             "\"parallel\": {\"allow_tp_over_pcie\": %s, \"cp\": %d}}",
             heads, heads * 8, over_pcie ? "true" : "false", cp);
    struct plait_error err;
    struct plan *p = plan_load_text(text, "test", "/", NULL, 0, &err);
    if (!p) printf("  plan: %s\n", err.text);
    return p;
}

static struct plan *make_plan(int heads, bool over_pcie)
{
    return make_plan_cp(heads, over_pcie, 1);
}

static const struct place_bandwidth bw = {.pcie_gbps = 24, .network_gbps = 50, .memory_gbps = 100};

static void test_megatron_order_tp_fastest_then_dp_then_pp(void)
{
    struct topo *t = make_topo(8, NULL, 2, 8, 8);
    struct place_node nodes[4];
    for (int i = 0; i < 4; i++) nodes[i] = (struct place_node){.name = "n", .topo = t, .slots = 8};
    struct plan *p = make_plan(16, false);
    struct rank_map m;
    struct plait_error err;
    CHECK(place_ranks(p, 8, 2, 2, nodes, 4, &bw, &m, &err) == 0, "%s", err.text);
    CHECK(m.world == 32, "world %d", m.world);
    for (int r = 0; r < 32; r++) {
        CHECK(m.ranks[r].tp == r % 8 && m.ranks[r].dp == (r / 8) % 2 && m.ranks[r].pp == r / 16,
              "rank %d has tp %d dp %d pp %d", r, m.ranks[r].tp, m.ranks[r].dp, m.ranks[r].pp);
        CHECK(m.ranks[r].gpu == r % 8, "rank %d on GPU %d", r, m.ranks[r].gpu);
    }
    /* groups go pipeline by pipeline: (dp0,pp0) node 0, (dp0,pp1) node 1, (dp1,pp0) node 2 */
    CHECK(m.ranks[0].node == 0 && m.ranks[16].node == 1 && m.ranks[8].node == 2 &&
              m.ranks[24].node == 3,
          "nodes %d %d %d %d", m.ranks[0].node, m.ranks[16].node, m.ranks[8].node,
          m.ranks[24].node);
    CHECK(m.comm_tp.slowest == COST_LINK_NVLINK && m.comm_tp.gbps == 450, "tp link %d %g",
          m.comm_tp.slowest, m.comm_tp.gbps);
    CHECK(m.comm_pp.slowest == COST_LINK_NETWORK && m.comm_dp.slowest == COST_LINK_NETWORK,
          "pp %d dp %d", m.comm_pp.slowest, m.comm_dp.slowest);
    CHECK(m.comm_tp.groups == 4 && m.comm_pp.groups == 16 && m.comm_dp.groups == 16,
          "groups %d %d %d", m.comm_tp.groups, m.comm_pp.groups, m.comm_dp.groups);
    rank_map_free(&m);
    plan_free(p);
    free_topo(t);
}

static void test_pipeline_stages_share_a_node_when_they_fit(void)
{
    struct topo *t = make_topo(8, NULL, 2, 8, 8);
    struct place_node nodes[2] = {{.name = "a", .topo = t, .slots = 8},
                                  {.name = "b", .topo = t, .slots = 8}};
    struct plan *p = make_plan(8, false);
    struct rank_map m;
    struct plait_error err;
    CHECK(place_ranks(p, 4, 2, 2, nodes, 2, &bw, &m, &err) == 0, "%s", err.text);
    /* pipeline dp0 = ranks {0-3 (pp0), 8-11 (pp1)} on node a; dp1 on node b */
    CHECK(m.ranks[0].node == 0 && m.ranks[8].node == 0 && m.ranks[4].node == 1 &&
              m.ranks[12].node == 1,
          "nodes %d %d %d %d", m.ranks[0].node, m.ranks[8].node, m.ranks[4].node, m.ranks[12].node);
    CHECK(m.ranks[8].gpu == 4, "stage 1 of pipeline 0 on GPUs 4-7, got %d", m.ranks[8].gpu);
    CHECK(m.comm_pp.slowest == COST_LINK_NVLINK, "pp stays on NVLink: %s",
          cost_link_name(m.comm_pp.slowest));
    CHECK(m.comm_dp.slowest == COST_LINK_NETWORK, "dp crosses the network: %s",
          cost_link_name(m.comm_dp.slowest));
    rank_map_free(&m);
    plan_free(p);
    free_topo(t);
}

static void test_tp_group_stays_in_nvlink_clique_with_interleaved_indices(void)
{
    int islands[8] = {0, 1, 0, 1, 0, 1, 0, 1};
    struct topo *t = make_topo(8, islands, 2, 8, 4);
    struct place_node node = {.name = "islands", .topo = t, .slots = 8};
    struct plan *p = make_plan(8, false);
    struct rank_map m;
    struct plait_error err;
    CHECK(place_ranks(p, 4, 1, 2, &node, 1, &bw, &m, &err) == 0, "%s", err.text);
    int want[8] = {0, 2, 4, 6, 1, 3, 5, 7};
    for (int r = 0; r < 8; r++)
        CHECK(m.ranks[r].gpu == want[r], "rank %d on GPU %d, want %d", r, m.ranks[r].gpu, want[r]);
    CHECK(m.comm_tp.slowest == COST_LINK_NVLINK, "tp on %s", cost_link_name(m.comm_tp.slowest));
    rank_map_free(&m);

    /* tp = 8 does not fit an island: refused with the domains and the largest tp */
    CHECK(place_ranks(p, 8, 1, 1, &node, 1, &bw, &m, &err) != 0, "tp=8 placed on 4-GPU islands");
    CHECK(strstr(err.text, "parallel.tp = 8 does not fit in one NVLink domain") &&
              strstr(err.text, "{0,2,4,6}, {1,3,5,7}") &&
              strstr(err.text, "the largest tp that fits is 4") &&
              strstr(err.text, "allow_tp_over_pcie"),
          "message: %s", err.text);
    plan_free(p);

    /* unless the plan allows crossing PCIe */
    p = make_plan(8, true);
    CHECK(place_ranks(p, 8, 1, 1, &node, 1, &bw, &m, &err) == 0, "%s", err.text);
    CHECK(m.comm_tp.slowest == COST_LINK_PCIE && m.comm_tp.gbps == 24, "tp link %s %g",
          cost_link_name(m.comm_tp.slowest), m.comm_tp.gbps);
    rank_map_free(&m);
    plan_free(p);
    free_topo(t);
}

static void test_refusals_say_why(void)
{
    struct topo *t = make_topo(8, NULL, 2, 8, 8);
    struct place_node nodes[2] = {{.name = "a", .topo = t, .slots = 8},
                                  {.name = "b", .topo = t, .slots = 8}};
    struct plan *p = make_plan(32, false);
    struct rank_map m;
    struct plait_error err;
    CHECK(place_ranks(p, 8, 2, 2, nodes, 2, &bw, &m, &err) != 0, "32 ranks on 16 slots");
    CHECK(strstr(err.text, "needs 32 ranks; the allocation has 16 (2 nodes)"), "%s", err.text);
    CHECK(place_ranks(p, 16, 1, 1, nodes, 2, &bw, &m, &err) != 0, "tp over two nodes");
    CHECK(strstr(err.text, "exceeds the 8 ranks of the largest node") &&
              strstr(err.text, "largest tp that fits: 8"),
          "%s", err.text);
    plan_free(p);
    free_topo(t);
}

static void test_nics_nearest_first_then_spread(void)
{
    /* 8 GPUs, 2 NICs: NIC 0 beside GPU 0 (NUMA 0), NIC 1 beside GPU 4 (NUMA 1) */
    struct topo *t = make_topo(8, NULL, 2, 8, 2);
    struct place_node node = {.name = "n", .topo = t, .slots = 8};
    struct plan *p = make_plan(8, false);
    struct rank_map m;
    struct plait_error err;
    CHECK(place_ranks(p, 1, 1, 8, &node, 1, &bw, &m, &err) == 0, "%s", err.text);
    for (int r = 0; r < 8; r++)
        CHECK(m.ranks[r].nic == (r < 4 ? 0 : 1), "rank %d (GPU %d, NUMA %d) got NIC %d", r,
              m.ranks[r].gpu, m.ranks[r].numa, m.ranks[r].nic);
    rank_map_free(&m);
    /* two equally near NICs per GPU: ranks alternate between them */
    for (int g = 0; g < 8; g++)
        for (int k = 0; k < 2; k++) t->gpu_nic[g * 2 + k] = TOPO_SAME_NUMA;
    CHECK(place_ranks(p, 1, 1, 8, &node, 1, &bw, &m, &err) == 0, "%s", err.text);
    for (int r = 0; r < 8; r++)
        CHECK(m.ranks[r].nic == r % 2, "rank %d got NIC %d, want %d", r, m.ranks[r].nic, r % 2);
    rank_map_free(&m);
    plan_free(p);
    free_topo(t);
}

static void test_cpu_sets_are_local_and_disjoint(void)
{
    struct topo *t = make_topo(8, NULL, 2, 8, 8); /* 4 GPUs per NUMA node of 8 cores */
    struct place_node node = {.name = "n", .topo = t, .slots = 8};
    struct plan *p = make_plan(8, false);
    struct rank_map m;
    struct plait_error err;
    CHECK(place_ranks(p, 8, 1, 1, &node, 1, &bw, &m, &err) == 0, "%s", err.text);
    int owner[16];
    for (int c = 0; c < 16; c++) owner[c] = -1;
    for (int r = 0; r < 8; r++) {
        CHECK(m.ranks[r].n_cores == 2, "rank %d has %d cores", r, m.ranks[r].n_cores);
        for (int k = 0; k < m.ranks[r].n_cores; k++) {
            int c = m.ranks[r].cores[k];
            CHECK(owner[c] < 0, "core %d given to ranks %d and %d", c, owner[c], r);
            owner[c] = r;
            CHECK(t->cores[c].numa == m.ranks[r].numa, "rank %d (NUMA %d) got core %d of NUMA %d",
                  r, m.ranks[r].numa, c, t->cores[c].numa);
        }
    }
    rank_map_free(&m);
    plan_free(p);
    free_topo(t);
}

static void test_gpu_less_nodes_run_cpu_ranks(void)
{
    struct topo *t = make_topo(0, NULL, 2, 4, 0);
    struct place_node nodes[2] = {{.name = "c0", .topo = t, .slots = 4},
                                  {.name = "c1", .topo = t, .slots = 4}};
    struct plan *p = make_plan(4, false);
    struct rank_map m;
    struct plait_error err;
    CHECK(place_ranks(p, 2, 1, 4, nodes, 2, &bw, &m, &err) == 0, "%s", err.text);
    for (int r = 0; r < 8; r++) {
        CHECK(m.ranks[r].gpu == -1 && m.ranks[r].nic == -1, "rank %d gpu %d nic %d", r,
              m.ranks[r].gpu, m.ranks[r].nic);
        CHECK(m.ranks[r].n_cores == 2 && m.ranks[r].node == r / 4, "rank %d: %d cores, node %d", r,
              m.ranks[r].n_cores, m.ranks[r].node);
    }
    CHECK(m.comm_tp.slowest == COST_LINK_MEMORY && m.comm_dp.slowest == COST_LINK_NETWORK,
          "tp %s dp %s", cost_link_name(m.comm_tp.slowest), cost_link_name(m.comm_dp.slowest));
    rank_map_free(&m);
    plan_free(p);
    free_topo(t);
}

static void test_heterogeneous_nodes_and_granted_gpus(void)
{
    struct topo *big = make_topo(8, NULL, 2, 8, 8);
    int pairs[4] = {0, 0, 1, 1};
    struct topo *small = make_topo(4, pairs, 1, 8, 2);
    int granted[2] = {3, 2}; /* Slurm granted two GPUs of the small node */
    struct place_node nodes[2] = {{.name = "big", .topo = big, .slots = 8},
                                  {.name = "small", .topo = small, .slots = 2, .gpus = granted}};
    struct plan *p = make_plan(8, false);
    struct rank_map m;
    struct plait_error err;
    CHECK(place_ranks(p, 2, 1, 5, nodes, 2, &bw, &m, &err) == 0, "%s", err.text);
    CHECK(m.ranks[8].node == 1 && m.ranks[9].node == 1, "ranks 8, 9 on node %d %d", m.ranks[8].node,
          m.ranks[9].node);
    CHECK(m.ranks[8].gpu == 2 && m.ranks[9].gpu == 3, "granted GPUs 2, 3; got %d %d",
          m.ranks[8].gpu, m.ranks[9].gpu);
    CHECK(m.ranks[8].local_rank == 0 && m.ranks[9].local_rank == 1, "local ranks %d %d",
          m.ranks[8].local_rank, m.ranks[9].local_rank);
    rank_map_free(&m);
    plan_free(p);
    free_topo(big);
    free_topo(small);
}

static void test_device_cpu_runs_cpu_ranks_on_gpu_nodes(void)
{
    struct topo *t = make_topo(8, NULL, 2, 8, 8);
    struct place_node node = {.name = "n", .topo = t, .slots = 2, .cpu_ranks = true};
    struct plan *p = make_plan(8, false);
    struct rank_map m;
    struct plait_error err;
    CHECK(place_ranks(p, 1, 1, 2, &node, 1, &bw, &m, &err) == 0, "%s", err.text);
    for (int r = 0; r < 2; r++)
        CHECK(m.ranks[r].gpu == -1 && m.ranks[r].n_cores == 8, "rank %d: gpu %d, %d cores", r,
              m.ranks[r].gpu, m.ranks[r].n_cores);
    rank_map_free(&m);
    plan_free(p);
    free_topo(t);
}

/* 4 ranks on 2 cores (the issue: 0-1, 0, 0-1, 1): one core each, round-robin,
 * so two ranks' sets are the same or disjoint, never overlapping in part;
 * the map says so for the launchers' warning. */
static void test_more_ranks_than_cores_share_whole_cores_round_robin(void)
{
    struct topo *t = make_topo(0, NULL, 1, 2, 0);
    struct place_node node = {.name = "small", .topo = t, .slots = 4};
    struct plan *p = make_plan(4, false);
    struct rank_map m;
    struct plait_error err;
    CHECK(place_ranks(p, 1, 1, 4, &node, 1, &bw, &m, &err) == 0, "%s", err.text);
    for (int r = 0; r < 4; r++)
        CHECK(m.ranks[r].n_cores == 1 && m.ranks[r].cores[0] == r % 2,
              "rank %d: %d cores, first %d", r, m.ranks[r].n_cores,
              m.ranks[r].n_cores ? m.ranks[r].cores[0] : -1);
    char text[256];
    place_shared_cores_text(&m, &node, text, sizeof text);
    CHECK(m.shared_node == 0 && strstr(text, "node small has 2 cores for 4 ranks"), "%d: %s",
          m.shared_node, text);
    rank_map_free(&m);
    CHECK(place_ranks(p, 1, 1, 2, &node, 1, &bw, &m, &err) == 0, "%s", err.text);
    place_shared_cores_text(&m, &node, text, sizeof text);
    CHECK(m.shared_node == -1 && !*text, "2 ranks on 2 cores: %s", text);
    rank_map_free(&m);
    plan_free(p);
    free_topo(t);
}

/* A one-layer model of `heads` heads of 8 with the sets applied, or NULL with err. */
static struct plan *small_plan(int heads, const char **sets, int n_sets, struct plait_error *err)
{
    char text[256];
    snprintf(text, sizeof text,
             "{\"model\": {\"layers\": 1, \"heads\": %d, \"hidden\": %d, \"vocab\": 256, "
             "\"seq_len\": 8}, \"data\": {\"train\": \"x\"}, \"steps\": 1}",
             heads, heads * 8);
    return plan_load_text(text, "test", "/", sets, n_sets, err);
}

/* parallel.device "cuda" on a node without GPUs cannot run: refused, not
 * turned into CPU ranks */
static void test_cuda_on_a_gpu_less_node_is_refused(void)
{
    struct topo *t = make_topo(0, NULL, 1, 4, 0);
    struct place_node node = {.name = "c0", .topo = t, .slots = 1};
    const char *cuda[] = {"parallel.device=cuda"};
    struct plait_error err;
    struct plan *p = small_plan(1, cuda, 1, &err);
    CHECK(p, "%s", err.text);
    struct rank_map m;
    CHECK(p && place_ranks(p, 1, 1, 1, &node, 1, &bw, &m, &err) != 0, "cuda placed on no GPU");
    CHECK(strstr(err.text, "parallel.device is \"cuda\" but node c0 has no GPU"), "%s", err.text);
    plan_free(p);
    free_topo(t);
}

/* The value of name in a rank's env contract, or NULL */
static const char *env_value(char **env, const char *name)
{
    size_t len = strlen(name);
    for (char **e = env; e && *e; e++)
        if (strncmp(*e, name, len) == 0 && (*e)[len] == '=') return *e + len + 1;
    return NULL;
}

/* tp 2 × cp 2 × pp 2 × dp 2 on two 8-GPU nodes: rank = tp + 2·(cp + 2·(dp + 2·pp)); a
 * stage's two cp groups are carved one after the other, so each cp group (and each
 * pipeline) sits on one node, and only dp crosses the network */
static void test_cp_groups_sit_next_to_tp_on_one_node(void)
{
    struct topo *t = make_topo(8, NULL, 2, 8, 8);
    struct place_node nodes[2] = {{.name = "a", .topo = t, .slots = 8},
                                  {.name = "b", .topo = t, .slots = 8}};
    struct plan *p = make_plan_cp(8, false, 2);
    struct rank_map m;
    struct plait_error err;
    CHECK(place_ranks(p, 2, 2, 2, nodes, 2, &bw, &m, &err) == 0, "%s", err.text);
    CHECK(m.world == 16 && m.cp == 2 && m.dp == 2, "world %d cp %d dp %d", m.world, m.cp, m.dp);
    for (int r = 0; r < m.world; r++) {
        const struct place_rank *q = &m.ranks[r];
        CHECK(q->tp == r % 2 && q->cp == r / 2 % 2 && q->dp == r / 4 % 2 && q->pp == r / 8,
              "rank %d has tp %d cp %d dp %d pp %d", r, q->tp, q->cp, q->dp, q->pp);
        CHECK(q->node == q->dp, "rank %d (dp %d) on node %d", r, q->dp, q->node);
        /* node order: (pp0: cp0, cp1), (pp1: cp0, cp1), two GPUs each */
        int gpu = 4 * q->pp + 2 * q->cp + q->tp;
        CHECK(q->gpu == gpu, "rank %d on GPU %d, want %d", r, q->gpu, gpu);
    }
    CHECK(m.comm_cp.groups == 8 && m.comm_cp.slowest == COST_LINK_NVLINK, "cp: %d groups over %s",
          m.comm_cp.groups, cost_link_name(m.comm_cp.slowest));
    /* dp's groups are the dp·cp ranks a gradient is summed over: tp 2 × pp 2 of them */
    CHECK(m.comm_dp.groups == 4 && m.comm_dp.slowest == COST_LINK_NETWORK, "dp: %d groups over %s",
          m.comm_dp.groups, cost_link_name(m.comm_dp.slowest));
    CHECK(m.comm_tp.groups == 8 && m.comm_pp.groups == 8 && m.comm_pp.slowest == COST_LINK_NVLINK,
          "tp %d groups, pp %d over %s", m.comm_tp.groups, m.comm_pp.groups,
          cost_link_name(m.comm_pp.slowest));
    /* rank 6: tp 0, cp 1, dp 1, pp 0; its env reads back through the runtime's reader */
    char **env = place_rank_env(&m, nodes, 6);
    CHECK(env && strcmp(env_value(env, PLAIT_ENV_CP), "2") == 0 &&
              strcmp(env_value(env, PLAIT_ENV_CP_RANK), "1") == 0 &&
              strcmp(env_value(env, PLAIT_ENV_DP), "2") == 0 &&
              strcmp(env_value(env, PLAIT_ENV_DP_RANK), "1") == 0 &&
              strcmp(env_value(env, PLAIT_ENV_WORLD_SIZE), "16") == 0,
          "rank 6's env");
    for (char **e = env; e && *e; e++) putenv(*e);
    setenv(PLAIT_ENV_STORE_ADDR, "a:29500", 1);
    setenv(PLAIT_ENV_STORE_SECRET, "abc", 1);
    struct env_rank er;
    CHECK(env_rank_read(&er, &err) == 0, "%s", err.text);
    CHECK(er.rank == 6 && er.cp == 2 && er.cp_rank == 1 && er.dp == 2 && er.dp_rank == 1,
          "read back: rank %d cp %d/%d dp %d/%d", er.rank, er.cp_rank, er.cp, er.dp_rank, er.dp);
    for (char **e = env; e && *e; e++) {
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)(strchr(*e, '=') - *e), *e);
        unsetenv(name);
    }
    unsetenv(PLAIT_ENV_STORE_ADDR);
    unsetenv(PLAIT_ENV_STORE_SECRET);
    place_env_free(env);
    rank_map_free(&m);
    plan_free(p);

    /* without cp the contract's optional variables stay out */
    p = make_plan(8, false);
    CHECK(place_ranks(p, 2, 1, 1, nodes, 1, &bw, &m, &err) == 0, "%s", err.text);
    env = place_rank_env(&m, nodes, 1);
    CHECK(env && !env_value(env, PLAIT_ENV_CP) && !env_value(env, PLAIT_ENV_CP_RANK) &&
              m.comm_cp.groups == 0,
          "cp 1 exports %s", env_value(env, PLAIT_ENV_CP));
    place_env_free(env);
    rank_map_free(&m);
    plan_free(p);
    free_topo(t);
}

/* a cp group that does not fit is refused naming cp; hybrid sharding's shard group is
 * dp_shard·cp ranks, its replicas dp / dp_shard */
static void test_cp_counts_in_the_world_and_the_shard_group(void)
{
    struct topo *t = make_topo(8, NULL, 2, 8, 8);
    struct place_node nodes[2] = {{.name = "a", .topo = t, .slots = 8},
                                  {.name = "b", .topo = t, .slots = 8}};
    struct plan *p = make_plan_cp(8, false, 4);
    struct rank_map m;
    struct plait_error err;
    CHECK(place_ranks(p, 2, 1, 4, nodes, 2, &bw, &m, &err) != 0, "32 ranks on 16 slots");
    CHECK(strstr(err.text, "the layout tp 2 × cp 4 × pp 1 × dp 4 needs 32 ranks"), "%s", err.text);
    plan_free(p);
    const char *hsdp[] = {"parallel.cp=2", "parallel.dp=4", "parallel.zero=1",
                          "parallel.dp_shard=2"};
    p = plan_load_text("{\"model\": {\"layers\": 8, \"heads\": 8, \"hidden\": 64, "
                       "\"vocab\": 256, \"seq_len\": 16}, \"data\": {\"train\": \"x\"}, "
                       "\"steps\": 1}",
                       "test", "/", hsdp, 4, &err);
    CHECK(p, "%s", err.text);
    /* tp 1 × cp 2 × dp 4 (2 replicas of shard groups of 2): 4 ranks a node */
    for (int i = 0; i < 2; i++) nodes[i].slots = 4;
    CHECK(p && place_ranks(p, 1, 1, 4, nodes, 2, &bw, &m, &err) == 0, "%s", err.text);
    CHECK(m.comm_shard.groups == 2 && m.comm_shard.slowest == COST_LINK_NVLINK &&
              m.comm_replicas.groups == 4 && m.comm_replicas.slowest == COST_LINK_NETWORK,
          "shard %d groups over %s, replicas %d over %s", m.comm_shard.groups,
          cost_link_name(m.comm_shard.slowest), m.comm_replicas.groups,
          cost_link_name(m.comm_replicas.slowest));
    rank_map_free(&m);
    plan_free(p);
    free_topo(t);
}

/* Expert parallelism on two nodes of 8 GPUs, tp 2 × dp 8: an ep group is ep consecutive dp
 * ranks of one tp rank (parallel.c's split), tp·ep consecutive ranks. At ep 2 a group is 4
 * ranks of one node's NVLink domain (one peer, over NVLink), the expert peers (ranks 4 apart:
 * dp 0, 2, 4, 6 of tp rank 0) span both nodes; at ep 8 a group is 16 ranks, both nodes,
 * 4 of a rank's 7 peers on the other, and there are no expert peers. */
static void test_ep_groups_and_expert_peers_are_placed(void)
{
    const struct {
        int ep, groups, behind, peer_groups;
        enum cost_link link, peers_link;
    } cases[] = {{1, 0, 0, 0, COST_LINK_NONE, COST_LINK_NONE},
                 {2, 8, 1, 4, COST_LINK_NVLINK, COST_LINK_NETWORK},
                 {8, 2, 4, 0, COST_LINK_NETWORK, COST_LINK_NONE}};
    struct topo *t = make_topo(8, NULL, 2, 8, 8);
    struct place_node two[2] = {{.name = "a", .topo = t, .slots = 8},
                                {.name = "b", .topo = t, .slots = 8}};
    struct plan *p = make_plan(8, false);
    for (size_t k = 0; p && k < sizeof cases / sizeof *cases; k++) {
        struct rank_map m;
        struct plait_error err;
        p->parallel.ep = cases[k].ep;
        if (place_ranks(p, 2, 1, 8, two, 2, &bw, &m, &err)) {
            CHECK(0, "ep %d: %s", cases[k].ep, err.text);
            continue;
        }
        const struct place_comm *g = &m.comm_ep, *peers = &m.comm_experts;
        CHECK(m.ep == cases[k].ep && g->groups == cases[k].groups && g->slowest == cases[k].link &&
                  g->peers_behind == cases[k].behind,
              "ep %d: %d groups over %s, %d peers behind", cases[k].ep, g->groups,
              cost_link_name(g->slowest), g->peers_behind);
        CHECK(peers->groups == cases[k].peer_groups && peers->slowest == cases[k].peers_link &&
                  peers->crossing[cases[k].peers_link] == cases[k].peer_groups,
              "ep %d: %d expert peer groups over %s", cases[k].ep, peers->groups,
              cost_link_name(peers->slowest));
        rank_map_free(&m);
    }
    plan_free(p);
    free_topo(t);
}

/* PLAIT_RANKS_PER_GPU = 2 on two GPUs in separate domains: slots r·2 and r·2+1 are GPU r,
 * so tp 2 groups share a GPU (the same domain, trivially), their link host memory; each GPU
 * rank's contract carries the sharing and its own GPU's index; nccl is refused naming both;
 * K = 1 on the same node is one rank per GPU, as always, and says nothing of sharing. */
static void test_ranks_share_a_gpu_k_slots_each(void)
{
    static const int apart[] = {0, 1};
    struct topo *t = make_topo(2, apart, 1, 8, 1);
    struct place_node node = {.name = "ws", .topo = t, .slots = 4, .ranks_per_gpu = 2};
    const char *cuda[] = {"parallel.device=cuda", "parallel.backend=socket"};
    struct plait_error err;
    struct plan *p = small_plan(4, cuda, 2, &err);
    CHECK(p, "%s", err.text);
    if (!p) return;
    struct rank_map m;
    CHECK(place_ranks(p, 2, 1, 2, &node, 1, &bw, &m, &err) == 0, "%s", err.text);
    for (int r = 0; r < m.world; r++)
        CHECK(m.ranks[r].gpu == r / 2, "rank %d on GPU %d, want %d", r, m.ranks[r].gpu, r / 2);
    CHECK(m.gpu_sharing == 2, "sharing %d", m.gpu_sharing);
    CHECK(m.comm_tp.slowest == COST_LINK_MEMORY, "tp on one GPU over %d", m.comm_tp.slowest);
    CHECK(m.comm_dp.slowest == COST_LINK_PCIE, "dp across the GPUs over %d", m.comm_dp.slowest);
    char **env = place_rank_env(&m, &node, 3);
    CHECK(env && !strcmp(env_value(env, PLAIT_ENV_DEVICE), "1") &&
              !strcmp(env_value(env, PLAIT_ENV_GPU_SHARED_BY), "2"),
          "rank 3: device %s, shared by %s", env ? env_value(env, PLAIT_ENV_DEVICE) : "?",
          env ? env_value(env, PLAIT_ENV_GPU_SHARED_BY) : "?");
    place_env_free(env);
    rank_map_free(&m);
    /* 5 ranks are more than 2 GPUs of 2 slots */
    node.slots = 5;
    CHECK(place_ranks(p, 1, 1, 5, &node, 1, &bw, &m, &err) != 0 &&
              strstr(err.text, "has 2 GPUs of 2 ranks each (PLAIT_RANKS_PER_GPU=2)"),
          "%s", err.text);
    node.slots = 4;
    p->parallel.backend = PLAN_BACKEND_NCCL;
    CHECK(place_ranks(p, 2, 1, 1, &node, 1, &bw, &m, &err) != 0 &&
              strstr(err.text, "PLAIT_RANKS_PER_GPU=2 puts 2 ranks on each GPU of node ws, but "
                               "parallel.backend \"nccl\" takes one rank per GPU"),
          "%s", err.text);
    node = (struct place_node){.name = "ws", .topo = t, .slots = 2, .ranks_per_gpu = 1};
    CHECK(place_ranks(p, 1, 1, 2, &node, 1, &bw, &m, &err) == 0, "%s", err.text);
    CHECK(m.ranks[0].gpu == 0 && m.ranks[1].gpu == 1 && m.gpu_sharing == 1, "K = 1: GPUs %d %d",
          m.ranks[0].gpu, m.ranks[1].gpu);
    env = place_rank_env(&m, &node, 1);
    CHECK(env && !env_value(env, PLAIT_ENV_GPU_SHARED_BY), "K = 1 names the sharing");
    place_env_free(env);
    rank_map_free(&m);
    plan_free(p);
    free_topo(t);
}

int main(void)
{
    RUN(test_megatron_order_tp_fastest_then_dp_then_pp);
    RUN(test_pipeline_stages_share_a_node_when_they_fit);
    RUN(test_tp_group_stays_in_nvlink_clique_with_interleaved_indices);
    RUN(test_refusals_say_why);
    RUN(test_nics_nearest_first_then_spread);
    RUN(test_cpu_sets_are_local_and_disjoint);
    RUN(test_gpu_less_nodes_run_cpu_ranks);
    RUN(test_heterogeneous_nodes_and_granted_gpus);
    RUN(test_device_cpu_runs_cpu_ranks_on_gpu_nodes);
    RUN(test_more_ranks_than_cores_share_whole_cores_round_robin);
    RUN(test_cuda_on_a_gpu_less_node_is_refused);
    RUN(test_cp_groups_sit_next_to_tp_on_one_node);
    RUN(test_cp_counts_in_the_world_and_the_shard_group);
    RUN(test_ep_groups_and_expert_peers_are_placed);
    RUN(test_ranks_share_a_gpu_k_slots_each);
    return check_exit_code();
}
