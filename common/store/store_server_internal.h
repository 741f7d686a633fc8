/* store_server_internal.h — what the store server's files share: its state
 * (struct store_server, a struct conn per client, the key table's entries,
 * the values as shared blobs) and the functions one file calls in another.
 * Included only by common/store/store_server*.c, never by a client of the
 * store; store.h is the server's interface.
 *
 * The server is one thread, one epoll loop over non-blocking sockets
 * (store_server_loop.c), a struct conn per client (store_server_conn.c, its
 * requests read phase by phase in store_server_input.c), keys in a hash table
 * (store_server_table.c). A GET/WAIT on a missing key parks its connection on
 * the key until a write, the abort key or its deadline (a heap of deadlines,
 * store_server_heap.c), so nothing polls. Every byte held is counted
 * (store_server_memory.c); the handshake is checked in store_server_auth.c,
 * the requests answered in store_server_requests.c, and store_server.c starts
 * and stops it all. The bytes on the wire are store_wire.h; the client is
 * store_client.c. */
#ifndef PLAIT_STORE_SERVER_INTERNAL_H
#define PLAIT_STORE_SERVER_INTERNAL_H

#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <time.h>

#include "common/store/store.h"
#include "common/store/store_wire.h"

#define NO_HEAP SIZE_MAX
#define REPLY_TEXT_BYTES 256    /* the longest error text a reply carries */
#define FIRST_BUFFER_BYTES 4096 /* buffers start here and double as bytes arrive */

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

/* Connections turned away before they proved the secret, said on the
 * launcher's console a few a window and the rest counted
 * (store_server_auth.c). */
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

static inline int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- store_server_memory.c: everything the server holds goes through here */

/* Zeroed memory counted against STORE_SERVER_MAX_BYTES; NULL over the limit. */
void *srv_alloc_counted(struct store_server *srv, size_t bytes);
void srv_free_counted(struct store_server *srv, void *p, size_t bytes);
/* A value of refs 1, empty, room for cap_bytes; NULL over the limit. */
struct blob *srv_blob_new(struct store_server *srv, size_t cap_bytes);
void srv_blob_release(struct store_server *srv, struct blob *b);
/* Grows an unshared blob to cap_bytes; NULL (b unchanged) over the limit. */
struct blob *srv_blob_grow(struct store_server *srv, struct blob *b, size_t cap_bytes);
/* The next capacity on the way to want_bytes: double, at least FIRST_BUFFER_BYTES. */
size_t srv_next_cap(size_t cap_bytes, size_t want_bytes);

/* ---- store_server_table.c: the key table */

/* The entry for key; created (without a value) when create; NULL when absent
 * or when creating it would pass the memory limit. */
struct entry *srv_entry_lookup(struct store_server *srv, const char *key, size_t key_bytes,
                               bool create);
/* Drops an entry nobody needs any more (no value, no waiters). */
void srv_entry_forget_if_unused(struct store_server *srv, struct entry *e);
/* The abort key's value; NULL when it was never written or was cleared. */
struct blob *srv_abort_reason(struct store_server *srv);

/* ---- store_server_heap.c: the deadline heap */

bool srv_heap_push(struct store_server *srv, struct conn *c, int64_t deadline_ms);
void srv_heap_remove(struct store_server *srv, struct conn *c); /* a no-op when not in it */

/* ---- store_server_conn.c: a connection's life */

/* Takes an accepted socket: a struct conn, the hello sent, a handshake deadline. */
void srv_conn_open(struct store_server *srv, int fd, const struct sockaddr_storage *sa,
                   socklen_t len);
/* Parks c on e until a write, an abort or wait_ms; false when out of memory. */
bool srv_park(struct store_server *srv, struct conn *c, struct entry *e, int64_t wait_ms);
void srv_unpark(struct store_server *srv, struct conn *c);
/* Closes c now; its memory goes at the end of the loop iteration (srv_bury). */
void srv_conn_kill(struct store_server *srv, struct conn *c);
void srv_bury(struct store_server *srv);
/* Whether c takes another request now (alive, not parked, its reply out). */
bool srv_can_read(const struct conn *c);
void srv_update_events(struct store_server *srv, struct conn *c);
/* Sends what it can of c's output; the rest waits for EPOLLOUT. */
void srv_conn_flush(struct store_server *srv, struct conn *c);
/* Queues a reply: a status, a result, and either a short text or a shared value. */
void srv_reply(struct store_server *srv, struct conn *c, uint8_t status, int64_t result,
               const char *text, struct blob *value);
/* A reply after which the stream cannot be trusted: the connection closes. */
void srv_reply_and_close(struct store_server *srv, struct conn *c, uint8_t status,
                         const char *text);

/* ---- store_server_input.c: a request's bytes read phase by phase */

/* Ready for the next request: small buffers kept, the value dropped. */
void srv_input_reset(struct store_server *srv, struct conn *c);
/* Reads what has arrived on c, request by request. */
void srv_conn_read(struct store_server *srv, struct conn *c);

/* ---- store_server_requests.c: the requests answered */

/* The request header is in: bounds are checked before anything is allocated. */
const char *srv_request_problem(const struct store_wire_request *r, uint8_t *status);
/* A whole request has arrived: check its keys, answer it (or park it). */
void srv_dispatch(struct store_server *srv, struct conn *c);

/* ---- store_server_auth.c: the handshake, and those turned away */

/* The handshake is in: c proves the secret (and goes on) or is refused. */
void srv_auth_check(struct store_server *srv, struct conn *c);
/* Whether a connection turned away from peer is said now (else counted) */
bool srv_turned_away_say(struct store_server *srv, const char *peer);
/* The summary of a window's unsaid refusals, and a new window */
void srv_turned_away_summary(struct turned_away *t);

/* ---- store_server_loop.c: the server's thread */

/* The thread: epoll until store_server_stop wakes it; every connection closed. */
void *srv_main(void *arg);
/* Copies the counts store_server_stats returns. */
void srv_publish_stats(struct store_server *srv);

#endif
