/* store_client.c — a rank's connection to the rendezvous store: connect with
 * retries and the handshake, one request at a time under a deadline, and
 * what is built from requests (barrier, abort, heartbeats, dead ranks). The
 * server is store_server.c; the bytes are store_wire.h. */
#include "common/store/store.h"

#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/store/store_wire.h"

#define REPLY_GRACE_MS 2000   /* a waiting request's reply may come this late */
#define RETRY_FIRST_MS 10     /* connect retries back off from here... */
#define RETRY_MAX_MS 500      /* ...to here */
#define BARRIER_LIST_RANKS 32 /* a timeout names this many missing ranks, then counts */

struct heartbeat {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t wake; /* on CLOCK_MONOTONIC */
    bool stop;
    int interval_ms;
    struct store *conn; /* its own connection */
    char key[32];
};

struct store {
    int fd; /* -1 once dropped */
    int rank;
    int port;
    int64_t default_timeout_ms;
    char host[256];
    char addr[300]; /* host:port, for messages */
    char secret[STORE_MAX_SECRET_BYTES + 1];
    char dropped[400]; /* why the connection was dropped */
    struct heartbeat *heartbeat;
};

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int64_t ms)
{
    struct timespec ts = {ms / 1000, ms % 1000 * 1000000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* timeout_s in ms, the store's default where it is not positive. */
static int64_t timeout_ms_of(const struct store *st, double timeout_s)
{
    if (!(timeout_s > 0)) return st->default_timeout_ms;
    double ms = ceil(timeout_s * 1000);
    return ms > (double)STORE_WIRE_MAX_WAIT_MS ? STORE_WIRE_MAX_WAIT_MS : (int64_t)ms;
}

/* ---- bytes under a deadline ------------------------------------------ */

enum io_result { IO_OK, IO_TIMEOUT, IO_CLOSED, IO_ERROR /* errno says */ };

static enum io_result wait_fd(int fd, short events, int64_t deadline_ms)
{
    for (;;) {
        int64_t left = deadline_ms - now_ms(); /* past it, still look once */
        struct pollfd p = {.fd = fd, .events = events};
        int n = poll(&p, 1, left <= 0 ? 0 : left > 60000 ? 60000 : (int)left);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return IO_ERROR;
        if (n > 0) return IO_OK; /* readiness, or an error the next call reports */
        if (left <= 0) return IO_TIMEOUT;
    }
}

static enum io_result send_all(int fd, struct iovec *iov, int iov_count, int64_t deadline_ms)
{
    while (iov_count > 0) {
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)iov_count};
        ssize_t k = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            enum io_result r = wait_fd(fd, POLLOUT, deadline_ms);
            if (r != IO_OK) return r;
            continue;
        }
        if (k < 0) return errno == EPIPE || errno == ECONNRESET ? IO_CLOSED : IO_ERROR;
        for (size_t done = (size_t)k; iov_count > 0 && done >= iov->iov_len; iov++, iov_count--)
            done -= iov->iov_len, k = (ssize_t)done;
        if (iov_count > 0) {
            iov->iov_base = (char *)iov->iov_base + k;
            iov->iov_len -= (size_t)k;
        }
    }
    return IO_OK;
}

static enum io_result recv_all(int fd, void *buf, size_t bytes, int64_t deadline_ms)
{
    uint8_t *p = buf;
    while (bytes > 0) {
        ssize_t k = recv(fd, p, bytes, MSG_DONTWAIT);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            enum io_result r = wait_fd(fd, POLLIN, deadline_ms);
            if (r != IO_OK) return r;
            continue;
        }
        if (k == 0 || (k < 0 && errno == ECONNRESET)) return IO_CLOSED;
        if (k < 0) return IO_ERROR;
        p += k;
        bytes -= (size_t)k;
    }
    return IO_OK;
}

/* What went wrong with a connection, in words (errno for IO_ERROR). */
static const char *io_what(enum io_result r)
{
    return r == IO_TIMEOUT  ? "no answer in time"
           : r == IO_CLOSED ? "the server closed the connection (did the rank 0 launcher exit?)"
                            : strerror(errno);
}

/* ---- connecting ------------------------------------------------------ */

/* The handshake on a connected socket: 0, 1 (refused: the secret is wrong),
 * or -1 with why in last. */
