/* test_topo.c — topology discovery on the hwloc XML fixtures in tests/topo/<case>/ (made by
 * tests/topo/make_fixtures.py, see there for how each machine is modelled) and on this
 * machine: GPUs and their CUDA order, NVLink closed through NVSwitches and cut into domains,
 * NICs and their kinds, GPU-NIC affinity, cores and CPU lists, and the errors for bad input.
 * Run from the repo root. */
#include <hwloc.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fsutil.h"
#include "common/place/gpu.h"
#include "common/place/topo.h"
#include "tests/unit/check.h"

#define FIXTURES "tests/topo"
#define H100 FIXTURES "/h100_sxm8/topology.xml"
#define ISLANDS FIXTURES "/islands8_interleaved/topology.xml"
#define PCIE4 FIXTURES "/pcie4_nvbridge/topology.xml"
#define NVSWITCH16 FIXTURES "/nvswitch16/topology.xml"
#define CPU_ONLY FIXTURES "/cpu_only/topology.xml"
#define PCI_IDS_ONLY FIXTURES "/pci_ids_only/topology.xml"
#define OPENCL_L4 FIXTURES "/opencl_l4/topology.xml"

static const char *const fixtures[] = {H100,     ISLANDS,      PCIE4,    NVSWITCH16,
                                       CPU_ONLY, PCI_IDS_ONLY, OPENCL_L4};
#define N_FIXTURES (int)(sizeof fixtures / sizeof fixtures[0])

/* ---- helpers ----------------------------------------------------------------------------- */

/* Loads a fixture; on failure reports it and returns false (t is then zeroed). */
static bool load(struct topo *t, const char *path)
{
    struct plait_error err = {0};
    int rc = topo_load(t, path, &err);
    CHECK(rc == 0, "topo_load(%s): %s", path ? path : "NULL", err.text);
    return rc == 0;
}

static double bw(const struct topo *t, int a, int b)
{
    return t->nvlink_gbps[a * t->n_gpus + b];
}

static enum topo_affinity aff(const struct topo *t, int gpu, int nic)
{
    return t->gpu_nic[gpu * t->n_nics + nic];
}

static int nic_named(const struct topo *t, const char *name)
{
    for (int k = 0; k < t->n_nics; k++)
        if (strcmp(t->nics[k].name, name) == 0) return k;
    return -1;
}

static void check_domain(const struct topo *t, int d, const int *gpus, int n)
{
    CHECK(d < t->n_domains, "domain %d of %d", d, t->n_domains);
    if (d >= t->n_domains) return;
    const struct topo_domain *dom = &t->domains[d];
    CHECK(dom->n_gpus == n, "domain %d has %d GPUs, want %d", d, dom->n_gpus, n);
    for (int k = 0; k < n && k < dom->n_gpus; k++) {
        CHECK(dom->gpus[k] == gpus[k], "domain %d GPU %d is %d, want %d", d, k, dom->gpus[k],
              gpus[k]);
        CHECK(t->gpus[gpus[k]].domain == d, "GPU %d says domain %d, want %d", gpus[k],
              t->gpus[gpus[k]].domain, d);
    }
}

/* Writes text to a fresh temporary file; returns its path in `path` (or false). */
static bool write_temp(const char *text, char path[64])
{
    snprintf(path, 64, "/tmp/test_topo_XXXXXX");
    int fd = mkstemp(path);
    if (fd < 0) return false;
    FILE *f = fdopen(fd, "w");
    if (!f) {
        close(fd);
        return false;
    }
    bool ok = fputs(text, f) >= 0;
    return fclose(f) == 0 && ok;
}

/* The fixture at `path` with every line containing `drop` removed and every `from` replaced
 * by `to` (either may be NULL), written to a temporary file. */
static bool edited_fixture(const char *path, const char *drop, const char *from, const char *to,
                           char out[64])
{
    char *text = fs_read_all(path, NULL, NULL);
    if (!text) return false;
    size_t n = strlen(text);
    char *edited = malloc(2 * n + 1);
    if (!edited) {
        free(text);
        return false;
    }
    size_t len = 0;
    for (char *line = text; *line;) {
        char *end = strchr(line, '\n');
        size_t line_len = end ? (size_t)(end - line + 1) : strlen(line);
        char saved = line[line_len];
        line[line_len] = '\0';
        if (!drop || !strstr(line, drop)) {
            for (char *p = line; *p;) {
                if (from && strncmp(p, from, strlen(from)) == 0) {
                    memcpy(edited + len, to, strlen(to));
                    len += strlen(to);
                    p += strlen(from);
                } else {
                    edited[len++] = *p++;
                }
            }
        }
        line[line_len] = saved;
        line += line_len;
    }
    edited[len] = '\0';
    bool ok = write_temp(edited, out);
    free(edited);
    free(text);
    return ok;
}

/* ---- every fixture ----------------------------------------------------------------------- */

/* hwloc's own lstopo reads every fixture (they are real hwloc XML) */
static void test_fixtures_load_in_lstopo(void)
{
    if (system("command -v lstopo-no-graphics >/dev/null 2>&1") != 0)
        SKIP("lstopo-no-graphics is not installed (Debian's hwloc-nox)");
    for (int i = 0; i < N_FIXTURES; i++) {
        char cmd[512];
        snprintf(cmd, sizeof cmd,
                 "lstopo-no-graphics -i %s --of console --whole-io >/dev/null 2>&1", fixtures[i]);
        CHECK(system(cmd) == 0, "lstopo-no-graphics rejects %s", fixtures[i]);
    }
}

static void test_fixtures_load_in_topo_load(void)
{
    for (int i = 0; i < N_FIXTURES; i++) {
        struct topo t;
        if (!load(&t, fixtures[i])) continue;
        CHECK(strcmp(t.source, fixtures[i]) == 0, "source %s", t.source);
        CHECK(t.hostname[0] != '\0', "%s: no hostname", fixtures[i]);
        CHECK(t.n_cores > 0 && t.n_numa > 0, "%s: %d cores, %d NUMA nodes", fixtures[i], t.n_cores,
              t.n_numa);
        for (int g = 0; g < t.n_gpus; g++) {
            CHECK(t.gpus[g].cuda_index == g, "%s: GPU %d has CUDA index %d", fixtures[i], g,
                  t.gpus[g].cuda_index);
            CHECK(bw(&t, g, g) == 0, "%s: diagonal %g", fixtures[i], bw(&t, g, g));
            for (int h = 0; h < t.n_gpus; h++)
                CHECK(bw(&t, g, h) == bw(&t, h, g), "%s: asymmetric %d-%d", fixtures[i], g, h);
        }
        topo_free(&t);
    }
}

/* ---- h100_sxm8 ----------------------------------------------------------------------------- */

