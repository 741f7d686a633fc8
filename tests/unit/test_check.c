/* test_check.c — the unit-test harness itself (check.h): a case that SKIPs is
 * reported "ok NAME # SKIP why" and counted as skipped, not as passed; a
 * case that fails a CHECK and then SKIPs is still a failure. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "tests/unit/check.h"

static void skips(void)
{
    SKIP("no %s here", "device");
}

static void fails_then_skips(void)
{
    CHECK(0, "on purpose");
    SKIP("too late");
}

/* fn run by check_run with stdout into a temporary file: its report in out */
static void report_of(const char *name, void (*fn)(void), char *out, size_t bytes)
{
    fflush(stdout);
    FILE *tmp = tmpfile();
    int saved = dup(STDOUT_FILENO);
    if (!tmp || saved < 0 || dup2(fileno(tmp), STDOUT_FILENO) < 0) {
        out[0] = '\0';
        return;
    }
    char outer_why[sizeof check_skip_why];
    memcpy(outer_why, check_skip_why, sizeof outer_why);
    check_run(name, fn);
    memcpy(check_skip_why, outer_why, sizeof outer_why); /* the outer case's own state */
    fflush(stdout);
    dup2(saved, STDOUT_FILENO);
    close(saved);
    rewind(tmp);
    size_t n = fread(out, 1, bytes - 1, tmp);
    out[n] = '\0';
    fclose(tmp);
}

static void test_a_skipped_case_is_reported_and_counted_as_skipped(void)
{
    int passed = tests_passed, skipped = tests_skipped, failures = check_failures;
    char out[512];
    report_of("skips", skips, out, sizeof out);
    CHECK(strcmp(out, "ok skips # SKIP no device here\n") == 0, "reported: %s", out);
    CHECK(tests_skipped == skipped + 1 && tests_passed == passed, "skipped %d, passed %d",
          tests_skipped - skipped, tests_passed - passed);
    CHECK(check_failures == failures, "failures %d", check_failures - failures);
}

static void test_a_failed_check_before_a_skip_is_a_failure(void)
{
    int failed = tests_failed, skipped = tests_skipped, failures = check_failures;
    char out[512];
    report_of("fails_then_skips", fails_then_skips, out, sizeof out);
    CHECK(strstr(out, "not ok fails_then_skips\n") != NULL, "reported: %s", out);
    CHECK(tests_failed == failed + 1 && tests_skipped == skipped, "failed %d, skipped %d",
          tests_failed - failed, tests_skipped - skipped);
    /* the deliberate failure is not this case's own */
    check_failures = failures;
    tests_failed = failed;
}

int main(void)
{
    RUN(test_a_skipped_case_is_reported_and_counted_as_skipped);
    RUN(test_a_failed_check_before_a_skip_is_a_failure);
    return check_exit_code();
}
