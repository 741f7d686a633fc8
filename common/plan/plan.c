/* plan.c — plan.json's strict loader: the JSON text, then --set overrides, then types,
 * ranges and defaults field by field against the schema (plan_schema.c), then model.init
 * and the checks between fields, which are plan_rules.c's. jansson parses; where each
 * value came from, so that messages can say `plan.json:7: optimizer.lr`, is
 * plan_origin.c's; writing the plan back is plan_write.c's. What the fields mean at run
 * time (schedules, sharding) lives in runtime/. */
#include "common/plan/plan.h"
#include "common/plan/plan_check.h"

#include <ctype.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <jansson.h>

#include "common/plan/plan_origin.h"
#include "common/plan/plan_schema.h"

/* ---- keys: the schema's, and what is said of one it does not have ------------------------ */

static const struct field *find_field(const struct field *fields, const char *name)
{
    for (const struct field *f = fields; f->name; f++)
        if (strcmp(f->name, name) == 0) return f;
    return NULL;
}

/* Levenshtein distance, ignoring case; INT_MAX for long strings. */
static int edit_distance(const char *a, const char *b)
{
    enum { MAX = 64 };
    size_t na = strlen(a), nb = strlen(b);
    if (na > MAX || nb > MAX) return INT_MAX;
    int prev[MAX + 1], cur[MAX + 1];
    for (size_t j = 0; j <= nb; j++) prev[j] = (int)j;
    for (size_t i = 1; i <= na; i++) {
        cur[0] = (int)i;
        for (size_t j = 1; j <= nb; j++) {
            int sub = prev[j - 1] +
                      (tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]));
            int del = prev[j] + 1, ins = cur[j - 1] + 1;
            cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
        memcpy(prev, cur, sizeof cur);
    }
    return prev[nb];
}

static void append(char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void append(char *buf, size_t n, const char *fmt, ...)
{
    size_t len = strlen(buf);
    if (len + 1 >= n) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + len, n - len, fmt, ap);
    va_end(ap);
}

/* What to tell about an unknown key in the object at `here` whose keys are `fields`:
 * a near miss, the same name in another section, or the allowed keys. */
static void unknown_key_hint(const struct field *fields, const char *here, const char *key,
                             char *buf, size_t n)
{
    const struct field *best = NULL;
    int best_d = INT_MAX;
    for (const struct field *f = fields; f->name; f++) {
        int d = edit_distance(key, f->name), limit = strlen(f->name) <= 3 ? 1 : 2;
        if (d <= limit && d < best_d) best = f, best_d = d;
    }
    buf[0] = '\0';
    if (best) {
        append(buf, n, "did you mean \"%s\"?", best->name);
        return;
    }
    int found = 0;
    for (const struct field *r = plan_root_fields; r->name; r++) {
        if (*here && strcasecmp(r->name, key) == 0)
            append(buf, n, "%s\"%s\"", found++ ? " or " : "did you mean ", r->name);
        if (r->kind != K_SECTION || strcmp(r->name, here) == 0) continue;
        for (const struct field *f = r->fields; f->name; f++)
            if (strcasecmp(f->name, key) == 0)
                append(buf, n, "%s\"%s.%s\"", found++ ? " or " : "did you mean ", r->name, f->name);
    }
    if (found) {
        append(buf, n, "?");
        return;
    }
    append(buf, n, "allowed:");
    for (const struct field *f = fields; f->name; f++)
        append(buf, n, "%s \"%s\"", f == fields ? "" : ",", f->name);
}

static int top_level_error(struct plan_ctx *c, json_t *root)
{
    char got[PLAN_GOT_MAX];
    return plan_fail(c, "", "the top level must be an object (got %s)", plan_got_text(c, "", root, got));
}

/* ---- overrides --------------------------------------------------------------------------- */

