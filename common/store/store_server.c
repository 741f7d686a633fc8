/* store_server.c — the rendezvous store's server: one thread, one epoll loop
 * over non-blocking sockets, a struct conn per client, keys in a hash table.
 * A GET/WAIT on a missing key parks its connection on the key until a write,
 * the abort key or its deadline (a heap of deadlines), so nothing polls.
 * The bytes on the wire are store_wire.h; the client is store_client.c. */
#include "common/store/store.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/store/store_wire.h"

#define NO_HEAP SIZE_MAX
#define REPLY_TEXT_BYTES 256    /* the longest error text a reply carries */
#define FIRST_BUFFER_BYTES 4096 /* buffers start here and double as bytes arrive */
#define READS_PER_EVENT 64      /* then other connections get a turn */
#define ACCEPT_PAUSE_MS 100     /* after EMFILE and friends */

/* A value, shared by the table and the replies still being sent. */
struct blob {
    size_t refs;
    size_t bytes, cap_bytes;
    uint8_t data[];
};

struct conn;

struct entry {
    struct entry *next; /* hash chain */
    uint64_t hash;
    struct blob *value;   /* NULL: never written (the entry exists for its waiters) */
    int64_t written_ms;   /* server clock at the last write */
    struct conn *waiters; /* parked connections, linked by wait_next */
    size_t key_bytes;
    char key[]; /* NUL-terminated */
};

enum conn_phase { PHASE_AUTH, PHASE_HEAD, PHASE_KEYS, PHASE_VALUE };

struct conn {
    int fd;
    enum conn_phase phase;
    bool closing; /* close once the reply is out */
    bool dead;    /* closed; freed at the end of this loop iteration */
    int32_t rank; /* claimed at the handshake */
    uint32_t events;
    char peer[INET6_ADDRSTRLEN + 16];
    uint8_t nonce[STORE_WIRE_NONCE_BYTES];
    /* input: the fixed part, then the keys, then the value */
    uint8_t head[STORE_WIRE_AUTH_BYTES];
    size_t head_got;
    struct store_wire_request req;
    uint8_t *keys;
    size_t keys_cap, keys_got;
    struct blob *value;
    /* output: a header (and short text), then maybe a shared value */
    uint8_t out[STORE_WIRE_REPLY_BYTES + REPLY_TEXT_BYTES];
    size_t out_bytes, out_sent;
    struct blob *out_blob;
    size_t out_blob_bytes;
    /* parked on a key, or waiting for its handshake: a deadline in the heap */
    struct entry *waiting_on;
    struct conn *wait_prev, *wait_next;
    uint8_t wait_op;
    int64_t deadline_ms;
    size_t heap_index;
    struct conn *prev, *next; /* all connections (or the graveyard) */
    struct conn *abort_next;
};

/* Connections turned away before they proved the secret (a wrong handshake,
 * none in time, no memory left for them): each said on the launcher's
 * console, up to TURNED_AWAY_SAID a window of TURNED_AWAY_WINDOW_MS, the rest
 * counted and summarised in one line when the next window opens, or when the
 * server stops, so a flood of strangers cannot flood the console. */
#define TURNED_AWAY_SAID 5
#define TURNED_AWAY_WINDOW_MS 10000
struct turned_away {
    int64_t window_ms; /* when the window began */
    int said;          /* lines in it */
    uint64_t unsaid;   /* turned away in it, not said */
    char last_peer[INET6_ADDRSTRLEN + 16];
};

struct store_server {
    pthread_t thread;
    int listen_fd, wake_fd, epoll_fd;
    int port;
    char secret[STORE_MAX_SECRET_BYTES + 1];
    uint64_t hash_seed;
    struct entry **buckets;
    size_t bucket_count, entry_count, keys_with_value;
    struct conn *conns, *graveyard;
    size_t conn_count;
    struct conn **heap;
    size_t heap_len, heap_cap;
    int64_t accept_paused_until_ms; /* 0: accepting */
    size_t bytes_held;
    uint64_t refused, bad_requests, requests;
    struct turned_away turned_away;
    pthread_mutex_t stats_mu;
    struct store_server_stats stats;
};

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- memory: everything the server holds goes through here ---------- */

static bool reserve(struct store_server *srv, size_t bytes)
{
    if (bytes > STORE_SERVER_MAX_BYTES - srv->bytes_held) return false;
    srv->bytes_held += bytes;
    return true;
}

static void *alloc_counted(struct store_server *srv, size_t bytes)
{
    if (!reserve(srv, bytes)) return NULL;
    void *p = calloc(1, bytes);
    if (!p) srv->bytes_held -= bytes;
    return p;
}

static void free_counted(struct store_server *srv, void *p, size_t bytes)
{
    if (!p) return;
    srv->bytes_held -= bytes;
    free(p);
}

static struct blob *blob_new(struct store_server *srv, size_t cap_bytes)
{
    struct blob *b = alloc_counted(srv, sizeof *b + cap_bytes);
    if (b) b->refs = 1, b->cap_bytes = cap_bytes;
    return b;
}

static void blob_release(struct store_server *srv, struct blob *b)
{
    if (b && --b->refs == 0) free_counted(srv, b, sizeof *b + b->cap_bytes);
}

/* Grows an unshared blob to cap_bytes; NULL (b unchanged) over the limit. */
static struct blob *blob_grow(struct store_server *srv, struct blob *b, size_t cap_bytes)
{
    size_t more = cap_bytes - b->cap_bytes;
    if (!reserve(srv, more)) return NULL;
    struct blob *g = realloc(b, sizeof *b + cap_bytes);
    if (!g) {
        srv->bytes_held -= more;
        return NULL;
    }
    g->cap_bytes = cap_bytes;
    return g;
}

