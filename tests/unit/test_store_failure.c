/* test_store_failure.c — the store when its server is not there: a server
 * killed (in its own process) or stopped fails its waiting clients at once and
 * says why, and a client retries until a late server comes up. Not the
 * protocol itself (test_store.c). `test_store_failure --serve-store FD` is the
 * killed server's process. */
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "store_harness.h"

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

/* `test_store_failure --serve-store FD`: a server in its own process (so a test can
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

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--serve-store")) return serve_store(atoi(argv[2]));
    ssize_t k = readlink("/proc/self/exe", self_exe, sizeof self_exe - 1);
    if (k > 0) self_exe[k] = '\0';
    RUN(test_dead_server_fails_waiting_clients_at_once);
    RUN(test_stopped_server_fails_waiting_clients_at_once);
    RUN(test_connect_retries_until_a_late_server_comes_up);
    return check_exit_code();
}
