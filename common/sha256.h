/* sha256.h — SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), small and
 * dependency-free, for the rendezvous store's handshake. Not a general crypto
 * library: no other hashes, no key derivation. */
#ifndef PLAIT_SHA256_H
#define PLAIT_SHA256_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SHA256_DIGEST_BYTES 32
#define SHA256_BLOCK_BYTES 64

struct sha256 {
    uint32_t state[8];
    uint64_t total_bytes;              /* message bytes hashed so far */
    uint8_t block[SHA256_BLOCK_BYTES]; /* the partial block */
    size_t block_used_bytes;
};

void sha256_init(struct sha256 *s);
void sha256_update(struct sha256 *s, const void *data, size_t bytes);
/* Writes the digest; s must be initialised again before reuse. */
void sha256_final(struct sha256 *s, uint8_t out[SHA256_DIGEST_BYTES]);

/* The digest of one buffer. */
void sha256(const void *data, size_t bytes, uint8_t out[SHA256_DIGEST_BYTES]);

/* HMAC-SHA256(key, msg); any key length (longer than a block is hashed first). */
void sha256_hmac(const void *key, size_t key_bytes, const void *msg, size_t msg_bytes,
                 uint8_t out[SHA256_DIGEST_BYTES]);

/* a == b over n bytes in time that does not depend on where they differ. */
bool sha256_equal_ct(const void *a, const void *b, size_t n);

#endif