static int handshake(struct store *st, int fd, int64_t deadline_ms, char *last, size_t last_bytes)
{
    uint8_t hello[STORE_WIRE_HELLO_BYTES];
    enum io_result r = recv_all(fd, hello, sizeof hello, deadline_ms);
    if (r != IO_OK) {
        snprintf(last, last_bytes, "handshake: %s", io_what(r));
        return -1;
    }
    if (memcmp(hello, STORE_WIRE_MAGIC, 4) != 0 ||
        store_wire_get_u32(hello + 4) != STORE_WIRE_VERSION) {
        snprintf(last, last_bytes, "the service there is not a plait store (version %u)",
                 (unsigned)store_wire_get_u32(hello + 4));
        return -1;
    }
    uint8_t auth[STORE_WIRE_AUTH_BYTES];
    store_wire_put_u32(auth, (uint32_t)st->rank);
    store_wire_auth_mac(st->secret, hello + 8, st->rank, auth + 4);
    uint8_t head[STORE_WIRE_REPLY_BYTES];
    struct iovec iov = {auth, sizeof auth};
    r = send_all(fd, &iov, 1, deadline_ms);
    if (r == IO_OK) r = recv_all(fd, head, sizeof head, deadline_ms);
    if (r != IO_OK) {
        snprintf(last, last_bytes, "handshake: %s", io_what(r));
        return -1;
    }
    struct store_wire_reply rep;
    store_wire_decode_reply(head, &rep);
    if (rep.status == STORE_STATUS_REFUSED) return 1;
    if (rep.status != STORE_STATUS_OK) {
        snprintf(last, last_bytes, "handshake: status %u", rep.status);
        return -1;
    }
    return 0;
}

/* One attempt at every address of host: a connected, authenticated socket;
 * -1 (try again; why in last) or -2 (refused; err set). */
static int try_connect(struct store *st, int64_t deadline_ms, char *last, size_t last_bytes,
                       struct plait_error *err)
{
    char port_text[8];
    snprintf(port_text, sizeof port_text, "%d", st->port);
    struct addrinfo hints = {
        .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
    struct addrinfo *list = NULL;
    int rc = getaddrinfo(st->host, port_text, &hints, &list);
    if (rc != 0) {
        snprintf(last, last_bytes, "resolving %s: %s", st->host,
                 rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc));
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *ai = list; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            snprintf(last, last_bytes, "socket: %s", strerror(errno));
            continue;
        }
        int so_error = 0, one = 1;
        socklen_t len = sizeof so_error;
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
            if (errno != EINPROGRESS)
                so_error = errno;
            else if (wait_fd(fd, POLLOUT, deadline_ms) != IO_OK)
                so_error = ETIMEDOUT;
            else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &len) != 0)
                so_error = errno;
        }
        if (so_error == 0 && setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0)
            so_error = errno;
        int shake = so_error ? -1 : handshake(st, fd, deadline_ms, last, last_bytes);
        if (so_error) snprintf(last, last_bytes, "%s", strerror(so_error));
        if (shake == 1) {
            close(fd);
            freeaddrinfo(list);
            error_set(err,
                      "store server %s refused rank %d: the secret is not this job's (check "
                      "PLAIT_STORE_SECRET)",
                      st->addr, st->rank);
            return -2;
        }
        if (shake != 0) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(list);
    return fd;
}

