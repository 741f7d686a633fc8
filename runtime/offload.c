/* offload.c — the moments' files, their windows and the I/O thread that
 * reads ahead and writes behind (offload.h). Requests run in the order
 * posted, one at a time: a window's buffer is read again only after the
 * write of what it held. */
#include "runtime/offload.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fsutil.h"
#include "common/log.h"

enum { QUEUE = 16 }; /* requests in flight at most: 2 moments × (2 reads + 2 writes) */

struct io_req {
    bool write;
    int k; /* moment */
    float *buf;
    size_t at, n;
};

struct offload_io {
    struct offload *o;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct io_req q[QUEUE];
    long posted, done; /* requests posted and completed, in order */
    bool stop;
    int failed; /* the first failure (why) */
    char why[5120];
};

static const char *const names[2] = {"adam_m.bin", "adam_v.bin"};

#define DIRECT_ALIGN 4096 /* O_DIRECT's buffer, offset and length alignment (a page) */

/* Bytes [done, bytes) of buf at file offset off (+done) of moment k through
 * fd, or errno's reason in why. */
static int transfer_fd(const struct offload *o, int fd, bool write, int k, char *p, size_t done,
                       size_t bytes, off_t off, char *why, size_t why_n)
{
    while (done < bytes) {
        ssize_t r = write ? pwrite(fd, p + done, bytes - done, off + (off_t)done)
                          : pread(fd, p + done, bytes - done, off + (off_t)done);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            snprintf(why, why_n, "%s/%s: %s of %zu bytes at byte %lld: %s", o->dir, names[k],
                     write ? "writing" : "reading", bytes, (long long)(off + (off_t)done),
                     r < 0 ? strerror(errno) : "the file ends early");
            return -1;
        }
        done += (size_t)r;
    }
    return 0;
}

/* Every byte of [at, at + n) floats of moment k: with direct (the I/O
 * thread's windows), its aligned part past the page cache where the file and
 * the buffer take it, the rest through the page cache. */
static int transfer(const struct offload *o, bool write, int k, float *buf, size_t at, size_t n,
                    bool direct, char *why, size_t why_n)
{
    char *p = (char *)buf;
    size_t bytes = n * sizeof(float), aligned = 0;
    off_t off = (off_t)(at * sizeof(float));
    if (direct && o->direct[k] >= 0 && (uintptr_t)p % DIRECT_ALIGN == 0 && off % DIRECT_ALIGN == 0)
        aligned = bytes / DIRECT_ALIGN * DIRECT_ALIGN;
    return (aligned && transfer_fd(o, o->direct[k], write, k, p, 0, aligned, off, why, why_n)) ||
                   transfer_fd(o, o->fd[k], write, k, p, aligned, bytes, off, why, why_n)
               ? -1
               : 0;
}

static void *io_main(void *arg)
{
    struct offload_io *io = arg;
    pthread_mutex_lock(&io->mu);
    for (;;) {
        while (!io->stop && io->done == io->posted) pthread_cond_wait(&io->cv, &io->mu);
        if (io->done == io->posted) break; /* stopping, nothing left */
        struct io_req r = io->q[io->done % QUEUE];
        bool skip = io->failed;
        pthread_mutex_unlock(&io->mu);
        char why[5120];
        int rc = skip ? 0 : transfer(io->o, r.write, r.k, r.buf, r.at, r.n, true, why, sizeof why);
        pthread_mutex_lock(&io->mu);
        if (rc && !io->failed) {
            io->failed = 1;
            snprintf(io->why, sizeof io->why, "%s", why);
        }
        io->done++;
        pthread_cond_broadcast(&io->cv);
    }
    pthread_mutex_unlock(&io->mu);
    return NULL;
}

