/* store_server_requests.c — the store server's answers to whole requests:
 * the header's bounds, the keys checked, SET/GET/WAIT/ADD/APPEND/AGES, and
 * the parked requests a write (or the abort key) answers. Not the bytes'
 * arrival (store_server_input.c) nor sending the reply (store_server_conn.c). */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/store/store_server_internal.h"

/* Every parked request learns the job was aborted (but those waiting on the
 * abort key itself, which its write has already answered). */
static void abort_all(struct store_server *srv, struct blob *reason)
{
    struct conn *list = NULL;
    for (size_t i = 0; i < srv->heap_len; i++)
        if (srv->heap[i]->waiting_on) srv->heap[i]->abort_next = list, list = srv->heap[i];
    for (struct conn *c = list, *next; c; c = next) {
        next = c->abort_next;
        srv_unpark(srv, c);
        srv_reply(srv, c, STORE_STATUS_ABORTED, 0, NULL, reason);
    }
}

/* After a write: answer the key's parked requests (and everyone's, for abort). */
static void entry_written(struct store_server *srv, struct entry *e)
{
    e->written_ms = now_ms();
    while (e->waiters) {
        struct conn *c = e->waiters;
        uint8_t op = c->wait_op;
        srv_unpark(srv, c);
        srv_reply(srv, c, STORE_STATUS_OK, 0, NULL, op == STORE_OP_GET ? e->value : NULL);
    }
    if (e->key_bytes == strlen(STORE_ABORT_KEY) && !memcmp(e->key, STORE_ABORT_KEY, e->key_bytes) &&
        e->value && e->value->bytes)
        abort_all(srv, e->value);
}

static void entry_set_value(struct store_server *srv, struct entry *e, struct blob *value)
{
    if (!e->value) srv->keys_with_value++;
    srv_blob_release(srv, e->value);
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
    struct entry *e = srv_entry_lookup(srv, key, key_bytes, false);
    if (e && e->value) {
        srv_reply(srv, c, STORE_STATUS_OK, 0, NULL, want_value ? e->value : NULL);
        return;
    }
    struct blob *reason = srv_abort_reason(srv);
    if (reason) { /* the abort key itself is never missing here */
        srv_reply(srv, c, STORE_STATUS_ABORTED, 0, NULL, reason);
        return;
    }
    if (c->req.arg == 0) {
        srv_reply(srv, c, STORE_STATUS_TIMEOUT, 0, NULL, NULL);
        return;
    }
    e = srv_entry_lookup(srv, key, key_bytes, true);
    if (!e || !srv_park(srv, c, e, c->req.arg)) {
        if (e) srv_entry_forget_if_unused(srv, e);
        srv_reply(srv, c, STORE_STATUS_TOO_LARGE, 0, "the store server is out of memory", NULL);
        return;
    }
    srv_update_events(srv, c); /* stop reading until it is answered */
}

static void op_add(struct store_server *srv, struct conn *c, const char *key, size_t key_bytes)
{
    struct entry *e = srv_entry_lookup(srv, key, key_bytes, true);
    int64_t sum = 0;
    const char *problem = NULL;
    if (!e)
        problem = "the store server is out of memory";
    else if (e->value && !parse_int64(e->value, &sum))
        problem = "the key's value is not a decimal integer";
    else if (__builtin_add_overflow(sum, c->req.arg, &sum))
        problem = "the sum overflows a 64-bit integer";
    uint8_t status = e ? STORE_STATUS_NOT_INTEGER : STORE_STATUS_TOO_LARGE;
    struct blob *b = problem ? NULL : srv_blob_new(srv, 24);
    if (!problem && !b) {
        problem = "the store server is out of memory";
        status = STORE_STATUS_TOO_LARGE;
    }
    if (problem) {
        if (e) srv_entry_forget_if_unused(srv, e);
        srv_reply(srv, c, status, 0, problem, NULL);
        return;
    }
    b->bytes = (size_t)snprintf((char *)b->data, b->cap_bytes, "%lld", (long long)sum);
    entry_set_value(srv, e, b);
    srv_reply(srv, c, STORE_STATUS_OK, sum, NULL, NULL);
}

