/* runlock.c — the per-directory run lock: flock on DIR/.lock, the holder's
 * identity inside as one JSON line. Deciding what a refused run does is the
 * caller's. */
#include "common/formats/runlock.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#include "common/fsutil.h"
#include "common/log.h"
#include "common/formats/rundir.h"

/* The holder as text, from the lock file's JSON line. */
static void describe(int fd, char *out, size_t n)
{
    char buf[512] = "";
    ssize_t k = pread(fd, buf, sizeof buf - 1, 0);
    buf[k > 0 ? k : 0] = '\0';
    json_t *j = json_loads(buf, JSON_DISABLE_EOF_CHECK, NULL);
    const char *host = "?", *since = "?";
    json_int_t pid = 0;
    if (j && !json_unpack(j, "{s:s,s:I,s:s}", "host", &host, "pid", &pid, "since", &since))
        snprintf(out, n, "pid %lld on host %s since %s", (long long)pid, host, since);
    else
        snprintf(out, n, "another process (its lock file names no holder yet)");
    json_decref(j);
}

static int open_lock(const char *dir, char *path, size_t n, struct plait_error *err)
{
    if (fs_join(path, n, dir, RUNDIR_LOCK, err)) return -1;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) return error_errno(err, "opening %s", path);
    return fd;
}

int runlock_acquire(struct runlock *l, const char *dir, const char *what, struct plait_error *err)
{
    char path[4096];
    l->fd = open_lock(dir, path, sizeof path, err);
    if (l->fd < 0) return -1;
    int rc;
    while ((rc = flock(l->fd, LOCK_EX | LOCK_NB)) != 0 && errno == EINTR) {
    }
    if (rc != 0 && errno == EWOULDBLOCK) {
        char holder[600];
        describe(l->fd, holder, sizeof holder);
        runlock_release(l);
        return error_set(err,
                         "%s %s is in use by another run (%s): wait for it or stop it, or "
                         "train into another directory (--out)",
                         what, dir, holder);
    }
    if (rc != 0) { /* ENOLCK, EOPNOTSUPP: a file system without locks */
        log_warn("cannot lock %s (%s): nothing stops a second run from using %s %s", path,
                 strerror(errno), what, dir);
        return 0;
    }
    char host[256] = "?", since[32];
    gethostname(host, sizeof host - 1);
    time_t now = time(NULL);
    strftime(since, sizeof since, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    json_t *j =
        json_pack("{s:s,s:I,s:s}", "host", host, "pid", (json_int_t)getpid(), "since", since);
    char *line = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (line && ftruncate(l->fd, 0) == 0) {
        size_t len = strlen(line);
        if (pwrite(l->fd, line, len, 0) != (ssize_t)len)
            log_warn("cannot write the holder into %s: %s", path, strerror(errno));
    }
    free(line);
    return 0;
}

void runlock_release(struct runlock *l)
{
    if (l->fd < 0) return;
    close(l->fd); /* releases the flock */
    l->fd = -1;
}

int runlock_holder(const char *dir, char *holder, size_t holder_bytes, struct plait_error *err)
{
    char path[4096];
    if (fs_join(path, sizeof path, dir, RUNDIR_LOCK, err)) return -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0 && errno == ENOENT) return 0;
    if (fd < 0) return error_errno(err, "opening %s", path);
    int held = 0;
    if (flock(fd, LOCK_SH | LOCK_NB) != 0) {
        if (errno != EWOULDBLOCK) {
            close(fd);
            return error_errno(err, "testing the lock %s", path);
        }
        describe(fd, holder, holder_bytes);
        held = 1;
    }
    close(fd);
    return held;
}
