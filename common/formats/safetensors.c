/* safetensors.c — reading a safetensors file's header with every entry
 * checked against the file, its tensors as fp32, and writing fp32 or bf16
 * files (safetensors.h). Which tensors a model has is hf_model.c's. */
#include "common/formats/safetensors.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/checked.h"
#include "common/fsutil.h"
#include "kernels/cpu/bf16.h" // defines: bf16_round (header only, the kernels' rounding)

static const struct {
    const char *name;
    enum st_dtype dtype;
    size_t bytes;
} dtypes[] = {{"F32", ST_F32, 4},   {"BF16", ST_BF16, 2}, {"F16", ST_F16, 2},   {"F64", ST_OTHER, 8},
              {"I64", ST_OTHER, 8}, {"I32", ST_OTHER, 4}, {"I16", ST_OTHER, 2}, {"I8", ST_OTHER, 1},
              {"U8", ST_OTHER, 1},  {"BOOL", ST_OTHER, 1}, {"F8_E4M3", ST_OTHER, 1},
              {"F8_E5M2", ST_OTHER, 1}};

/* A dtype plait writes (F32, BF16): its name and its bytes an element. */
static const char *written_dtype(enum st_dtype dtype, size_t *bytes)
{
    *bytes = dtype == ST_BF16 ? 2 : 4;
    return dtype == ST_BF16 ? "BF16" : "F32";
}

static size_t dtype_bytes(const char *name, enum st_dtype *dtype)
{
    for (size_t i = 0; i < sizeof dtypes / sizeof *dtypes; i++)
        if (strcmp(dtypes[i].name, name) == 0) {
            *dtype = dtypes[i].dtype;
            return dtypes[i].bytes;
        }
    return 0;
}

/* One header entry into t, checked: its dtype known, its shape of non-negative
 * sizes whose bytes are its range's, the range inside the data. */
static int parse_entry(const char *path, const char *name, json_t *v, uint64_t data_at,
                       uint64_t data_bytes, struct st_tensor *t, struct plait_error *err)
{
    json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape"),
           *off = json_object_get(v, "data_offsets");
    if (!json_is_object(v) || !json_is_string(dt) || !json_is_array(sh) || !json_is_array(off) ||
        json_array_size(off) != 2 || !json_is_integer(json_array_get(off, 0)) ||
        !json_is_integer(json_array_get(off, 1)))
        return error_set(err, "%s: tensor %s: needs dtype, shape and two data_offsets", path, name);
    snprintf(t->dtype_name, sizeof t->dtype_name, "%s", json_string_value(dt));
    size_t width = dtype_bytes(t->dtype_name, &t->dtype), elems = 1;
    if (!width) return error_set(err, "%s: tensor %s: unknown dtype %s", path, name, t->dtype_name);
    if (json_array_size(sh) > ST_MAX_DIMS)
        return error_set(err, "%s: tensor %s: %zu dimensions (at most %d)", path, name,
                         json_array_size(sh), ST_MAX_DIMS);
    t->ndim = (int)json_array_size(sh);
    for (int d = 0; d < t->ndim; d++) {
        json_t *x = json_array_get(sh, (size_t)d);
        if (!json_is_integer(x) || json_integer_value(x) < 0 ||
            !ck_mul(elems, (size_t)json_integer_value(x), &elems))
            return error_set(err, "%s: tensor %s: shape[%d] is not a size", path, name, d);
        t->shape[d] = json_integer_value(x);
    }
    json_int_t b = json_integer_value(json_array_get(off, 0)),
               e = json_integer_value(json_array_get(off, 1));
    size_t bytes;
    if (b < 0 || e < b || (uint64_t)e > data_bytes)
        return error_set(err, "%s: tensor %s: data_offsets [%lld, %lld] outside the %llu bytes "
                              "of data",
                         path, name, (long long)b, (long long)e, (unsigned long long)data_bytes);
    if (!ck_mul(elems, width, &bytes) || bytes != (uint64_t)(e - b))
        return error_set(err, "%s: tensor %s: %lld bytes for %zu elements of %s", path, name,
                         (long long)(e - b), elems, t->dtype_name);
    t->begin = data_at + (uint64_t)b;
    t->end = data_at + (uint64_t)e;
    return (t->name = strdup(name)) ? 0 : error_set(err, "out of memory");
}

