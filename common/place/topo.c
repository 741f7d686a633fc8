/* topo.c — one node's hardware from hwloc (the live machine, an XML file or XML text, which it
 * also writes) into struct topo: cores and NUMA nodes, NVIDIA GPUs, their NVLink bandwidth closed
 * through NVSwitches and cut into cliques (domains), network adapters, and how far each adapter
 * is from each GPU in the PCI tree. Choosing GPUs, NICs and cores for ranks is place.c. */
#include "common/place/topo.h"

#include <errno.h>
#include <hwloc.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/place/gpu.h" // defines: gpu_spec_by_pci, gpu_spec_by_name, gpu_nvml_*

/* hwloc 2.x and 3.x. We compile against 2.x. hwloc 3.0 turned the OS-device type into a set of
 * flags (attr->osdev.types; a CUDA device is GPU|COPROC) and renamed BLOCK to STORAGE, so
 * `attr->osdev.type == HWLOC_OBJ_OSDEV_...` neither compiles nor means the same there. So devices
 * are recognised by their names, subtypes and infos first ("cudaN"/"CUDA", "nvmlN"/"NVML",
 * "OpenFabrics"), and the OS-device type is only ever read through osdev_is(), which masks the 3.x
 * flags and compares the 2.x enum. Everything else used here (distances, filters, infos, PCI
 * attributes) is the same in both. */
static bool osdev_is(hwloc_obj_t o, hwloc_obj_osdev_type_t type)
{
#if HWLOC_API_VERSION >= 0x00030000
    return (o->attr->osdev.types & type) != 0;
#else
    return o->attr->osdev.type == type;
#endif
}

#define NVIDIA_VENDOR 0x10de
#define PCI_CLASS_BRIDGE_OTHER 0x0680 /* what an NVSwitch presents itself as */
#define PCI_CLASS_ETHERNET 0x0200
#define NVLINK_MATRIX "NVLinkBandwidth"
#define MAX_MATRICES 8
#define MAX_TREE_DEPTH 128

/* Everything one load needs; the hwloc objects behind t's arrays live only as long as it. */
struct loader {
    hwloc_topology_t hw;
    struct topo *t;
    const char *label;      /* what errors name: the XML file, or "this machine" */
    hwloc_obj_t *core_objs; /* t->cores[i] is core_objs[i] */
    hwloc_obj_t *gpu_objs;  /* t->gpus[i]'s PCI device */
    hwloc_obj_t *nic_objs;  /* t->nics[i]'s PCI device, or its OS device when not on PCI */
    struct plait_error *err;
};

/* A failed hwloc call: the source, what we were doing, hwloc's errno text, where in here. */
#define HWLOC_FAILED(ld, what)                                                                     \
    error_set((ld)->err, "%s: %s: %s (topo.c:%d)", (ld)->label, (what), strerror(errno), __LINE__)

static int out_of_memory(struct loader *ld)
{
    return error_set(ld->err, "%s: out of memory", ld->label);
}

static bool str_is(const char *a, const char *b)
{
    return a && b && strcasecmp(a, b) == 0;
}

static void copy_str(char *dst, size_t dst_bytes, const char *src)
{
    snprintf(dst, dst_bytes, "%s", src ? src : "");
}

/* ---- localities ----------------------------------------------------------------------- */

/* The NUMA node (os index) whose CPUs include all of obj's, -1 when none does (obj spans
 * several, or has no CPUs). With several candidates (DDR and HBM nodes over the same CPUs),
 * the first in hwloc's order. */
static int numa_of(hwloc_topology_t hw, hwloc_obj_t obj)
{
    if (!obj || !obj->cpuset || hwloc_bitmap_iszero(obj->cpuset)) return -1;
    hwloc_obj_t node = NULL;
    while ((node = hwloc_get_next_obj_by_type(hw, HWLOC_OBJ_NUMANODE, node)))
        if (node->cpuset && hwloc_bitmap_isincluded(obj->cpuset, node->cpuset))
            return (int)node->os_index;
    return -1;
}

/* The PCI device an I/O object belongs to (itself, or an OS device's parent), or NULL. */
static hwloc_obj_t pci_of(hwloc_obj_t obj)
{
    for (; obj; obj = obj->parent) {
        if (obj->type == HWLOC_OBJ_PCI_DEVICE) return obj;
        if (obj->type != HWLOC_OBJ_OS_DEVICE) return NULL;
    }
    return NULL;
}

static void busid_of(hwloc_obj_t pci, char out[16])
{
    snprintf(out, 16, "%04x:%02x:%02x.%x", pci->attr->pcidev.domain & 0xffffu,
             pci->attr->pcidev.bus, pci->attr->pcidev.dev, pci->attr->pcidev.func & 0xfu);
}

static bool is_nvswitch(hwloc_obj_t obj)
{
    if (!obj || obj->type != HWLOC_OBJ_PCI_DEVICE) return false;
    if (str_is(obj->subtype, "NVSwitch")) return true; /* hwloc's NVML backend marks them */
    return obj->attr->pcidev.vendor_id == NVIDIA_VENDOR &&
           obj->attr->pcidev.class_id == PCI_CLASS_BRIDGE_OTHER;
}

