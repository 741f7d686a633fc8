/* test_store_hostile.c — the store server against clients that do not play
 * by the rules: a wrong secret (its pipelined SET never lands), a replayed
 * handshake, a flood of strangers said a few then summarised, and hostile byte
 * streams that must neither crash the server nor grow it. Not the job's own
 * use of the store (test_store.c). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "store_harness.h"

/* Polls the server's stats until pred holds (or 5 s pass). */
static struct store_server_stats stats_when(struct store_server *srv,
                                            bool (*pred)(const struct store_server_stats *))
{
    struct store_server_stats s;
    for (double t0 = now_s(); now_s() - t0 < 5; sleep_s(0.005)) {
        store_server_stats(srv, &s);
        if (pred(&s)) break;
    }
    return s;
}

static bool no_connections(const struct store_server_stats *s)
{
    return s->connections == 0;
}

/* ---- the secret ------------------------------------------------------ */

/* A SET request's bytes for key=value. */
static size_t raw_set_request(uint8_t *out, const char *key, const char *value)
{
    size_t k = strlen(key), v = strlen(value);
    struct store_wire_request r = request(STORE_OP_SET, 1, (uint32_t)(2 + k), v, 0);
    store_wire_encode_request(out, &r);
    store_wire_put_u16(out + STORE_WIRE_REQUEST_BYTES, (uint16_t)k);
    memcpy(out + STORE_WIRE_REQUEST_BYTES + 2, key, k);
    memcpy(out + STORE_WIRE_REQUEST_BYTES + 2 + k, value, v);
    return STORE_WIRE_REQUEST_BYTES + 2 + k + v;
}

static bool three_refused(const struct store_server_stats *s)
{
    return s->refused >= 3;
}

static bool peer_closed(int fd)
{
    char c;
    return recv(fd, &c, 1, 0) <= 0;
}

static void test_wrong_secret_is_refused_and_its_set_does_not_land(void)
{
    struct store_server *srv = start_server();
    int port = store_server_port(srv);
    struct store *st = NULL;
    struct plait_error err;
    double t0 = now_s();
    CHECK(store_connect(&st, "127.0.0.1", port, "not-the-secret", 5, 10, &err) == STORE_REFUSED &&
              !st,
          "connected without the secret");
    CHECK(now_s() - t0 < 3, "a refusal is not retried until the deadline");
    CHECK(strstr(err.text, "refused rank 5") && strstr(err.text, "PLAIT_STORE_SECRET"), "%s",
          err.text);
    /* a raw client that pipelines a SET behind a wrong mac */
    int fd = raw_connect(port);
    uint8_t hello[STORE_WIRE_HELLO_BYTES], msg[STORE_WIRE_AUTH_BYTES + 64];
    CHECK(raw_read(fd, hello, sizeof hello) && !memcmp(hello, "PLST", 4), "hello");
    store_wire_put_u32(msg, 0);
    store_wire_auth_mac("guess", hello + 8, 0, msg + 4);
    size_t n =
        STORE_WIRE_AUTH_BYTES + raw_set_request(msg + STORE_WIRE_AUTH_BYTES, "intruder", "x");
    raw_send(fd, msg, n);
    CHECK(raw_reply(fd) == STORE_STATUS_REFUSED, "refused");
    CHECK(peer_closed(fd), "closed after the refusal");
    close(fd);
    /* a replayed auth (right secret, old nonce) fails too: the nonce is per connection */
    fd = raw_connect(port);
    uint8_t hello2[STORE_WIRE_HELLO_BYTES], replay[STORE_WIRE_AUTH_BYTES];
    CHECK(raw_read(fd, hello2, sizeof hello2), "hello");
    CHECK(memcmp(hello + 8, hello2 + 8, STORE_WIRE_NONCE_BYTES) != 0, "a fresh nonce");
    store_wire_put_u32(replay, 0);
    store_wire_auth_mac(SECRET, hello + 8, 0, replay + 4);
    raw_send(fd, replay, sizeof replay);
    CHECK(raw_reply(fd) == STORE_STATUS_REFUSED, "a replay is refused");
    close(fd);
    struct store_server_stats s = stats_when(srv, three_refused);
    CHECK(s.refused == 3, "refused %llu", (unsigned long long)s.refused);
    st = join(srv, 0);
    void *v = NULL;
    size_t bytes;
    CHECK(store_get(st, "intruder", &v, &bytes, 0.1, &err) != 0 && !v, "the intruder's key exists");
    store_close(st);
    store_server_stop(srv);
}

static bool thirty_refused(const struct store_server_stats *s)
{
    return s->refused >= 30;
}

/* 30 strangers with a wrong handshake: the console says the first few, then
 * one line for the rest (the launcher's console is the job's log; 750 of them
 * had made 750 lines), and the store still serves the job. */
