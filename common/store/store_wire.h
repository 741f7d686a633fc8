/* store_wire.h — the rendezvous store's bytes on the wire, shared by
 * store_server.c, store_client.c and the tests that play a hostile client.
 * Limits a caller must know are in store.h; this header is the protocol.
 *
 * Integers are little-endian, fixed width. One connection carries one request
 * at a time: the client sends a request and reads its reply before the next.
 *
 * Handshake (the server speaks first):
 *   hello   server -> client, 40 bytes:  "PLST" | u32 version (1) | nonce[32]
 *   auth    client -> server, 36 bytes:  i32 rank | mac[32]
 *           mac = HMAC-SHA256(secret, "plait-store-v1" | nonce[32] | i32 rank)
 *   reply   server -> client: a reply (below) with status OK, or REFUSED and
 *           the server closes the connection. The secret never crosses the
 *           wire; the nonce is fresh per connection (getrandom), so a recorded
 *           auth cannot be replayed. The server waits STORE_WIRE_AUTH_TIMEOUT_MS
 *           for the auth, then closes.
 *
 * Request, 24-byte header then its keys and value:
 *    0 u8  op            enum store_wire_op
 *    1 u8  0             (reserved; anything else is a bad request)
 *    2 u16 key_count     SET/GET/ADD/APPEND/WAIT: 1; AGES: 1..STORE_MAX_KEYS_PER_REQUEST
 *    4 u32 keys_bytes    the key list's length: key_count * (2 + 1..STORE_MAX_KEY_BYTES)
 *    8 u64 value_bytes   SET/APPEND: 0..STORE_MAX_VALUE_BYTES; others 0
 *   16 i64 arg           ADD: delta; GET/WAIT: how long to wait in ms
 *                        (0..STORE_WIRE_MAX_WAIT_MS, 0 = answer now); others 0
 *   24 keys              key_count times: u16 length (1..STORE_MAX_KEY_BYTES), the
 *                        key's bytes (no NUL)
 *      value             value_bytes bytes
 *
 * Reply, 24-byte header then value_bytes bytes:
 *    0 u8  status        enum store_wire_status
 *    1 u8[7] 0
 *    8 u64 value_bytes   GET: the value; AGES: key_count * i64 (ms since the key
 *                        was last written, by the server's clock; -1 never);
 *                        ABORTED: the abort reason; errors: a text; else 0
 *   16 i64 result        ADD: the new value; APPEND: the new length in bytes
 *
 * Ops: SET stores the value. GET answers the value, parking the request until
 * the key is written or arg ms pass (TIMEOUT). WAIT is GET without the value.
 * ADD adds arg to the key's value read as a decimal integer (absent = 0) and
 * stores the sum as decimal text. APPEND appends the value (absent = empty).
 * AGES answers each key's age. Every write wakes the key's parked requests.
 * While the key STORE_ABORT_KEY exists, a GET/WAIT on a missing key (other
 * than that one) answers ABORTED with its value, and writing it answers every
 * parked request so.
 *
 * A request the server cannot parse (unknown op, a length out of bounds) gets
 * BAD_REQUEST or TOO_LARGE with a text, then the connection is closed: the
 * stream cannot be trusted after a bad length. Lengths are checked before
 * anything is allocated, and buffers grow only as bytes arrive. */
#ifndef PLAIT_STORE_WIRE_H
#define PLAIT_STORE_WIRE_H

#include <stdint.h>
#include <string.h>

#include "common/sha256.h"
#include "common/store/store.h"

#define STORE_WIRE_MAGIC "PLST"
#define STORE_WIRE_VERSION 1u
#define STORE_WIRE_NONCE_BYTES 32
#define STORE_WIRE_HELLO_BYTES 40
#define STORE_WIRE_AUTH_BYTES 36
#define STORE_WIRE_REQUEST_BYTES 24
#define STORE_WIRE_REPLY_BYTES 24
#define STORE_WIRE_AUTH_LABEL "plait-store-v1"
#define STORE_WIRE_AUTH_TIMEOUT_MS 10000
#define STORE_WIRE_MAX_WAIT_MS (7LL * 24 * 3600 * 1000) /* a week */

