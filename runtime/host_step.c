/* host_step.c — a GPU rank's optimizer step on the CPU (host_step.h): the gradient's final
 * ranges brought down during the last backward (the grads_final hook, or the buckets'
 * landed hook as their sums arrive), then the copy thread moving the rest down chunk by
 * chunk as soon as a step starts (and, at the first step, the master weights), then each
 * window's updated weights up as the step posts them; the step waits only for the chunks
 * its window needs. */
#include "runtime/host_step.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

enum { UPS = 64 }; /* windows posted up and not yet copied, at most */

struct up {
    size_t lo, n;
};

struct host_step_io {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* the step in progress: its device buffers, how far down they are, the ups */
    const float *dev_grad;
    float *dev_master;
    bool stepping, fetch_master, stop;
    size_t early; /* the gradient at or above it came down during the backward */
    size_t limit; /* what the thread brings down: [0, early), or all n with the master */
    size_t down;  /* floats of the slice on the host so far, up to limit */
    struct up q[UPS];
    long posted, done; /* ups, in order */
};

static void *host_alloc(const struct host_step *h, size_t bytes)
{
    return h->dev->host_alloc ? h->dev->host_alloc(h->dev_ctx, bytes) : calloc(1, bytes);
}

static void host_free(const struct host_step *h, void *p)
{
    if (!p) return;
    if (h->dev->host_free)
        h->dev->host_free(h->dev_ctx, p);
    else
        free(p);
}

static void *io_main(void *arg)
{
    struct host_step *h = arg;
    struct host_step_io *io = h->io;
    if (h->dev->bind_thread) h->dev->bind_thread(h->dev_ctx); /* the rank's device, not 0 */
    pthread_mutex_lock(&io->mu);
    for (;;) {
        while (!io->stop && !(io->stepping && io->down < io->limit) && io->done == io->posted)
            pthread_cond_wait(&io->cv, &io->mu);
        if (io->stepping && io->down < io->limit) { /* down first: the step waits on it */
            size_t lo = io->down, n = io->limit - lo < h->chunk ? io->limit - lo : h->chunk;
            size_t grad = lo >= io->early ? 0 : lo + n <= io->early ? n : io->early - lo;
            bool master = io->fetch_master;
            pthread_mutex_unlock(&io->mu);
            h->dev->download(h->dev_ctx, h->grad + lo, io->dev_grad + lo, grad * sizeof(float));
            if (master)
                h->dev->download(h->dev_ctx, h->master + lo, io->dev_master + lo,
                                 n * sizeof(float));
            pthread_mutex_lock(&io->mu);
            io->down = lo + n;
        } else if (io->done < io->posted) {
            struct up u = io->q[io->done % UPS];
            pthread_mutex_unlock(&io->mu);
            h->dev->upload(h->dev_ctx, io->dev_master + u.lo, h->master + u.lo,
                           u.n * sizeof(float));
            pthread_mutex_lock(&io->mu);
            io->done++;
        } else {
            break; /* stopping, nothing left */
        }
        pthread_cond_broadcast(&io->cv);
    }
    pthread_mutex_unlock(&io->mu);
    return NULL;
}

/* n floats of host memory, counted */
static float *host_floats(struct host_step *h, size_t n, bool *ok)
{
    float *p = n ? host_alloc(h, n * sizeof(float)) : NULL;
    if (n && !p) *ok = false;
    h->bytes += n * sizeof(float);
    return p;
}

int host_step_open(struct host_step *h, const struct ops *dev, struct ops_ctx *dev_ctx, size_t n,
                   size_t window, bool in_files, struct plait_error *err)
{
    memset(h, 0, sizeof *h);
    h->dev = dev;
    h->dev_ctx = dev_ctx;
    h->n = n;
    h->chunk = window ? window : 1;
    bool ok = true;
    h->master = host_floats(h, n, &ok);
    h->grad = host_floats(h, n, &ok);
    for (int k = 0; k < 2; k++) {
        if (!in_files) h->moments[k] = host_floats(h, n, &ok);
        for (int b = 0; in_files && b < 2; b++) h->windows[b][k] = host_floats(h, window, &ok);
    }
    if (!ok) {
        unsigned long long bytes = h->bytes;
        host_step_close(h);
        return error_set(err,
                         "parallel.offload: out of host memory for the optimizer's %llu bytes "
                         "(the slice's master weights, its gradient and the AdamW moments%s)",
                         bytes, in_files ? "' windows" : "");
    }
    char why[256] = "";
    if (!(h->cpu_ctx = ops_cpu()->open(0, why, sizeof why))) {
        host_step_close(h);
        return error_set(err, "parallel.offload: the CPU backend for the optimizer step: %s", why);
    }
    if (!(h->io = calloc(1, sizeof *h->io))) {
        host_step_close(h);
        return error_set(err, "out of memory");
    }
    pthread_mutex_init(&h->io->mu, NULL);
    pthread_cond_init(&h->io->cv, NULL);
    if (pthread_create(&h->io->thread, NULL, io_main, h) != 0) {
        pthread_mutex_destroy(&h->io->mu);
        pthread_cond_destroy(&h->io->cv);
        free(h->io);
        h->io = NULL;
        host_step_close(h);
        return error_set(err, "parallel.offload: starting the optimizer's copy thread failed");
    }
    return 0;
}

