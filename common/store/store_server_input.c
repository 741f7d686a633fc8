/* store_server_input.c — a request's bytes read off a store server
 * connection, phase by phase (the handshake, the fixed header, the keys, the
 * value) into buffers that grow as bytes arrive, each phase handed on when
 * complete. Not the handshake's check (store_server_auth.c) nor the answer
 * (store_server_requests.c). */
#include <errno.h>
#include <stdbool.h>
#include <string.h>
#include <sys/socket.h>

#include "common/store/store_server_internal.h"

#define READS_PER_EVENT 64 /* then other connections get a turn */

void srv_input_reset(struct store_server *srv, struct conn *c)
{
    if (c->keys_cap > FIRST_BUFFER_BYTES) { /* keep a small buffer, not a large one */
        srv_free_counted(srv, c->keys, c->keys_cap);
        c->keys = NULL;
        c->keys_cap = 0;
    }
    c->keys_got = 0;
    srv_blob_release(srv, c->value);
    c->value = NULL;
    c->head_got = 0;
    c->phase = PHASE_HEAD;
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
            size_t cap = srv_next_cap(c->keys_cap, c->req.keys_bytes);
            uint8_t *keys = srv_alloc_counted(srv, cap);
            if (!keys) return false;
            if (c->keys_got) memcpy(keys, c->keys, c->keys_got);
            srv_free_counted(srv, c->keys, c->keys_cap);
            c->keys = keys;
            c->keys_cap = cap;
        }
        *dst = c->keys + c->keys_got; /* a kept buffer may be longer than this list */
        *want = (c->keys_cap < c->req.keys_bytes ? c->keys_cap : c->req.keys_bytes) - c->keys_got;
        return true;
    case PHASE_VALUE:
        if (c->value->bytes == c->value->cap_bytes) {
            struct blob *b =
                srv_blob_grow(srv, c->value, srv_next_cap(c->value->cap_bytes, c->req.value_bytes));
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
        if (c->head_got == STORE_WIRE_AUTH_BYTES) srv_auth_check(srv, c);
        return;
    }
    if (c->phase == PHASE_HEAD) {
        if (c->head_got < STORE_WIRE_REQUEST_BYTES) return;
        store_wire_decode_request(c->head, &c->req);
        uint8_t status;
        const char *problem = srv_request_problem(&c->req, &status);
        if (problem) {
            srv_reply_and_close(srv, c, status, problem);
            return;
        }
        c->phase = PHASE_KEYS;
    }
    if (c->phase == PHASE_KEYS) {
        if (c->keys_got < c->req.keys_bytes) return;
        c->value = srv_blob_new(srv, 0);
        if (!c->value) {
            srv_reply_and_close(srv, c, STORE_STATUS_TOO_LARGE,
                                "the store server is out of memory");
            return;
        }
        c->phase = PHASE_VALUE;
    }
    if (c->value->bytes < c->req.value_bytes) return;
    srv_dispatch(srv, c);
    if (!c->dead) srv_input_reset(srv, c);
}

/* Reads what has arrived on c, request by request. */
void srv_conn_read(struct store_server *srv, struct conn *c)
{
    for (int round = 0; round < READS_PER_EVENT && srv_can_read(c); round++) {
        uint8_t *dst;
        size_t want;
        if (!input_target(srv, c, &dst, &want)) {
            srv_reply_and_close(srv, c, STORE_STATUS_TOO_LARGE,
                                "the store server is out of memory");
            return;
        }
        ssize_t k = recv(c->fd, dst, want, MSG_DONTWAIT);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (k <= 0) { /* closed (or reset) by the peer */
            srv_conn_kill(srv, c);
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
    if (!c->dead) srv_update_events(srv, c);
}