static void test_h100_gpus_in_cuda_order_with_memory_model_and_locality(void)
{
    static const char *const busids[] = {"0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0",
                                         "0000:5d:00.0", "0000:9a:00.0", "0000:ab:00.0",
                                         "0000:ba:00.0", "0000:db:00.0"};
    struct topo t;
    if (!load(&t, H100)) return;
    CHECK(strcmp(t.hostname, "h100-sxm8-node01") == 0, "hostname %s", t.hostname);
    CHECK(t.n_gpus == 8, "%d GPUs", t.n_gpus);
    for (int g = 0; g < t.n_gpus && g < 8; g++) {
        const struct topo_gpu *gpu = &t.gpus[g];
        CHECK(strcmp(gpu->busid, busids[g]) == 0, "GPU %d at %s", g, gpu->busid);
        CHECK(gpu->memory_bytes == 81559ull << 20, "GPU %d memory %llu", g,
              (unsigned long long)gpu->memory_bytes);
        CHECK(strcmp(gpu->model, "NVIDIA H100 80GB HBM3") == 0, "GPU %d model %s", g, gpu->model);
        CHECK(gpu->numa == g / 4, "GPU %d on NUMA %d", g, gpu->numa);
        CHECK(gpu->n_local_cores == 56, "GPU %d has %d local cores", g, gpu->n_local_cores);
        char cpus[64];
        topo_cpu_list(&t, gpu->local_cores, gpu->n_local_cores, cpus, sizeof cpus);
        CHECK(strcmp(cpus, g < 4 ? "0-55,112-167" : "56-111,168-223") == 0, "GPU %d cpus %s", g,
              cpus);
    }
    topo_free(&t);
}

static void test_h100_cores_and_numa(void)
{
    struct topo t;
    if (!load(&t, H100)) return;
    CHECK(t.n_cores == 112 && t.n_numa == 2, "%d cores, %d NUMA", t.n_cores, t.n_numa);
    for (int c = 0; c < t.n_cores; c++) {
        const struct topo_core *core = &t.cores[c];
        CHECK(core->n_pus == 2 && core->pus[0] == c && core->pus[1] == c + 112, "core %d PUs %d,%d",
              c, core->pus[0], core->n_pus > 1 ? core->pus[1] : -1);
        CHECK(core->numa == c / 56 && core->package == c / 56, "core %d numa %d package %d", c,
              core->numa, core->package);
        CHECK(core->os_index == c % 56, "core %d os_index %d", c, core->os_index);
    }
    topo_free(&t);
}

static void test_h100_nvlink_through_nvswitches_is_450_gbps_one_domain(void)
{
    struct topo t;
    if (!load(&t, H100)) return;
    for (int a = 0; a < t.n_gpus; a++)
        for (int b = 0; b < t.n_gpus; b++)
            if (a != b) CHECK(bw(&t, a, b) == 450.0, "%d-%d: %g GB/s", a, b, bw(&t, a, b));
    CHECK(t.n_domains == 1, "%d domains", t.n_domains);
    check_domain(&t, 0, (const int[]){0, 1, 2, 3, 4, 5, 6, 7}, 8);
    topo_free(&t);
}

static void test_h100_nics_infiniband_first_with_netdevs(void)
{
    static const char *const netdevs[] = {"ibp25s0",  "ibp43s0",  "ibp59s0",  "ibp94s0",
                                          "ibp155s0", "ibp172s0", "ibp187s0", "ibp220s0"};
    struct topo t;
    if (!load(&t, H100)) return;
    CHECK(t.n_nics == 9, "%d NICs", t.n_nics);
    for (int k = 0; k < 8 && k < t.n_nics; k++) {
        char name[16];
        snprintf(name, sizeof name, "mlx5_%d", k);
        CHECK(strcmp(t.nics[k].name, name) == 0, "NIC %d is %s", k, t.nics[k].name);
        CHECK(t.nics[k].kind == TOPO_NIC_INFINIBAND, "%s kind %d", name, t.nics[k].kind);
        CHECK(strcmp(t.nics[k].netdev, netdevs[k]) == 0, "%s netdev %s", name, t.nics[k].netdev);
        CHECK(t.nics[k].numa == k / 4, "%s numa %d", name, t.nics[k].numa);
    }
    if (t.n_nics == 9) {
        const struct topo_nic *eth = &t.nics[8];
        CHECK(strcmp(eth->name, "eno1") == 0 && eth->kind == TOPO_NIC_ETHERNET &&
                  eth->netdev[0] == '\0' && strcmp(eth->busid, "0000:01:00.0") == 0 &&
                  eth->numa == 0,
              "last NIC %s kind %d netdev '%s' at %s numa %d", eth->name, eth->kind, eth->netdev,
              eth->busid, eth->numa);
        CHECK(strcmp(t.nics[0].busid, "0000:19:00.0") == 0, "mlx5_0 at %s", t.nics[0].busid);
    }
    topo_free(&t);
}

static void test_h100_each_gpu_shares_a_pcie_switch_with_its_nic(void)
{
    struct topo t;
    if (!load(&t, H100)) return;
    if (t.n_gpus != 8 || t.n_nics != 9) goto out;
    for (int g = 0; g < 8; g++) {
        for (int k = 0; k < 8; k++) {
            /* one host bridge per GPU+NIC switch: the same socket is only the same NUMA node */
            enum topo_affinity want = g == k           ? TOPO_SAME_PCIE_SWITCH
                                      : g / 4 == k / 4 ? TOPO_SAME_NUMA
                                                       : TOPO_OTHER;
            CHECK(aff(&t, g, k) == want, "GPU %d - mlx5_%d: %d, want %d", g, k, aff(&t, g, k),
                  want);
        }
        enum topo_affinity eno1 = g < 4 ? TOPO_SAME_NUMA : TOPO_OTHER;
        CHECK(aff(&t, g, 8) == eno1, "GPU %d - eno1: %d", g, aff(&t, g, 8));
    }
out:
    topo_free(&t);
}

/* A cudaN beyond the node's GPUs (an edited XML) once gave the next GPU index
 * INT_MAX + 1, so CUDA_VISIBLE_DEVICES read "...,-2147483648". */
static void test_cuda_indexes_stay_within_the_nodes_gpus(void)
{
    char path[64];
    struct topo t;
    if (!edited_fixture(H100, NULL, "name=\"cuda3\"", "name=\"cuda2147483646\"", path)) {
        CHECK(0, "cannot write the edited fixture");
        return;
    }
    bool ok = load(&t, path);
    unlink(path);
    if (!ok) return;
    CHECK(t.n_gpus == 8, "%d GPUs", t.n_gpus);
    bool seen[8] = {false};
    for (int g = 0; g < t.n_gpus; g++) {
        int i = t.gpus[g].cuda_index;
        CHECK(i >= 0 && i < t.n_gpus && !seen[i], "GPU %s: CUDA index %d", t.gpus[g].busid, i);
        if (i >= 0 && i < 8) seen[i] = true;
        /* inconsistent numbers: PCI bus order for all */
        if (g > 0)
            CHECK(strcmp(t.gpus[g - 1].busid, t.gpus[g].busid) < 0, "%s before %s",
                  t.gpus[g - 1].busid, t.gpus[g].busid);
    }
    topo_free(&t);
}

/* ---- islands8_interleaved ---------------------------------------------------------------- */

static void test_islands_interleaved_cuda_indices_give_two_domains(void)
{
    struct topo t;
    if (!load(&t, ISLANDS)) return;
    CHECK(t.n_gpus == 8, "%d GPUs", t.n_gpus);
    if (t.n_gpus != 8) goto out;
    for (int a = 0; a < 8; a++)
        for (int b = 0; b < 8; b++) {
            double want = a == b ? 0 : a % 2 == b % 2 ? 50.0 : 0.0;
            CHECK(bw(&t, a, b) == want, "%d-%d: %g GB/s, want %g", a, b, bw(&t, a, b), want);
        }
    CHECK(t.n_domains == 2, "%d domains", t.n_domains);
    check_domain(&t, 0, (const int[]){0, 2, 4, 6}, 4);
    check_domain(&t, 1, (const int[]){1, 3, 5, 7}, 4);
    /* only NVML OS devices: CUDA order is PCI bus order, memory unknown, model from NVML */
    for (int g = 1; g < 8; g++)
        CHECK(strcmp(t.gpus[g - 1].busid, t.gpus[g].busid) < 0, "GPU %d (%s) before %d (%s)", g - 1,
              t.gpus[g - 1].busid, g, t.gpus[g].busid);
    for (int g = 0; g < 8; g++) {
        CHECK(t.gpus[g].memory_bytes == 0, "GPU %d memory %llu", g,
              (unsigned long long)t.gpus[g].memory_bytes);
        CHECK(strcmp(t.gpus[g].model, "Tesla V100-SXM2-32GB") == 0, "GPU %d model %s", g,
              t.gpus[g].model);
        CHECK(t.gpus[g].n_local_cores == 20 && t.gpus[g].numa == g / 4, "GPU %d: %d cores numa %d",
              g, t.gpus[g].n_local_cores, t.gpus[g].numa);
    }
out:
    topo_free(&t);
}

