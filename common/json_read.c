/* json_read.c — a run-directory file's JSON members read one by one, every
 * error naming the file and the member (json_read.h). Not here: what any
 * file holds. */
#include "common/json_read.h"

#include <stdarg.h>
#include <stdio.h>

json_t *json_read_file(struct json_read *r, const char *path)
{
    json_error_t jerr;
    json_t *j = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (!j) {
        r->failed = error_set(r->err, "%s: line %d: %s", r->file, jerr.line, jerr.text);
        return NULL;
    }
    if (!json_is_object(j)) {
        json_decref(j);
        r->failed = error_set(r->err, "%s: not a JSON object", r->file);
        return NULL;
    }
    return j;
}

int json_read_fail(struct json_read *r, const char *at, const char *key, const char *fmt, ...)
{
    if (r->failed) return -1;
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    bool top = !at || !*at;
    r->failed =
        error_set(r->err, "%s: %s%s%s: %s", r->file, top ? "" : at, top ? "" : ".", key, why);
    return -1;
}

static const char *type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a real number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    default:
        return "null";
    }
}

/* Whether v is of the type `want` names: JSON_REAL a number (an integer too), JSON_TRUE a
 * boolean. */
static bool of_type(const json_t *v, json_type want)
{
    if (want == JSON_REAL) return json_is_number(v);
    if (want == JSON_TRUE) return json_is_boolean(v);
    return json_typeof(v) == want;
}

/* Member key of o when it is of type want (of_type), else NULL with r's error. */
static json_t *member(struct json_read *r, json_t *o, const char *at, const char *key,
                      json_type want, const char *want_name)
{
    if (r->failed) return NULL;
    json_t *v = json_object_get(o, key);
    if (!v) {
        json_read_fail(r, at, key, "missing");
        return NULL;
    }
    if (!of_type(v, want)) {
        json_read_fail(r, at, key, "%s, not %s", type_name(v), want_name);
        return NULL;
    }
    return v;
}

int64_t json_read_int(struct json_read *r, json_t *o, const char *at, const char *key)
{
    json_t *v = member(r, o, at, key, JSON_INTEGER, "an integer");
    return v ? (int64_t)json_integer_value(v) : 0;
}

double json_read_number(struct json_read *r, json_t *o, const char *at, const char *key)
{
    json_t *v = member(r, o, at, key, JSON_REAL, "a number");
    return v ? json_number_value(v) : 0;
}

bool json_read_bool(struct json_read *r, json_t *o, const char *at, const char *key)
{
    json_t *v = member(r, o, at, key, JSON_TRUE, "a boolean");
    return v && json_is_true(v);
}

const char *json_read_string(struct json_read *r, json_t *o, const char *at, const char *key)
{
    json_t *v = member(r, o, at, key, JSON_STRING, "a string");
    return v ? json_string_value(v) : "";
}

json_t *json_read_object(struct json_read *r, json_t *o, const char *at, const char *key)
{
    return member(r, o, at, key, JSON_OBJECT, "an object");
}

json_t *json_read_array(struct json_read *r, json_t *o, const char *at, const char *key)
{
    return member(r, o, at, key, JSON_ARRAY, "an array");
}

bool json_read_has(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return v && !json_is_null(v);
}