/* ---- cores ---------------------------------------------------------------------------- */

/* Physical cores in hwloc's logical order (package by package). Core os indexes restart in
 * each package on Linux, so they are not an order. A topology without Core objects (some VMs,
 * synthetic XML) gets one core per PU. */
static int load_cores(struct loader *ld)
{
    struct topo *t = ld->t;
    hwloc_obj_type_t type = HWLOC_OBJ_CORE;
    int n = hwloc_get_nbobjs_by_type(ld->hw, type);
    if (n <= 0) {
        type = HWLOC_OBJ_PU;
        n = hwloc_get_nbobjs_by_type(ld->hw, type);
    }
    if (n <= 0) return error_set(ld->err, "%s: the topology has no processing units", ld->label);
    t->cores = calloc((size_t)n, sizeof *t->cores);
    ld->core_objs = calloc((size_t)n, sizeof *ld->core_objs);
    if (!t->cores || !ld->core_objs) return out_of_memory(ld);
    t->n_cores = n;
    for (int i = 0; i < n; i++) {
        hwloc_obj_t core = hwloc_get_obj_by_type(ld->hw, type, (unsigned)i);
        struct topo_core *c = &t->cores[i];
        if (!core || !core->cpuset)
            return error_set(ld->err, "%s: core %d has no cpuset", ld->label, i);
        ld->core_objs[i] = core;
        c->os_index = (int)core->os_index;
        int weight = hwloc_bitmap_weight(core->cpuset);
        if (weight <= 0) return error_set(ld->err, "%s: core %d has no PUs", ld->label, i);
        c->pus = calloc((size_t)weight, sizeof *c->pus);
        if (!c->pus) return out_of_memory(ld);
        unsigned pu;
        hwloc_bitmap_foreach_begin(pu, core->cpuset) c->pus[c->n_pus++] = (int)pu;
        hwloc_bitmap_foreach_end();
        c->numa = numa_of(ld->hw, core);
        hwloc_obj_t pkg = hwloc_get_ancestor_obj_by_type(ld->hw, HWLOC_OBJ_PACKAGE, core);
        c->package = pkg ? (int)pkg->os_index : -1;
    }
    return 0;
}

/* Indexes into t->cores of the cores inside `set`, ascending. */
static int cores_within(struct loader *ld, hwloc_const_cpuset_t set, int **out, int *n_out)
{
    *out = NULL;
    *n_out = 0;
    if (!set) return 0;
    int *list = calloc((size_t)ld->t->n_cores, sizeof *list);
    if (!list) return out_of_memory(ld);
    int n = 0;
    for (int i = 0; i < ld->t->n_cores; i++)
        if (hwloc_bitmap_isincluded(ld->core_objs[i]->cpuset, set)) list[n++] = i;
    *out = list;
    *n_out = n;
    return 0;
}

/* ---- GPUs ----------------------------------------------------------------------------- */

/* The CUDA or NVML OS device of a GPU, by subtype, by backend or by name. */
static bool osdev_of_backend(hwloc_obj_t o, const char *backend)
{
    if (o->type != HWLOC_OBJ_OS_DEVICE) return false;
    if (str_is(o->subtype, backend)) return true;
    if (str_is(hwloc_obj_get_info_by_name(o, "Backend"), backend)) return true;
    size_t n = strlen(backend);
    return o->name && strncasecmp(o->name, backend, n) == 0 && o->name[n] >= '0' &&
           o->name[n] <= '9';
}

/* N of a "cudaN" OS device, or -1. */
static int cuda_number(hwloc_obj_t o)
{
    if (!o->name || strncmp(o->name, "cuda", 4) != 0 || o->name[4] < '0' || o->name[4] > '9')
        return -1;
    char *end;
    long n = strtol(o->name + 4, &end, 10);
    return *end == '\0' && n < INT_MAX ? (int)n : -1;
}

static bool is_nvidia_gpu(hwloc_obj_t pci)
{
    /* display controllers: 0x0300 VGA (workstation boards), 0x0302 3D (data-centre boards) */
    return pci->attr->pcidev.vendor_id == NVIDIA_VENDOR &&
           (pci->attr->pcidev.class_id >> 8) == 0x03;
}

struct gpu_found {
    hwloc_obj_t pci;
    int cuda; /* N of its cudaN OS device, or -1 */
    struct topo_gpu gpu;
};

static int compare_found_by_busid(const void *a, const void *b)
{
    return strcmp(((const struct gpu_found *)a)->gpu.busid,
                  ((const struct gpu_found *)b)->gpu.busid);
}

static int compare_found_by_cuda(const void *a, const void *b)
{
    return ((const struct gpu_found *)a)->gpu.cuda_index -
           ((const struct gpu_found *)b)->gpu.cuda_index;
}

/* Model and memory from the most trusted source that has them (topo.h): NVML (nvml not NULL
 * only for the live machine), hwloc's CUDA, NVML or OpenCL OS devices, the table of GPUs by PCI
 * id, and for the model the PCI device name hwloc found in pci.ids. */