int store_connect(struct store **out, const char *host, int port, const char *secret, int rank,
                  double timeout_s, struct plait_error *err)
{
    *out = NULL;
    if (!host || !*host || strlen(host) >= sizeof((struct store *)0)->host)
        return error_set(err, "store: the server's host name is empty or too long");
    if (port < 1 || port > 65535)
        return error_set(err, "store server %s: port %d is not 1..65535", host, port);
    if (!secret || !*secret || strlen(secret) > STORE_MAX_SECRET_BYTES)
        return error_set(err, "store server %s:%d: the secret must be 1 to %d bytes", host, port,
                         STORE_MAX_SECRET_BYTES);
    if (!(timeout_s > 0))
        return error_set(err, "store server %s:%d: the connect timeout must be positive", host,
                         port);
    struct store *st = calloc(1, sizeof *st);
    if (!st) return error_errno(err, "store: allocating a connection");
    st->fd = -1;
    st->rank = rank;
    st->port = port;
    snprintf(st->host, sizeof st->host, "%s", host);
    snprintf(st->secret, sizeof st->secret, "%s", secret);
    if (store_addr_format(st->addr, sizeof st->addr, host, port, err)) goto fail;
    st->default_timeout_ms = timeout_ms_of(st, timeout_s);
    int64_t deadline = now_ms() + st->default_timeout_ms, backoff = RETRY_FIRST_MS;
    char last[300] = "no attempt finished";
    for (;;) {
        st->fd = try_connect(st, deadline, last, sizeof last, err);
        if (st->fd >= 0) break;
        if (st->fd == -2) {
            free(st);
            return STORE_REFUSED;
        }
        int64_t left = deadline - now_ms();
        if (left <= 0) {
            error_peer_lost(
                err,
                "cannot reach store server %s within %.1f s (last error: %s); is rank 0's "
                "launcher running, and is %s its address?",
                st->addr, st->default_timeout_ms / 1000.0, last, st->addr);
            goto fail;
        }
        sleep_ms(backoff < left ? backoff : left);
        backoff = backoff * 2 < RETRY_MAX_MS ? backoff * 2 : RETRY_MAX_MS;
    }
    *out = st;
    return 0;
fail:
    free(st);
    return -1;
}

/* ---- one request ----------------------------------------------------- */

/* After a failed exchange the stream is out of step: later calls fail at once. */
static int drop(struct store *st, const char *what, enum io_result r, int64_t waited_ms,
                struct plait_error *err)
{
    if (r == IO_TIMEOUT)
        snprintf(st->dropped, sizeof st->dropped,
                 "store server %s: %s: no reply within %.1f s (is the server stuck?)", st->addr,
                 what, waited_ms / 1000.0);
    else
        snprintf(st->dropped, sizeof st->dropped, "store server %s: %s: %s", st->addr, what,
                 io_what(r));
    close(st->fd);
    st->fd = -1;
    return error_peer_lost(err, "%s", st->dropped);
}

static int key_check(const struct store *st, const char *key, struct plait_error *err)
{
    size_t n = key ? strlen(key) : 0;
    if (n < 1 || n > STORE_MAX_KEY_BYTES)
        return error_set(err, "store server %s: key \"%.40s%s\" is %zu bytes, not 1..%d", st->addr,
                         key ? key : "", n > 40 ? "..." : "", n, STORE_MAX_KEY_BYTES);
    return 0;
}

/* Sends one request and reads its reply (status and result in *rep; the
 * value, NUL-terminated, in *value when value is not NULL). The reply must
 * come by deadline_ms. what names the request in messages. */
static int call(struct store *st, const char *what, uint8_t op, const char *const *keys,
                size_t key_count, const void *value, size_t value_bytes, int64_t arg,
                int64_t deadline_ms, struct store_wire_reply *rep, void **rep_value,
                struct plait_error *err)
{
    if (rep_value) *rep_value = NULL;
    if (st->fd < 0)
        return error_peer_lost(err, "%s (the connection was dropped then)", st->dropped);
    if (value_bytes > STORE_MAX_VALUE_BYTES)
        return error_set(err,
                         "store server %s: %s: a value of %zu bytes is over the %zu-byte limit",
                         st->addr, what, value_bytes, STORE_MAX_VALUE_BYTES);
    size_t keys_bytes = 0;
    for (size_t i = 0; i < key_count; i++) {
        if (key_check(st, keys[i], err)) return -1;
        keys_bytes += 2 + strlen(keys[i]);
    }
    uint8_t *list = malloc(keys_bytes);
    if (!list) return error_errno(err, "store: %s: allocating the request", what);
    for (size_t i = 0, pos = 0; i < key_count; i++) {
        size_t n = strlen(keys[i]);
        store_wire_put_u16(list + pos, (uint16_t)n);
        memcpy(list + pos + 2, keys[i], n);
        pos += 2 + n;
    }
    struct store_wire_request req = {.op = op,
                                     .key_count = (uint16_t)key_count,
                                     .keys_bytes = (uint32_t)keys_bytes,
                                     .value_bytes = value_bytes,
                                     .arg = arg};
    uint8_t head[STORE_WIRE_REQUEST_BYTES];
    store_wire_encode_request(head, &req);
    struct iovec iov[3] = {{head, sizeof head}, {list, keys_bytes}, {(void *)value, value_bytes}};
    int64_t start = now_ms();
    enum io_result r = send_all(st->fd, iov, value_bytes ? 3 : 2, deadline_ms);
    free(list);
    if (r != IO_OK) return drop(st, what, r, now_ms() - start, err);
    uint8_t reply_head[STORE_WIRE_REPLY_BYTES];
    r = recv_all(st->fd, reply_head, sizeof reply_head, deadline_ms);
    if (r != IO_OK) return drop(st, what, r, now_ms() - start, err);
    store_wire_decode_reply(reply_head, rep);
    if (rep->value_bytes > STORE_MAX_VALUE_BYTES) {
        errno = EPROTO;
        return drop(st, what, IO_ERROR, 0, err);
    }
    uint8_t *data = malloc(rep->value_bytes + 1);
    if (!data) return drop(st, what, IO_ERROR, 0, err); /* its bytes stay unread: out of step */
    r = recv_all(st->fd, data, rep->value_bytes, deadline_ms);
    if (r != IO_OK) {
        free(data);
        return drop(st, what, r, now_ms() - start, err);
    }
    data[rep->value_bytes] = '\0';
    if (rep_value)
        *rep_value = data;
    else
        free(data);
    return 0;
}

