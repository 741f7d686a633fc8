/* seconds.h — the tests' clock, in seconds: now_s (monotonic) and sleep_s
 * (resumed after a signal). Shared by store_harness.h, comm_world.h and test_comm_nccl.c. */
#ifndef PLAIT_TESTS_SECONDS_H
#define PLAIT_TESTS_SECONDS_H

#include <errno.h>
#include <time.h>

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static inline void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

#endif
