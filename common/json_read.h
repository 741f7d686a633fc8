/* json_read.h — reading the members of a run-directory file's JSON, each
 * error naming the file and the member's path ("run.json: memory.ranks[0].tp:
 * not an integer"). The first error is kept and later reads do nothing, so a
 * format's reader reads every member and checks once. What each file holds
 * is its own module's (runjson.h, metrics.h, runend.h, ckpt_state.h,
 * ckpt_manifest.h). */
#ifndef PLAIT_JSON_READ_H
#define PLAIT_JSON_READ_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/error.h"

struct json_read {
    const char *file; /* what messages name: the path read (with ":LINE" for a line) */
    struct plait_error *err;
    int failed; /* -1 once a read failed (err says which member) */
};

/* The JSON object in file `path` (r->file names it in messages); NULL with
 * r's error when it does not parse or is not an object. Duplicate keys are
 * errors. */
json_t *json_read_file(struct json_read *r, const char *path);

/* Member `key` of object o, whose own path is `at` ("" or NULL: the file's
 * top level). Each is an error when missing or of another type; the
 * value returned then is 0, "" or NULL. */
int64_t json_read_int(struct json_read *r, json_t *o, const char *at, const char *key);
double json_read_number(struct json_read *r, json_t *o, const char *at, const char *key);
bool json_read_bool(struct json_read *r, json_t *o, const char *at, const char *key);
const char *json_read_string(struct json_read *r, json_t *o, const char *at, const char *key);
json_t *json_read_object(struct json_read *r, json_t *o, const char *at, const char *key);
json_t *json_read_array(struct json_read *r, json_t *o, const char *at, const char *key);

/* Whether o has member `key` with a value other than null (an optional one). */
bool json_read_has(json_t *o, const char *key);

/* An error of r's about member `key` of `at` ("...: must be ≥ 0"); returns -1. */
int json_read_fail(struct json_read *r, const char *at, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