static void op_append(struct store_server *srv, struct conn *c, const char *key, size_t key_bytes)
{
    struct entry *e = srv_entry_lookup(srv, key, key_bytes, true);
    if (!e) {
        srv_reply(srv, c, STORE_STATUS_TOO_LARGE, 0, "the store server is out of memory", NULL);
        return;
    }
    struct blob *old = e->value, *add = c->value;
    size_t old_bytes = old ? old->bytes : 0;
    if (add->bytes > STORE_MAX_VALUE_BYTES - old_bytes) {
        srv_entry_forget_if_unused(srv, e);
        srv_reply(srv, c, STORE_STATUS_TOO_LARGE, 0, "the value would pass STORE_MAX_VALUE_BYTES",
                  NULL);
        return;
    }
    size_t total = old_bytes + add->bytes;
    struct blob *b;
    if (!old) {
        b = add; /* the request's own buffer becomes the value */
        c->value = NULL;
    } else {
        size_t cap =
            old->cap_bytes >= total ? old->cap_bytes : srv_next_cap(old->cap_bytes, SIZE_MAX);
        if (cap < total) cap = total;
        if (cap > STORE_MAX_VALUE_BYTES) cap = STORE_MAX_VALUE_BYTES;
        if (old->refs == 1) { /* nobody is sending it: grow in place */
            b = cap == old->cap_bytes ? old : srv_blob_grow(srv, old, cap);
        } else if ((b = srv_blob_new(srv, cap))) { /* a reply still sends the old one */
            memcpy(b->data, old->data, old_bytes);
            srv_blob_release(srv, old);
        }
        if (!b) {
            srv_reply(srv, c, STORE_STATUS_TOO_LARGE, 0, "the store server is out of memory", NULL);
            return;
        }
        memcpy(b->data + old_bytes, add->data, add->bytes);
        b->bytes = total;
    }
    if (!old) srv->keys_with_value++;
    e->value = b;
    entry_written(srv, e);
    srv_reply(srv, c, STORE_STATUS_OK, (int64_t)total, NULL, NULL);
}

static void op_ages(struct store_server *srv, struct conn *c)
{
    struct blob *b = srv_blob_new(srv, (size_t)c->req.key_count * 8);
    if (!b) {
        srv_reply(srv, c, STORE_STATUS_TOO_LARGE, 0, "the store server is out of memory", NULL);
        return;
    }
    int64_t now = now_ms();
    size_t pos = 0;
    for (size_t i = 0; i < c->req.key_count; i++) {
        const char *key;
        size_t key_bytes;
        next_key(c, &pos, &key, &key_bytes); /* checked by srv_dispatch */
        struct entry *e = srv_entry_lookup(srv, key, key_bytes, false);
        int64_t age = e && e->value ? now - e->written_ms : -1;
        store_wire_put_u64(b->data + 8 * i, (uint64_t)age);
    }
    b->bytes = b->cap_bytes;
    srv_reply(srv, c, STORE_STATUS_OK, 0, NULL, b);
    srv_blob_release(srv, b);
}

/* A whole request has arrived: check its keys, answer it (or park it). */
void srv_dispatch(struct store_server *srv, struct conn *c)
{
    size_t pos = 0, key_bytes = 0, other_bytes;
    const char *key = NULL, *other;
    bool well_formed = next_key(c, &pos, &key, &key_bytes);
    for (size_t i = 1; i < c->req.key_count && well_formed; i++)
        well_formed = next_key(c, &pos, &other, &other_bytes);
    if (!well_formed || pos != c->req.keys_bytes) {
        srv_reply_and_close(srv, c, STORE_STATUS_BAD_REQUEST, "a malformed key list");
        return;
    }
    srv->requests++;
    switch (c->req.op) {
    case STORE_OP_SET: {
        struct entry *e = srv_entry_lookup(srv, key, key_bytes, true);
        if (!e) {
            srv_reply(srv, c, STORE_STATUS_TOO_LARGE, 0, "the store server is out of memory", NULL);
            break;
        }
        entry_set_value(srv, e, c->value);
        c->value = NULL;
        srv_reply(srv, c, STORE_STATUS_OK, 0, NULL, NULL);
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
const char *srv_request_problem(const struct store_wire_request *r, uint8_t *status)
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