/* A reply that is not OK, as an error: what was asked, and why it failed. */
static int status_error(const struct store *st, const char *what,
                        const struct store_wire_reply *rep, const char *text, int64_t waited_ms,
                        struct plait_error *err)
{
    switch (rep->status) {
    case STORE_STATUS_TIMEOUT:
        return error_peer_lost(err, "%s: timed out after %.1f s (store server %s)", what,
                               waited_ms / 1000.0, st->addr);
    case STORE_STATUS_ABORTED:
        return error_peer_lost(err, "%s: the job was aborted: %.300s", what, text ? text : "");
    default:
        return error_set(err, "%s: store server %s refused the request: %.300s (status %u)", what,
                         st->addr, text ? text : "", rep->status);
    }
}

/* One request whose reply must be OK; its value (if asked) in *value. */
static int call_ok(struct store *st, const char *what, uint8_t op, const char *key,
                   const void *value, size_t value_bytes, int64_t arg, int64_t wait_ms,
                   int64_t *result, void **rep_value, size_t *rep_bytes, struct plait_error *err)
{
    struct store_wire_reply rep;
    void *data = NULL;
    int64_t deadline = now_ms() + (wait_ms ? wait_ms + REPLY_GRACE_MS : st->default_timeout_ms);
    if (call(st, what, op, &key, 1, value, value_bytes, arg, deadline, &rep, &data, err)) return -1;
    if (rep.status != STORE_STATUS_OK) {
        status_error(st, what, &rep, data, wait_ms, err);
        free(data);
        return -1;
    }
    if (result) *result = rep.result;
    if (rep_bytes) *rep_bytes = rep.value_bytes;
    if (rep_value)
        *rep_value = data;
    else
        free(data);
    return 0;
}

int store_set(struct store *st, const char *key, const void *value, size_t bytes,
              struct plait_error *err)
{
    char what[300];
    snprintf(what, sizeof what, "setting key \"%.256s\"", key ? key : "");
    return call_ok(st, what, STORE_OP_SET, key, value, bytes, 0, 0, NULL, NULL, NULL, err);
}

int store_get(struct store *st, const char *key, void **value, size_t *bytes, double timeout_s,
              struct plait_error *err)
{
    char what[300];
    snprintf(what, sizeof what, "waiting for key \"%.256s\"", key ? key : "");
    *value = NULL;
    return call_ok(st, what, STORE_OP_GET, key, NULL, 0, timeout_ms_of(st, timeout_s),
                   timeout_ms_of(st, timeout_s), NULL, value, bytes, err);
}

int store_add(struct store *st, const char *key, int64_t delta, int64_t *result,
              struct plait_error *err)
{
    char what[300];
    snprintf(what, sizeof what, "adding %lld to key \"%.256s\"", (long long)delta, key ? key : "");
    return call_ok(st, what, STORE_OP_ADD, key, NULL, 0, delta, 0, result, NULL, NULL, err);
}