static void describe_gpu(struct gpu_found *f, struct gpu_nvml *nvml)
{
    const char *nvml_model = NULL, *cuda_model = NULL, *opencl_model = NULL;
    uint64_t cuda_bytes = 0, opencl_bytes = 0, nvml_bytes = 0;
    struct topo_gpu *g = &f->gpu;
    f->cuda = -1;
    busid_of(f->pci, g->busid);
    g->pci_device = f->pci->attr->pcidev.device_id;
    for (hwloc_obj_t o = f->pci->io_first_child; o; o = o->next_sibling) {
        if (osdev_of_backend(o, "CUDA")) {
            cuda_model = hwloc_obj_get_info_by_name(o, "GPUModel");
            const char *kib = hwloc_obj_get_info_by_name(o, "CUDAGlobalMemorySize");
            if (kib) cuda_bytes = strtoull(kib, NULL, 10) * 1024u;
            f->cuda = cuda_number(o);
        } else if (osdev_of_backend(o, "NVML")) {
            nvml_model = hwloc_obj_get_info_by_name(o, "GPUModel");
        } else if (osdev_of_backend(o, "OpenCL")) {
            opencl_model = hwloc_obj_get_info_by_name(o, "GPUModel");
            const char *kib = hwloc_obj_get_info_by_name(o, "OpenCLGlobalMemorySize");
            if (kib) opencl_bytes = strtoull(kib, NULL, 10) * 1024u;
        }
    }
    const struct gpu_spec *by_pci = gpu_spec_by_pci(f->pci->attr->pcidev.vendor_id, g->pci_device);
    char nvml_name[96] = "";
    if (nvml) gpu_nvml_describe(nvml, g->busid, nvml_name, sizeof nvml_name, &nvml_bytes);
    const char *hwloc_model = nvml_model ? nvml_model : cuda_model ? cuda_model : opencl_model;
    const char *pci_ids = hwloc_obj_get_info_by_name(f->pci, "PCIDevice");
    const struct {
        const char *model, *source;
    } models[] = {{nvml_name, "NVML"},
                  {hwloc_model, "hwloc"},
                  {by_pci ? by_pci->name : NULL, "PCI id"},
                  {pci_ids, "pci.ids"}};
    g->model_source = "";
    for (size_t k = 0; k < sizeof models / sizeof models[0] && !*g->model_source; k++)
        if (models[k].model && *models[k].model) {
            copy_str(g->model, sizeof g->model, models[k].model);
            g->model_source = models[k].source;
        }
    const struct {
        uint64_t bytes;
        const char *source;
    } memories[] = {{nvml_bytes, "NVML"},
                    {cuda_bytes ? cuda_bytes : opencl_bytes, "hwloc"},
                    {by_pci ? by_pci->memory_bytes : 0, "PCI id"}};
    g->memory_source = "";
    for (size_t k = 0; k < sizeof memories / sizeof memories[0] && !*g->memory_source; k++)
        if (memories[k].bytes) {
            g->memory_bytes = memories[k].bytes;
            g->memory_source = memories[k].source;
        }
    g->spec = by_pci ? by_pci : gpu_spec_by_name(g->model);
}

/* CUDA indexes: a GPU's cudaN when hwloc saw the CUDA runtime; the others follow in PCI
 * bus-id order (CUDA_DEVICE_ORDER=PCI_BUS_ID), after the largest N. The CUDA runtime
 * numbers a node's n GPUs 0..n-1, so should two GPUs claim the same N, or any index come
 * out n or more (an edited XML), bus-id order for all. `found` is in bus-id order. */
static void assign_cuda_indexes(struct gpu_found *found, int n)
{
    int next = 0;
    bool bad = false;
    for (int i = 0; i < n; i++) {
        if (found[i].cuda < 0) continue;
        bad |= found[i].cuda >= n;
        if (!bad && found[i].cuda >= next) next = found[i].cuda + 1;
        for (int j = 0; j < i; j++) bad |= found[j].cuda == found[i].cuda;
    }
    for (int i = 0; i < n && !bad; i++) {
        found[i].gpu.cuda_index = found[i].cuda >= 0 ? found[i].cuda : next++;
        bad |= found[i].gpu.cuda_index >= n;
    }
    for (int i = 0; i < n && bad; i++) found[i].gpu.cuda_index = i;
}

static int load_gpus(struct loader *ld, bool live)
{
    struct topo *t = ld->t;
    int n = 0, cap = 0, rc = -1;
    struct gpu_found *found = NULL;
    struct gpu_nvml *nvml = NULL; /* the live machine's driver, when it has NVML */
    bool nvml_tried = false;
    for (hwloc_obj_t pci = NULL; (pci = hwloc_get_next_pcidev(ld->hw, pci));) {
        if (!is_nvidia_gpu(pci)) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 8;
            struct gpu_found *bigger = realloc(found, (size_t)cap * sizeof *found);
            if (!bigger) {
                out_of_memory(ld);
                goto out;
            }
            found = bigger;
        }
        memset(&found[n], 0, sizeof found[n]);
        found[n].pci = pci;
        if (live && !nvml_tried) {
            nvml = gpu_nvml_open();
            nvml_tried = true;
        }
        describe_gpu(&found[n], nvml);
        n++;
    }
    if (n == 0) {
        rc = 0;
        goto out;
    }
    qsort(found, (size_t)n, sizeof *found, compare_found_by_busid);
    assign_cuda_indexes(found, n);
    qsort(found, (size_t)n, sizeof *found, compare_found_by_cuda);

    t->gpus = calloc((size_t)n, sizeof *t->gpus);
    ld->gpu_objs = calloc((size_t)n, sizeof *ld->gpu_objs);
    if (!t->gpus || !ld->gpu_objs) {
        out_of_memory(ld);
        goto out;
    }
    t->n_gpus = n;
    for (int i = 0; i < n; i++) {
        struct topo_gpu *g = &t->gpus[i];
        *g = found[i].gpu;
        ld->gpu_objs[i] = found[i].pci;
        hwloc_obj_t near = hwloc_get_non_io_ancestor_obj(ld->hw, found[i].pci);
        g->numa = numa_of(ld->hw, near);
        if (cores_within(ld, near ? near->cpuset : NULL, &g->local_cores, &g->n_local_cores) < 0)
            goto out;
    }
    rc = 0;
