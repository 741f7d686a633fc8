/* thread_group.h — a struct group (runtime/group.h) whose ranks are threads
 * of the test process: every collective meets at a barrier, rank 0 combines
 * the members' buffers in rank order (the same bits for every rank), and
 * each copies its result out. For tests of the model and the optimizer
 * without processes or sockets. */
#ifndef PLAIT_TESTS_THREAD_GROUP_H
#define PLAIT_TESTS_THREAD_GROUP_H

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/group.h"

#define THREAD_GROUP_MAX 8

struct threads {
    int size;
    pthread_barrier_t barrier;
    const void *bufs[THREAD_GROUP_MAX];
    double *result; /* rank 0's scratch, as doubles (floats are exact in them) */
    size_t cap;
};

struct thread_rank {
    struct threads *t;
    int rank;
};

static inline void threads_init(struct threads *t, int size)
{
    memset(t, 0, sizeof *t);
    t->size = size;
    pthread_barrier_init(&t->barrier, NULL, (unsigned)size);
}

static inline void threads_destroy(struct threads *t)
{
    pthread_barrier_destroy(&t->barrier);
    free(t->result);
}

static inline void threads_grow(struct threads *t, size_t n)
{
    if (n > t->cap) {
        free(t->result);
        t->result = malloc(n * sizeof *t->result);
        t->cap = n;
    }
}

/* op: 0 sum of floats, 1 max of floats, 2 sum of doubles; over n elements
 * starting at element `from` of each member's buffer */
static inline void threads_combine(struct threads *t, int op, size_t from, size_t n)
{
    threads_grow(t, n);
    for (size_t i = 0; i < n; i++) {
        if (op == 2) {
            double acc = ((const double *)t->bufs[0])[from + i];
            for (int r = 1; r < t->size; r++) acc += ((const double *)t->bufs[r])[from + i];
            t->result[i] = acc;
        } else {
            float acc = ((const float *)t->bufs[0])[from + i];
            for (int r = 1; r < t->size; r++) {
                float x = ((const float *)t->bufs[r])[from + i];
                acc = op == 1 ? (x > acc ? x : acc) : acc + x;
            }
            t->result[i] = acc;
        }
    }
}

static int tg_allreduce(void *ctx, float *buf, size_t n, bool max, struct plait_error *err)
{
    struct thread_rank *me = ctx;
    struct threads *t = me->t;
    (void)err;
    t->bufs[me->rank] = buf;
    pthread_barrier_wait(&t->barrier);
    if (me->rank == 0) threads_combine(t, max ? 1 : 0, 0, n);
    pthread_barrier_wait(&t->barrier);
    for (size_t i = 0; i < n; i++) buf[i] = (float)t->result[i];
    pthread_barrier_wait(&t->barrier);
    return 0;
}

static int tg_allreduce_f64(void *ctx, double *buf, size_t n, struct plait_error *err)
{
    struct thread_rank *me = ctx;
    struct threads *t = me->t;
    (void)err;
    t->bufs[me->rank] = buf;
    pthread_barrier_wait(&t->barrier);
    if (me->rank == 0) threads_combine(t, 2, 0, n);
    pthread_barrier_wait(&t->barrier);
    memcpy(buf, t->result, n * sizeof *buf);
    pthread_barrier_wait(&t->barrier);
    return 0;
}

static int tg_reduce_scatter(void *ctx, const float *send, float *recv, size_t count,
                             struct plait_error *err)
{
    struct thread_rank *me = ctx;
    struct threads *t = me->t;
    (void)err;
    t->bufs[me->rank] = send;
    pthread_barrier_wait(&t->barrier);
    if (me->rank == 0) threads_combine(t, 0, 0, count * (size_t)t->size);
    pthread_barrier_wait(&t->barrier);
    for (size_t i = 0; i < count; i++) recv[i] = (float)t->result[(size_t)me->rank * count + i];
    pthread_barrier_wait(&t->barrier);
    return 0;
}

