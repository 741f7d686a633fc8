/* check.h — what plait check's files share (cmd_check.c the command, check_text.c its
 * tables, check_json.c its JSON document, check_figures.c the figures both print); not an
 * interface beyond them. */
#ifndef PLAIT_LAUNCHER_CHECK_H
#define PLAIT_LAUNCHER_CHECK_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "common/place/cost.h"
#include "common/place/gpu.h"
#include "common/place/layout.h"
#include "common/place/place.h"
#include "common/place/schedule.h"
#include "common/plan/plan.h"

/* What the command found, for its output. */
struct check_result {
    const struct plan *p;
    const struct place_node *nodes;
    int n_nodes;
    uint64_t gpu_mem;
    const struct cost_cpu_rates *cpu; /* this machine's CPU, measured; NULL: not */
    double cpu_s;                     /* how long measuring it took */
    json_t *candidates;               /* "auto": each candidate's record; else NULL */
};

/* ---- the figures both outputs print (check_figures.c) ---- */

/* The plan's GPUs: those of its ranks' nodes (NULL for CPU ranks, or when
 * plait does not know the first rank's GPU). */
const struct gpu_spec *check_plan_gpu(const struct layout_eval *e, const struct place_node *nodes);

/* The GPUs a GPU plan's ranks use: its ranks, over those sharing one (PLAIT_RANKS_PER_GPU). */
int check_plan_gpus(const struct layout_eval *e);
/* The modelled MFU of a GPU plan (a fraction), 0 when the GPU's peak is unknown. */
double check_modelled_mfu(const struct plan *p, const struct layout_eval *e,
                          const struct place_node *nodes);

/* The chosen layout's rank: its CPUs (*cpus) and the rates it gets from the measured ones. */
struct cost_links check_rank_rates(const struct cost_cpu_rates *cpu, const struct layout_eval *e,
                                   const struct place_node *nodes, double *cpus);

/* Whether the map splits dp into shard groups and their replicas. */
bool check_hybrid(const struct rank_map *m);

/* A hybrid sharding group's bytes over its own slowest link (not hidden). */
double check_raw_seconds(const struct place_comm *c, double bytes);

/* The step's pipeline schedule, as the runtime runs it (pp > 1), simulated with a backward
 * twice a forward; -1 when there is none (pp 1) or it cannot be made. */
int check_make_schedule(const struct plan *p, const struct cost_layout *l, struct schedule *s,
                        struct sched_sim *sim);

/* ---- the tables (check_text.c) ---- */

/* This machine's CPU kernels as measured, and a rank's rates from them. */
void check_print_cpu(const struct cost_cpu_rates *cpu, double seconds, const struct layout_eval *e,
                     const struct place_node *nodes);

/* The layout and its nodes, the memory table, the traffic table with the modelled step and
 * MFU, and the rank map. */
void check_print_tables(const struct plan *p, const struct layout_eval *e,
                        const struct place_node *nodes, int n_nodes, uint64_t gpu_mem);

/* The pipeline schedule (pp > 1): its bubble beside every schedule's, and its chart. */
void check_print_schedule(const struct plan *p, const struct cost_layout *l);

/* ---- the JSON document (check_json.c) ---- */

/* The result as one JSON object on stdout. */
void check_print_json(const struct check_result *r, const struct layout_eval *best);

#endif
