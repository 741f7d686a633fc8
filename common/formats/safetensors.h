/* safetensors.h — Hugging Face's weights format: an 8-byte little-endian
 * header length, a JSON header naming each tensor's dtype, shape and byte
 * range in the data that follows ("__metadata__" aside), then the data.
 * Every length, shape and offset of the header is checked against the file
 * before a byte of data is read (no two tensors may share a byte): a
 * hostile header is an error naming the file and the tensor, never a crash
 * or an allocation of its size. */
#ifndef PLAIT_FORMATS_SAFETENSORS_H
#define PLAIT_FORMATS_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/error.h"

#define ST_MAX_DIMS 8
#define ST_MAX_HEADER (100u << 20) /* bytes of JSON a file may have (safetensors' own cap) */

enum st_dtype { ST_F32, ST_BF16, ST_F16, ST_OTHER };

struct st_tensor {
    char *name;
    enum st_dtype dtype;
    char dtype_name[16];
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    uint64_t begin, end; /* its bytes in the file (absolute offsets) */
};

struct st_file {
    char *path;
    FILE *f;
    struct st_tensor *tensors;
    int n;
};

/* Opens and checks a file's header: -1 with err naming the file (and the
 * tensor) when any entry is malformed or outside the file. */
int st_open(struct st_file *st, const char *path, struct plait_error *err);
void st_close(struct st_file *st);

/* The tensor of that name, NULL when the file has none. */
const struct st_tensor *st_find(const struct st_file *st, const char *name);

/* Its elements (the product of its shape). */
size_t st_elems(const struct st_tensor *t);

/* Its elements as fp32 into out (st_elems of them): F32 as they are, BF16
 * and F16 widened exactly; another dtype is an error naming it. */
int st_read_f32(struct st_file *st, const struct st_tensor *t, float *out,
                struct plait_error *err);

/* One tensor to write: fp32 data of the shape, stored as dtype (ST_F32, or
 * ST_BF16: rounded to nearest even; any other is written as ST_F32). */
struct st_out {
    const char *name;
    const float *data;
    int ndim;
    int64_t shape[4];
    enum st_dtype dtype;
};

/* Writes the tensors as one safetensors file, through a temporary name,
 * fsynced and renamed into place. */
int st_write(const char *path, const struct st_out *t, int n, struct plait_error *err);

#endif
