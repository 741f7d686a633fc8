/* comm_socket.c — the socket backend of comm.h: its ops (post, wait, test,
 * stats, destroy) and making a communicator (its peers' endpoints gathered
 * through the store, the mesh connected, the progress thread started). The
 * progress thread is sock_progress.c's; links sock_link.c's, setting them up
 * sock_connect.c's, the store sock_job.c's. */
#include "runtime/comm/sock_comm.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

static const struct comm_backend_ops sock_ops;

/* ---- the backend's ops ------------------------------------------------- */

/* Who frees a request: the caller, through comm_wait or comm_test saying
 * done; else sock_destroy. The progress thread only moves a request between
 * its queues and lets go of it once done or failed (complete, fail_comm in
 * sock_progress.c), so a request the caller never reaps is in none of them
 * by then: c->reqs holds every request from post until it is reaped, and
 * sock_destroy frees what is left on it, pending, done or failed, once the
 * progress thread has stopped (comm.h's comm_destroy; the nccl backend's
 * c->pending and comm_staging.c's c->staged keep the same rule). */

/* q off c->reqs: the caller has reaped it (under c->mu). */
static void reqs_unlink(struct sock_comm *c, struct sock_request *q)
{
    if (q->reqs_next) q->reqs_next->reqs_prev = q->reqs_prev;
    *(q->reqs_prev ? &q->reqs_prev->reqs_next : &c->reqs) = q->reqs_next;
}

/* The communicator's failure as an error (under mu, or once it is final). */
static int failure(const struct sock_comm *c, struct plait_error *err)
{
    return c->fail_peer_lost ? error_peer_lost(err, "%s", c->fail_text)
                             : error_set(err, "%s", c->fail_text);
}

static int sock_post(struct comm *base, const struct comm_desc *d, struct comm_request **out,
                     struct plait_error *err)
{
    struct sock_comm *c = (struct sock_comm *)base;
    /* per-rank counts travel with the request: its program is built later */
    size_t n = (size_t)base->size, counts_bytes = d->counts ? n * sizeof *d->counts : 0;
    struct sock_request *q = calloc(1, sizeof *q + counts_bytes * (d->recv_counts ? 2 : 1));
    if (!q) return error_errno(err, "comm '%s': allocating a request", base->name);
    q->base.ops = &sock_ops;
    q->c = c;
    q->d = *d;
    if (d->counts) q->d.counts = memcpy(q->counts, d->counts, counts_bytes);
    if (d->recv_counts) q->d.recv_counts = memcpy(q->counts + n, d->recv_counts, counts_bytes);
    pthread_mutex_lock(&c->mu);
    if (c->failed) {
        failure(c, err);
        pthread_mutex_unlock(&c->mu);
        free(q);
        return -1;
    }
    sock_request_list_push(&c->submit, &c->submit_tail, q);
    q->reqs_next = c->reqs;
    if (q->reqs_next) q->reqs_next->reqs_prev = q;
    c->reqs = q;
    c->operations++;
    pthread_mutex_unlock(&c->mu);
    if (atomic_load(&c->sleeping)) sock_progress_wake(c); /* awake, it finds q by itself */
    *out = &q->base;
    return 0;
}

static int finish_request(struct sock_request *q, struct plait_error *err)
{
    return q->state == REQ_FAILED ? failure(q->c, err) : 0;
}

static int sock_wait(struct comm_request *base, struct plait_error *err)
{
    struct sock_request *q = (struct sock_request *)base;
    struct sock_comm *c = q->c;
    int64_t t0 = sock_now_ms(), stuck_ms = c->timeout_ms + STUCK_GRACE_MS;
    int rc = 0;
    atomic_fetch_add(&c->waiters, 1);
    pthread_mutex_lock(&c->mu);
    while (q->state == REQ_PENDING) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&c->done_cond, &c->mu, &ts);
        int64_t beat = atomic_load_explicit(&c->beat_ms, memory_order_relaxed);
        if (q->state == REQ_PENDING && sock_now_ms() - beat > stuck_ms) {
            rc = error_set(err,
                           "comm '%s' rank %d: the progress thread has not run for %.1f s "
                           "(a bug: please report it)",
                           c->base.name, c->base.rank, (sock_now_ms() - beat) / 1000.0);
            c->wait_s += (sock_now_ms() - t0) / 1000.0;
            pthread_mutex_unlock(&c->mu);
            atomic_fetch_sub(&c->waiters, 1);
            return rc; /* q stays the thread's, and c->reqs' until destroy */
        }
    }
    rc = finish_request(q, err);
    reqs_unlink(c, q);
    c->wait_s += (sock_now_ms() - t0) / 1000.0;
    pthread_mutex_unlock(&c->mu);
    atomic_fetch_sub(&c->waiters, 1);
    free(q);
    return rc;
}