static void test_islands_affinity_switch_host_bridge_socket(void)
{
    struct topo t;
    if (!load(&t, ISLANDS)) return;
    CHECK(t.n_nics == 4, "%d NICs", t.n_nics);
    if (t.n_gpus != 8 || t.n_nics != 4) goto out;
    for (int k = 0; k < 4; k++) {
        char name[16], netdev[16];
        snprintf(name, sizeof name, "mlx5_%d", k);
        snprintf(netdev, sizeof netdev, "ib%d", k);
        CHECK(strcmp(t.nics[k].name, name) == 0 && strcmp(t.nics[k].netdev, netdev) == 0 &&
                  t.nics[k].kind == TOPO_NIC_INFINIBAND,
              "NIC %d: %s/%s kind %d", k, t.nics[k].name, t.nics[k].netdev, t.nics[k].kind);
    }
    /* two GPUs and one HCA per PLX switch, two switches per socket on one host bridge */
    for (int g = 0; g < 8; g++)
        for (int k = 0; k < 4; k++) {
            enum topo_affinity want = g / 2 == k       ? TOPO_SAME_PCIE_SWITCH
                                      : g / 4 == k / 2 ? TOPO_SAME_HOST_BRIDGE
                                                       : TOPO_OTHER;
            CHECK(aff(&t, g, k) == want, "GPU %d - mlx5_%d: %d, want %d", g, k, aff(&t, g, k),
                  want);
        }
out:
    topo_free(&t);
}

/* ---- pcie4_nvbridge ------------------------------------------------------------------------ */

static void test_pcie4_bridged_pairs_from_pci_devices_without_driver(void)
{
    static const char *const busids[] = {"0000:43:00.0", "0000:44:00.0", "0000:48:00.0",
                                         "0000:49:00.0"};
    struct topo t;
    if (!load(&t, PCIE4)) return;
    /* the GPUs' HDMI audio functions (class 0403) are not GPUs */
    CHECK(t.n_gpus == 4, "%d GPUs", t.n_gpus);
    if (t.n_gpus != 4) goto out;
    for (int g = 0; g < 4; g++) {
        CHECK(strcmp(t.gpus[g].busid, busids[g]) == 0, "GPU %d at %s", g, t.gpus[g].busid);
        CHECK(strcmp(t.gpus[g].model, "GA102GL [RTX A6000]") == 0, "GPU %d model %s", g,
              t.gpus[g].model);
        CHECK(t.gpus[g].memory_bytes == 0 && t.gpus[g].numa == 0 && t.gpus[g].n_local_cores == 32,
              "GPU %d: memory %llu numa %d cores %d", g, (unsigned long long)t.gpus[g].memory_bytes,
              t.gpus[g].numa, t.gpus[g].n_local_cores);
    }
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++) {
            double want = a != b && a / 2 == b / 2 ? 100.0 : 0.0;
            CHECK(bw(&t, a, b) == want, "%d-%d: %g GB/s, want %g", a, b, bw(&t, a, b), want);
        }
    CHECK(t.n_domains == 2, "%d domains", t.n_domains);
    check_domain(&t, 0, (const int[]){0, 1}, 2);
    check_domain(&t, 1, (const int[]){2, 3}, 2);
    char cpus[64];
    topo_cpu_list(&t, t.gpus[0].local_cores, t.gpus[0].n_local_cores, cpus, sizeof cpus);
    CHECK(strcmp(cpus, "0-63") == 0, "GPU 0 cpus %s", cpus);
out:
    topo_free(&t);
}

static void test_pcie4_infiniband_and_roce_nics(void)
{
    struct topo t;
    if (!load(&t, PCIE4)) return;
    /* the RoCE port's Ethernet interface is its netdev, not a NIC of its own */
    CHECK(t.n_nics == 2, "%d NICs", t.n_nics);
    if (t.n_nics != 2 || t.n_gpus != 4) goto out;
    CHECK(strcmp(t.nics[0].name, "mlx5_0") == 0 && t.nics[0].kind == TOPO_NIC_INFINIBAND &&
              strcmp(t.nics[0].netdev, "ibp69s0") == 0 &&
              strcmp(t.nics[0].busid, "0000:45:00.0") == 0,
          "NIC 0: %s kind %d netdev %s at %s", t.nics[0].name, t.nics[0].kind, t.nics[0].netdev,
          t.nics[0].busid);
    CHECK(strcmp(t.nics[1].name, "mlx5_1") == 0 && t.nics[1].kind == TOPO_NIC_ROCE &&
              strcmp(t.nics[1].netdev, "enp74s0np0") == 0,
          "NIC 1: %s kind %d netdev %s", t.nics[1].name, t.nics[1].kind, t.nics[1].netdev);
    /* both switches on root ports of one host bridge */
    for (int g = 0; g < 4; g++)
        for (int k = 0; k < 2; k++) {
            enum topo_affinity want = g / 2 == k ? TOPO_SAME_PCIE_SWITCH : TOPO_SAME_HOST_BRIDGE;
            CHECK(aff(&t, g, k) == want, "GPU %d - NIC %d: %d, want %d", g, k, aff(&t, g, k), want);
        }
out:
    topo_free(&t);
}

/* hwloc writes no link layer for OpenFabrics devices: without Port1LinkLayer the kind comes
 * from the port's network interface (20-byte IPoIB vs 6-byte Ethernet address), and without
 * that from the PCI class (Ethernet 0200 vs InfiniBand 0207 controller). */
static void test_roce_recognised_without_link_layer_info(void)
{
    char no_layer[64], no_netdev[64];
    bool ok = edited_fixture(PCIE4, "LinkLayer", NULL, NULL, no_layer);
    CHECK(ok, "cannot write a temporary fixture");
    if (!ok) return;
    struct topo t;
    if (load(&t, no_layer)) {
        int ib = nic_named(&t, "mlx5_0"), roce = nic_named(&t, "mlx5_1");
        CHECK(ib >= 0 && t.nics[ib].kind == TOPO_NIC_INFINIBAND, "mlx5_0 kind %d",
              ib >= 0 ? (int)t.nics[ib].kind : -1);
        CHECK(roce >= 0 && t.nics[roce].kind == TOPO_NIC_ROCE, "mlx5_1 kind %d",
              roce >= 0 ? (int)t.nics[roce].kind : -1);
        topo_free(&t);
    }
    /* the network interfaces turned into DMA devices: only the PCI class is left */
    ok = edited_fixture(no_layer, NULL, "osdev_type=\"2\"", "osdev_type=\"4\"", no_netdev);
    CHECK(ok, "cannot write a temporary fixture");
    if (ok && load(&t, no_netdev)) {
        CHECK(t.n_nics == 2, "%d NICs", t.n_nics);
        int ib = nic_named(&t, "mlx5_0"), roce = nic_named(&t, "mlx5_1");
        CHECK(ib >= 0 && t.nics[ib].kind == TOPO_NIC_INFINIBAND && !t.nics[ib].netdev[0],
              "mlx5_0 kind %d", ib >= 0 ? (int)t.nics[ib].kind : -1);
        CHECK(roce >= 0 && t.nics[roce].kind == TOPO_NIC_ROCE, "mlx5_1 kind %d",
              roce >= 0 ? (int)t.nics[roce].kind : -1);
        topo_free(&t);
    }
    unlink(no_layer);
    if (ok) unlink(no_netdev);
}

