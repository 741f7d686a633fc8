/* store.h — the rendezvous store: a TCP key/value server hosted by rank 0's
 * launcher (store_server.c) and the client every rank uses (store_client.c),
 * for NCCL id exchange, gang barriers, heartbeats and restart coordination.
 * It knows nothing of Slurm or Kubernetes: a launcher starts the server, then
 * tells ranks where it is and the job's secret through the env contract
 * (PLAIT_STORE_ADDR, PLAIT_STORE_SECRET in env.h). The wire format, with every
 * length it accepts, is in store_wire.h.
 *
 * Trust: every connection proves it knows the per-job secret (HMAC-SHA256 over
 * a fresh nonce; the secret itself is never sent) before it can read or write
 * anything. Clients that pass are trusted to follow the protocol, but nothing
 * they send can crash the server or make it hold more than
 * STORE_SERVER_MAX_BYTES.
 *
 * Threads: the server runs in its own thread, so the process hosting it can
 * fork and wait for children. A struct store is one connection and is used by
 * one thread at a time. store_heartbeat_start opens a second connection owned
 * by its own thread, so the owner may keep calling store_* while it beats;
 * start, stop and close are called by the owner.
 *
 * Deadlines: every call is bounded. Calls without a timeout argument use the
 * store's default (the connect timeout); a timeout_s <= 0 also means that
 * default. A timeout error says what was waited for and how long. A server
 * that goes away fails the call in progress at once, naming its address. */
#ifndef PLAIT_STORE_H
#define PLAIT_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

#define STORE_MAX_KEY_BYTES 256                  /* 1..256 bytes, no NUL */
#define STORE_MAX_VALUE_BYTES ((size_t)64 << 20) /* 64 MiB */
#define STORE_MAX_SECRET_BYTES 256
#define STORE_SECRET_HEX_BYTES 65                /* 64 hex digits and a NUL */
#define STORE_MAX_KEYS_PER_REQUEST 4096          /* store_dead_ranks batches by it */
#define STORE_SERVER_MAX_BYTES ((size_t)1 << 30) /* keys, values and buffers, in all */
#define STORE_ABORT_KEY "abort"                  /* see store_abort */
#define STORE_HEARTBEAT_PREFIX "heartbeat/"      /* heartbeat/<rank> */

/* ---- server ---------------------------------------------------------- */

struct store_server;

/* Binds bind_address ("0.0.0.0", "::" for both families, a host name; NULL is
 * "::", or "0.0.0.0" where there is no IPv6) at port (0: a free one), and
 * serves in a new thread. secret: 1..STORE_MAX_SECRET_BYTES bytes. */
int store_server_start(struct store_server **srv, const char *bind_address, int port,
                       const char *secret, struct plait_error *err);

/* The port it listens on (the one picked, for port 0). */
int store_server_port(const struct store_server *srv);

/* What the server holds now (a snapshot taken by its thread after each event). */
struct store_server_stats {
    size_t bytes_held;     /* keys, values, connection buffers (its own accounting) */
    size_t keys;           /* keys that have a value */
    size_t connections;    /* open, authenticated or not */
    size_t parked;         /* requests waiting for a key */
    uint64_t refused;      /* connections refused at the handshake */
    uint64_t bad_requests; /* connections closed for a malformed request */
    uint64_t requests;     /* well-formed requests read */
};
void store_server_stats(struct store_server *srv, struct store_server_stats *out);

/* Stops the thread, closes every connection (their pending calls fail at
 * once) and frees everything. NULL is fine. */
void store_server_stop(struct store_server *srv);

/* ---- client ---------------------------------------------------------- */

struct store;

/* Connects to host:port as `rank` and proves the secret, retrying (the server
 * may not be up yet, its name may not resolve yet) until timeout_s; that
 * timeout is also the store's default for later calls. On failure the error
 * names host:port and the last error seen; a wrong secret fails at once,
 * returning STORE_REFUSED rather than -1. */
#define STORE_REFUSED (-2)
int store_connect(struct store **st, const char *host, int port, const char *secret, int rank,
                  double timeout_s, struct plait_error *err);

