/* plan_origin.c — where each value of a plan being loaded came from: its JSON path, the
 * plan's line or the --set override that gave it, and its literal as written (jansson keeps
 * none of these, so a small scanner over the same text records them), and the messages
 * located by them (`plan.json:7: optimizer.lr: must be > 0 (got -3e-4)`). Decoding the
 * values is plan.c's. */
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/plan/plan_origin.h"

/* ---- where each value came from --------------------------------------------------------- */

#define SCAN_DEPTH 3 /* deeper values are never named in a message */

int plan_out_of_memory(struct plan_ctx *c)
{
    return error_set(c->err, "%s: out of memory", c->source);
}

char *plan_dup_n(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

/* "a" + "b" -> "a.b"; "" + "b" -> "b". malloc'ed. */
char *plan_join(const char *path, const char *key)
{
    size_t a = strlen(path), b = strlen(key);
    char *s = malloc(a + b + 2);
    if (!s) return NULL;
    memcpy(s, path, a);
    size_t n = a;
    if (a) s[n++] = '.';
    memcpy(s + n, key, b + 1);
    return s;
}

int plan_add_entry(struct plan_ctx *c, const char *path, int origin, int line, const char *raw,
                   size_t raw_bytes)
{
    if (c->n_entries == c->cap_entries) {
        int cap = c->cap_entries ? 2 * c->cap_entries : 64;
        struct entry *e = realloc(c->entries, (size_t)cap * sizeof *e);
        if (!e) return plan_out_of_memory(c);
        c->entries = e;
        c->cap_entries = cap;
    }
    struct entry *e = &c->entries[c->n_entries];
    *e = (struct entry){.origin = origin, .line = line};
    e->path = plan_dup_n(path, strlen(path));
    e->raw = raw ? plan_dup_n(raw, raw_bytes) : NULL;
    if (!e->path || (raw && !e->raw)) {
        free(e->path);
        free(e->raw);
        return plan_out_of_memory(c);
    }
    c->n_entries++;
    return 0;
}

int plan_find_entry_index(const struct plan_ctx *c, const char *path)
{
    for (int i = 0; i < c->n_entries; i++)
        if (!c->entries[i].dead && strcmp(c->entries[i].path, path) == 0) return i;
    return -1;
}

const struct entry *plan_find_entry(const struct plan_ctx *c, const char *path)
{
    int i = plan_find_entry_index(c, path);
    return i < 0 ? NULL : &c->entries[i];
}

/* The entry of path, else of the nearest enclosing value that has one. */
static const struct entry *locate(const struct plan_ctx *c, const char *path)
{
    size_t n = strlen(path);
    for (;;) {
        for (int i = 0; i < c->n_entries; i++) {
            const struct entry *e = &c->entries[i];
            if (!e->dead && strlen(e->path) == n && strncmp(e->path, path, n) == 0) return e;
        }
        if (n == 0) return NULL;
        while (n > 0 && path[n - 1] != '.') n--;
        if (n > 0) n--; /* drop the dot */
    }
}

/* An override replaced path: forget what was recorded there and below. */
void plan_kill_entries(struct plan_ctx *c, const char *path)
{
    size_t n = strlen(path);
    for (int i = 0; i < c->n_entries; i++) {
        struct entry *e = &c->entries[i];
        if (strncmp(e->path, path, n) == 0 && (e->path[n] == '\0' || e->path[n] == '.'))
            e->dead = true;
    }
}

/* ---- the scanner: lines and literals of an already-valid JSON text ---------------------- */

struct scanner {
    struct plan_ctx *c;
    const char *p;
    int line;
    int origin;
};

static void skip_ws(struct scanner *s)
{
    for (;; s->p++) {
        if (*s->p == '\n')
            s->line++;
        else if (*s->p != ' ' && *s->p != '\t' && *s->p != '\r')
            return;
    }
}

/* s->p at the opening quote; leaves it after the closing one. */
static void skip_string(struct scanner *s)
{
    for (s->p++; *s->p && *s->p != '"'; s->p++)
        if (*s->p == '\\' && s->p[1]) s->p++;
    if (*s->p == '"') s->p++;
}

static unsigned hex4(const char *p)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char ch = p[i];
        unsigned d = ch >= '0' && ch <= '9'   ? (unsigned)(ch - '0')
                     : ch >= 'a' && ch <= 'f' ? (unsigned)(ch - 'a' + 10)
                     : ch >= 'A' && ch <= 'F' ? (unsigned)(ch - 'A' + 10)
                                              : 0;
        v = v * 16 + d;
    }
    return v;
}

