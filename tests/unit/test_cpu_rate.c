/* test_cpu_rate.c — the CPU rates measured at start-up (kernels/cpu/cpu_rate.c)
 * and the cost model's use of them: every rate positive and finite in fp32 and
 * bf16 (and on the threads asked for), a shape the kernels cannot run refused, and this machine's
 * modelled speed following the rates it is given. How fast is make bench-cost's business, never
 * asserted here. */
#include "kernels/cpu/cpu_rate.h"

#include <math.h>
#include <string.h>

#include "common/place/cost.h"
#include "common/place/layout.h" // layout_modelled_tokens_per_s
#include "common/plan/plan.h"
#include "tests/unit/check.h"

/* GPT-2's layout, small: 2 sequences of 16 tokens, C 32 in 2 heads, 2 layers. */
static const struct cpu_rate_shape small = {.rows = 32,
                                            .batch = 2,
                                            .seq_len = 16,
                                            .hidden = 32,
                                            .width = 32,
                                            .heads = 2,
                                            .layers = 2,
                                            .params = 30000};

static void test_every_rate_is_measured_positive(void)
{
    for (int bf16 = 0; bf16 <= 1; bf16++) {
        struct cpu_rate_shape s = small;
        s.bf16 = bf16;
        struct cpu_rate r;
        char err[256] = "";
        CHECK(cpu_rate_measure(&s, bf16 ? 1 : 0, &r, err, sizeof err) == 0, "%s", err);
        CHECK(bf16 ? r.cpus == 1 : r.cpus >= 1, "%d", r.cpus); /* bf16 on one thread */
        double rates[] = {r.matmul_gflops, r.attention_gflops, r.activation_gbps, r.memory_gbps,
                          r.parallel_op_us};
        for (int k = 0; k < 5; k++)
            CHECK(rates[k] > 0 && isfinite(rates[k]), "bf16 %d rate %d: %g", bf16, k, rates[k]);
        CHECK(r.seconds > 0, "%g", r.seconds);
    }
}

/* Above tp 4 a rank's 4·width is narrower than the hidden size: the products'
 * gradients of C columns (the projections') were written past buffers of 4·width
 * (plait check and plait-train aborted on tp 8; the ASan build says where) */
static void test_a_rank_narrower_than_the_hidden_size_is_measured(void)
{
    struct cpu_rate_shape s = cpu_rate_shape_of(2, 16, 64, 8, 2, 256, 8, 1, false);
    struct cpu_rate r;
    char err[256] = "";
    CHECK(s.width == 8, "%d", s.width);
    CHECK(cpu_rate_measure(&s, 1, &r, err, sizeof err) == 0, "%s", err);
    CHECK(r.matmul_gflops > 0 && isfinite(r.matmul_gflops), "%g", r.matmul_gflops);
}

static void test_a_shape_the_kernels_cannot_run_is_refused(void)
{
    struct cpu_rate_shape s = small;
    s.heads = 3; /* does not divide the width */
    struct cpu_rate r;
    char err[256] = "";
    CHECK(cpu_rate_measure(&s, 0, &r, err, sizeof err) == -1, "accepted");
    CHECK(strstr(err, "3 heads") != NULL, "%s", err);
}

static void test_shape_of_a_rank_splits_width_heads_and_layers(void)
{
    struct cpu_rate_shape s = cpu_rate_shape_of(4, 64, 768, 12, 12, 50304, 2, 4, true);
    CHECK(s.rows == 256 && s.batch == 4 && s.seq_len == 64 && s.hidden == 768, "rows");
    CHECK(s.width == 384 && s.heads == 6 && s.layers == 3 && s.bf16, "%d %d %d", s.width, s.heads,
          s.layers);
    /* 3 layers' 12·768·384 and half of 50304·768 */
    CHECK(s.params == 3.0 * 12 * 768 * 384 + 25152.0 * 768, "%g", s.params);
}

/* One rank on this machine: its step is compute, memory-bound ops, parallel
 * starts and the optimizer, each inversely proportional to a rate (or
 * proportional to the start's time), so twice every rate and half the start
 * model twice the tokens a second; unmeasured, the assumed rate models
 * something else. */
static void test_modelled_speed_follows_the_measured_rates(void)
{
    const char *text = "{\"model\": {\"layers\": 2, \"heads\": 2, \"hidden\": 32, \"vocab\": 64, "
                       "\"seq_len\": 16},\n \"data\": {\"train\": \"train.bin\"},\n"
                       " \"batch\": {\"micro_batch\": 2}, \"steps\": 10,\n"
                       " \"parallel\": {\"device\": \"cpu\"}}\n";
    struct plait_error err = {0};
    struct plan *p = plan_load_text(text, "test_cpu_rate", "/", NULL, 0, &err);
    CHECK(p != NULL, "%s", err.text);
    if (!p) return;
    struct cpu_rate r;
    char why[256] = "";
    CHECK(cpu_rate_measure(&small, 0, &r, why, sizeof why) == 0, "%s", why);
    struct cost_cpu_rates once = {r.matmul_gflops, r.attention_gflops, r.activation_gbps,
                                  r.memory_gbps,   r.parallel_op_us,   0};
    struct cost_cpu_rates twice = {2 * r.matmul_gflops,   2 * r.attention_gflops,
                                   2 * r.activation_gbps, 2 * r.memory_gbps,
                                   r.parallel_op_us / 2,  0};
    double a = layout_modelled_tokens_per_s(p, &once), b = layout_modelled_tokens_per_s(p, &twice);
    double assumed = layout_modelled_tokens_per_s(p, NULL);
    CHECK(a > 0 && fabs(b / a - 2) < 1e-9, "%g %g", a, b);
    CHECK(assumed > 0 && assumed != a, "%g %g", assumed, a);
    plan_free(p);
}

int main(void)
{
    RUN(test_every_rate_is_measured_positive);
    RUN(test_a_rank_narrower_than_the_hidden_size_is_measured);
    RUN(test_a_shape_the_kernels_cannot_run_is_refused);
    RUN(test_shape_of_a_rank_splits_width_heads_and_layers);
    RUN(test_modelled_speed_follows_the_measured_rates);
    return check_exit_code();
}