/* Queues a request; its number (wait for it with wait_done). */
static long post(struct offload_io *io, bool write, int k, float *buf, size_t at, size_t n)
{
    pthread_mutex_lock(&io->mu);
    while (io->posted - io->done >= QUEUE) pthread_cond_wait(&io->cv, &io->mu);
    io->q[io->posted % QUEUE] = (struct io_req){write, k, buf, at, n};
    long seq = ++io->posted;
    pthread_cond_broadcast(&io->cv);
    pthread_mutex_unlock(&io->mu);
    return seq;
}

/* Waits until request `seq` (and every one before it) is done; -1 with err
 * when any failed. */
static int wait_done(struct offload_io *io, long seq, struct plait_error *err)
{
    pthread_mutex_lock(&io->mu);
    while (io->done < seq) pthread_cond_wait(&io->cv, &io->mu);
    int failed = io->failed;
    if (failed) error_set(err, "parallel.offload: %s", io->why);
    pthread_mutex_unlock(&io->mu);
    return failed ? -1 : 0;
}

/* Both moments of window i into (or out of) buffer b; the later request's number. */
static long post_window(struct offload *o, bool write, int b, size_t i)
{
    size_t at = i * o->window, n = o->n - at < o->window ? o->n - at : o->window;
    post(o->io, write, 0, o->buf[b][0], at, n);
    return post(o->io, write, 1, o->buf[b][1], at, n);
}

int offload_each_window(struct offload *o,
                        int (*fn)(void *ctx, size_t lo, size_t n, float *m, float *v,
                                  struct plait_error *err),
                        void *ctx, struct plait_error *err)
{
    size_t windows = (o->n + o->window - 1) / o->window;
    if (o->in_memory) { /* in memory: each window in place */
        for (size_t lo = 0; lo < o->n; lo += o->window) {
            size_t n = o->n - lo < o->window ? o->n - lo : o->window;
            if (fn(ctx, lo, n, o->mem[0] + lo, o->mem[1] + lo, err)) return -1;
        }
        return 0;
    }
    long read[2] = {0, 0};
    for (size_t i = 0; i < windows && i < 2; i++) read[i] = post_window(o, false, (int)i, i);
    int rc = 0;
    for (size_t i = 0; i < windows; i++) {
        int b = (int)(i % 2);
        size_t lo = i * o->window, n = o->n - lo < o->window ? o->n - lo : o->window;
        if (wait_done(o->io, read[b], err) || fn(ctx, lo, n, o->buf[b][0], o->buf[b][1], err)) {
            rc = -1;
            break;
        }
        post_window(o, true, b, i);
        if (i + 2 < windows) read[b] = post_window(o, false, b, i + 2); /* after that write */
    }
    /* every request done before the buffers are touched again (after a failure too) */
    struct plait_error later;
    if (wait_done(o->io, o->io->posted, rc ? &later : err)) rc = -1;
    return rc;
}

int offload_read(const struct offload *o, int k, size_t at, float *host, size_t n,
                 struct plait_error *err)
{
    char why[5120];
    if (o->in_memory) {
        memcpy(host, o->mem[k] + at, n * sizeof(float));
        return 0;
    }
    if (transfer(o, false, k, host, at, n, false, why, sizeof why))
        return error_set(err, "parallel.offload: %s", why);
    return 0;
}

int offload_write(const struct offload *o, int k, size_t at, const float *host, size_t n,
                  struct plait_error *err)
{
    char why[5120];
    if (o->in_memory) {
        memcpy(o->mem[k] + at, host, n * sizeof(float));
        return 0;
    }
    if (transfer(o, true, k, (float *)host, at, n, false, why, sizeof why))
        return error_set(err, "parallel.offload: %s", why);
    return 0;
}

/* dir and dir/rank-N, made where missing. */
static int make_dirs(struct offload *o, const char *dir, int rank, struct plait_error *err)
{
    if (mkdir(dir, 0700) != 0 && errno != EEXIST)
        return error_errno(err, "parallel.offload_dir %s (rank %d)", dir, rank);
    if (snprintf(o->dir, sizeof o->dir, "%s/rank-%d", dir, rank) >= (int)sizeof o->dir)
        return error_set(err, "parallel.offload_dir %s: too long a path", dir);
    if (mkdir(o->dir, 0700) != 0 && errno != EEXIST)
        return error_errno(err, "parallel.offload_dir: %s (rank %d)", o->dir, rank);
    return 0;
}

