/* plan_origin.h — the loading context plan_origin.c keeps and plan.c's loader fills: each
 * value's path, where it came from (the plan's line, or a --set override) and its literal,
 * and the messages located by them. Not an interface of the plan (plan.h is); plan_check.h
 * is what the rules between fields see of it. */
#ifndef PLAIT_PLAN_ORIGIN_H
#define PLAIT_PLAN_ORIGIN_H

#include <stdbool.h>
#include <stddef.h>

#include "common/plan/plan_check.h"

struct entry {
    char *path; /* dot-joined JSON path; "" is the top level */
    int origin; /* -1: the plan text; i >= 0: override i */
    int line;   /* where the value starts (plan text only) */
    char *raw;  /* the literal as written, for scalars; NULL for objects and arrays */
    bool dead;  /* replaced by an override */
};

struct plan_ctx {
    const char *source;
    const char *const *overrides;
    const char *base_arg; /* base directory as given (NULL = current directory) */
    char *base_dir;       /* absolute, computed on first use */
    char *cwd;            /* absolute, computed on first use */
    struct entry *entries;
    int n_entries, cap_entries;
    struct plait_error *err;
};

/* "source: out of memory"; -1. */
int plan_out_of_memory(struct plan_ctx *c);

/* The first n bytes of s, malloc'ed; NULL: out of memory. */
char *plan_dup_n(const char *s, size_t n);

/* "a" + "b" -> "a.b"; "" + "b" -> "b". malloc'ed. */
char *plan_join(const char *path, const char *key);

/* Records where the value at path came from (origin -1: the plan text, at line; i >= 0:
 * override i) and its literal (raw, raw_bytes; NULL for objects and arrays); -1 when out
 * of memory. */
int plan_add_entry(struct plan_ctx *c, const char *path, int origin, int line, const char *raw,
                   size_t raw_bytes);

/* The live entry of path (its index, or -1; or it, or NULL). */
int plan_find_entry_index(const struct plan_ctx *c, const char *path);
const struct entry *plan_find_entry(const struct plan_ctx *c, const char *path);

/* An override replaced path: forget what was recorded there and below. */
void plan_kill_entries(struct plan_ctx *c, const char *path);

/* Records the lines and literals of text, an already-valid JSON value at path, from
 * origin (-1: the plan text; i: override i), objects down to depth 3; -1 when out of
 * memory. */
int plan_scan(struct plan_ctx *c, const char *text, int origin, const char *path, int depth);

/* "source:line: path: msg", or "--set override: path: msg" for values an override gave; -1. */
int plan_report(struct plan_ctx *c, int origin, int line, const char *path, const char *msg);

#endif