enum store_wire_op {
    STORE_OP_SET = 1,
    STORE_OP_GET = 2,
    STORE_OP_ADD = 3,
    STORE_OP_APPEND = 4,
    STORE_OP_WAIT = 5,
    STORE_OP_AGES = 6,
};

enum store_wire_status {
    STORE_STATUS_OK = 0,
    STORE_STATUS_TIMEOUT = 1,     /* GET/WAIT: the key was not written in time */
    STORE_STATUS_ABORTED = 2,     /* GET/WAIT: the job was aborted; value = reason */
    STORE_STATUS_BAD_REQUEST = 3, /* value = what was wrong */
    STORE_STATUS_NOT_INTEGER = 4, /* ADD: the value is not a decimal integer, or overflow */
    STORE_STATUS_TOO_LARGE = 5,   /* a value or the server's memory would exceed its limit */
    STORE_STATUS_REFUSED = 6,     /* handshake: the mac does not prove the secret */
};

struct store_wire_request {
    uint8_t op;
    uint8_t reserved; /* 0 */
    uint16_t key_count;
    uint32_t keys_bytes;
    uint64_t value_bytes;
    int64_t arg;
};

struct store_wire_reply {
    uint8_t status;
    uint64_t value_bytes;
    int64_t result;
};

static inline void store_wire_put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8);
}

static inline void store_wire_put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> 8 * i);
}

static inline void store_wire_put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> 8 * i);
}

static inline uint16_t store_wire_get_u16(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

static inline uint32_t store_wire_get_u32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << 8 * i;
    return v;
}

static inline uint64_t store_wire_get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << 8 * i;
    return v;
}

static inline void store_wire_encode_request(uint8_t out[STORE_WIRE_REQUEST_BYTES],
                                             const struct store_wire_request *r)
{
    memset(out, 0, STORE_WIRE_REQUEST_BYTES);
    out[0] = r->op;
    out[1] = r->reserved;
    store_wire_put_u16(out + 2, r->key_count);
    store_wire_put_u32(out + 4, r->keys_bytes);
    store_wire_put_u64(out + 8, r->value_bytes);
    store_wire_put_u64(out + 16, (uint64_t)r->arg);
}

static inline void store_wire_decode_request(const uint8_t in[STORE_WIRE_REQUEST_BYTES],
                                             struct store_wire_request *r)
{
    r->op = in[0];
    r->reserved = in[1];
    r->key_count = store_wire_get_u16(in + 2);
    r->keys_bytes = store_wire_get_u32(in + 4);
    r->value_bytes = store_wire_get_u64(in + 8);
    r->arg = (int64_t)store_wire_get_u64(in + 16);
}

static inline void store_wire_encode_reply(uint8_t out[STORE_WIRE_REPLY_BYTES],
                                           const struct store_wire_reply *r)
{
    memset(out, 0, STORE_WIRE_REPLY_BYTES);
    out[0] = r->status;
    store_wire_put_u64(out + 8, r->value_bytes);
    store_wire_put_u64(out + 16, (uint64_t)r->result);
}

static inline void store_wire_decode_reply(const uint8_t in[STORE_WIRE_REPLY_BYTES],
                                           struct store_wire_reply *r)
{
    r->status = in[0];
    r->value_bytes = store_wire_get_u64(in + 8);
    r->result = (int64_t)store_wire_get_u64(in + 16);
}

/* The handshake's mac (see the top of this file). */
static inline void store_wire_auth_mac(const char *secret,
                                       const uint8_t nonce[STORE_WIRE_NONCE_BYTES], int32_t rank,
                                       uint8_t out[SHA256_DIGEST_BYTES])
{
    uint8_t msg[sizeof STORE_WIRE_AUTH_LABEL - 1 + STORE_WIRE_NONCE_BYTES + 4];
    memcpy(msg, STORE_WIRE_AUTH_LABEL, sizeof STORE_WIRE_AUTH_LABEL - 1);
    memcpy(msg + sizeof STORE_WIRE_AUTH_LABEL - 1, nonce, STORE_WIRE_NONCE_BYTES);
    store_wire_put_u32(msg + sizeof msg - 4, (uint32_t)rank);
    sha256_hmac(secret, strlen(secret), msg, sizeof msg, out);
}

#endif
