/* selftest.h — plait-train --selftest: every op of the CUDA backend against
 * its CPU twin (kernels/cpu), on random data at several shapes. */
#ifndef PLAIT_RUNTIME_SELFTEST_H
#define PLAIT_RUNTIME_SELFTEST_H

#include <stdio.h>

/* Prints a table of max relative errors and the verdict on out. Returns
 * PLAIT_EXIT_OK when every op agrees, PLAIT_EXIT_ERROR when one does not (or
 * the backend failed), PLAIT_EXIT_SKIPPED when there is no GPU or no CUDA
 * backend in this build. The device: PLAIT_DEVICE if it is an index, else 0. */
int selftest_run(FILE *out);

#endif
