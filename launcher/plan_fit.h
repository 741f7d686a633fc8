/* plan_fit.h — the allocation a plan is checked against, built one way for
 * plait check (hwloc XML or this machine), plait check --k8s-nodes (a node
 * list) and plait k8s render (--gpus-per-node on a node type): its nodes with
 * their slots, and a node's hardware described without hwloc when only its
 * GPU count, product and memory are known. The layout decision itself is
 * common/place/layout.h's, shared by all of them. */
#ifndef PLAIT_LAUNCHER_PLAN_FIT_H
#define PLAIT_LAUNCHER_PLAN_FIT_H

#include <stdint.h>

#include "common/error.h"
#include "common/place/layout.h"
#include "common/place/place.h"
#include "common/plan/plan.h"
#include "common/place/topo.h"

struct fit_nodes {
    struct place_node *v; /* [n] */
    char (*names)[64];    /* their names, unless given */
    int n;
};

/* n nodes, node i on topos[n_topos > 1 ? i : 0], named names[i] (NULL:
 * "node0", "node1", ...), each with gpus_per_node slots (0: the node's GPUs,
 * each ranks_per_gpu slots (PLAIT_RANKS_PER_GPU; 1 or 0: one); CPU ranks: the
 * plan's ranks spread over the nodes) — plait check's rules. -1 with err when
 * the slots exceed what plait runs. */
int fit_nodes_make(const struct plan *p, int n, int gpus_per_node, int ranks_per_gpu,
                   const struct topo *topos, int n_topos, const char *const *names,
                   struct fit_nodes *out, struct plait_error *err);
void fit_nodes_free(struct fit_nodes *f);

/* This machine as plait train places `slots` ranks on it (topology t, named host): GPU
 * ranks when parallel.device is "cuda", or "auto" where the machine has GPUs (as plait
 * check places them), each GPU PLAIT_RANKS_PER_GPU slots; else CPU ranks. -1 with err for
 * a bad PLAIT_RANKS_PER_GPU. */
int fit_node_here(const struct plan *p, int slots, const struct topo *t, const char *host,
                  struct place_node *out, struct plait_error *err);

/* A node known only by its GPUs: n_gpus of `product` (a GPU model name such
 * as "NVIDIA-H100-80GB-HBM3": it picks the cost model's speed), each with
 * memory_bytes (0 unknown), all in one NVLink domain (NVSwitch, as on HGX
 * boards) when nvlink, else each its own; cores_per_gpu cores per GPU on one
 * NUMA node; one InfiniBand adapter per GPU when rdma, else one Ethernet
 * adapter. source names it in messages. */
struct fit_node_spec {
    int n_gpus;
    const char *product;
    uint64_t memory_bytes;
    bool nvlink;
    int cores_per_gpu;
    bool rdma;
    const char *source;
};
int fit_topo_synthetic(struct topo *t, const struct fit_node_spec *s, struct plait_error *err);

/* Device memory read from a GPU product name, in bytes: its "NNGB" is NN GiB,
 * as the datasheets and common/place/gpu.c's table read it ("NVIDIA-H100-80GB-
 * HBM3": 80 GiB, which plait prints as 85.90 GB, GB = 10^9 bytes everywhere);
 * 0 when the name does not say. */
uint64_t fit_product_memory(const char *product);

#endif
