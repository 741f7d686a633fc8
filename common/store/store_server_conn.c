/* store_server_conn.c — a store server connection's life: opened with its
 * hello, parked on a key and unparked, its replies queued and flushed, closed
 * and buried at the end of the loop iteration. Not the reading of requests
 * (store_server_input.c) nor what they ask (store_server_requests.c). */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "common/log.h"
#include "common/store/store_server_internal.h"

static void peer_name(const struct sockaddr_storage *sa, socklen_t len, char *out, size_t n)
{
    char host[INET6_ADDRSTRLEN], port[8];
    int rc = getnameinfo((const struct sockaddr *)sa, len, host, sizeof host, port, sizeof port,
                         NI_NUMERICHOST | NI_NUMERICSERV);
    if (rc != 0)
        snprintf(out, n, "an unknown address (%s)", gai_strerror(rc));
    else
        snprintf(out, n, strchr(host, ':') ? "[%s]:%s" : "%s:%s", host, port);
}

void srv_conn_open(struct store_server *srv, int fd, const struct sockaddr_storage *sa,
                   socklen_t len)
{
    char peer[INET6_ADDRSTRLEN + 16];
    peer_name(sa, len, peer, sizeof peer);
    struct conn *c = srv_alloc_counted(srv, sizeof *c);
    if (!c) {
        if (srv_turned_away_say(srv, peer))
            log_warn("store: refused a connection from %s: the server is at its memory limit",
                     peer);
        close(fd);
        return;
    }
    c->fd = fd;
    c->heap_index = NO_HEAP;
    c->rank = -1;
    c->phase = PHASE_AUTH;
    memcpy(c->peer, peer, sizeof peer);
    int one = 1;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0)
        log_warn("store: TCP_NODELAY for %s: %s (replies may be slower)", peer, strerror(errno));
    if (getrandom(c->nonce, sizeof c->nonce, 0) != (ssize_t)sizeof c->nonce) {
        log_warn("store: refused a connection from %s: getrandom: %s", peer, strerror(errno));
        goto fail;
    }
    if (!srv_heap_push(srv, c, now_ms() + STORE_WIRE_AUTH_TIMEOUT_MS)) goto fail;
    struct epoll_event ev = {.events = EPOLLRDHUP, .data.ptr = c};
    if (epoll_ctl(srv->epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        log_warn("store: epoll_ctl(ADD) for %s: %s", peer, strerror(errno));
        srv_heap_remove(srv, c);
        goto fail;
    }
    c->events = EPOLLRDHUP;
    c->next = srv->conns;
    if (srv->conns) srv->conns->prev = c;
    srv->conns = c;
    srv->conn_count++;
    memcpy(c->out, STORE_WIRE_MAGIC, 4); /* hello */
    store_wire_put_u32(c->out + 4, STORE_WIRE_VERSION);
    memcpy(c->out + 8, c->nonce, STORE_WIRE_NONCE_BYTES);
    c->out_bytes = STORE_WIRE_HELLO_BYTES;
    srv_conn_flush(srv, c);
    return;
fail:
    close(fd);
    srv_free_counted(srv, c, sizeof *c);
}

void srv_unpark(struct store_server *srv, struct conn *c)
{
    struct entry *e = c->waiting_on;
    if (!e) return;
    if (c->wait_prev)
        c->wait_prev->wait_next = c->wait_next;
    else
        e->waiters = c->wait_next;
    if (c->wait_next) c->wait_next->wait_prev = c->wait_prev;
    c->waiting_on = NULL;
    c->wait_prev = c->wait_next = NULL;
    srv_heap_remove(srv, c);
    srv_entry_forget_if_unused(srv, e);
}

bool srv_park(struct store_server *srv, struct conn *c, struct entry *e, int64_t wait_ms)
{
    if (!srv_heap_push(srv, c, now_ms() + wait_ms)) return false;
    c->waiting_on = e;
    c->wait_op = c->req.op;
    c->wait_prev = NULL;
    c->wait_next = e->waiters;
    if (e->waiters) e->waiters->wait_prev = c;
    e->waiters = c;
    return true;
}

/* Closes c now; its memory goes at the end of the loop iteration, so that
 * pointers to it held by the caller stay valid (c->dead says it is gone). */