/* Checks path against the schema; returns the number of keys in it, or -1. */
static int check_override_path(struct plan_ctx *c, int i, const char *path)
{
    const struct field *fields = plan_root_fields;
    const char *parent = ""; /* the section the current key is in; "" = top level */
    size_t at = 0;           /* where the current key starts in path */
    for (int depth = 1;; depth++) {
        size_t n = strcspn(path + at, "."), end = at + n; /* path[0, end) ends with this key */
        char *key = plan_dup_n(path + at, n), msg[640] = "";
        if (!key) return plan_out_of_memory(c);
        const struct field *f = find_field(fields, key);
        if (n == 0) {
            snprintf(msg, sizeof msg, "empty key in the path");
            end = strlen(path);
        } else if (!f) {
            char hint[600];
            unknown_key_hint(fields, parent, key, hint, sizeof hint);
            snprintf(msg, sizeof msg, "unknown key (%s)", hint);
        } else if (path[end] == '.' && f->kind != K_SECTION) {
            snprintf(msg, sizeof msg, "unknown key (%.*s is not an object)", (int)end, path);
            end += 1 + strcspn(path + end + 1, ".");
        }
        free(key);
        if (msg[0]) {
            char *where = plan_dup_n(path, end);
            if (!where) return plan_out_of_memory(c);
            plan_report(c, i, 0, where, msg);
            free(where);
            return -1;
        }
        if (path[end] == '\0') return depth;
        parent = f->name;
        fields = f->fields;
        at = end + 1;
    }
}

/* s as a JSON string, by jansson ("\n" as two characters); NULL: out of memory, or s is not
 * UTF-8 */
char *plan_quote(const char *s)
{
    json_t *j = json_string(s);
    char *text = j ? json_dumps(j, JSON_ENCODE_ANY) : NULL;
    json_decref(j);
    return text;
}

/* Applies overrides[i] ("dot.path=value") to root, creating objects on the way. */
static int apply_override(struct plan_ctx *c, json_t *root, int i)
{
    const char *ovr = c->overrides[i];
    const char *eq = ovr ? strchr(ovr, '=') : NULL;
    if (!eq) return plan_report(c, i, 0, "", "expected dot.path=value");
    char *path = plan_dup_n(ovr, (size_t)(eq - ovr)), *prefix = NULL;
    const char *text = eq + 1;
    json_t *value = NULL;
    if (!path) return plan_out_of_memory(c);
    int depth = check_override_path(c, i, path);
    if (depth < 0) goto fail;
    if (!json_is_object(root)) {
        top_level_error(c, root);
        goto fail;
    }

    json_error_t jerr;
    value = json_loads(text, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &jerr);
    bool is_json = value != NULL;
    if (!value && !(value = json_string(text))) {
        plan_report(c, i, 0, path, "the value is not valid UTF-8");
        goto fail;
    }

    json_t *obj = root;
    prefix = plan_dup_n(path, strlen(path));
    if (!prefix) goto oom;
    for (char *p = prefix, *dot; (dot = strchr(p, '.')); p = dot + 1) {
        *dot = '\0'; /* prefix is now the path of the object on the way */
        json_t *child = json_object_get(obj, p);
        if (!child || json_is_null(child)) {
            child = json_object();
            if (!child || json_object_set_new(obj, p, child)) goto oom;
            plan_kill_entries(c, prefix);
            if (plan_add_entry(c, prefix, i, 0, NULL, 0)) goto fail;
        } else if (!json_is_object(child)) {
            char got[PLAN_GOT_MAX];
            plan_fail(c, prefix, "must be an object (got %s)", plan_got_text(c, prefix, child, got));
            goto fail;
        }
        obj = child;
        *dot = '.';
    }
    const char *last = strrchr(path, '.') ? strrchr(path, '.') + 1 : path;
    plan_kill_entries(c, path);
    if (json_object_set_new(obj, last, value)) {
        value = NULL;
        goto oom;
    }
    value = NULL;
    if (is_json) {
        if (plan_scan(c, text, i, path, depth)) goto fail;
    } else {
        char *quoted = plan_quote(text);
        if (!quoted) goto oom;
        int rc = plan_add_entry(c, path, i, 0, quoted, strlen(quoted));
        free(quoted);
        if (rc) goto fail;
    }
    free(prefix);
    free(path);
    return 0;
oom:
    plan_out_of_memory(c);
fail:
    json_decref(value);
    free(prefix);
    free(path);
    return -1;
}

