/* hostlist.h — Slurm's compressed host lists ("node[01-04,07],gpu3",
 * "rack[1-2]-n[1-2]"), as srun puts them in SLURM_STEP_NODELIST and
 * SLURM_JOB_NODELIST, read without libslurm: the names in Slurm's order. */
#ifndef PLAIT_HOSTLIST_H
#define PLAIT_HOSTLIST_H

#include <stddef.h>

#include "common/error.h"

#define HOSTLIST_MAX_NAMES 65536 /* a list naming more is refused */
#define HOSTLIST_NAME_BYTES 256  /* a host name, NUL included */

/* The n-th name (from 0) of list into out. Ranges keep their zero padding
 * ("n[08-10]": n08 n09 n10); several bracket groups in one name expand
 * left to right, the rightmost fastest, as Slurm does. -1 with err for a
 * malformed list ("node[3-1]", an unclosed "["), or n past its end. */
int hostlist_nth(const char *list, int n, char out[HOSTLIST_NAME_BYTES], struct plait_error *err);

/* How many names list holds, or -1 with err. */
int hostlist_count(const char *list, struct plait_error *err);

#endif
