/* test_comm_failure.c — the socket collectives when something goes wrong,
 * with real processes (comm_world.h): a killed rank, a rank that never
 * joins, a stranger without the secret, a job abort, and requests never
 * waited for (freed with their communicator: each rank's LeakSanitizer
 * check under ASan). */
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "comm_world.h"
#include "common/sha256.h"
#include "runtime/comm/sock_connect.h"

/* ---- failure ----------------------------------------------------------------- */

/* Rank `victim` is killed (SIGKILL, by the parent) during a stream of large
 * all-reduces; every other rank must fail naming it within timeout_s. */
static void kill_rank(struct comm *c, struct store *st, int rank, int n, void *arg)
{
    (void)st;
    (void)n;
    (void)arg;
    struct plait_error err;
    size_t count = (size_t)4 << 20;
    float *x = calloc(count, sizeof(float));
    for (int i = 0; i < 1000; i++) {
        atomic_store(&sh->flag[rank], i + 1);
        if (comm_allreduce(c, x, x, count, COMM_FLOAT32, COMM_SUM, &err) != 0) {
            sh->t[rank][0] = now_s();
            snprintf(sh->text[rank], sizeof sh->text[rank], "%s", err.text);
            sh->peer_lost[rank] = err.peer_lost;
            /* later operations fail at once, with the same text */
            double t0 = now_s();
            CHECK(comm_barrier(c, &err) != 0 && now_s() - t0 < 0.5,
                  "a later barrier fails at once");
            break;
        }
    }
    free(x);
}

static void killed_rank_case(int n, int victim, enum comm_transport tr, double timeout_s)
{
    struct world w;
    struct world_opts o = {
        .n = n, .absent_rank = -1, .timeout_s = timeout_s, .transport = tr, .name = "kill"};
    world_start(&w, &o, kill_rank, NULL);
    /* wait until everyone is a few all-reduces in, then kill the victim mid-stream */
    double t0 = now_s();
    for (bool ready = false; !ready && now_s() - t0 < 20; sleep_s(0.001)) {
        ready = true;
        for (int r = 0; r < n; r++) ready &= atomic_load(&sh->flag[r]) >= 3;
    }
    sleep_s(0.003);
    sh->kill_time = now_s();
    kill(w.pid[victim], SIGKILL);
    int status[MAX_RANKS];
    int ok = world_wait(&w, status);
    CHECK(ok == n - 1, "%d ranks passed", ok);
    char name[32];
    snprintf(name, sizeof name, "rank %d (", victim);
    for (int r = 0; r < n; r++) {
        if (r == victim) continue;
        double after = sh->t[r][0] - sh->kill_time;
        CHECK(sh->t[r][0] > 0 && after < timeout_s, "rank %d failed %.2f s after the kill", r,
              after);
        CHECK(strstr(sh->text[r], name) != NULL, "rank %d's error does not name rank %d: %s", r,
              victim, sh->text[r]);
        CHECK(sh->peer_lost[r], "rank %d's error is not marked peer_lost: %s", r, sh->text[r]);
    }
    printf("  n=%d %s: rank 0 after %.3f s: %s\n", n, tr == COMM_TRANSPORT_TCP ? "tcp" : "shm",
           sh->t[victim ? 0 : 1][0] - sh->kill_time, sh->text[victim ? 0 : 1]);
}

static void test_killed_rank_fails_the_others_naming_it(void)
{
    killed_rank_case(4, 2, COMM_TRANSPORT_AUTO, 3);
    killed_rank_case(3, 0, COMM_TRANSPORT_TCP, 3);
}

static void never_called(struct comm *c, struct store *st, int rank, int n, void *arg)
{
    (void)c, (void)st, (void)n, (void)arg;
    CHECK(0, "rank %d joined a world that should not form", rank);
}