/* ---- decoding ---------------------------------------------------------------------------- */

static void put_int(struct plan *p, size_t offset, int v)
{
    memcpy((char *)p + offset, &v, sizeof v);
}

static const char *ctx_cwd(struct plan_ctx *c)
{
    if (!c->cwd && !(c->cwd = getcwd(NULL, 0)))
        error_errno(c->err, "%s: cannot resolve relative paths: getcwd", c->source);
    return c->cwd;
}

/* rel against base (absolute); an absolute rel is kept. "./" prefixes are dropped. */
static char *resolve(const char *base, const char *rel)
{
    if (rel[0] == '/') return plan_dup_n(rel, strlen(rel));
    while (rel[0] == '.' && rel[1] == '/')
        for (rel += 2; *rel == '/';) rel++;
    if (rel[0] == '\0' || strcmp(rel, ".") == 0) return plan_dup_n(base, strlen(base));
    size_t nb = strlen(base), nr = strlen(rel);
    while (nb > 1 && base[nb - 1] == '/') nb--;
    char *s = malloc(nb + nr + 2);
    if (!s) return NULL;
    memcpy(s, base, nb);
    size_t n = nb;
    if (base[nb - 1] != '/') s[n++] = '/';
    memcpy(s + n, rel, nr + 1);
    return s;
}

static const char *ctx_base_dir(struct plan_ctx *c)
{
    if (c->base_dir) return c->base_dir;
    if (c->base_arg && c->base_arg[0] == '/') {
        c->base_dir = plan_dup_n(c->base_arg, strlen(c->base_arg));
    } else {
        const char *cwd = ctx_cwd(c);
        if (!cwd) return NULL;
        c->base_dir = resolve(cwd, c->base_arg ? c->base_arg : ".");
    }
    if (!c->base_dir) plan_out_of_memory(c);
    return c->base_dir;
}

static bool required(const struct field *f, bool has_init)
{
    return (f->flags & REQ) || ((f->flags & REQ_NO_INIT) && !has_init);
}

static int decode_object(struct plan_ctx *c, json_t *obj, const struct field *fields, const char *path,
                         struct plan *p, bool has_init);

static int set_default(struct plan_ctx *c, const struct field *f, const char *path, struct plan *p,
                       bool has_init)
{
    char **str = (char **)((char *)p + f->offset);
    switch (f->kind) {
    case K_SECTION:
        if (f->flags & OPTIONAL) *(bool *)((char *)p + f->offset) = false;
        return decode_object(c, NULL, f->fields, path, p, has_init);
    case K_INT:
        *(int *)((char *)p + f->offset) = (int)f->idef;
        return 0;
    case K_U64:
        *(uint64_t *)((char *)p + f->offset) = (uint64_t)f->idef;
        return 0;
    case K_INTS:
        ((struct plan_ints *)((char *)p + f->offset))->n = 0;
        return 0;
    case K_REAL:
        *(double *)((char *)p + f->offset) = f->rdef;
        return 0;
    case K_BOOL:
        *(bool *)((char *)p + f->offset) = f->idef != 0;
        return 0;
    case K_ENUM:
        put_int(p, f->offset, (int)f->idef);
        return 0;
    case K_STRING:
    case K_PATH:
        if (f->sdef && !(*str = plan_dup_n(f->sdef, strlen(f->sdef)))) return plan_out_of_memory(c);
        return 0;
    }
    return 0;
}

/* "must be one of "a", "b"", or "must be "a"" for a set of one. */
void plan_one_of(char *buf, size_t n, const char *const *names)
{
    buf[0] = '\0';
    if (!names[1]) {
        append(buf, n, "must be \"%s\"", names[0]);
        return;
    }
    append(buf, n, "must be one of");
    for (int k = 0; names[k]; k++) append(buf, n, "%s \"%s\"", k ? "," : "", names[k]);
}