static char *put_utf8(char *o, unsigned cp)
{
    if (cp < 0x80) {
        *o++ = (char)cp;
    } else if (cp < 0x800) {
        *o++ = (char)(0xC0 | (cp >> 6));
        *o++ = (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        *o++ = (char)(0xE0 | (cp >> 12));
        *o++ = (char)(0x80 | ((cp >> 6) & 0x3F));
        *o++ = (char)(0x80 | (cp & 0x3F));
    } else {
        *o++ = (char)(0xF0 | (cp >> 18));
        *o++ = (char)(0x80 | ((cp >> 12) & 0x3F));
        *o++ = (char)(0x80 | ((cp >> 6) & 0x3F));
        *o++ = (char)(0x80 | (cp & 0x3F));
    }
    return o;
}

/* The text between the quotes of a JSON string, unescaped (as jansson has the key). */
static char *unescape(const char *begin, const char *end)
{
    char *out = malloc((size_t)(end - begin) + 1), *o = out;
    if (!out) return NULL;
    for (const char *q = begin; q < end; q++) {
        if (*q != '\\') {
            *o++ = *q;
            continue;
        }
        q++;
        switch (*q) {
        case 'b':
            *o++ = '\b';
            break;
        case 'f':
            *o++ = '\f';
            break;
        case 'n':
            *o++ = '\n';
            break;
        case 'r':
            *o++ = '\r';
            break;
        case 't':
            *o++ = '\t';
            break;
        case 'u': {
            unsigned cp = hex4(q + 1);
            q += 4;
            if (cp >= 0xD800 && cp < 0xDC00 && q[1] == '\\' && q[2] == 'u') {
                unsigned lo = hex4(q + 3);
                if (lo >= 0xDC00 && lo < 0xE000) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    q += 6;
                }
            }
            o = put_utf8(o, cp);
            break;
        }
        default:
            *o++ = *q;
            break; /* \" \\ \/ */
        }
    }
    *o = '\0';
    return out;
}

/* Records path (NULL: inside an array or too deep, not recorded) and, for
 * objects, every member up to SCAN_DEPTH. */
static int scan_value(struct scanner *s, const char *path, int depth)
{
    skip_ws(s);
    const char *start = s->p;
    int line = s->line;
    if (*s->p == '{' || *s->p == '[') {
        char close = *s->p == '{' ? '}' : ']';
        if (path && plan_add_entry(s->c, path, s->origin, line, NULL, 0)) return -1;
        for (s->p++, skip_ws(s); *s->p && *s->p != close;) {
            char *child = NULL;
            if (close == '}') {
                if (*s->p != '"') return 0; /* not JSON; jansson would have said */
                const char *key = s->p + 1;
                skip_string(s);
                if (path && depth < SCAN_DEPTH) {
                    char *name = unescape(key, s->p - 1);
                    child = name ? plan_join(path, name) : NULL;
                    free(name);
                    if (!child) return plan_out_of_memory(s->c);
                }
                skip_ws(s);
                if (*s->p == ':') s->p++;
            }
            const char *before = s->p;
            int rc = scan_value(s, child, depth + 1);
            free(child);
            if (rc) return -1;
            if (s->p == before) return 0; /* no progress: not JSON */
            skip_ws(s);
            if (*s->p == ',') {
                s->p++;
                skip_ws(s);
            }
        }
        if (*s->p) s->p++;
        return 0;
    }
    if (*s->p == '"')
        skip_string(s);
    else
        while (*s->p && !strchr(",}] \t\r\n", *s->p)) s->p++;
    return path ? plan_add_entry(s->c, path, s->origin, line, start, (size_t)(s->p - start)) : 0;
}

int plan_scan(struct plan_ctx *c, const char *text, int origin, const char *path, int depth)
{
    struct scanner s = {.c = c, .p = text, .line = 1, .origin = origin};
    return scan_value(&s, path, depth);
}

