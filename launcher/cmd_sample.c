/* cmd_sample.c — `plait sample DIR`: text from a checkpoint of any layout, on
 * one process: the newest checkpoint of DIR that verifies, its parameters
 * gathered from whatever tp × pp × dp layout wrote them (ckpt_shards.h), its
 * plan's sample section (each option overrides its field, checked by the
 * plan's own rules), through the sampler's key/value cache on the CPU. It
 * takes no lock and changes nothing. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/formats/ckpt_shards.h"
#include "common/formats/rundir.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/place/env.h"
#include "launcher/commands.h"
#include "sample/sampler.h"

enum { OPT_PROMPT, OPT_TOKENS, OPT_TEMPERATURE, OPT_TOP_K, OPT_SEED, OPT_COUNT };
/* the plan field each option sets */
static const char *const fields[OPT_COUNT] = {"sample.prompt", "sample.tokens",
                                              "sample.temperature", "sample.top_k", "sample.seed"};

const struct cli_command cmd_sample_cli = {
    .name = "sample",
    .operands = "DIR",
    .min_operands = 1,
    .max_operands = 1,
    .summary = "text from a run's checkpoint, of any layout",
    .description =
        "DIR is a run directory, its checkpoint directory or one checkpoint: its newest\n"
        "checkpoint that verifies is read whole, whatever tp × pp × dp layout wrote it,\n"
        "and sampled on this machine's CPUs one token at a time (a key/value cache).\n"
        "The checkpoint's plan gives the prompt, the tokens, the temperature, top-k, the\n"
        "seed and data.tokenizer; each option replaces its sample field.",
    .options =
        (const struct cli_option[]){
            [OPT_PROMPT] = {"--prompt", "TEXT", "the text the sample starts from"},
            [OPT_TOKENS] = {"--tokens", "N", "tokens to sample"},
            [OPT_TEMPERATURE] = {"--temperature", "T", "softmax temperature (> 0)"},
            [OPT_TOP_K] = {"--top-k", "K", "draw among the K likeliest tokens (0: all)"},
            [OPT_SEED] = {"--seed", "S", "the sampling generator's seed"},
            {0}},
    .epilog = "exit codes: 0 sampled, 1 no checkpoint that verifies, or a bad value",
};

/* "sample.tokens=40", the prompt as a JSON string (so that "12" stays text) */
static char *override(int opt, const char *value)
{
    char *quoted = NULL, *out = NULL;
    if (opt == OPT_PROMPT) {
        json_t *s = json_string(value);
        quoted = s ? json_dumps(s, JSON_ENCODE_ANY) : NULL;
        json_decref(s);
        if (!quoted) return NULL;
        value = quoted;
    }
    size_t n = strlen(fields[opt]) + strlen(value) + 2;
    if ((out = malloc(n))) snprintf(out, n, "%s=%s", fields[opt], value);
    free(quoted);
    return out;
}

/* A refusal of an option's value names the option as the user gave it ("--tokens -3: ..."),
 * not the override it became. */
static void name_options(const struct cli_args *a, char *const *sets, int n,
                         struct plait_error *err)
{
    for (int i = 0, k = 0; i < a->n && k < n; i++) {
        if (a->v[i].opt < 0) continue;
        char was[sizeof err->text];
        int len = snprintf(was, sizeof was, "--set %s: ", sets[k++]);
        if (len <= 0 || (size_t)len >= sizeof was || strncmp(err->text, was, (size_t)len)) continue;
        struct plait_error named;
        error_set(&named, "%s %s: %s", cmd_sample_cli.options[a->v[i].opt].name, a->v[i].value,
                  err->text + len);
        *err = named;
        return;
    }
}

/* The checkpoint's plan with the options' sample fields. */
static struct plan *plan_of(const char *cdir, const struct cli_args *a, struct plait_error *err)
{
    char path[4096], *sets[OPT_COUNT + 1] = {0};
    int n = 0;
    struct plan *plan = NULL;
    for (int i = 0; i < a->n; i++)
        if (a->v[i].opt >= 0 && !(sets[n++] = override(a->v[i].opt, a->v[i].value))) {
            error_set(err, "%s: not valid UTF-8", fields[a->v[i].opt]);
            goto out;
        }
    /* one process samples the whole model: the run's expert parallelism (which refuses a
     * run's samples) is no matter here */
    if (!(sets[n++] = strdup("parallel.ep=1"))) {
        error_set(err, "out of memory");
        goto out;
    }
    if (!fs_join(path, sizeof path, cdir, RUNDIR_PLAN, err) &&
        !(plan = plan_load(path, (const char *const *)sets, n, err)))
        name_options(a, sets, n, err);
out:
    for (int i = 0; i < n; i++) free(sets[i]);
    return plan;
}

/* The whole model's parameters (gpt2_shard.h's order) from the checkpoint, into *params. */
static int read_whole(const char *cdir, struct gpt2_shard *whole, float **params,
                      struct plait_error *err)
{
    struct ckpt_source src;
    *params = NULL;
    if (ckpt_source_open(&src, cdir, err)) return -1;
    struct gpt2_part part = gpt2_part_whole(&src.cfg);
    int rc = gpt2_shard_init(whole, &src.cfg, &part, err);
    if (!rc && !(*params = malloc(whole->total * sizeof **params + 1)))
        rc = error_set(err, "out of memory for %zu parameters", whole->total);
    if (!rc) rc = ckpt_source_read(&src, CKPT_PARAMS, whole, 0, whole->total, *params, err);
    ckpt_source_close(&src);
    return rc;
}

static int sample_from(const char *cdir, const struct plan *plan, struct plait_error *err)
{
    struct gpt2_shard whole;
    struct tokenizer tok;
    float *params = NULL;
    bool has_tok = false;
    int rc = -1;
    if (read_whole(cdir, &whole, &params, err)) goto out;
    if (tokenizer_open(&tok, plan, &has_tok, err)) goto out;
    struct rng r;
    rng_seed(&r, plan->sample.seed, 0);
    rc = sample_tokens(&whole, params, &plan->sample, has_tok ? &tok : NULL, &r, stdout, err);
out:
    if (has_tok) tokenizer_free(&tok);
    free(params);
    return rc;
}

int cmd_sample(int argc, char **argv)
{
    struct cli_args a;
    int parsed = cli_parse(&cmd_sample_cli, argc, argv, &a);
    if (parsed != CLI_CONTINUE) return parsed;
    const char *dir = NULL;
    for (int i = 0; i < a.n; i++)
        if (a.v[i].opt < 0) dir = a.v[i].value;
    struct plait_error err;
    char cdir[4096], layout[96];
    int64_t step;
    struct plan *plan = NULL;
    int rc = PLAIT_EXIT_ERROR;
    if (ckpt_pick_newest("sample", dir, cdir, sizeof cdir, &step, layout, sizeof layout, &err) ||
        !(plan = plan_of(cdir, &a, &err))) {
        log_error("sample: %s", err.text);
        goto out;
    }
    log_info("sample: %s (step %lld, %s)", cdir, (long long)step, layout);
    if (sample_from(cdir, plan, &err)) {
        log_error("sample: %s", err.text);
        goto out;
    }
    rc = PLAIT_EXIT_OK;
out:
    plan_free(plan);
    cli_args_free(&a);
    return rc;
}