static void test_rank_that_never_joins_is_named_at_the_deadline(void)
{
    struct world w;
    double timeout = 1.5;
    struct world_opts o = {
        .n = 3, .absent_rank = 2, .timeout_s = timeout, .init_may_fail = true, .name = "absent"};
    world_start(&w, &o, never_called, NULL);
    CHECK(world_wait(&w, NULL) == 3, "every rank exits cleanly");
    for (int r = 0; r < 2; r++) {
        CHECK(sh->t[r][0] >= timeout - 0.1 && sh->t[r][0] < timeout + 2,
              "rank %d gave up after %.2f s", r, sh->t[r][0]);
        CHECK(strstr(sh->text[r], "rank 2 did not join") != NULL, "rank %d: %s", r, sh->text[r]);
        CHECK(sh->peer_lost[r], "rank %d's error is not marked peer_lost", r);
    }
    printf("  %s\n", sh->text[0]);
}

/* Someone who knows where rank 0 listens, but not the secret. */
static int stranger_connect(const struct sock_endpoint *e, bool unix_socket)
{
    int fd;
    if (unix_socket) {
        struct sockaddr_un un = {.sun_family = AF_UNIX};
        size_t n = strlen(e->unix_name);
        memcpy(un.sun_path + 1, e->unix_name, n);
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (connect(fd, (struct sockaddr *)&un,
                    (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n)) != 0) {
            close(fd);
            return -1;
        }
    } else { /* where it listens: the address it published, and only there */
        char port[16];
        snprintf(port, sizeof port, "%d", e->port);
        struct addrinfo hints = {.ai_socktype = SOCK_STREAM,
                                 .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV},
                        *ai = NULL;
        if (getaddrinfo(e->host, port, &hints, &ai) != 0) return -1;
        fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
        freeaddrinfo(ai);
        if (rc != 0) {
            close(fd);
            return -1;
        }
    }
    struct timeval tv = {3, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

/* Plays the connector's side with a wrong secret: true if rank 0 hung up
 * instead of acknowledging. */
static bool stranger_is_refused(const struct sock_endpoint *e, bool unix_socket, bool garbage)
{
    int fd = stranger_connect(e, unix_socket);
    if (fd < 0) return false;
    uint8_t hello[56] = "PLCM", buf[64];
    if (garbage) {
        if (getrandom(hello, sizeof hello, 0) != (ssize_t)sizeof hello) return false;
    } else {
        hello[4] = 1;
        hello[8] = 1;                    /* from rank 1 */
        hello[16] = unix_socket ? 1 : 0; /* kind */
        if (getrandom(hello + 24, 32, 0) != 32) return false;
    }
    bool refused = false;
    if (write(fd, hello, sizeof hello) == (ssize_t)sizeof hello) {
        ssize_t k = read(fd, buf, 64); /* the challenge, or a hang-up */
        if (k <= 0) {
            refused = true;
        } else {
            uint8_t proof[32];
            sha256_hmac("not-the-secret", 14, buf, 32, proof);
            if (write(fd, proof, sizeof proof) == (ssize_t)sizeof proof) {
                k = read(fd, buf, 8);
                refused = k <= 0; /* no "PLOK" */
            }
        }
    }
    close(fd);
    return refused;
}

static void late_rank(struct comm *c, struct store *st, int rank, int n, void *arg)
{
    (void)st, (void)arg;
    struct plait_error err;
    float v = (float)rank + 1;
    CHECK(comm_allreduce(c, &v, &v, 1, COMM_FLOAT32, COMM_SUM, &err) == 0 &&
              v == (float)(n * (n + 1) / 2),
          "the world works after strangers knocked: %s", err.text);
    comm_stats(c, &sh->stats[rank][0]);
}

struct stranger {
    pthread_t thread;
    const struct sock_endpoint *e;
    bool unix_socket, garbage, refused;
};

static void *stranger_main(void *arg)
{
    struct stranger *s = arg;
    s->refused = stranger_is_refused(s->e, s->unix_socket, s->garbage);
    return NULL;
}

/* Rank 1 joins only after the strangers are done, so rank 0 waits with its
 * listeners open while strangers that read its address from the store knock,
 * all at once (a pipe holds rank 1 back: no race with a loaded machine). */
static void strangers_case(enum comm_transport tr)
{
    struct plait_error err;
    memset(sh, 0, sizeof *sh);
    struct world_opts o = {
        .n = 2, .absent_rank = -1, .timeout_s = 10, .transport = tr, .name = "guarded"};
    fflush(stdout);
    int hold[2];
    if (pipe(hold) != 0) {
        CHECK(0, "pipe");
        return;
    }
    pid_t pid[2];
    for (int r = 0; r < 2; r++) {
        pid[r] = fork();
        if (pid[r] == 0) {
            close(hold[1]);
            char go;
            if (r == 1 && read(hold[0], &go, 1) != 1) _exit(2);
            close(hold[0]);
            child(&o, r, late_rank, NULL);
        }
    }
    close(hold[0]);
    struct store_server *srv = serve();
    int port = atomic_load(&sh->port);
    struct store *st = NULL;
    CHECK(store_connect(&st, "127.0.0.1", port, SECRET, 99, 5, &err) == 0, "%s", err.text);
    void *value = NULL;
    size_t bytes;
    struct sock_endpoint e;
    CHECK(store_get(st, "comm/guarded/addr/0", &value, &bytes, 5, &err) == 0, "%s", err.text);
    CHECK(value && sock_endpoint_parse(value, &e) == 0, "endpoint %s", (char *)value);
    free(value);
    bool shm = tr == COMM_TRANSPORT_AUTO;
    struct stranger s[3] = {{.e = &e, .unix_socket = shm},
                            {.e = &e, .unix_socket = shm, .garbage = true},
                            {.e = &e, .unix_socket = false}};
    int count = shm ? 3 : 2;
    for (int i = 0; i < count; i++) pthread_create(&s[i].thread, NULL, stranger_main, &s[i]);
    for (int i = 0; i < count; i++) {
        pthread_join(s[i].thread, NULL);
        CHECK(s[i].refused, "%s stranger %d (%s) was not refused", shm ? "shm" : "tcp", i,
              s[i].garbage ? "garbage" : "a wrong proof");
    }
    /* let rank 1 join now; rank 0 has seen every stranger by the time the mesh is up */
    if (write(hold[1], "g", 1) != 1) CHECK(0, "releasing rank 1");
    close(hold[1]);
    int status[2];
    for (int r = 0; r < 2; r++)
        CHECK(waitpid(pid[r], &status[r], 0) == pid[r] && WIFEXITED(status[r]) &&
                  WEXITSTATUS(status[r]) == 0,
              "rank %d", r);
    CHECK(sh->stats[0][0].connections_refused == (uint64_t)count, "rank 0 refused %llu, not %d",
          (unsigned long long)sh->stats[0][0].connections_refused, count);
    /* once the mesh is up the listeners are gone */
    int fd = stranger_connect(&e, false);
    CHECK(fd < 0, "the TCP listener closed after set-up");
    if (fd >= 0) close(fd);
    store_close(st);
    store_server_stop(srv);
}

static void test_connection_without_the_secret_is_refused(void)
{
    strangers_case(COMM_TRANSPORT_TCP);
    strangers_case(COMM_TRANSPORT_AUTO);
}

/* A rank blocked in a receive learns at once that the job was aborted
 * elsewhere (here: by another rank, through the store). */
static void abort_rank(struct comm *c, struct store *st, int rank, int n, void *arg)
{
    (void)n, (void)arg;
    struct plait_error err;
    if (rank == 1) {
        sleep_s(0.3);
        sh->kill_time = now_s();
        CHECK(store_abort(st, "rank 1: the optimizer found a NaN", &err) == 0, "%s", err.text);
        return;
    }
    float x;
    CHECK(comm_recv(c, &x, sizeof x, 1, 0, &err) != 0, "the receive fails");
    sh->t[rank][0] = now_s();
    snprintf(sh->text[rank], sizeof sh->text[rank], "%s", err.text);
    sh->peer_lost[rank] = err.peer_lost;
}

static void test_job_abort_fails_blocked_operations_at_once(void)
{
    struct world_opts o = {.n = 2, .absent_rank = -1, .timeout_s = 20, .name = "abort"};
    run_world(&o, abort_rank, NULL);
    double after = sh->t[0][0] - sh->kill_time;
    CHECK(after >= 0 && after < 1.0, "rank 0 heard of the abort after %.2f s", after);
    CHECK(strstr(sh->text[0], "aborted") && strstr(sh->text[0], "found a NaN"), "%s", sh->text[0]);
    CHECK(sh->peer_lost[0], "the abort is not marked peer_lost");
}

/* ---- requests never waited for ------------------------------------------------ */

/* Requests the caller never reaps are freed with their communicator (comm.h's
 * comm_destroy; each rank's LeakSanitizer check, under ASan): done ones
 * (a collective, a send, a receive), failed ones (rank 0's, once rank 1
 * leaves) and one in flight (rank 1's receive); requests waited for before
 * destroy work as ever. */
static void unreaped_rank(struct comm *c, struct store *st, int rank, int n, void *arg)
{
    (void)st, (void)n, (void)arg;
    struct plait_error err;
    int peer = 1 - rank;
    double sum_a = rank + 1, sum_w = 10 * (rank + 1), sent[2] = {rank, rank + 0.5}, got[2];
    float stray;
    struct comm_request *coll_a, *send_a, *recv_a, *w, *send_b, *recv_b, *left;
    CHECK(comm_iallreduce(c, &sum_a, &sum_a, 1, COMM_FLOAT64, COMM_SUM, &coll_a, &err) == 0 &&
              comm_isend(c, &sent[0], sizeof(double), peer, 1, &send_a, &err) == 0 &&
              comm_irecv(c, &got[0], sizeof(double), peer, 1, &recv_a, &err) == 0,
          "%s", err.text);
    /* collectives complete in order, sends and receives to one peer too: once
     * these are waited for, the first three are done, never reaped */
    CHECK(comm_iallreduce(c, &sum_w, &sum_w, 1, COMM_FLOAT64, COMM_SUM, &w, &err) == 0 &&
              comm_wait(w, &err) == 0 && sum_w == 30,
          "a waited all-reduce: %g (%s)", sum_w, err.text);
    CHECK(comm_isend(c, &sent[1], sizeof(double), peer, 1, &send_b, &err) == 0 &&
              comm_irecv(c, &got[1], sizeof(double), peer, 1, &recv_b, &err) == 0 &&
              comm_wait(send_b, &err) == 0 && comm_wait(recv_b, &err) == 0,
          "%s", err.text);
    CHECK(sum_a == 3 && got[0] == peer && got[1] == peer + 0.5,
          "the unreaped requests did their work: %g %g %g", sum_a, got[0], got[1]);
    if (rank == 1) { /* leaves with a receive in flight (rank 0 never sends tag 2) */
        CHECK(comm_irecv(c, &stray, sizeof stray, peer, 2, &left, &err) == 0, "%s", err.text);
        return;
    }
    /* rank 0: two requests that fail as rank 1 leaves, found out by a third */
    CHECK(comm_irecv(c, &stray, sizeof stray, peer, 3, &left, &err) == 0 &&
              comm_iallreduce(c, &sum_a, &sum_a, 1, COMM_FLOAT64, COMM_SUM, &w, &err) == 0,
          "%s", err.text);
    CHECK(comm_recv(c, &stray, sizeof stray, peer, 3, &err) != 0 && err.peer_lost,
          "a receive from a rank that left: %s", err.text);
}

static void test_requests_never_waited_for_are_freed_with_their_communicator(void)
{
    struct world_opts tcp = {
        .n = 2, .absent_rank = -1, .transport = COMM_TRANSPORT_TCP, .name = "unreaped"};
    run_world(&tcp, unreaped_rank, NULL);
    struct world_opts shm = {.n = 2, .absent_rank = -1, .name = "unreaped-shm"};
    run_world(&shm, unreaped_rank, NULL);
}

static const struct comm_case cases[] = {
    COMM_CASE(test_killed_rank_fails_the_others_naming_it),
    COMM_CASE(test_rank_that_never_joins_is_named_at_the_deadline),
    COMM_CASE(test_connection_without_the_secret_is_refused),
    COMM_CASE(test_job_abort_fails_blocked_operations_at_once),
    COMM_CASE(test_requests_never_waited_for_are_freed_with_their_communicator),
};

int main(int argc, char **argv)
{
    return comm_world_main(argc, argv, cases, (int)(sizeof cases / sizeof cases[0]));
}
