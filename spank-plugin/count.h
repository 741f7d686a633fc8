/* count.h — counts in spank_plait (GPUs, tasks, nodes, quota sums): 64-bit,
 * checked, saturating at COUNT_MAX instead of wrapping, and parsed from
 * Slurm's text with a bound. A saturated count is over any limit, so the
 * checks that follow refuse it by name. */
#ifndef PLAIT_SPANK_COUNT_H
#define PLAIT_SPANK_COUNT_H

#include <stdint.h>

#define COUNT_MAX INT64_MAX

/* a + b and a × b, both ≥ 0, saturating at COUNT_MAX. */
static inline int64_t count_add(int64_t a, int64_t b)
{
    int64_t r;
    return __builtin_add_overflow(a, b, &r) ? COUNT_MAX : r;
}

static inline int64_t count_mul(int64_t a, int64_t b)
{
    int64_t r;
    return __builtin_mul_overflow(a, b, &r) ? COUNT_MAX : r;
}

/* The decimal count at the start of text (digits only, no sign), saturating
 * at COUNT_MAX; -1 if text does not start with a digit. *end (may be NULL)
 * is set after the digits. */
static inline int64_t count_parse(const char *text, const char **end)
{
    const char *s = text;
    int64_t n = 0;
    if (!s || *s < '0' || *s > '9') {
        if (end) *end = text;
        return -1;
    }
    for (; *s >= '0' && *s <= '9'; s++) n = count_add(count_mul(n, 10), *s - '0');
    if (end) *end = s;
    return n;
}

#endif