/* The next capacity on the way to want_bytes: double, at least FIRST_BUFFER_BYTES. */
static size_t next_cap(size_t cap_bytes, size_t want_bytes)
{
    size_t next = cap_bytes < FIRST_BUFFER_BYTES / 2 ? FIRST_BUFFER_BYTES : 2 * cap_bytes;
    return next < want_bytes ? next : want_bytes;
}

/* ---- the key table --------------------------------------------------- */

static uint64_t key_hash(const struct store_server *srv, const char *key, size_t bytes)
{
    uint64_t h = 0xcbf29ce484222325ull ^ srv->hash_seed; /* FNV-1a, seeded per server */
    for (size_t i = 0; i < bytes; i++) h = (h ^ (uint8_t)key[i]) * 0x100000001b3ull;
    return h;
}

static void table_grow(struct store_server *srv)
{
    size_t count = srv->bucket_count * 2;
    struct entry **buckets = alloc_counted(srv, count * sizeof *buckets);
    if (!buckets) return; /* a longer chain is fine */
    for (size_t i = 0; i < srv->bucket_count; i++)
        for (struct entry *e = srv->buckets[i], *next; e; e = next) {
            next = e->next;
            e->next = buckets[e->hash & (count - 1)];
            buckets[e->hash & (count - 1)] = e;
        }
    free_counted(srv, srv->buckets, srv->bucket_count * sizeof *buckets);
    srv->buckets = buckets;
    srv->bucket_count = count;
}

/* The entry for key; created (without a value) when create; NULL when absent
 * or when creating it would pass the memory limit. */
static struct entry *entry_lookup(struct store_server *srv, const char *key, size_t key_bytes,
                                  bool create)
{
    uint64_t h = key_hash(srv, key, key_bytes);
    for (struct entry *e = srv->buckets[h & (srv->bucket_count - 1)]; e; e = e->next)
        if (e->hash == h && e->key_bytes == key_bytes && !memcmp(e->key, key, key_bytes)) return e;
    if (!create) return NULL;
    struct entry *e = alloc_counted(srv, sizeof *e + key_bytes + 1);
    if (!e) return NULL;
    e->hash = h;
    e->key_bytes = key_bytes;
    memcpy(e->key, key, key_bytes);
    e->next = srv->buckets[h & (srv->bucket_count - 1)];
    srv->buckets[h & (srv->bucket_count - 1)] = e;
    if (++srv->entry_count > srv->bucket_count) table_grow(srv);
    return e;
}

/* Drops an entry nobody needs any more (no value, no waiters). */
static void entry_forget_if_unused(struct store_server *srv, struct entry *e)
{
    if (e->value || e->waiters) return;
    struct entry **p = &srv->buckets[e->hash & (srv->bucket_count - 1)];
    while (*p != e) p = &(*p)->next;
    *p = e->next;
    srv->entry_count--;
    free_counted(srv, e, sizeof *e + e->key_bytes + 1);
}

static struct blob *abort_reason(struct store_server *srv)
{
    struct entry *e = entry_lookup(srv, STORE_ABORT_KEY, strlen(STORE_ABORT_KEY), false);
    return e && e->value && e->value->bytes ? e->value : NULL; /* empty: cleared */
}

/* ---- the deadline heap ----------------------------------------------- */

static void heap_place(struct store_server *srv, size_t i, struct conn *c)
{
    srv->heap[i] = c;
    c->heap_index = i;
}

static void heap_sift_up(struct store_server *srv, size_t i)
{
    struct conn *c = srv->heap[i];
    while (i > 0 && srv->heap[(i - 1) / 2]->deadline_ms > c->deadline_ms) {
        heap_place(srv, i, srv->heap[(i - 1) / 2]);
        i = (i - 1) / 2;
    }
    heap_place(srv, i, c);
}

static void heap_sift_down(struct store_server *srv, size_t i)
{
    struct conn *c = srv->heap[i];
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= srv->heap_len) break;
        if (child + 1 < srv->heap_len &&
            srv->heap[child + 1]->deadline_ms < srv->heap[child]->deadline_ms)
            child++;
        if (srv->heap[child]->deadline_ms >= c->deadline_ms) break;
        heap_place(srv, i, srv->heap[child]);
        i = child;
    }
    heap_place(srv, i, c);
}

static bool heap_push(struct store_server *srv, struct conn *c, int64_t deadline_ms)
{
    if (srv->heap_len == srv->heap_cap) {
        size_t cap = srv->heap_cap ? 2 * srv->heap_cap : 64;
        struct conn **heap = alloc_counted(srv, cap * sizeof *heap);
        if (!heap) return false;
        if (srv->heap_len) memcpy(heap, srv->heap, srv->heap_len * sizeof *heap);
        free_counted(srv, srv->heap, srv->heap_cap * sizeof *heap);
        srv->heap = heap;
        srv->heap_cap = cap;
    }
    c->deadline_ms = deadline_ms;
    heap_place(srv, srv->heap_len++, c);
    heap_sift_up(srv, c->heap_index);
    return true;
}

static void heap_remove(struct store_server *srv, struct conn *c)
{
    size_t i = c->heap_index;
    if (i == NO_HEAP) return;
    c->heap_index = NO_HEAP;
    struct conn *last = srv->heap[--srv->heap_len];
    if (last == c) return;
    heap_place(srv, i, last);
    heap_sift_up(srv, i);
    heap_sift_down(srv, last->heap_index);
}

/* ---- connections ----------------------------------------------------- */

static void unpark(struct store_server *srv, struct conn *c)
{
    struct entry *e = c->waiting_on;
    if (!e) return;
    if (c->wait_prev)
        c->wait_prev->wait_next = c->wait_next;
    else
        e->waiters = c->wait_next;
    if (c->wait_next) c->wait_next->wait_prev = c->wait_prev;
    c->waiting_on = NULL;
    c->wait_prev = c->wait_next = NULL;
    heap_remove(srv, c);
    entry_forget_if_unused(srv, e);
}

