/* ckpt_async.h — checkpoints written in the background (checkpoint.async):
 * the step pauses only to copy this rank's part (parameters, moments, an
 * unfinished step's gradients) into host memory and to open the checkpoint's
 * temporary directory; a thread writes and fsyncs the files; the commit (the
 * manifest, the rename, once every rank's files are durable) is made at the
 * first step boundary after every rank's writer is done. A checkpoint still
 * being written when the next is due, or when the run ends or stops, is
 * waited for and committed first: never skipped. The files and the protocol
 * are ckpt.c's and ckpt_parts.c's. */
#ifndef PLAIT_RUNTIME_CKPT_ASYNC_H
#define PLAIT_RUNTIME_CKPT_ASYNC_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "runtime/ckpt.h"
#include "runtime/ckpt_parts.h"

struct ckpt_async {
    bool pending;    /* begun, not yet committed */
    bool running;    /* its writer thread is to be joined */
    atomic_int done; /* the writer finished (its outcome in the job) */
    pthread_t thread;
    struct model snap;        /* the model's description; its buffers: the host copies below */
    struct ops_ctx *host_ctx; /* snap's: a cpu backend context for the writer thread */
    float *params, *adam_m, *adam_v, *grads;
    size_t params_n, m_n, v_n, grads_n; /* their sizes, floats */
    struct train_state st;
    const char *plan_json;
    const struct env_rank *where; /* NULL: one rank */
    struct ckpt_job job;          /* one rank */
    struct ckpt_parts_job parts;  /* several */
    double begun_s, written_s;    /* when it began; how long the writer took */
    double stall_s;               /* how long the step paused for it */
};

/* Where the checkpoints go: d (rank 0's, NULL on the other ranks of a
 * multi-rank job), dir, and par (NULL for one rank). */
struct ckpt_target {
    struct ckptdir *d;
    const char *dir;
    struct parallel *par;
    int keep;
};

/* The host copies, allocated and touched before training starts. */
int ckpt_async_reserve(struct ckpt_async *a, const struct model *m, struct plait_error *err);

/* Commits a pending checkpoint first (waiting for its writer), then copies
 * m and st and starts writing them in the background. Every rank calls it. */
int ckpt_async_save(struct ckpt_async *a, const struct ckpt_target *to, const struct model *m,
                    const struct train_state *st, const char *plan_json, struct plait_error *err);

/* At a step boundary (every rank): commits the pending checkpoint if every
 * rank's writer is done; 1 when it committed one, 0 when none was ready. */
int ckpt_async_poll(struct ckpt_async *a, const struct ckpt_target *to, struct plait_error *err);

/* Waits for the pending checkpoint's writer and commits it (every rank); 0
 * at once when none is pending. */
int ckpt_async_wait(struct ckpt_async *a, const struct ckpt_target *to, struct plait_error *err);

/* Joins a writer still running (after a failure: nothing is committed; the
 * temporary directory is removed at the next start) and frees the copies. */
void ckpt_async_free(struct ckpt_async *a);

#endif