static int sock_test(struct comm_request *base, bool *done, struct plait_error *err)
{
    struct sock_request *q = (struct sock_request *)base;
    struct sock_comm *c = q->c;
    pthread_mutex_lock(&c->mu);
    *done = q->state != REQ_PENDING;
    int rc = 0;
    if (*done) {
        rc = finish_request(q, err);
        reqs_unlink(c, q);
    }
    pthread_mutex_unlock(&c->mu);
    if (*done) free(q);
    return rc;
}

static void sock_stats(const struct comm *base, struct comm_stats *out)
{
    struct sock_comm *c = (struct sock_comm *)base;
    out->bytes_sent = atomic_load(&c->bytes_sent);
    out->bytes_received = atomic_load(&c->bytes_received);
    out->payload_bytes_sent = atomic_load(&c->payload_sent);
    pthread_mutex_lock(&c->mu);
    out->operations = c->operations;
    out->wait_s = c->wait_s;
    pthread_mutex_unlock(&c->mu);
    out->connections_refused = c->refused;
}

static void sock_destroy(struct comm *base)
{
    struct sock_comm *c = (struct sock_comm *)base;
    sock_job_unwatch(c->job, c);
    if (c->thread_started) {
        pthread_mutex_lock(&c->mu);
        c->stop = true;
        pthread_mutex_unlock(&c->mu);
        sock_progress_wake(c);
        pthread_join(c->thread, NULL);
    }
    /* every request the caller has not reaped: those still in the queues
     * (submit, collq, the peers' sendq, recvq, p2p_in_req, claim_req) and
     * those done or failed that no queue holds any more */
    while (c->reqs) {
        struct sock_request *q = c->reqs;
        c->reqs = q->reqs_next;
        sock_algo_free(&q->prog);
        free(q);
    }
    for (int r = 0; c->peers && r < c->base.size; r++) {
        struct peer *p = &c->peers[r];
        if (r == c->base.rank) continue;
        sock_unexpected_free_list(p->ux_coll);
        sock_unexpected_free_list(p->ux_p2p);
        sock_link_close(&p->link);
    }
    if (c->wake_fd >= 0) close(c->wake_fd);
    pthread_cond_destroy(&c->done_cond);
    pthread_mutex_destroy(&c->mu);
    sock_job_unref(c->job);
    free(c->peers);
    free(c->pfds);
    free(c->pfd_peer);
    free(c);
}

/* The watcher (sock_job.c) calls this when the job is aborted. */
static void on_abort(void *ctx, const char *reason)
{
    struct sock_comm *c = ctx;
    pthread_mutex_lock(&c->mu);
    if (!c->abort_pending) {
        c->abort_pending = true;
        snprintf(c->abort_text, sizeof c->abort_text, "%s", reason);
    }
    pthread_mutex_unlock(&c->mu);
    sock_progress_wake(c);
}

/* ---- making a communicator --------------------------------------------- */

/* Everything a communicator needs before its links: 0 or -1. */
static int comm_alloc(struct sock_comm **out, struct sock_job *job, const struct sock_config *cfg,
                      const char *name, int rank, int size, struct plait_error *err)
{
    struct sock_comm *c = calloc(1, sizeof *c);
    if (!c) return error_errno(err, "allocating");
    c->base.ops = &sock_ops;
    c->base.rank = rank;
    c->base.size = size;
    snprintf(c->base.name, sizeof c->base.name, "%s", name);
    c->cfg = *cfg;
    c->timeout_ms = (int64_t)(cfg->timeout_s * 1000);
    if (c->timeout_ms < 1) c->timeout_ms = 1;
    c->global_rank = sock_job_global_rank(job);
    c->wake_fd = -1;
    c->peers = calloc((size_t)size, sizeof *c->peers);
    c->pfds = calloc((size_t)size + 1, sizeof *c->pfds);
    c->pfd_peer = calloc((size_t)size + 1, sizeof *c->pfd_peer);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->done_cond, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&c->mu, NULL);
    sock_job_ref(job);
    c->job = job;
    if (!c->peers || !c->pfds || !c->pfd_peer) {
        error_errno(err, "allocating");
        goto fail;
    }
    for (int r = 0; r < size; r++) {
        c->peers[r].rank = r;
        c->peers[r].link.fd = -1;
        c->peers[r].coll_in_xfer = -1;
    }
    c->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (c->wake_fd < 0) {
        error_errno(err, "eventfd");
        goto fail;
    }
    *out = c;
    return 0;
