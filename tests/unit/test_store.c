/* test_store.c — the rendezvous store over real TCP on the loopback, as a job
 * uses it: round trips, waits answered by later writes from other threads and
 * processes, atomic counters, barriers that name who did not come, one write
 * answering 2000 parked gets, abort and heartbeats. Not the secret and hostile
 * clients (test_store_hostile.c), servers that go away (test_store_failure.c)
 * or addresses (test_store_addr.c). `test_store --bench` prints round trips
 * per second and barrier latency instead. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "store_harness.h"

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

/* ---- many clients (raw, so not 2000 threads) --------------------------- */

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
    if (argc == 2 && !strcmp(argv[1], "--bench")) return bench();
    RUN(test_get_waits_for_a_later_set_from_another_process);
    RUN(test_set_get_round_trip);
    RUN(test_wait_timeout_names_the_key_and_how_long);
    RUN(test_add_is_atomic_across_8_threads_of_1000);
    RUN(test_barrier_of_16_clients_completes);
    RUN(test_barrier_with_rank_7_missing_times_out_naming_rank_7);
    RUN(test_one_set_answers_2000_parked_gets);
    RUN(test_abort_wakes_every_waiter_with_the_reason_until_cleared);
    RUN(test_heartbeat_stopped_is_reported_dead_after_stale_ms);
    return check_exit_code();
}