out:
    gpu_nvml_close(nvml);
    free(found);
    return rc;
}

/* ---- NVLink --------------------------------------------------------------------------- */

static int gpu_index_of(struct loader *ld, hwloc_obj_t obj)
{
    hwloc_obj_t pci = pci_of(obj);
    for (int g = 0; pci && g < ld->t->n_gpus; g++)
        if (ld->gpu_objs[g] == pci) return g;
    return -1;
}

/* Folds one NVLinkBandwidth matrix (MB/s) into bw (n_gpus × n_gpus, MB/s).
 *
 * hwloc's NVML backend lists, for each GPU (its nvmlN OS device), the summed bandwidth of its
 * links to each peer: another GPU, an NVSwitch (a PCI device), or a CPU (POWER; ignored
 * here). Direct GPU-GPU links count as they are. Links to NVSwitches are closed through the
 * switch fabric: GPU a reaches GPU b at min(a's total bandwidth into NVSwitches, b's), the
 * rule of hwloc's own HWLOC_DISTANCES_TRANSFORM_TRANSITIVE_CLOSURE, which we do not call
 * because it needs the "NVSwitch" subtype (absent from hand-made XML), overwrites direct
 * links, and is missing before hwloc 2.5. The fabric rule, rather than summing per switch
 * min(link_a, link_b), is what real machines need: on a DGX-2 each GPU links only to the six
 * switches of its own baseboard and the baseboards are joined switch to switch, links the
 * matrix does not hold, so a per-switch sum would split the 16 GPUs in two. On HGX boards,
 * where every GPU spreads its links alike over all switches (H100: 5/4/4/5 over 4), both
 * rules give the same answer (18 × 25 = 450 GB/s). */
static void fold_matrix(struct loader *ld, const struct hwloc_distances_s *m, uint64_t *bw,
                        uint64_t *into_switches, int *role)
{
    int n_gpus = ld->t->n_gpus;
    unsigned nb = m->nbobjs;
    for (unsigned i = 0; i < nb; i++)
        role[i] = is_nvswitch(m->objs[i]) ? -2 : gpu_index_of(ld, m->objs[i]);
    memset(into_switches, 0, (size_t)n_gpus * sizeof *into_switches);
    for (unsigned i = 0; i < nb; i++) {
        if (role[i] < 0) continue;
        uint64_t sum = 0;
        for (unsigned k = 0; k < nb; k++)
            if (role[k] == -2) sum += m->values[i * nb + k];
        if (sum > into_switches[role[i]]) into_switches[role[i]] = sum;
    }
    for (unsigned i = 0; i < nb; i++) {
        for (unsigned j = 0; j < nb; j++) {
            int a = role[i], b = role[j];
            if (a < 0 || b < 0 || a == b) continue;
            uint64_t through =
                into_switches[a] < into_switches[b] ? into_switches[a] : into_switches[b];
            uint64_t v = m->values[i * nb + j] + through;
            if (v > bw[a * n_gpus + b]) bw[a * n_gpus + b] = v;
        }
    }
}

static int load_nvlink(struct loader *ld)
{
    struct topo *t = ld->t;
    int n = t->n_gpus, rc = -1;
    if (n == 0) return 0;
    t->nvlink_gbps = calloc((size_t)n * (size_t)n, sizeof *t->nvlink_gbps);
    uint64_t *bw = calloc((size_t)n * (size_t)n, sizeof *bw);
    uint64_t *into_switches = calloc((size_t)n, sizeof *into_switches);
    int *role = NULL;
    struct hwloc_distances_s *mats[MAX_MATRICES];
    unsigned nr = MAX_MATRICES;
    if (!t->nvlink_gbps || !bw || !into_switches) {
        out_of_memory(ld);
        goto out;
    }
    if (hwloc_distances_get_by_name(ld->hw, NVLINK_MATRIX, &nr, mats, 0) < 0) {
        HWLOC_FAILED(ld, "reading the " NVLINK_MATRIX " distances");
        goto out;
    }
    if (nr > MAX_MATRICES) nr = MAX_MATRICES;
    for (unsigned k = 0; k < nr; k++) {
        if (mats[k]->kind & HWLOC_DISTANCES_KIND_MEANS_BANDWIDTH) {
            int *bigger = realloc(role, mats[k]->nbobjs * sizeof *role);
            if (!bigger) {
                for (unsigned r = k; r < nr; r++) hwloc_distances_release(ld->hw, mats[r]);
                out_of_memory(ld);
                goto out;
            }
            role = bigger;
            fold_matrix(ld, mats[k], bw, into_switches, role);
        }
        hwloc_distances_release(ld->hw, mats[k]);
    }
    for (int i = 0; i < n * n; i++) t->nvlink_gbps[i] = (double)bw[i] / 1000.0;
    for (int i = 0; i < n; i++) t->nvlink_gbps[i * n + i] = 0;
    rc = 0;
out:
    free(bw);
    free(into_switches);
    free(role);
    return rc;
}

