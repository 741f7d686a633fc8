/* elastic.h — the layout plait train runs on this machine: the plan's tp and
 * pp ("auto" by the cost model over --ranks, as 1 without it) and, when dp is
 * "auto", as many data-parallel replicas as the slots hold, keeping the
 * global batch of the run being resumed
 * (grad_accum grows when dp shrinks: a node lost), so the losses go on as if
 * nothing happened. Every degree is written into the plan, so the runtime's
 * resolved plan (and the run's plan.json) holds the layout that ran. */
#ifndef PLAIT_LAUNCHER_ELASTIC_H
#define PLAIT_LAUNCHER_ELASTIC_H

#include "common/error.h"
#include "common/plan/plan.h"

/* slots: the ranks this machine may run (0: as many as the plan's layout
 * with "auto" as 1). run_dir: the run being resumed, if its plan.json is
 * there. -1 with err when the layout cannot fit the slots, or no dp keeps the
 * run's global batch. */
int elastic_resolve(struct plan *plan, int slots, const char *run_dir, struct plait_error *err);

#endif
