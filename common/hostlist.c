/* hostlist.c — Slurm's compressed host lists read without libslurm: a list is
 * names separated by commas outside brackets; a name is literal text and
 * bracket groups of numbers and ranges ("[01-04,07]"). Counting and picking the
 * n-th name only: nothing here allocates. */
#include "common/hostlist.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One range of a bracket group: lo..hi, printed width digits wide. */
struct range {
    long lo, hi;
    int width;
};

/* The next range of the group at *s (after "[" or ","), *s moved past it. */
static int next_range(const char **s, struct range *r, const char *list, struct plait_error *err)
{
    const char *p = *s;
    char *end;
    if (*p < '0' || *p > '9') goto bad;
    r->lo = strtol(p, &end, 10);
    r->width = (int)(end - p);
    r->hi = r->lo;
    if (*end == '-') {
        p = end + 1;
        if (*p < '0' || *p > '9') goto bad;
        r->hi = strtol(p, &end, 10);
    }
    if (r->hi < r->lo || r->hi - r->lo >= HOSTLIST_MAX_NAMES || r->width > 18) goto bad;
    if (*end != ',' && *end != ']') goto bad;
    *s = end;
    return 0;
bad:
    return error_set(err, "host list \"%s\": bad range at \"%.20s\" (Slurm writes "
                     "\"node[01-04,07]\")", list, *s);
}

/* The names the group at g (just after "[") holds; *end: past its "]". */
static long group_count(const char *g, const char **end, const char *list,
                        struct plait_error *err)
{
    long n = 0;
    for (;;) {
        struct range r;
        if (next_range(&g, &r, list, err)) return -1;
        n += r.hi - r.lo + 1;
        if (n > HOSTLIST_MAX_NAMES) break;
        if (*g++ == ']') break;
    }
    *end = g;
    return n;
}

/* The k-th number of the group at g, printed into out (bytes left). */
static int group_pick(const char *g, long k, char *out, size_t bytes)
{
    struct plait_error ignored;
    for (;;) {
        struct range r;
        next_range(&g, &r, "", &ignored); /* counted already: well formed */
        if (k <= r.hi - r.lo) {
            int n = snprintf(out, bytes, "%0*ld", r.width, r.lo + k);
            return n >= 0 && (size_t)n < bytes ? n : -1;
        }
        k -= r.hi - r.lo + 1;
        g++;
    }
}

/* The names of the one host expression [s, e): literal text and groups. */
static long expr_count(const char *s, const char *e, const char *list, struct plait_error *err)
{
    long n = 1;
    while (s < e) {
        if (*s == ']') goto bad;
        if (*s++ != '[') continue;
        long g = group_count(s, &s, list, err);
        if (g < 0) return -1;
        if (s > e || (n *= g) > HOSTLIST_MAX_NAMES) goto bad;
    }
    return n;
bad:
    error_set(err, "host list \"%s\": malformed, or more than %d names", list, HOSTLIST_MAX_NAMES);
    return -1;
}

/* Its k-th name: the rightmost group fastest. */
static int expr_pick(const char *s, const char *e, long k, char out[HOSTLIST_NAME_BYTES])
{
    /* the stride of each group is the product of the counts after it */
    long after = 1;
    struct plait_error ignored;
    for (const char *p = s; p < e;)
        if (*p++ == '[') after *= group_count(p, &p, "", &ignored);
    size_t len = 0;
    while (s < e) {
        if (*s != '[') {
            if (len + 1 >= HOSTLIST_NAME_BYTES) return -1;
            out[len++] = *s++;
            continue;
        }
        const char *g = s + 1;
        long count = group_count(g, &s, "", &ignored);
        after /= count;
        int n = group_pick(g, (k / after) % count, out + len, HOSTLIST_NAME_BYTES - len);
        if (n < 0) return -1;
        len += (size_t)n;
    }
    out[len] = '\0';
    return 0;
}

/* The end of the expression starting at s: the next comma outside brackets. */
static const char *expr_end(const char *s)
{
    int depth = 0;
    for (; *s && !(*s == ',' && depth == 0); s++) depth += *s == '[' ? 1 : *s == ']' ? -1 : 0;
    return s;
}

/* Walks the list: its count, or the n-th name (n >= 0) into out. */
static long walk(const char *list, long n, char *out, struct plait_error *err)
{
    long total = 0;
    if (!list || !*list) return error_set(err, "the host list is empty"), -1;
    for (const char *s = list; *s;) {
        const char *e = expr_end(s);
        if (e == s || (*e && !e[1]))
            return error_set(err, "host list \"%s\": an empty name", list), -1;
        long c = expr_count(s, e, list, err);
        if (c < 0) return -1;
        if (n >= 0 && n < total + c) {
            if (expr_pick(s, e, n - total, out))
                return error_set(err, "host list \"%s\": a name longer than %d bytes", list,
                                 HOSTLIST_NAME_BYTES - 1), -1;
            return n;
        }
        if ((total += c) > HOSTLIST_MAX_NAMES)
            return error_set(err, "host list \"%s\": more than %d names", list,
                             HOSTLIST_MAX_NAMES), -1;
        s = *e ? e + 1 : e;
    }
    if (n >= 0) return error_set(err, "host list \"%s\" has %ld names, not %ld", list, total, n + 1), -1;
    return total;
}

int hostlist_nth(const char *list, int n, char out[HOSTLIST_NAME_BYTES], struct plait_error *err)
{
    if (n < 0) return error_set(err, "host list: no name %d", n);
    return walk(list, n, out, err) < 0 ? -1 : 0;
}

int hostlist_count(const char *list, struct plait_error *err)
{
    return (int)walk(list, -1, NULL, err);
}
