/* profile.h — where a step's time goes: wall time per phase (kind of op ×
 * forward/backward, optimizer, data), accumulated always (a clock read per op
 * call) and printed at the end of a run when PLAIT_PROFILE=1. The CPU ops are
 * synchronous; on an asynchronous backend (CUDA) a printed profile waits for
 * the device around each phase, which slows the run a little but makes each
 * phase's time the device's. */
#ifndef PLAIT_RUNTIME_PROFILE_H
#define PLAIT_RUNTIME_PROFILE_H

#include <stdio.h>
#include <time.h>

struct ops_ctx; /* kernels/ops.h */

enum prof_phase {
    PROF_EMBED_FWD,
    PROF_LAYERNORM_FWD,
    PROF_MATMUL_FWD,
    PROF_ATTENTION_FWD,
    PROF_GELU_FWD,
    PROF_RESIDUAL_FWD,
    PROF_LM_HEAD_FWD,
    PROF_LOSS,
    PROF_LM_HEAD_BWD,
    PROF_MATMUL_BWD,
    PROF_ATTENTION_BWD,
    PROF_GELU_BWD,
    PROF_LAYERNORM_BWD,
    PROF_EMBED_BWD,
    PROF_RECOMPUTE,
    PROF_GRAD_NORM,
    PROF_OPTIMIZER,
    PROF_DATA,
    PROF_PHASES
};

static inline double prof_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

struct profile {
    double seconds[PROF_PHASES];
    int steps;  /* optimizer steps the seconds cover */
    int paused; /* > 0: PROF does not count (evaluation, sampling, recompute) */
    /* An asynchronous backend's wait (ops.h synchronize) and its context, set
     * only when the profile is printed (PLAIT_PROFILE=1): each phase then
     * waits for the device before and after, so its time is the device's.
     * NULL otherwise: measuring costs a clock read. */
    void (*sync)(struct ops_ctx *ctx);
    struct ops_ctx *sync_ctx;
};

static inline void prof_sync(const struct profile *p)
{
    if (p->sync) p->sync(p->sync_ctx);
}

/* The clock for a phase timed by hand: the device's work so far done first. */
static inline double prof_clock(const struct profile *p)
{
    prof_sync(p);
    return prof_now();
}

/* Runs `call` and adds its wall time to the phase, unless paused. */
#define PROF(prof, phase, call)                                                                    \
    do {                                                                                           \
        prof_sync(prof);                                                                           \
        double prof_t0_ = prof_now();                                                              \
        call;                                                                                      \
        prof_sync(prof);                                                                           \
        if (!(prof)->paused) (prof)->seconds[phase] += prof_now() - prof_t0_;                      \
    } while (0)

/* A table of ms per step and share per phase; step_s is the measured mean
 * step time (the rest is reported as "other"). */
void profile_print(const struct profile *p, double step_s, FILE *out);

#endif
