/* check.h — the whole unit-test harness: TEST cases run by RUN, CHECK that
 * counts failures, SKIP for a case that cannot run here, output the runner
 * counts ("ok NAME" / "not ok NAME" / "ok NAME # SKIP why", which tests/run.sh
 * counts as skipped, never as passed). */
#ifndef PLAIT_TESTS_CHECK_H
#define PLAIT_TESTS_CHECK_H

#include <stdio.h>

static int check_failures, tests_passed, tests_failed, tests_skipped;
static char check_skip_why[256]; /* set by SKIP in the running case */

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stdout, "  %s:%d: check failed: %s: ", __FILE__, __LINE__, #cond);             \
            fprintf(stdout, __VA_ARGS__);                                                          \
            fputc('\n', stdout);                                                                   \
            check_failures++;                                                                      \
        }                                                                                          \
    } while (0)

/* In a case: it cannot run on this machine (why: printf-style); returns from
 * the case, which is reported "ok NAME # SKIP why". Only for what is truly
 * absent (a library, a device), never for a condition the case should check. */
#define SKIP(...)                                                                                  \
    do {                                                                                           \
        snprintf(check_skip_why, sizeof check_skip_why, __VA_ARGS__);                              \
        return;                                                                                    \
    } while (0)

#define RUN(fn) check_run(#fn, fn)

static inline void check_run(const char *name, void (*fn)(void))
{
    int before = check_failures;
    check_skip_why[0] = '\0';
    fn();
    if (check_failures == before && check_skip_why[0]) {
        printf("ok %s # SKIP %s\n", name, check_skip_why);
        tests_skipped++;
    } else if (check_failures == before) {
        printf("ok %s\n", name);
        tests_passed++;
    } else {
        printf("not ok %s\n", name);
        tests_failed++;
    }
    fflush(stdout);
}

static inline int check_exit_code(void)
{
    return tests_failed ? 1 : 0;
}

#endif
