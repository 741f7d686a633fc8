/* test_lr_schedule.c — the learning rate of every step (common/plan/lr_schedule.h):
 * each schedule at the steps where its shape turns, against the closed forms;
 * optimizer.decay_steps holds the schedule when steps grows; a resume that
 * moves the schedule is named with the step and both rates. */
#include <math.h>
#include <string.h>

#include "common/plan/lr_schedule.h"
#include "tests/unit/check.h"

static struct plan_optimizer schedule(enum plan_schedule s, int warmup, int decay_steps)
{
    return (struct plan_optimizer){.lr = 1e-3, .min_lr_ratio = 0.1, .warmup_steps = warmup,
                                   .schedule = s, .decay_steps = decay_steps,
                                   .decay_fraction = 0.2};
}

static bool near(double a, double b)
{
    return fabs(a - b) <= 1e-15 + 1e-12 * fabs(b);
}

static void test_warmup_then_each_schedule_at_its_turns(void)
{
    const double lr = 1e-3, lo = 1e-4;
    struct plan_optimizer c = schedule(PLAN_SCHEDULE_COSINE, 10, 0);
    CHECK(near(plan_lr(&c, 110, 0), lr / 10), "warmup step 0: %g", plan_lr(&c, 110, 0));
    CHECK(near(plan_lr(&c, 110, 9), lr), "warmup's last step: %g", plan_lr(&c, 110, 9));
    CHECK(near(plan_lr(&c, 110, 10), lr), "cosine's first: %g", plan_lr(&c, 110, 10));
    CHECK(near(plan_lr(&c, 110, 60), (lr + lo) / 2), "cosine half way: %g", plan_lr(&c, 110, 60));
    CHECK(near(plan_lr(&c, 110, 35), lo + (lr - lo) * (1 + cos(M_PI / 4)) / 2), "cosine at 1/4: %g",
          plan_lr(&c, 110, 35));
    struct plan_optimizer l = schedule(PLAN_SCHEDULE_LINEAR, 10, 0);
    CHECK(near(plan_lr(&l, 110, 35), lr - (lr - lo) / 4), "linear at 1/4: %g", plan_lr(&l, 110, 35));
    CHECK(near(plan_lr(&l, 110, 110), lo), "linear at its end: %g", plan_lr(&l, 110, 110));
    /* wsd: 100 steps after warmup, the last 20 decay (from step 90 to 110) */
    struct plan_optimizer w = schedule(PLAN_SCHEDULE_WSD, 10, 0);
    CHECK(near(plan_lr(&w, 110, 89), lr), "wsd stable: %g", plan_lr(&w, 110, 89));
    CHECK(near(plan_lr(&w, 110, 90), lr), "wsd decay's first step: %g", plan_lr(&w, 110, 90));
    CHECK(near(plan_lr(&w, 110, 100), (lr + lo) / 2), "wsd decay half way: %g",
          plan_lr(&w, 110, 100));
    struct plan_optimizer k = schedule(PLAN_SCHEDULE_CONSTANT, 0, 0);
    CHECK(near(plan_lr(&k, 110, 0), lr) && near(plan_lr(&k, 110, 109), lr), "constant");
}

static void test_decay_steps_hold_the_schedule_when_steps_grow(void)
{
    for (int s = PLAN_SCHEDULE_COSINE; s <= PLAN_SCHEDULE_WSD; s++) {
        struct plan_optimizer o = schedule((enum plan_schedule)s, 5, 50);
        for (int step = 0; step < 80; step++)
            CHECK(plan_lr(&o, 30, step) == plan_lr(&o, 80, step),
                  "%s: step %d changed with steps", plan_schedule_name(o.schedule), step);
        CHECK(near(plan_lr(&o, 80, 50), 1e-4) && near(plan_lr(&o, 80, 79), 1e-4),
              "%s: past decay_steps the rate is the minimum (%g)", plan_schedule_name(o.schedule),
              plan_lr(&o, 80, 60));
    }
}

static void test_a_resume_that_moves_the_schedule_is_named(void)
{
    struct plan before = {.steps = 20, .optimizer = schedule(PLAN_SCHEDULE_COSINE, 2, 0)};
    struct plan after = before;
    after.steps = 40;
    char note[256] = "";
    CHECK(plan_lr_jump(&before, &after, 20, note, sizeof note), "steps 20 -> 40 moves cosine");
    CHECK(strstr(note, "step 21") && strstr(note, "optimizer.decay_steps 20 keeps"),
          "the note: %s", note);
    CHECK(!plan_lr_jump(&before, &after, 0, note, sizeof note) &&
              !plan_lr_jump(&before, &after, 1, note, sizeof note),
          "warmup is the same under both");
    after.optimizer.decay_steps = 20;
    CHECK(!plan_lr_jump(&before, &after, 20, note, sizeof note),
          "decay_steps 20 keeps the schedule: %s", note);
    struct plan flat = {.steps = 20, .optimizer = schedule(PLAN_SCHEDULE_CONSTANT, 2, 0)};
    struct plan longer = flat;
    longer.steps = 40;
    CHECK(!plan_lr_jump(&flat, &longer, 20, note, sizeof note), "constant does not move");
}

int main(void)
{
    RUN(test_warmup_then_each_schedule_at_its_turns);
    RUN(test_decay_steps_hold_the_schedule_when_steps_grow);
    RUN(test_a_resume_that_moves_the_schedule_is_named);
    return check_exit_code();
}
