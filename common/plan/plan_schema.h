/* plan_schema.h — plan.json's schema as the plan's files share it: a field's kind, flags,
 * bounds and default (plan_schema.c fills the table; plan.c decodes by it, plan_write.c
 * writes by it, plan_help.c prints it). Not an interface of the plan (plan.h is). */
#ifndef PLAIT_PLAN_SCHEMA_H
#define PLAIT_PLAN_SCHEMA_H

#include <stdbool.h>
#include <stddef.h>

#include "common/plan/plan.h"

enum kind { K_SECTION, K_INT, K_U64, K_REAL, K_BOOL, K_STRING, K_PATH, K_ENUM, K_INTS };

#define REQ 0x1u           /* must be present and not null */
#define REQ_NO_INIT 0x2u   /* required unless model.init is given */
#define KEEP_RELATIVE 0x4u /* a path that is not resolved (checkpoint.dir) */
#define AUTO_OK 0x8u       /* K_INT that may also be "auto" (stored as PLAN_AUTO) */
#define MAY_CHANGE 0x10u   /* may differ when a run resumes (plan_diff) */
/* K_SECTION that may be absent: offset is a bool, whether given; an absent one gets its
 * defaults and is not written back */
#define OPTIONAL 0x20u

struct field {
    const char *name;
    enum kind kind;
    unsigned flags;
    size_t offset;              /* into struct plan (not for K_SECTION) */
    long long imin, imax, idef; /* K_INT, K_U64, K_BOOL (idef), K_ENUM (idef) */
    double rmin, rmax, rdef;    /* K_REAL; rmax = INFINITY when unbounded */
    bool rmin_open, rmax_open;  /* K_REAL: (rmin, ...) rather than [rmin, ...] */
    const char *const *names;   /* K_ENUM (index = enum value); K_STRING: the allowed set */
    const char *sdef;           /* K_STRING, K_PATH; NULL = no default */
    const struct field *fields; /* K_SECTION, ended by a NULL name */
};

/* The top level, in the order plan_to_json writes it (plan_schema.c's). */
extern const struct field plan_root_fields[];

/* "must be one of "a", "b"", or "must be "a"" for a set of one (plan.c's: the loader's
 * words, which plait help plan shares). */
void plan_one_of(char *buf, size_t n, const char *const *names);

/* s as a JSON string, by jansson ("\n" as two characters); NULL: out of memory, or s is not
 * UTF-8 (plan.c's). */
char *plan_quote(const char *s);

#endif
