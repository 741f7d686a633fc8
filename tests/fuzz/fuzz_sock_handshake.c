/* fuzz_sock_handshake.c — libFuzzer target for the socket backend's handshake
 * messages (runtime/comm/sock_handshake.h): a hello read by the acceptor, a
 * challenge read by the connector, a proof and an ack, each from the input,
 * for a communicator, pair and secret the input also gives. Checks each
 * reader against this file's own reading of the protocol in sock_connect.h
 * (fields, ranks, and the MACs built here from the spec's transcript). */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "common/sha256.h"
#include "runtime/comm/comm.h"
#include "runtime/comm/sock_handshake.h"
#include "tests/fuzz/harness.h"

enum {
    SHM = 1 << 0,         /* the connection came on the Unix socket */
    RIGHT_PROOF = 1 << 1, /* the proof is the one the secret makes (else the input's) */
    RIGHT_CHALLENGE = 1 << 2,
    /* bits 3-5: which part of the transcript a second check changes */
};

/* The input's first 8 bytes (little-endian); then the name, the secret,
 * nonce_a, the hello, the challenge, the proof and the ack, each as long as
 * it says or as the input has left. */
struct control {
    uint16_t size; /* the communicator's ranks: 1 + size % 4096 */
    uint16_t self; /* the acceptor: self % ranks */
    uint8_t flags;
    uint8_t hello_bytes; /* & 63 */
    uint8_t name_bytes;  /* % (COMM_MAX_NAME_BYTES + 1) */
    uint8_t secret_bytes;
};
_Static_assert(sizeof(struct control) == 8, "control block layout");

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* sock_connect.h's MAC, built here: HMAC(secret, label | t), t = u32 len |
 * name | from | to | kind | nonce_c | nonce_a. */
static void spec_mac(const struct sock_transcript *t, const char *label, uint8_t out[32])
{
    uint8_t msg[64 + 4 + COMM_MAX_NAME_BYTES + 12 + 2 * SOCK_NONCE_BYTES];
    size_t n = strlen(label), name = strlen(t->comm_name);
    memcpy(msg, label, n);
    put_le32(msg + n, (uint32_t)name);
    memcpy(msg + n + 4, t->comm_name, name);
    n += 4 + name;
    put_le32(msg + n, (uint32_t)t->from);
    put_le32(msg + n + 4, (uint32_t)t->to);
    put_le32(msg + n + 8, t->kind);
    memcpy(msg + n + 12, t->nonce_c, SOCK_NONCE_BYTES);
    memcpy(msg + n + 12 + SOCK_NONCE_BYTES, t->nonce_a, SOCK_NONCE_BYTES);
    n += 12 + 2 * SOCK_NONCE_BYTES;
    sha256_hmac(t->secret, strlen(t->secret), msg, n, out);
}

/* Takes up to want bytes of the input into out (the rest zero). */
static size_t take(const uint8_t **p, const uint8_t *end, void *out, size_t want)
{
    size_t n = (size_t)(end - *p) < want ? (size_t)(end - *p) : want;
    memset(out, 0, want);
    memcpy(out, *p, n);
    *p += n;
    return n;
}

/* The hello as sock_connect.h describes it, read here. */
static bool spec_hello_ok(const uint8_t *h, size_t n, int self, int ranks, uint32_t kind)
{
    if (n != SOCK_HELLO_BYTES || memcmp(h, "PLCM", 4) != 0 || le32(h + 4) != 1 || le32(h + 20))
        return false;
    int64_t from = (int32_t)le32(h + 8), to = (int32_t)le32(h + 12);
    return to == self && from > self && from < ranks && le32(h + 16) == kind;
}

/* The hello: accepted exactly when the spec says, its fields taken as they
 * are, and written back to the same bytes. */
static void check_hello(const uint8_t *hello, size_t n, int self, int ranks, uint32_t kind,
                        struct sock_transcript *t)
{
    bool want = spec_hello_ok(hello, n, self, ranks, kind);
    int rc = sock_hello_read(hello, n, self, ranks, kind, t);
    FUZZ_CHECK((rc == 0) == want, "hello %s, the spec says %s", rc ? "refused" : "accepted",
               want ? "accept" : "refuse");
    if (rc) { /* the MAC checks below go on with what the bytes say */
        t->from = (int)le32(hello + 8);
        t->to = (int)le32(hello + 12);
        t->kind = kind;
        memcpy(t->nonce_c, hello + 24, SOCK_NONCE_BYTES);
        return;
    }
    FUZZ_CHECK(t->from == (int)le32(hello + 8) && t->to == self && t->kind == kind &&
                   !memcmp(t->nonce_c, hello + 24, SOCK_NONCE_BYTES),
               "the hello's fields");
    uint8_t again[SOCK_HELLO_BYTES];
    sock_hello_write(t, again);
    FUZZ_CHECK(!memcmp(again, hello, SOCK_HELLO_BYTES), "a hello written back differs");
}

/* The challenge: written as the spec says; read (by the connector) exactly
 * when its MAC is the one over its own nonce_a. */