fail:
    sock_destroy(&c->base);
    return -1;
}

/* Every rank's endpoint, by the deadline; names the ranks that never came. */
static int gather_endpoints(struct sock_comm *c, int64_t deadline_ms, struct plait_error *err)
{
    char key[160];
    for (int r = 0; r < c->base.size; r++) {
        if (r == c->base.rank) continue;
        snprintf(key, sizeof key, "comm/%s/addr/%d", c->base.name, r);
        char *value = NULL;
        double left_s = (deadline_ms - sock_now_ms()) / 1000.0;
        if (sock_job_get(c->job, key, &value, left_s > 0.001 ? left_s : 0.001, err) != 0) {
            bool timed_out = sock_now_ms() >= deadline_ms || strstr(err->text, "timed out");
            if (!timed_out) return -1; /* the store is gone, or the job was aborted */
            /* list every rank that is missing, asking each once more briefly */
            char who[400];
            snprintf(key, sizeof key, "comm/%s/addr/", c->base.name);
            int missing =
                sock_job_missing_ranks(c->job, key, r, c->base.size, c->base.rank, who, sizeof who);
            return error_peer_lost(err,
                                   "rank%s %s did not join within %.1f s (no address at "
                                   "comm/%s/addr/<rank>; did it start, and with this name?)",
                                   missing > 1 ? "s" : "", who, c->cfg.timeout_s, c->base.name);
        }
        int bad = sock_endpoint_parse(value, &c->peers[r].ep);
        free(value);
        if (bad) return error_set(err, "rank %d published a malformed address", r);
    }
    return 0;
}

/* Publishes this rank's addresses under comm/<name>/addr/<rank>, once per name. */
static int publish_self(struct sock_comm *c, struct sock_job *job, const struct sock_listeners *ls,
                        const char *name, struct plait_error *err)
{
    int rank = c->base.rank, size = c->base.size;
    struct sock_endpoint *self = &c->peers[rank].ep;
    *self = ls->self;
    self->global_rank = sock_job_global_rank(job);
    self->pid = (long)getpid();
    snprintf(self->node_id, sizeof self->node_id, "%s", sock_job_node_id(job));
    snprintf(self->hostname, sizeof self->hostname, "%s", sock_job_hostname(job));
    char key[160], value[512];
    /* a name used before would lead to its old addresses: say so instead */
    int64_t joined = 0;
    snprintf(key, sizeof key, "comm/%s/members", name);
    if (sock_job_add(job, key, 1, &joined, err)) return -1;
    if (joined > size)
        return error_set(err,
                         "the name is in use in this job already (%lld joins for %d ranks): every "
                         "communicator needs a name of its own (put a generation in it)",
                         (long long)joined, size);
    snprintf(key, sizeof key, "comm/%s/addr/%d", name, rank);
    if (sock_endpoint_format(self, value, sizeof value))
        return error_set(err, "the address is too long to publish");
    return sock_job_set(job, key, value, err);
}

/* Connects a link to every other member (shared memory to those on this node where both
 * have a Unix socket, TCP to the rest), the members' endpoints gathered. */
