/* sock_job.c — the per-process context of the socket backend (sock_job.h):
 * store connections of its own, node identity, and the abort watcher. The
 * watcher parks a store wait on a key only it uses: the store answers it
 * ABORTED as soon as anyone aborts the job, or OK when this process sets the
 * key to stop the watcher. */
#include "runtime/comm/sock_job.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "common/store/store.h"

#define WATCH_S 5.0 /* one parked wait; the watcher loops */

struct watcher {
    sock_job_abort_fn fn;
    void *ctx;
};

struct sock_job {
    pthread_mutex_t mu; /* everything below that is not set once at creation */
    int refs;
    struct store *store;       /* addresses, splits, abort */
    struct store *watch_store; /* the watcher thread's own connection */
    pthread_t thread;
    bool thread_started;
    char watch_key[96];
    char secret[STORE_MAX_SECRET_BYTES + 1];
    char store_host[256];
    int global_rank;
    char node_id[SOCK_NODE_ID_BYTES];
    char hostname[64];
    bool abort_sent;
    bool aborted;
    char abort_reason[700];
    struct watcher *watchers;
    int n_watchers, cap_watchers;
};

/* boot id + network namespace: ranks that share both can share memory and
 * reach each other's abstract Unix sockets. */
static void detect_node_id(char *out, size_t n, const char *hostname)
{
    char boot[64] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot, sizeof boot, f)) boot[0] = '\0';
        fclose(f);
    }
    boot[strcspn(boot, "\n")] = '\0';
    struct stat st;
    unsigned long long netns =
        stat("/proc/self/ns/net", &st) == 0 ? (unsigned long long)st.st_ino : 0;
    if (boot[0])
        snprintf(out, n, "%s-%llu", boot, netns);
    else
        snprintf(out, n, "host-%s-%llu", hostname, netns);
}

static void notify_locked(struct sock_job *job, const char *reason)
{
    if (job->aborted) return;
    job->aborted = true;
    snprintf(job->abort_reason, sizeof job->abort_reason, "%s", reason);
    for (int i = 0; i < job->n_watchers; i++) job->watchers[i].fn(job->watchers[i].ctx, reason);
}

static void *watch_main(void *arg)
{
    struct sock_job *job = arg;
    const char *key = job->watch_key;
    for (;;) {
        struct plait_error err;
        int64_t t0 = sock_now_ms();
        if (store_wait(job->watch_store, &key, 1, WATCH_S, &err) == 0) return NULL; /* stop */
        void *value = NULL;
        size_t bytes = 0;
        struct plait_error err2;
        if (store_get(job->watch_store, STORE_ABORT_KEY, &value, &bytes, 0.001, &err2) == 0 &&
            bytes > 0) { /* (empty: cleared, store_abort_clear) */
            pthread_mutex_lock(&job->mu);
            notify_locked(job, value);
            pthread_mutex_unlock(&job->mu);
            free(value);
            return NULL;
        }
        free(value);
        if (sock_now_ms() - t0 < (int64_t)(WATCH_S * 500)) { /* not a timeout: the store is gone */
            log_warn("comm: rank %d stops watching for a job abort: %s", job->global_rank,
                     err.text);
            return NULL;
        }
    }
}

int sock_job_create(struct sock_job **out, struct store *store, int global_rank, const char *secret,
                    const char *node_id, double timeout_s, struct plait_error *err)
{
    *out = NULL;
    if (strlen(secret) > STORE_MAX_SECRET_BYTES)
        return error_set(err, "the secret is over %d bytes", STORE_MAX_SECRET_BYTES);
    if (node_id &&
        (!*node_id || strlen(node_id) >= SOCK_NODE_ID_BYTES || strpbrk(node_id, " \t\n")))
        return error_set(err, "node_id \"%.40s\" is empty, too long or has blanks", node_id);
    struct sock_job *job = calloc(1, sizeof *job);
    if (!job) return error_errno(err, "allocating");
    pthread_mutex_init(&job->mu, NULL);
    job->refs = 1;
    job->global_rank = global_rank;
    snprintf(job->secret, sizeof job->secret, "%s", secret);
    if (gethostname(job->hostname, sizeof job->hostname) != 0)
        snprintf(job->hostname, sizeof job->hostname, "unknown");
    job->hostname[sizeof job->hostname - 1] = '\0';
    job->hostname[strcspn(job->hostname, " \t\n")] = '\0';
    if (node_id)
        snprintf(job->node_id, sizeof job->node_id, "%s", node_id);
    else
        detect_node_id(job->node_id, sizeof job->node_id, job->hostname);
    int port;
    uint8_t rnd[8];
    if (store_addr_parse(store_address(store), job->store_host, sizeof job->store_host, &port, err))
        goto fail;
    if (store_connect(&job->store, job->store_host, port, secret, global_rank, timeout_s, err) ||
        store_connect(&job->watch_store, job->store_host, port, secret, global_rank, timeout_s,
                      err))
        goto fail;
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) {
        error_errno(err, "getrandom");
        goto fail;
    }
    int n = snprintf(job->watch_key, sizeof job->watch_key, "comm/watch/%d/", global_rank);
    for (size_t i = 0; i < sizeof rnd; i++) sprintf(job->watch_key + n + 2 * i, "%02x", rnd[i]);
    int rc = pthread_create(&job->thread, NULL, watch_main, job);
    if (rc) {
        errno = rc;
        error_errno(err, "starting the abort watcher");
        goto fail;
    }
    job->thread_started = true;
    *out = job;
    return 0;
