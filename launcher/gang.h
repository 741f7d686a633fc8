/* gang.h — running all the ranks of a job on this machine (plait train), and
 * supervising them. The caller has set what every rank shares (the plan, the
 * run directory) in its own environment; the gang adds each rank's place
 * (common/place.h), the store's address and the job's secret (one rank alone:
 * 1 × 1 × 1 on the CPU, no store), and PLAIT_RESTART_COUNT. */
#ifndef PLAIT_LAUNCHER_GANG_H
#define PLAIT_LAUNCHER_GANG_H

#include "common/error.h"
#include "common/plan.h"

struct gang_spec {
    int tp, pp, dp;   /* the layout (no "auto") */
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

/* ---- what gang_run_local and plait launch (one rank of a Slurm step) share -- */

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