static int connect_links(struct sock_comm *c, struct sock_job *job, struct sock_listeners *ls,
                         const char *name, int64_t deadline, struct plait_error *err)
{
    int rank = c->base.rank, size = c->base.size, rc = -1;
    if (size < 1 || rank < 0 || rank >= size)
        return error_set(err, "rank %d of a communicator of %d ranks", rank, size);
    const struct sock_endpoint *self = &c->peers[rank].ep;
    bool *use_shm = calloc((size_t)size, sizeof *use_shm);
    struct sock_endpoint *eps = calloc((size_t)size, sizeof *eps);
    struct sock_link *links = calloc((size_t)size, sizeof *links);
    if (!use_shm || !eps || !links) {
        error_errno(err, "allocating");
        goto out;
    }
    for (int r = 0; r < size; r++) {
        eps[r] = c->peers[r].ep;
        use_shm[r] = r != rank && !strcmp(eps[r].node_id, self->node_id) &&
                     strcmp(eps[r].unix_name, "-") && strcmp(self->unix_name, "-");
    }
    struct sock_mesh m = {.comm_name = name,
                          .secret = sock_job_secret(job),
                          .rank = rank,
                          .size = size,
                          .peers = eps,
                          .use_shm = use_shm,
                          .deadline_ms = deadline};
    rc = sock_mesh_connect(&m, ls, links, &c->refused, err);
    for (int r = 0; r < size && rc == 0; r++)
        if (r != rank) c->peers[r].link = links[r];
out:
    free(links);
    free(use_shm);
    free(eps);
    return rc;
}

/* The progress thread, and the job's abort watched. */
static int start_progress(struct sock_comm *c, struct sock_job *job, struct plait_error *err)
{
    atomic_store(&c->beat_ms, sock_now_ms());
    int rc = pthread_create(&c->thread, NULL, sock_progress_main, c);
    if (rc) {
        errno = rc;
        return error_errno(err, "starting the progress thread");
    }
    c->thread_started = true;
    if (sock_job_watch(job, on_abort, c)) return error_errno(err, "watching for aborts");
    return 0;
}

/* Joins communicator `name` as rank of size: listen, publish, gather,
 * connect, start the progress thread. Collective over the members. */
static int comm_create(struct comm **out, struct sock_job *job, const struct sock_config *cfg,
                       const char *name, int rank, int size, struct plait_error *err)
{
    *out = NULL;
    int64_t deadline = sock_now_ms() + (int64_t)(cfg->timeout_s * 1000);
    struct sock_comm *c = NULL;
    struct sock_listeners ls = {.tcp_fd = -1, .unix_fd = -1};
    if (comm_alloc(&c, job, cfg, name, rank, size, err)) goto fail_quiet;
    if (sock_listen(&ls, sock_job_store_host(job), cfg->transport == COMM_TRANSPORT_AUTO, err) ||
        publish_self(c, job, &ls, name, err) || gather_endpoints(c, deadline, err) ||
        connect_links(c, job, &ls, name, deadline, err))
        goto fail;
    sock_listeners_close(&ls);
    if (start_progress(c, job, err)) goto fail;
    *out = &c->base;
    return 0;
fail:
    error_prefix(err, "comm '%s' rank %d of %d: ", name, rank, size);
    sock_job_abort(job, err->text);
fail_quiet:
    sock_listeners_close(&ls);
    if (c) sock_destroy(&c->base);
    return -1;
}

int comm_socket_world_init(struct comm **out, struct store *store, int rank, int world_size,
                           const struct comm_options *opts, const char *name,
                           struct plait_error *err)
{
    struct sock_job *job;
    if (sock_job_create(&job, store, rank, opts->secret, opts->node_id, opts->timeout_s, err))
        return error_prefix(err, "comm '%s' rank %d: ", name, rank);
    struct sock_config cfg = {.timeout_s = opts->timeout_s,
                              .spin_us = opts->spin_us < 0    ? 0
                                         : opts->spin_us == 0 ? COMM_DEFAULT_SPIN_US
                                                              : opts->spin_us,
                              .transport = opts->transport,
                              .algorithm = opts->algorithm,
                              .small_bytes = opts->small_message_bytes
                                                 ? opts->small_message_bytes
                                                 : COMM_DEFAULT_SMALL_MESSAGE_BYTES};
    int rc = comm_create(out, job, &cfg, name, rank, world_size, err);
    sock_job_unref(job);
    return rc;
}

static int sock_split(struct comm *parent, const int *members, int n, int my_index,
                      const char *name, struct comm **out, struct plait_error *err)
{
    (void)members;
    struct sock_comm *p = (struct sock_comm *)parent;
    *out = NULL;
    if (n == 0) return 0; /* this rank joins no group */
    return comm_create(out, p->job, &p->cfg, name, my_index, n, err);
}

static const struct comm_backend_ops sock_ops = {
    .name = "socket",
    .post = sock_post,
    .wait = sock_wait,
    .test = sock_test,
    .split = sock_split,
    .stats = sock_stats,
    .destroy = sock_destroy,
};