int store_append(struct store *st, const char *key, const void *value, size_t bytes,
                 size_t *new_bytes, struct plait_error *err)
{
    char what[300];
    int64_t total = 0;
    snprintf(what, sizeof what, "appending to key \"%.256s\"", key ? key : "");
    if (call_ok(st, what, STORE_OP_APPEND, key, value, bytes, 0, 0, &total, NULL, NULL, err))
        return -1;
    if (new_bytes) *new_bytes = (size_t)total;
    return 0;
}

/* Waits for one key until deadline_ms (what names the wait in messages);
 * *timed_out (may be NULL) says whether it failed only by the deadline. */
static int wait_key(struct store *st, const char *what, const char *key, int64_t deadline_ms,
                    int64_t waited_before_ms, bool *timed_out, struct plait_error *err)
{
    int64_t left = deadline_ms - now_ms();
    struct store_wire_reply rep;
    void *text = NULL;
    if (timed_out) *timed_out = false;
    if (left < 0) left = 0;
    if (call(st, what, STORE_OP_WAIT, &key, 1, NULL, 0, left, now_ms() + left + REPLY_GRACE_MS,
             &rep, &text, err))
        return -1;
    if (timed_out) *timed_out = rep.status == STORE_STATUS_TIMEOUT;
    int rc = rep.status == STORE_STATUS_OK
                 ? 0
                 : status_error(st, what, &rep, text, waited_before_ms + left, err);
    free(text);
    return rc;
}

int store_wait(struct store *st, const char *const *keys, size_t n, double timeout_s,
               struct plait_error *err)
{
    int64_t start = now_ms(), deadline = start + timeout_ms_of(st, timeout_s);
    for (size_t i = 0; i < n; i++) {
        char what[360];
        snprintf(what, sizeof what, "waiting for key \"%.256s\" (%zu of %zu keys set)",
                 keys[i] ? keys[i] : "", i, n);
        if (wait_key(st, what, keys[i], deadline, now_ms() - start, NULL, err)) return -1;
    }
    return 0;
}

/* ---- barrier, abort -------------------------------------------------- */

/* "barrier \"x\": ranks 3, 7 did not arrive" from the arrival list. */
static int barrier_missing(struct store *st, const char *what, const char *arrived_key, int world,
                           int64_t waited_ms, struct plait_error *err)
{
    struct store_wire_reply rep;
    void *list = NULL;
    char *seen = calloc((size_t)world, 1);
    if (!seen) return error_errno(err, "%s: allocating the arrival list", what);
    if (call(st, what, STORE_OP_GET, &arrived_key, 1, NULL, 0, 0, now_ms() + st->default_timeout_ms,
             &rep, &list, err)) {
        free(seen);
        return -1;
    }
    if (rep.status == STORE_STATUS_OK)
        for (size_t i = 0; i + 4 <= rep.value_bytes; i += 4) {
            int32_t r = (int32_t)store_wire_get_u32((uint8_t *)list + i);
            if (r >= 0 && r < world) seen[r] = 1;
        }
    free(list);
    char ranks[400] = "";
    size_t missing = 0, pos = 0;
    for (int r = 0; r < world; r++) {
        if (seen[r]) continue;
        if (missing++ < BARRIER_LIST_RANKS && pos < sizeof ranks)
            pos += (size_t)snprintf(ranks + pos, sizeof ranks - pos, "%s%d", pos ? ", " : "", r);
    }
    free(seen);
    if (missing > BARRIER_LIST_RANKS && pos < sizeof ranks)
        snprintf(ranks + pos, sizeof ranks - pos, " and %zu more", missing - BARRIER_LIST_RANKS);
    return error_peer_lost(err, "%s: timed out after %.1f s; %zu of %d ranks did not arrive: %s",
                           what, waited_ms / 1000.0, missing, world, ranks);
}

/* The last rank in checks that every rank came once (two processes that
 * think they are the same rank would otherwise complete it early). */
static int barrier_check_arrivals(struct store *st, const char *what, const char *arrived_key,
                                  int world, struct plait_error *err)
{
    void *list = NULL;
    size_t bytes = 0;
    char *seen = calloc((size_t)world, 1);
    if (!seen) return error_errno(err, "%s: allocating the arrival list", what);
    int rc = call_ok(st, what, STORE_OP_GET, arrived_key, NULL, 0, 0, 0, NULL, &list, &bytes, err);
    for (size_t i = 0; rc == 0 && i + 4 <= bytes; i += 4) {
        int32_t r = (int32_t)store_wire_get_u32((uint8_t *)list + i);
        if (r < 0 || r >= world || seen[r]++)
            rc = error_set(err, "%s: rank %d arrived twice (two processes with one rank?)", what,
                           (int)r);
    }
    free(list);
    free(seen);
    return rc;
}

