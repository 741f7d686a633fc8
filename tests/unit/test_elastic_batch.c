/* test_elastic_batch.c — the global batch across layouts (common/place/elastic_batch.h):
 * a fresh run fills the slots and keeps the plan's grad_accum; a resumed one
 * takes the most replicas that keep its global batch, with the grad_accum
 * that does, and never one the interleaved schedule cannot run. */
#include <stdlib.h>

#include "common/place/elastic_batch.h"
#include "tests/unit/check.h"

static struct plan *plan_with(const char *parallel, int grad_accum)
{
    char text[768];
    snprintf(text, sizeof text,
             "{\"model\": {\"layers\": 4, \"heads\": 2, \"hidden\": 8, \"vocab\": 256, "
             "\"seq_len\": 16},\n \"data\": {\"train\": \"train.bin\"},\n"
             " \"batch\": {\"grad_accum\": %d},\n \"parallel\": %s,\n \"steps\": 10}\n",
             grad_accum, parallel);
    struct plait_error err = {0};
    struct plan *p = plan_load_text(text, "test_elastic_batch", "/", NULL, 0, &err);
    CHECK(p != NULL, "plan_load_text: %s", err.text);
    return p;
}

static void test_a_fresh_run_fills_the_slots_with_the_plans_grad_accum(void)
{
    struct plan *p = plan_with("{\"dp\": \"auto\"}", 3);
    if (!p) return;
    CHECK(elastic_batch_dp(p, 5, 1, NULL) == 5, "dp %d", elastic_batch_dp(p, 5, 1, NULL));
    CHECK(elastic_batch_grad_accum(p, 5, 1, NULL) == 3, "grad_accum %d",
          elastic_batch_grad_accum(p, 5, 1, NULL));
    plan_free(p);
}

static void test_a_resumed_run_keeps_its_global_batch_on_fewer_replicas(void)
{
    struct plan *p = plan_with("{\"dp\": \"auto\"}", 1);
    if (!p) return;
    struct ckpt_batch before = {.global = 12, .dp = 4, .grad_accum = 3};
    /* 5 slots: 4 replicas of 3 keep 12 micro-batches (5 would not divide it) */
    CHECK(elastic_batch_dp(p, 5, 1, &before) == 4, "dp %d", elastic_batch_dp(p, 5, 1, &before));
    CHECK(elastic_batch_grad_accum(p, 4, 1, &before) == 3, "grad_accum %d",
          elastic_batch_grad_accum(p, 4, 1, &before));
    /* a node lost: 2 replicas of 6 */
    CHECK(elastic_batch_dp(p, 2, 1, &before) == 2 &&
              elastic_batch_grad_accum(p, 2, 1, &before) == 6,
          "dp %d grad_accum %d", elastic_batch_dp(p, 2, 1, &before),
          elastic_batch_grad_accum(p, 2, 1, &before));
    /* a dp that does not divide it (a launcher that must fill its slots) keeps the plan's */
    CHECK(elastic_batch_grad_accum(p, 5, 1, &before) == 1, "grad_accum %d",
          elastic_batch_grad_accum(p, 5, 1, &before));
    plan_free(p);
}

static void test_the_interleaved_schedule_gets_a_grad_accum_it_can_run(void)
{
    struct plan *p = plan_with("{\"pp\": 2, \"dp\": \"auto\", \"schedule\": \"interleaved\", "
                               "\"virtual_stages\": 2}",
                               2);
    if (!p) return;
    struct ckpt_batch before = {.global = 12, .dp = 6, .grad_accum = 2};
    /* 4 replicas of 3 keep 12 but 3 is no multiple of pp 2: 3 replicas of 4 do */
    CHECK(elastic_batch_dp(p, 4, 2, &before) == 3, "dp %d", elastic_batch_dp(p, 4, 2, &before));
    CHECK(elastic_batch_grad_accum(p, 3, 2, &before) == 4, "grad_accum %d",
          elastic_batch_grad_accum(p, 3, 2, &before));
    CHECK(elastic_batch_grad_accum(p, 4, 2, &before) == 2, "grad_accum %d (the plan's)",
          elastic_batch_grad_accum(p, 4, 2, &before));
    plan_free(p);
}

/* batch.global_batch: a fresh run with dp "auto" keeps it on any number of slots, as a
 * resumed run keeps its checkpoint's */
static void test_a_fresh_run_keeps_the_plans_global_batch_on_any_slots(void)
{
    char text[512];
    snprintf(text, sizeof text,
             "{\"model\": {\"layers\": 4, \"heads\": 2, \"hidden\": 8, \"vocab\": 256, "
             "\"seq_len\": 16},\n \"data\": {\"train\": \"train.bin\"},\n"
             " \"batch\": {\"micro_batch\": 2, \"global_batch\": 24},\n"
             " \"parallel\": {\"dp\": \"auto\"},\n \"steps\": 10}\n");
    struct plait_error err = {0};
    struct plan *p = plan_load_text(text, "test_elastic_batch", "/", NULL, 0, &err);
    CHECK(p != NULL, "plan_load_text: %s", err.text);
    if (!p) return;
    /* 12 micro-batches a step: 5 slots -> 4 replicas of 3, 8 -> 6 of 2, 7 -> 6 of 2 */
    int slots[] = {1, 5, 7, 8, 12, 13}, dp[] = {1, 4, 6, 6, 12, 12}, accum[] = {12, 3, 2, 2, 1, 1};
    for (int i = 0; i < 6; i++) {
        int d = elastic_batch_dp(p, slots[i], 1, NULL);
        int g = elastic_batch_grad_accum(p, d, 1, NULL);
        CHECK(d == dp[i] && g == accum[i], "%d slots: dp %d × grad_accum %d, expected %d × %d",
              slots[i], d, g, dp[i], accum[i]);
        CHECK((int64_t)d * g * p->batch.micro_batch == 24, "%d slots: the global batch is %lld",
              slots[i], (long long)d * g * p->batch.micro_batch);
    }
    plan_free(p);
}

int main(void)
{
    RUN(test_a_fresh_run_keeps_the_plans_global_batch_on_any_slots);
    RUN(test_a_fresh_run_fills_the_slots_with_the_plans_grad_accum);
    RUN(test_a_resumed_run_keeps_its_global_batch_on_fewer_replicas);
    RUN(test_the_interleaved_schedule_gets_a_grad_accum_it_can_run);
    return check_exit_code();
}
