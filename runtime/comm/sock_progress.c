/* sock_progress.c — the socket backend's progress thread: the frames on a
 * communicator's links and how they match operations, running collective
 * programs (built by sock_algo.c), deadlines and failure. The backend's ops
 * and making a communicator are comm_socket.c's; links sock_link.c's. */
#include "runtime/comm/sock_comm.h"

#include <errno.h>
#include <inttypes.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "runtime/comm/sock_reduce.h"

/* Frames: every message, collective or point to point, travels as fragments
 * of at most FRAG_MAX bytes, each behind a 40-byte header; payloads are
 * padded to 8 bytes so every header and element is aligned in the stream.
 *    0 u8  kind (1 collective, 2 point to point) | u8[3] 0
 *    4 u32 step (collective) or tag (point to point)
 *    8 u64 seq: the collective's number on the communicator, or the message's
 *          number on this link (point to point)
 *   16 u64 total bytes of the message
 *   24 u64 offset of this fragment in it
 *   32 u32 bytes in this fragment | 36 u32 "PLFR"
 * A link carries at most one collective and one point-to-point message at a
 * time in each direction, their fragments interleaved, so a collective
 * waiting on a gate never holds up a pipeline send. A message that arrives
 * before its operation is posted is buffered (it is never left in the
 * stream), which is what lets every send complete without its receive. */
#define FRAME_MAGIC 0x52464c50u /* "PLFR" */
#define FRAME_COLL 1
#define FRAME_P2P 2
#define FRAG_MAX ((size_t)256 << 10)
#define FRAG_MIN ((size_t)32 << 10) /* a gated send waits for this much, or its end */
#define IO_BUDGET ((size_t)1 << 20) /* per link and direction per round, for fairness */