static bool park(struct store_server *srv, struct conn *c, struct entry *e, int64_t wait_ms)
{
    if (!heap_push(srv, c, now_ms() + wait_ms)) return false;
    c->waiting_on = e;
    c->wait_op = c->req.op;
    c->wait_prev = NULL;
    c->wait_next = e->waiters;
    if (e->waiters) e->waiters->wait_prev = c;
    e->waiters = c;
    return true;
}

static void input_reset(struct store_server *srv, struct conn *c)
{
    if (c->keys_cap > FIRST_BUFFER_BYTES) { /* keep a small buffer, not a large one */
        free_counted(srv, c->keys, c->keys_cap);
        c->keys = NULL;
        c->keys_cap = 0;
    }
    c->keys_got = 0;
    blob_release(srv, c->value);
    c->value = NULL;
    c->head_got = 0;
    c->phase = PHASE_HEAD;
}

/* Closes c now; its memory goes at the end of the loop iteration, so that
 * pointers to it held by the caller stay valid (c->dead says it is gone). */
static void conn_kill(struct store_server *srv, struct conn *c)
{
    if (c->dead) return;
    c->dead = true;
    unpark(srv, c);
    heap_remove(srv, c);
    if (epoll_ctl(srv->epoll_fd, EPOLL_CTL_DEL, c->fd, NULL) != 0)
        log_warn("store: epoll_ctl(DEL) for %s: %s", c->peer, strerror(errno));
    close(c->fd);
    c->fd = -1;
    blob_release(srv, c->out_blob);
    c->out_blob = NULL;
    input_reset(srv, c);
    free_counted(srv, c->keys, c->keys_cap);
    c->keys = NULL;
    if (c->prev)
        c->prev->next = c->next;
    else
        srv->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    srv->conn_count--;
    c->prev = NULL;
    c->next = srv->graveyard;
    srv->graveyard = c;
}

static void bury(struct store_server *srv)
{
    while (srv->graveyard) {
        struct conn *c = srv->graveyard;
        srv->graveyard = c->next;
        free_counted(srv, c, sizeof *c);
    }
}

static bool out_pending(const struct conn *c)
{
    return c->out_sent < c->out_bytes + c->out_blob_bytes;
}

static bool can_read(const struct conn *c)
{
    return !c->dead && !c->closing && !c->waiting_on && !out_pending(c);
}

static void update_events(struct store_server *srv, struct conn *c)
{
    uint32_t want = EPOLLRDHUP;
    if (out_pending(c))
        want |= EPOLLOUT;
    else if (can_read(c))
        want |= EPOLLIN;
    if (want == c->events) return;
    struct epoll_event ev = {.events = want, .data.ptr = c};
    if (epoll_ctl(srv->epoll_fd, EPOLL_CTL_MOD, c->fd, &ev) != 0) {
        log_warn("store: epoll_ctl(MOD) for %s: %s; closing it", c->peer, strerror(errno));
        conn_kill(srv, c);
        return;
    }
    c->events = want;
}

/* Sends what it can of c's output; the rest waits for EPOLLOUT. */
static void conn_flush(struct store_server *srv, struct conn *c)
{
    while (!c->dead && out_pending(c)) {
        struct iovec iov[2];
        int n = 0;
        if (c->out_sent < c->out_bytes)
            iov[n++] = (struct iovec){c->out + c->out_sent, c->out_bytes - c->out_sent};
        size_t blob_sent = c->out_sent > c->out_bytes ? c->out_sent - c->out_bytes : 0;
        if (blob_sent < c->out_blob_bytes)
            iov[n++] = (struct iovec){c->out_blob->data + blob_sent, c->out_blob_bytes - blob_sent};
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        ssize_t k = sendmsg(c->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        if (k < 0) { /* the peer went away: nothing to tell anyone */
            conn_kill(srv, c);
            return;
        }
        c->out_sent += (size_t)k;
    }
    if (c->dead) return;
    if (!out_pending(c)) {
        blob_release(srv, c->out_blob);
        c->out_blob = NULL;
        c->out_bytes = c->out_sent = c->out_blob_bytes = 0;
        if (c->closing) {
            conn_kill(srv, c);
            return;
        }
    }
    update_events(srv, c);
}

/* Queues a reply: a status, a result, and either a short text or a shared value. */
static void reply(struct store_server *srv, struct conn *c, uint8_t status, int64_t result,
                  const char *text, struct blob *value)
{
    if (c->dead) return;
    size_t text_bytes = text ? strnlen(text, REPLY_TEXT_BYTES) : 0;
    struct store_wire_reply r = {status, text ? text_bytes : value ? value->bytes : 0, result};
    store_wire_encode_reply(c->out, &r);
    if (text_bytes) memcpy(c->out + STORE_WIRE_REPLY_BYTES, text, text_bytes);
    c->out_bytes = STORE_WIRE_REPLY_BYTES + text_bytes;
    c->out_sent = 0;
    if (!text && value) {
        value->refs++;
        c->out_blob = value;
        c->out_blob_bytes = value->bytes;
    }
    conn_flush(srv, c);
}

/* A reply after which the stream cannot be trusted: the connection closes. */
static void reply_and_close(struct store_server *srv, struct conn *c, uint8_t status,
                            const char *text)
{
    srv->bad_requests++;
    log_warn("store: closing the connection of rank %d from %s: %s", (int)c->rank, c->peer, text);
    c->closing = true;
    reply(srv, c, status, 0, text, NULL);
}

/* ---- the requests ---------------------------------------------------- */

/* Every parked request learns the job was aborted (but those waiting on the
 * abort key itself, which its write has already answered). */
static void abort_all(struct store_server *srv, struct blob *reason)
{
    struct conn *list = NULL;
    for (size_t i = 0; i < srv->heap_len; i++)
        if (srv->heap[i]->waiting_on) srv->heap[i]->abort_next = list, list = srv->heap[i];
    for (struct conn *c = list, *next; c; c = next) {
        next = c->abort_next;
        unpark(srv, c);
        reply(srv, c, STORE_STATUS_ABORTED, 0, NULL, reason);
    }
}

/* After a write: answer the key's parked requests (and everyone's, for abort). */
static void entry_written(struct store_server *srv, struct entry *e)
{
    e->written_ms = now_ms();
    while (e->waiters) {
        struct conn *c = e->waiters;
        uint8_t op = c->wait_op;
        unpark(srv, c);
        reply(srv, c, STORE_STATUS_OK, 0, NULL, op == STORE_OP_GET ? e->value : NULL);
    }
    if (e->key_bytes == strlen(STORE_ABORT_KEY) && !memcmp(e->key, STORE_ABORT_KEY, e->key_bytes) &&
        e->value && e->value->bytes)
        abort_all(srv, e->value);
}

static void entry_set_value(struct store_server *srv, struct entry *e, struct blob *value)
{
    if (!e->value) srv->keys_with_value++;
    blob_release(srv, e->value);
    e->value = value;
    entry_written(srv, e);
}

/* The i-th key of the request at *pos in c->keys; false when malformed. */
static bool next_key(const struct conn *c, size_t *pos, const char **key, size_t *key_bytes)
{
    if (c->req.keys_bytes - *pos < 2) return false;
    size_t n = store_wire_get_u16(c->keys + *pos);
    if (n < 1 || n > STORE_MAX_KEY_BYTES || c->req.keys_bytes - *pos - 2 < n) return false;
    *key = (const char *)c->keys + *pos + 2;
    if (memchr(*key, '\0', n)) return false;
    *key_bytes = n;
    *pos += 2 + n;
    return true;
}

/* A decimal int64 with an optional '-', nothing else. */
static bool parse_int64(const struct blob *b, int64_t *out)
{
    char text[24];
    if (b->bytes == 0 || b->bytes >= sizeof text) return false;
    memcpy(text, b->data, b->bytes);
    text[b->bytes] = '\0';
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno || *end || !(text[0] == '-' || (text[0] >= '0' && text[0] <= '9'))) return false;
    *out = v;
    return true;
}