static bool nvlinked(const struct topo *t, int a, int b)
{
    return t->nvlink_gbps[a * t->n_gpus + b] > 0 && t->nvlink_gbps[b * t->n_gpus + a] > 0;
}

/* NVLink domains: cliques of the GPU-GPU NVLink graph. The lowest-indexed GPU not yet in a
 * domain starts one; every later free GPU linked to all its members so far joins. A connected
 * component that is a clique (NVSwitch boards, bridged pairs, islands) thus becomes one
 * domain; one that is not (a ring, a DGX-1 hybrid cube-mesh) is cut greedily into maximal
 * cliques in CUDA order (cube-mesh: {0,1,2,3}, {4,5,6,7}; ring of 4: {0,1}, {2,3}). A GPU
 * without NVLink is a domain of its own. Domains come out ordered by their lowest GPU. */
static int load_domains(struct loader *ld)
{
    struct topo *t = ld->t;
    int n = t->n_gpus;
    if (n == 0) return 0;
    t->domains = calloc((size_t)n, sizeof *t->domains);
    if (!t->domains) return out_of_memory(ld);
    for (int g = 0; g < n; g++) t->gpus[g].domain = -1;
    for (int seed = 0; seed < n; seed++) {
        if (t->gpus[seed].domain >= 0) continue;
        struct topo_domain *d = &t->domains[t->n_domains];
        d->gpus = calloc((size_t)n, sizeof *d->gpus);
        if (!d->gpus) return out_of_memory(ld);
        t->n_domains++;
        d->gpus[d->n_gpus++] = seed;
        t->gpus[seed].domain = t->n_domains - 1;
        for (int g = seed + 1; g < n; g++) {
            if (t->gpus[g].domain >= 0) continue;
            bool all = true;
            for (int k = 0; k < d->n_gpus && all; k++) all = nvlinked(t, g, d->gpus[k]);
            if (!all) continue;
            d->gpus[d->n_gpus++] = g;
            t->gpus[g].domain = t->n_domains - 1;
        }
    }
    return 0;
}

/* ---- network adapters ------------------------------------------------------------------ */

static bool is_openfabrics(hwloc_obj_t o)
{
    return str_is(o->subtype, "OpenFabrics") || osdev_is(o, HWLOC_OBJ_OSDEV_OPENFABRICS);
}

/* Bytes in a "aa:bb:..." hardware address. */
static int address_bytes(const char *address)
{
    if (!address || !*address) return 0;
    int n = 1;
    for (const char *p = address; *p; p++) n += *p == ':';
    return n;
}

/* InfiniBand or RoCE. hwloc (2.x and 3.x alike) records no link layer for OpenFabrics
 * devices, so in order: an explicit PortNLinkLayer info (annotated XML, other tools); the
 * network interface on the same PCI function (IPoIB addresses are 20 bytes, Ethernet 6);
 * the PCI class (a ConnectX in Ethernet mode is an Ethernet controller, 0x0200, and an
 * InfiniBand controller, 0x0207, otherwise); else InfiniBand. */
static enum topo_nic_kind openfabrics_kind(hwloc_obj_t dev, hwloc_obj_t pci)
{
    for (int port = 1; port <= 8; port++) {
        char key[32];
        snprintf(key, sizeof key, "Port%dLinkLayer", port);
        const char *layer = hwloc_obj_get_info_by_name(dev, key);
        if (layer) return str_is(layer, "Ethernet") ? TOPO_NIC_ROCE : TOPO_NIC_INFINIBAND;
    }
    for (hwloc_obj_t o = pci ? pci->io_first_child : NULL; o; o = o->next_sibling) {
        if (o->type != HWLOC_OBJ_OS_DEVICE || is_openfabrics(o) ||
            !osdev_is(o, HWLOC_OBJ_OSDEV_NETWORK))
            continue;
        int bytes = address_bytes(hwloc_obj_get_info_by_name(o, "Address"));
        if (bytes == 20) return TOPO_NIC_INFINIBAND;
        if (bytes == 6) return TOPO_NIC_ROCE;
    }
    if (pci && pci->attr->pcidev.class_id == PCI_CLASS_ETHERNET) return TOPO_NIC_ROCE;
    return TOPO_NIC_INFINIBAND;
}

