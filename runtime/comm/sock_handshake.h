/* sock_handshake.h — the bytes of the socket backend's handshake (the
 * protocol is described at the top of sock_connect.h): each message written
 * and read by one pure function, so that the parser can be fuzzed
 * (tests/fuzz/fuzz_sock_handshake.c). Sockets, slots and deadlines are
 * sock_connect.c's. */
#ifndef PLAIT_SOCK_HANDSHAKE_H
#define PLAIT_SOCK_HANDSHAKE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SOCK_HELLO_BYTES 56
#define SOCK_CHALLENGE_BYTES 64
#define SOCK_PROOF_BYTES 32
#define SOCK_ACK_BYTES 8
#define SOCK_NONCE_BYTES 32
#define SOCK_HANDSHAKE_VERSION 1u
#define SOCK_KIND_TCP 0u
#define SOCK_KIND_SHM 1u /* a Unix socket, and shared memory after */

/* What both sides' MACs cover: the communicator, the pair, the transport and
 * both nonces (t in sock_connect.h), and the secret that keys them. */
struct sock_transcript {
    const char *comm_name; /* its first COMM_MAX_NAME_BYTES bytes count (comm.c allows no more) */
    const char *secret;
    int from, to; /* the connector's rank, the acceptor's */
    uint32_t kind;
    uint8_t nonce_c[SOCK_NONCE_BYTES], nonce_a[SOCK_NONCE_BYTES];
};

/* The connector's hello: from, to, kind and nonce_c of t. */
void sock_hello_write(const struct sock_transcript *t, uint8_t out[SOCK_HELLO_BYTES]);

/* The acceptor reads a hello of n bytes into t (from, to, kind, nonce_c; the
 * rest of t is the caller's). 0 when it is one, of this version, addressed to
 * rank self of a communicator of size ranks by a higher rank, over the
 * transport it came on (kind); -1 otherwise. It proves nothing: anyone can
 * write a hello, and only the proof says who sent it. */
int sock_hello_read(const uint8_t *bytes, size_t n, int self, int size, uint32_t kind,
                    struct sock_transcript *t);

/* The acceptor's challenge: nonce_a of t, and its MAC over t. */
void sock_challenge_write(const struct sock_transcript *t, uint8_t out[SOCK_CHALLENGE_BYTES]);

/* The connector takes nonce_a from a challenge of n bytes into t; true when
 * its MAC proves the secret for t. */
bool sock_challenge_read(const uint8_t *bytes, size_t n, struct sock_transcript *t);

/* The connector's proof: its MAC over t. */
void sock_proof_write(const struct sock_transcript *t, uint8_t out[SOCK_PROOF_BYTES]);

/* Whether n bytes are the connector's proof for t (in constant time). */
bool sock_proof_valid(const struct sock_transcript *t, const uint8_t *bytes, size_t n);

void sock_ack_write(uint8_t out[SOCK_ACK_BYTES]);
bool sock_ack_valid(const uint8_t *bytes, size_t n);

#endif