static void op_get(struct store_server *srv, struct conn *c, const char *key, size_t key_bytes)
{
    bool want_value = c->req.op == STORE_OP_GET;
    struct entry *e = entry_lookup(srv, key, key_bytes, false);
    if (e && e->value) {
        reply(srv, c, STORE_STATUS_OK, 0, NULL, want_value ? e->value : NULL);
        return;
    }
    struct blob *reason = abort_reason(srv);
    if (reason) { /* the abort key itself is never missing here */
        reply(srv, c, STORE_STATUS_ABORTED, 0, NULL, reason);
        return;
    }
    if (c->req.arg == 0) {
        reply(srv, c, STORE_STATUS_TIMEOUT, 0, NULL, NULL);
        return;
    }
    e = entry_lookup(srv, key, key_bytes, true);
    if (!e || !park(srv, c, e, c->req.arg)) {
        if (e) entry_forget_if_unused(srv, e);
        reply(srv, c, STORE_STATUS_TOO_LARGE, 0, "the store server is out of memory", NULL);
        return;
    }
    update_events(srv, c); /* stop reading until it is answered */
}

static void op_add(struct store_server *srv, struct conn *c, const char *key, size_t key_bytes)
{
    struct entry *e = entry_lookup(srv, key, key_bytes, true);
    int64_t sum = 0;
    const char *problem = NULL;
    if (!e)
        problem = "the store server is out of memory";
    else if (e->value && !parse_int64(e->value, &sum))
        problem = "the key's value is not a decimal integer";
    else if (__builtin_add_overflow(sum, c->req.arg, &sum))
        problem = "the sum overflows a 64-bit integer";
    uint8_t status = e ? STORE_STATUS_NOT_INTEGER : STORE_STATUS_TOO_LARGE;
    struct blob *b = problem ? NULL : blob_new(srv, 24);
    if (!problem && !b) {
        problem = "the store server is out of memory";
        status = STORE_STATUS_TOO_LARGE;
    }
    if (problem) {
        if (e) entry_forget_if_unused(srv, e);
        reply(srv, c, status, 0, problem, NULL);
        return;
    }
    b->bytes = (size_t)snprintf((char *)b->data, b->cap_bytes, "%lld", (long long)sum);
    entry_set_value(srv, e, b);
    reply(srv, c, STORE_STATUS_OK, sum, NULL, NULL);
}

static void op_append(struct store_server *srv, struct conn *c, const char *key, size_t key_bytes)
{
    struct entry *e = entry_lookup(srv, key, key_bytes, true);
    if (!e) {
        reply(srv, c, STORE_STATUS_TOO_LARGE, 0, "the store server is out of memory", NULL);
        return;
    }
    struct blob *old = e->value, *add = c->value;
    size_t old_bytes = old ? old->bytes : 0;
    if (add->bytes > STORE_MAX_VALUE_BYTES - old_bytes) {
        entry_forget_if_unused(srv, e);
        reply(srv, c, STORE_STATUS_TOO_LARGE, 0, "the value would pass STORE_MAX_VALUE_BYTES",
              NULL);
        return;
    }
    size_t total = old_bytes + add->bytes;
    struct blob *b;
    if (!old) {
        b = add; /* the request's own buffer becomes the value */
        c->value = NULL;
    } else {
        size_t cap = old->cap_bytes >= total ? old->cap_bytes : next_cap(old->cap_bytes, SIZE_MAX);
        if (cap < total) cap = total;
        if (cap > STORE_MAX_VALUE_BYTES) cap = STORE_MAX_VALUE_BYTES;
        if (old->refs == 1) { /* nobody is sending it: grow in place */
            b = cap == old->cap_bytes ? old : blob_grow(srv, old, cap);
        } else if ((b = blob_new(srv, cap))) { /* a reply still sends the old one */
            memcpy(b->data, old->data, old_bytes);
            blob_release(srv, old);
        }
        if (!b) {
            reply(srv, c, STORE_STATUS_TOO_LARGE, 0, "the store server is out of memory", NULL);
            return;
        }
        memcpy(b->data + old_bytes, add->data, add->bytes);
        b->bytes = total;
    }
    if (!old) srv->keys_with_value++;
    e->value = b;
    entry_written(srv, e);
    reply(srv, c, STORE_STATUS_OK, (int64_t)total, NULL, NULL);
}

