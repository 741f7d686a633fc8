/* gang.h — the ranks a launcher runs on this machine, as processes: plait
 * train's whole gang, supervised (gang_run_local), and a pod's share of a job
 * (plait launch in a pod, pod.c), both started, signalled and reaped by
 * gang_run_ranks. The caller has set what every rank shares (the plan, the
 * run directory) in its own environment; each rank adds its place
 * (common/place/place.h), the store's address and the job's secret (one rank alone:
 * 1 × 1 × 1 on the CPU, no store), and PLAIT_RESTART_COUNT. */
#ifndef PLAIT_LAUNCHER_GANG_H
#define PLAIT_LAUNCHER_GANG_H

#include <stdbool.h>
#include <stddef.h>

#include "common/error.h"
#include "common/plan/plan.h"

struct gang_spec {
    int tp, cp, pp, dp; /* the layout (no "auto"): tp·cp·pp·dp ranks */
    double timeout_s; /* the ranks' deadline; stragglers are killed this + 5 s after a failure */
    int max_restarts; /* checkpoint.max_restarts */
};

/* Starts the store and the ranks (each in its own process group, so that a
 * terminal's signals reach them only through the launcher, and each killed
 * by the kernel if the launcher dies) and waits for them: SIGINT, SIGTERM,
 * SIGUSR1 and SIGHUP are passed on to every rank; when one rank fails the
 * others are sent SIGTERM, then SIGKILL after the deadline.
 *
 * Supervision: a rank is lost when it is killed by a signal the launcher did
 * not send or pass on, or exits 76 (PLAIT_EXIT_RESTART: a peer was lost).
 * Once every rank has ended, a gang that lost a rank, where no rank failed by
 * itself (another non-zero code) and no signal came from outside, starts
 * again, whole, with a new store and PLAIT_RESTART_COUNT one higher (the
 * runtime resumes from the newest complete checkpoint), up to max_restarts
 * times; each restart is logged with the lost rank and how it ended.
 *
 * Returns the gang's exit code: a failing rank's first, 76 when a rank was
 * lost and no restart was left, else 75 if any stopped for preemption, else
 * 0; or -1 with err when it could not start. */
int gang_run_local(const struct plan *plan, const struct gang_spec *g, struct plait_error *err);

/* ---- the processes, for any launcher ------------------------------------- */

/* What gang_run_ranks starts: n ranks of this machine. */
struct gang_ranks {
    int n;
    char **const *envs;     /* [n] each rank's env contract (place_rank_env) */
    const int *global_rank; /* [n] for messages */
    const char *store_addr; /* PLAIT_STORE_ADDR and PLAIT_STORE_SECRET of every rank ("": none) */
    const char *secret;
    int restart_count; /* PLAIT_RESTART_COUNT of every rank; -1: as the launcher's */
    int threads;       /* OMP_NUM_THREADS unless set (0: one per CPU a rank is bound to) */
    double grace_s; /* after a failure, those still running get SIGKILL this long after SIGTERM */
    /* Both optional, called in the launcher's thread. poll, about every 50 ms while ranks run:
     * non-zero stops them all as a failure does (a peer elsewhere was lost). failed, once, as
     * soon as the first rank fails (before the others are stopped): tell the peers. */
    int (*poll)(void *ctx);
    void (*failed)(void *ctx, const char *how); /* how: "rank 2 (pid 4711) was killed by
                                                   signal 9" */
    void *ctx;
};

/* How the ranks ended. */
struct gang_outcome {
    int code;           /* a failing rank's exit code (128 + signal) first, else 75 if any
                           stopped for preemption, else 0 */
    int failed_rank;    /* the global rank that failed first (lost or by itself), or -1 */
    int lost_rank;      /* the first rank lost (gang_end_of: GANG_END_LOST), or -1 */
    char lost_how[128]; /* "rank 2 (pid 4711) was killed by signal 9" */
    bool error;         /* a rank failed by itself (GANG_END_ERROR) or could not start */
    int error_code;     /* the first such rank's exit code (what the gang exits with then) */
    bool outside;       /* a stop signal from outside was passed on to the ranks */
    bool stopped;       /* poll stopped them */
};

/* Forks the ranks (each in its own process group, killed by the kernel if the
 * launcher dies, with its env, CPUs and plait-train), passes SIGINT, SIGTERM,
 * SIGUSR1 and SIGHUP on to every one, and waits for them all: when one fails,
 * or poll says so, the others get SIGTERM, then SIGKILL after grace_s. A rank
 * that cannot be started counts as a failed one (code 1). */
void gang_run_ranks(const struct gang_ranks *g, struct gang_outcome *out);

/* ---- how a rank ended: gang_run_ranks and plait launch (a Slurm task) ----- */

/* How a supervised rank ended. */
enum gang_end {
    GANG_END_OK,        /* exit 0 */
    GANG_END_PREEMPTED, /* exit 75 */
    GANG_END_OURS,      /* killed by the launcher's own stop (SIGTERM, SIGKILL) */
    GANG_END_OUTSIDE,   /* killed by a stop signal from outside (a second Ctrl-C) */
    GANG_END_LOST,      /* exit 76, or killed by any other signal: restart */
    GANG_END_ERROR      /* any other exit: its own failure, no restart */
};

/* Classifies a wait status; ours and outside are sets of signals (bit s for
 * signal s). *code gets the exit code to report (128 + signal when killed),
 * how its text ("rank 2 (pid 4711) was killed by signal 9"). */
enum gang_end gang_end_of(int status, unsigned ours, unsigned outside, int rank, int pid, int *code,
                          char *how, size_t how_bytes);

#endif
