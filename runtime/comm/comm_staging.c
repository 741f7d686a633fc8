/* comm_staging.c — an operation's device buffers moved through host memory
 * (comm.h's struct comm_staging): device inputs copied to host buffers at
 * post, the backend's operation run on those, device outputs copied back at
 * completion. Which bytes an operation reads and writes is comm.c's
 * (comm_desc_bytes); moving them between ranks is the backend's.
 *
 * A wrapper around the backend's post, wait and test (comm.c's post calls it
 * where c->staging is set) rather than a part of the socket backend: the
 * copies must run on the caller's thread, ordered after the device work the
 * caller knows of, never on the progress thread (which has no device bound
 * and would order against nothing); and so comm_socket.c and sock_*.c stay
 * host memory only, their requests unchanged. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/comm/comm_backend.h"

/* An operation with staged buffers: the backend's request, run on host
 * memory of its own, and what goes back where once it completes. The host
 * buffers live until then: the backend reads and writes them after post. */
struct comm_staged {
    struct comm_request base;
    struct comm *c;
    struct comm_staged *prev, *next; /* c->staged's list, under list_mu */
    struct comm_request *inner;      /* the backend's, on the host buffers */
    struct comm_staging staging;
    uint8_t *send_host, *recv_host; /* malloc'd; NULL: that side is not staged */
    void *recv_dev;                 /* where recv_host's first `written` bytes go */
    size_t written;
};

static const struct comm_backend_ops staged_ops;

/* Every communicator's list of staged requests: callers of different
 * communicators may post and wait at once, and a communicator's requests
 * may be waited for on other threads than the one that posted. */
static pthread_mutex_t list_mu = PTHREAD_MUTEX_INITIALIZER;

static bool is_device(const struct comm_staging *sg, const void *p, size_t bytes)
{
    return p && bytes && sg->is_device(sg->ctx, p);
}

/* bytes of host memory, dev's read_bytes copied in at offset `at`; NULL
 * (err set) if there is no memory. */
static uint8_t *host_copy(struct comm *c, const struct comm_staging *sg, size_t bytes, size_t at,
                          const void *dev, size_t read_bytes, struct plait_error *err)
{
    uint8_t *host = malloc(bytes);
    if (!host) {
        error_errno(err, "comm '%s': staging %zu bytes", c->name, bytes);
        return NULL;
    }
    if (read_bytes) sg->to_host(sg->ctx, host + at, dev, read_bytes);
    return host;
}

static void staged_free(struct comm_staged *q)
{
    free(q->send_host);
    free(q->recv_host);
    free(q);
}

/* The backend's request ended with rc: results back to device memory if it
 * succeeded, the host buffers freed either way. */
static int staged_finish(struct comm_staged *q, int rc)
{
    const struct comm_staging *sg = &q->staging;
    if (rc == 0 && q->recv_host && q->written)
        sg->to_device(sg->ctx, q->recv_dev, q->recv_host, q->written);
    pthread_mutex_lock(&list_mu);
    if (q->next) q->next->prev = q->prev;
    *(q->prev ? &q->prev->next : &q->c->staged) = q->next;
    pthread_mutex_unlock(&list_mu);
    staged_free(q);
    return rc;
}

void comm_staging_free_pending(struct comm_staged *staged)
{
    while (staged) {
        struct comm_staged *next = staged->next;
        staged_free(staged);
        staged = next;
    }
}

int comm_staging_post(struct comm *c, const struct comm_desc *d, struct comm_request **req,
                      struct plait_error *err)
{
    const struct comm_staging *sg = &c->staging;
    size_t read_bytes, written_bytes;
    comm_desc_bytes(d, c->rank, c->size, &read_bytes, &written_bytes);
    /* send within recv's bytes (in place: all-reduce, all-gather's own block,
     * a broadcast's one buffer on every rank) is one host buffer, as it is
     * one device buffer: the backend sees the aliasing it would see */
    uintptr_t s = (uintptr_t)d->send, r = (uintptr_t)d->recv;
    bool aliased = s && r && s >= r && (s == r || s - r < written_bytes);
    size_t at = aliased ? s - r : 0;
    size_t recv_bytes =
        aliased && at + read_bytes > written_bytes ? at + read_bytes : written_bytes;
    bool send_dev = !aliased && is_device(sg, d->send, read_bytes);
    bool recv_dev = is_device(sg, d->recv, recv_bytes);
    if (!send_dev && !recv_dev) return c->ops->post(c, d, req, err);

    struct comm_staged *q = calloc(1, sizeof *q);
    if (!q) return error_errno(err, "comm '%s': allocating a request", c->name);
    q->base.ops = &staged_ops;
    q->staging = *sg;
    struct comm_desc hd = *d; /* d on host memory */
    if (send_dev) {
        hd.send = q->send_host = host_copy(c, sg, read_bytes, 0, d->send, read_bytes, err);
        if (!q->send_host) goto fail;
    }
    if (recv_dev) {
        hd.recv = q->recv_host =
            host_copy(c, sg, recv_bytes, at, d->send, aliased ? read_bytes : 0, err);
        if (!q->recv_host) goto fail;
        if (aliased) hd.send = q->recv_host + at;
        q->recv_dev = d->recv;
        q->written = written_bytes;
    }
    if (c->ops->post(c, &hd, &q->inner, err)) goto fail;
    q->c = c;
    pthread_mutex_lock(&list_mu);
    q->next = c->staged;
    if (q->next) q->next->prev = q;
    c->staged = q;
    pthread_mutex_unlock(&list_mu);
    *req = &q->base;
    return 0;
fail:
    staged_free(q);
    return -1;
}

/* A wait that fails frees the host buffers as it returns the caller's
 * (sock_wait's "progress thread has not run" bug path included). */
static int staged_wait(struct comm_request *base, struct plait_error *err)
{
    struct comm_staged *q = (struct comm_staged *)base;
    return staged_finish(q, q->inner->ops->wait(q->inner, err));
}

static int staged_test(struct comm_request *base, bool *done, struct plait_error *err)
{
    struct comm_staged *q = (struct comm_staged *)base;
    int rc = q->inner->ops->test(q->inner, done, err);
    return *done ? staged_finish(q, rc) : rc;
}

/* A request's ops: only wait and test are ever called through one. */
static const struct comm_backend_ops staged_ops = {
    .name = "staged",
    .wait = staged_wait,
    .test = staged_test,
};