static void op_ages(struct store_server *srv, struct conn *c)
{
    struct blob *b = blob_new(srv, (size_t)c->req.key_count * 8);
    if (!b) {
        reply(srv, c, STORE_STATUS_TOO_LARGE, 0, "the store server is out of memory", NULL);
        return;
    }
    int64_t now = now_ms();
    size_t pos = 0;
    for (size_t i = 0; i < c->req.key_count; i++) {
        const char *key;
        size_t key_bytes;
        next_key(c, &pos, &key, &key_bytes); /* checked by dispatch */
        struct entry *e = entry_lookup(srv, key, key_bytes, false);
        int64_t age = e && e->value ? now - e->written_ms : -1;
        store_wire_put_u64(b->data + 8 * i, (uint64_t)age);
    }
    b->bytes = b->cap_bytes;
    reply(srv, c, STORE_STATUS_OK, 0, NULL, b);
    blob_release(srv, b);
}

/* A whole request has arrived: check its keys, answer it (or park it). */
static void dispatch(struct store_server *srv, struct conn *c)
{
    size_t pos = 0, key_bytes = 0, other_bytes;
    const char *key = NULL, *other;
    bool well_formed = next_key(c, &pos, &key, &key_bytes);
    for (size_t i = 1; i < c->req.key_count && well_formed; i++)
        well_formed = next_key(c, &pos, &other, &other_bytes);
    if (!well_formed || pos != c->req.keys_bytes) {
        reply_and_close(srv, c, STORE_STATUS_BAD_REQUEST, "a malformed key list");
        return;
    }
    srv->requests++;
    switch (c->req.op) {
    case STORE_OP_SET: {
        struct entry *e = entry_lookup(srv, key, key_bytes, true);
        if (!e) {
            reply(srv, c, STORE_STATUS_TOO_LARGE, 0, "the store server is out of memory", NULL);
            break;
        }
        entry_set_value(srv, e, c->value);
        c->value = NULL;
        reply(srv, c, STORE_STATUS_OK, 0, NULL, NULL);
        break;
    }
    case STORE_OP_GET:
    case STORE_OP_WAIT:
        op_get(srv, c, key, key_bytes);
        break;
    case STORE_OP_ADD:
        op_add(srv, c, key, key_bytes);
        break;
    case STORE_OP_APPEND:
        op_append(srv, c, key, key_bytes);
        break;
    case STORE_OP_AGES:
        op_ages(srv, c);
        break;
    }
}

/* The request header is in: bounds are checked before anything is allocated. */
static const char *request_problem(const struct store_wire_request *r, uint8_t *status)
{
    *status = STORE_STATUS_BAD_REQUEST;
    bool has_value = r->op == STORE_OP_SET || r->op == STORE_OP_APPEND;
    bool waits = r->op == STORE_OP_GET || r->op == STORE_OP_WAIT;
    if (r->op < STORE_OP_SET || r->op > STORE_OP_AGES) return "an unknown op";
    if (r->reserved != 0) return "a reserved byte that is not 0";
    if (r->op == STORE_OP_AGES ? r->key_count < 1 || r->key_count > STORE_MAX_KEYS_PER_REQUEST
                               : r->key_count != 1)
        return "a key count out of bounds";
    if (r->keys_bytes < 3u * r->key_count ||
        r->keys_bytes > (2u + STORE_MAX_KEY_BYTES) * r->key_count)
        return "a key list length out of bounds";
    if (!has_value && r->value_bytes != 0) return "a value where the op takes none";
    if (r->value_bytes > STORE_MAX_VALUE_BYTES) {
        *status = STORE_STATUS_TOO_LARGE;
        return "a value longer than STORE_MAX_VALUE_BYTES";
    }
    if (waits && (r->arg < 0 || r->arg > STORE_WIRE_MAX_WAIT_MS)) return "a wait out of bounds";
    if (!waits && r->op != STORE_OP_ADD && r->arg != 0)
        return "an argument where the op takes none";
    return NULL;
}

/* The summary of a window's unsaid refusals, and a new window */
static void turned_away_summary(struct turned_away *t)
{
    if (t->unsaid)
        log_warn("store: %llu more connection%s turned away without the job's secret in %d s "
                 "(the last from %s)",
                 (unsigned long long)t->unsaid, t->unsaid == 1 ? "" : "s",
                 TURNED_AWAY_WINDOW_MS / 1000, t->last_peer);
    t->said = 0;
    t->unsaid = 0;
}

/* Whether a connection turned away from peer is said now (else counted) */
static bool turned_away_say(struct store_server *srv, const char *peer)
{
    struct turned_away *t = &srv->turned_away;
    int64_t now = now_ms();
    if (now - t->window_ms >= TURNED_AWAY_WINDOW_MS) {
        turned_away_summary(t);
        t->window_ms = now;
    }
    snprintf(t->last_peer, sizeof t->last_peer, "%s", peer);
    if (t->said < TURNED_AWAY_SAID) {
        t->said++;
        if (t->said == TURNED_AWAY_SAID)
            log_warn("store: %d connections turned away in %d s: the next in this %d s are "
                     "counted, not each said",
                     TURNED_AWAY_SAID, TURNED_AWAY_WINDOW_MS / 1000, TURNED_AWAY_WINDOW_MS / 1000);
        return true;
    }
    t->unsaid++;
    return false;
}

