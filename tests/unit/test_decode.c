/* test_decode.c — the key/value-cache decoder (sample/decode.h) against the
 * model's full forward pass: after feeding n tokens one at a time, its logits
 * are the forward pass's last row over those n tokens (to fp32 rounding), for
 * every n up to the context, for a GPT-2 and for mixtures of experts (a GPT-2's,
 * a Llama's); after a reset it starts over at position 0; it refuses a token
 * past the context or outside the vocabulary. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "common/rng.h"
#include "kernels/ops.h"
#include "sample/decode.h"
#include "runtime/model.h"
#include "tests/unit/cpu_ctx.h"

static const struct gpt2_config dense = {
    .max_seq_len = 12, .vocab = 50, .padded_vocab = 64, .layers = 2, .heads = 4, .hidden = 16};
/* mixture of experts: 4 experts (top 2) and a shared one in layer 1, a dense MLP in layer 0;
 * a Llama's too (SwiGLU experts) */
static const struct gpt2_config moe = {.max_seq_len = 12,
                                       .vocab = 50,
                                       .padded_vocab = 64,
                                       .layers = 2,
                                       .heads = 4,
                                       .hidden = 16,
                                       .experts = 4,
                                       .top_k = 2,
                                       .moe_every = 2,
                                       .shared_experts = 1,
                                       .moe_ffn = 24};
static const struct gpt2_config llama_moe = {.max_seq_len = 12,
                                             .vocab = 50,
                                             .padded_vocab = 64,
                                             .layers = 2,
                                             .heads = 4,
                                             .hidden = 16,
                                             .llama = true,
                                             .kv_heads = 2,
                                             .ffn_hidden = 40,
                                             .untied = true,
                                             .rope_theta = 1e4,
                                             .norm_eps = 1e-5f,
                                             .experts = 4,
                                             .top_k = 2,
                                             .moe_every = 1,
                                             .shared_experts = 1,
                                             .moe_ffn = 20};
static struct gpt2_config cfg;
enum { T = 12 };

/* the worst difference between the decoder's logits and row n-1 of the forward pass */
static double worst_against_forward(struct model *m, struct decoder *d, const int32_t *seq, int n)
{
    struct plait_error err = {.text = ""};
    float logits[T * 64]; /* (n, padded_vocab) */
    m->logits_out = logits;
    int failed = model_forward(m, seq, NULL, 1, n, 0.0f, NULL, &err);
    m->logits_out = NULL;
    if (failed) {
        CHECK(0, "forward: %s", err.text);
        return INFINITY;
    }
    const float *row = logits + (size_t)(n - 1) * cfg.padded_vocab;
    double worst = 0;
    for (int v = 0; v < cfg.vocab; v++) {
        double e = fabs(row[v] - d->logits[v]) / (1e-3 + fabs(row[v]));
        worst = e > worst ? e : worst;
    }
    return worst;
}

static void test_each_position_matches_the_full_forward_pass(void)
{
    struct ops_ctx *cx = test_cpu_open();
    struct model m;
    struct plait_error err = {.text = ""};
    struct gpt2_part part = gpt2_part_whole(&cfg);
    struct model_shape shape = {.B = 1, .T = T, .slots = 1, .dp = 1};
    CHECK(model_init(&m, &cfg, &part, NULL, ops_cpu(), cx, &shape, &err) == 0, "%s", err.text);
    struct rng r;
    rng_seed(&r, 5, 0);
    float *p = malloc(m.shard.total * sizeof *p);
    for (size_t i = 0; i < m.shard.total; i++) p[i] = (float)(0.3 * rng_normal(&r));
    model_set_params(&m, p);
    int32_t seq[T];
    for (int i = 0; i < T; i++) seq[i] = (int32_t)rng_below(&r, cfg.vocab);
    struct decoder d;
    CHECK(decoder_init(&d, &m.shard, m.params, &err) == 0, "%s", err.text);
    double worst = 0;
    for (int n = 1; n <= T; n++) {
        CHECK(decoder_feed(&d, seq[n - 1], &err) == 0, "feed %d: %s", n, err.text);
        double e = worst_against_forward(&m, &d, seq, n);
        worst = e > worst ? e : worst;
    }
    printf("  worst relative difference over %d positions: %.3g (bound 1e-4)\n", T, worst);
    CHECK(worst < 1e-4, "the decoder's logits differ from the forward pass: %.3g", worst);
    CHECK(decoder_feed(&d, 1, &err) == -1 && strstr(err.text, "context is full"),
          "a token past the context: %s", err.text);
    decoder_reset(&d);
    for (int n = 1; n <= 3; n++) CHECK(decoder_feed(&d, seq[T - 4 + n], &err) == 0, "%s", err.text);
    CHECK(worst_against_forward(&m, &d, seq + T - 3, 3) < 1e-4, "after a reset");
    CHECK(decoder_feed(&d, cfg.vocab, &err) == -1 && strstr(err.text, "outside the vocabulary"),
          "a token outside the vocabulary: %s", err.text);
    decoder_free(&d);
    free(p);
    model_free(&m);
    ops_cpu()->close(cx);
}

int main(void)
{
    cfg = dense;
    RUN(test_each_position_matches_the_full_forward_pass);
    cfg = moe; /* each token through its router's experts, as the forward pass's */
    RUN(test_each_position_matches_the_full_forward_pass);
    cfg = llama_moe;
    RUN(test_each_position_matches_the_full_forward_pass);
    return check_exit_code();
}