static int add_nic(struct loader *ld, int *cap, hwloc_obj_t dev, hwloc_obj_t pci,
                   enum topo_nic_kind kind)
{
    struct topo *t = ld->t;
    if (t->n_nics == *cap) {
        int bigger_cap = *cap ? 2 * *cap : 8;
        struct topo_nic *nics = realloc(t->nics, (size_t)bigger_cap * sizeof *nics);
        if (!nics) return out_of_memory(ld);
        t->nics = nics;
        hwloc_obj_t *objs = realloc(ld->nic_objs, (size_t)bigger_cap * sizeof *objs);
        if (!objs) return out_of_memory(ld);
        ld->nic_objs = objs;
        *cap = bigger_cap;
    }
    struct topo_nic *nic = &t->nics[t->n_nics];
    memset(nic, 0, sizeof *nic);
    copy_str(nic->name, sizeof nic->name, dev->name);
    nic->kind = kind;
    if (pci) busid_of(pci, nic->busid);
    nic->numa = numa_of(ld->hw, hwloc_get_non_io_ancestor_obj(ld->hw, dev));
    ld->nic_objs[t->n_nics++] = pci ? pci : dev;
    return 0;
}

static int compare_nics(const void *a, const void *b)
{
    const struct topo_nic *x = a, *y = b;
    int gx = x->kind == TOPO_NIC_ETHERNET, gy = y->kind == TOPO_NIC_ETHERNET;
    if (gx != gy) return gx - gy;
    return strverscmp(x->name, y->name); /* mlx5_2 before mlx5_10 */
}

/* OpenFabrics devices (mlx5_N) first, then plain network interfaces that are on PCI and
 * not an OpenFabrics device's own interface (ib0 beside mlx5_0 is recorded as its netdev).
 * Interfaces without a PCI device (loopback, bridges, bonds, tunnels) are skipped. */
static int load_nics(struct loader *ld)
{
    struct topo *t = ld->t;
    int cap = 0;
    for (hwloc_obj_t o = NULL; (o = hwloc_get_next_osdev(ld->hw, o));) {
        if (!o->name || !is_openfabrics(o)) continue;
        hwloc_obj_t pci = pci_of(o->parent);
        if (add_nic(ld, &cap, o, pci, openfabrics_kind(o, pci)) < 0) return -1;
    }
    int n_openfabrics = t->n_nics;
    for (hwloc_obj_t o = NULL; (o = hwloc_get_next_osdev(ld->hw, o));) {
        if (!o->name || is_openfabrics(o) || !osdev_is(o, HWLOC_OBJ_OSDEV_NETWORK)) continue;
        hwloc_obj_t pci = pci_of(o->parent);
        if (!pci || strcmp(o->name, "lo") == 0) continue;
        bool own = false;
        for (int k = 0; k < n_openfabrics && !own; k++) {
            if (ld->nic_objs[k] != pci) continue;
            own = true;
            if (!t->nics[k].netdev[0])
                copy_str(t->nics[k].netdev, sizeof t->nics[k].netdev, o->name);
        }
        if (!own && add_nic(ld, &cap, o, pci, TOPO_NIC_ETHERNET) < 0) return -1;
    }
    /* sort the NICs and their objects together */
    for (int i = 1; i < t->n_nics; i++) {
        for (int j = i; j > 0 && compare_nics(&t->nics[j - 1], &t->nics[j]) > 0; j--) {
            struct topo_nic nic = t->nics[j];
            t->nics[j] = t->nics[j - 1];
            t->nics[j - 1] = nic;
            hwloc_obj_t obj = ld->nic_objs[j];
            ld->nic_objs[j] = ld->nic_objs[j - 1];
            ld->nic_objs[j - 1] = obj;
        }
    }
    return 0;
}

/* ---- GPU-NIC affinity ---------------------------------------------------------------- */

/* The nearest common ancestor of two objects, I/O objects included (hwloc's own helper works
 * by depth, which I/O objects do not have). */
static hwloc_obj_t common_ancestor(hwloc_obj_t a, hwloc_obj_t b)
{
    hwloc_obj_t chain[MAX_TREE_DEPTH];
    int n = 0;
    for (hwloc_obj_t p = a; p && n < MAX_TREE_DEPTH; p = p->parent) chain[n++] = p;
    for (hwloc_obj_t p = b; p; p = p->parent)
        for (int i = 0; i < n; i++)
            if (chain[i] == p) return p;
    return NULL;
}

static enum topo_affinity affinity(struct loader *ld, int g, int k)
{
    hwloc_obj_t gpu = ld->gpu_objs[g], nic = ld->nic_objs[k];
    hwloc_obj_t common = common_ancestor(gpu, nic);
    if (common && (common->type == HWLOC_OBJ_BRIDGE || common->type == HWLOC_OBJ_PCI_DEVICE)) {
        bool host = common->type == HWLOC_OBJ_BRIDGE &&
                    common->attr->bridge.upstream_type == HWLOC_OBJ_BRIDGE_HOST;
        return host ? TOPO_SAME_HOST_BRIDGE : TOPO_SAME_PCIE_SWITCH;
    }
    int gn = ld->t->gpus[g].numa, nn = ld->t->nics[k].numa;
    if (gn >= 0 && nn >= 0) return gn == nn ? TOPO_SAME_NUMA : TOPO_OTHER;
    /* a NUMA node unknown on one side: compare the CPUs the two are attached to */
    hwloc_obj_t ga = hwloc_get_non_io_ancestor_obj(ld->hw, gpu);
    hwloc_obj_t na = hwloc_get_non_io_ancestor_obj(ld->hw, nic);
    if (ga && na && ga->cpuset && na->cpuset && hwloc_bitmap_isequal(ga->cpuset, na->cpuset))
        return TOPO_SAME_NUMA;
    return TOPO_OTHER;
}