static void auth_check(struct store_server *srv, struct conn *c)
{
    uint8_t want[SHA256_DIGEST_BYTES];
    c->rank = (int32_t)store_wire_get_u32(c->head);
    store_wire_auth_mac(srv->secret, c->nonce, c->rank, want);
    heap_remove(srv, c);
    if (!sha256_equal_ct(want, c->head + 4, sizeof want)) {
        srv->refused++;
        if (turned_away_say(srv, c->peer))
            log_warn("store: refused a connection from %s (claiming rank %d): its handshake does "
                     "not prove the job's secret",
                     c->peer, (int)c->rank);
        c->closing = true;
        reply(srv, c, STORE_STATUS_REFUSED, 0, "the handshake does not prove the job's secret",
              NULL);
        return;
    }
    c->head_got = 0;
    c->phase = PHASE_HEAD;
    reply(srv, c, STORE_STATUS_OK, 0, NULL, NULL);
}

/* Where the next bytes go: a pointer and how many are still wanted there. */
static bool input_target(struct store_server *srv, struct conn *c, uint8_t **dst, size_t *want)
{
    switch (c->phase) {
    case PHASE_AUTH:
    case PHASE_HEAD: {
        size_t need = c->phase == PHASE_AUTH ? STORE_WIRE_AUTH_BYTES : STORE_WIRE_REQUEST_BYTES;
        *dst = c->head + c->head_got;
        *want = need - c->head_got;
        return true;
    }
    case PHASE_KEYS:
        if (c->keys_got == c->keys_cap) {
            size_t cap = next_cap(c->keys_cap, c->req.keys_bytes);
            uint8_t *keys = alloc_counted(srv, cap);
            if (!keys) return false;
            if (c->keys_got) memcpy(keys, c->keys, c->keys_got);
            free_counted(srv, c->keys, c->keys_cap);
            c->keys = keys;
            c->keys_cap = cap;
        }
        *dst = c->keys + c->keys_got; /* a kept buffer may be longer than this list */
        *want = (c->keys_cap < c->req.keys_bytes ? c->keys_cap : c->req.keys_bytes) - c->keys_got;
        return true;
    case PHASE_VALUE:
        if (c->value->bytes == c->value->cap_bytes) {
            struct blob *b =
                blob_grow(srv, c->value, next_cap(c->value->cap_bytes, c->req.value_bytes));
            if (!b) return false;
            c->value = b;
        }
        *dst = c->value->data + c->value->bytes;
        *want = c->value->cap_bytes - c->value->bytes;
        return true;
    }
    return false;
}

/* After bytes arrived: move to the next phase, and run what is complete. */
static void input_advance(struct store_server *srv, struct conn *c)
{
    if (c->phase == PHASE_AUTH) {
        if (c->head_got == STORE_WIRE_AUTH_BYTES) auth_check(srv, c);
        return;
    }
    if (c->phase == PHASE_HEAD) {
        if (c->head_got < STORE_WIRE_REQUEST_BYTES) return;
        store_wire_decode_request(c->head, &c->req);
        uint8_t status;
        const char *problem = request_problem(&c->req, &status);
        if (problem) {
            reply_and_close(srv, c, status, problem);
            return;
        }
        c->phase = PHASE_KEYS;
    }
    if (c->phase == PHASE_KEYS) {
        if (c->keys_got < c->req.keys_bytes) return;
        c->value = blob_new(srv, 0);
        if (!c->value) {
            reply_and_close(srv, c, STORE_STATUS_TOO_LARGE, "the store server is out of memory");
            return;
        }
        c->phase = PHASE_VALUE;
    }
    if (c->value->bytes < c->req.value_bytes) return;
    dispatch(srv, c);
    if (!c->dead) input_reset(srv, c);
}

/* Reads what has arrived on c, request by request. */
static void conn_read(struct store_server *srv, struct conn *c)
{
    for (int round = 0; round < READS_PER_EVENT && can_read(c); round++) {
        uint8_t *dst;
        size_t want;
        if (!input_target(srv, c, &dst, &want)) {
            reply_and_close(srv, c, STORE_STATUS_TOO_LARGE, "the store server is out of memory");
            return;
        }
        ssize_t k = recv(c->fd, dst, want, MSG_DONTWAIT);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (k <= 0) { /* closed (or reset) by the peer */
            conn_kill(srv, c);
            return;
        }
        if (c->phase <= PHASE_HEAD)
            c->head_got += (size_t)k;
        else if (c->phase == PHASE_KEYS)
            c->keys_got += (size_t)k;
        else
            c->value->bytes += (size_t)k;
        input_advance(srv, c);
    }
    if (!c->dead) update_events(srv, c);
}

static void peer_name(const struct sockaddr_storage *sa, socklen_t len, char *out, size_t n)
{
    char host[INET6_ADDRSTRLEN], port[8];
    int rc = getnameinfo((const struct sockaddr *)sa, len, host, sizeof host, port, sizeof port,
                         NI_NUMERICHOST | NI_NUMERICSERV);
    if (rc != 0)
        snprintf(out, n, "an unknown address (%s)", gai_strerror(rc));
    else
        snprintf(out, n, strchr(host, ':') ? "[%s]:%s" : "%s:%s", host, port);
}

