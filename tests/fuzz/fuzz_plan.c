/* fuzz_plan.c — libFuzzer target for the plan parser (common/plan/plan.h): plan text,
 * optionally a line "--set" and one "dot.path=value" override per line. Beyond
 * surviving: errors are one printable line naming their source, a loaded plan
 * keeps every rule of plan.h, and plan_to_json(_line) reads back to the same
 * text. What it asserts in full: tests/fuzz/README.md. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "common/gpt2/gpt2_layout.h" // gpt2_layout (the model must be addressable)
#include "common/formats/llmc.h"        // llmc_model_header_fill (the init fixture)
#include "common/plan/plan.h"
#include "tests/fuzz/harness.h"

#define SOURCE "fuzz.json"
#define SEPARATOR "\n--set\n"
#define MAX_OVERRIDES 16

/* Files beside the plan (relative paths resolve there), for model.init:
 * "tiny_gpt2.bin" (fp32, max T 4, vocab 8, padded 8, 1 layer, 2 heads, hidden
 * 4), "wide_gpt2.bin" (bf16 with vocab 65537, more than tokens can say), both
 * with zero weights, and "tiny_tokens.bin", a token shard (not a checkpoint):
 * links in fuzz_dir() to the harness's memfds. */
enum { TINY_FD = FUZZ_FD, WIDE_FD, TOKENS_FD, PLAN_FD };
static const struct llmc_model_header tiny = {.version = LLMC_MODEL_VERSION_FP32,
                                              .max_seq_len = 4,
                                              .vocab = 8,
                                              .padded_vocab = 8,
                                              .layers = 1,
                                              .heads = 2,
                                              .hidden = 4};
static const struct llmc_model_header wide = {.version = LLMC_MODEL_VERSION_BF16,
                                              .max_seq_len = 1,
                                              .vocab = 65537,
                                              .padded_vocab = 65537,
                                              .layers = 1,
                                              .heads = 1,
                                              .hidden = 1};

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void link_file(const char *name, int fd)
{
    char link[4096];
    snprintf(link, sizeof link, "%s/%s", fuzz_dir(), name);
    FUZZ_CHECK(symlink(fuzz_fd_path(fd), link) == 0, "symlink %s", link);
}

static void write_checkpoint(const char *name, int fd, const struct llmc_model_header *h)
{
    int64_t params = llmc_param_count(h->max_seq_len, h->padded_vocab, h->layers, h->hidden);
    size_t bytes =
        LLMC_HEADER_BYTES + (size_t)params * (h->version == LLMC_MODEL_VERSION_FP32 ? 4 : 2);
    char *file = calloc(1, bytes);
    FUZZ_CHECK(file, "out of memory");
    llmc_model_header_fill((int32_t *)(void *)file, h);
    fuzz_file(fd, file, bytes);
    link_file(name, fd);
    free(file);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    write_checkpoint("tiny_gpt2.bin", TINY_FD, &tiny);
    write_checkpoint("wide_gpt2.bin", WIDE_FD, &wide);
    char shard[LLMC_HEADER_BYTES + 16];
    llmc_tokens_header_fill((int32_t *)(void *)shard, 8, 2);
    for (int t = 0; t < 8; t++) {
        uint16_t token = (uint16_t)t;
        memcpy(shard + LLMC_HEADER_BYTES + 2 * t, &token, 2);
    }
    fuzz_file(TOKENS_FD, shard, sizeof shard);
    link_file("tiny_tokens.bin", TOKENS_FD);
    return 0;
}

/* An error is one printable line that starts with where it came from. */
static void check_error(const char *text, const char *source)
{
    fuzz_check_message(text);
    FUZZ_CHECK(strncmp(text, source, strlen(source)) == 0 || strncmp(text, "--set ", 6) == 0,
               "the error names neither %s nor an override: %s", source, text);
}

static bool absolute_or_null(const char *path)
{
    return !path || path[0] == '/';
}

