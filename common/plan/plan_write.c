/* plan_write.c — a loaded plan back to JSON (plan_to_json: every field, defaults filled,
 * each real as the shortest text that reads back as itself), and two plans compared field
 * by field through that text (plan_diff), with what may differ when a run resumes
 * (plan_resumable). Reading a plan is plan.c's. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/plan/plan_schema.h"

/* ---- writing: the plan as jansson values, dumped by jansson ------------------------------ */

static int get_int(const struct plan *p, size_t offset)
{
    int v;
    memcpy(&v, (const char *)p + offset, sizeof v);
    return v;
}

/* A scalar field's value (NULL: out of memory, or a path that is not UTF-8). */
static json_t *value_json(const struct field *f, const struct plan *p)
{
    const char *at = (const char *)p + f->offset;
    switch (f->kind) {
    case K_INT:
        if ((f->flags & AUTO_OK) && *(const int *)at == PLAN_AUTO) return json_string("auto");
        return json_integer(*(const int *)at);
    case K_U64:
        return json_integer((json_int_t) * (const uint64_t *)at); /* at most LLONG_MAX */
    case K_INTS: {
        const struct plan_ints *list = (const struct plan_ints *)at;
        json_t *a = list->n ? json_array() : json_null();
        for (int k = 0; a && k < list->n; k++)
            if (json_array_append_new(a, json_integer(list->v[k]))) {
                json_decref(a);
                return NULL;
            }
        return a;
    }
    case K_REAL:
        return json_real(*(const double *)at);
    case K_BOOL:
        return json_boolean(*(const bool *)at);
    case K_STRING:
    case K_PATH:
        return *(char *const *)at ? json_string(*(char *const *)at) : json_null();
    case K_ENUM: {
        int v = get_int(p, f->offset), n = 0;
        while (f->names[n]) n++;
        return v >= 0 && v < n ? json_string(f->names[v]) : json_null();
    }
    case K_SECTION:
        break;
    }
    return json_null();
}

/* Whether f is an optional section the plan does not have (not written back). */
static bool absent_section(const struct field *f, const struct plan *p)
{
    return f->kind == K_SECTION && (f->flags & OPTIONAL) &&
           !*(const bool *)((const char *)p + f->offset);
}

static json_t *object_json(const struct field *fields, const struct plan *p)
{
    json_t *o = json_object();
    for (const struct field *f = fields; o && f->name; f++)
        if (!absent_section(f, p) &&
            json_object_set_new(
                o, f->name, f->kind == K_SECTION ? object_json(f->fields, p) : value_json(f, p))) {
            json_decref(o);
            return NULL;
        }
    return o;
}

/* The shortest text that reads back as x, with a '.' or an exponent so it reads as a real. */
static void shortest_real(char buf[40], double x)
{
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, 40, "%.*g", prec, x);
        if (strtod(buf, NULL) == x) break;
    }
    char *e = strchr(buf, 'e'); /* 1e-08 -> 1e-8, 1e+20 -> 1e20 */
    if (e) {
        char *digits = e + 1, *from = e + 1;
        if (*from == '-')
            digits++, from++;
        else if (*from == '+')
            from++;
        while (*from == '0' && from[1]) from++;
        memmove(digits, from, strlen(from) + 1);
    }
    if (!strpbrk(buf, ".eEn")) strcat(buf, ".0");
}

/* jansson prints every real of a document at one precision (17 digits: 0.0006 as
 * 0.00059999999999999995, 0.1 as 0.10000000000000001); plan.json is read by people, so each
 * real of jansson's text is rewritten as the shortest text that reads back as itself. The
 * text is JSON: a number is a token outside the strings, a real one with '.' or an exponent. */
static char *shorten_reals(char *json)
{
    size_t n = strlen(json), len = 0;
    char *out = json ? malloc(2 * n + 1) : NULL; /* a shortened real is never longer */
    for (size_t i = 0; out && i < n;) {
        if (json[i] == '"') { /* a string, to its closing quote */
            size_t j = i + 1;
            while (j < n && json[j] != '"') j += json[j] == '\\' ? 2 : 1;
            memcpy(out + len, json + i, j + 1 - i);
            len += j + 1 - i, i = j + 1;
        } else if (json[i] == '-' || (json[i] >= '0' && json[i] <= '9')) {
            size_t j = i + strspn(json + i, "-+0123456789.eE");
            char token[64], real[40];
            snprintf(token, sizeof token, "%.*s", (int)(j - i), json + i);
            bool is_real = strpbrk(token, ".eE") && j - i < sizeof token;
            if (is_real) shortest_real(real, strtod(token, NULL));
            const char *put = is_real ? real : json + i;
            size_t k = is_real ? strlen(real) : j - i;
            memcpy(out + len, put, k);
            len += k, i = j;
        } else {
            out[len++] = json[i++];
        }
    }
    if (out) out[len] = '\0';
    free(json);
    return out;
}