static void conn_open(struct store_server *srv, int fd, const struct sockaddr_storage *sa,
                      socklen_t len)
{
    char peer[INET6_ADDRSTRLEN + 16];
    peer_name(sa, len, peer, sizeof peer);
    struct conn *c = alloc_counted(srv, sizeof *c);
    if (!c) {
        if (turned_away_say(srv, peer))
            log_warn("store: refused a connection from %s: the server is at its memory limit",
                     peer);
        close(fd);
        return;
    }
    c->fd = fd;
    c->heap_index = NO_HEAP;
    c->rank = -1;
    c->phase = PHASE_AUTH;
    memcpy(c->peer, peer, sizeof peer);
    int one = 1;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0)
        log_warn("store: TCP_NODELAY for %s: %s (replies may be slower)", peer, strerror(errno));
    if (getrandom(c->nonce, sizeof c->nonce, 0) != (ssize_t)sizeof c->nonce) {
        log_warn("store: refused a connection from %s: getrandom: %s", peer, strerror(errno));
        goto fail;
    }
    if (!heap_push(srv, c, now_ms() + STORE_WIRE_AUTH_TIMEOUT_MS)) goto fail;
    struct epoll_event ev = {.events = EPOLLRDHUP, .data.ptr = c};
    if (epoll_ctl(srv->epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        log_warn("store: epoll_ctl(ADD) for %s: %s", peer, strerror(errno));
        heap_remove(srv, c);
        goto fail;
    }
    c->events = EPOLLRDHUP;
    c->next = srv->conns;
    if (srv->conns) srv->conns->prev = c;
    srv->conns = c;
    srv->conn_count++;
    memcpy(c->out, STORE_WIRE_MAGIC, 4); /* hello */
    store_wire_put_u32(c->out + 4, STORE_WIRE_VERSION);
    memcpy(c->out + 8, c->nonce, STORE_WIRE_NONCE_BYTES);
    c->out_bytes = STORE_WIRE_HELLO_BYTES;
    conn_flush(srv, c);
    return;
fail:
    close(fd);
    free_counted(srv, c, sizeof *c);
}

static void set_accepting(struct store_server *srv, bool on)
{
    struct epoll_event ev = {.events = on ? EPOLLIN : 0, .data.ptr = &srv->listen_fd};
    if (epoll_ctl(srv->epoll_fd, EPOLL_CTL_MOD, srv->listen_fd, &ev) != 0)
        log_warn("store: epoll_ctl(MOD) for the listening socket: %s", strerror(errno));
    srv->accept_paused_until_ms = on ? 0 : now_ms() + ACCEPT_PAUSE_MS;
}

static void accept_all(struct store_server *srv)
{
    for (;;) {
        struct sockaddr_storage sa;
        socklen_t len = sizeof sa;
        int fd =
            accept4(srv->listen_fd, (struct sockaddr *)&sa, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            conn_open(srv, fd, &sa, len);
            continue;
        }
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        /* EMFILE, ENFILE, ENOBUFS, ENOMEM: the backlog waits a moment */
        log_warn("store: accept: %s; pausing new connections for %d ms", strerror(errno),
                 ACCEPT_PAUSE_MS);
        set_accepting(srv, false);
        return;
    }
}

/* Deadlines that passed: a handshake that never came, a wait that timed out. */
static void expire(struct store_server *srv)
{
    int64_t now = now_ms();
    while (srv->heap_len && srv->heap[0]->deadline_ms <= now) {
        struct conn *c = srv->heap[0];
        if (c->phase == PHASE_AUTH) {
            if (turned_away_say(srv, c->peer))
                log_warn("store: closed the connection from %s: no handshake within %d s", c->peer,
                         STORE_WIRE_AUTH_TIMEOUT_MS / 1000);
            conn_kill(srv, c);
            continue;
        }
        if (!c->waiting_on) { /* cannot happen: only those two have deadlines */
            heap_remove(srv, c);
            continue;
        }
        unpark(srv, c);
        reply(srv, c, STORE_STATUS_TIMEOUT, 0, NULL, NULL);
    }
    if (srv->accept_paused_until_ms && now >= srv->accept_paused_until_ms) set_accepting(srv, true);
}

static int next_timeout_ms(const struct store_server *srv)
{
    int64_t next = INT64_MAX;
    if (srv->heap_len) next = srv->heap[0]->deadline_ms;
    if (srv->accept_paused_until_ms && srv->accept_paused_until_ms < next)
        next = srv->accept_paused_until_ms;
    if (next == INT64_MAX) return -1;
    int64_t wait = next - now_ms();
    return wait < 0 ? 0 : wait > 60000 ? 60000 : (int)wait;
}

static void conn_event(struct store_server *srv, struct conn *c, uint32_t events)
{
    if (c->dead) return;
    if (events & (EPOLLERR | EPOLLHUP)) {
        conn_kill(srv, c);
        return;
    }
    if (events & EPOLLOUT) conn_flush(srv, c);
    if (!c->dead && (events & EPOLLIN)) conn_read(srv, c);
    /* closed while we are not reading (parked, or a reply not yet taken) */
    if (!c->dead && (events & EPOLLRDHUP) && !can_read(c)) conn_kill(srv, c);
}

static void publish_stats(struct store_server *srv)
{
    size_t parked = 0;
    for (size_t i = 0; i < srv->heap_len; i++) parked += srv->heap[i]->waiting_on != NULL;
    pthread_mutex_lock(&srv->stats_mu);
    srv->stats = (struct store_server_stats){
        .bytes_held = srv->bytes_held,
        .keys = srv->keys_with_value,
        .connections = srv->conn_count,
        .parked = parked,
        .refused = srv->refused,
        .bad_requests = srv->bad_requests,
        .requests = srv->requests,
    };
    pthread_mutex_unlock(&srv->stats_mu);
}

static void *server_main(void *arg)
{
    struct store_server *srv = arg;
    struct epoll_event events[256];
    bool stop = false;
    while (!stop) {
        int n = epoll_wait(srv->epoll_fd, events, 256, next_timeout_ms(srv));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            log_error("store: epoll_wait: %s; the store server stops", strerror(errno));
            break;
        }
        for (int i = 0; i < n; i++) {
            void *p = events[i].data.ptr;
            if (p == &srv->wake_fd)
                stop = true;
            else if (p == &srv->listen_fd)
                accept_all(srv);
            else
                conn_event(srv, p, events[i].events);
        }
        expire(srv);
        bury(srv);
        publish_stats(srv);
    }
    while (srv->conns) conn_kill(srv, srv->conns); /* their clients fail now, not at a deadline */
    bury(srv);
    publish_stats(srv);
    return NULL;
}