static int load_affinity(struct loader *ld)
{
    struct topo *t = ld->t;
    if (t->n_gpus == 0 || t->n_nics == 0) return 0;
    t->gpu_nic = calloc((size_t)t->n_gpus * (size_t)t->n_nics, sizeof *t->gpu_nic);
    if (!t->gpu_nic) return out_of_memory(ld);
    for (int g = 0; g < t->n_gpus; g++)
        for (int k = 0; k < t->n_nics; k++) t->gpu_nic[g * t->n_nics + k] = affinity(ld, g, k);
    return 0;
}

/* ---- loading ------------------------------------------------------------------------- */

/* hwloc refuses a file that is not XML in hwloc_topology_set_xml() and XML that is not a
 * topology in hwloc_topology_load(), with EINVAL either way; one message for both. */
static int not_a_topology(struct loader *ld, const char *xml_path)
{
    return error_set(ld->err,
                     "%s: cannot load hwloc topology: not a valid hwloc XML topology "
                     "(HWLOC_XML_VERBOSE=1 shows why)",
                     xml_path);
}

/* Opens the topology: an XML file (checked for readability first, so that the error says
 * why), XML text in memory (xml_text, xml_bytes), or the live machine. I/O objects are all
 * kept: bridges for the PCI tree, NVSwitches (class 0680, "unimportant" to hwloc's default
 * filter), OS devices for names. */
static int open_hwloc(struct loader *ld, const char *xml_path, const char *xml_text,
                      size_t xml_bytes)
{
    if (hwloc_topology_init(&ld->hw) < 0) {
        ld->hw = NULL;
        return HWLOC_FAILED(ld, "cannot initialise hwloc");
    }
    if (xml_text) {
        /* hwloc wants the text's length with its NUL */
        if (xml_bytes == 0 || xml_bytes >= INT_MAX ||
            hwloc_topology_set_xmlbuffer(ld->hw, xml_text, (int)xml_bytes + 1) < 0)
            return not_a_topology(ld, ld->label);
    } else if (xml_path) {
        FILE *f = fopen(xml_path, "r");
        if (!f) return error_errno(ld->err, "%s: cannot load hwloc topology", xml_path);
        int unreadable = fgetc(f) == EOF && ferror(f); /* a directory, say */
        if (unreadable) error_errno(ld->err, "%s: cannot load hwloc topology", xml_path);
        fclose(f);
        if (unreadable) return -1;
        if (hwloc_topology_set_xml(ld->hw, xml_path) < 0) return not_a_topology(ld, xml_path);
    }
    bool live = !xml_text && !xml_path;
#if defined(__linux__) && HWLOC_API_VERSION >= 0x00020100
    /* On Linux hwloc reads the PCI tree from sysfs itself. Its libpciaccess plugin repeats the
     * work and, being unloaded with each topology, strands about 1 KB of libpciaccess's static
     * tables every time: LeakSanitizer reports it in every program that loads this machine.
     * EINVAL means hwloc was built without that plugin: nothing to leave out. */
    if (live &&
        hwloc_topology_set_components(ld->hw, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, "pci") <
            0 &&
        errno != EINVAL)
        return HWLOC_FAILED(ld, "cannot leave out hwloc's libpciaccess component");
#endif
    if (hwloc_topology_set_io_types_filter(ld->hw, HWLOC_TYPE_FILTER_KEEP_ALL) < 0)
        return HWLOC_FAILED(ld, "cannot enable I/O discovery");
    if (hwloc_topology_load(ld->hw) < 0) {
        if (!live) return not_a_topology(ld, ld->label);
        return HWLOC_FAILED(ld, "cannot load hwloc topology");
    }
    return 0;
}

/* HWLOC_XMLFILE is honoured here rather than left to hwloc, which silently falls back to the
 * live machine when the file is bad. */
static const char *source_path(const char *xml_path)
{
    const char *env = getenv("HWLOC_XMLFILE");
    return !xml_path && env && *env ? env : xml_path;
}

static int load(struct topo *t, const char *xml_path, const char *xml_text, size_t xml_bytes,
                const char *label, struct plait_error *err)
{
    if (!t) return error_set(err, "topo_load: no struct topo to fill");
    memset(t, 0, sizeof *t);
    struct loader ld = {.t = t, .label = label, .err = err};
    int rc = -1;
    t->source = strdup(ld.label);
    if (!t->source) {
        out_of_memory(&ld);
        goto out;
    }
    if (open_hwloc(&ld, xml_path, xml_text, xml_bytes) < 0) goto out;
    const char *host = hwloc_obj_get_info_by_name(hwloc_get_root_obj(ld.hw), "HostName");
    copy_str(t->hostname, sizeof t->hostname, host);
    int n_numa = hwloc_get_nbobjs_by_type(ld.hw, HWLOC_OBJ_NUMANODE);
    t->n_numa = n_numa > 0 ? n_numa : 0;
    if (load_cores(&ld) < 0 || load_gpus(&ld, !xml_path && !xml_text) < 0 || load_nvlink(&ld) < 0 ||
        load_domains(&ld) < 0 || load_nics(&ld) < 0 || load_affinity(&ld) < 0)
        goto out;
    rc = 0;
out:
    free(ld.core_objs);
    free(ld.gpu_objs);
    free(ld.nic_objs);
    if (ld.hw) hwloc_topology_destroy(ld.hw);
    if (rc < 0) topo_free(t);
    return rc;
}

