/* restart.h — a gang restarted inside one Slurm step: the step's members (the
 * plugin's tasks, one rank each; srun's tasks without the plugin, one node's
 * ranks each) start their part, report how it ended through the step's store,
 * and all take the same decision: start again, whole, from the newest complete
 * checkpoint when a rank was lost and none failed by itself, up to
 * checkpoint.max_restarts times; else end, with one exit code (env.h). */
#ifndef PLAIT_LAUNCHER_RESTART_H
#define PLAIT_LAUNCHER_RESTART_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>

#include "common/plan/plan.h"
#include "common/store/store.h"
#include "launcher/gang.h"

/* One member of the step, as the restarts see it. */
struct restart_member {
    const char *noun;     /* "rank", "node": messages say "launch: node 1: …" */
    int index, members;   /* this member, of how many */
    struct store *st;     /* the step's store; NULL: one member alone */
    bool hosts_store;     /* the store ends with this process: before returning, it waits
                             until every member has read the last verdict */
};

/* One start of this member's part: how it ended, its exit code, and what to
 * say of a rank lost ("" when its start said it already). k counts the starts
 * from 0: the ranks' PLAIT_RESTART_COUNT is the job's requeues + k. */
typedef enum gang_end (*restart_start_fn)(void *ctx, int k, int *code, char *how,
                                          size_t how_bytes);

/* Starts the member's part until the step is done. A stop signal (a bit of
 * *signals_seen, which the start may set too) ends the restarts. Returns the
 * member's exit code: a failing rank's, 76 when restarts ran out or a member
 * never reported (its node gone), else 75 when preempted, else 0. */
int restart_supervise(const struct restart_member *m, const struct plan *plan,
                      restart_start_fn start, void *ctx, volatile sig_atomic_t *signals_seen);

#endif