/* ---- start and stop -------------------------------------------------- */

/* A listening socket on the first address of bind_address:port that works. */
static int listen_on(const char *bind_address, int port, struct plait_error *err)
{
    char port_text[8];
    snprintf(port_text, sizeof port_text, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *list = NULL;
    const char *node = bind_address ? bind_address : "::";
    int rc = getaddrinfo(node, port_text, &hints, &list);
    if (rc != 0 && !bind_address) return listen_on("0.0.0.0", port, err); /* no IPv6 here */
    if (rc != 0)
        return error_set(err, "store server: cannot resolve the bind address %s: %s", node,
                         gai_strerror(rc));
    char last[200] = "no address";
    int fd = -1;
    for (struct addrinfo *ai = list; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            snprintf(last, sizeof last, "socket: %s", strerror(errno));
            continue;
        }
        int one = 1, zero = 0;
        if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
            (ai->ai_family == AF_INET6 &&
             setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero) != 0) ||
            bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, SOMAXCONN) != 0) {
            snprintf(last, sizeof last, "%s", strerror(errno));
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(list);
    if (fd < 0 && !bind_address) return listen_on("0.0.0.0", port, err); /* no IPv6 here */
    if (fd < 0)
        return error_set(err, "store server: cannot listen on %s port %d: %s", node, port, last);
    return fd;
}

int store_server_start(struct store_server **out, const char *bind_address, int port,
                       const char *secret, struct plait_error *err)
{
    *out = NULL;
    if (!secret || !*secret || strlen(secret) > STORE_MAX_SECRET_BYTES)
        return error_set(err,
                         "store server: the secret must be 1 to %d bytes (anyone could "
                         "join a store without one)",
                         STORE_MAX_SECRET_BYTES);
    if (port < 0 || port > 65535)
        return error_set(err, "store server: port %d is not 0..65535", port);
    struct store_server *srv = calloc(1, sizeof *srv);
    if (!srv) return error_errno(err, "store server: allocating its state");
    srv->listen_fd = srv->wake_fd = srv->epoll_fd = -1;
    bool mutex_ready = false;
    snprintf(srv->secret, sizeof srv->secret, "%s", secret);
    srv->bucket_count = 256;
    srv->buckets = alloc_counted(srv, srv->bucket_count * sizeof *srv->buckets);
    if (!srv->buckets) {
        error_errno(err, "store server: allocating its table");
        goto fail;
    }
    if (getrandom(&srv->hash_seed, sizeof srv->hash_seed, 0) != (ssize_t)sizeof srv->hash_seed) {
        error_errno(err, "store server: getrandom");
        goto fail;
    }
    srv->listen_fd = listen_on(bind_address, port, err);
    if (srv->listen_fd < 0) goto fail;
    struct sockaddr_storage sa;
    socklen_t len = sizeof sa;
    if (getsockname(srv->listen_fd, (struct sockaddr *)&sa, &len) != 0) {
        error_errno(err, "store server: getsockname");
        goto fail;
    }
    srv->port = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port
                                               : ((struct sockaddr_in *)&sa)->sin_port);
    srv->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    srv->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    if (srv->wake_fd < 0 || srv->epoll_fd < 0) {
        error_errno(err, "store server: %s", srv->wake_fd < 0 ? "eventfd" : "epoll_create1");
        goto fail;
    }
    struct epoll_event listen_ev = {.events = EPOLLIN, .data.ptr = &srv->listen_fd};
    struct epoll_event wake_ev = {.events = EPOLLIN, .data.ptr = &srv->wake_fd};
    if (epoll_ctl(srv->epoll_fd, EPOLL_CTL_ADD, srv->listen_fd, &listen_ev) != 0 ||
        epoll_ctl(srv->epoll_fd, EPOLL_CTL_ADD, srv->wake_fd, &wake_ev) != 0) {
        error_errno(err, "store server: epoll_ctl");
        goto fail;
    }
    int rc = pthread_mutex_init(&srv->stats_mu, NULL);
    if (rc != 0) {
        error_set(err, "store server: pthread_mutex_init: %s", strerror(rc));
        goto fail;
    }
    mutex_ready = true;
    publish_stats(srv);
    /* the thread takes no signals: they stay with the launcher's own threads */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    rc = pthread_create(&srv->thread, NULL, server_main, srv);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        error_set(err, "store server: pthread_create: %s", strerror(rc));
        goto fail;
    }
    *out = srv;
    return 0;
fail:
    if (mutex_ready) pthread_mutex_destroy(&srv->stats_mu);
    if (srv->epoll_fd >= 0) close(srv->epoll_fd);
    if (srv->wake_fd >= 0) close(srv->wake_fd);
    if (srv->listen_fd >= 0) close(srv->listen_fd);
    free(srv->buckets);
    free(srv);
    return -1;
}

int store_server_port(const struct store_server *srv)
{
    return srv->port;
}

void store_server_stats(struct store_server *srv, struct store_server_stats *out)
{
    pthread_mutex_lock(&srv->stats_mu);
    *out = srv->stats;
    pthread_mutex_unlock(&srv->stats_mu);
}

void store_server_stop(struct store_server *srv)
{
    if (!srv) return;
    uint64_t one = 1;
    if (write(srv->wake_fd, &one, sizeof one) != (ssize_t)sizeof one)
        log_warn("store: waking the server thread: %s", strerror(errno)); /* cannot happen */
    pthread_join(srv->thread, NULL);
    turned_away_summary(&srv->turned_away);
    for (size_t i = 0; i < srv->bucket_count; i++)
        for (struct entry *e = srv->buckets[i], *next; e; e = next) {
            next = e->next;
            blob_release(srv, e->value);
            free(e);
        }
    free(srv->buckets);
    free(srv->heap);
    pthread_mutex_destroy(&srv->stats_mu);
    close(srv->epoll_fd);
    close(srv->wake_fd);
    close(srv->listen_fd);
    free(srv);
}
