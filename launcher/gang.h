/* gang.h — the ranks a launcher runs on this machine, as processes: plait
 * train's whole gang (gang_run_local) and a pod's share of a job (plait launch
 * in a pod, pod.c), both started, signalled and reaped by gang_run_ranks. The
 * caller has set what every rank shares (the plan, the run directory, the
 * restart count) in its own environment; each rank adds its place
 * (common/place.h), the store's address and the job's secret. */
#ifndef PLAIT_LAUNCHER_GANG_H
#define PLAIT_LAUNCHER_GANG_H

#include <stdbool.h>

#include "common/error.h"
#include "common/plan.h"

struct gang_spec {
    int tp, pp, dp;   /* the layout (no "auto") */
    double timeout_s; /* the ranks' deadline; stragglers are killed this + 5 s after a failure */
};

/* Starts the store and the ranks (each in its own process group, so that a
 * terminal's signals reach them only through the launcher) and waits for
 * them: SIGINT, SIGTERM, SIGUSR1 and SIGHUP are passed on to every rank; when one rank fails the
 * others are sent SIGTERM, then SIGKILL after the deadline. Returns the gang's exit code (a failing
 * rank's first, else 75 if any stopped for preemption, else 0), or -1 with err when it could not
 * start. */
int gang_run_local(const struct plan *plan, const struct gang_spec *g, struct plait_error *err);

/* ---- the processes, for any launcher ------------------------------------- */

/* What gang_run_ranks starts: n ranks of this machine. */
struct gang_ranks {
    int n;
    char **const *envs;     /* [n] each rank's env contract (place_rank_env) */
    const int *global_rank; /* [n] for messages */
    const char *store_addr; /* PLAIT_STORE_ADDR and PLAIT_STORE_SECRET of every rank */
    const char *secret;
    int threads;    /* OMP_NUM_THREADS unless set (0: one per CPU a rank is bound to) */
    double grace_s; /* after a failure, those still running get SIGKILL this long after SIGTERM */
    /* Both optional, called in the launcher's thread. poll, about every 50 ms while ranks run:
     * non-zero stops them all as a failure does (a peer elsewhere was lost). failed, once, as
     * soon as the first rank fails (before the others are stopped): tell the peers. */
    int (*poll)(void *ctx);
    void (*failed)(void *ctx, int global_rank, bool exited, int code_or_signal);
    void *ctx;
};

/* How the ranks ended. */
struct gang_outcome {
    int code;        /* a failing rank's exit code (128 + signal) first, else 75 if any
                        stopped for preemption, else 0 */
    int failed_rank; /* the global rank that failed first, or -1 */
    bool stopped;    /* poll stopped them */
};

/* Forks the ranks (each in its own process group, with its env, CPUs and
 * plait-train), passes SIGINT, SIGTERM, SIGUSR1 and SIGHUP on to every one,
 * and waits for them all: when one fails, or poll says so, the others get
 * SIGTERM, then SIGKILL after grace_s. A rank that cannot be started counts
 * as a failed one (code 1). */
void gang_run_ranks(const struct gang_ranks *g, struct gang_outcome *out);

#endif