/* What plan.h promises of a loaded plan. */
static void check_plan(const struct plan *p)
{
    const struct plan_model *m = &p->model;
    FUZZ_CHECK(p->source && strcmp(p->source, SOURCE) == 0, "source %s", p->source);
    bool llama = m->arch && strcmp(m->arch, "llama") == 0;
    FUZZ_CHECK(m->arch && (llama || strcmp(m->arch, "gpt2") == 0), "arch %s", m->arch);
    if (llama)
        FUZZ_CHECK(m->kv_heads >= 1 && m->heads % m->kv_heads == 0 && m->ffn_hidden >= 1 &&
                       (m->hidden / m->heads) % 2 == 0,
                   "a llama of %d key/value heads over %d, MLP %d, head size %d", m->kv_heads,
                   m->heads, m->ffn_hidden, m->hidden / m->heads);
    else
        FUZZ_CHECK(m->kv_heads == m->heads && (long long)m->ffn_hidden == 4LL * m->hidden &&
                       m->tie_embeddings,
                   "a gpt2 with %d key/value heads of %d, MLP %d, tied %d", m->kv_heads, m->heads,
                   m->ffn_hidden, m->tie_embeddings);
    if (p->parallel.tp != PLAN_AUTO)
        FUZZ_CHECK(m->kv_heads % p->parallel.tp == 0 && m->ffn_hidden % p->parallel.tp == 0,
                   "tp %d splits %d key/value heads and an MLP of %d", p->parallel.tp,
                   m->kv_heads, m->ffn_hidden);
    FUZZ_CHECK(m->layers >= 1 && m->heads >= 1 && m->hidden >= 1 && m->seq_len >= 1,
               "L %d NH %d C %d T %d", m->layers, m->heads, m->hidden, m->seq_len);
    FUZZ_CHECK(m->hidden % m->heads == 0, "heads %d do not divide hidden %d", m->heads, m->hidden);
    FUZZ_CHECK(m->vocab >= 1 && m->vocab <= PLAN_VOCAB_MAX, "vocab %d", m->vocab);
    FUZZ_CHECK(m->padded_vocab >= m->vocab, "padded vocab %d < vocab %d", m->padded_vocab,
               m->vocab);
    FUZZ_CHECK(m->max_seq_len >= m->seq_len, "max T %d < T %d", m->max_seq_len, m->seq_len);
    struct gpt2_config cfg = gpt2_config_of_plan(m);
    struct gpt2_layout layout;
    FUZZ_CHECK(gpt2_layout(&cfg, &layout) == 0, "a model too large to address was accepted");
    if (m->init) {
        struct plait_error err = {.text = ""};
        struct llmc_model_header h;
        FUZZ_CHECK(llmc_read_model_header(m->init, &h, &err) == 0, "model.init: %s", err.text);
        FUZZ_CHECK(h.max_seq_len == m->max_seq_len && h.vocab == m->vocab &&
                       h.padded_vocab == m->padded_vocab && h.layers == m->layers &&
                       h.heads == m->heads && h.hidden == m->hidden,
                   "the model differs from model.init");
    }
    FUZZ_CHECK(absolute_or_null(m->init), "model.init %s", m->init);
    FUZZ_CHECK(p->data.train && p->data.train[0] == '/', "data.train %s", p->data.train);
    FUZZ_CHECK(absolute_or_null(p->data.val), "data.val %s", p->data.val);
    FUZZ_CHECK(absolute_or_null(p->data.tokenizer), "data.tokenizer %s", p->data.tokenizer);
    FUZZ_CHECK(p->data.val_every >= 0 && (p->data.val_every == 0 || p->data.val),
               "val_every %d without val", p->data.val_every);
    FUZZ_CHECK(p->data.val_batches >= 1, "val_batches %d", p->data.val_batches);
    FUZZ_CHECK(p->batch.micro_batch >= 1 && p->batch.grad_accum >= 1, "B %d accum %d",
               p->batch.micro_batch, p->batch.grad_accum);

    const struct plan_optimizer *o = &p->optimizer;
    FUZZ_CHECK(o->lr > 0 && o->eps > 0 && o->weight_decay >= 0 && o->grad_clip >= 0,
               "lr %g eps %g wd %g clip %g", o->lr, o->eps, o->weight_decay, o->grad_clip);
    FUZZ_CHECK(o->beta1 >= 0 && o->beta1 < 1 && o->beta2 >= 0 && o->beta2 < 1, "betas %g %g",
               o->beta1, o->beta2);
    FUZZ_CHECK(o->min_lr_ratio >= 0 && o->min_lr_ratio <= 1, "min_lr_ratio %g", o->min_lr_ratio);
    FUZZ_CHECK(isfinite(o->lr) && isfinite(o->eps) && isfinite(o->weight_decay) &&
                   isfinite(o->grad_clip),
               "a real that is not finite");
    FUZZ_CHECK(o->schedule >= PLAN_SCHEDULE_CONSTANT && o->schedule <= PLAN_SCHEDULE_WSD,
               "schedule %d", (int)o->schedule);
    FUZZ_CHECK(p->steps >= 1 && o->warmup_steps >= 0 && o->warmup_steps <= p->steps,
               "warmup %d steps %d", o->warmup_steps, p->steps);
    int decay_end = o->decay_steps ? o->decay_steps : p->steps;
    FUZZ_CHECK(o->schedule == PLAN_SCHEDULE_CONSTANT || o->warmup_steps < decay_end,
               "a decaying schedule with warmup %d >= its decay's end %d", o->warmup_steps,
               decay_end);
    FUZZ_CHECK(o->schedule != PLAN_SCHEDULE_CONSTANT || o->decay_steps == 0,
               "decay_steps %d with the constant schedule", o->decay_steps);
    FUZZ_CHECK(o->decay_fraction > 0 && o->decay_fraction <= 1, "decay_fraction %g",
               o->decay_fraction);
    FUZZ_CHECK(p->batch.global_batch == 0 || p->batch.global_batch % p->batch.micro_batch == 0,
               "global_batch %d micro_batch %d", p->batch.global_batch, p->batch.micro_batch);
    FUZZ_CHECK(p->precision == PLAN_PRECISION_FP32 || p->precision == PLAN_PRECISION_BF16 ||
                   p->precision == PLAN_PRECISION_FP8,
               "precision %d", (int)p->precision);
    FUZZ_CHECK((p->precision == PLAN_PRECISION_FP8) == (p->fp8_scaling != PLAN_FP8_NONE),
               "precision %d with fp8_scaling %d", (int)p->precision, (int)p->fp8_scaling);
    FUZZ_CHECK(p->recompute >= PLAN_RECOMPUTE_NONE && p->recompute <= PLAN_RECOMPUTE_FULL,
               "recompute %d", (int)p->recompute);
    FUZZ_CHECK(p->checkpoint.dir && p->checkpoint.dir[0], "checkpoint.dir empty");
    FUZZ_CHECK(p->checkpoint.every >= 0 && p->checkpoint.keep >= 1, "every %d keep %d",
               p->checkpoint.every, p->checkpoint.keep);

    const struct plan_parallel *par = &p->parallel;
    FUZZ_CHECK(par->tp >= 0 && par->pp >= 0 && par->dp >= 0, "tp %d pp %d dp %d", par->tp, par->pp,
               par->dp);
    FUZZ_CHECK(par->tp == PLAN_AUTO || (m->heads % par->tp == 0 && m->padded_vocab % par->tp == 0),
               "tp %d divides neither heads %d nor padded vocab %d", par->tp, m->heads,
               m->padded_vocab);
    FUZZ_CHECK(par->pp == PLAN_AUTO || par->pp <= m->layers, "pp %d > layers %d", par->pp,
               m->layers);
    FUZZ_CHECK(par->zero >= 0 && par->zero <= 3, "zero %d", par->zero);
    FUZZ_CHECK(par->device >= PLAN_DEVICE_AUTO && par->device <= PLAN_DEVICE_CUDA, "device %d",
               (int)par->device);
    FUZZ_CHECK(par->cp >= 1 && (par->cp == 1 || m->seq_len % (2 * par->cp) == 0),
               "cp %d with seq_len %d", par->cp, m->seq_len);
    int64_t ranks = plan_ranks(p);
    FUZZ_CHECK(ranks >= 0 && ranks <= PLAN_MAX_RANKS, "%lld ranks", (long long)ranks);
    FUZZ_CHECK(
        (ranks == 0) == (par->tp == PLAN_AUTO || par->pp == PLAN_AUTO || par->dp == PLAN_AUTO),
        "plan_ranks %lld with tp %d pp %d dp %d", (long long)ranks, par->tp, par->pp, par->dp);

    const struct plan_sample *s = &p->sample;
    FUZZ_CHECK(s->tokens >= 0 && s->top_k >= 0 && s->temperature > 0 && isfinite(s->temperature),
               "sample tokens %d top_k %d temperature %g", s->tokens, s->top_k, s->temperature);
    FUZZ_CHECK(s->prompt, "no sample.prompt");
}