/* The header's JSON: its length read and checked against the file first. */
static json_t *read_header(struct st_file *st, uint64_t *data_at, uint64_t *data_bytes,
                           struct plait_error *err)
{
    struct stat sb;
    unsigned char len8[8];
    if (fstat(fileno(st->f), &sb) != 0) return error_errno(err, "%s", st->path), NULL;
    if (fread(len8, 1, 8, st->f) != 8)
        return error_set(err, "%s: too short for a safetensors header", st->path), NULL;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | len8[i];
    uint64_t size = (uint64_t)sb.st_size;
    if (n > ST_MAX_HEADER || n > size - 8)
        return error_set(err, "%s: a header of %llu bytes in a file of %llu", st->path,
                         (unsigned long long)n, (unsigned long long)size),
               NULL;
    char *text = malloc(n + 1);
    if (!text) return error_set(err, "out of memory"), NULL;
    if (fread(text, 1, n, st->f) != n) {
        free(text);
        return error_set(err, "%s: short read of the header", st->path), NULL;
    }
    json_error_t jerr;
    json_t *h = json_loadb(text, n, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    if (!json_is_object(h)) {
        json_decref(h);
        return error_set(err, "%s: header: %s", st->path, h ? "not an object" : jerr.text), NULL;
    }
    *data_at = 8 + n;
    *data_bytes = size - 8 - n;
    return h;
}

static int by_begin(const void *a, const void *b)
{
    const struct st_tensor *x = *(const struct st_tensor *const *)a,
                           *y = *(const struct st_tensor *const *)b;
    return (x->begin > y->begin) - (x->begin < y->begin);
}

/* No two tensors share a byte (empty ones hold none). */
static int check_overlaps(const struct st_file *st, struct plait_error *err)
{
    const struct st_tensor **by = malloc((size_t)st->n * sizeof *by + 1);
    if (!by) return error_set(err, "out of memory");
    int m = 0;
    for (int i = 0; i < st->n; i++)
        if (st->tensors[i].end > st->tensors[i].begin) by[m++] = &st->tensors[i];
    qsort(by, (size_t)m, sizeof *by, by_begin);
    int rc = 0;
    for (int i = 1; i < m && !rc; i++)
        if (by[i]->begin < by[i - 1]->end)
            rc = error_set(err, "%s: tensor %s: its bytes overlap tensor %s's", st->path,
                           by[i]->name, by[i - 1]->name);
    free(by);
    return rc;
}

int st_open(struct st_file *st, const char *path, struct plait_error *err)
{
    memset(st, 0, sizeof *st);
    if (!(st->path = strdup(path))) return error_set(err, "out of memory");
    if (!(st->f = fs_fopen_regular(path, err))) return st_close(st), -1;
    uint64_t data_at, data_bytes;
    json_t *h = read_header(st, &data_at, &data_bytes, err);
    if (!h) return st_close(st), -1;
    st->tensors = calloc(json_object_size(h) + 1, sizeof *st->tensors);
    const char *name;
    json_t *v;
    int rc = st->tensors ? 0 : error_set(err, "out of memory");
    json_object_foreach(h, name, v)
    {
        if (rc || strcmp(name, "__metadata__") == 0) continue;
        rc = parse_entry(path, name, v, data_at, data_bytes, &st->tensors[st->n], err);
        if (rc == 0) st->n++;
    }
    json_decref(h);
    if (!rc) rc = check_overlaps(st, err);
    if (rc) st_close(st);
    return rc;
}

void st_close(struct st_file *st)
{
    for (int i = 0; i < st->n; i++) free(st->tensors[i].name);
    free(st->tensors);
    if (st->f) fclose(st->f);
    free(st->path);
    memset(st, 0, sizeof *st);
}

const struct st_tensor *st_find(const struct st_file *st, const char *name)
{
    for (int i = 0; i < st->n; i++)
        if (strcmp(st->tensors[i].name, name) == 0) return &st->tensors[i];
    return NULL;
}

size_t st_elems(const struct st_tensor *t)
{
    size_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d]; /* checked by st_open */
    return n;
}

