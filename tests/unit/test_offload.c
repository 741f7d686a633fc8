/* test_offload.c — the moments' files (runtime/offload.h): opened as zeros of
 * the slice's size under <dir>/rank-N/, walked window by window with every
 * element seen once and in place (windows that do not divide the slice, one
 * window, a window of one float), what a pass writes read back by the next
 * and by random access, a failing visitor stopping the walk with its error,
 * and a directory that cannot be made named with the rank. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "runtime/offload.h"

static char root[] = "/tmp/plait-test-offload.XXXXXX";

struct walk {
    size_t next; /* the element the next window must start at */
    int windows, fail_at;
};

/* m[i] += i + 1, v[i] -= 2·(i + 1) over global index i; the windows must tile the slice */
static int visit(void *ctx, size_t lo, size_t n, float *m, float *v, struct plait_error *err)
{
    struct walk *w = ctx;
    CHECK(lo == w->next && n > 0, "window at %zu of %zu, want at %zu", lo, n, w->next);
    if (w->windows++ == w->fail_at) return error_set(err, "the visitor failed at window %d", w->fail_at);
    for (size_t i = 0; i < n; i++) {
        m[i] += (float)(lo + i + 1);
        v[i] -= 2.0f * (float)(lo + i + 1);
    }
    w->next = lo + n;
    return 0;
}

/* n floats with windows of `window`: two passes, then every element checked */
static void walk_case(size_t n, size_t window)
{
    struct offload o = {0};
    struct plait_error err;
    float *bufs = calloc(4 * window, sizeof(float));
    for (int b = 0; b < 2; b++)
        for (int k = 0; k < 2; k++) o.buf[b][k] = bufs + (size_t)(2 * b + k) * window;
    char dir[64];
    snprintf(dir, sizeof dir, "%s/n%zu_w%zu", root, n, window);
    if (offload_open(&o, dir, 3, n, window, &err) != 0) {
        CHECK(0, "%s", err.text);
        free(bufs);
        return;
    }
    for (int pass = 0; pass < 2; pass++) {
        struct walk w = {0, 0, -1};
        CHECK(offload_each_window(&o, visit, &w, &err) == 0, "%s", err.text);
        CHECK(w.next == n && w.windows == (int)((n + window - 1) / window),
              "n %zu window %zu: %d windows ending at %zu", n, window, w.windows, w.next);
    }
    float *m = malloc(n * sizeof *m), *v = malloc(n * sizeof *v);
    CHECK(offload_read(&o, 0, 0, m, n, &err) == 0 && offload_read(&o, 1, 0, v, n, &err) == 0,
          "%s", err.text);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += m[i] != 2.0f * (float)(i + 1) || v[i] != -4.0f * (float)(i + 1);
    CHECK(bad == 0, "n %zu window %zu: %zu elements wrong after two passes", n, window, bad);
    /* random access: a write in the middle, read back on its own */
    float x[3] = {7, 8, 9}, y[3];
    size_t at = n > 5 ? n / 2 : 0, k = n > 5 ? 3 : 1;
    CHECK(offload_write(&o, 1, at, x, k, &err) == 0 && offload_read(&o, 1, at, y, k, &err) == 0 &&
              !memcmp(x, y, k * sizeof *x),
          "random access at %zu", at);
    free(m);
    free(v);
    offload_close(&o);
    free(bufs);
}

static void test_windows_tile_the_slice_and_keep_what_they_wrote(void)
{
    walk_case(1000, 64);  /* 16 windows, the last of 40 */
    walk_case(1000, 1000); /* one */
    walk_case(7, 1);       /* a float each */
    walk_case(4096, 512);  /* even */
}

static void test_a_failing_visitor_stops_the_walk_with_its_error(void)
{
    struct offload o = {0};
    struct plait_error err;
    float bufs[4 * 10];
    for (int b = 0; b < 2; b++)
        for (int k = 0; k < 2; k++) o.buf[b][k] = bufs + (2 * b + k) * 10;
    char dir[64];
    snprintf(dir, sizeof dir, "%s/fail", root);
    CHECK(offload_open(&o, dir, 0, 100, 10, &err) == 0, "%s", err.text);
    struct walk w = {0, 0, 4};
    CHECK(offload_each_window(&o, visit, &w, &err) != 0 &&
              strstr(err.text, "the visitor failed at window 4"),
          "%s", err.text);
    offload_close(&o);
}

static void test_a_directory_that_cannot_be_made_is_named_with_the_rank(void)
{
    char file[64], dir[80];
    snprintf(file, sizeof file, "%s/a_file", root);
    FILE *f = fopen(file, "w");
    if (f) fclose(f);
    snprintf(dir, sizeof dir, "%s/sub", file);
    struct offload o = {0};
    struct plait_error err;
    CHECK(offload_open(&o, dir, 5, 10, 4, &err) != 0 && strstr(err.text, dir) &&
              strstr(err.text, "rank 5"),
          "%s", err.text);
}

int main(void)
{
    if (!mkdtemp(root)) return 1;
    RUN(test_windows_tile_the_slice_and_keep_what_they_wrote);
    RUN(test_a_failing_visitor_stops_the_walk_with_its_error);
    RUN(test_a_directory_that_cannot_be_made_is_named_with_the_rank);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root);
    return check_exit_code();
}