/* ---- nvswitch16 ---------------------------------------------------------------------------- */

static void test_nvswitch16_two_baseboards_are_one_domain(void)
{
    struct topo t;
    if (!load(&t, NVSWITCH16)) return;
    CHECK(t.n_gpus == 16, "%d GPUs", t.n_gpus);
    if (t.n_gpus != 16) goto out;
    for (int a = 0; a < 16; a++)
        for (int b = 0; b < 16; b++)
            if (a != b) CHECK(bw(&t, a, b) == 150.0, "%d-%d: %g GB/s", a, b, bw(&t, a, b));
    CHECK(t.n_domains == 1 && t.domains[0].n_gpus == 16, "%d domains", t.n_domains);
    for (int g = 0; g < 16; g++) {
        CHECK(t.gpus[g].memory_bytes == 32510ull << 20, "GPU %d memory %llu", g,
              (unsigned long long)t.gpus[g].memory_bytes);
        CHECK(strcmp(t.gpus[g].model, "Tesla V100-SXM3-32GB-H") == 0, "GPU %d model %s", g,
              t.gpus[g].model);
        CHECK(t.gpus[g].numa == g / 8 && t.gpus[g].n_local_cores == 24, "GPU %d numa %d cores %d",
              g, t.gpus[g].numa, t.gpus[g].n_local_cores);
    }
    CHECK(t.n_nics == 8, "%d NICs", t.n_nics);
    if (t.n_nics != 8) goto out;
    /* a GPU pair and its HCA per leaf switch, two leaves per level-1 switch (host bridge),
     * two host bridges per socket */
    for (int g = 0; g < 16; g++)
        for (int k = 0; k < 8; k++) {
            enum topo_affinity want = g / 4 == k / 2   ? TOPO_SAME_PCIE_SWITCH
                                      : g / 8 == k / 4 ? TOPO_SAME_NUMA
                                                       : TOPO_OTHER;
            CHECK(aff(&t, g, k) == want, "GPU %d - mlx5_%d: %d, want %d", g, k, aff(&t, g, k),
                  want);
        }
out:
    topo_free(&t);
}

/* Our closure through NVSwitches against hwloc's own TRANSITIVE_CLOSURE transform. */
static void test_nvlink_closure_matches_hwloc_transform(void)
{
#if HWLOC_API_VERSION >= 0x00020500
    const char *const paths[] = {H100, NVSWITCH16};
    for (int p = 0; p < 2; p++) {
        struct topo t;
        if (!load(&t, paths[p])) continue;
        hwloc_topology_t hw = NULL;
        struct hwloc_distances_s *d = NULL;
        unsigned nr = 1;
        CHECK(hwloc_topology_init(&hw) == 0, "hwloc_topology_init");
        CHECK(hwloc_topology_set_xml(hw, paths[p]) == 0, "set_xml %s", paths[p]);
        CHECK(hwloc_topology_set_io_types_filter(hw, HWLOC_TYPE_FILTER_KEEP_ALL) == 0, "filter");
        CHECK(hwloc_topology_load(hw) == 0, "load %s", paths[p]);
        CHECK(hwloc_distances_get_by_name(hw, "NVLinkBandwidth", &nr, &d, 0) == 0 && nr == 1,
              "%s: %u matrices", paths[p], nr);
        if (nr == 1 && d) {
            int transformed = hwloc_distances_transform(
                hw, d, HWLOC_DISTANCES_TRANSFORM_TRANSITIVE_CLOSURE, NULL, 0);
            CHECK(transformed == 0, "transform");
            int compared = 0;
            for (unsigned i = 0; transformed == 0 && i < d->nbobjs; i++) {
                for (unsigned j = 0; j < d->nbobjs; j++) {
                    hwloc_obj_t a = d->objs[i]->parent, b = d->objs[j]->parent;
                    if (i == j || d->objs[i]->type != HWLOC_OBJ_OS_DEVICE ||
                        d->objs[j]->type != HWLOC_OBJ_OS_DEVICE)
                        continue;
                    char busa[16], busb[16];
                    snprintf(busa, sizeof busa, "%04x:%02x:%02x.%x", a->attr->pcidev.domain,
                             a->attr->pcidev.bus, a->attr->pcidev.dev, a->attr->pcidev.func);
                    snprintf(busb, sizeof busb, "%04x:%02x:%02x.%x", b->attr->pcidev.domain,
                             b->attr->pcidev.bus, b->attr->pcidev.dev, b->attr->pcidev.func);
                    int ga = -1, gb = -1;
                    for (int g = 0; g < t.n_gpus; g++) {
                        if (strcmp(t.gpus[g].busid, busa) == 0) ga = g;
                        if (strcmp(t.gpus[g].busid, busb) == 0) gb = g;
                    }
                    CHECK(ga >= 0 && gb >= 0, "%s or %s not a GPU", busa, busb);
                    if (ga < 0 || gb < 0) continue;
                    double want = (double)d->values[i * d->nbobjs + j] / 1000.0;
                    CHECK(bw(&t, ga, gb) == want, "%s: %d-%d %g GB/s, hwloc says %g", paths[p], ga,
                          gb, bw(&t, ga, gb), want);
                    compared++;
                }
            }
            CHECK(compared == t.n_gpus * (t.n_gpus - 1), "%s: compared %d pairs", paths[p],
                  compared);
            hwloc_distances_release(hw, d);
        }
        if (hw) hwloc_topology_destroy(hw);
        topo_free(&t);
    }
#else
    SKIP("hwloc older than 2.5 has no distances transform");
#endif
}

#if HWLOC_API_VERSION >= 0x00020500
/* The islands fixture with its NVLinkBandwidth matrix (between nvml0..7) replaced by `mbps`,
 * written by hwloc itself to a temporary file. */
static bool islands_with_matrix(hwloc_uint64_t mbps[64], char out[64])
{
    hwloc_topology_t hw = NULL;
    struct hwloc_distances_s *old = NULL;
    hwloc_obj_t nvml[8] = {NULL};
    unsigned nr = 1;
    bool ok = hwloc_topology_init(&hw) == 0 && hwloc_topology_set_xml(hw, ISLANDS) == 0 &&
              hwloc_topology_set_io_types_filter(hw, HWLOC_TYPE_FILTER_KEEP_ALL) == 0 &&
              hwloc_topology_load(hw) == 0 &&
              hwloc_distances_get_by_name(hw, "NVLinkBandwidth", &nr, &old, 0) == 0 && nr == 1 &&
              hwloc_distances_release_remove(hw, old) == 0;
    for (hwloc_obj_t o = NULL; ok && (o = hwloc_get_next_osdev(hw, o));) {
        unsigned n;
        if (o->name && sscanf(o->name, "nvml%u", &n) == 1 && n < 8) nvml[n] = o;
    }
    for (int i = 0; i < 8; i++) ok = ok && nvml[i];
    hwloc_distances_add_handle_t h =
        ok ? hwloc_distances_add_create(
                 hw, "NVLinkBandwidth",
                 HWLOC_DISTANCES_KIND_FROM_OS | HWLOC_DISTANCES_KIND_MEANS_BANDWIDTH, 0)
           : NULL;
    ok = ok && h && hwloc_distances_add_values(hw, h, 8, nvml, mbps, 0) == 0 &&
         hwloc_distances_add_commit(hw, h, 0) == 0;
    if (ok) {
        snprintf(out, 64, "/tmp/test_topo_XXXXXX");
        int fd = mkstemp(out);
        ok = fd >= 0 && close(fd) == 0 && hwloc_topology_export_xml(hw, out, 0) == 0;
    }
    if (hw) hwloc_topology_destroy(hw);
    return ok;
}