static void test_strangers_are_said_a_few_then_summarised(void)
{
    char path[] = "/tmp/plait-test-store-log.XXXXXX";
    int log_fd = mkstemp(path), saved = dup(STDERR_FILENO);
    CHECK(log_fd >= 0 && saved >= 0, "a temporary log");
    if (log_fd < 0 || saved < 0) return;
    unlink(path);
    fflush(stderr);
    dup2(log_fd, STDERR_FILENO);
    struct store_server *srv = start_server();
    int port = store_server_port(srv);
    for (int i = 0; i < 30; i++) {
        int fd = raw_connect(port);
        uint8_t hello[STORE_WIRE_HELLO_BYTES], msg[STORE_WIRE_AUTH_BYTES];
        if (raw_read(fd, hello, sizeof hello)) {
            store_wire_put_u32(msg, 1);
            store_wire_auth_mac("a guess", hello + 8, 1, msg + 4);
            raw_send(fd, msg, sizeof msg);
            (void)raw_reply(fd);
        }
        close(fd);
    }
    struct store_server_stats st = stats_when(srv, thirty_refused);
    struct store *client = join(srv, 0);
    struct plait_error err;
    CHECK(client && store_set(client, "k", "v", 1, &err) == 0, "the job's own client: %s",
          client ? err.text : "none");
    store_close(client);
    store_server_stop(srv);
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    char text[8192] = "";
    ssize_t n = pread(log_fd, text, sizeof text - 1, 0);
    close(log_fd);
    text[n > 0 ? n : 0] = '\0';
    int said = 0;
    for (const char *q = text; (q = strstr(q, "refused a connection from")); q++) said++;
    CHECK(st.refused == 30, "refused %llu", (unsigned long long)st.refused);
    CHECK(said == 5, "%d refusals said: %s", said, text);
    CHECK(strstr(text, "25 more connections turned away without the job's secret"), "%s", text);
}

/* ---- hostile input --------------------------------------------------- */

