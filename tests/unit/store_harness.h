/* store_harness.h — what the store's tests share (test_store.c,
 * test_store_hostile.c, test_store_failure.c, test_store_addr.c): the job's
 * secret, a clock, a server on the loopback and a client joining it, and a
 * raw client that speaks store_wire.h byte by byte, for strangers, hostile
 * streams and thousands of parked requests. Not the cases: each file holds
 * its group's. */
#ifndef PLAIT_TESTS_STORE_HARNESS_H
#define PLAIT_TESTS_STORE_HARNESS_H

#include <errno.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "seconds.h" // defines: now_s, sleep_s
#include "common/store/store.h"
#include "common/store/store_wire.h"

#define SECRET "0123456789abcdef-test-secret"

static inline struct store_server *start_server(void)
{
    struct store_server *srv = NULL;
    struct plait_error err;
    int rc = store_server_start(&srv, "127.0.0.1", 0, SECRET, &err);
    CHECK(rc == 0, "%s", err.text);
    return srv;
}

static inline struct store *join(struct store_server *srv, int rank)
{
    struct store *st = NULL;
    struct plait_error err;
    int rc = store_connect(&st, "127.0.0.1", store_server_port(srv), SECRET, rank, 10, &err);
    CHECK(rc == 0, "rank %d: %s", rank, err.text);
    return st;
}

/* ---- a raw client ----------------------------------------------------- */

/* A raw TCP connection to the server (blocking, 5 s receive timeout). */
static inline int raw_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static inline bool raw_read(int fd, void *buf, size_t n)
{
    for (size_t got = 0; got < n;) {
        ssize_t k = recv(fd, (char *)buf + got, n - got, 0);
        if (k <= 0) return false;
        got += (size_t)k;
    }
    return true;
}

static inline void raw_send(int fd, const void *buf, size_t n)
{
    for (size_t sent = 0; sent < n;) {
        ssize_t k = send(fd, (const char *)buf + sent, n - sent, MSG_NOSIGNAL);
        if (k <= 0) return; /* the server may close first: that is fine here */
        sent += (size_t)k;
    }
}

/* A reply's status, or -1 when the server closed the connection instead. */
static inline int raw_reply(int fd)
{
    uint8_t head[STORE_WIRE_REPLY_BYTES];
    if (!raw_read(fd, head, sizeof head)) return -1;
    struct store_wire_reply r;
    store_wire_decode_reply(head, &r);
    char sink[4096];
    for (uint64_t left = r.value_bytes; left > 0;) {
        size_t take = left < sizeof sink ? (size_t)left : sizeof sink;
        if (!raw_read(fd, sink, take)) return -1;
        left -= take;
    }
    return r.status;
}

/* Reads the hello and answers with a mac made from `secret`: the reply's status. */
static inline int raw_handshake(int fd, const char *secret, int32_t rank)
{
    uint8_t hello[STORE_WIRE_HELLO_BYTES], auth[STORE_WIRE_AUTH_BYTES];
    if (!raw_read(fd, hello, sizeof hello)) return -1;
    store_wire_put_u32(auth, (uint32_t)rank);
    store_wire_auth_mac(secret, hello + 8, rank, auth + 4);
    raw_send(fd, auth, sizeof auth);
    return raw_reply(fd);
}

static inline struct store_wire_request request(uint8_t op, uint16_t key_count, uint32_t keys_bytes,
                                                uint64_t value_bytes, int64_t arg)
{
    return (struct store_wire_request){.op = op,
                                       .key_count = key_count,
                                       .keys_bytes = keys_bytes,
                                       .value_bytes = value_bytes,
                                       .arg = arg};
}

#endif
