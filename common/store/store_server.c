/* store_server.c — the rendezvous store's server started and stopped
 * (store.h): the listening socket, the state, the thread, and everything
 * freed again. The server itself is the store_server_*.c files around this
 * one (store_server_internal.h says which holds what); the bytes on the wire
 * are store_wire.h; the client is store_client.c. */
#include "common/store/store.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/log.h"
#include "common/store/store_server_internal.h"

/* A listening socket on the first address of bind_address:port that works. */
static int listen_on(const char *bind_address, int port, struct plait_error *err)
{
    char port_text[8];
    snprintf(port_text, sizeof port_text, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *list = NULL;
    const char *node = bind_address ? bind_address : "::";
    int rc = getaddrinfo(node, port_text, &hints, &list);
    if (rc != 0 && !bind_address) return listen_on("0.0.0.0", port, err); /* no IPv6 here */
    if (rc != 0)
        return error_set(err, "store server: cannot resolve the bind address %s: %s", node,
                         gai_strerror(rc));
    char last[200] = "no address";
    int fd = -1;
    for (struct addrinfo *ai = list; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            snprintf(last, sizeof last, "socket: %s", strerror(errno));
            continue;
        }
        int one = 1, zero = 0;
        if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
            (ai->ai_family == AF_INET6 &&
             setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero) != 0) ||
            bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, SOMAXCONN) != 0) {
            snprintf(last, sizeof last, "%s", strerror(errno));
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(list);
    if (fd < 0 && !bind_address) return listen_on("0.0.0.0", port, err); /* no IPv6 here */
    if (fd < 0)
        return error_set(err, "store server: cannot listen on %s port %d: %s", node, port, last);
    return fd;
}

int store_server_start(struct store_server **out, const char *bind_address, int port,
                       const char *secret, struct plait_error *err)
{
    *out = NULL;
    if (!secret || !*secret || strlen(secret) > STORE_MAX_SECRET_BYTES)
        return error_set(err,
                         "store server: the secret must be 1 to %d bytes (anyone could "
                         "join a store without one)",
                         STORE_MAX_SECRET_BYTES);
    if (port < 0 || port > 65535)
        return error_set(err, "store server: port %d is not 0..65535", port);
    struct store_server *srv = calloc(1, sizeof *srv);
    if (!srv) return error_errno(err, "store server: allocating its state");
    srv->listen_fd = srv->wake_fd = srv->epoll_fd = -1;
    bool mutex_ready = false;
    snprintf(srv->secret, sizeof srv->secret, "%s", secret);
    srv->bucket_count = 256;
    srv->buckets = srv_alloc_counted(srv, srv->bucket_count * sizeof *srv->buckets);
    if (!srv->buckets) {
        error_errno(err, "store server: allocating its table");
        goto fail;
    }
    if (getrandom(&srv->hash_seed, sizeof srv->hash_seed, 0) != (ssize_t)sizeof srv->hash_seed) {
        error_errno(err, "store server: getrandom");
        goto fail;
    }
    srv->listen_fd = listen_on(bind_address, port, err);
    if (srv->listen_fd < 0) goto fail;
    struct sockaddr_storage sa;
    socklen_t len = sizeof sa;
    if (getsockname(srv->listen_fd, (struct sockaddr *)&sa, &len) != 0) {
        error_errno(err, "store server: getsockname");
        goto fail;
    }
    srv->port = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port
                                               : ((struct sockaddr_in *)&sa)->sin_port);
    srv->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    srv->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    if (srv->wake_fd < 0 || srv->epoll_fd < 0) {
        error_errno(err, "store server: %s", srv->wake_fd < 0 ? "eventfd" : "epoll_create1");
        goto fail;
    }
    struct epoll_event listen_ev = {.events = EPOLLIN, .data.ptr = &srv->listen_fd};
    struct epoll_event wake_ev = {.events = EPOLLIN, .data.ptr = &srv->wake_fd};
    if (epoll_ctl(srv->epoll_fd, EPOLL_CTL_ADD, srv->listen_fd, &listen_ev) != 0 ||
        epoll_ctl(srv->epoll_fd, EPOLL_CTL_ADD, srv->wake_fd, &wake_ev) != 0) {
        error_errno(err, "store server: epoll_ctl");
        goto fail;
    }
    int rc = pthread_mutex_init(&srv->stats_mu, NULL);
    if (rc != 0) {
        error_set(err, "store server: pthread_mutex_init: %s", strerror(rc));
        goto fail;
    }
    mutex_ready = true;
    srv_publish_stats(srv);
    /* the thread takes no signals: they stay with the launcher's own threads */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    rc = pthread_create(&srv->thread, NULL, srv_main, srv);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        error_set(err, "store server: pthread_create: %s", strerror(rc));
        goto fail;
    }
    *out = srv;
    return 0;
fail:
    if (mutex_ready) pthread_mutex_destroy(&srv->stats_mu);
    if (srv->epoll_fd >= 0) close(srv->epoll_fd);
    if (srv->wake_fd >= 0) close(srv->wake_fd);
    if (srv->listen_fd >= 0) close(srv->listen_fd);
    free(srv->buckets);
    free(srv);
    return -1;
}

int store_server_port(const struct store_server *srv)
{
    return srv->port;
}

void store_server_stats(struct store_server *srv, struct store_server_stats *out)
{
    pthread_mutex_lock(&srv->stats_mu);
    *out = srv->stats;
    pthread_mutex_unlock(&srv->stats_mu);
}

void store_server_stop(struct store_server *srv)
{
    if (!srv) return;
    uint64_t one = 1;
    if (write(srv->wake_fd, &one, sizeof one) != (ssize_t)sizeof one)
        log_warn("store: waking the server thread: %s", strerror(errno)); /* cannot happen */
    pthread_join(srv->thread, NULL);
    srv_turned_away_summary(&srv->turned_away);
    for (size_t i = 0; i < srv->bucket_count; i++)
        for (struct entry *e = srv->buckets[i], *next; e; e = next) {
            next = e->next;
            srv_blob_release(srv, e->value);
            free(e);
        }
    free(srv->buckets);
    free(srv->heap);
    pthread_mutex_destroy(&srv->stats_mu);
    close(srv->epoll_fd);
    close(srv->wake_fd);
    close(srv->listen_fd);
    free(srv);
}
