/* runend.h — how a run's last process ended, in RUN_DIR/end.json: written by
 * plait-train's rank 0 as it exits ({"exit_code", "end": "finished" |
 * "preempted" | "failed", "signal" (the stop's, "" when none), "message"
 * (the error, "" when none), "time", "host", "pid"}), removed when a
 * process starts on the run. plait status reads it through here. */
#ifndef PLAIT_RUNEND_H
#define PLAIT_RUNEND_H

#include "common/error.h"

struct run_end {
    int exit_code;
    char end[16];    /* "finished", "preempted" or "failed" (of exit_code) */
    char signal[16]; /* the signal that stopped it ("SIGTERM"), "" none */
    char message[sizeof((struct plait_error *)0)->text]; /* the error, "" none */
    char time[32];                                       /* UTC, ISO 8601 */
    char host[256];
    int pid;
};

/* The end of this process now: exit_code, the signal that stopped it (0
 * none), the error (NULL or "" when none), the time, host and pid. */
void runend_of(struct run_end *e, int exit_code, int sig, const char *message);

/* Records e as RUN_DIR/end.json (whole: it appears at once). */
int runend_write(const char *run_dir, const struct run_end *e, struct plait_error *err);

/* RUN_DIR/end.json into e: 0, RUNEND_NONE when there is none, -1 with err
 * naming the file and the field that is wrong. */
#define RUNEND_NONE 1
int runend_read(const char *run_dir, struct run_end *e, struct plait_error *err);

/* Removes RUN_DIR/end.json (a process runs it now). */
void runend_clear(const char *run_dir);

#endif
