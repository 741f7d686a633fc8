/* sha256.c — SHA-256 compression, padding, HMAC and a constant-time compare.
 * Byte order is explicit (big-endian words, as FIPS 180-4 says), so the
 * result does not depend on the host. What the store does with it is in
 * store_wire.h. */
#include "common/sha256.h"

#include <string.h>

static const uint32_t round_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

static uint32_t rotr(uint32_t x, unsigned n)
{
    return x >> n | x << (32 - n);
}

/* One 64-byte block into the state. */
static void compress(uint32_t state[8], const uint8_t block[SHA256_BLOCK_BYTES])
{
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)block[4 * i] << 24 | (uint32_t)block[4 * i + 1] << 16 |
               (uint32_t)block[4 * i + 2] << 8 | (uint32_t)block[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ w[i - 15] >> 3;
        uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ w[i - 2] >> 10;
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = state[0], b = state[1], c = state[2], d = state[3];
    uint32_t e = state[4], f = state[5], g = state[6], h = state[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 =
            h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + round_k[i] + w[i];
        uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        h = g, g = f, f = e, e = d + t1;
        d = c, c = b, b = a, a = t1 + t2;
    }
    state[0] += a, state[1] += b, state[2] += c, state[3] += d;
    state[4] += e, state[5] += f, state[6] += g, state[7] += h;
}

void sha256_init(struct sha256 *s)
{
    static const uint32_t initial[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                        0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->state, initial, sizeof initial);
    s->total_bytes = 0;
    s->block_used_bytes = 0;
}

void sha256_update(struct sha256 *s, const void *data, size_t bytes)
{
    const uint8_t *p = data;
    s->total_bytes += bytes;
    while (bytes > 0) {
        size_t take = SHA256_BLOCK_BYTES - s->block_used_bytes;
        if (take > bytes) take = bytes;
        memcpy(s->block + s->block_used_bytes, p, take);
        s->block_used_bytes += take;
        p += take;
        bytes -= take;
        if (s->block_used_bytes == SHA256_BLOCK_BYTES) {
            compress(s->state, s->block);
            s->block_used_bytes = 0;
        }
    }
}

void sha256_final(struct sha256 *s, uint8_t out[SHA256_DIGEST_BYTES])
{
    uint64_t bits = s->total_bytes * 8;
    /* 0x80, zeros up to 56 mod 64, then the message length in bits (big-endian) */
    static const uint8_t pad[SHA256_BLOCK_BYTES] = {0x80};
    size_t pad_bytes =
        s->block_used_bytes < 56 ? 56 - s->block_used_bytes : 120 - s->block_used_bytes;
    sha256_update(s, pad, pad_bytes);
    uint8_t length[8];
    for (int i = 0; i < 8; i++) length[i] = (uint8_t)(bits >> (56 - 8 * i));
    sha256_update(s, length, sizeof length);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (uint8_t)(s->state[i] >> 24);
        out[4 * i + 1] = (uint8_t)(s->state[i] >> 16);
        out[4 * i + 2] = (uint8_t)(s->state[i] >> 8);
        out[4 * i + 3] = (uint8_t)s->state[i];
    }
}

void sha256(const void *data, size_t bytes, uint8_t out[SHA256_DIGEST_BYTES])
{
    struct sha256 s;
    sha256_init(&s);
    sha256_update(&s, data, bytes);
    sha256_final(&s, out);
}

void sha256_hmac(const void *key, size_t key_bytes, const void *msg, size_t msg_bytes,
                 uint8_t out[SHA256_DIGEST_BYTES])
{
    uint8_t block_key[SHA256_BLOCK_BYTES] = {0};
    if (key_bytes > SHA256_BLOCK_BYTES)
        sha256(key, key_bytes, block_key);
    else if (key_bytes > 0)
        memcpy(block_key, key, key_bytes);
    uint8_t ipad[SHA256_BLOCK_BYTES], opad[SHA256_BLOCK_BYTES];
    for (int i = 0; i < SHA256_BLOCK_BYTES; i++) {
        ipad[i] = block_key[i] ^ 0x36;
        opad[i] = block_key[i] ^ 0x5c;
    }
    uint8_t inner[SHA256_DIGEST_BYTES];
    struct sha256 s;
    sha256_init(&s);
    sha256_update(&s, ipad, sizeof ipad);
    sha256_update(&s, msg, msg_bytes);
    sha256_final(&s, inner);
    sha256_init(&s);
    sha256_update(&s, opad, sizeof opad);
    sha256_update(&s, inner, sizeof inner);
    sha256_final(&s, out);
}

bool sha256_equal_ct(const void *a, const void *b, size_t n)
{
    const volatile uint8_t *x = a, *y = b;
    uint8_t diff = 0;
    for (size_t i = 0; i < n; i++) diff |= x[i] ^ y[i];
    return diff == 0;
}