static void check_challenge(const struct sock_transcript *t, const uint8_t *in, size_t n,
                            bool right)
{
    uint8_t mine[SOCK_CHALLENGE_BYTES], mac[32];
    sock_challenge_write(t, mine);
    spec_mac(t, "plait-comm-v1 acceptor", mac);
    FUZZ_CHECK(!memcmp(mine, t->nonce_a, SOCK_NONCE_BYTES) && !memcmp(mine + 32, mac, 32),
               "the challenge is not nonce_a and the acceptor's MAC");
    struct sock_transcript c = *t;
    memset(c.nonce_a, 0, sizeof c.nonce_a);
    FUZZ_CHECK(sock_challenge_read(mine, sizeof mine, &c) &&
                   !memcmp(c.nonce_a, t->nonce_a, SOCK_NONCE_BYTES),
               "the connector refuses a right challenge");
    const uint8_t *bytes = right ? mine : in;
    size_t bytes_n = right ? sizeof mine : n;
    bool want = false;
    if (bytes_n == SOCK_CHALLENGE_BYTES) {
        memcpy(c.nonce_a, bytes, SOCK_NONCE_BYTES);
        spec_mac(&c, "plait-comm-v1 acceptor", mac);
        want = !memcmp(mac, bytes + 32, 32);
    }
    FUZZ_CHECK(sock_challenge_read(bytes, bytes_n, &c) == want, "challenge read: want %d", want);
}

/* The proof: the connector's MAC and nothing else, for this transcript only. */
static void check_proof(const struct sock_transcript *t, const uint8_t *in, size_t n, bool right,
                        unsigned change)
{
    uint8_t mine[SOCK_PROOF_BYTES], mac[32], acceptors[32];
    sock_proof_write(t, mine);
    spec_mac(t, "plait-comm-v1 connector", mac);
    FUZZ_CHECK(!memcmp(mine, mac, 32), "the proof is not the connector's MAC");
    spec_mac(t, "plait-comm-v1 acceptor", acceptors);
    FUZZ_CHECK(!sock_proof_valid(t, acceptors, sizeof acceptors),
               "the acceptor's own MAC passes as the connector's proof");
    const uint8_t *bytes = right ? mine : in;
    size_t bytes_n = right ? sizeof mine : n;
    bool want = bytes_n == SOCK_PROOF_BYTES && !memcmp(bytes, mac, 32);
    FUZZ_CHECK(sock_proof_valid(t, bytes, bytes_n) == want, "proof: want %d", want);
    /* the right proof for another transcript is no proof for this one */
    struct sock_transcript o = *t;
    char name[COMM_MAX_NAME_BYTES + 1];
    switch (change % 6) {
    case 0:
        o.from ^= 1;
        break;
    case 1:
        o.to ^= 1 << 20;
        break;
    case 2:
        o.kind ^= 1;
        break;
    case 3:
        o.nonce_c[change % SOCK_NONCE_BYTES] ^= 0x80;
        break;
    case 4:
        o.nonce_a[change % SOCK_NONCE_BYTES] ^= 1;
        break;
    default: /* another name of a length the MAC covers whole */
        snprintf(name, sizeof name, "%s", *t->comm_name ? t->comm_name : "x");
        name[0] = *t->comm_name ? (char)(name[0] ^ 1) : name[0];
        o.comm_name = name;
    }
    FUZZ_CHECK(!sock_proof_valid(&o, mine, sizeof mine), "a proof passes for a changed transcript");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct control c;
    if (size < sizeof c) return -1;
    memcpy(&c, data, sizeof c);
    const uint8_t *p = data + sizeof c, *end = data + size;
    int ranks = 1 + c.size % 4096, self = c.self % ranks;
    uint32_t kind = c.flags & SHM ? SOCK_KIND_SHM : SOCK_KIND_TCP;
    char name[COMM_MAX_NAME_BYTES + 1], secret[256];
    take(&p, end, name, c.name_bytes % (COMM_MAX_NAME_BYTES + 1));
    name[c.name_bytes % (COMM_MAX_NAME_BYTES + 1)] = '\0';
    take(&p, end, secret, c.secret_bytes);
    secret[c.secret_bytes] = '\0';
    struct sock_transcript t = {.comm_name = name, .secret = secret};
    take(&p, end, t.nonce_a, SOCK_NONCE_BYTES);
    uint8_t hello[64], challenge[SOCK_CHALLENGE_BYTES], proof[SOCK_PROOF_BYTES],
        ack[SOCK_ACK_BYTES];
    size_t hello_n = take(&p, end, hello, c.hello_bytes & 63);
    size_t challenge_n = take(&p, end, challenge, sizeof challenge);
    size_t proof_n = take(&p, end, proof, sizeof proof);
    size_t ack_n = take(&p, end, ack, sizeof ack);

    check_hello(hello, hello_n, self, ranks, kind, &t);
    check_challenge(&t, challenge, challenge_n, c.flags & RIGHT_CHALLENGE);
    check_proof(&t, proof, proof_n, c.flags & RIGHT_PROOF, c.flags >> 3);
    uint8_t mine[SOCK_ACK_BYTES];
    sock_ack_write(mine);
    FUZZ_CHECK(sock_ack_valid(mine, sizeof mine), "the ack written is refused");
    bool want = ack_n == SOCK_ACK_BYTES && !memcmp(ack, "PLOK\0\0\0\0", 8);
    FUZZ_CHECK(sock_ack_valid(ack, ack_n) == want, "ack: want %d", want);
    return 0;
}