void srv_conn_kill(struct store_server *srv, struct conn *c)
{
    if (c->dead) return;
    c->dead = true;
    srv_unpark(srv, c);
    srv_heap_remove(srv, c);
    if (epoll_ctl(srv->epoll_fd, EPOLL_CTL_DEL, c->fd, NULL) != 0)
        log_warn("store: epoll_ctl(DEL) for %s: %s", c->peer, strerror(errno));
    close(c->fd);
    c->fd = -1;
    srv_blob_release(srv, c->out_blob);
    c->out_blob = NULL;
    srv_input_reset(srv, c);
    srv_free_counted(srv, c->keys, c->keys_cap);
    c->keys = NULL;
    if (c->prev)
        c->prev->next = c->next;
    else
        srv->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    srv->conn_count--;
    c->prev = NULL;
    c->next = srv->graveyard;
    srv->graveyard = c;
}

void srv_bury(struct store_server *srv)
{
    while (srv->graveyard) {
        struct conn *c = srv->graveyard;
        srv->graveyard = c->next;
        srv_free_counted(srv, c, sizeof *c);
    }
}

static bool out_pending(const struct conn *c)
{
    return c->out_sent < c->out_bytes + c->out_blob_bytes;
}

bool srv_can_read(const struct conn *c)
{
    return !c->dead && !c->closing && !c->waiting_on && !out_pending(c);
}

void srv_update_events(struct store_server *srv, struct conn *c)
{
    uint32_t want = EPOLLRDHUP;
    if (out_pending(c))
        want |= EPOLLOUT;
    else if (srv_can_read(c))
        want |= EPOLLIN;
    if (want == c->events) return;
    struct epoll_event ev = {.events = want, .data.ptr = c};
    if (epoll_ctl(srv->epoll_fd, EPOLL_CTL_MOD, c->fd, &ev) != 0) {
        log_warn("store: epoll_ctl(MOD) for %s: %s; closing it", c->peer, strerror(errno));
        srv_conn_kill(srv, c);
        return;
    }
    c->events = want;
}

/* Sends what it can of c's output; the rest waits for EPOLLOUT. */
void srv_conn_flush(struct store_server *srv, struct conn *c)
{
    while (!c->dead && out_pending(c)) {
        struct iovec iov[2];
        int n = 0;
        if (c->out_sent < c->out_bytes)
            iov[n++] = (struct iovec){c->out + c->out_sent, c->out_bytes - c->out_sent};
        size_t blob_sent = c->out_sent > c->out_bytes ? c->out_sent - c->out_bytes : 0;
        if (blob_sent < c->out_blob_bytes)
            iov[n++] = (struct iovec){c->out_blob->data + blob_sent, c->out_blob_bytes - blob_sent};
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        ssize_t k = sendmsg(c->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        if (k < 0) { /* the peer went away: nothing to tell anyone */
            srv_conn_kill(srv, c);
            return;
        }
        c->out_sent += (size_t)k;
    }
    if (c->dead) return;
    if (!out_pending(c)) {
        srv_blob_release(srv, c->out_blob);
        c->out_blob = NULL;
        c->out_bytes = c->out_sent = c->out_blob_bytes = 0;
        if (c->closing) {
            srv_conn_kill(srv, c);
            return;
        }
    }
    srv_update_events(srv, c);
}

/* Queues a reply: a status, a result, and either a short text or a shared value. */
void srv_reply(struct store_server *srv, struct conn *c, uint8_t status, int64_t result,
               const char *text, struct blob *value)
{
    if (c->dead) return;
    size_t text_bytes = text ? strnlen(text, REPLY_TEXT_BYTES) : 0;
    struct store_wire_reply r = {status, text ? text_bytes : value ? value->bytes : 0, result};
    store_wire_encode_reply(c->out, &r);
    if (text_bytes) memcpy(c->out + STORE_WIRE_REPLY_BYTES, text, text_bytes);
    c->out_bytes = STORE_WIRE_REPLY_BYTES + text_bytes;
    c->out_sent = 0;
    if (!text && value) {
        value->refs++;
        c->out_blob = value;
        c->out_blob_bytes = value->bytes;
    }
    srv_conn_flush(srv, c);
}

/* A reply after which the stream cannot be trusted: the connection closes. */
void srv_reply_and_close(struct store_server *srv, struct conn *c, uint8_t status, const char *text)
{
    srv->bad_requests++;
    log_warn("store: closing the connection of rank %d from %s: %s", (int)c->rank, c->peer, text);
    c->closing = true;
    srv_reply(srv, c, status, 0, text, NULL);
}
