/* sock_job.h — what the socket backend's communicators of one process share:
 * their own connections to the job's store (addresses, splits, abort), the
 * node identity, and a watcher thread that turns a store abort into the
 * failure of every communicator at once (sock_job.c). Made by the world
 * communicator, referenced by every communicator split from it. */
#ifndef PLAIT_SOCK_JOB_H
#define PLAIT_SOCK_JOB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "runtime/comm/sock_connect.h"

struct store;
struct sock_job;

/* Called by the watcher (job lock held) when the job is aborted. */
typedef void (*sock_job_abort_fn)(void *ctx, const char *reason);

/* Opens two connections to store's server as global_rank, proving secret,
 * and starts the watcher. node_id: NULL detects it. */
int sock_job_create(struct sock_job **out, struct store *store, int global_rank, const char *secret,
                    const char *node_id, double timeout_s, struct plait_error *err);
void sock_job_ref(struct sock_job *job);
/* Drops a reference; the last stops the watcher and closes the connections. */
void sock_job_unref(struct sock_job *job);

int sock_job_global_rank(const struct sock_job *job);
const char *sock_job_node_id(const struct sock_job *job);
const char *sock_job_hostname(const struct sock_job *job);
const char *sock_job_secret(const struct sock_job *job);
const char *sock_job_store_host(const struct sock_job *job);

/* The store, one caller at a time. */
int sock_job_set(struct sock_job *job, const char *key, const char *value, struct plait_error *err);
int sock_job_get(struct sock_job *job, const char *key, char **value, double timeout_s,
                 struct plait_error *err);
int sock_job_add(struct sock_job *job, const char *key, int64_t delta, int64_t *result,
                 struct plait_error *err);

/* The ranks of 0..size-1 (but self) that have not set "<key_prefix><rank>",
 * for a message after a wait for `first`'s key timed out: first, then every
 * later rank whose key is still unset (asked once, briefly), as "3, 5, 9"
 * (16 at most, then " ..."). Returns how many are missing. */
int sock_job_missing_ranks(struct sock_job *job, const char *key_prefix, int first, int size,
                           int self, char *out, size_t out_bytes);

/* store_abort(reason), once per job; later calls do nothing. */
void sock_job_abort(struct sock_job *job, const char *reason);

/* Whether the job has been aborted (asking the store, briefly, if the watcher
 * has not said so yet); the reason into out. A peer that dies may be only the
 * second casualty: the abort names the first. */
bool sock_job_aborted(struct sock_job *job, char *out, size_t out_bytes);

/* Whom to tell when the job is aborted (by anyone: this process or another). */
int sock_job_watch(struct sock_job *job, sock_job_abort_fn fn, void *ctx);
void sock_job_unwatch(struct sock_job *job, void *ctx);

#endif
