/* console.c — rank 0's console kept in the run directory: stdout and stderr
 * become streams that write each piece to where it went before (a terminal,
 * a pipe) and append it to RUN_DIR/train.log, at once (nothing is held back
 * that a crash could lose). A closed terminal or pipe (EPIPE, EIO, ...) only
 * ends the printing; training and the log go on. What is printed is not
 * decided here. */
#include "runtime/console.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/fsutil.h"
#include "common/formats/rundir.h"

enum console_mode console_mode = CONSOLE_PROGRESS;

struct sink {
    int fd; /* the stream's own descriptor (1 or 2), -1 once it failed */
};

static struct {
    int log_fd; /* train.log, -1 when not kept */
    struct sink sinks[2];
    FILE *before[2]; /* stdout and stderr as they were */
    bool running;
} con = {.log_fd = -1};

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

static ssize_t sink_write(void *cookie, const char *buf, size_t n)
{
    struct sink *s = cookie;
    /* the terminal or pipe closed: stop printing there, keep the log */
    if (s->fd >= 0 && !write_all(s->fd, buf, n)) s->fd = -1;
    if (con.log_fd >= 0 && !write_all(con.log_fd, buf, n)) {
        close(con.log_fd);
        con.log_fd = -1;
    }
    return (ssize_t)n;
}

int console_start(const char *run_dir, struct plait_error *err)
{
    char path[4096];
    if (fs_join(path, sizeof path, run_dir, RUNDIR_LOG, err)) return -1;
    con.log_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (con.log_fd < 0) return error_errno(err, "%s", path);
    fflush(stdout);
    fflush(stderr);
    cookie_io_functions_t io = {.write = sink_write};
    FILE *streams[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++) {
        con.sinks[i].fd = 1 + i;
        streams[i] = fopencookie(&con.sinks[i], "w", io);
        if (!streams[i]) {
            error_errno(err, "keeping the console in %s", path);
            if (streams[0]) fclose(streams[0]);
            close(con.log_fd);
            con.log_fd = -1;
            return -1;
        }
    }
    /* as on a terminal: stdout a line at a time, stderr at once */
    setvbuf(streams[0], NULL, _IOLBF, 0);
    setvbuf(streams[1], NULL, _IONBF, 0);
    con.before[0] = stdout;
    con.before[1] = stderr;
    stdout = streams[0];
    stderr = streams[1];
    con.running = true;
    return 0;
}

void console_note(const char *text, size_t bytes)
{
    if (!con.running || con.sinks[1].fd >= 0) write_all(STDERR_FILENO, text, bytes);
    if (con.log_fd >= 0) write_all(con.log_fd, text, bytes);
}

void console_stop(void)
{
    if (!con.running) return;
    FILE *streams[2] = {stdout, stderr};
    stdout = con.before[0];
    stderr = con.before[1];
    con.running = false;
    for (int i = 0; i < 2; i++) fclose(streams[i]); /* flushes what is left */
    if (con.log_fd >= 0) close(con.log_fd);
    con.log_fd = -1;
    /* a closed terminal or pipe stays closed: nothing more goes there */
    for (int i = 0; i < 2; i++)
        if (con.sinks[i].fd < 0) {
            int null_fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
            if (null_fd >= 0) {
                dup2(null_fd, 1 + i);
                close(null_fd);
            }
        }
}