/* A scalar field's value as plan_to_json writes it. */
static char *value_text(const struct field *f, const struct plan *p)
{
    json_t *v = value_json(f, p);
    char *text = v ? json_dumps(v, JSON_ENCODE_ANY | JSON_REAL_PRECISION(17)) : NULL;
    json_decref(v);
    return text ? shorten_reals(text) : NULL;
}

/* The plan's text with the given jansson flags (indented or compact). */
static char *plan_text(const struct plan *plan, size_t flags)
{
    if (!plan) return NULL;
    json_t *root = object_json(plan_root_fields, plan);
    char *text =
        root ? json_dumps(root, flags | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17)) : NULL;
    json_decref(root);
    return text ? shorten_reals(text) : NULL;
}

/* Appends the differences under fields (at path) to out[*n..max). */
static void diff_fields(const struct field *fields, const char *path, const struct plan *a,
                        const struct plan *b, struct plan_change *out, int max, int *n)
{
    for (const struct field *f = fields; f->name; f++) {
        char fpath[sizeof out->path];
        snprintf(fpath, sizeof fpath, "%s%s%s", path, *path ? "." : "", f->name);
        if (f->kind == K_SECTION) {
            diff_fields(f->fields, fpath, a, b, out, max, n);
            continue;
        }
        char *ta = value_text(f, a), *tb = value_text(f, b);
        bool differ = !ta || !tb || strcmp(ta, tb) != 0;
        if (differ && *n < max) {
            struct plan_change *c = &out[*n];
            snprintf(c->path, sizeof c->path, "%s", fpath);
            snprintf(c->before, sizeof c->before, "%s", ta ? ta : "?");
            snprintf(c->after, sizeof c->after, "%s", tb ? tb : "?");
            c->may_change = (f->flags & MAY_CHANGE) != 0;
        }
        if (differ) (*n)++;
        free(ta);
        free(tb);
    }
}

int plan_diff(const struct plan *before, const struct plan *after, struct plan_change *out, int max)
{
    int n = 0;
    diff_fields(plan_root_fields, "", before, after, out, max, &n);
    return n;
}

char *plan_to_json_line(const struct plan *plan)
{
    return plan_text(plan, JSON_COMPACT);
}

char *plan_to_json(const struct plan *plan)
{
    char *text = plan_text(plan, JSON_INDENT(2)), *line = NULL;
    if (text && (line = realloc(text, strlen(text) + 2))) strcat(line, "\n");
    if (!line) free(text);
    return line;
}

int plan_resumable(const struct plan *before, const struct plan *after, char *notes,
                   size_t notes_bytes, struct plait_error *err)
{
    enum { MAX = 64 };
    struct plan_change ch[MAX];
    int n = plan_diff(before, after, ch, MAX), refused = 0;
    /* micro-batches per data-parallel rank may change with dp, if the global
     * batch stays: the same windows make each step (data_next_of) */
    const struct plan_parallel *pb = &before->parallel, *pa = &after->parallel;
    bool known = pb->dp != PLAN_AUTO && pa->dp != PLAN_AUTO;
    int64_t global_before = (int64_t)before->batch.micro_batch * before->batch.grad_accum * pb->dp,
            global_after = (int64_t)after->batch.micro_batch * after->batch.grad_accum * pa->dp;
    for (int i = 0; i < n && i < MAX; i++)
        if (!strcmp(ch[i].path, "batch.grad_accum") && known && global_before == global_after)
            ch[i].may_change = true;
    char list[900] = "";
    size_t len = 0;
    if (notes_bytes) notes[0] = '\0';
    for (int pass = 0; pass < 2; pass++) { /* first what may not change, then what may */
        len = 0;
        list[0] = '\0';
        for (int i = 0; i < n && i < MAX; i++) {
            if (ch[i].may_change != (pass == 1)) continue;
            refused += pass == 0;
            int k = snprintf(list + len, sizeof list - len, "%s%s %s -> %s", len ? ", " : "",
                             ch[i].path, ch[i].before, ch[i].after);
            if (k < 0 || (size_t)k >= sizeof list - len) break;
            len += (size_t)k;
        }
        if (pass == 0 && refused) return error_set(err, "%s", list);
        if (pass == 1 && notes_bytes) snprintf(notes, notes_bytes, "%s", list);
    }
    /* dp alone may change the global batch: the steps that follow read more or
     * fewer sequences than the checkpoint's run did, and the user should know */
    if (known && global_before != global_after && notes_bytes) {
        int64_t per = (int64_t)after->batch.micro_batch * pa->dp;
        char keep[64] = "";
        if (global_before % per == 0)
            snprintf(keep, sizeof keep, "; batch.grad_accum %lld keeps it",
                     (long long)(global_before / per));
        size_t used = strlen(notes);
        snprintf(notes + used, notes_bytes - used,
                 "%sthe global batch (micro_batch × grad_accum × dp) %lld -> %lld sequences a "
                 "step%s",
                 used ? "; " : "", (long long)global_before, (long long)global_after, keep);
    }
    return 0;
}