void host_step_close(struct host_step *h)
{
    if (h->early_src && h->dev->copies_wait) h->dev->copies_wait(h->dev_ctx); /* into grad */
    if (h->io) {
        pthread_mutex_lock(&h->io->mu);
        h->io->stop = true;
        pthread_cond_broadcast(&h->io->cv);
        pthread_mutex_unlock(&h->io->mu);
        pthread_join(h->io->thread, NULL);
        pthread_mutex_destroy(&h->io->mu);
        pthread_cond_destroy(&h->io->cv);
        free(h->io);
        h->io = NULL;
    }
    if (h->cpu_ctx) ops_cpu()->close(h->cpu_ctx);
    h->cpu_ctx = NULL;
    host_free(h, h->master);
    host_free(h, h->grad);
    for (int k = 0; k < 2; k++) {
        host_free(h, h->moments[k]);
        for (int b = 0; b < 2; b++) host_free(h, h->windows[b][k]);
    }
    memset(h->windows, 0, sizeof h->windows);
    h->master = h->grad = h->moments[0] = h->moments[1] = NULL;
}

void host_step_moments(struct host_step *h, struct offload *o)
{
    if (h->moments[0] || !h->n) /* "host" */
        offload_open_memory(o, h->n, h->chunk, h->moments[0], h->moments[1]);
    else
        memcpy(o->buf, h->windows, sizeof o->buf);
}

void host_step_expect(struct host_step *h, const float *dev_grad, size_t top)
{
    if (h->early_src && h->dev->copies_wait) h->dev->copies_wait(h->dev_ctx); /* forgotten */
    h->early_src = dev_grad;
    h->top = top;
    h->early = h->early_backward = h->n;
}

int host_step_landed(void *ctx, size_t from, size_t to, bool after_backward,
                     struct plait_error *err)
{
    struct host_step *h = ctx;
    (void)err;
    if (!h->early_src || to < h->top || from >= h->early) return 0;
    void (*down)(struct ops_ctx *, void *, const void *, size_t) =
        h->dev->download_after ? h->dev->download_after : h->dev->download;
    down(h->dev_ctx, h->grad + from, h->early_src + from, (h->early - from) * sizeof(float));
    h->early = from;
    if (!after_backward) h->early_backward = from;
    return 0;
}

int host_step_grads_final(void *ctx, size_t from, size_t to, struct plait_error *err)
{
    return host_step_landed(ctx, from, to, false, err);
}

struct run_args {
    struct host_step *h;
    int (*fn)(void *ctx, size_t lo, size_t n, float *m, float *v, struct plait_error *err);
    void *ctx;
};

/* offload_each_window's visitor around the caller's: the window's chunks down first, its
 * weights posted up after */
static int step_window(void *ctx, size_t lo, size_t n, float *m, float *v, struct plait_error *err)
{
    struct run_args *a = ctx;
    struct host_step_io *io = a->h->io;
    pthread_mutex_lock(&io->mu);
    while (io->down < (lo + n < io->limit ? lo + n : io->limit))
        pthread_cond_wait(&io->cv, &io->mu);
    pthread_mutex_unlock(&io->mu);
    if (a->fn(a->ctx, lo, n, m, v, err)) return -1;
    pthread_mutex_lock(&io->mu);
    while (io->posted - io->done >= UPS) pthread_cond_wait(&io->cv, &io->mu);
    io->q[io->posted % UPS] = (struct up){lo, n};
    io->posted++;
    pthread_cond_broadcast(&io->cv);
    pthread_mutex_unlock(&io->mu);
    return 0;
}

int host_step_run(struct host_step *h, struct offload *o, const float *dev_grad, float *dev_master,
                  int (*fn)(void *ctx, size_t lo, size_t n, float *m, float *v,
                            struct plait_error *err),
                  void *ctx, struct plait_error *err)
{
    struct host_step_io *io = h->io;
    /* the backward's copies done before the CPU reads them (and before the thread issues
     * to the device: one thread at a time) */
    bool mine = h->early_src == dev_grad;
    size_t early = mine ? h->early : h->n, backward = mine ? h->early_backward : h->n;
    if (h->early_src && h->dev->copies_wait) h->dev->copies_wait(h->dev_ctx);
    h->early_src = NULL;
    h->floats_early += h->n - early;
    h->floats_after += backward - early;
    h->floats_down += h->n;
    pthread_mutex_lock(&io->mu);
    io->dev_grad = dev_grad;
    io->dev_master = dev_master;
    io->fetch_master = !h->master_ready;
    io->down = 0;
    io->early = early;
    io->limit = io->fetch_master ? h->n : early;
    io->stepping = true;
    pthread_cond_broadcast(&io->cv);
    pthread_mutex_unlock(&io->mu);
    struct run_args a = {h, fn, ctx};
    int rc = offload_each_window(o, step_window, &a, err);
    /* every copy done before the host arrays or the device's buffers are touched again
     * (after a failure too) */
    pthread_mutex_lock(&io->mu);
    while (io->down < io->limit || io->done < io->posted) pthread_cond_wait(&io->cv, &io->mu);
    io->stepping = false;
    pthread_mutex_unlock(&io->mu);
    if (rc == 0) h->master_ready = true;
    return rc;
}
