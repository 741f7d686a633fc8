/* fuzz_llmc.c — libFuzzer target for llm.c model files (and plait's Llama
 * model.bin, version 103): one input file goes to
 * llmc_read_model_header, then (accepted, ≤ 64 MB of parameters) gpt2_read_llmc,
 * and to tokenizer_load. Checks the header rules against its own GPT-2
 * parameter count, that the parameters and CRC-32C are the file's, and what a
 * loaded tokenizer promises (every piece; end-of-text -1 or a token). */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "common/crc32c.h"
#include "common/gpt2/gpt2_layout.h"
#include "common/formats/llmc.h"
#include "runtime/gpt2.h"
#include "sample/tokenizer.h"
#include "tests/fuzz/harness.h"

#define MAX_PARAM_BYTES (64u << 20)
#define TOKENIZER_MAGIC 20240328

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* a · b + c in uint64, or UINT64_MAX when it does not fit */
static uint64_t mul_add(uint64_t a, uint64_t b, uint64_t c)
{
    uint64_t r;
    if (__builtin_mul_overflow(a, b, &r) || __builtin_add_overflow(r, c, &r)) return UINT64_MAX;
    return r;
}

/* GPT-2's parameter count, counted here rather than by gpt2_layout:
 * Vp·C + maxT·C + L·(12·C² + 13·C) + 2·C; UINT64_MAX when it overflows. */
static uint64_t gpt2_params(uint64_t max_t, uint64_t vp, uint64_t layers, uint64_t c)
{
    uint64_t per_layer = mul_add(mul_add(12, c, 13), c, 0);
    uint64_t n = mul_add(layers, per_layer, 0);
    n = mul_add(vp + max_t + 2, c, n); /* vp, max_t < 2^31: no overflow in the sum */
    return n;
}

/* A Llama's (llmc.h's version 103): Vp·C·(1 + untied) + L·(C·((NH + 2KV)·C/NH + C + 3F)
 * + 2C) + C; UINT64_MAX when it overflows. */
static uint64_t llama_params(const int32_t h[11])
{
    uint64_t c = (uint64_t)h[6], nh = (uint64_t)h[5], kv = (uint64_t)h[8], f = (uint64_t)h[9];
    uint64_t qkv = mul_add(nh + 2 * kv, c / nh, 0); /* NH, KV < 2^31: the sum fits */
    uint64_t rows = qkv + c + 3 * f;                 /* each < 2^63: fits, or counts as huge */
    uint64_t per_layer = mul_add(c, rows, 2 * c);
    uint64_t n = mul_add((uint64_t)h[4], per_layer, c);
    return mul_add((uint64_t)h[7] * (1 + (uint64_t)h[10]), c, n);
}

/* The header rules of llmc.h, read independently; *params gets the count. */
static bool model_header_good(const uint8_t *bytes, size_t n, uint64_t *params)
{
    int32_t h[11];
    if (n < LLMC_HEADER_BYTES) return false;
    memcpy(h, bytes, sizeof h);
    if (h[0] != LLMC_MODEL_MAGIC) return false;
    bool llama = h[1] == LLMC_MODEL_VERSION_LLAMA_FP32;
    if (h[1] != LLMC_MODEL_VERSION_FP32 && h[1] != LLMC_MODEL_VERSION_BF16 && !llama) return false;
    if (llama && (h[8] < 1 || h[5] % h[8] != 0 || h[9] < 1 || (h[10] != 0 && h[10] != 1)))
        return false; /* key/value heads dividing heads, an MLP, a 0/1 untied flag */
    for (int i = 2; i < 8; i++)
        if (h[i] < 1) return false;
    if (h[7] < h[3] || h[6] % h[5] != 0) return false; /* padded vocab, heads divide hidden */
    *params = llama ? llama_params(h)
                    : gpt2_params((uint64_t)h[2], (uint64_t)h[7], (uint64_t)h[4], (uint64_t)h[6]);
    if (*params > SIZE_MAX / 16) return false; /* gpt2_layout: weights, grads, 2 moments */
    uint64_t want = mul_add(*params, h[1] == LLMC_MODEL_VERSION_BF16 ? 2 : 4, LLMC_HEADER_BYTES);
    return want == (uint64_t)n;
}

