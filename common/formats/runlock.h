/* runlock.h — one run per directory. A run holds an exclusive flock(2) on
 * DIR/.lock for its whole life and writes who it is into the file (host, pid,
 * start time), so a second run on the same directory is refused naming the
 * first. The lock goes with the process (a crash or kill -9 releases it). On a
 * shared file system it holds across nodes as far as the file system's locks
 * do (NFSv4 and Lustre mounted with -o flock: yes; without lock support the
 * run goes on with a warning). */
#ifndef PLAIT_RUNLOCK_H
#define PLAIT_RUNLOCK_H

#include <stddef.h>

#include "common/error.h"

struct runlock {
    int fd; /* -1 when not held */
};

/* Takes DIR/.lock (DIR must exist). `what` names the directory's role in
 * messages ("run directory", "checkpoint directory"). */
int runlock_acquire(struct runlock *l, const char *dir, const char *what, struct plait_error *err);
void runlock_release(struct runlock *l);

/* Who holds DIR's lock: 1 with the holder's description ("pid 123 on host h
 * since 2026-11-23T10:00:00Z") in holder, 0 when nobody does, -1 on error. */
int runlock_holder(const char *dir, char *holder, size_t holder_bytes, struct plait_error *err);

#endif