static int tg_allgather(void *ctx, const float *send, float *recv, size_t count,
                        struct plait_error *err)
{
    struct thread_rank *me = ctx;
    struct threads *t = me->t;
    (void)err;
    t->bufs[me->rank] = send;
    pthread_barrier_wait(&t->barrier);
    for (int r = 0; r < t->size; r++)
        memcpy(recv + (size_t)r * count, t->bufs[r], count * sizeof *recv);
    pthread_barrier_wait(&t->barrier);
    return 0;
}

/* An "asynchronous" sum or uneven reduce-scatter: recorded when started,
 * done in wait (every rank waits in the order it started, so the members
 * meet in the same order). */
struct tg_request {
    struct thread_rank *me;
    float *buf; /* the sum's, in place */
    size_t n;
    const float *send; /* the reduce-scatter's or the all-gather's */
    size_t *counts;    /* [size] (a copy) */
    bool gather;       /* an all-gather: the blocks into buf */
};

static int tg_iallreduce(void *ctx, float *buf, size_t n, void **req, struct plait_error *err)
{
    struct tg_request *r = calloc(1, sizeof *r);
    if (!r) return error_set(err, "out of memory");
    *r = (struct tg_request){.me = ctx, .buf = buf, .n = n};
    *req = r;
    return 0;
}

static int tg_ireduce_scatter_v(void *ctx, const float *send, float *recv, const size_t *counts,
                                void **req, struct plait_error *err)
{
    struct thread_rank *me = ctx;
    size_t bytes = (size_t)me->t->size * sizeof *counts;
    struct tg_request *r = calloc(1, sizeof *r);
    size_t *copy = malloc(bytes);
    if (!r || !copy) {
        free(r);
        free(copy);
        return error_set(err, "out of memory");
    }
    *r = (struct tg_request){
        .me = me, .buf = recv, .send = send, .counts = memcpy(copy, counts, bytes)};
    *req = r;
    return 0;
}

static int tg_iallgather_v(void *ctx, const float *send, float *recv, const size_t *counts,
                           void **req, struct plait_error *err)
{
    if (tg_ireduce_scatter_v(ctx, send, recv, counts, req, err)) return -1;
    ((struct tg_request *)*req)->gather = true;
    return 0;
}

/* Every member's block, in rank order, into buf. */
static void tg_gather_blocks(struct tg_request *r)
{
    struct threads *t = r->me->t;
    t->bufs[r->me->rank] = r->send;
    pthread_barrier_wait(&t->barrier);
    size_t at = 0;
    for (int k = 0; k < t->size; k++) {
        if (r->counts[k]) memcpy(r->buf + at, t->bufs[k], r->counts[k] * sizeof *r->buf);
        at += r->counts[k];
    }
    pthread_barrier_wait(&t->barrier);
}

static int tg_wait(void *req, struct plait_error *err)
{
    struct tg_request *r = req;
    int rc = 0;
    if (!r->send && !r->gather) {
        rc = tg_allreduce(r->me, r->buf, r->n, false, err);
    } else if (r->gather) {
        tg_gather_blocks(r);
    } else { /* the whole summed, then this rank's block */
        struct threads *t = r->me->t;
        size_t total = 0, at = 0;
        for (int k = 0; k < t->size; k++) {
            if (k == r->me->rank) at = total;
            total += r->counts[k];
        }
        t->bufs[r->me->rank] = r->send;
        pthread_barrier_wait(&t->barrier);
        if (r->me->rank == 0) threads_combine(t, 0, 0, total);
        pthread_barrier_wait(&t->barrier);
        for (size_t i = 0; i < r->counts[r->me->rank]; i++) r->buf[i] = (float)t->result[at + i];
        pthread_barrier_wait(&t->barrier);
    }
    free(r->counts);
    free(r);
    return rc;
}

/* The group of rank `me` (size 1: a group that is never called). */
static inline struct group thread_group(struct thread_rank *me)
{
    return (struct group){.size = me->t->size,
                          .rank = me->rank,
                          .allreduce = tg_allreduce,
                          .allreduce_f64 = tg_allreduce_f64,
                          .reduce_scatter = tg_reduce_scatter,
                          .allgather = tg_allgather,
                          .iallreduce = tg_iallreduce,
                          .ireduce_scatter_v = tg_ireduce_scatter_v,
                          .iallgather_v = tg_iallgather_v,
                          .wait = tg_wait,
                          .ctx = me};
}

#endif