static int name_index(const char *const *names, const char *s)
{
    for (int k = 0; names[k]; k++)
        if (strcmp(names[k], s) == 0) return k;
    return -1;
}

static int decode_int(struct plan_ctx *c, const struct field *f, json_t *v, const char *path,
                      long long *out)
{
    char got[PLAN_GOT_MAX];
    const char *g = plan_got_text(c, path, v, got);
    if (f->kind == K_U64) {
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return plan_fail(c, path, "must be a non-negative integer (got %s)", g);
    } else if (!json_is_integer(v) && (f->flags & AUTO_OK)) {
        return plan_fail(c, path, "must be an integer or \"auto\" (got %s)", g);
    } else if (!json_is_integer(v)) {
        return plan_fail(c, path, "must be an integer (got %s)", g);
    }
    long long i = json_integer_value(v);
    if (f->imax == INT_MAX && i < f->imin)
        return plan_fail(c, path, "must be >= %lld (got %s)", f->imin, g);
    if (f->imax == INT_MAX && i > f->imax)
        return plan_fail(c, path, "must be <= %lld (got %s)", f->imax, g);
    if (i < f->imin || i > f->imax)
        return plan_fail(c, path, "must be in [%lld, %lld] (got %s)", f->imin, f->imax, g);
    *out = i;
    return 0;
}

static int decode_real(struct plan_ctx *c, const struct field *f, json_t *v, const char *path,
                       double *out)
{
    char got[PLAN_GOT_MAX];
    const char *g = plan_got_text(c, path, v, got);
    if (!json_is_number(v)) return plan_fail(c, path, "must be a number (got %s)", g);
    double x = json_number_value(v);
    bool low = f->rmin_open ? x > f->rmin : x >= f->rmin;
    bool high = isinf(f->rmax) || (f->rmax_open ? x < f->rmax : x <= f->rmax);
    if (low && high) {
        *out = x;
        return 0;
    }
    if (isinf(f->rmax))
        return plan_fail(c, path, "must be %s %g (got %s)", f->rmin_open ? ">" : ">=", f->rmin, g);
    return plan_fail(c, path, "must be in %c%g, %g%c (got %s)", f->rmin_open ? '(' : '[', f->rmin,
                f->rmax, f->rmax_open ? ')' : ']', g);
}

static int decode_string(struct plan_ctx *c, const struct field *f, json_t *v, const char *path,
                         struct plan *p)
{
    char got[PLAN_GOT_MAX], rule[256] = "must be a string";
    const char *g = plan_got_text(c, path, v, got);
    if (f->names) plan_one_of(rule, sizeof rule, f->names);
    if (!json_is_string(v)) return plan_fail(c, path, "%s (got %s)", rule, g);
    const char *s = json_string_value(v);
    if (f->names && name_index(f->names, s) < 0) return plan_fail(c, path, "%s (got %s)", rule, g);
    if (s[0] == '\0') return plan_fail(c, path, "must not be empty");
    if (f->kind == K_ENUM) {
        put_int(p, f->offset, name_index(f->names, s));
        return 0;
    }
    char **dst = (char **)((char *)p + f->offset);
    if (f->kind == K_PATH && !(f->flags & KEEP_RELATIVE) && s[0] != '/') {
        const struct entry *e = plan_find_entry(c, path);
        const char *base = e && e->origin >= 0 ? ctx_cwd(c) : ctx_base_dir(c);
        if (!base) return -1;
        *dst = resolve(base, s);
    } else {
        *dst = plan_dup_n(s, strlen(s));
    }
    return *dst ? 0 : plan_out_of_memory(c);
}