int offload_open(struct offload *o, const char *dir, int rank, size_t n, size_t window,
                 struct plait_error *err)
{
    float *buf[2][2];
    memcpy(buf, o->buf, sizeof buf); /* the caller's windows (counted with the model) */
    offload_init(o);
    memcpy(o->buf, buf, sizeof buf);
    o->n = n;
    o->window = window ? window : 1;
    if (make_dirs(o, dir, rank, err)) return -1;
    for (int k = 0; k < 2; k++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", o->dir, names[k]);
        o->fd[k] = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        /* the disk space taken now: a full disk fails here, not mid-step */
        int rc = o->fd[k] < 0 ? errno : posix_fallocate(o->fd[k], 0, (off_t)(n * sizeof(float)));
        if (rc == EOPNOTSUPP || rc == EINVAL) /* a file system without it: zeros, unreserved */
            rc = ftruncate(o->fd[k], (off_t)(n * sizeof(float))) != 0 ? errno : 0;
        if (rc) {
            offload_close(o);
            errno = rc;
            return error_errno(err, "parallel.offload: %s (rank %d), %zu bytes", path, rank,
                               n * sizeof(float));
        }
        o->direct[k] = open(path, O_RDWR | O_DIRECT | O_CLOEXEC); /* -1: through the cache */
    }
    if (rank == 0)
        log_info("parallel.offload \"nvme\": the moments' windows %s", o->direct[0] >= 0
                     ? "move past the page cache (O_DIRECT)"
                     : "move through the page cache (the file system refuses O_DIRECT)");
    struct offload_io *io = calloc(1, sizeof *io);
    if (!io) {
        offload_close(o);
        return error_set(err, "out of memory");
    }
    io->o = o;
    pthread_mutex_init(&io->mu, NULL);
    pthread_cond_init(&io->cv, NULL);
    if (pthread_create(&io->thread, NULL, io_main, io) != 0) {
        pthread_mutex_destroy(&io->mu);
        pthread_cond_destroy(&io->cv);
        free(io);
        offload_close(o);
        return error_set(err, "parallel.offload: starting its I/O thread failed");
    }
    o->io = io;
    return 0;
}

void offload_init(struct offload *o)
{
    memset(o, 0, sizeof *o);
    o->fd[0] = o->fd[1] = o->direct[0] = o->direct[1] = -1;
    o->window = 1;
}

void offload_open_memory(struct offload *o, size_t n, size_t window, float *m, float *v)
{
    offload_init(o);
    o->n = n;
    o->window = window ? window : 1;
    o->in_memory = true;
    o->mem[0] = m;
    o->mem[1] = v;
}

void offload_close(struct offload *o)
{
    if (o->io) {
        pthread_mutex_lock(&o->io->mu);
        o->io->stop = true;
        pthread_cond_broadcast(&o->io->cv);
        pthread_mutex_unlock(&o->io->mu);
        pthread_join(o->io->thread, NULL);
        pthread_mutex_destroy(&o->io->mu);
        pthread_cond_destroy(&o->io->cv);
        free(o->io);
        o->io = NULL;
    }
    for (int k = 0; k < 2; k++) { /* scratch: a resume rewrites them from its checkpoint */
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", o->dir, names[k]);
        if (o->fd[k] >= 0) close(o->fd[k]), unlink(path);
        if (o->direct[k] >= 0) close(o->direct[k]);
    }
    o->fd[0] = o->fd[1] = o->direct[0] = o->direct[1] = -1;
    if (o->dir[0]) rmdir(o->dir); /* rank-N, when empty */
}