int store_barrier(struct store *st, const char *name, int world, double timeout_s,
                  struct plait_error *err)
{
    char what[320], arrived[STORE_MAX_KEY_BYTES + 64], done[STORE_MAX_KEY_BYTES + 64];
    snprintf(what, sizeof what, "barrier \"%.256s\" (rank %d of %d)", name ? name : "", st->rank,
             world);
    if (world < 1 || st->rank < 0 || st->rank >= world)
        return error_set(err, "%s: this rank is not in the world", what);
    snprintf(arrived, sizeof arrived, "barrier/%.256s/arrived", name ? name : "");
    snprintf(done, sizeof done, "barrier/%.256s/done", name ? name : "");
    if (key_check(st, arrived, err)) return error_prefix(err, "barrier name too long: ");
    int64_t start = now_ms(), deadline = start + timeout_ms_of(st, timeout_s);
    uint8_t me[4];
    store_wire_put_u32(me, (uint32_t)st->rank);
    size_t arrived_bytes;
    if (store_append(st, arrived, me, sizeof me, &arrived_bytes, err))
        return error_prefix(err, "%s: ", what);
    if (arrived_bytes % 4 || arrived_bytes > 4 * (size_t)world)
        return error_set(err,
                         "%s: %zu arrivals for a world of %d (is the name used twice, or do the "
                         "ranks disagree on the world size?)",
                         what, arrived_bytes / 4, world);
    if (arrived_bytes == 4 * (size_t)world) {
        if (barrier_check_arrivals(st, what, arrived, world, err)) return -1;
        if (store_set(st, done, "1", 1, err)) return error_prefix(err, "%s: ", what);
    }
    bool timed_out;
    if (wait_key(st, what, done, deadline, 0, &timed_out, err) == 0) return 0;
    if (timed_out) return barrier_missing(st, what, arrived, world, now_ms() - start, err);
    return -1;
}

int store_abort(struct store *st, const char *reason, struct plait_error *err)
{
    char text[1024];
    int n = st->rank >= 0
                ? snprintf(text, sizeof text, "rank %d: %s", st->rank, reason ? reason : "")
                : snprintf(text, sizeof text, "the launcher: %s", reason ? reason : "");
    size_t bytes = n < 0 ? 0 : (size_t)n < sizeof text ? (size_t)n : sizeof text - 1;
    return store_set(st, STORE_ABORT_KEY, text, bytes, err);
}

int store_abort_clear(struct store *st, struct plait_error *err)
{
    return store_set(st, STORE_ABORT_KEY, "", 0, err);
}

/* ---- heartbeats ------------------------------------------------------ */

static void *heartbeat_main(void *arg)
{
    struct heartbeat *hb = arg;
    long long beats = 0;
    pthread_mutex_lock(&hb->mu);
    while (!hb->stop) {
        pthread_mutex_unlock(&hb->mu);
        char value[32];
        struct plait_error err;
        int n = snprintf(value, sizeof value, "%lld", ++beats);
        int rc = store_set(hb->conn, hb->key, value, (size_t)n, &err);
        pthread_mutex_lock(&hb->mu);
        if (rc) {
            if (!hb->stop)
                log_warn("store: the heartbeat of rank %d stopped: %s", hb->conn->rank, err.text);
            break;
        }
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_sec += hb->interval_ms / 1000;
        until.tv_nsec += (long)(hb->interval_ms % 1000) * 1000000;
        if (until.tv_nsec >= 1000000000) until.tv_sec++, until.tv_nsec -= 1000000000;
        while (!hb->stop && pthread_cond_timedwait(&hb->wake, &hb->mu, &until) != ETIMEDOUT) {
        }
    }
    pthread_mutex_unlock(&hb->mu);
    return NULL;
}

