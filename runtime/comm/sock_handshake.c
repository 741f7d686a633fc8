/* sock_handshake.c — the handshake's messages as bytes (sock_handshake.h):
 * hello, challenge, proof and ack, written and checked, and the MACs over the
 * transcript. No sockets, no state: sock_connect.c moves the bytes. */
#include "runtime/comm/sock_handshake.h"

#include <string.h>

#include "common/sha256.h"
#include "runtime/comm/comm.h"

#define LABEL_ACCEPTOR "plait-comm-v1 acceptor"
#define LABEL_CONNECTOR "plait-comm-v1 connector"

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* HMAC(secret, label | u32 len | name | from | to | kind | nonce_c | nonce_a) */
static void transcript_mac(const struct sock_transcript *t, bool acceptor,
                           uint8_t out[SHA256_DIGEST_BYTES])
{
    const char *label = acceptor ? LABEL_ACCEPTOR : LABEL_CONNECTOR;
    size_t label_len = strlen(label), name_len = strnlen(t->comm_name, COMM_MAX_NAME_BYTES), n = 0;
    uint8_t msg[sizeof LABEL_CONNECTOR + 4 + COMM_MAX_NAME_BYTES + 12 + 2 * SOCK_NONCE_BYTES];
    memcpy(msg, label, label_len);
    n += label_len;
    put_u32(msg + n, (uint32_t)name_len);
    n += 4;
    memcpy(msg + n, t->comm_name, name_len);
    n += name_len;
    put_u32(msg + n, (uint32_t)t->from);
    put_u32(msg + n + 4, (uint32_t)t->to);
    put_u32(msg + n + 8, t->kind);
    n += 12;
    memcpy(msg + n, t->nonce_c, SOCK_NONCE_BYTES);
    memcpy(msg + n + SOCK_NONCE_BYTES, t->nonce_a, SOCK_NONCE_BYTES);
    n += 2 * SOCK_NONCE_BYTES;
    sha256_hmac(t->secret, strlen(t->secret), msg, n, out);
}

void sock_hello_write(const struct sock_transcript *t, uint8_t out[SOCK_HELLO_BYTES])
{
    memcpy(out, "PLCM", 4);
    put_u32(out + 4, SOCK_HANDSHAKE_VERSION);
    put_u32(out + 8, (uint32_t)t->from);
    put_u32(out + 12, (uint32_t)t->to);
    put_u32(out + 16, t->kind);
    put_u32(out + 20, 0);
    memcpy(out + 24, t->nonce_c, SOCK_NONCE_BYTES);
}

int sock_hello_read(const uint8_t *bytes, size_t n, int self, int size, uint32_t kind,
                    struct sock_transcript *t)
{
    if (n != SOCK_HELLO_BYTES || memcmp(bytes, "PLCM", 4) != 0 ||
        get_u32(bytes + 4) != SOCK_HANDSHAKE_VERSION || get_u32(bytes + 20) != 0)
        return -1;
    /* ranks as unsigned: a negative one is a huge one, and out of range */
    uint32_t from = get_u32(bytes + 8), to = get_u32(bytes + 12);
    if (self < 0 || size <= self || to != (uint32_t)self || from <= (uint32_t)self ||
        from >= (uint32_t)size || get_u32(bytes + 16) != kind)
        return -1;
    t->from = (int)from;
    t->to = (int)to;
    t->kind = kind;
    memcpy(t->nonce_c, bytes + 24, SOCK_NONCE_BYTES);
    return 0;
}

void sock_challenge_write(const struct sock_transcript *t, uint8_t out[SOCK_CHALLENGE_BYTES])
{
    memcpy(out, t->nonce_a, SOCK_NONCE_BYTES);
    transcript_mac(t, true, out + SOCK_NONCE_BYTES);
}

bool sock_challenge_read(const uint8_t *bytes, size_t n, struct sock_transcript *t)
{
    if (n != SOCK_CHALLENGE_BYTES) return false;
    memcpy(t->nonce_a, bytes, SOCK_NONCE_BYTES);
    uint8_t want[SHA256_DIGEST_BYTES];
    transcript_mac(t, true, want);
    return sha256_equal_ct(want, bytes + SOCK_NONCE_BYTES, SHA256_DIGEST_BYTES);
}

void sock_proof_write(const struct sock_transcript *t, uint8_t out[SOCK_PROOF_BYTES])
{
    transcript_mac(t, false, out);
}

bool sock_proof_valid(const struct sock_transcript *t, const uint8_t *bytes, size_t n)
{
    if (n != SOCK_PROOF_BYTES) return false;
    uint8_t want[SHA256_DIGEST_BYTES];
    transcript_mac(t, false, want);
    return sha256_equal_ct(want, bytes, SHA256_DIGEST_BYTES);
}

void sock_ack_write(uint8_t out[SOCK_ACK_BYTES])
{
    memcpy(out, "PLOK", 4);
    put_u32(out + 4, 0);
}

bool sock_ack_valid(const uint8_t *bytes, size_t n)
{
    return n == SOCK_ACK_BYTES && memcmp(bytes, "PLOK", 4) == 0 && get_u32(bytes + 4) == 0;
}
