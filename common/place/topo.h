/* topo.h — one node's hardware as placement needs it, discovered with hwloc
 * (2.x; 3.x's OS-device types tolerated) from the live machine or an hwloc
 * XML file: GPUs and their NVLink domains, network adapters and their PCI
 * position relative to each GPU, NUMA nodes and cores. Nothing here knows
 * about plans or ranks (that is place.h). A node without GPUs is valid. */
#ifndef PLAIT_TOPO_H
#define PLAIT_TOPO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

struct gpu_spec; /* common/place/gpu.h: a GPU model's peaks and bandwidth */

struct topo_core {
    int os_index; /* hwloc Core os_index */
    int *pus;     /* os indexes of its hardware threads, ascending */
    int n_pus;
    int numa;    /* os index of its NUMA node, -1 unknown */
    int package; /* os index of its package (socket), -1 unknown */
};

struct topo_gpu {
    char busid[16];   /* "0000:1b:00.0", lower-case hex */
    int cuda_index;   /* the index CUDA gives it (PCI bus order, CUDA_DEVICE_ORDER=PCI_BUS_ID) */
    int numa;         /* NUMA node os index, -1 unknown */
    int *local_cores; /* indexes into topo.cores of the cores local to it (its
                         non-I/O ancestor's cpuset), ascending */
    int n_local_cores;
    unsigned pci_device; /* its PCI device id (vendor 10de): 0x2330 for an H100 SXM5 */
    /* What it is, from the most trusted source that says: NVML (the live
     * machine, when the driver's library is there), hwloc's CUDA, NVML or
     * OpenCL OS devices (GPUModel, CUDAGlobalMemorySize, OpenCLGlobalMemorySize),
     * plait's table of GPUs by PCI id (common/place/gpu.h), the PCI device name
     * hwloc took from pci.ids (model only). */
    uint64_t memory_bytes;       /* 0 when nothing says */
    char model[96];              /* "NVIDIA H100 80GB HBM3", or "" */
    const char *model_source;    /* "NVML", "hwloc", "PCI id", "pci.ids", or "" */
    const char *memory_source;   /* "NVML", "hwloc", "PCI id", or "" */
    const struct gpu_spec *spec; /* its peaks and bandwidth: by PCI id, else by model
                                    name; NULL when plait does not know it */
    int domain;                  /* its NVLink domain: index into topo.domains */
};

enum topo_nic_kind {
    TOPO_NIC_INFINIBAND, /* OpenFabrics device on an InfiniBand link */
    TOPO_NIC_ROCE,       /* OpenFabrics device on an Ethernet link */
    TOPO_NIC_ETHERNET,   /* a plain network interface */
};

struct topo_nic {
    char name[32];   /* "mlx5_0" for OpenFabrics devices, "eth0"/"ens1f0" otherwise */
    char netdev[32]; /* the network interface of an OpenFabrics device ("ib0"), or "" */
    enum topo_nic_kind kind;
    char busid[16]; /* its PCI device, "" if not on PCI */
    int numa;       /* NUMA node os index, -1 unknown */
};

/* How near a NIC is to a GPU, by the PCI tree (smaller is nearer). */
enum topo_affinity {
    TOPO_SAME_PCIE_SWITCH = 0, /* a common PCI bridge below the host bridge */
    TOPO_SAME_HOST_BRIDGE = 1, /* the same host bridge (root complex) */
    TOPO_SAME_NUMA = 2,        /* different host bridges, same NUMA node */
    TOPO_OTHER = 3,            /* across the inter-socket link */
};

/* A set of GPUs all pairwise connected by NVLink (directly or through
 * NVSwitches): tensor-parallel groups are placed inside one. */
struct topo_domain {
    int *gpus; /* indexes into topo.gpus, ascending */
    int n_gpus;
};

struct topo {
    char *source;            /* the XML file, or "this machine" */
    char hostname[64];       /* from the topology's HostName info, or "" */
    struct topo_core *cores; /* physical cores in hwloc's logical order, package by package
                                (Core os indexes restart in each package on Linux) */
    int n_cores;
    int n_numa;            /* NUMA nodes */
    struct topo_gpu *gpus; /* NVIDIA GPUs, by cuda_index */
    int n_gpus;
    double *nvlink_gbps;         /* n_gpus × n_gpus, row-major: GPU-to-GPU NVLink bandwidth
                                    in GB/s (unidirectional; through switches: the bottleneck
                                    of the path); 0 = no NVLink; diagonal 0 */
    struct topo_domain *domains; /* NVLink domains; a GPU without NVLink is its own
                                    domain; ordered by their lowest cuda_index */
    int n_domains;
    struct topo_nic *nics; /* InfiniBand/RoCE devices first, then Ethernet; by name */
    int n_nics;
    enum topo_affinity *gpu_nic; /* n_gpus × n_nics, row-major */
};

/* Loads the live machine's topology (xml_path NULL, or HWLOC_XMLFILE set in
 * the environment) or an hwloc XML file. Returns 0, or -1 with err naming the
 * file and the problem. */
int topo_load(struct topo *t, const char *xml_path, struct plait_error *err);
void topo_free(struct topo *t);

/* The same from hwloc XML text held in memory (xml_bytes without the NUL that
 * must follow them), e.g. another node's topology; label names it in errors
 * and becomes t->source. */
int topo_load_xml_text(struct topo *t, const char *xml, size_t xml_bytes, const char *label,
                       struct plait_error *err);

/* The topology topo_load(xml_path) would load, written as hwloc XML text
 * (malloc'ed, NUL-terminated; *xml_bytes without the NUL), so that another
 * process can load exactly this node with topo_load_xml_text. */
int topo_export_xml(const char *xml_path, char **xml, size_t *xml_bytes, struct plait_error *err);

/* The GPU model of the rank on CUDA device cuda_index: that GPU's, or the
 * node's when all its GPUs are one model (a CUDA_VISIBLE_DEVICES renumbering
 * then does not matter). NULL when unknown. */
const struct gpu_spec *topo_gpu_spec(const struct topo *t, int cuda_index);

/* "0-13,112-125": the PUs of the given cores (indexes into t->cores) as a
 * Linux CPU list, written into buf. */
void topo_cpu_list(const struct topo *t, const int *cores, int n_cores, char *buf,
                   size_t buf_bytes);

#endif
