/* store_server_loop.c — the store server's thread: one epoll loop that accepts
 * connections (pausing after EMFILE and friends), hands each event to its
 * connection, expires deadlines and publishes the stats. Not what a
 * connection does with its event (store_server_conn.c, store_server_input.c). */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include "common/log.h"
#include "common/store/store_server_internal.h"

#define ACCEPT_PAUSE_MS 100 /* after EMFILE and friends */

static void set_accepting(struct store_server *srv, bool on)
{
    struct epoll_event ev = {.events = on ? EPOLLIN : 0, .data.ptr = &srv->listen_fd};
    if (epoll_ctl(srv->epoll_fd, EPOLL_CTL_MOD, srv->listen_fd, &ev) != 0)
        log_warn("store: epoll_ctl(MOD) for the listening socket: %s", strerror(errno));
    srv->accept_paused_until_ms = on ? 0 : now_ms() + ACCEPT_PAUSE_MS;
}

static void accept_all(struct store_server *srv)
{
    for (;;) {
        struct sockaddr_storage sa;
        socklen_t len = sizeof sa;
        int fd =
            accept4(srv->listen_fd, (struct sockaddr *)&sa, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            srv_conn_open(srv, fd, &sa, len);
            continue;
        }
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        /* EMFILE, ENFILE, ENOBUFS, ENOMEM: the backlog waits a moment */
        log_warn("store: accept: %s; pausing new connections for %d ms", strerror(errno),
                 ACCEPT_PAUSE_MS);
        set_accepting(srv, false);
        return;
    }
}

/* Deadlines that passed: a handshake that never came, a wait that timed out. */
static void expire(struct store_server *srv)
{
    int64_t now = now_ms();
    while (srv->heap_len && srv->heap[0]->deadline_ms <= now) {
        struct conn *c = srv->heap[0];
        if (c->phase == PHASE_AUTH) {
            if (srv_turned_away_say(srv, c->peer))
                log_warn("store: closed the connection from %s: no handshake within %d s", c->peer,
                         STORE_WIRE_AUTH_TIMEOUT_MS / 1000);
            srv_conn_kill(srv, c);
            continue;
        }
        if (!c->waiting_on) { /* cannot happen: only those two have deadlines */
            srv_heap_remove(srv, c);
            continue;
        }
        srv_unpark(srv, c);
        srv_reply(srv, c, STORE_STATUS_TIMEOUT, 0, NULL, NULL);
    }
    if (srv->accept_paused_until_ms && now >= srv->accept_paused_until_ms) set_accepting(srv, true);
}

static int next_timeout_ms(const struct store_server *srv)
{
    int64_t next = INT64_MAX;
    if (srv->heap_len) next = srv->heap[0]->deadline_ms;
    if (srv->accept_paused_until_ms && srv->accept_paused_until_ms < next)
        next = srv->accept_paused_until_ms;
    if (next == INT64_MAX) return -1;
    int64_t wait = next - now_ms();
    return wait < 0 ? 0 : wait > 60000 ? 60000 : (int)wait;
}

static void conn_event(struct store_server *srv, struct conn *c, uint32_t events)
{
    if (c->dead) return;
    if (events & (EPOLLERR | EPOLLHUP)) {
        srv_conn_kill(srv, c);
        return;
    }
    if (events & EPOLLOUT) srv_conn_flush(srv, c);
    if (!c->dead && (events & EPOLLIN)) srv_conn_read(srv, c);
    /* closed while we are not reading (parked, or a reply not yet taken) */
    if (!c->dead && (events & EPOLLRDHUP) && !srv_can_read(c)) srv_conn_kill(srv, c);
}

void srv_publish_stats(struct store_server *srv)
{
    size_t parked = 0;
    for (size_t i = 0; i < srv->heap_len; i++) parked += srv->heap[i]->waiting_on != NULL;
    pthread_mutex_lock(&srv->stats_mu);
    srv->stats = (struct store_server_stats){
        .bytes_held = srv->bytes_held,
        .keys = srv->keys_with_value,
        .connections = srv->conn_count,
        .parked = parked,
        .refused = srv->refused,
        .bad_requests = srv->bad_requests,
        .requests = srv->requests,
    };
    pthread_mutex_unlock(&srv->stats_mu);
}

void *srv_main(void *arg)
{
    struct store_server *srv = arg;
    struct epoll_event events[256];
    bool stop = false;
    while (!stop) {
        int n = epoll_wait(srv->epoll_fd, events, 256, next_timeout_ms(srv));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            log_error("store: epoll_wait: %s; the store server stops", strerror(errno));
            break;
        }
        for (int i = 0; i < n; i++) {
            void *p = events[i].data.ptr;
            if (p == &srv->wake_fd)
                stop = true;
            else if (p == &srv->listen_fd)
                accept_all(srv);
            else
                conn_event(srv, p, events[i].events);
        }
        expire(srv);
        srv_bury(srv);
        srv_publish_stats(srv);
    }
    while (srv->conns)
        srv_conn_kill(srv, srv->conns); /* their clients fail now, not at a deadline */
    srv_bury(srv);
    srv_publish_stats(srv);
    return NULL;
}