static void check_model(const uint8_t *data, size_t size, const char *path)
{
    struct llmc_model_header h;
    struct plait_error err = {.text = ""};
    uint64_t params = 0;
    bool good = model_header_good(data, size, &params);
    int rc = llmc_read_model_header(path, &h, &err);
    FUZZ_CHECK((rc == 0) == good, "model header %s, the rules say %s: %s",
               rc == 0 ? "accepted" : "refused", good ? "good" : "bad", err.text);
    if (rc) {
        fuzz_check_message(err.text);
        return;
    }
    struct gpt2_config cfg = llmc_model_config(&h);
    struct gpt2_layout layout;
    FUZZ_CHECK(gpt2_layout(&cfg, &layout) == 0 && layout.total == params,
               "layout of %zu parameters, counted %llu", layout.total, (unsigned long long)params);
    if (params * sizeof(float) > MAX_PARAM_BYTES) return;

    float *w = malloc(params * sizeof(float));
    FUZZ_CHECK(w, "out of memory");
    uint32_t crc = 0;
    rc = gpt2_read_llmc(path, &cfg, w, &crc, &err);
    FUZZ_CHECK(rc == 0, "the header was accepted, the checkpoint not: %s", err.text);
    FUZZ_CHECK(crc == crc32c_update(0, data, size), "CRC-32C %08x is not the file's", crc);
    const uint8_t *body = data + LLMC_HEADER_BYTES;
    if (h.version != LLMC_MODEL_VERSION_BF16) {
        FUZZ_CHECK(memcmp(w, body, params * 4) == 0, "fp32 parameters differ from the file");
    } else {
        for (uint64_t i = 0; i < params; i++) {
            uint32_t bits;
            memcpy(&bits, &w[i], 4);
            FUZZ_CHECK(bits >> 16 == (uint32_t)(body[2 * i] | body[2 * i + 1] << 8) &&
                           (bits & 0xFFFF) == 0,
                       "bf16 parameter %llu is not widened from the file", (unsigned long long)i);
        }
    }
    /* a checkpoint that is not the plan's model is refused */
    cfg.layers = h.layers == 1 ? 2 : 1;
    FUZZ_CHECK(gpt2_read_llmc(path, &cfg, w, NULL, &err) != 0,
               "a checkpoint with a different layer count was read");
    fuzz_check_message(err.text);
    free(w);
}

static void check_tokenizer(const uint8_t *data, size_t size, const char *path)
{
    struct tokenizer t;
    struct plait_error err = {.text = ""};
    if (tokenizer_load(&t, path, &err)) {
        fuzz_check_message(err.text);
        FUZZ_CHECK(t.piece == NULL && t.vocab == 0, "a failed load leaves a tokenizer behind");
        return;
    }
    uint32_t h[4];
    FUZZ_CHECK(size >= sizeof h, "a %zu-byte tokenizer was accepted", size);
    memcpy(h, data, sizeof h);
    FUZZ_CHECK(h[0] == TOKENIZER_MAGIC && (h[1] == 1 || h[1] == 2), "magic %u version %u", h[0],
               h[1]);
    FUZZ_CHECK(t.vocab >= 0 && (uint32_t)t.vocab == h[2], "vocab %d, the header says %u", t.vocab,
               h[2]);
    FUZZ_CHECK(t.eot == -1 || (t.eot >= 0 && t.eot < t.vocab),
               "end-of-text token %d is not a token of a %d-token vocabulary", t.eot, t.vocab);
    /* each piece is its length byte's worth of the file, in order */
    size_t at = 1024;
    for (int i = 0; i < t.vocab; i++) {
        FUZZ_CHECK(t.piece[i] && at < size, "token %d", i);
        size_t len = data[at++];
        FUZZ_CHECK(at + len <= size && memcmp(t.piece[i], data + at, len) == 0 &&
                       t.piece[i][len] == '\0',
                   "token %d is not the file's piece", i);
        at += len;
    }
    tokenizer_free(&t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_file(FUZZ_FD, data, size);
    check_model(data, size, path);
    check_tokenizer(data, size, path);
    return 0;
}