static int decode_value(struct plan_ctx *c, const struct field *f, json_t *v, const char *path,
                        struct plan *p, bool has_init)
{
    char got[PLAN_GOT_MAX];
    char *dst = (char *)p + f->offset;
    long long i = 0;
    double x = 0;
    switch (f->kind) {
    case K_SECTION:
        if (!json_is_object(v))
            return plan_fail(c, path, "must be an object (got %s)", plan_got_text(c, path, v, got));
        if (f->flags & OPTIONAL) *(bool *)dst = true;
        return decode_object(c, v, f->fields, path, p, has_init);
    case K_INT:
        if ((f->flags & AUTO_OK) && json_is_string(v) &&
            strcmp(json_string_value(v), "auto") == 0) {
            *(int *)dst = PLAN_AUTO;
            return 0;
        }
        if (decode_int(c, f, v, path, &i)) return -1;
        *(int *)dst = (int)i;
        return 0;
    case K_U64:
        if (decode_int(c, f, v, path, &i)) return -1;
        *(uint64_t *)dst = (uint64_t)i;
        return 0;
    case K_INTS: {
        struct plan_ints *list = (struct plan_ints *)dst;
        if (!json_is_array(v) || json_array_size(v) == 0 || json_array_size(v) > PLAN_MAX_STAGES)
            return plan_fail(c, path, "must be a list of 1 to %d integers (got %s)", PLAN_MAX_STAGES,
                        plan_got_text(c, path, v, got));
        list->n = 0;
        size_t k;
        json_t *e;
        json_array_foreach(v, k, e)
        {
            char epath[256];
            snprintf(epath, sizeof epath, "%s[%zu]", path, k);
            if (decode_int(c, f, e, epath, &i)) return -1;
            list->v[list->n++] = (int)i;
        }
        return 0;
    }
    case K_REAL:
        if (decode_real(c, f, v, path, &x)) return -1;
        *(double *)dst = x;
        return 0;
    case K_BOOL:
        if (!json_is_boolean(v))
            return plan_fail(c, path, "must be true or false (got %s)", plan_got_text(c, path, v, got));
        *(bool *)dst = json_is_true(v);
        return 0;
    case K_STRING:
    case K_PATH:
    case K_ENUM:
        return decode_string(c, f, v, path, p);
    }
    return 0;
}

static int check_unknown_keys(struct plan_ctx *c, json_t *obj, const struct field *fields,
                              const char *path)
{
    const char *key, *bad = NULL;
    json_t *value;
    int bad_at = INT_MAX;
    json_object_foreach(obj, key, value)
    {
        if (find_field(fields, key)) continue;
        char *kp = plan_join(path, key);
        if (!kp) return plan_out_of_memory(c);
        int at = plan_find_entry_index(c, kp);
        free(kp);
        if (!bad || (at >= 0 && at < bad_at)) bad = key, bad_at = at < 0 ? INT_MAX : at;
    }
    if (!bad) return 0;
    char hint[600];
    unknown_key_hint(fields, path, bad, hint, sizeof hint);
    char *kp = plan_join(path, bad);
    if (!kp) return plan_out_of_memory(c);
    plan_fail(c, kp, "unknown key (%s)", hint);
    free(kp);
    return -1;
}

/* obj: the object at path, or NULL when absent (then every field gets its default). */
static int decode_object(struct plan_ctx *c, json_t *obj, const struct field *fields, const char *path,
                         struct plan *p, bool has_init)
{
    if (obj) {
        if (check_unknown_keys(c, obj, fields, path)) return -1;
        for (const struct field *f = fields; f->name; f++) {
            json_t *v = json_object_get(obj, f->name);
            if (required(f, has_init) && (!v || json_is_null(v)))
                return plan_fail(c, path, "missing required key \"%s\"", f->name);
        }
    }
    for (const struct field *f = fields; f->name; f++) {
        char fpath[64];
        snprintf(fpath, sizeof fpath, "%s%s%s", path, *path ? "." : "", f->name);
        json_t *v = obj ? json_object_get(obj, f->name) : NULL;
        int rc = v && !json_is_null(v) ? decode_value(c, f, v, fpath, p, has_init)
                                       : set_default(c, f, fpath, p, has_init);
        if (rc) return -1;
    }
    return 0;
}

/* ---- loading ----------------------------------------------------------------------------- */

