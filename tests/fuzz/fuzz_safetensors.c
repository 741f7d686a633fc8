/* fuzz_safetensors.c — libFuzzer target for Hugging Face weight files: one
 * input file goes to st_open (common/formats/safetensors.h) and, accepted,
 * each of its tensors of at most 16 MB to st_read_f32. Checks the header
 * rules against an independent reading of the bytes: a length within the
 * file, and for each tensor a range inside the data whose size is its
 * shape's elements times its dtype's width, sharing no byte with another;
 * F32 read as the file's bytes. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/formats/safetensors.h"
#include "tests/fuzz/harness.h"

#define MAX_TENSOR_BYTES (16u << 20)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static size_t width_of(const char *dtype)
{
    static const struct {
        const char *name;
        size_t bytes;
    } w[] = {{"F32", 4}, {"BF16", 2}, {"F16", 2}, {"F64", 8}, {"I64", 8}, {"I32", 4},
             {"I16", 2}, {"I8", 1},   {"U8", 1},  {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
    for (size_t i = 0; i < sizeof w / sizeof *w; i++)
        if (strcmp(w[i].name, dtype) == 0) return w[i].bytes;
    return 0;
}

/* What an accepted file promises of tensor t. */
static void check_tensor(struct st_file *st, const struct st_tensor *t, const uint8_t *data,
                         size_t size, uint64_t data_at)
{
    size_t width = width_of(t->dtype_name), elems = 1;
    FUZZ_CHECK(width > 0, "tensor %s of unknown dtype %s accepted", t->name, t->dtype_name);
    for (int d = 0; d < t->ndim; d++) {
        FUZZ_CHECK(t->shape[d] >= 0, "tensor %s: shape[%d] = %lld", t->name, d,
                   (long long)t->shape[d]);
        FUZZ_CHECK(!__builtin_mul_overflow(elems, (size_t)t->shape[d], &elems),
                   "tensor %s: its shape overflows", t->name);
    }
    FUZZ_CHECK(st_elems(t) == elems, "tensor %s: %zu elements, counted %zu", t->name,
               st_elems(t), elems);
    FUZZ_CHECK(t->begin >= data_at && t->begin <= t->end && t->end <= size,
               "tensor %s: bytes [%llu, %llu) outside the data [%llu, %zu)", t->name,
               (unsigned long long)t->begin, (unsigned long long)t->end,
               (unsigned long long)data_at, size);
    FUZZ_CHECK(t->end - t->begin == (uint64_t)elems * width, "tensor %s: %llu bytes for %zu x %zu",
               t->name, (unsigned long long)(t->end - t->begin), elems, width);
    if (elems * 4 > MAX_TENSOR_BYTES) return;
    float *out = malloc(elems * 4 + 4);
    FUZZ_CHECK(out, "out of memory");
    struct plait_error err = {.text = ""};
    int rc = st_read_f32(st, t, out, &err);
    bool readable = strcmp(t->dtype_name, "F32") == 0 || strcmp(t->dtype_name, "BF16") == 0 ||
                    strcmp(t->dtype_name, "F16") == 0;
    FUZZ_CHECK((rc == 0) == readable, "tensor %s (%s): read %s", t->name, t->dtype_name,
               rc == 0 ? "accepted" : err.text);
    if (rc) fuzz_check_message(err.text);
    if (rc == 0 && width == 4)
        FUZZ_CHECK(memcmp(out, data + t->begin, elems * 4) == 0, "tensor %s: F32 not the file's",
                   t->name);
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_file(FUZZ_FD, data, size);
    struct st_file st;
    struct plait_error err = {.text = ""};
    if (st_open(&st, path, &err)) {
        fuzz_check_message(err.text);
        return 0;
    }
    uint64_t n = 0;
    FUZZ_CHECK(size >= 8, "a %zu-byte file was accepted", size);
    for (int i = 7; i >= 0; i--) n = n << 8 | data[i];
    FUZZ_CHECK(n <= ST_MAX_HEADER && n <= size - 8, "a header of %llu bytes in %zu accepted",
               (unsigned long long)n, size);
    for (int i = 0; i < st.n; i++) check_tensor(&st, &st.tensors[i], data, size, 8 + n);
    for (int i = 0; i < st.n && st.n <= 1000; i++)
        for (int j = 0; j < i; j++) {
            const struct st_tensor *a = &st.tensors[i], *b = &st.tensors[j];
            FUZZ_CHECK(a->begin == a->end || b->begin == b->end || a->end <= b->begin ||
                           b->end <= a->begin,
                       "tensors %s and %s share bytes", a->name, b->name);
        }
    st_close(&st);
    return 0;
}
