/* ckpt_async.c — a checkpoint's files written by a thread from host copies
 * of this rank's part, committed at a later step boundary (ckpt_async.h).
 * What the files hold and how they are committed is ckpt.c's and
 * ckpt_parts.c's. */
#include "runtime/ckpt_async.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "kernels/ops.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *writer(void *arg)
{
    struct ckpt_async *a = arg;
    double t0 = now_s();
    if (a->where)
        ckpt_parts_write(&a->parts, &a->snap, &a->st, a->plan_json, a->where);
    else
        ckpt_write(&a->job, &a->snap, &a->st, a->plan_json);
    a->written_s = now_s() - t0;
    atomic_store(&a->done, 1);
    return NULL;
}

/* A host buffer of at least n floats (grown, never shrunk). */
static float *room(float **buf, size_t *have, size_t n)
{
    if (*have >= n && *buf) return *buf;
    float *p = realloc(*buf, (n ? n : 1) * sizeof(float));
    if (!p) return NULL;
    *buf = p;
    *have = n;
    return p;
}

static int join(struct ckpt_async *a)
{
    if (!a->running) return 0;
    pthread_join(a->thread, NULL);
    a->running = false;
    return 0;
}

static int commit(struct ckpt_async *a, const struct ckpt_target *to, struct plait_error *err)
{
    join(a);
    a->pending = false;
    int rc = a->where ? ckpt_parts_commit(to->d, &a->parts, &a->snap, to->keep, to->par, err)
                      : ckpt_commit(to->d, &a->job, to->keep, err);
    if (rc == 0 && (!a->where || a->where->rank == 0))
        log_info("checkpoint step %d%s written in %.1f s in the background (the step paused %.3f "
                 "s for it), committed %.1f s after it began",
                 a->st.step, a->st.micro ? " (mid-step)" : "", a->written_s, a->stall_s,
                 now_s() - a->begun_s);
    return rc;
}

int ckpt_async_wait(struct ckpt_async *a, const struct ckpt_target *to, struct plait_error *err)
{
    if (!a->pending) return 0;
    if (!atomic_load(&a->done) && (!a->where || a->where->rank == 0))
        log_info("waiting for checkpoint step %d to be written", a->st.step);
    return commit(a, to, err);
}

int ckpt_async_poll(struct ckpt_async *a, const struct ckpt_target *to, struct plait_error *err)
{
    if (!a->pending) return 0;
    int busy = !atomic_load(&a->done); /* any rank's writer busy: not yet */
    if (to->par && parallel_max_int(to->par, &busy, err)) return -1;
    if (busy) return 0;
    return commit(a, to, err) ? -1 : 1;
}

int ckpt_async_reserve(struct ckpt_async *a, const struct model *m, struct plait_error *err)
{
    size_t S = m->slice_n, P = m->zero == 3 ? S : m->shard.total;
    if (!room(&a->params, &a->params_n, P) || !room(&a->adam_m, &a->m_n, S) ||
        !room(&a->adam_v, &a->v_n, S))
        return error_set(err, "checkpoint.async: out of memory for the host copy of this part");
    /* touched now, so that the first checkpoint's pause is a copy, not page faults */
    memset(a->params, 0, P * sizeof(float));
    memset(a->adam_m, 0, S * sizeof(float));
    memset(a->adam_v, 0, S * sizeof(float));
    return 0;
}

int ckpt_async_save(struct ckpt_async *a, const struct ckpt_target *to, const struct model *m,
                    const struct train_state *st, const char *plan_json, struct plait_error *err)
{
    if (ckpt_async_wait(a, to, err)) return -1;
    double t0 = now_s();
    size_t S = m->slice_n, P = m->zero == 3 ? S : m->shard.total; /* ZeRO 3: its slice */
    size_t G = st->micro > 0 ? (m->zero >= 2 ? S : m->shard.total) : 0;
    if (!room(&a->params, &a->params_n, P) || !room(&a->adam_m, &a->m_n, S) ||
        !room(&a->adam_v, &a->v_n, S) || !room(&a->grads, &a->grads_n, G))
        return error_set(err, "checkpoint.async: out of memory for the host copy of this part");
    char why[256];
    if (!a->host_ctx && !(a->host_ctx = ops_cpu()->open(0, why, sizeof why)))
        return error_set(err, "checkpoint.async: %s", why);
    /* the copies: the part as it is now; the writer reads only these */
    m->ops->download(m->ctx, a->params, m->params, P * sizeof(float));
    if (m->offload) { /* a GPU rank's "host" offload: in host memory (nvme is refused) */
        if (offload_read(m->offload, 0, 0, a->adam_m, S, err) ||
            offload_read(m->offload, 1, 0, a->adam_v, S, err))
            return error_prefix(err, "checkpoint.async: ");
    } else {
        m->ops->download(m->ctx, a->adam_m, m->adam_m, S * sizeof(float));
        m->ops->download(m->ctx, a->adam_v, m->adam_v, S * sizeof(float));
    }
    if (G)
        m->ops->download(m->ctx, a->grads, m->zero >= 2 ? m->grad_slice : m->grads,
                         G * sizeof(float));
    a->snap = *m;
    a->snap.ops = ops_cpu();
    a->snap.ctx = a->host_ctx;
    a->snap.params = a->params;
    a->snap.adam_m = a->adam_m;
    a->snap.adam_v = a->adam_v;
    a->snap.offload = NULL; /* the copies above are the moments */
    a->snap.host_step = NULL;
    a->snap.grads = a->snap.grad_slice = G ? a->grads : NULL;
    a->st = *st;
    a->plan_json = plan_json;
    a->where = to->par ? &to->par->where : NULL;
    int rc = a->where ? ckpt_parts_begin(to->d, to->dir, st, to->par, &a->parts, err)
                      : ckpt_begin(to->d, st, &a->job, err);
    if (rc) return -1;
    a->pending = true;
    a->begun_s = now_s();
    atomic_store(&a->done, 0);
    if (pthread_create(&a->thread, NULL, writer, a) == 0) {
        a->running = true;
    } else { /* no thread: write here */
        writer(a);
    }
    a->stall_s = now_s() - t0;
    return 0;
}

void ckpt_async_free(struct ckpt_async *a)
{
    join(a);
    if (a->pending && !a->where && a->job.begun) {
        ckpt_manifest_free(&a->job.manifest);
        ckptdir_abort(a->job.tmp);
    }
    free(a->params);
    free(a->adam_m);
    free(a->adam_v);
    free(a->grads);
    ops_cpu()->close(a->host_ctx);
    memset(a, 0, sizeof *a);
}
