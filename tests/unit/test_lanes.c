/* test_lanes.c — the baton of runtime/lanes.h: two passes that switch at each started
 * exchange compute strictly in turn (never both at once, each with its own set entered),
 * the one left alone running to its end; the switches counted; a failing lane's error
 * returned once the other has finished; the second lane's thread reused pair after pair. */
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "runtime/lanes.h"
#include "tests/unit/check.h"

struct trace {
    struct lanes *L;
    char order[64]; /* "A0B0A1..." each segment as it computed */
    int n;
    atomic_int inside; /* lanes computing at once */
    int entered;       /* the last lane enter installed */
    atomic_int waits;  /* exchanges waited for */
};

/* An exchange's wait: the time it moves */
static int slow_wait(void *req, struct plait_error *err)
{
    (void)err;
    struct trace *t = req;
    usleep(2000);
    atomic_fetch_add(&t->waits, 1);
    return 0;
}

static const struct group exchanges = {.size = 2, .wait = slow_wait};

static void enter(void *ctx, int lane)
{
    ((struct trace *)ctx)->entered = lane;
}

/* A pass of n exchanges: n + 1 segments, each noted, an exchange started after all but
 * the last; fails (at its end) when n is negative */
struct pass {
    struct trace *t;
    int lane, n;
};

static int run_pass(void *ctx, struct plait_error *err)
{
    struct pass *p = ctx;
    struct trace *t = p->t;
    int n = p->n < 0 ? -p->n : p->n;
    for (int s = 0; s <= n; s++) {
        CHECK(atomic_fetch_add(&t->inside, 1) == 0, "lane %d segment %d: the other computes",
              p->lane, s);
        CHECK(t->entered == p->lane, "lane %d computes with lane %d's set", p->lane, t->entered);
        usleep(1000); /* a window for the other lane to break in */
        t->order[t->n++] = (char)('A' + p->lane);
        t->order[t->n++] = (char)('0' + s);
        atomic_fetch_sub(&t->inside, 1);
        if (s < n && lanes_switch(t->L, &exchanges, t, err)) return -1;
    }
    return p->n < 0 ? error_set(err, "lane %d failed", p->lane) : 0;
}

/* Runs a pair of passes of a and b exchanges: 0 or -1, the trace in t */
static int pair(struct trace *t, int a, int b, struct plait_error *err)
{
    struct lanes *L = t->L;
    memset(t, 0, sizeof *t);
    t->L = L;
    struct pass pa = {t, 0, a}, pb = {t, 1, b};
    const lane_pass pass[2] = {run_pass, run_pass};
    void *const ctx[2] = {&pa, &pb};
    int rc = lanes_run(t->L, pass, ctx, err);
    t->order[t->n] = '\0';
    CHECK(t->entered == 0, "lane %d's set left in after the pair", t->entered);
    return rc;
}

/* t's lanes, entering into t: false (a failed check) when they could not start */
static bool open_lanes(struct trace *t)
{
    struct plait_error err = {0};
    t->L = lanes_open(enter, t, &err);
    CHECK(t->L != NULL, "lanes_open: %s", err.text);
    return t->L != NULL;
}

static void test_the_lanes_take_turns_at_each_exchange(void)
{
    struct plait_error err = {0};
    static struct trace t;
    if (!open_lanes(&t)) return;
    CHECK(!lanes_running(t.L), "running before a pair");
    CHECK(pair(&t, 3, 2, &err) == 0, "pair: %s", err.text);
    /* lane 1 done after its last segment: lane 0 runs on alone, handing nothing over */
    CHECK(strcmp(t.order, "A0B0A1B1A2B2A3") == 0, "order %s", t.order);
    CHECK(lanes_switches(t.L) == 5, "%ld switches", lanes_switches(t.L));
    CHECK(atomic_load(&t.waits) == 5, "%d exchanges waited for", atomic_load(&t.waits));
    /* the same thread again; a pass without an exchange never switches */
    CHECK(pair(&t, 0, 2, &err) == 0, "pair: %s", err.text);
    CHECK(strcmp(t.order, "A0B0B1B2") == 0, "order %s", t.order);
    CHECK(lanes_switches(t.L) == 5, "%ld switches", lanes_switches(t.L));
    CHECK(pair(&t, 2, 0, &err) == 0, "pair: %s", err.text);
    CHECK(strcmp(t.order, "A0B0A1A2") == 0, "order %s", t.order);
    CHECK(lanes_switches(t.L) == 6, "%ld switches", lanes_switches(t.L));
    CHECK(!lanes_running(t.L), "running after the pairs");
    lanes_close(t.L);
}

static void test_a_failing_lane_fails_the_pair_once_the_other_is_done(void)
{
    struct plait_error err = {0};
    static struct trace t;
    if (!open_lanes(&t)) return;
    CHECK(pair(&t, 2, -1, &err) == -1, "a failing lane 1 passed");
    CHECK(strstr(err.text, "lane 1 failed") != NULL, "error %s", err.text);
    CHECK(strcmp(t.order, "A0B0A1B1A2") == 0, "order %s", t.order);
    err = (struct plait_error){0};
    CHECK(pair(&t, -1, 1, &err) == -1, "a failing lane 0 passed");
    CHECK(strstr(err.text, "lane 0 failed") != NULL, "error %s", err.text);
    CHECK(strcmp(t.order, "A0B0A1B1") == 0, "order %s", t.order);
    CHECK(pair(&t, 1, 1, &err) == 0, "the pair after the failures: %s", err.text);
    lanes_close(t.L);
    lanes_close(NULL);
}

int main(void)
{
    RUN(test_the_lanes_take_turns_at_each_exchange);
    RUN(test_a_failing_lane_fails_the_pair_once_the_other_is_done);
    return check_exit_code();
}
