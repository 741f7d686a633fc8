/* test_sha256.c — SHA-256 and HMAC-SHA-256 (common/sha256.h, what the store's
 * handshake proves the secret with) against the published vectors: FIPS 180-2's
 * examples and RFC 4231's cases, and the constant-time compare. Not the
 * handshake itself (test_store_hostile.c). */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "common/sha256.h"

static void hex(const uint8_t *bytes, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", bytes[i]);
}

static void test_sha256_matches_fips_180_2_examples(void)
{
    static const char *const inputs[] = {
        "abc", "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", ""};
    static const char *const digests[] = {
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1",
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"};
    for (int i = 0; i < 3; i++) {
        uint8_t d[32];
        char text[65];
        sha256(inputs[i], strlen(inputs[i]), d);
        hex(d, 32, text);
        CHECK(!strcmp(text, digests[i]), "sha256(\"%s\") = %s", inputs[i], text);
    }
    /* one million 'a', fed in uneven pieces to cross block boundaries */
    struct sha256 s;
    char a[1000];
    memset(a, 'a', sizeof a);
    sha256_init(&s);
    for (size_t fed = 0, piece = 1; fed < 1000000; fed += piece, piece = piece % 997 + 1) {
        if (piece > 1000000 - fed) piece = 1000000 - fed;
        sha256_update(&s, a, piece);
    }
    uint8_t d[32];
    char text[65];
    sha256_final(&s, d);
    hex(d, 32, text);
    CHECK(!strcmp(text, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"),
          "sha256(a x 10^6) = %s", text);
}

static void unhex(const char *text, uint8_t *out, size_t *n)
{
    *n = strlen(text) / 2;
    for (size_t i = 0; i < *n; i++) sscanf(text + 2 * i, "%2hhx", &out[i]);
}

static void test_hmac_sha256_matches_rfc_4231_vectors(void)
{
    static const struct {
        const char *key, *data, *mac; /* hex */
    } cases[] = {
        {"0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b", "4869205468657265",
         "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
        {"4a656665", "7768617420646f2079612077616e7420666f72206e6f7468696e673f",
         "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
        {"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
         "dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd"
         "dddddddddddd",
         "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"},
        {"0102030405060708090a0b0c0d0e0f10111213141516171819",
         "cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd"
         "cdcdcdcdcdcd",
         "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"},
        /* case 6: a key longer than a block (131 bytes of 0xaa) */
        {NULL,
         "54657374205573696e67204c6172676572205468616e20426c6f636b2d53697a65204b6579202d2048"
         "617368204b6579204669727374",
         "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"},
        /* case 7: a long key and a long message */
        {NULL,
         "5468697320697320612074657374207573696e672061206c6172676572207468616e20626c6f636b2d73"
         "697a65206b657920616e642061206c6172676572207468616e20626c6f636b2d73697a6520646174612e"
         "20546865206b6579206e6565647320746f20626520686173686564206265666f7265206265696e672075"
         "7365642062792074686520484d414320616c676f726974686d2e",
         "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint8_t key[131], data[256], mac[32];
        size_t key_bytes, data_bytes;
        if (cases[i].key)
            unhex(cases[i].key, key, &key_bytes);
        else
            memset(key, 0xaa, key_bytes = 131);
        unhex(cases[i].data, data, &data_bytes);
        sha256_hmac(key, key_bytes, data, data_bytes, mac);
        char text[65];
        hex(mac, 32, text);
        CHECK(!strcmp(text, cases[i].mac), "RFC 4231 case %zu: %s", i < 4 ? i + 1 : i + 2, text);
    }
    CHECK(sha256_equal_ct("abcd", "abcd", 4) && !sha256_equal_ct("abcd", "abce", 4), "compare");
}

int main(void)
{
    RUN(test_sha256_matches_fips_180_2_examples);
    RUN(test_hmac_sha256_matches_rfc_4231_vectors);
    return check_exit_code();
}