static struct plan *load(const char *text, size_t text_bytes, const char *source,
                         const char *base_dir, const char *const *overrides, int n_overrides,
                         struct plait_error *err)
{
    struct plan_ctx c = {.source = source ? source : "(plan text)",
                    .overrides = overrides,
                    .base_arg = base_dir,
                    .err = err};
    json_t *root = NULL;
    struct plan *p = calloc(1, sizeof *p);
    if (!p || !(p->source = plan_dup_n(c.source, strlen(c.source)))) {
        plan_out_of_memory(&c);
        goto fail;
    }
    if (!text) {
        error_set(err, "%s: no plan text", c.source);
        goto fail;
    }
    const char *nul = memchr(text, '\0', text_bytes);
    if (nul) { /* jansson may stop there; the scanner certainly would */
        int line = 1, column = 1;
        for (const char *q = text; q < nul; q++) {
            column = *q == '\n' ? 1 : column + 1;
            line += *q == '\n';
        }
        error_set(err, "%s:%d:%d: invalid JSON: NUL byte", c.source, line, column);
        goto fail;
    }
    json_error_t jerr;
    root = json_loadb(text, text_bytes, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        error_set(err, "%s:%d:%d: invalid JSON: %s", c.source, jerr.line, jerr.column, jerr.text);
        goto fail;
    }
    if (plan_scan(&c, text, -1, "", 0)) goto fail;
    if (n_overrides > 0 && !overrides) {
        error_set(err, "%s: %d overrides but no array", c.source, n_overrides);
        goto fail;
    }
    for (int i = 0; i < n_overrides; i++)
        if (apply_override(&c, root, i)) goto fail;
    if (!json_is_object(root)) {
        top_level_error(&c, root);
        goto fail;
    }
    bool has_init = plan_given(root, "model", "init") != NULL;
    if (decode_object(&c, root, plan_root_fields, "", p, has_init)) goto fail;
    if (plan_check_rules(&c, root, p)) goto fail;
    goto out;
fail:
    plan_free(p);
    p = NULL;
out:
    json_decref(root);
    for (int i = 0; i < c.n_entries; i++) {
        free(c.entries[i].path);
        free(c.entries[i].raw);
    }
    free(c.entries);
    free(c.base_dir);
    free(c.cwd);
    return p;
}

struct plan *plan_load_text(const char *text, const char *source, const char *base_dir,
                            const char *const *overrides, int n_overrides, struct plait_error *err)
{
    return load(text, text ? strlen(text) : 0, source, base_dir, overrides, n_overrides, err);
}

struct plan *plan_load(const char *path, const char *const *overrides, int n_overrides,
                       struct plait_error *err)
{
    char *text = NULL, *dir = NULL;
    struct plan *p = NULL;
    FILE *f = NULL;
    if (!path) {
        error_set(err, "plan_load: no path");
        goto out;
    }
    f = fopen(path, "rb");
    if (!f) {
        error_errno(err, "%s", path);
        goto out;
    }
    size_t cap = 4096, n = 0;
    text = malloc(cap);
    for (;;) {
        if (!text) {
            error_set(err, "%s: out of memory", path);
            goto out;
        }
        n += fread(text + n, 1, cap - n, f);
        if (n < cap) break;
        char *bigger = realloc(text, cap *= 2);
        if (!bigger) free(text);
        text = bigger;
    }
    if (ferror(f)) {
        error_errno(err, "%s", path);
        goto out;
    }
    text[n] = '\0';
    const char *slash = strrchr(path, '/');
    if (slash && !(dir = plan_dup_n(path, slash == path ? 1 : (size_t)(slash - path)))) {
        error_set(err, "%s: out of memory", path);
        goto out;
    }
    p = load(text, n, path, dir, overrides, n_overrides, err);
out:
    if (f) fclose(f);
    free(text);
    free(dir);
    return p;
}

void plan_free(struct plan *plan)
{
    if (!plan) return;
    free(plan->source);
    free(plan->model.arch);
    free(plan->model.init);
    free(plan->data.train);
    free(plan->data.val);
    free(plan->data.tokenizer);
    free(plan->checkpoint.dir);
    free(plan->parallel.offload_dir);
    free(plan->train.tensorboard);
    free(plan->sample.prompt);
    free(plan);
}
