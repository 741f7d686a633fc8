/* console.c — rank 0's console kept in the run directory: stdout and stderr
 * go through pipes to a thread that passes each on to where it went before
 * (a terminal, a pipe) and appends both to RUN_DIR/train.log. A closed
 * terminal or pipe (EPIPE, EIO, ...) only ends the printing; training and the
 * log go on. What is printed is not decided here. */
#include "runtime/console.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/fsutil.h"

enum console_mode console_mode = CONSOLE_PROGRESS;

static struct {
    int log_fd;
    int pipe_fd[2]; /* the read ends: stdout's, stderr's */
    int out_fd[2];  /* where stdout and stderr went before (dups), -1 once closed */
    pthread_t thread;
    bool running;
} con = {.log_fd = -1, .pipe_fd = {-1, -1}, .out_fd = {-1, -1}};

/* all of buf to fd; false when it failed for good */
static bool write_all(int fd, const char *buf, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, buf, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        buf += w;
        n -= (size_t)w;
    }
    return true;
}

static void *pump(void *arg)
{
    (void)arg;
    struct pollfd p[2] = {{.fd = con.pipe_fd[0], .events = POLLIN},
                          {.fd = con.pipe_fd[1], .events = POLLIN}};
    int open_ends = 2;
    char buf[65536];
    while (open_ends > 0) {
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        for (int i = 0; i < 2; i++) {
            if (p[i].fd < 0 || !(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            ssize_t n = read(p[i].fd, buf, sizeof buf);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) {
                p[i].fd = -1;
                open_ends--;
                continue;
            }
            /* the terminal or pipe closed: stop printing there, keep the log */
            if (con.out_fd[i] >= 0 && !write_all(con.out_fd[i], buf, (size_t)n)) {
                close(con.out_fd[i]);
                con.out_fd[i] = -1;
            }
            if (con.log_fd >= 0 && !write_all(con.log_fd, buf, (size_t)n)) {
                close(con.log_fd);
                con.log_fd = -1;
            }
        }
    }
    return NULL;
}

int console_start(const char *run_dir, struct plait_error *err)
{
    char path[4096];
    int fds[2][2] = {{-1, -1}, {-1, -1}};
    if (fs_join(path, sizeof path, run_dir, "train.log", err)) return -1;
    con.log_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (con.log_fd < 0) return error_errno(err, "%s", path);
    fflush(stdout);
    fflush(stderr);
    for (int i = 0; i < 2; i++) {
        if (pipe2(fds[i], O_CLOEXEC)) goto fail;
        con.out_fd[i] = fcntl(1 + i, F_DUPFD_CLOEXEC, 3);
        if (con.out_fd[i] < 0) goto fail;
    }
    for (int i = 0; i < 2; i++) {
        con.pipe_fd[i] = fds[i][0];
        if (dup2(fds[i][1], 1 + i) < 0) goto fail;
        close(fds[i][1]);
        fds[i][1] = -1;
    }
    setvbuf(stdout, NULL, _IOLBF, 0); /* a pipe now: one line at a time, as on a terminal */
    if (pthread_create(&con.thread, NULL, pump, NULL)) {
        errno = EAGAIN;
        goto fail;
    }
    con.running = true;
    return 0;
fail:
    error_errno(err, "keeping the console in %s", path);
    for (int i = 0; i < 2; i++) {
        if (con.out_fd[i] >= 0) dup2(con.out_fd[i], 1 + i);
        if (fds[i][1] >= 0) close(fds[i][1]);
        if (fds[i][0] >= 0) close(fds[i][0]);
        if (con.out_fd[i] >= 0) close(con.out_fd[i]);
        con.out_fd[i] = con.pipe_fd[i] = -1;
    }
    close(con.log_fd);
    con.log_fd = -1;
    return -1;
}

void console_stop(void)
{
    if (!con.running) return;
    fflush(stdout);
    fflush(stderr);
    /* the write ends closed (fds 1 and 2 on /dev/null for now), the thread
     * drains what is left and ends */
    int null_fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
    for (int i = 0; i < 2; i++) dup2(null_fd, 1 + i);
    pthread_join(con.thread, NULL);
    con.running = false;
    for (int i = 0; i < 2; i++) { /* what comes after goes where it went before */
        if (con.out_fd[i] >= 0) {
            dup2(con.out_fd[i], 1 + i);
            close(con.out_fd[i]);
        }
        close(con.pipe_fd[i]);
        con.out_fd[i] = con.pipe_fd[i] = -1;
    }
    if (null_fd >= 0) close(null_fd);
    if (con.log_fd >= 0) close(con.log_fd);
    con.log_fd = -1;
}