static bool same_string(const char *a, const char *b)
{
    return a == b || (a && b && strcmp(a, b) == 0);
}

/* The field that differs between two plans (reals to the bit), or NULL. */
static const char *plan_difference(const struct plan *a, const struct plan *b)
{
#define SAME_STRING(f)                                                                             \
    if (!same_string(a->f, b->f)) return #f
#define SAME_VALUE(f)                                                                              \
    if (memcmp(&a->f, &b->f, sizeof a->f) != 0) return #f
    SAME_STRING(source);
    SAME_STRING(model.arch);
    SAME_VALUE(model.layers);
    SAME_VALUE(model.heads);
    SAME_VALUE(model.hidden);
    SAME_VALUE(model.vocab);
    SAME_VALUE(model.padded_vocab);
    SAME_VALUE(model.seq_len);
    SAME_VALUE(model.max_seq_len);
    SAME_VALUE(model.seed);
    SAME_STRING(model.init);
    SAME_STRING(data.train);
    SAME_STRING(data.val);
    SAME_VALUE(data.shuffle);
    SAME_VALUE(data.val_every);
    SAME_VALUE(data.val_batches);
    SAME_STRING(data.tokenizer);
    SAME_VALUE(batch.micro_batch);
    SAME_VALUE(batch.grad_accum);
    SAME_VALUE(optimizer.lr);
    SAME_VALUE(optimizer.beta1);
    SAME_VALUE(optimizer.beta2);
    SAME_VALUE(optimizer.eps);
    SAME_VALUE(optimizer.weight_decay);
    SAME_VALUE(optimizer.grad_clip);
    SAME_VALUE(optimizer.warmup_steps);
    SAME_VALUE(optimizer.schedule);
    SAME_VALUE(optimizer.min_lr_ratio);
    SAME_VALUE(steps);
    SAME_VALUE(precision);
    SAME_VALUE(recompute);
    SAME_STRING(checkpoint.dir);
    SAME_VALUE(checkpoint.every);
    SAME_VALUE(checkpoint.keep);
    SAME_VALUE(parallel.tp);
    SAME_VALUE(parallel.pp);
    SAME_VALUE(parallel.dp);
    SAME_VALUE(parallel.allow_tp_over_pcie);
    SAME_VALUE(parallel.zero);
    SAME_VALUE(parallel.device);
    SAME_VALUE(sample.tokens);
    SAME_VALUE(sample.temperature);
    SAME_VALUE(sample.top_k);
    SAME_STRING(sample.prompt);
    SAME_VALUE(sample.seed);
    return NULL;
#undef SAME_STRING
#undef SAME_VALUE
}