/* ---- small helpers --------------------------------------------------- */

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get_u64(const uint8_t *p)
{
    return (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32;
}

static size_t pad8(size_t n)
{
    return (8 - n % 8) % 8;
}

void sock_progress_wake(struct sock_comm *c)
{
    uint64_t one = 1;
    /* EAGAIN (the counter is full) still leaves it readable: the thread wakes */
    while (write(c->wake_fd, &one, sizeof one) < 0 && errno == EINTR) {
    }
}

/* "rank 3 (global rank 7, host n12, pid 4242)" */
static void peer_name(const struct sock_comm *c, int r, char *out, size_t n)
{
    const struct sock_endpoint *e = &c->peers[r].ep;
    snprintf(out, n, "rank %d (global rank %d, host %s, pid %ld)", r, e->global_rank, e->hostname,
             e->pid);
}

/* "all-reduce #5 (ring, 4194304 bytes)" */
static void op_name(const struct sock_request *q, char *out, size_t n)
{
    if (q->d.kind == COMM_OP_SEND || q->d.kind == COMM_OP_RECV)
        snprintf(out, n, "%s %s rank %d (tag %" PRIu32 ", %zu bytes)", comm_op_kind_name(q->d.kind),
                 q->d.kind == COMM_OP_SEND ? "to" : "from", q->d.peer, q->d.tag, q->d.bytes);
    else
        snprintf(out, n, "%s #%" PRIu64 " (%s, %zu bytes)", comm_op_kind_name(q->d.kind), q->seq,
                 q->started ? q->prog.algorithm : "not started", q->d.bytes);
}

void sock_request_list_push(struct sock_request **head, struct sock_request **tail,
                            struct sock_request *q)
{
    q->next = NULL;
    if (*tail)
        (*tail)->next = q;
    else
        *head = q;
    *tail = q;
}

static struct sock_request *list_pop(struct sock_request **head, struct sock_request **tail)
{
    struct sock_request *q = *head;
    if (q) {
        *head = q->next;
        if (!*head) *tail = NULL;
        q->next = NULL;
    }
    return q;
}

void sock_unexpected_free_list(struct unexpected *u)
{
    while (u) {
        struct unexpected *next = u->next;
        free(u->data);
        free(u);
        u = next;
    }
}

static void ux_unlink(struct unexpected **head, struct unexpected *u)
{
    for (struct unexpected **pp = head; *pp; pp = &(*pp)->next)
        if (*pp == u) {
            *pp = u->next;
            return;
        }
}

static void ux_append(struct unexpected **head, struct unexpected *u)
{
    struct unexpected **pp = head;
    while (*pp) pp = &(*pp)->next;
    *pp = u;
}

static struct sock_request *running(const struct sock_comm *c)
{
    return c->collq && c->collq->started ? c->collq : NULL;
}

/* ---- finishing requests ------------------------------------------------ */

/* Marks q done and wakes its waiter; the progress thread must not touch q
 * after this (the waiter frees it). */
static void complete(struct sock_comm *c, struct sock_request *q)
{
    sock_algo_free(&q->prog);
    pthread_mutex_lock(&c->mu);
    q->state = REQ_DONE;
    pthread_cond_broadcast(&c->done_cond);
    pthread_mutex_unlock(&c->mu);
}

static void fail_list_locked(struct sock_request *q)
{
    while (q) {
        struct sock_request *next = q->next;
        sock_algo_free(&q->prog);
        q->next = NULL;
        q->state = REQ_FAILED;
        q = next;
    }
}

/* The communicator is broken: every pending request fails with text, and so
 * does every later one. report: also abort the job through the store, so
 * ranks blocked elsewhere hear of it. peer_lost: the cause is another
 * process (gone, silent, or the job aborted), not this one (plait_error's
 * peer_lost). Progress thread only. */
static void fail_comm(struct sock_comm *c, bool report, bool peer_lost, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void fail_comm(struct sock_comm *c, bool report, bool peer_lost, const char *fmt, ...)
{
    char text[sizeof c->fail_text - COMM_MAX_NAME_BYTES - 40], full[sizeof c->fail_text];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    snprintf(full, sizeof full, "comm '%s' rank %d: %s", c->base.name, c->base.rank, text);
    /* tell the job before waking anyone: a caller that exits on the error
       must not take the news with it */
    if (report) sock_job_abort(c->job, full);
    pthread_mutex_lock(&c->mu);
    if (c->failed) {
        pthread_mutex_unlock(&c->mu);
        return;
    }
    c->failed = true;
    c->fail_peer_lost = peer_lost;
    memcpy(c->fail_text, full, sizeof full);
    fail_list_locked(c->submit);
    c->submit = c->submit_tail = NULL;
    fail_list_locked(c->collq);
    c->collq = c->collq_tail = NULL;
    for (int r = 0; r < c->base.size; r++) {
        struct peer *p = &c->peers[r];
        if (r == c->base.rank) continue;
        fail_list_locked(p->sendq);
        fail_list_locked(p->recvq);
        p->sendq = p->sendq_tail = p->recvq = p->recvq_tail = NULL;
        if (p->p2p_in_req) fail_list_locked(p->p2p_in_req);
        for (struct unexpected *u = p->ux_p2p; u; u = u->next)
            if (u->claim_req) fail_list_locked(u->claim_req), u->claim_req = NULL;
        p->p2p_in_req = p->rx_req = NULL;
        p->tx_active = false;
    }
    pthread_cond_broadcast(&c->done_cond);
    pthread_mutex_unlock(&c->mu);
}

/* ---- sending ----------------------------------------------------------- */

static void frame_header(uint8_t *h, uint8_t kind, uint32_t tag, uint64_t seq, uint64_t total,
                         uint64_t offset, uint32_t bytes)
{
    memset(h, 0, FRAME_BYTES);
    h[0] = kind;
    put_u32(h + 4, tag);
    put_u64(h + 8, seq);
    put_u64(h + 16, total);
    put_u64(h + 24, offset);
    put_u32(h + 32, bytes);
    put_u32(h + 36, FRAME_MAGIC);
}

static const uint8_t zeros[8];

static void tx_start(struct peer *p, const void *payload, size_t bytes)
{
    p->tx_iov[0] = (struct iovec){p->tx_head, FRAME_BYTES};
    p->tx_iov[1] = (struct iovec){(void *)payload, bytes};
    p->tx_iov[2] = (struct iovec){(void *)zeros, pad8(bytes)};
    p->tx_iov_at = 0;
    p->tx_left = FRAME_BYTES + bytes + pad8(bytes);
    p->tx_frag = bytes;
    p->tx_active = true;
}

/* The next collective send to p, if its gate lets a fragment go now. */
static bool pick_coll(struct sock_comm *c, struct peer *p)
{
    struct sock_request *q = running(c);
    if (!q) return false;
    struct program *g = &q->prog;
    int i = p->coll_send_next;
    while (i < g->n_sends && (g->sends[i].peer != p->rank || g->sends[i].done)) i++;
    p->coll_send_next = i;
    if (i >= g->n_sends) return false;
    struct xfer_send *s = &g->sends[i];
    size_t limit;
    bool can_finish;
    sock_algo_send_limit(g, s, &limit, &can_finish);
    size_t avail = limit > s->sent ? limit - s->sent : 0,
           frag = avail < FRAG_MAX ? avail : FRAG_MAX;
    if (s->bytes == 0 ? !can_finish : frag == 0) return false;
    if (frag < FRAG_MIN && s->sent + frag < s->bytes && !can_finish) return false;
    frame_header(p->tx_head, FRAME_COLL, s->step, q->seq, s->bytes, s->sent, (uint32_t)frag);
    tx_start(p, frag ? s->src + s->sent : NULL, frag);
    p->tx_is_p2p = false;
    p->tx_send = i;
    return true;
}

static bool pick_p2p(struct peer *p)
{
    struct sock_request *q = p->sendq;
    if (!q) return false;
    size_t left = q->d.bytes - q->done_bytes, frag = left < FRAG_MAX ? left : FRAG_MAX;
    frame_header(p->tx_head, FRAME_P2P, q->d.tag, q->seq, q->d.bytes, q->done_bytes,
                 (uint32_t)frag);
    tx_start(p, frag ? (const uint8_t *)q->d.send + q->done_bytes : NULL, frag);
    p->tx_is_p2p = true;
    return true;
}

static void tx_fragment_done(struct sock_comm *c, struct peer *p, int64_t now)
{
    p->tx_active = false;
    atomic_fetch_add_explicit(&c->payload_sent, p->tx_frag, memory_order_relaxed);
    if (p->tx_is_p2p) {
        struct sock_request *q = p->sendq;
        q->done_bytes += p->tx_frag;
        q->progress_ms = now;
        if (q->done_bytes == q->d.bytes) {
            list_pop(&p->sendq, &p->sendq_tail);
            if (p->sendq) p->sendq->progress_ms = now;
            complete(c, q);
        }
        return;
    }
    struct sock_request *q = running(c);
    struct xfer_send *s = &q->prog.sends[p->tx_send];
    s->sent += p->tx_frag;
    if (s->sent == s->bytes) s->done = true;
    q->progress_ms = now;
}

/* Writes what p's link takes now. Returns whether bytes moved; -1 if the
 * link broke. */
static int tx_progress(struct sock_comm *c, struct peer *p, int64_t now)
{
    bool moved = false;
    size_t budget = IO_BUDGET;
    while (budget > 0) {
        if (!p->tx_active) {
            bool first = p->tx_p2p_turn ? pick_p2p(p) : pick_coll(c, p);
            if (!first && !(p->tx_p2p_turn ? pick_coll(c, p) : pick_p2p(p))) break;
            p->tx_p2p_turn = !p->tx_is_p2p;
        }
        uint64_t before = p->link.bytes_written;
        ssize_t k = sock_link_write(&p->link, p->tx_iov + p->tx_iov_at, 3 - p->tx_iov_at);
        atomic_fetch_add_explicit(&c->bytes_sent, p->link.bytes_written - before,
                                  memory_order_relaxed);
        if (k < 0) return -1;
        if (k == 0) break;
        moved = true;
        size_t done = (size_t)k;
        budget = done < budget ? budget - done : 0;
        p->tx_left -= done;
        while (done > 0) {
            struct iovec *v = &p->tx_iov[p->tx_iov_at];
            size_t n = done < v->iov_len ? done : v->iov_len;
            v->iov_base = (uint8_t *)v->iov_base + n;
            v->iov_len -= n;
            done -= n;
            if (v->iov_len == 0) p->tx_iov_at++;
        }
        while (p->tx_iov_at < 3 && p->tx_iov[p->tx_iov_at].iov_len == 0) p->tx_iov_at++;
        if (p->tx_left == 0) tx_fragment_done(c, p, now);
    }
    return moved;
}

/* ---- receiving --------------------------------------------------------- */

static int protocol_error(struct sock_comm *c, struct peer *p, const char *what)
{
    char who[200];
    peer_name(c, p->rank, who, sizeof who);
    fail_comm(c, true, false,
              "%s sent a frame out of step (%s: kind %u, step/tag %" PRIu32 ", seq %" PRIu64
              ", %" PRIu64 " bytes at %" PRIu64 "); do all ranks post the same collectives in the "
              "same order, and do sends and receives agree on sizes?",
              who, what, p->rx_f.kind, p->rx_f.tag, p->rx_f.seq, p->rx_f.total, p->rx_f.offset);
    return -1;
}

static struct unexpected *ux_new(const struct frame *f)
{
    struct unexpected *u = calloc(1, sizeof *u);
    if (!u) return NULL;
    u->tag = f->tag;
    u->seq = f->seq;
    u->total = f->total;
    u->claim_xfer = -1;
    u->data = f->total ? malloc(f->total) : NULL;
    if (f->total && !u->data) {
        free(u);
        return NULL;
    }
    return u;
}

/* Applies bytes already in memory to collective receive x at its offset. */
static void xfer_apply(struct program *g, struct xfer_recv *x, const uint8_t *src, size_t n)
{
    if (n == 0) return;
    if (x->action == XFER_REDUCE)
        sock_reduce(g->dtype, g->op, x->dst + x->got, src, x->local + x->got, n / g->elem_bytes);
    else
        memcpy(x->dst + x->got, src, n);
    x->got += n;
}

/* A buffered collective message is complete and claimed: hand it over. */
static void ux_coll_deliver(struct sock_request *q, struct peer *p, struct unexpected *u)
{
    struct xfer_recv *x = &q->prog.recvs[u->claim_xfer];
    xfer_apply(&q->prog, x, u->data, u->total);
    x->done = true;
    ux_unlink(&p->ux_coll, u);
    free(u->data);
    free(u);
}

static void ux_p2p_deliver(struct sock_comm *c, struct peer *p, struct unexpected *u)
{
    struct sock_request *q = u->claim_req;
    if (u->total) memcpy(q->d.recv, u->data, u->total);
    ux_unlink(&p->ux_p2p, u);
    free(u->data);
    free(u);
    complete(c, q);
}

/* A collective's frame: the message under way, the one this collective expects next, or an
 * early one kept for a collective to come. */
static int rx_target_coll(struct sock_comm *c, struct peer *p, int64_t now)
{
    struct frame *f = &p->rx_f;
    struct sock_request *q = running(c);
    if (q && f->seq == q->seq) q->progress_ms = now;
    if (f->offset > 0) { /* a message under way */
        if (p->coll_in_ux) {
            p->rx_ux = p->coll_in_ux;
        } else if (p->coll_in_xfer >= 0 && q && q->seq == f->seq) {
            p->rx_xfer = p->coll_in_xfer;
        } else {
            return protocol_error(c, p, "continuation of no message");
        }
    } else if (q && f->seq == q->seq) {
        struct program *g = &q->prog;
        int i = p->coll_recv_next;
        while (i < g->n_recvs && g->recvs[i].peer != p->rank) i++;
        if (i >= g->n_recvs || g->recvs[i].step != f->tag || g->recvs[i].bytes != f->total)
            return protocol_error(c, p, "not the message this collective expects next");
        p->coll_recv_next = i + 1;
        p->rx_xfer = p->coll_in_xfer = i;
    } else if (f->seq >= (q ? q->seq + 1 : c->collq ? c->collq->seq : c->next_seq)) {
        struct unexpected *u = ux_new(f);
        if (!u) {
            fail_comm(c, true, false, "out of memory buffering %" PRIu64 " early bytes", f->total);
            return -1;
        }
        ux_append(&p->ux_coll, u);
        p->rx_ux = p->coll_in_ux = u;
    } else {
        return protocol_error(c, p, "a collective that is over");
    }
    if (p->rx_ux && (p->rx_ux->seq != f->seq || p->rx_ux->tag != f->tag ||
                     p->rx_ux->total != f->total || p->rx_ux->got != f->offset))
        return protocol_error(c, p, "does not continue its message");
    if (p->rx_xfer >= 0) {
        struct xfer_recv *x = &q->prog.recvs[p->rx_xfer];
        if (x->got != f->offset || x->bytes != f->total)
            return protocol_error(c, p, "does not continue its message");
        q->progress_ms = now;
    }
    return 0;
}

/* The continuation of a point-to-point message: into its receive, or its early buffer. */
static int rx_target_p2p_more(struct sock_comm *c, struct peer *p, int64_t now)
{
    struct frame *f = &p->rx_f;
    if (p->p2p_in_req) {
        p->rx_req = p->p2p_in_req;
        if (p->rx_req->done_bytes != f->offset)
            return protocol_error(c, p, "does not continue its message");
        p->rx_req->progress_ms = now;
    } else if (p->p2p_in_ux) {
        p->rx_ux = p->p2p_in_ux;
        if (p->rx_ux->got != f->offset) return protocol_error(c, p, "does not continue its message");
        if (p->rx_ux->claim_req) p->rx_ux->claim_req->progress_ms = now;
    } else {
        return protocol_error(c, p, "continuation of no message");
    }
    return 0;
}

/* The first frame of a point-to-point message: the posted receive of its tag, or an early
 * buffer until one is posted. */
static int rx_target_p2p_first(struct sock_comm *c, struct peer *p, int64_t now)
{
    struct frame *f = &p->rx_f;
    if (f->seq != p->p2p_rx_seq++) return protocol_error(c, p, "message number out of order");
    struct sock_request *prev = NULL, *q = p->recvq;
    while (q && q->d.tag != f->tag) prev = q, q = q->next;
    if (q) {
        if (q->d.bytes != f->total) {
            char who[200];
            peer_name(c, p->rank, who, sizeof who);
            fail_comm(c, true, false,
                      "%s sent %" PRIu64 " bytes with tag %" PRIu32
                      " but the matching receive expects %zu",
                      who, f->total, f->tag, q->d.bytes);
            return -1;
        }
        if (prev)
            prev->next = q->next;
        else
            p->recvq = q->next;
        if (p->recvq_tail == q) p->recvq_tail = prev;
        q->next = NULL;
        q->progress_ms = now;
        p->rx_req = p->p2p_in_req = q;
        return 0;
    }
    struct unexpected *u = ux_new(f);
    if (!u) {
        fail_comm(c, true, false, "out of memory buffering %" PRIu64 " early bytes", f->total);
        return -1;
    }
    ux_append(&p->ux_p2p, u);
    p->rx_ux = p->p2p_in_ux = u;
    return 0;
}

/* Decides where the fragment whose header is in p->rx_f goes. 0 or -1. */
static int rx_target(struct sock_comm *c, struct peer *p, int64_t now)
{
    struct frame *f = &p->rx_f;
    p->rx_xfer = -1;
    p->rx_req = NULL;
    p->rx_ux = NULL;
    if (f->offset + f->bytes > f->total || f->bytes > FRAG_MAX)
        return protocol_error(c, p, "fragment outside its message");
    if (f->kind == FRAME_COLL) return rx_target_coll(c, p, now);
    if (f->kind != FRAME_P2P) return protocol_error(c, p, "unknown kind");
    return f->offset > 0 ? rx_target_p2p_more(c, p, now) : rx_target_p2p_first(c, p, now);
}

/* Moves payload of the current fragment into its target. Bytes taken, or -1. */
static ssize_t rx_payload(struct sock_comm *c, struct peer *p, size_t budget)
{
    size_t taken = 0;
    if (p->rx_xfer >= 0) {
        struct sock_request *q = running(c);
        struct program *g = &q->prog;
        struct xfer_recv *x = &g->recvs[p->rx_xfer];
        if (x->action == XFER_REDUCE) {
            size_t e = g->elem_bytes;
            while (p->rx_left > 0 && taken < budget) {
                const uint8_t *src;
                size_t avail;
                if (sock_link_peek(&p->link, e, &src, &avail)) return -1;
                size_t n = avail < p->rx_left ? avail : p->rx_left;
                if (n < p->rx_left) n -= n % e;
                if (n == 0) break;
                xfer_apply(g, x, src, n);
                sock_link_consume(&p->link, n);
                p->rx_left -= n;
                taken += n;
            }
            return (ssize_t)taken;
        }
        while (p->rx_left > 0 && taken < budget) {
            ssize_t k = sock_link_read(&p->link, x->dst + x->got, p->rx_left);
            if (k <= 0) return k < 0 ? -1 : (ssize_t)taken;
            x->got += (size_t)k;
            p->rx_left -= (size_t)k;
            taken += (size_t)k;
        }
        return (ssize_t)taken;
    }
    uint8_t *dst;
    size_t *got;
    if (p->rx_req) {
        dst = (uint8_t *)p->rx_req->d.recv;
        got = &p->rx_req->done_bytes;
    } else {
        dst = p->rx_ux->data;
        got = &p->rx_ux->got;
    }
    while (p->rx_left > 0 && taken < budget) {
        ssize_t k = sock_link_read(&p->link, dst + *got, p->rx_left);
        if (k <= 0) return k < 0 ? -1 : (ssize_t)taken;
        *got += (size_t)k;
        p->rx_left -= (size_t)k;
        taken += (size_t)k;
    }
    return (ssize_t)taken;
}

/* The current fragment is all in: finish messages that it completes. */
static void rx_fragment_done(struct sock_comm *c, struct peer *p)
{
    struct frame *f = &p->rx_f;
    bool last = f->offset + f->bytes == f->total;
    p->rx_in_payload = false;
    if (!last) return;
    if (f->kind == FRAME_COLL) {
        if (p->rx_xfer >= 0) {
            running(c)->prog.recvs[p->rx_xfer].done = true;
        } else if (p->rx_ux->claim_xfer >= 0) {
            ux_coll_deliver(running(c), p, p->rx_ux);
        }
        p->coll_in_xfer = -1;
        p->coll_in_ux = NULL;
        return;
    }
    if (p->rx_req) {
        p->p2p_in_req = NULL;
        complete(c, p->rx_req);
    } else if (p->rx_ux->claim_req) {
        ux_p2p_deliver(c, p, p->rx_ux);
    }
    p->p2p_in_req = NULL;
    p->p2p_in_ux = NULL;
    p->rx_req = NULL;
    p->rx_ux = NULL;
}

/* Reads what p's link has now. Whether bytes moved; -1 if the link broke
 * or the communicator failed. */
static int rx_progress(struct sock_comm *c, struct peer *p, int64_t now)
{
    bool moved = false;
    size_t budget = IO_BUDGET;
    uint64_t before = p->link.bytes_read;
    int rc = 0;
    while (budget > 0) {
        if (!p->rx_in_payload) {
            ssize_t k =
                sock_link_read(&p->link, p->rx_hdr + p->rx_hdr_got, FRAME_BYTES - p->rx_hdr_got);
            if (k < 0) {
                rc = -1;
                break;
            }
            if (k == 0) break;
            moved = true;
            p->rx_hdr_got += (size_t)k;
            if (p->rx_hdr_got < FRAME_BYTES) continue;
            p->rx_hdr_got = 0;
            const uint8_t *h = p->rx_hdr;
            p->rx_f = (struct frame){.kind = h[0],
                                     .tag = get_u32(h + 4),
                                     .seq = get_u64(h + 8),
                                     .total = get_u64(h + 16),
                                     .offset = get_u64(h + 24),
                                     .bytes = get_u32(h + 32)};
            if (get_u32(h + 36) != FRAME_MAGIC || h[1] || h[2] || h[3]) {
                protocol_error(c, p, "bad header");
                rc = -1;
                break;
            }
            if (rx_target(c, p, now)) {
                rc = -1;
                break;
            }
            p->rx_in_payload = true;
            p->rx_left = p->rx_f.bytes;
            p->rx_pad_left = pad8(p->rx_f.bytes);
        }
        if (p->rx_left > 0) {
            ssize_t k = rx_payload(c, p, budget);
            if (k < 0) {
                rc = -1;
                break;
            }
            if (k == 0) break;
            moved = true;
            budget = (size_t)k < budget ? budget - (size_t)k : 0;
            if (p->rx_left > 0) continue;
        }
        if (p->rx_pad_left > 0) {
            uint8_t pad[8];
            ssize_t k = sock_link_read(&p->link, pad, p->rx_pad_left);
            if (k < 0) {
                rc = -1;
                break;
            }
            if (k == 0) break;
            p->rx_pad_left -= (size_t)k;
            if (p->rx_pad_left > 0) continue;
        }
        rx_fragment_done(c, p);
    }
    atomic_fetch_add_explicit(&c->bytes_received, p->link.bytes_read - before,
                              memory_order_relaxed);
    return rc ? rc : moved;
}

/* ---- operations -------------------------------------------------------- */

/* Starts the collective at the head of the queue: builds its program and
 * takes what arrived for it early. 0, or -1 (the communicator failed). */
static int start_collective(struct sock_comm *c, struct sock_request *q, int64_t now)
{
    if (sock_algo_build(&q->prog, &q->d, c->base.rank, c->base.size, c->cfg.algorithm,
                        c->cfg.small_bytes)) {
        fail_comm(c, true, false, "out of memory starting %s", comm_op_kind_name(q->d.kind));
        return -1;
    }
    q->started = true;
    q->progress_ms = now;
    for (int r = 0; r < c->base.size; r++) {
        struct peer *p = &c->peers[r];
        if (r == c->base.rank) continue;
        p->coll_send_next = p->coll_recv_next = 0;
        p->coll_in_xfer = -1;
        struct program *g = &q->prog;
        for (struct unexpected *u = p->ux_coll, *next; u; u = next) {
            next = u->next;
            if (u->seq != q->seq) continue;
            int i = p->coll_recv_next;
            while (i < g->n_recvs && g->recvs[i].peer != r) i++;
            if (i >= g->n_recvs || g->recvs[i].step != u->tag || g->recvs[i].bytes != u->total) {
                char who[200];
                peer_name(c, r, who, sizeof who);
                fail_comm(c, true, false,
                          "%s sent step %" PRIu32 " (%zu bytes) of collective #%" PRIu64
                          ", which this rank's %s does not expect; do all ranks post the same "
                          "collectives in the same order?",
                          who, u->tag, u->total, q->seq, comm_op_kind_name(q->d.kind));
                return -1;
            }
            p->coll_recv_next = i + 1;
            u->claim_xfer = i;
            if (u->got == u->total && u != p->coll_in_ux) ux_coll_deliver(q, p, u);
        }
    }
    return 0;
}

/* Runs what can run of the collectives: combines, completions, the next
 * start. Whether anything happened. */
static bool advance_collectives(struct sock_comm *c, int64_t now)
{
    bool any = false;
    while (c->collq && !c->failed) {
        struct sock_request *q = c->collq;
        if (!q->started) {
            if (start_collective(c, q, now)) return true;
            any = true;
        }
        if (sock_algo_combine(&q->prog)) {
            q->progress_ms = now;
            any = true;
        }
        if (!sock_algo_complete(&q->prog)) break;
        list_pop(&c->collq, &c->collq_tail);
        complete(c, q);
        any = true;
    }
    return any;
}

/* A posted receive first looks among the messages that came early. */
static void post_recv(struct sock_comm *c, struct sock_request *q, int64_t now)
{
    struct peer *p = &c->peers[q->d.peer];
    q->progress_ms = now;
    for (struct unexpected *u = p->ux_p2p; u; u = u->next) {
        if (u->claim_req || u->tag != q->d.tag) continue;
        if (u->total != q->d.bytes) {
            char who[200];
            peer_name(c, p->rank, who, sizeof who);
            fail_comm(c, true, false,
                      "%s sent %zu bytes with tag %" PRIu32 " but the matching receive expects %zu",
                      who, u->total, u->tag, q->d.bytes);
            return;
        }
        u->claim_req = q;
        if (u->got == u->total && u != p->p2p_in_ux) ux_p2p_deliver(c, p, u);
        return;
    }
    sock_request_list_push(&p->recvq, &p->recvq_tail, q);
}

static void take_request(struct sock_comm *c, struct sock_request *q, int64_t now)
{
    switch (q->d.kind) {
    case COMM_OP_SEND: {
        struct peer *p = &c->peers[q->d.peer];
        q->seq = p->p2p_tx_seq++;
        q->progress_ms = now;
        sock_request_list_push(&p->sendq, &p->sendq_tail, q);
        return;
    }
    case COMM_OP_RECV:
        post_recv(c, q, now);
        return;
    default:
        q->seq = c->next_seq++;
        sock_request_list_push(&c->collq, &c->collq_tail, q);
        return;
    }
}

/* Whether anything pending or under way needs peer p. */
static bool peer_needed(const struct sock_comm *c, const struct peer *p)
{
    if (p->sendq || p->recvq || p->tx_active || p->rx_in_payload || p->rx_hdr_got ||
        p->coll_in_ux || p->p2p_in_ux || p->p2p_in_req)
        return true;
    for (struct unexpected *u = p->ux_p2p; u; u = u->next)
        if (u->claim_req) return true;
    const struct sock_request *q = running(c);
    if (q) {
        for (int i = 0; i < q->prog.n_sends; i++)
            if (q->prog.sends[i].peer == p->rank && !q->prog.sends[i].done) return true;
        for (int i = 0; i < q->prog.n_recvs; i++)
            if (q->prog.recvs[i].peer == p->rank && !q->prog.recvs[i].done) return true;
    }
    return false;
}

/* What the operation that needs p was doing, for the error. */
static void needed_by(const struct sock_comm *c, const struct peer *p, char *out, size_t n)
{
    const struct sock_request *q = running(c);
    if (p->sendq)
        q = p->sendq;
    else if (p->recvq)
        q = p->recvq;
    else if (p->p2p_in_req)
        q = p->p2p_in_req;
    if (q)
        op_name(q, out, n);
    else
        snprintf(out, n, "a message under way");
}

/* Fails the communicator if a peer that is gone is needed. */
static void check_peers(struct sock_comm *c)
{
    for (int r = 0; r < c->base.size && !c->failed; r++) {
        struct peer *p = &c->peers[r];
        if (r == c->base.rank) continue;
        /* closed, and what it sent before is all taken (or cannot be: a
           message cut short) */
        if (!p->gone && p->link.peer_closed && (!sock_link_rx_ready(&p->link) || !p->rx_moved)) {
            p->gone = true;
            if (p->link.kind == SOCK_LINK_SHM)
                snprintf(p->gone_why, sizeof p->gone_why, "its process ended");
            else
                snprintf(p->gone_why, sizeof p->gone_why, "%s",
                         p->link.closed_errno ? strerror(p->link.closed_errno)
                                              : "it closed the connection");
        }
        if (p->gone && peer_needed(c, p)) {
            char who[200], what[200], reason[700];
            if (sock_job_aborted(c->job, reason, sizeof reason)) { /* p died of it, after */
                fail_comm(c, false, true, "the job was aborted: %s", reason);
                return;
            }
            peer_name(c, r, who, sizeof who);
            needed_by(c, p, what, sizeof what);
            fail_comm(c, true, true, "peer %s is gone (%s) during %s", who, p->gone_why, what);
        }
    }
}

/* Fails the communicator if an operation has not moved for timeout_s.
 * Returns the time of the next deadline. */
static int64_t check_deadlines(struct sock_comm *c, int64_t now)
{
    int64_t next = now + 1000;
    char what[200], who[200];
    struct sock_request *q = running(c);
    if (q) {
        int64_t due = q->progress_ms + c->timeout_ms;
        if (now >= due) {
            int late = -1;
            const char *how = "sent nothing to this rank";
            for (int i = 0; i < q->prog.n_recvs && late < 0; i++)
                if (!q->prog.recvs[i].done) late = q->prog.recvs[i].peer;
            for (int i = 0; i < q->prog.n_sends && late < 0; i++)
                if (!q->prog.sends[i].done) late = q->prog.sends[i].peer, how = "took nothing";
            op_name(q, what, sizeof what);
            peer_name(c, late < 0 ? c->base.rank : late, who, sizeof who);
            fail_comm(c, true, true,
                      "%s: %s %s for %.1f s (did it die, stall, or not post this collective?)",
                      what, who, how, c->timeout_ms / 1000.0);
            return now;
        }
        if (due < next) next = due;
    }
    for (int r = 0; r < c->base.size; r++) {
        struct peer *p = &c->peers[r];
        if (r == c->base.rank) continue;
        struct sock_request *late = NULL, *heads[2] = {p->sendq, p->p2p_in_req};
        for (int k = 0; k < 2 && !late; k++) {
            if (!heads[k]) continue;
            if (now >= heads[k]->progress_ms + c->timeout_ms) late = heads[k];
            if (heads[k]->progress_ms + c->timeout_ms < next)
                next = heads[k]->progress_ms + c->timeout_ms;
        }
        for (struct sock_request *x = p->recvq; x && !late; x = x->next) {
            if (now >= x->progress_ms + c->timeout_ms) late = x;
            if (x->progress_ms + c->timeout_ms < next) next = x->progress_ms + c->timeout_ms;
        }
        if (!late) continue;
        op_name(late, what, sizeof what);
        peer_name(c, r, who, sizeof who);
        fail_comm(c, true, true, "%s: nothing moved for %.1f s (did %s die or stall?)", what,
                  c->timeout_ms / 1000.0, who);
        return now;
    }
    return next;
}

/* ---- the progress thread ----------------------------------------------- */

/* Takes what callers posted, and the job's abort; false when asked to stop. */
static bool take_submitted(struct sock_comm *c, int64_t now)
{
    pthread_mutex_lock(&c->mu);
    if (c->stop) {
        pthread_mutex_unlock(&c->mu);
        return false;
    }
    struct sock_request *taken = c->submit;
    c->submit = c->submit_tail = NULL;
    bool aborted = c->abort_pending && !c->failed;
    char reason[sizeof c->abort_text];
    if (aborted) memcpy(reason, c->abort_text, sizeof reason);
    if (c->failed && taken) {
        fail_list_locked(taken);
        taken = NULL;
        pthread_cond_broadcast(&c->done_cond);
    }
    pthread_mutex_unlock(&c->mu);
    while (taken) {
        struct sock_request *next = taken->next;
        take_request(c, taken, now);
        taken = next;
    }
    if (aborted) fail_comm(c, false, true, "the job was aborted: %s", reason);
    return true;
}

/* Every live peer's receiving side; whether any moved. */
static bool receive_all(struct sock_comm *c, int64_t now)
{
    bool moved = false;
    for (int r = 0; r < c->base.size && !c->failed; r++) {
        struct peer *p = &c->peers[r];
        if (r == c->base.rank || p->gone) continue;
        int k = rx_progress(c, p, now);
        if (k < 0 && !c->failed) p->link.peer_closed = true;
        p->rx_moved = k > 0;
        moved |= k > 0;
    }
    return moved;
}

/* Every live peer's sending side; whether any moved. A link that fails to send is gone. */
static bool send_all(struct sock_comm *c, int64_t now)
{
    bool moved = false;
    for (int r = 0; r < c->base.size && !c->failed; r++) {
        struct peer *p = &c->peers[r];
        if (r == c->base.rank || p->gone) continue;
        int k = tx_progress(c, p, now);
        if (k < 0 && !c->failed) {
            p->gone = p->link.peer_closed = true;
            snprintf(p->gone_why, sizeof p->gone_why, "%s",
                     p->link.kind == SOCK_LINK_SHM
                         ? "its process ended"
                         : strerror(p->link.closed_errno ? p->link.closed_errno : EPIPE));
        }
        moved |= k > 0;
    }
    return moved;
}

/* One pass over the collectives and the links; whether anything moved. *next_due: when a
 * deadline next needs looking at. */
static bool move_once(struct sock_comm *c, int64_t now, int64_t *next_due)
{
    *next_due = now + 1000;
    if (c->failed) return false;
    bool moved = advance_collectives(c, now);
    moved |= receive_all(c, now);
    moved |= advance_collectives(c, now);
    moved |= send_all(c, now);
    moved |= advance_collectives(c, now);
    if (!c->failed) check_peers(c);
    if (!c->failed) *next_due = check_deadlines(c, now);
    return moved;
}

/* Nothing to do now: sleeps until a link or a caller wakes the thread, or next_due. */
static void sleep_until_woken(struct sock_comm *c, int64_t next_due)
{
    struct pollfd *pfds = c->pfds;
    int *pfd_peer = c->pfd_peer, np = 0;
    bool ready = false;
    pfds[np] = (struct pollfd){.fd = c->wake_fd, .events = POLLIN};
    pfd_peer[np++] = -1;
    for (int r = 0; r < c->base.size && !c->failed; r++) {
        struct peer *p = &c->peers[r];
        if (r == c->base.rank || p->gone || p->link.peer_closed) continue;
        bool want_write = p->tx_active && p->link.tx_blocked;
        if (sock_link_prepare_sleep(&p->link, want_write)) ready = true;
        short ev = POLLIN;
        if (want_write && p->link.kind == SOCK_LINK_TCP) ev |= POLLOUT;
        pfds[np] = (struct pollfd){.fd = p->link.fd, .events = ev};
        pfd_peer[np++] = r;
    }
    /* posters write wake_fd only while this is set (sock_post); look at
       what they posted once more after setting it */
    atomic_store(&c->sleeping, true);
    pthread_mutex_lock(&c->mu);
    if (c->submit || c->stop || (c->abort_pending && !c->failed)) ready = true;
    pthread_mutex_unlock(&c->mu);
    int64_t wait_ms = ready ? 0 : next_due - sock_now_ms();
    int k = poll(pfds, (nfds_t)np, wait_ms < 0 ? 0 : wait_ms > 1000 ? 1000 : (int)wait_ms);
    atomic_store(&c->sleeping, false);
    if (k < 0 && errno != EINTR) {
        fail_comm(c, true, false, "poll: %s", strerror(errno));
        return;
    }
    for (int i = 0; i < np; i++) {
        if (pfd_peer[i] < 0) {
            uint64_t v;
            if (pfds[i].revents & POLLIN) (void)!read(c->wake_fd, &v, sizeof v);
            continue;
        }
        struct peer *p = &c->peers[pfd_peer[i]];
        sock_link_after_sleep(&p->link);
        if (p->link.kind == SOCK_LINK_SHM && pfds[i].revents) sock_link_drain_doorbell(&p->link);
    }
}

void *sock_progress_main(void *arg)
{
    struct sock_comm *c = arg;
    int64_t idle_since = 0;
    for (;;) {
        int64_t now = sock_now_ms(), next_due;
        atomic_store_explicit(&c->beat_ms, now, memory_order_relaxed);
        if (!take_submitted(c, now)) break;
        if (move_once(c, now, &next_due)) {
            idle_since = 0;
            continue;
        }
        /* nothing moved: while a caller is blocked waiting (its CPU is free),
           look again for a while, yielding, so a reply about to come costs no
           wake-up; while callers compute, sleep at once and leave them the CPU */
        int64_t t_us = sock_now_us();
        if (!idle_since) idle_since = t_us;
        if (t_us - idle_since < c->cfg.spin_us && atomic_load(&c->waiters) > 0) {
            sched_yield();
            continue;
        }
        sleep_until_woken(c, next_due);
    }
    return NULL;
}