static void check_domains_of_matrix(const char *what, hwloc_uint64_t mbps[64], const int *sizes,
                                    int n_domains, const int *members)
{
    char path[64];
    bool ok = islands_with_matrix(mbps, path);
    CHECK(ok, "%s: cannot write the fixture", what);
    if (!ok) return;
    struct topo t;
    if (load(&t, path)) {
        CHECK(t.n_domains == n_domains, "%s: %d domains, want %d", what, t.n_domains, n_domains);
        for (int d = 0, at = 0; d < n_domains && d < t.n_domains; at += sizes[d], d++)
            check_domain(&t, d, members + at, sizes[d]);
        topo_free(&t);
    }
    unlink(path);
}
#endif

/* Components that are not cliques are cut greedily in CUDA order; lone GPUs stand alone. */
static void test_non_clique_nvlink_is_cut_into_cliques(void)
{
#if HWLOC_API_VERSION >= 0x00020500
    hwloc_uint64_t cube[64] = {0}, ring[64] = {0}, pair[64] = {0};
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 8; j++) {
            /* DGX-1 hybrid cube-mesh: two fully linked quads, plus i <-> i+4 */
            if (i != j && (i / 4 == j / 4 || i % 4 == j % 4)) cube[i * 8 + j] = 50000;
            if ((i + 1) % 8 == j || (j + 1) % 8 == i) ring[i * 8 + j] = 25000;
        }
    pair[0 * 8 + 1] = pair[1 * 8 + 0] = 100000;
    check_domains_of_matrix("cube-mesh", cube, (const int[]){4, 4}, 2,
                            (const int[]){0, 1, 2, 3, 4, 5, 6, 7});
    check_domains_of_matrix("ring", ring, (const int[]){2, 2, 2, 2}, 4,
                            (const int[]){0, 1, 2, 3, 4, 5, 6, 7});
    check_domains_of_matrix("one pair", pair, (const int[]){2, 1, 1, 1, 1, 1, 1}, 7,
                            (const int[]){0, 1, 2, 3, 4, 5, 6, 7});
#else
    SKIP("hwloc older than 2.5 cannot add distances");
#endif
}

/* ---- cpu_only and this machine ----------------------------------------------------------- */

static void test_cpu_only_has_no_gpus_and_one_ethernet_nic(void)
{
    struct topo t;
    if (!load(&t, CPU_ONLY)) return;
    /* the BMC's ASPEED VGA is a display controller, but not an NVIDIA one */
    CHECK(t.n_gpus == 0 && t.gpus == NULL && t.nvlink_gbps == NULL && t.n_domains == 0 &&
              t.gpu_nic == NULL,
          "%d GPUs, %d domains", t.n_gpus, t.n_domains);
    CHECK(t.n_nics == 1, "%d NICs", t.n_nics);
    if (t.n_nics == 1)
        CHECK(strcmp(t.nics[0].name, "ens1f0") == 0 && t.nics[0].kind == TOPO_NIC_ETHERNET &&
                  t.nics[0].numa == 1 && strcmp(t.nics[0].busid, "0000:99:00.0") == 0,
              "NIC %s kind %d numa %d at %s", t.nics[0].name, t.nics[0].kind, t.nics[0].numa,
              t.nics[0].busid);
    CHECK(t.n_cores == 32 && t.n_numa == 2, "%d cores %d NUMA", t.n_cores, t.n_numa);
    int socket0[16], socket1[16];
    for (int c = 0; c < 16; c++) socket0[c] = c, socket1[c] = 16 + c;
    char cpus[64];
    topo_cpu_list(&t, socket0, 16, cpus, sizeof cpus);
    CHECK(strcmp(cpus, "0-15,32-47") == 0, "socket 0: %s", cpus);
    topo_cpu_list(&t, socket1, 16, cpus, sizeof cpus);
    CHECK(strcmp(cpus, "16-31,48-63") == 0, "socket 1: %s", cpus);
    topo_free(&t);
}

/* A network interface hwloc hangs off the machine rather than a PCI device (a bridge, a
 * tunnel) is not a NIC. */
static void test_virtual_interfaces_are_not_nics(void)
{
    char path[64];
    bool ok = edited_fixture(CPU_ONLY, NULL, "<object type=\"Package\" os_index=\"1\"",
                             "<object type=\"OSDev\" gp_index=\"9999\" name=\"docker0\" "
                             "osdev_type=\"2\"><info name=\"Address\" value=\"02:42:ac:11:00:01\"/>"
                             "</object><object type=\"Package\" os_index=\"1\"",
                             path);
    CHECK(ok, "cannot write a temporary fixture");
    if (!ok) return;
    if (system("command -v lstopo-no-graphics >/dev/null 2>&1") == 0) {
        char cmd[256];
        snprintf(cmd, sizeof cmd,
                 "lstopo-no-graphics -i %s --of console --whole-io 2>/dev/null | grep -q docker0",
                 path);
        CHECK(system(cmd) == 0, "hwloc does not show docker0 in %s", path);
    }
    struct topo t;
    if (load(&t, path)) {
        CHECK(t.n_nics == 1 && strcmp(t.nics[0].name, "ens1f0") == 0, "%d NICs, first %s", t.n_nics,
              t.n_nics ? t.nics[0].name : "-");
        topo_free(&t);
    }
    unlink(path);
}

static void test_this_machine_loads(void)
{
    char *saved = getenv("HWLOC_XMLFILE") ? strdup(getenv("HWLOC_XMLFILE")) : NULL;
    unsetenv("HWLOC_XMLFILE");
    struct topo t;
    if (load(&t, NULL)) {
        CHECK(strcmp(t.source, "this machine") == 0, "source %s", t.source);
        CHECK(t.n_cores >= 1 && t.n_numa >= 1, "%d cores %d NUMA", t.n_cores, t.n_numa);
        for (int c = 0; c < t.n_cores; c++) CHECK(t.cores[c].n_pus >= 1, "core %d has no PU", c);
        for (int g = 0; g < t.n_gpus; g++) CHECK(t.gpus[g].domain >= 0, "GPU %d no domain", g);
        char cpus[4096];
        int all[4096];
        int n = t.n_cores < 4096 ? t.n_cores : 4096;
        for (int c = 0; c < n; c++) all[c] = c;
        topo_cpu_list(&t, all, n, cpus, sizeof cpus);
        CHECK(cpus[0] != '\0', "empty CPU list");
        topo_free(&t);
    }
    if (saved) setenv("HWLOC_XMLFILE", saved, 1);
    free(saved);
}