/* JSON written by plan_to_json(_line) must load back to an identical plan
 * (plan.h), every field and every bit of every real, and write the same text. */
static void check_reads_back(const struct plan *p, const char *json, const char *want,
                             const char *what)
{
    struct plait_error err = {.text = ""};
    struct plan *again = plan_load_text(json, SOURCE, fuzz_dir(), NULL, 0, &err);
    FUZZ_CHECK(again, "%s does not read back: %s\n%s", what, err.text, json);
    check_plan(again);
    const char *field = plan_difference(p, again);
    FUZZ_CHECK(!field, "%s reads back with a different %s:\n%s", what, field, json);
    char *text = plan_to_json(again);
    FUZZ_CHECK(text, "plan_to_json failed");
    FUZZ_CHECK(strcmp(text, want) == 0, "%s reads back as a different plan:\n%s\nthen\n%s", what,
               want, text);
    free(text);
    plan_free(again);
}

static void check_round_trip(const struct plan *p)
{
    char *json = plan_to_json(p);
    FUZZ_CHECK(json, "plan_to_json failed");
    check_reads_back(p, json, json, "plan_to_json");
    char *line = plan_to_json_line(p);
    FUZZ_CHECK(line, "plan_to_json_line failed");
    FUZZ_CHECK(!strchr(line, '\n'), "plan_to_json_line wrote more than one line: %s", line);
    check_reads_back(p, line, json, "plan_to_json_line");
    free(line);
    free(json);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* the plan text, then the override lines after the separator */
    char *input = malloc(size + 1);
    FUZZ_CHECK(input, "out of memory");
    memcpy(input, data, size);
    input[size] = '\0';
    size_t text_bytes = size;
    const char *overrides[MAX_OVERRIDES];
    int n_overrides = 0;
    char *sep = memmem(input, size, SEPARATOR, strlen(SEPARATOR));
    if (sep) {
        text_bytes = (size_t)(sep - input);
        *sep = '\0';
        char *line = sep + strlen(SEPARATOR), *end = input + size;
        while (line < end && n_overrides < MAX_OVERRIDES) {
            char *nl = memchr(line, '\n', (size_t)(end - line));
            if (nl) *nl = '\0';
            overrides[n_overrides++] = line;
            line = nl ? nl + 1 : end;
        }
    }

    struct plait_error err = {.text = ""};
    if (memchr(input, '\0', text_bytes)) {
        /* plan_load_text stops at a NUL; a plan file does not, and must refuse it */
        const char *path = fuzz_file(PLAN_FD, input, text_bytes);
        struct plan *p = plan_load(path, overrides, n_overrides, &err);
        FUZZ_CHECK(!p, "a plan with a NUL byte was accepted");
        FUZZ_CHECK(strstr(err.text, "NUL byte"), "the error does not say NUL byte: %s", err.text);
        check_error(err.text, path);
        free(input);
        return 0;
    }
    struct plan *p = plan_load_text(input, SOURCE, fuzz_dir(), overrides, n_overrides, &err);
    if (!p) {
        check_error(err.text, SOURCE);
    } else {
        check_plan(p);
        check_round_trip(p);
        plan_free(p);
    }
    free(input);
    return 0;
}