/* IEEE half to float, exactly (subnormals, infinities and NaNs too) */
static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | man << 13;
    } else if (exp != 0) {
        bits = sign | (exp + 112) << 23 | man << 13;
    } else if (man == 0) {
        bits = sign;
    } else { /* subnormal: normalise */
        int e = -1;
        do {
            man <<= 1;
            e++;
        } while (!(man & 0x400));
        bits = sign | (uint32_t)(112 - e) << 23 | (man & 0x3ff) << 13;
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

int st_read_f32(struct st_file *st, const struct st_tensor *t, float *out, struct plait_error *err)
{
    if (t->dtype == ST_OTHER)
        return error_set(err, "%s: tensor %s is %s (plait reads F32, BF16 and F16)", st->path,
                         t->name, t->dtype_name);
    size_t n = st_elems(t), width = t->dtype == ST_F32 ? 4 : 2;
    if (fseeko(st->f, (off_t)t->begin, SEEK_SET) != 0) return error_errno(err, "%s", st->path);
    if (t->dtype == ST_F32)
        return fread(out, 4, n, st->f) == n ? 0 : error_set(err, "%s: short read of %s", st->path,
                                                            t->name);
    /* 16-bit: read into the upper half of out, widen upwards from the front */
    uint16_t *h = (uint16_t *)(void *)out + n;
    if (fread(h, width, n, st->f) != n)
        return error_set(err, "%s: short read of %s", st->path, t->name);
    for (size_t i = 0; i < n; i++) {
        if (t->dtype == ST_BF16) {
            uint32_t bits = (uint32_t)h[i] << 16;
            memcpy(&out[i], &bits, sizeof bits);
        } else {
            out[i] = half_to_float(h[i]);
        }
    }
    return 0;
}

static size_t out_elems(const struct st_out *t)
{
    size_t elems = 1;
    for (int d = 0; d < t->ndim; d++) elems *= (size_t)t->shape[d];
    return elems;
}

/* The header: {name: {dtype, shape, data_offsets}} in the order given,
 * padded with spaces to a multiple of 8 bytes. */
static char *header_of(const struct st_out *t, int n, uint64_t *data_bytes)
{
    json_t *h = json_object();
    uint64_t at = 0;
    for (int i = 0; i < n; i++) {
        json_t *shape = json_array();
        for (int d = 0; d < t[i].ndim; d++)
            json_array_append_new(shape, json_integer(t[i].shape[d]));
        size_t width;
        const char *dtype = written_dtype(t[i].dtype, &width);
        uint64_t bytes = out_elems(&t[i]) * width;
        json_object_set_new(h, t[i].name,
                            json_pack("{s:s,s:o,s:[I,I]}", "dtype", dtype, "shape", shape,
                                      "data_offsets", (json_int_t)at, (json_int_t)(at + bytes)));
        at += bytes;
    }
    char *text = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(h);
    *data_bytes = at;
    return text;
}

int st_write(const char *path, const struct st_out *t, int n, struct plait_error *err)
{
    uint64_t data_bytes;
    char *text = header_of(t, n, &data_bytes);
    if (!text) return error_set(err, "out of memory");
    size_t len = strlen(text), padded = (len + 7) / 8 * 8, total = 8 + padded + data_bytes;
    unsigned char *buf = malloc(total);
    if (!buf) {
        free(text);
        return error_set(err, "%s: out of memory for %zu bytes", path, total);
    }
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    memcpy(buf + 8, text, len);
    memset(buf + 8 + len, ' ', padded - len);
    free(text);
    unsigned char *at = buf + 8 + padded;
    for (int i = 0; i < n; i++) {
        size_t elems = out_elems(&t[i]), width;
        written_dtype(t[i].dtype, &width);
        if (t[i].dtype == ST_BF16)
            for (size_t k = 0; k < elems; k++) {
                uint16_t b = bf16_round(t[i].data[k]);
                at[2 * k] = (unsigned char)b, at[2 * k + 1] = (unsigned char)(b >> 8);
            }
        else
            memcpy(at, t[i].data, 4 * elems);
        at += elems * width;
    }
    int rc = fs_write_atomic(path, buf, total, err);
    free(buf);
    return rc;
}