static void test_hwloc_xmlfile_in_the_environment_is_used_and_named(void)
{
    char *saved = getenv("HWLOC_XMLFILE") ? strdup(getenv("HWLOC_XMLFILE")) : NULL;
    setenv("HWLOC_XMLFILE", PCIE4, 1);
    struct topo t;
    if (load(&t, NULL)) {
        CHECK(strcmp(t.source, PCIE4) == 0 && t.n_gpus == 4, "source %s, %d GPUs", t.source,
              t.n_gpus);
        topo_free(&t);
    }
    setenv("HWLOC_XMLFILE", FIXTURES "/missing/topology.xml", 1);
    struct plait_error err = {0};
    CHECK(topo_load(&t, NULL, &err) == -1, "a missing HWLOC_XMLFILE loaded");
    CHECK(strcmp(err.text, FIXTURES "/missing/topology.xml: cannot load hwloc topology: No such "
                                    "file or directory") == 0,
          "error: %s", err.text);
    if (saved)
        setenv("HWLOC_XMLFILE", saved, 1);
    else
        unsetenv("HWLOC_XMLFILE");
    free(saved);
}

/* ---- bad input --------------------------------------------------------------------------- */

static void expect_error(const char *path, const char *want)
{
    struct topo t;
    struct plait_error err = {0};
    int rc = topo_load(&t, path, &err);
    CHECK(rc == -1, "%s loaded", path);
    if (rc == 0) {
        topo_free(&t);
        return;
    }
    char expected[1024];
    snprintf(expected, sizeof expected, "%s: cannot load hwloc topology: %s", path, want);
    CHECK(strcmp(err.text, expected) == 0, "error: %s\n  want: %s", err.text, expected);
    CHECK(t.source == NULL && t.cores == NULL && t.n_gpus == 0, "not zeroed after an error");
}

static void test_bad_inputs_name_the_file_and_the_problem(void)
{
    static const char *const not_topology =
        "not a valid hwloc XML topology (HWLOC_XML_VERBOSE=1 shows why)";
    expect_error("tests/topo/no_such_case/topology.xml", "No such file or directory");
    expect_error("tests/topo", "Is a directory");
    char text[64], plan[64], empty[64];
    if (write_temp("this is not XML at all\n", text)) {
        expect_error(text, not_topology);
        unlink(text);
    }
    if (write_temp("<?xml version=\"1.0\"?>\n<plan><model layers=\"2\"/></plan>\n", plan)) {
        expect_error(plan, not_topology);
        unlink(plan);
    }
    if (write_temp("", empty)) {
        expect_error(empty, not_topology);
        unlink(empty);
    }
    /* a NULL err is allowed */
    struct topo t;
    CHECK(topo_load(&t, "tests/topo/no_such_case/topology.xml", NULL) == -1, "loaded");
}

/* ---- CPU lists and freeing --------------------------------------------------------------- */

static void test_cpu_list_sorts_and_collapses_ranges(void)
{
    struct topo t;
    if (!load(&t, H100)) return;
    char buf[64];
    topo_cpu_list(&t, NULL, 0, buf, sizeof buf);
    CHECK(strcmp(buf, "") == 0, "no cores: '%s'", buf);
    topo_cpu_list(&t, (const int[]){3}, 1, buf, sizeof buf);
    CHECK(strcmp(buf, "3,115") == 0, "one core: %s", buf);
    topo_cpu_list(&t, (const int[]){5, 1, 2, 3, 60, 111}, 6, buf, sizeof buf);
    CHECK(strcmp(buf, "1-3,5,60,111,113-115,117,172,223") == 0, "mixed: %s", buf);
    topo_cpu_list(&t, (const int[]){0, -1, 112, 1}, 4, buf, sizeof buf);
    CHECK(strcmp(buf, "0-1,112-113") == 0, "out-of-range indexes skipped: %s", buf);
    char small[10];
    topo_cpu_list(&t, (const int[]){0, 2, 4, 6}, 4, small, sizeof small);
    CHECK(strcmp(small, "0,2,4,6") == 0, "short buffer keeps whole items: %s", small);
    topo_cpu_list(&t, (const int[]){0, 2, 4, 6, 8}, 5, small, sizeof small);
    CHECK(strcmp(small, "0,2,4,6,8") == 0, "exactly full: %s", small);
    topo_cpu_list(&t, (const int[]){0, 2, 4, 6, 8, 10}, 6, small, sizeof small);
    CHECK(strcmp(small, "0,2,4,6,8") == 0, "cut at an item: %s", small);
    topo_free(&t);
}

static void test_free_is_safe_on_zeroed_and_freed(void)
{
    struct topo t;
    memset(&t, 0, sizeof t);
    topo_free(&t);
    topo_free(NULL);
    if (load(&t, ISLANDS)) {
        topo_free(&t);
        CHECK(t.gpus == NULL && t.n_gpus == 0 && t.source == NULL, "not zeroed");
        topo_free(&t);
    }
}

/* What one node sends another (plait launch in a pod): its topology as XML text, loaded back
 * elsewhere to the same GPUs, domains, NICs and cores; bad text is refused naming its label. */
static void test_exported_xml_text_loads_back_to_the_same_node(void)
{
    const char *const cases[] = {H100, ISLANDS, CPU_ONLY, NULL};
    for (int i = 0; i < 4; i++) { /* NULL: this machine */
        struct topo a, b;
        struct plait_error err = {.text = ""};
        char *xml = NULL;
        size_t bytes = 0;
        CHECK(topo_export_xml(cases[i], &xml, &bytes, &err) == 0, "export %s: %s",
              cases[i] ? cases[i] : "this machine", err.text);
        if (!xml) continue;
        CHECK(bytes == strlen(xml), "%zu bytes, strlen %zu", bytes, strlen(xml));
        int rc = topo_load_xml_text(&b, xml, bytes, "pod 1's topology", &err);
        CHECK(rc == 0, "load back: %s", err.text);
        free(xml);
        if (rc || !load(&a, cases[i])) {
            if (!rc) topo_free(&b);
            continue;
        }
        CHECK(strcmp(b.source, "pod 1's topology") == 0, "source %s", b.source);
        CHECK(strcmp(a.hostname, b.hostname) == 0, "%s / %s", a.hostname, b.hostname);
        CHECK(a.n_cores == b.n_cores && a.n_numa == b.n_numa && a.n_gpus == b.n_gpus &&
                  a.n_domains == b.n_domains && a.n_nics == b.n_nics,
              "%d/%d cores, %d/%d GPUs, %d/%d domains, %d/%d NICs", a.n_cores, b.n_cores, a.n_gpus,
              b.n_gpus, a.n_domains, b.n_domains, a.n_nics, b.n_nics);
        for (int c = 0; c < a.n_cores && c < b.n_cores; c++)
            CHECK(a.cores[c].n_pus == b.cores[c].n_pus && a.cores[c].pus[0] == b.cores[c].pus[0],
                  "core %d", c);
        for (int g = 0; g < a.n_gpus && g < b.n_gpus; g++)
            CHECK(!strcmp(a.gpus[g].busid, b.gpus[g].busid) && a.gpus[g].domain == b.gpus[g].domain,
                  "GPU %d", g);
        int n = a.n_gpus == b.n_gpus ? a.n_gpus * a.n_gpus : 0;
        for (int k = 0; k < n; k++)
            CHECK(a.nvlink_gbps[k] == b.nvlink_gbps[k], "NVLink entry %d", k);
        topo_free(&a);
        topo_free(&b);
    }
    struct topo t;
    struct plait_error err = {.text = ""};
    const char junk[] = "<not a topology/>";
    CHECK(topo_load_xml_text(&t, junk, sizeof junk - 1, "pod 3's topology", &err) == -1,
          "junk accepted");
    CHECK(strstr(err.text, "pod 3's topology") && strstr(err.text, "not a valid hwloc XML"), "%s",
          err.text);
}

