/* test_store.c — the rendezvous store over real TCP on the loopback: SHA-256
 * and HMAC against the published vectors, round trips, waits answered by
 * later writes from other threads and processes, atomic counters, barriers
 * that name who did not come, the secret, dead servers, hostile byte streams,
 * abort, heartbeats and late servers. `test_store --bench` prints round trips
 * per second and barrier latency instead. */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "common/sha256.h"
#include "common/store/store.h"
#include "common/store/store_wire.h"

#define SECRET "0123456789abcdef-test-secret"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static void hex(const uint8_t *bytes, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", bytes[i]);
}

static struct store_server *start_server(void)
{
    struct store_server *srv = NULL;
    struct plait_error err;
    int rc = store_server_start(&srv, "127.0.0.1", 0, SECRET, &err);
    CHECK(rc == 0, "%s", err.text);
    return srv;
}

static struct store *join(struct store_server *srv, int rank)
{
    struct store *st = NULL;
    struct plait_error err;
    int rc = store_connect(&st, "127.0.0.1", store_server_port(srv), SECRET, rank, 10, &err);
    CHECK(rc == 0, "rank %d: %s", rank, err.text);
    return st;
}

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

/* ---- SHA-256 and HMAC ------------------------------------------------ */

static void test_sha256_matches_fips_180_2_examples(void)
{
    static const char *const inputs[] = {
        "abc", "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", ""};
    static const char *const digests[] = {
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1",
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"};
    for (int i = 0; i < 3; i++) {
        uint8_t d[32];
        char text[65];
        sha256(inputs[i], strlen(inputs[i]), d);
        hex(d, 32, text);
        CHECK(!strcmp(text, digests[i]), "sha256(\"%s\") = %s", inputs[i], text);
    }
    /* one million 'a', fed in uneven pieces to cross block boundaries */
    struct sha256 s;
    char a[1000];
    memset(a, 'a', sizeof a);
    sha256_init(&s);
    for (size_t fed = 0, piece = 1; fed < 1000000; fed += piece, piece = piece % 997 + 1) {
        if (piece > 1000000 - fed) piece = 1000000 - fed;
        sha256_update(&s, a, piece);
    }
    uint8_t d[32];
    char text[65];
    sha256_final(&s, d);
    hex(d, 32, text);
    CHECK(!strcmp(text, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"),
          "sha256(a x 10^6) = %s", text);
}

static void unhex(const char *text, uint8_t *out, size_t *n)
{
    *n = strlen(text) / 2;
    for (size_t i = 0; i < *n; i++) sscanf(text + 2 * i, "%2hhx", &out[i]);
}

static void test_hmac_sha256_matches_rfc_4231_vectors(void)
{
    static const struct {
        const char *key, *data, *mac; /* hex */
    } cases[] = {
        {"0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b", "4869205468657265",
         "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
        {"4a656665", "7768617420646f2079612077616e7420666f72206e6f7468696e673f",
         "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
        {"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
         "dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd"
         "dddddddddddd",
         "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"},
        {"0102030405060708090a0b0c0d0e0f10111213141516171819",
         "cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd"
         "cdcdcdcdcdcd",
         "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"},
        /* case 6: a key longer than a block (131 bytes of 0xaa) */
        {NULL,
         "54657374205573696e67204c6172676572205468616e20426c6f636b2d53697a65204b6579202d2048"
         "617368204b6579204669727374",
         "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"},
        /* case 7: a long key and a long message */
        {NULL,
         "5468697320697320612074657374207573696e672061206c6172676572207468616e20626c6f636b2d73"
         "697a65206b657920616e642061206c6172676572207468616e20626c6f636b2d73697a6520646174612e"
         "20546865206b6579206e6565647320746f20626520686173686564206265666f7265206265696e672075"
         "7365642062792074686520484d414320616c676f726974686d2e",
         "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint8_t key[131], data[256], mac[32];
        size_t key_bytes, data_bytes;
        if (cases[i].key)
            unhex(cases[i].key, key, &key_bytes);
        else
            memset(key, 0xaa, key_bytes = 131);
        unhex(cases[i].data, data, &data_bytes);
        sha256_hmac(key, key_bytes, data, data_bytes, mac);
        char text[65];
        hex(mac, 32, text);
        CHECK(!strcmp(text, cases[i].mac), "RFC 4231 case %zu: %s", i < 4 ? i + 1 : i + 2, text);
    }
    CHECK(sha256_equal_ct("abcd", "abcd", 4) && !sha256_equal_ct("abcd", "abce", 4), "compare");
}

/* ---- the basics ------------------------------------------------------ */

static void test_set_get_round_trip(void)
{
    struct store_server *srv = start_server();
    struct store *st = join(srv, 0);
    struct plait_error err;
    void *v = NULL;
    size_t bytes = 0;
    CHECK(store_set(st, "text", "hello", 5, &err) == 0, "%s", err.text);
    CHECK(store_get(st, "text", &v, &bytes, 1, &err) == 0, "%s", err.text);
    CHECK(bytes == 5 && v && !strcmp(v, "hello"), "got %zu bytes", bytes);
    free(v);
    /* binary with NULs, empty, overwritten, and a value too big for one socket buffer */
    const uint8_t bin[] = {0, 1, 0, 255, 0};
    CHECK(store_set(st, "bin", bin, sizeof bin, &err) == 0, "%s", err.text);
    CHECK(store_get(st, "bin", &v, &bytes, 1, &err) == 0 && bytes == 5 && !memcmp(v, bin, 5),
          "binary value");
    free(v);
    CHECK(store_set(st, "empty", "", 0, &err) == 0, "%s", err.text);
    CHECK(store_get(st, "empty", &v, &bytes, 1, &err) == 0 && bytes == 0, "empty value");
    free(v);
    CHECK(store_set(st, "text", "again", 5, &err) == 0, "%s", err.text);
    CHECK(store_get(st, "text", &v, &bytes, 1, &err) == 0 && !strcmp(v, "again"), "overwrite");
    free(v);
    size_t big_bytes = 3 << 20;
    uint8_t *big = malloc(big_bytes);
    for (size_t i = 0; i < big_bytes; i++) big[i] = (uint8_t)(i * 2654435761u >> 13);
    CHECK(store_set(st, "big", big, big_bytes, &err) == 0, "%s", err.text);
    CHECK(store_get(st, "big", &v, &bytes, 5, &err) == 0 && bytes == big_bytes &&
              !memcmp(v, big, big_bytes),
          "3 MiB value");
    free(v);
    free(big);
    /* append and add, and add on text that is not a number */
    size_t total = 0;
    int64_t sum = 0;
    CHECK(store_append(st, "log", "ab", 2, &total, &err) == 0 && total == 2, "append");
    CHECK(store_append(st, "log", "cde", 3, &total, &err) == 0 && total == 5, "append");
    CHECK(store_get(st, "log", &v, &bytes, 1, &err) == 0 && !strcmp(v, "abcde"), "appended");
    free(v);
    CHECK(store_add(st, "n", 5, &sum, &err) == 0 && sum == 5, "add to absent");
    CHECK(store_add(st, "n", -7, &sum, &err) == 0 && sum == -2, "add negative");
    CHECK(store_get(st, "n", &v, &bytes, 1, &err) == 0 && !strcmp(v, "-2"), "counter text");
    free(v);
    CHECK(store_add(st, "text", 1, &sum, &err) != 0 && strstr(err.text, "not a decimal integer"),
          "%s", err.text);
    CHECK(store_add(st, "n", INT64_MAX, &sum, &err) == 0, "%s", err.text);
    CHECK(store_add(st, "n", INT64_MAX, &sum, &err) != 0 && strstr(err.text, "overflow"), "%s",
          err.text);
    CHECK(store_set(st, "after-errors", "ok", 2, &err) == 0, "the connection survives: %s",
          err.text);
    store_close(st);
    store_server_stop(srv);
}

static void test_wait_timeout_names_the_key_and_how_long(void)
{
    struct store_server *srv = start_server();
    struct store *st = join(srv, 3);
    struct plait_error err;
    CHECK(store_set(st, "a", "1", 1, &err) == 0, "%s", err.text);
    const char *keys[] = {"a", "b"};
    double t0 = now_s();
    CHECK(store_wait(st, keys, 2, 0.3, &err) != 0, "b was never set");
    double took = now_s() - t0;
    CHECK(took >= 0.25 && took < 3, "took %.2f s", took);
    CHECK(strstr(err.text, "\"b\"") && strstr(err.text, "1 of 2") &&
              strstr(err.text, "timed out after 0.3 s"),
          "%s", err.text);
    CHECK(err.peer_lost, "a deadline passed waiting for peers is a lost peer");
    void *v = NULL;
    size_t bytes;
    CHECK(store_get(st, "missing", &v, &bytes, 0.2, &err) != 0 && !v &&
              strstr(err.text, "\"missing\"") && strstr(err.text, "0.2 s"),
          "%s", err.text);
    CHECK(store_set(st, "a", "2", 1, &err) == 0, "usable after timeouts: %s", err.text);
    store_close(st);
    store_server_stop(srv);
}

/* ---- waiting for writes from elsewhere --------------------------------- */

static void test_get_waits_for_a_later_set_from_another_process(void)
{
    struct store_server *srv = start_server();
    int port = store_server_port(srv);
    pid_t pid = fork();
    if (pid == 0) {
        struct store *st;
        struct plait_error err;
        sleep_s(0.3);
        if (store_connect(&st, "127.0.0.1", port, SECRET, 1, 10, &err) ||
            store_set(st, "late", "from the child", 14, &err))
            _exit(1);
        store_close(st);
        _exit(0);
    }
    struct store *st = join(srv, 0);
    struct plait_error err;
    void *v = NULL;
    size_t bytes;
    double t0 = now_s();
    CHECK(store_get(st, "late", &v, &bytes, 10, &err) == 0, "%s", err.text);
    double took = now_s() - t0;
    CHECK(v && !strcmp(v, "from the child"), "value");
    CHECK(took > 0.2 && took < 5, "answered after %.2f s", took);
    free(v);
    int status;
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "the child set the key");
    store_close(st);
    store_server_stop(srv);
}

struct adder {
    struct store_server *srv;
    int rank;
    int64_t results[1000];
    int failures;
};

static void *add_1000(void *arg)
{
    struct adder *a = arg;
    struct store *st = join(a->srv, a->rank);
    struct plait_error err;
    for (int i = 0; st && i < 1000; i++)
        if (store_add(st, "counter", 1, &a->results[i], &err)) a->failures++;
    store_close(st);
    return NULL;
}

static void test_add_is_atomic_across_8_threads_of_1000(void)
{
    struct store_server *srv = start_server();
    static struct adder adders[8];
    pthread_t threads[8];
    for (int t = 0; t < 8; t++) {
        adders[t] = (struct adder){.srv = srv, .rank = t};
        pthread_create(&threads[t], NULL, add_1000, &adders[t]);
    }
    for (int t = 0; t < 8; t++) pthread_join(threads[t], NULL);
    /* every sum 1..8000 was handed out exactly once */
    static uint8_t seen[8001];
    memset(seen, 0, sizeof seen);
    int failures = 0, duplicates = 0;
    for (int t = 0; t < 8; t++) {
        failures += adders[t].failures;
        for (int i = 0; i < 1000; i++) {
            int64_t r = adders[t].results[i];
            if (r < 1 || r > 8000 || seen[r]++) duplicates++;
        }
    }
    CHECK(failures == 0 && duplicates == 0, "%d failures, %d duplicates", failures, duplicates);
    struct store *st = join(srv, 9);
    struct plait_error err;
    int64_t total = 0;
    CHECK(store_add(st, "counter", 0, &total, &err) == 0 && total == 8000, "total %lld",
          (long long)total);
    store_close(st);
    store_server_stop(srv);
}

/* ---- barriers -------------------------------------------------------- */

struct barrier_arg {
    struct store_server *srv;
    const char *name;
    int rank, world;
    double timeout_s;
    int rc;
    double entered_s, took_s;
    struct plait_error err;
};

static void *barrier_thread(void *arg)
{
    struct barrier_arg *b = arg;
    struct store *st = join(b->srv, b->rank);
    b->entered_s = now_s();
    b->rc = st ? store_barrier(st, b->name, b->world, b->timeout_s, &b->err) : -1;
    b->took_s = now_s() - b->entered_s;
    store_close(st);
    return NULL;
}

/* Runs world-1 or world ranks (skipping `missing`, -1 for none) through a barrier. */
static void run_barrier(struct store_server *srv, const char *name, int world, int missing,
                        double timeout_s, struct barrier_arg *args)
{
    pthread_t threads[64];
    for (int r = 0; r < world; r++) {
        args[r] = (struct barrier_arg){
            .srv = srv, .name = name, .rank = r, .world = world, .timeout_s = timeout_s, .rc = -1};
        if (r != missing) pthread_create(&threads[r], NULL, barrier_thread, &args[r]);
    }
    for (int r = 0; r < world; r++)
        if (r != missing) pthread_join(threads[r], NULL);
}

static void test_barrier_of_16_clients_completes(void)
{
    struct store_server *srv = start_server();
    struct barrier_arg args[16];
    run_barrier(srv, "all16", 16, -1, 20, args);
    for (int r = 0; r < 16; r++) CHECK(args[r].rc == 0, "rank %d: %s", r, args[r].err.text);
    /* the name is spent: a 17th arrival is an error, not a silent pass */
    struct store *st = join(srv, 3);
    struct plait_error err;
    CHECK(store_barrier(st, "all16", 16, 1, &err) != 0 && strstr(err.text, "used twice"), "%s",
          err.text);
    store_close(st);
    store_server_stop(srv);
}

static void test_barrier_with_rank_7_missing_times_out_naming_rank_7(void)
{
    struct store_server *srv = start_server();
    struct barrier_arg args[16];
    run_barrier(srv, "minus7", 16, 7, 0.5, args);
    for (int r = 0; r < 16; r++) {
        if (r == 7) continue;
        CHECK(args[r].rc != 0, "rank %d passed without rank 7", r);
        CHECK(strstr(args[r].err.text, "1 of 16 ranks did not arrive: 7") &&
                  !strstr(args[r].err.text, "7,") && strstr(args[r].err.text, "\"minus7\""),
              "rank %d: %s", r, args[r].err.text);
        CHECK(args[r].took_s >= 0.45 && args[r].took_s < 5, "rank %d took %.2f s", r,
              args[r].took_s);
    }
    store_server_stop(srv);
}

/* ---- the secret ------------------------------------------------------ */

/* A raw TCP connection to the server (blocking, 5 s receive timeout). */
static int raw_connect(int port)
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

static bool raw_read(int fd, void *buf, size_t n)
{
    for (size_t got = 0; got < n;) {
        ssize_t k = recv(fd, (char *)buf + got, n - got, 0);
        if (k <= 0) return false;
        got += (size_t)k;
    }
    return true;
}

static void raw_send(int fd, const void *buf, size_t n)
{
    for (size_t sent = 0; sent < n;) {
        ssize_t k = send(fd, (const char *)buf + sent, n - sent, MSG_NOSIGNAL);
        if (k <= 0) return; /* the server may close first: that is fine here */
        sent += (size_t)k;
    }
}

/* A reply's status, or -1 when the server closed the connection instead. */
static int raw_reply(int fd)
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
static int raw_handshake(int fd, const char *secret, int32_t rank)
{
    uint8_t hello[STORE_WIRE_HELLO_BYTES], auth[STORE_WIRE_AUTH_BYTES];
    if (!raw_read(fd, hello, sizeof hello)) return -1;
    store_wire_put_u32(auth, (uint32_t)rank);
    store_wire_auth_mac(secret, hello + 8, rank, auth + 4);
    raw_send(fd, auth, sizeof auth);
    return raw_reply(fd);
}

static struct store_wire_request request(uint8_t op, uint16_t key_count, uint32_t keys_bytes,
                                         uint64_t value_bytes, int64_t arg)
{
    return (struct store_wire_request){.op = op,
                                       .key_count = key_count,
                                       .keys_bytes = keys_bytes,
                                       .value_bytes = value_bytes,
                                       .arg = arg};
}

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

/* ---- servers that go away -------------------------------------------- */

struct waiter {
    struct store *st;
    const char *key;
    double timeout_s;
    int rc;
    double took_s;
    struct plait_error err;
};

static void *wait_thread(void *arg)
{
    struct waiter *w = arg;
    void *v = NULL;
    size_t bytes;
    double t0 = now_s();
    w->rc = store_get(w->st, w->key, &v, &bytes, w->timeout_s, &w->err);
    w->took_s = now_s() - t0;
    free(v);
    return NULL;
}

static char self_exe[4096];

/* `test_store --serve-store FD`: a server in its own process (so a test can
 * kill it); writes its port to FD, then waits to be killed. */
static int serve_store(int fd)
{
    struct store_server *srv;
    struct plait_error err;
    if (store_server_start(&srv, "127.0.0.1", 0, SECRET, &err)) {
        fprintf(stderr, "%s\n", err.text);
        return 1;
    }
    int port = store_server_port(srv);
    if (write(fd, &port, sizeof port) != (ssize_t)sizeof port) return 1;
    for (;;) pause();
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

static void test_dead_server_fails_waiting_clients_at_once(void)
{
    int pipe_fds[2];
    CHECK(pipe(pipe_fds) == 0, "pipe");
    pid_t pid = fork();
    if (pid == 0) {
        char fd_text[16];
        snprintf(fd_text, sizeof fd_text, "%d", pipe_fds[1]);
        close(pipe_fds[0]);
        execl(self_exe, self_exe, "--serve-store", fd_text, (char *)NULL);
        _exit(127);
    }
    close(pipe_fds[1]);
    int port = 0;
    CHECK(read(pipe_fds[0], &port, sizeof port) == (ssize_t)sizeof port, "the server's port");
    close(pipe_fds[0]);
    struct waiter w[4];
    pthread_t threads[4];
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    for (int i = 0; i < 4; i++) {
        struct plait_error err;
        w[i] = (struct waiter){.key = "never", .timeout_s = 60};
        CHECK(store_connect(&w[i].st, "127.0.0.1", port, SECRET, i, 10, &err) == 0, "%s", err.text);
        pthread_create(&threads[i], NULL, wait_thread, &w[i]);
    }
    sleep_s(0.3);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    for (int i = 0; i < 4; i++) {
        pthread_join(threads[i], NULL);
        CHECK(w[i].rc != 0 && w[i].took_s < 5, "rank %d: %.2f s", i, w[i].took_s);
        CHECK(strstr(w[i].err.text, addr) && strstr(w[i].err.text, "closed the connection"), "%s",
              w[i].err.text);
        /* and the next call fails at once too, saying why */
        struct plait_error err;
        double t0 = now_s();
        CHECK(store_set(w[i].st, "k", "v", 1, &err) != 0 && now_s() - t0 < 1 &&
                  strstr(err.text, addr),
              "%s", err.text);
        store_close(w[i].st);
    }
}

static void test_stopped_server_fails_waiting_clients_at_once(void)
{
    struct store_server *srv = start_server();
    struct waiter w = {.st = join(srv, 0), .key = "never", .timeout_s = 60};
    pthread_t thread;
    pthread_create(&thread, NULL, wait_thread, &w);
    struct store_server_stats s;
    for (double t0 = now_s(); now_s() - t0 < 5; sleep_s(0.005)) {
        store_server_stats(srv, &s);
        if (s.parked == 1) break;
    }
    CHECK(s.parked == 1, "the get is parked on the server");
    store_server_stop(srv);
    pthread_join(thread, NULL);
    CHECK(w.rc != 0 && w.took_s < 5 && strstr(w.err.text, "closed the connection"), "%.2f s: %s",
          w.took_s, w.err.text);
    store_close(w.st);
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

static void test_one_set_answers_2000_parked_gets(void)
{
    int clients = 2000;
    struct rlimit lim;
    if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < 4200) {
        lim.rlim_cur = lim.rlim_max < 4200 ? lim.rlim_max : 4200;
        setrlimit(RLIMIT_NOFILE, &lim);
        getrlimit(RLIMIT_NOFILE, &lim);
        if (lim.rlim_cur < 4200) clients = ((int)lim.rlim_cur - 100) / 2;
    }
    struct store_server *srv = start_server();
    int port = store_server_port(srv);
    int *fds = malloc((size_t)clients * sizeof *fds);
    struct store_wire_request g = request(STORE_OP_GET, 1, 2 + 2, 0, 30000);
    uint8_t get[STORE_WIRE_REQUEST_BYTES + 4];
    store_wire_encode_request(get, &g);
    store_wire_put_u16(get + STORE_WIRE_REQUEST_BYTES, 2);
    memcpy(get + STORE_WIRE_REQUEST_BYTES + 2, "go", 2);
    int connected = 0;
    for (int i = 0; i < clients; i++) {
        fds[i] = raw_connect(port);
        if (fds[i] < 0 || raw_handshake(fds[i], SECRET, i) != STORE_STATUS_OK) break;
        raw_send(fds[i], get, sizeof get);
        connected++;
    }
    CHECK(connected == clients, "%d of %d clients joined", connected, clients);
    struct store_server_stats s;
    for (double t0 = now_s(); now_s() - t0 < 10; sleep_s(0.01)) {
        store_server_stats(srv, &s);
        if (s.parked == (size_t)connected) break;
    }
    CHECK(s.parked == (size_t)connected, "%zu parked", s.parked);
    struct store *st = join(srv, 0);
    struct plait_error err;
    double t0 = now_s();
    CHECK(store_set(st, "go", "now", 3, &err) == 0, "%s", err.text);
    int answered = 0;
    for (int i = 0; i < connected; i++) {
        uint8_t head[STORE_WIRE_REPLY_BYTES + 3];
        struct store_wire_reply r;
        if (!raw_read(fds[i], head, sizeof head)) continue;
        store_wire_decode_reply(head, &r);
        answered += r.status == STORE_STATUS_OK && r.value_bytes == 3 &&
                    !memcmp(head + STORE_WIRE_REPLY_BYTES, "now", 3);
    }
    double took = now_s() - t0;
    CHECK(answered == connected, "%d of %d answered", answered, connected);
    CHECK(took < 10, "answering took %.2f s", took);
    printf("  # one set answered %d parked gets in %.1f ms\n", answered, took * 1e3);
    for (int i = 0; i < connected; i++) close(fds[i]);
    free(fds);
    store_close(st);
    store_server_stop(srv);
}

/* ---- abort ----------------------------------------------------------- */

struct abort_waiter {
    struct store_server *srv;
    int kind; /* 0 get, 1 wait, 2 barrier */
    int rc;
    double took_s;
    struct plait_error err;
};

static void *abort_waiter_thread(void *arg)
{
    struct abort_waiter *a = arg;
    struct store *st = join(a->srv, a->kind);
    const char *keys[] = {"never"};
    void *v = NULL;
    size_t bytes;
    double t0 = now_s();
    a->rc = a->kind == 0   ? store_get(st, "never", &v, &bytes, 60, &a->err)
            : a->kind == 1 ? store_wait(st, keys, 1, 60, &a->err)
                           : store_barrier(st, "b", 4, 60, &a->err);
    a->took_s = now_s() - t0;
    free(v);
    store_close(st);
    return NULL;
}

static void test_abort_wakes_every_waiter_with_the_reason_until_cleared(void)
{
    struct store_server *srv = start_server();
    struct abort_waiter w[3];
    pthread_t threads[3];
    for (int i = 0; i < 3; i++) {
        w[i] = (struct abort_waiter){.srv = srv, .kind = i};
        pthread_create(&threads[i], NULL, abort_waiter_thread, &w[i]);
    }
    struct store_server_stats s;
    for (double t0 = now_s(); now_s() - t0 < 5; sleep_s(0.005)) {
        store_server_stats(srv, &s);
        if (s.parked == 3) break;
    }
    CHECK(s.parked == 3, "%zu parked", s.parked);
    struct store *st = join(srv, 3);
    struct plait_error err;
    CHECK(store_set(st, "exists", "1", 1, &err) == 0, "%s", err.text);
    CHECK(store_abort(st, "CUDA out of memory", &err) == 0, "%s", err.text);
    for (int i = 0; i < 3; i++) {
        pthread_join(threads[i], NULL);
        CHECK(w[i].rc != 0 && w[i].took_s < 5, "waiter %d: %.2f s", i, w[i].took_s);
        CHECK(strstr(w[i].err.text, "aborted: rank 3: CUDA out of memory"), "%s", w[i].err.text);
        CHECK(w[i].err.peer_lost, "waiter %d: an aborted job is a lost peer", i);
    }
    /* later waits fail at once; keys that exist still read; the reason reads */
    void *v = NULL;
    size_t bytes;
    double t0 = now_s();
    CHECK(store_get(st, "other", &v, &bytes, 60, &err) != 0 && now_s() - t0 < 2 &&
              strstr(err.text, "aborted"),
          "%s", err.text);
    CHECK(store_get(st, "exists", &v, &bytes, 1, &err) == 0, "%s", err.text);
    free(v);
    CHECK(store_get(st, STORE_ABORT_KEY, &v, &bytes, 1, &err) == 0 && v &&
              !strcmp(v, "rank 3: CUDA out of memory"),
          "reason");
    free(v);
    /* cleared for a new start of the gang: waits wait again, and a new abort wakes them */
    CHECK(store_abort_clear(st, &err) == 0, "%s", err.text);
    t0 = now_s();
    CHECK(store_get(st, "other", &v, &bytes, 0.2, &err) != 0 && now_s() - t0 >= 0.15 &&
              strstr(err.text, "timed out"),
          "after the clear: %s", err.text);
    CHECK(store_abort(st, "again", &err) == 0, "%s", err.text);
    CHECK(store_get(st, "other", &v, &bytes, 60, &err) != 0 && strstr(err.text, "again"), "%s",
          err.text);
    store_close(st);
    store_server_stop(srv);
}

/* ---- heartbeats ------------------------------------------------------ */

static void test_heartbeat_stopped_is_reported_dead_after_stale_ms(void)
{
    struct store_server *srv = start_server();
    struct store *st[3];
    struct plait_error err;
    for (int r = 0; r < 3; r++) {
        st[r] = join(srv, r);
        CHECK(store_heartbeat_start(st[r], 20, &err) == 0, "%s", err.text);
    }
    CHECK(store_heartbeat_start(st[0], 20, &err) != 0, "a second heartbeat");
    sleep_s(0.1);
    int dead[8];
    size_t n = 99;
    CHECK(store_dead_ranks(st[0], 3, 400, dead, 8, &n, &err) == 0 && n == 0, "%zu dead: %s", n,
          err.text);
    /* the owner keeps using its connection while its heartbeat beats */
    CHECK(store_set(st[1], "busy", "1", 1, &err) == 0, "%s", err.text);
    store_heartbeat_stop(st[1]);
    sleep_s(0.6);
    CHECK(store_dead_ranks(st[0], 3, 400, dead, 8, &n, &err) == 0 && n == 1 && dead[0] == 1,
          "%zu dead, first %d", n, n ? dead[0] : -1);
    /* a rank that never beat counts as dead; max bounds what is written */
    CHECK(store_dead_ranks(st[0], 5, 400, dead, 2, &n, &err) == 0 && n == 3 && dead[0] == 1 &&
              dead[1] == 3,
          "%zu dead", n);
    for (int r = 0; r < 3; r++) store_close(st[r]);
    store_server_stop(srv);
}

/* ---- connecting ------------------------------------------------------ */

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    bind(fd, (struct sockaddr *)&sa, sizeof sa);
    getsockname(fd, (struct sockaddr *)&sa, &len);
    close(fd);
    return ntohs(sa.sin_port);
}

struct late_server {
    int port;
    struct store_server *srv;
    struct plait_error err;
};

static void *start_late(void *arg)
{
    struct late_server *l = arg;
    sleep_s(0.4);
    store_server_start(&l->srv, "127.0.0.1", l->port, SECRET, &l->err);
    return NULL;
}

static void test_connect_retries_until_a_late_server_comes_up(void)
{
    struct store *st = NULL;
    struct plait_error err;
    int port = free_port();
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    double t0 = now_s();
    CHECK(store_connect(&st, "127.0.0.1", port, SECRET, 0, 0.3, &err) != 0, "nobody there");
    CHECK(now_s() - t0 >= 0.25 && now_s() - t0 < 3, "gave up after %.2f s", now_s() - t0);
    CHECK(strstr(err.text, addr) && strstr(err.text, "Connection refused"), "%s", err.text);
    struct late_server l = {.port = port};
    pthread_t thread;
    pthread_create(&thread, NULL, start_late, &l);
    t0 = now_s();
    CHECK(store_connect(&st, "127.0.0.1", port, SECRET, 0, 10, &err) == 0, "%s", err.text);
    CHECK(now_s() - t0 > 0.3, "connected after %.2f s", now_s() - t0);
    pthread_join(thread, NULL);
    CHECK(l.srv, "%s", l.err.text);
    CHECK(st && store_set(st, "k", "v", 1, &err) == 0, "%s", err.text);
    store_close(st);
    store_server_stop(l.srv);
}

static void test_server_binds_ipv6_and_ipv4_and_host_names(void)
{
    struct store_server *srv = NULL;
    struct store *st = NULL;
    struct plait_error err;
    bool have_v6 = true;
    int probe = socket(AF_INET6, SOCK_STREAM, 0);
    if (probe < 0) have_v6 = false;
    struct sockaddr_in6 lo = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    if (probe >= 0 && bind(probe, (struct sockaddr *)&lo, sizeof lo) != 0) have_v6 = false;
    if (probe >= 0) close(probe);
    static const struct {
        const char *bind, *host;
    } cases[] = {{"0.0.0.0", "127.0.0.1"}, {"localhost", "localhost"},
                 {NULL, "127.0.0.1"},      {"::", "::1"},
                 {"::", "127.0.0.1"},      {NULL, "::1"}};
    for (int i = 0; i < (have_v6 ? 6 : 3); i++) {
        const char *bind_text = cases[i].bind ? cases[i].bind : "NULL";
        CHECK(store_server_start(&srv, cases[i].bind, 0, SECRET, &err) == 0, "%s: %s", bind_text,
              err.text);
        if (!srv) continue;
        CHECK(store_connect(&st, cases[i].host, store_server_port(srv), SECRET, 0, 5, &err) == 0,
              "bind %s, connect %s: %s", bind_text, cases[i].host, err.text);
        store_close(st);
        st = NULL;
        store_server_stop(srv);
        srv = NULL;
    }
    CHECK(store_server_start(&srv, "127.0.0.1", 0, "", &err) != 0, "an empty secret");
    CHECK(store_server_start(&srv, "no-such-host.invalid", 0, SECRET, &err) != 0 &&
              strstr(err.text, "no-such-host.invalid"),
          "%s", err.text);
}

static void test_address_and_secret_helpers(void)
{
    char out[64], host[64];
    int port = 0;
    struct plait_error err;
    CHECK(store_addr_format(out, sizeof out, "::1", 29500, &err) == 0 &&
              !strcmp(out, "[::1]:29500"),
          "%s", out);
    CHECK(store_addr_parse(out, host, sizeof host, &port, &err) == 0 && !strcmp(host, "::1") &&
              port == 29500,
          "%s %d", host, port);
    CHECK(store_addr_parse("node-7.cluster:1234", host, sizeof host, &port, &err) == 0 &&
              !strcmp(host, "node-7.cluster") && port == 1234,
          "%s", host);
    const char *bad[] = {"node",       "node:",    ":12",   "node:0",
                         "node:70000", "node:12x", "::1:5", "[::1]5"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK(store_addr_parse(bad[i], host, sizeof host, &port, &err) != 0, "%s", bad[i]);
    char a[STORE_SECRET_HEX_BYTES], b[STORE_SECRET_HEX_BYTES];
    CHECK(store_secret_generate(a, &err) == 0 && store_secret_generate(b, &err) == 0, "%s",
          err.text);
    CHECK(strlen(a) == 64 && strspn(a, "0123456789abcdef") == 64 && strcmp(a, b), "%s %s", a, b);
}

/* ---- numbers (not a test) -------------------------------------------- */

static int bench(void)
{
    struct store_server *srv = start_server();
    struct store *st = join(srv, 0);
    struct plait_error err;
    int n = 20000;
    double t0 = now_s();
    for (int i = 0; i < n; i++) {
        void *v;
        size_t bytes;
        char key[32];
        snprintf(key, sizeof key, "k%d", i % 100);
        if (store_set(st, key, "0123456789abcdef", 16, &err) ||
            store_get(st, key, &v, &bytes, 1, &err))
            return printf("bench: %s\n", err.text), 1;
        free(v);
    }
    double took = now_s() - t0;
    printf("set+get of 16 bytes: %.0f pairs/s (%.1f us per round trip)\n", n / took,
           took / (2 * n) * 1e6);
    store_close(st);
    for (int world = 16; world <= 64; world *= 4) {
        double best = 1e9, sum = 0;
        for (int rep = 0; rep < 5; rep++) {
            struct barrier_arg args[64];
            char name[32];
            snprintf(name, sizeof name, "bench-%d-%d", world, rep);
            run_barrier(srv, name, world, -1, 30, args);
            /* from the last rank entering to the last rank leaving (connects are not the barrier)
             */
            double last_in = 0, last_out = 0;
            for (int r = 0; r < world; r++) {
                if (args[r].rc) return printf("bench: %s\n", args[r].err.text), 1;
                if (args[r].entered_s > last_in) last_in = args[r].entered_s;
                if (args[r].entered_s + args[r].took_s > last_out)
                    last_out = args[r].entered_s + args[r].took_s;
            }
            double slowest = last_out - last_in;
            sum += slowest;
            if (slowest < best) best = slowest;
        }
        printf("barrier of %d clients (threads, own connections): best %.2f ms, mean %.2f ms "
               "from the last rank entering to the last rank leaving\n",
               world, best * 1e3, sum / 5 * 1e3);
    }
    store_server_stop(srv);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--serve-store")) return serve_store(atoi(argv[2]));
    ssize_t k = readlink("/proc/self/exe", self_exe, sizeof self_exe - 1);
    if (k > 0) self_exe[k] = '\0';
    if (argc == 2 && !strcmp(argv[1], "--bench")) return bench();
    RUN(test_sha256_matches_fips_180_2_examples);
    RUN(test_hmac_sha256_matches_rfc_4231_vectors);
    RUN(test_address_and_secret_helpers);
    RUN(test_dead_server_fails_waiting_clients_at_once);
    RUN(test_get_waits_for_a_later_set_from_another_process);
    RUN(test_set_get_round_trip);
    RUN(test_wait_timeout_names_the_key_and_how_long);
    RUN(test_add_is_atomic_across_8_threads_of_1000);
    RUN(test_barrier_of_16_clients_completes);
    RUN(test_barrier_with_rank_7_missing_times_out_naming_rank_7);
    RUN(test_wrong_secret_is_refused_and_its_set_does_not_land);
    RUN(test_strangers_are_said_a_few_then_summarised);
    RUN(test_stopped_server_fails_waiting_clients_at_once);
    RUN(test_hostile_streams_neither_crash_nor_grow_the_server);
    RUN(test_one_set_answers_2000_parked_gets);
    RUN(test_abort_wakes_every_waiter_with_the_reason_until_cleared);
    RUN(test_heartbeat_stopped_is_reported_dead_after_stale_ms);
    RUN(test_connect_retries_until_a_late_server_comes_up);
    RUN(test_server_binds_ipv6_and_ipv4_and_host_names);
    return check_exit_code();
}