int store_heartbeat_start(struct store *st, int interval_ms, struct plait_error *err)
{
    if (st->heartbeat) return error_set(err, "store: rank %d already has a heartbeat", st->rank);
    if (interval_ms < 1)
        return error_set(err, "store: heartbeat interval %d ms is not positive", interval_ms);
    struct heartbeat *hb = calloc(1, sizeof *hb);
    if (!hb) return error_errno(err, "store: allocating a heartbeat");
    hb->interval_ms = interval_ms;
    snprintf(hb->key, sizeof hb->key, STORE_HEARTBEAT_PREFIX "%d", st->rank);
    bool mu = false, cond = false;
    pthread_condattr_t attr;
    int rc = pthread_condattr_init(&attr);
    if (rc == 0) {
        rc = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
        if (rc == 0) rc = pthread_cond_init(&hb->wake, &attr);
        cond = rc == 0;
        pthread_condattr_destroy(&attr);
    }
    if (rc == 0) rc = pthread_mutex_init(&hb->mu, NULL), mu = rc == 0;
    if (rc != 0) {
        error_set(err, "store: heartbeat: initialising its lock: %s", strerror(rc));
        goto fail;
    }
    if (store_connect(&hb->conn, st->host, st->port, st->secret, st->rank,
                      st->default_timeout_ms / 1000.0, err)) {
        error_prefix(err, "heartbeat: ");
        goto fail;
    }
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    rc = pthread_create(&hb->thread, NULL, heartbeat_main, hb);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        error_set(err, "store: heartbeat: pthread_create: %s", strerror(rc));
        goto fail;
    }
    st->heartbeat = hb;
    return 0;
fail:
    store_close(hb->conn);
    if (mu) pthread_mutex_destroy(&hb->mu);
    if (cond) pthread_cond_destroy(&hb->wake);
    free(hb);
    return -1;
}

void store_heartbeat_stop(struct store *st)
{
    struct heartbeat *hb = st->heartbeat;
    if (!hb) return;
    pthread_mutex_lock(&hb->mu);
    hb->stop = true;
    pthread_cond_signal(&hb->wake);
    pthread_mutex_unlock(&hb->mu);
    pthread_join(hb->thread, NULL);
    store_close(hb->conn);
    pthread_mutex_destroy(&hb->mu);
    pthread_cond_destroy(&hb->wake);
    free(hb);
    st->heartbeat = NULL;
}

int store_dead_ranks(struct store *st, int world, int64_t stale_ms, int *ranks_out,
                     size_t max_ranks, size_t *n_dead, struct plait_error *err)
{
    *n_dead = 0;
    if (world < 1) return error_set(err, "store: dead ranks of a world of %d", world);
    size_t batch = world < STORE_MAX_KEYS_PER_REQUEST ? (size_t)world : STORE_MAX_KEYS_PER_REQUEST;
    char(*names)[32] = malloc(batch * sizeof *names);
    const char **keys = malloc(batch * sizeof *keys);
    int rc = 0;
    if (!names || !keys) {
        rc = error_errno(err, "store: allocating the heartbeat keys");
        goto out;
    }
    for (int first = 0; first < world && rc == 0; first += (int)batch) {
        size_t count = (size_t)(world - first) < batch ? (size_t)(world - first) : batch;
        for (size_t i = 0; i < count; i++) {
            snprintf(names[i], sizeof names[i], STORE_HEARTBEAT_PREFIX "%d", first + (int)i);
            keys[i] = names[i];
        }
        struct store_wire_reply rep;
        void *ages = NULL;
        rc = call(st, "reading heartbeats", STORE_OP_AGES, keys, count, NULL, 0, 0,
                  now_ms() + st->default_timeout_ms, &rep, &ages, err);
        if (rc == 0 && (rep.status != STORE_STATUS_OK || rep.value_bytes != 8 * count))
            rc = status_error(st, "reading heartbeats", &rep, ages, 0, err);
        for (size_t i = 0; rc == 0 && i < count; i++) {
            int64_t age = (int64_t)store_wire_get_u64((uint8_t *)ages + 8 * i);
            if (age >= 0 && age <= stale_ms) continue;
            if (*n_dead < max_ranks) ranks_out[*n_dead] = first + (int)i;
            ++*n_dead;
        }
        free(ages);
    }
out:
    free(names);
    free(keys);
    return rc;
}

const char *store_address(const struct store *st)
{
    return st->addr;
}

void store_close(struct store *st)
{
    if (!st) return;
    store_heartbeat_stop(st);
    if (st->fd >= 0) close(st->fd);
    explicit_bzero(st->secret, sizeof st->secret);
    free(st);
}