/* ---- what a GPU is ------------------------------------------------------------------------ */

/* hwloc's CUDA and NVML OS devices name the H100s and give their memory; plait's table, found
 * by the PCI id, gives their peaks. */
static void test_h100_named_by_hwloc_with_peaks_from_pci_id(void)
{
    struct topo t;
    if (!load(&t, H100)) return;
    for (int g = 0; g < t.n_gpus; g++) {
        const struct topo_gpu *gpu = &t.gpus[g];
        CHECK(gpu->pci_device == 0x2330, "GPU %d pci device %04x", g, gpu->pci_device);
        CHECK(strcmp(gpu->model_source, "hwloc") == 0 && strcmp(gpu->memory_source, "hwloc") == 0,
              "GPU %d sources %s %s", g, gpu->model_source, gpu->memory_source);
        CHECK(gpu->spec && gpu->spec->bf16_tflops == 989.4 && gpu->spec->fp8_tflops == 1978.9 &&
                  gpu->spec->memory_gbps == 3350,
              "GPU %d spec %s", g, gpu->spec ? gpu->spec->name : "none");
    }
    CHECK(topo_gpu_spec(&t, 3) == t.gpus[0].spec, "one model on the node");
    topo_free(&t);
}

/* A node seen without NVIDIA's libraries and without pci.ids (the live H100 box of issue
 * 11): the H100s are named, sized and rated from their PCI id alone; the GPU plait does not
 * know stays unknown (no model, no memory, no peaks). */
static void test_gpus_known_only_by_pci_id(void)
{
    struct topo t;
    if (!load(&t, PCI_IDS_ONLY)) return;
    CHECK(t.n_gpus == 3, "%d GPUs", t.n_gpus);
    for (int g = 0; g < 2 && g < t.n_gpus; g++) {
        const struct topo_gpu *gpu = &t.gpus[g];
        CHECK(strcmp(gpu->model, "NVIDIA H100 80GB HBM3") == 0 &&
                  strcmp(gpu->model_source, "PCI id") == 0,
              "GPU %d model %s from %s", g, gpu->model, gpu->model_source);
        CHECK(gpu->memory_bytes == 80ull << 30 && strcmp(gpu->memory_source, "PCI id") == 0,
              "GPU %d memory %llu from %s", g, (unsigned long long)gpu->memory_bytes,
              gpu->memory_source);
        CHECK(gpu_peak_tflops(gpu->spec, PLAN_PRECISION_BF16) == 989.4 &&
                  gpu_peak_tflops(gpu->spec, PLAN_PRECISION_FP8) == 1978.9,
              "GPU %d peaks", g);
    }
    if (t.n_gpus == 3) {
        const struct topo_gpu *gpu = &t.gpus[2];
        CHECK(gpu->pci_device == 0x2684 && gpu->model[0] == '\0' && gpu->memory_bytes == 0 &&
                  !gpu->spec && !*gpu->model_source && !*gpu->memory_source,
              "unknown GPU: %04x model '%s' memory %llu spec %p", gpu->pci_device, gpu->model,
              (unsigned long long)gpu->memory_bytes, (const void *)gpu->spec);
        /* two models on the node: each rank's own */
        CHECK(topo_gpu_spec(&t, 2) == NULL && topo_gpu_spec(&t, 1) == t.gpus[0].spec,
              "per-GPU spec on a mixed node");
    }
    topo_free(&t);
}

/* hwloc's OpenCL OS devices name the L4s and give their memory (23,034 MiB, before the
 * table's 24 GiB); the PCI id gives the peaks. */
static void test_l4_named_by_hwloc_opencl(void)
{
    struct topo t;
    if (!load(&t, OPENCL_L4)) return;
    CHECK(t.n_gpus == 2, "%d GPUs", t.n_gpus);
    for (int g = 0; g < t.n_gpus; g++) {
        const struct topo_gpu *gpu = &t.gpus[g];
        CHECK(strcmp(gpu->model, "NVIDIA L4") == 0 && strcmp(gpu->model_source, "hwloc") == 0,
              "GPU %d model %s from %s", g, gpu->model, gpu->model_source);
        CHECK(gpu->memory_bytes == 23034ull << 20 && strcmp(gpu->memory_source, "hwloc") == 0,
              "GPU %d memory %llu from %s", g, (unsigned long long)gpu->memory_bytes,
              gpu->memory_source);
        CHECK(gpu_peak_tflops(gpu->spec, PLAN_PRECISION_BF16) == 121 &&
                  gpu_peak_tflops(gpu->spec, PLAN_PRECISION_FP8) == 242.5 &&
                  gpu->spec->memory_gbps == 300,
              "GPU %d peaks", g);
    }
    topo_free(&t);
}

/* Names as NVML, CUDA and pci.ids write them find their table entry by whole words; the
 * variants sharing a word go to the right one, and unknown names to none. */
static void test_gpu_names_find_their_entry(void)
{
    const struct {
        const char *model;
        unsigned pci_device; /* of the entry it must find; 0: none */
    } cases[] = {
        {"NVIDIA H100 80GB HBM3", 0x2330},
        {"GH100 [H100 SXM5 80GB]", 0x2330},
        {"NVIDIA H100 PCIe", 0x2331},
        {"NVIDIA H100 NVL", 0x2321},
        {"NVIDIA H200", 0x2335},
        {"NVIDIA H200 NVL", 0x233b},
        {"NVIDIA H20", 0x2329},
        {"NVIDIA A100-SXM4-40GB", 0x20b0},
        {"NVIDIA A100-SXM4-80GB", 0x20b2},
        {"NVIDIA A100-PCIE-40GB", 0x20b1},
        {"NVIDIA A100 80GB PCIe", 0x20b5},
        {"NVIDIA L40S", 0x26b9},
        {"NVIDIA L4", 0x27b8},
        {"NVIDIA A10", 0x2236},
        {"NVIDIA B200", 0x2901},
        {"NVIDIA A10G", 0},
        {"NVIDIA GeForce RTX 4090", 0},
        {"", 0},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const struct gpu_spec *s = gpu_spec_by_name(cases[k].model);
        unsigned got = s ? s->pci_device : 0;
        CHECK(got == cases[k].pci_device, "%s: entry %04x, want %04x", cases[k].model, got,
              cases[k].pci_device);
        if (cases[k].pci_device)
            CHECK(gpu_spec_by_pci(0x10de, cases[k].pci_device) == s, "%s by PCI id",
                  cases[k].model);
    }
    CHECK(gpu_spec_by_pci(0x8086, 0x2330) == NULL, "another vendor's id");
    /* an A100 has no fp8 tensor cores: fp8 products run at its bf16 rate */
    CHECK(gpu_peak_tflops(gpu_spec_by_pci(0x10de, 0x20b2), PLAN_PRECISION_FP8) == 312,
          "A100 fp8 peak");
    CHECK(gpu_peak_tflops(NULL, PLAN_PRECISION_BF16) == 0, "unknown GPU: no peak");
}

/* MFU by hand: GPT-2 124M has 124,475,904 parameters less the position table (786,432) and
 * the 47 padding rows (36,096): N = 123,653,376; 6·N + 12·12·768·1024 = 741,920,256 +
 * 113,246,208 = 855,166,464 FLOPs per token; 440k tokens/s on one H100 (989.4 TFLOP/s) is
 * 38.03% MFU. */