/* Stores a copy of value (0..STORE_MAX_VALUE_BYTES bytes) under key. */
int store_set(struct store *st, const char *key, const void *value, size_t bytes,
              struct plait_error *err);

/* Waits until key has a value, then returns it malloc'ed (with a NUL after
 * its bytes, so text can be used as a string; free it). */
int store_get(struct store *st, const char *key, void **value, size_t *bytes, double timeout_s,
              struct plait_error *err);

/* Atomically adds delta to key's value read as a decimal integer (an absent
 * key counts as 0) and returns the sum (result may be NULL). */
int store_add(struct store *st, const char *key, int64_t delta, int64_t *result,
              struct plait_error *err);

/* Atomically appends bytes to key's value; new_bytes gets its length (may be NULL). */
int store_append(struct store *st, const char *key, const void *value, size_t bytes,
                 size_t *new_bytes, struct plait_error *err);

/* Waits until every one of keys[0..n) has a value. */
int store_wait(struct store *st, const char *const *keys, size_t n, double timeout_s,
               struct plait_error *err);

/* Waits until all ranks 0..world-1 arrive at the barrier `name` (this rank
 * must be one of them). A name is used once: put a generation in it
 * ("restart-3/gang"). On timeout the error lists the ranks that did not arrive.
 * Keys used: "barrier/<name>/arrived" (the ranks, i32 each, in order of
 * arrival) and "barrier/<name>/done". */
int store_barrier(struct store *st, const char *name, int world, double timeout_s,
                  struct plait_error *err);

/* Tells every rank the job is over: sets STORE_ABORT_KEY to
 * "rank <r>: <reason>" ("the launcher: <reason>" from a connection made with
 * rank -1, as a launcher that is no rank makes it). Every get, wait and barrier that is waiting
 * (now or later) on a key that is not set fails at once with that text. */
int store_abort(struct store *st, const char *reason, struct plait_error *err);

/* Undoes store_abort for a new start of the gang on the same store (plait
 * launch restarting a Slurm step's ranks): STORE_ABORT_KEY gets an empty
 * value, which means "not aborted" to the server and to every reader. Only
 * once every rank of the aborted start has ended (its keys stay: a new start
 * uses new names, as its restart generation is in them). */
int store_abort_clear(struct store *st, struct plait_error *err);

/* Starts a thread, on its own connection, that sets "heartbeat/<rank>" every
 * interval_ms. Stopped by store_heartbeat_stop or store_close. If the server
 * goes away the thread logs it once and ends. */
int store_heartbeat_start(struct store *st, int interval_ms, struct plait_error *err);
void store_heartbeat_stop(struct store *st);

/* The ranks among 0..world-1 whose heartbeat is older than stale_ms by the
 * server's clock, or that never beat: *n_dead gets how many, ranks_out the
 * first max_ranks of them in rank order. Ask after a barrier that follows
 * every rank's store_heartbeat_start, or the late starters count as dead. */
int store_dead_ranks(struct store *st, int world, int64_t stale_ms, int *ranks_out,
                     size_t max_ranks, size_t *n_dead, struct plait_error *err);

/* "host:port" of the server this store talks to. */
const char *store_address(const struct store *st);

/* Closes the connection (stopping its heartbeat). NULL is fine. */
void store_close(struct store *st);

/* ---- what a launcher hands its ranks --------------------------------- */

/* 32 random bytes (getrandom) as 64 hex digits: a per-job secret. */
int store_secret_generate(char out[STORE_SECRET_HEX_BYTES], struct plait_error *err);

/* NULL when secret could be a per-job secret a launcher made; else why not:
 * shorter than 32 characters, or fewer than 8 distinct ones (all zeros, the
 * examples' placeholder, or a word repeated). For secrets a user hands in
 * (a Kubernetes Secret), never for the ones store_secret_generate makes. */
const char *store_secret_problem(const char *secret);

/* "host:port", with an IPv6 literal in brackets ("[::1]:29500"). */
int store_addr_format(char *out, size_t out_bytes, const char *host, int port,
                      struct plait_error *err);

/* The reverse: host (brackets removed) and port (1..65535). */
int store_addr_parse(const char *text, char *host, size_t host_bytes, int *port,
                     struct plait_error *err);

#endif
