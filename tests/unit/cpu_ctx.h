/* cpu_ctx.h — a unit test's context of the CPU backend (kernels/ops.h), one
 * per thread that runs ops: opened, or the test stops (there is nothing to
 * test without one). Close with ops_cpu()->close. */
#ifndef PLAIT_TESTS_CPU_CTX_H
#define PLAIT_TESTS_CPU_CTX_H

#include <stdio.h>
#include <stdlib.h>

#include "kernels/ops.h"

static inline struct ops_ctx *test_cpu_open(void)
{
    char why[256] = "";
    struct ops_ctx *ctx = ops_cpu()->open(0, why, sizeof why);
    if (!ctx) {
        fprintf(stderr, "plait: test: the cpu backend's context: %s\n", why);
        exit(1);
    }
    return ctx;
}

#endif