fail:
    store_close(job->store);
    store_close(job->watch_store);
    pthread_mutex_destroy(&job->mu);
    free(job);
    return -1;
}

void sock_job_ref(struct sock_job *job)
{
    pthread_mutex_lock(&job->mu);
    job->refs++;
    pthread_mutex_unlock(&job->mu);
}

void sock_job_unref(struct sock_job *job)
{
    if (!job) return;
    pthread_mutex_lock(&job->mu);
    int left = --job->refs;
    if (left == 0 && job->thread_started) {
        struct plait_error err;
        if (store_set(job->store, job->watch_key, "stop", 4, &err) != 0 && !job->aborted)
            log_warn("comm: stopping the abort watcher: %s (it ends within %.0f s)", err.text,
                     WATCH_S);
    }
    pthread_mutex_unlock(&job->mu);
    if (left > 0) return;
    if (job->thread_started) pthread_join(job->thread, NULL);
    store_close(job->store);
    store_close(job->watch_store);
    pthread_mutex_destroy(&job->mu);
    free(job->watchers);
    free(job);
}

int sock_job_global_rank(const struct sock_job *job)
{
    return job->global_rank;
}

const char *sock_job_node_id(const struct sock_job *job)
{
    return job->node_id;
}

const char *sock_job_hostname(const struct sock_job *job)
{
    return job->hostname;
}

const char *sock_job_secret(const struct sock_job *job)
{
    return job->secret;
}

const char *sock_job_store_host(const struct sock_job *job)
{
    return job->store_host;
}

int sock_job_set(struct sock_job *job, const char *key, const char *value, struct plait_error *err)
{
    pthread_mutex_lock(&job->mu);
    int rc = store_set(job->store, key, value, strlen(value), err);
    pthread_mutex_unlock(&job->mu);
    return rc;
}

int sock_job_get(struct sock_job *job, const char *key, char **value, double timeout_s,
                 struct plait_error *err)
{
    void *v = NULL;
    size_t bytes;
    pthread_mutex_lock(&job->mu);
    int rc = store_get(job->store, key, &v, &bytes, timeout_s, err);
    pthread_mutex_unlock(&job->mu);
    *value = v;
    return rc;
}

int sock_job_add(struct sock_job *job, const char *key, int64_t delta, int64_t *result,
                 struct plait_error *err)
{
    pthread_mutex_lock(&job->mu);
    int rc = store_add(job->store, key, delta, result, err);
    pthread_mutex_unlock(&job->mu);
    return rc;
}

int sock_job_missing_ranks(struct sock_job *job, const char *key_prefix, int first, int size,
                           int self, char *out, size_t out_bytes)
{
    size_t used = 0;
    int missing = 0;
    out[0] = '\0';
    for (int m = first; m < size; m++) {
        struct plait_error err;
        char key[STORE_MAX_KEY_BYTES + 1], *v = NULL;
        snprintf(key, sizeof key, "%s%d", key_prefix, m);
        if (m == self || (m > first && sock_job_get(job, key, &v, 0.001, &err) == 0)) {
            free(v);
            continue;
        }
        if (++missing <= 16 && used < out_bytes) {
            int k = snprintf(out + used, out_bytes - used, "%s%d", used ? ", " : "", m);
            if (k > 0) used += (size_t)k;
        }
    }
    if (missing > 16 && used < out_bytes) snprintf(out + used, out_bytes - used, " ...");
    return missing;
}

void sock_job_abort(struct sock_job *job, const char *reason)
{
    pthread_mutex_lock(&job->mu);
    if (!job->abort_sent && !job->aborted) {
        job->abort_sent = true;
        struct plait_error err;
        if (store_abort(job->store, reason, &err) != 0)
            log_warn("comm: rank %d could not abort the job through the store: %s",
                     job->global_rank, err.text);
    }
    pthread_mutex_unlock(&job->mu);
}

bool sock_job_aborted(struct sock_job *job, char *out, size_t out_bytes)
{
    pthread_mutex_lock(&job->mu);
    bool aborted = job->aborted;
    if (aborted) {
        snprintf(out, out_bytes, "%s", job->abort_reason);
    } else {
        void *value = NULL;
        size_t bytes;
        struct plait_error err;
        if (store_get(job->store, STORE_ABORT_KEY, &value, &bytes, 0.001, &err) == 0 && bytes > 0) {
            aborted = true;
            snprintf(out, out_bytes, "%s", (char *)value);
        }
        free(value);
    }
    pthread_mutex_unlock(&job->mu);
    return aborted;
}

int sock_job_watch(struct sock_job *job, sock_job_abort_fn fn, void *ctx)
{
    pthread_mutex_lock(&job->mu);
    if (job->n_watchers == job->cap_watchers) {
        int cap = job->cap_watchers ? 2 * job->cap_watchers : 8;
        struct watcher *w = realloc(job->watchers, sizeof *w * (size_t)cap);
        if (!w) {
            pthread_mutex_unlock(&job->mu);
            return -1;
        }
        job->watchers = w;
        job->cap_watchers = cap;
    }
    job->watchers[job->n_watchers++] = (struct watcher){fn, ctx};
    if (job->aborted) fn(ctx, job->abort_reason);
    pthread_mutex_unlock(&job->mu);
    return 0;
}

void sock_job_unwatch(struct sock_job *job, void *ctx)
{
    pthread_mutex_lock(&job->mu);
    for (int i = 0; i < job->n_watchers; i++)
        if (job->watchers[i].ctx == ctx) {
            job->watchers[i] = job->watchers[--job->n_watchers];
            break;
        }
    pthread_mutex_unlock(&job->mu);
}
