/* check.h — the whole unit-test harness: TEST cases run by RUN, CHECK that
 * counts failures, output the runner counts ("ok NAME" / "not ok NAME"). */
#ifndef PLAIT_TESTS_CHECK_H
#define PLAIT_TESTS_CHECK_H

#include <stdio.h>

static int check_failures, tests_passed, tests_failed;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stdout, "  %s:%d: check failed: %s: ", __FILE__, __LINE__, #cond);             \
            fprintf(stdout, __VA_ARGS__);                                                          \
            fputc('\n', stdout);                                                                   \
            check_failures++;                                                                      \
        }                                                                                          \
    } while (0)

#define RUN(fn) check_run(#fn, fn)

static inline void check_run(const char *name, void (*fn)(void))
{
    int before = check_failures;
    fn();
    if (check_failures == before) {
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