int topo_load(struct topo *t, const char *xml_path, struct plait_error *err)
{
    xml_path = source_path(xml_path);
    return load(t, xml_path, NULL, 0, xml_path ? xml_path : "this machine", err);
}

int topo_load_xml_text(struct topo *t, const char *xml, size_t xml_bytes, const char *label,
                       struct plait_error *err)
{
    if (!xml) return error_set(err, "%s: no hwloc XML text", label ? label : "topology");
    return load(t, NULL, xml, xml_bytes, label ? label : "hwloc XML text", err);
}

int topo_export_xml(const char *xml_path, char **xml, size_t *xml_bytes, struct plait_error *err)
{
    *xml = NULL;
    *xml_bytes = 0;
    xml_path = source_path(xml_path);
    struct topo unused = {0};
    struct loader ld = {.t = &unused, .label = xml_path ? xml_path : "this machine", .err = err};
    char *buf = NULL;
    int len = 0, rc = -1;
    if (open_hwloc(&ld, xml_path, NULL, 0) < 0) goto out;
    if (hwloc_topology_export_xmlbuffer(ld.hw, &buf, &len, 0) < 0 || len < 1) {
        HWLOC_FAILED(&ld, "cannot write the topology as XML");
        goto out;
    }
    *xml = malloc((size_t)len);
    if (!*xml) {
        out_of_memory(&ld);
        goto out;
    }
    memcpy(*xml, buf, (size_t)len); /* len counts the NUL */
    *xml_bytes = (size_t)len - 1;
    rc = 0;
out:
    if (buf) hwloc_free_xmlbuffer(ld.hw, buf);
    if (ld.hw) hwloc_topology_destroy(ld.hw);
    return rc;
}

const struct gpu_spec *topo_gpu_spec(const struct topo *t, int cuda_index)
{
    bool one_model = t->n_gpus > 0;
    for (int g = 1; g < t->n_gpus && one_model; g++) one_model = t->gpus[g].spec == t->gpus[0].spec;
    if (one_model) return t->gpus[0].spec;
    for (int g = 0; g < t->n_gpus; g++)
        if (t->gpus[g].cuda_index == cuda_index) return t->gpus[g].spec;
    return NULL;
}

void topo_free(struct topo *t)
{
    if (!t) return;
    for (int i = 0; t->cores && i < t->n_cores; i++) free(t->cores[i].pus);
    for (int i = 0; t->gpus && i < t->n_gpus; i++) free(t->gpus[i].local_cores);
    for (int i = 0; t->domains && i < t->n_domains; i++) free(t->domains[i].gpus);
    free(t->source);
    free(t->cores);
    free(t->gpus);
    free(t->nvlink_gbps);
    free(t->domains);
    free(t->nics);
    free(t->gpu_nic);
    memset(t, 0, sizeof *t);
}

/* ---- CPU lists ------------------------------------------------------------------------ */

/* Appends ",first-last" (or ",first") if it fits whole; otherwise marks the buffer full, so
 * that a short buffer holds a correct prefix of the list rather than a cut number. */
static void append_range(char *buf, size_t buf_bytes, size_t *len, bool *full, int first, int last)
{
    char item[32];
    const char *sep = *len ? "," : "";
    if (first == last)
        snprintf(item, sizeof item, "%s%d", sep, first);
    else
        snprintf(item, sizeof item, "%s%d-%d", sep, first, last);
    size_t n = strlen(item);
    if (*full || *len + n >= buf_bytes) {
        *full = true;
        return;
    }
    memcpy(buf + *len, item, n + 1);
    *len += n;
}

void topo_cpu_list(const struct topo *t, const int *cores, int n_cores, char *buf, size_t buf_bytes)
{
    if (!buf || buf_bytes == 0) return;
    buf[0] = '\0';
    size_t len = 0;
    bool full = false;
    int first = -1, prev = -1;
    /* the PUs in ascending order without a sort buffer: each time, the smallest above prev */
    for (;;) {
        int next = INT_MAX;
        for (int i = 0; i < n_cores; i++) {
            if (cores[i] < 0 || cores[i] >= t->n_cores) continue;
            const struct topo_core *c = &t->cores[cores[i]];
            for (int p = 0; p < c->n_pus; p++)
                if (c->pus[p] > prev && c->pus[p] < next) next = c->pus[p];
        }
        if (first >= 0 && next != prev + 1) {
            append_range(buf, buf_bytes, &len, &full, first, prev);
            first = -1;
        }
        if (next == INT_MAX) break;
        if (first < 0) first = next;
        prev = next;
    }
}
