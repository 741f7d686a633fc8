/* runend.h — how a run's last process ended, in RUN_DIR/end.json: written by
 * plait-train's rank 0 as it exits ({"exit_code", "end": "finished" |
 * "preempted" | "failed", "signal" (the stop's, "" when none), "message"
 * (the error, "" when none), "time", "host", "pid"}), removed when a
 * process starts on the run. plait status reads it. */
#ifndef PLAIT_RUNEND_H
#define PLAIT_RUNEND_H

#include "common/error.h"

/* Records the end; sig is the signal that stopped it (0 none), message the
 * error ("" or NULL when none). */
int runend_write(const char *run_dir, int exit_code, int sig, const char *message,
                 struct plait_error *err);
/* Removes RUN_DIR/end.json (a process runs it now). */
void runend_clear(const char *run_dir);

#endif