/* ---- messages ---------------------------------------------------------------------------- */

/* "source:line: path: msg", or "--set override: path: msg" for values an override gave. */
int plan_report(struct plan_ctx *c, int origin, int line, const char *path, const char *msg)
{
    char at[512];
    if (origin >= 0)
        snprintf(at, sizeof at, "--set %s", c->overrides[origin] ? c->overrides[origin] : "(null)");
    else if (line > 0)
        snprintf(at, sizeof at, "%s:%d", c->source, line);
    else
        snprintf(at, sizeof at, "%s", c->source);
    if (*path) return error_set(c->err, "%s: %s: %s", at, path, msg);
    return error_set(c->err, "%s: %s", at, msg);
}

/* An error of a rule between fields: at path's place, unless an override set
 * one of the fields the rule also reads (also: space-separated paths) after
 * path's own value was given. Then it names that override (the last such)
 * and where path's value came from: "--set steps=5: optimizer.warmup_steps:
 * must be < steps (5) ...; optimizer.warmup_steps is at plan.json:9". */
static int vfail_rule(struct plan_ctx *c, const char *path, const char *also, const char *fmt,
                      va_list ap) __attribute__((format(printf, 4, 0)));
int plan_fail_rule(struct plan_ctx *c, const char *path, const char *also, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* An error about the value at path, located where that value (or its parent) came from. */
int plan_fail(struct plan_ctx *c, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int plan_fail(struct plan_ctx *c, const char *path, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = vfail_rule(c, path, "", fmt, ap);
    va_end(ap);
    return rc;
}

int plan_fail_rule(struct plan_ctx *c, const char *path, const char *also, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = vfail_rule(c, path, also, fmt, ap);
    va_end(ap);
    return rc;
}

static int vfail_rule(struct plan_ctx *c, const char *path, const char *also, const char *fmt,
                      va_list ap)
{
    char msg[640];
    vsnprintf(msg, sizeof msg, fmt, ap);
    const struct entry *own = locate(c, path);
    int own_origin = own ? own->origin : -1, culprit = own_origin;
    for (const char *a = also; *a;) {
        size_t n = strcspn(a, " ");
        char other[64];
        snprintf(other, sizeof other, "%.*s", (int)n, a);
        const struct entry *e = locate(c, other);
        if (e && e->origin > culprit) culprit = e->origin;
        a += n + (a[n] == ' ');
    }
    if (culprit == own_origin) return plan_report(c, own_origin, own ? own->line : 0, path, msg);
    char full[1280];
    bool given_here = own && strcmp(own->path, path) == 0;
    if (given_here && own_origin >= 0)
        snprintf(full, sizeof full, "%s; %s is set by --set %s", msg, path,
                 c->overrides[own_origin] ? c->overrides[own_origin] : "(null)");
    else if (given_here && own->line > 0)
        snprintf(full, sizeof full, "%s; %s is at %s:%d", msg, path, c->source, own->line);
    else
        snprintf(full, sizeof full, "%s; %s is %s", msg, path,
                 given_here ? "in the plan" : "its default");
    return plan_report(c, culprit, 0, path, full);
}

/* The value as written ("-3e-4", "\"fp16\""), shortened; "object"/"array" for those. */
const char *plan_got_text(const struct plan_ctx *c, const char *path, const json_t *v,
                          char buf[PLAN_GOT_MAX])
{
    if (json_is_object(v)) return "object";
    if (json_is_array(v)) return "array";
    const struct entry *e = plan_find_entry(c, path);
    char *dumped = NULL;
    const char *raw = e && e->raw ? e->raw : (dumped = json_dumps(v, JSON_ENCODE_ANY));
    if (!raw) return "?";
    size_t n = strlen(raw);
    if (n < PLAN_GOT_MAX) {
        memcpy(buf, raw, n + 1);
    } else {
        n = PLAN_GOT_MAX - 4;
        while (n > 0 && ((unsigned char)raw[n] & 0xC0) == 0x80) n--; /* whole UTF-8 characters */
        memcpy(buf, raw, n);
        memcpy(buf + n, "...", 4);
    }
    free(dumped);
    return buf;
}