static void test_mfu_by_hand(void)
{
    struct gpt2_config cfg = {.max_seq_len = 1024,
                              .vocab = 50257,
                              .padded_vocab = 50304,
                              .layers = 12,
                              .heads = 12,
                              .hidden = 768};
    double fpt = gpu_flops_per_token(&cfg, 1024);
    CHECK(fpt == 855166464.0, "flops per token %.0f", fpt);
    double mfu = gpu_mfu(fpt, 440e3, 989.4, 1);
    CHECK(fabs(mfu - 855166464.0 * 440e3 / 989.4e12) < 1e-12 && mfu > 0.38 && mfu < 0.381, "mfu %g",
          mfu);
    CHECK(gpu_mfu(fpt, 440e3, 989.4, 2) == mfu / 2, "two GPUs share the tokens");
    CHECK(gpu_mfu(fpt, 440e3, 0, 1) == 0, "no peak, no MFU");
}

/* Without libnvidia-ml.so.1 (this machine), NVML is simply not there. */
static void test_nvml_absent_degrades(void)
{
    struct gpu_nvml *nvml = gpu_nvml_open();
    if (nvml) { /* a machine with the driver: it must answer for no such bus id */
        char name[96] = "";
        uint64_t bytes = 0;
        CHECK(gpu_nvml_describe(nvml, "ffff:ff:1f.7", name, sizeof name, &bytes) == -1,
              "NVML found a GPU at ffff:ff:1f.7");
        gpu_nvml_close(nvml);
    }
    gpu_nvml_close(NULL);
}

/* A stand-in for libnvidia-ml.so.1 with NVML's C ABI (nvml.h): one H100 at 0000:18:00.0
 * (85,520,809,984 bytes, what NVML reports for an H100 80GB HBM3); INIT_RC makes nvmlInit_v2
 * fail (9: NVML_ERROR_DRIVER_NOT_LOADED), NO_NAME leaves nvmlDeviceGetName out. */
static const char nvml_stub[] =
    "#include <stdio.h>\n#include <strings.h>\n"
    "#ifndef INIT_RC\n#define INIT_RC 0\n#endif\n"
    "typedef struct dev *dev_t_;\n"
    "struct mem { unsigned long long total, free, used; };\n"
    "int nvmlInit_v2(void) { return INIT_RC; }\n"
    "int nvmlShutdown(void) { return 0; }\n"
    "int nvmlDeviceGetHandleByPciBusId_v2(const char *b, dev_t_ *d) {\n"
    "  if (strcasecmp(b, \"0000:18:00.0\") != 0) return 6; *d = (dev_t_)1; return 0; }\n"
    "#ifndef NO_NAME\n"
    "int nvmlDeviceGetName(dev_t_ d, char *n, unsigned len) {\n"
    "  (void)d; snprintf(n, len, \"NVIDIA H100 80GB HBM3\"); return 0; }\n"
    "#endif\n"
    "int nvmlDeviceGetMemoryInfo(dev_t_ d, struct mem *m) {\n"
    "  (void)d; m->total = 85520809984ull; m->free = m->used = 0; return 0; }\n";

/* Builds the stand-in with `flags` into a temporary .so; its path in lib (or false). */
static bool build_nvml_stub(const char *source, const char *flags, char lib[64])
{
    snprintf(lib, 64, "/tmp/test_topo_nvml_XXXXXX");
    int fd = mkstemp(lib);
    if (fd < 0) return false;
    close(fd);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "cc -x c -shared -fPIC %s -o %s %s", flags, lib, source);
    return system(cmd) == 0;
}

/* NVML through dlopen, on a stand-in library: the name and memory of the GPU it knows, -1 for
 * a bus id it does not, and no NVML at all when its library is missing, lacks a symbol, or
 * does not start (no driver). */
static void test_nvml_through_a_stand_in_library(void)
{
    char source[64] = "", lib[64] = "", no_driver[64] = "", no_name[64] = "";
    CHECK(write_temp(nvml_stub, source), "cannot write the stand-in's source");
    bool built = build_nvml_stub(source, "", lib) &&
                 build_nvml_stub(source, "-DINIT_RC=9", no_driver) &&
                 build_nvml_stub(source, "-DNO_NAME", no_name);
    CHECK(built, "cannot build the stand-in NVML with cc");
    if (built) {
        struct gpu_nvml *nvml = gpu_nvml_open_library(lib);
        CHECK(nvml, "the stand-in did not open");
        char name[96] = "";
        uint64_t bytes = 0;
        CHECK(gpu_nvml_describe(nvml, "0000:18:00.0", name, sizeof name, &bytes) == 0 &&
                  strcmp(name, "NVIDIA H100 80GB HBM3") == 0 && bytes == 85520809984ull,
              "0000:18:00.0: '%s' %llu bytes", name, (unsigned long long)bytes);
        CHECK(gpu_nvml_describe(nvml, "0000:2a:00.0", name, sizeof name, &bytes) == -1,
              "a bus id NVML does not know");
        gpu_nvml_close(nvml);
        CHECK(!gpu_nvml_open_library(no_driver), "NVML without its driver opened");
        CHECK(!gpu_nvml_open_library(no_name), "NVML without nvmlDeviceGetName opened");
        CHECK(!gpu_nvml_open_library("/nonexistent/libnvidia-ml.so.1"), "a missing library");
    }
    const char *made[] = {source, lib, no_driver, no_name};
    for (size_t k = 0; k < sizeof made / sizeof made[0]; k++)
        if (*made[k]) unlink(made[k]);
}

int main(void)
{
    RUN(test_fixtures_load_in_lstopo);
    RUN(test_fixtures_load_in_topo_load);
    RUN(test_h100_gpus_in_cuda_order_with_memory_model_and_locality);
    RUN(test_h100_named_by_hwloc_with_peaks_from_pci_id);
    RUN(test_gpus_known_only_by_pci_id);
    RUN(test_l4_named_by_hwloc_opencl);
    RUN(test_gpu_names_find_their_entry);
    RUN(test_mfu_by_hand);
    RUN(test_nvml_absent_degrades);
    RUN(test_nvml_through_a_stand_in_library);
    RUN(test_h100_cores_and_numa);
    RUN(test_h100_nvlink_through_nvswitches_is_450_gbps_one_domain);
    RUN(test_h100_nics_infiniband_first_with_netdevs);
    RUN(test_h100_each_gpu_shares_a_pcie_switch_with_its_nic);
    RUN(test_islands_interleaved_cuda_indices_give_two_domains);
    RUN(test_islands_affinity_switch_host_bridge_socket);
    RUN(test_pcie4_bridged_pairs_from_pci_devices_without_driver);
    RUN(test_pcie4_infiniband_and_roce_nics);
    RUN(test_roce_recognised_without_link_layer_info);
    RUN(test_nvswitch16_two_baseboards_are_one_domain);
    RUN(test_nvlink_closure_matches_hwloc_transform);
    RUN(test_non_clique_nvlink_is_cut_into_cliques);
    RUN(test_cpu_only_has_no_gpus_and_one_ethernet_nic);
    RUN(test_virtual_interfaces_are_not_nics);
    RUN(test_this_machine_loads);
    RUN(test_hwloc_xmlfile_in_the_environment_is_used_and_named);
    RUN(test_bad_inputs_name_the_file_and_the_problem);
    RUN(test_cpu_list_sorts_and_collapses_ranges);
    RUN(test_free_is_safe_on_zeroed_and_freed);
    RUN(test_cuda_indexes_stay_within_the_nodes_gpus);
    RUN(test_exported_xml_text_loads_back_to_the_same_node);
    return check_exit_code();
}