static long rss_kib(void)
{
    long pages = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f && fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    if (f) fclose(f);
    return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

/* Sends a request header (after a good handshake) and returns the reply's status. */
static int raw_header(int port, const struct store_wire_request *r)
{
    int fd = raw_connect(port);
    int status = raw_handshake(fd, SECRET, 0);
    if (status == STORE_STATUS_OK) {
        uint8_t head[STORE_WIRE_REQUEST_BYTES];
        store_wire_encode_request(head, r);
        raw_send(fd, head, sizeof head);
        status = raw_reply(fd);
        if (!peer_closed(fd)) status = -2;
    }
    close(fd);
    return status;
}

static void test_hostile_streams_neither_crash_nor_grow_the_server(void)
{
    struct store_server *srv = start_server();
    int port = store_server_port(srv);
    struct store *st = join(srv, 0);
    struct plait_error err;
    /* what the client refuses before sending */
    char long_key[300];
    memset(long_key, 'k', sizeof long_key - 1);
    long_key[sizeof long_key - 1] = '\0';
    CHECK(store_set(st, long_key, "v", 1, &err) != 0 && strstr(err.text, "not 1..256"), "%s",
          err.text);
    CHECK(store_set(st, "", "v", 1, &err) != 0, "an empty key");
    CHECK(store_set(st, "huge", "v", STORE_MAX_VALUE_BYTES + 1, &err) != 0 &&
              strstr(err.text, "limit"),
          "%s", err.text);
    store_close(st);
    struct store_server_stats base = stats_when(srv, no_connections);
    long rss_before = rss_kib();

    /* lengths the server must refuse from the header alone */
    struct store_wire_request bad[] = {
        request(STORE_OP_SET, 1, 3, 1ull << 63, 0),                /* a 2^63-byte value */
        request(STORE_OP_SET, 1, 3, STORE_MAX_VALUE_BYTES + 1, 0), /* just over the limit */
        request(STORE_OP_SET, 1, UINT32_MAX, 1, 0),                /* a 4 GiB key list */
        request(STORE_OP_AGES, UINT16_MAX, 3 * UINT16_MAX, 0, 0),  /* too many keys */
        request(STORE_OP_GET, 1, 3, 0, -1),                        /* a negative wait */
        request(STORE_OP_GET, 1, 3, 0, INT64_MAX),                 /* an endless wait */
        request(STORE_OP_GET, 1, 3, 5, 0),                         /* a value on a get */
        request(99, 1, 3, 0, 0),                                   /* an unknown op */
        {.op = STORE_OP_SET, .reserved = 1, .key_count = 1, .keys_bytes = 3}, /* a reserved bit */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int status = raw_header(port, &bad[i]);
        CHECK(status == STORE_STATUS_BAD_REQUEST || status == STORE_STATUS_TOO_LARGE,
              "request %zu: status %d (and the connection closed)", i, status);
    }
    /* a key list that lies about its lengths, and a key with a NUL in it */
    for (int variant = 0; variant < 2; variant++) {
        int fd = raw_connect(port);
        CHECK(raw_handshake(fd, SECRET, 0) == STORE_STATUS_OK, "handshake");
        uint8_t msg[STORE_WIRE_REQUEST_BYTES + 8];
        struct store_wire_request r = request(STORE_OP_SET, 1, 5, 0, 0);
        store_wire_encode_request(msg, &r);
        store_wire_put_u16(msg + STORE_WIRE_REQUEST_BYTES, variant ? 3 : 200);
        memcpy(msg + STORE_WIRE_REQUEST_BYTES + 2, variant ? "a\0b" : "abc", 3);
        raw_send(fd, msg, STORE_WIRE_REQUEST_BYTES + 5);
        CHECK(raw_reply(fd) == STORE_STATUS_BAD_REQUEST && peer_closed(fd), "variant %d", variant);
        close(fd);
    }
    /* random bytes, before and after a good handshake */
    unsigned seed = 12345;
    uint8_t noise[65536];
    for (int round = 0; round < 40; round++) {
        for (size_t i = 0; i < sizeof noise; i++) noise[i] = (uint8_t)(rand_r(&seed) >> 7);
        int fd = raw_connect(port);
        if (round % 2) CHECK(raw_handshake(fd, SECRET, 0) == STORE_STATUS_OK, "handshake");
        raw_send(fd, noise, 1 + (size_t)rand_r(&seed) % sizeof noise);
        close(fd);
    }
    /* a value announced as 60 MiB of which 1 MiB comes: the server holds what came */
    int fd = raw_connect(port);
    CHECK(raw_handshake(fd, SECRET, 0) == STORE_STATUS_OK, "handshake");
    uint8_t head[STORE_WIRE_REQUEST_BYTES + 5];
    struct store_wire_request r = request(STORE_OP_SET, 1, 5, 60ull << 20, 0);
    store_wire_encode_request(head, &r);
    store_wire_put_u16(head + STORE_WIRE_REQUEST_BYTES, 3);
    memcpy(head + STORE_WIRE_REQUEST_BYTES + 2, "big", 3);
    raw_send(fd, head, sizeof head);
    memset(noise, 'x', sizeof noise);
    for (int i = 0; i < 16; i++) raw_send(fd, noise, sizeof noise);
    sleep_s(0.2);
    struct store_server_stats mid;
    store_server_stats(srv, &mid);
    CHECK(mid.bytes_held < base.bytes_held + (4 << 20), "holding %zu bytes for 1 MiB received",
          mid.bytes_held - base.bytes_held);
    close(fd);
    /* a parked get whose client goes away */
    fd = raw_connect(port);
    CHECK(raw_handshake(fd, SECRET, 0) == STORE_STATUS_OK, "handshake");
    struct store_wire_request g = request(STORE_OP_GET, 1, 9, 0, 60000);
    uint8_t get[STORE_WIRE_REQUEST_BYTES + 9];
    store_wire_encode_request(get, &g);
    store_wire_put_u16(get + STORE_WIRE_REQUEST_BYTES, 7);
    memcpy(get + STORE_WIRE_REQUEST_BYTES + 2, "nothing", 7);
    raw_send(fd, get, sizeof get);
    close(fd);

    struct store_server_stats after = stats_when(srv, no_connections);
    CHECK(after.connections == 0 && after.parked == 0, "%zu connections, %zu parked left",
          after.connections, after.parked);
    CHECK(after.bytes_held == base.bytes_held && after.keys == base.keys,
          "held %zu bytes in %zu keys before, %zu in %zu after", base.bytes_held, base.keys,
          after.bytes_held, after.keys);
    CHECK(after.bad_requests >= 10, "%llu bad requests counted",
          (unsigned long long)after.bad_requests);
    long grown = rss_kib() - rss_before;
    CHECK(grown < 32 * 1024, "the process grew by %ld KiB", grown);
    /* and a well-behaved client is served as before */
    st = join(srv, 1);
    void *v = NULL;
    size_t bytes;
    CHECK(store_set(st, "still", "fine", 4, &err) == 0 &&
              store_get(st, "still", &v, &bytes, 1, &err) == 0 && v && !strcmp(v, "fine"),
          "%s", err.text);
    free(v);
    store_close(st);
    store_server_stop(srv);
}

int main(void)
{
    RUN(test_wrong_secret_is_refused_and_its_set_does_not_land);
    RUN(test_strangers_are_said_a_few_then_summarised);
    RUN(test_hostile_streams_neither_crash_nor_grow_the_server);
    return check_exit_code();
}
