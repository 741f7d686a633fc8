/* test_plan.c — plan.json: the golden suites under tests/plans (invalid/<case>:
 * a bad plan and the exact one-line error; valid/<case>: a good plan and its
 * resolved JSON), then focused cases: round trip, how override values are
 * typed, where relative paths resolve, NULL err. Run from the repo root. */
#include <dirent.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/formats/llmc.h" // llmc_model_header_fill, llmc_tokens_header_fill, llmc_param_count
#include "common/fsutil.h"
#include "common/plan/plan.h"
#include "tests/unit/check.h"

#define INVALID_DIR "tests/plans/invalid"
#define VALID_DIR "tests/plans/valid"
#define FIXTURES_DIR "tests/plans/fixtures"

/* A plan with only the required keys, for the focused cases. */
static const char *const minimal_plan =
    "{\"model\": {\"layers\": 2, \"heads\": 2, \"hidden\": 8, \"vocab\": 50257, \"seq_len\": 16},\n"
    " \"data\": {\"train\": \"train.bin\"},\n"
    " \"steps\": 10}\n";

/* ---- helpers ----------------------------------------------------------------------------- */

static void drop_trailing_newlines(char *s)
{
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == '\n' || s[n - 1] == '\r')) s[--n] = '\0';
}

static int compare_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The subdirectories of dir, sorted; returns their number. */
static int list_cases(const char *dir, char ***out)
{
    DIR *d = opendir(dir);
    char **names = NULL;
    int n = 0;
    if (!d) {
        *out = NULL;
        return 0;
    }
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char path[PATH_MAX];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) continue;
        char **more = realloc(names, (size_t)(n + 1) * sizeof *names);
        if (!more) break;
        names = more;
        names[n++] = strdup(e->d_name);
    }
    closedir(d);
    if (n) qsort(names, (size_t)n, sizeof *names, compare_names);
    *out = names;
    return n;
}

static void free_list(char **list, int n)
{
    for (int i = 0; i < n; i++) free(list[i]);
    free(list);
}

/* The non-empty lines of a file (none if it does not exist). */
static int read_lines(const char *path, char ***out)
{
    char *text = fs_read_all(path, NULL, NULL), **lines = NULL;
    int n = 0;
    for (char *line = text, *next; line && *line; line = next) {
        next = line + strcspn(line, "\n");
        if (*next) *next++ = '\0';
        drop_trailing_newlines(line);
        if (!*line) continue;
        char **more = realloc(lines, (size_t)(n + 1) * sizeof *lines);
        if (!more) break;
        lines = more;
        lines[n++] = strdup(line);
    }
    free(text);
    *out = lines;
    return n;
}

/* s with every `from` replaced by `to`; malloc'ed. */
static char *substitute(const char *s, const char *from, const char *to)
{
    size_t nf = strlen(from), nt = strlen(to), count = 0;
    for (const char *p = s; (p = strstr(p, from)); p += nf) count++;
    char *out = malloc(strlen(s) + count * nt + 1), *o = out;
    for (const char *p = s, *hit;; p = hit + nf) {
        hit = strstr(p, from);
        size_t keep = hit ? (size_t)(hit - p) : strlen(p);
        memcpy(o, p, keep);
        o += keep;
        if (!hit) break;
        memcpy(o, to, nt);
        o += nt;
    }
    *o = '\0';
    return out;
}

/* The first line where a and b differ, for a readable failure. */
static void show_difference(const char *name, const char *expected, const char *actual)
{
    int line = 1;
    const char *e = expected, *a = actual;
    while (*e && *e == *a) {
        if (*e == '\n') line++;
        e++, a++;
    }
    while (e > expected && e[-1] != '\n') e--, a--;
    printf("  %s: first difference at line %d\n    expected: %.*s\n    actual:   %.*s\n", name,
           line, (int)strcspn(e, "\n"), e, (int)strcspn(a, "\n"), a);
}

/* Loads <case_dir>/plan.json with the case's overrides, with the working
 * directory set to the case, so that the source reads "plan.json" and relative
 * overrides resolve there. *case_abs gets the case directory as plan.c sees it. */
static struct plan *load_case(const char *case_dir, struct plait_error *err,
                              char case_abs[PATH_MAX])
{
    char home[PATH_MAX], path[PATH_MAX + 16];
    char **overrides;
    struct plan *p = NULL;
    snprintf(path, sizeof path, "%s/overrides", case_dir);
    int n = read_lines(path, &overrides);
    if (!getcwd(home, sizeof home) || chdir(case_dir) != 0) {
        snprintf(err->text, sizeof err->text, "cannot enter %s", case_dir);
        goto out;
    }
    if (!getcwd(case_abs, PATH_MAX)) case_abs[0] = '\0';
    p = plan_load("plan.json", (const char *const *)overrides, n, err);
    if (chdir(home) != 0) printf("  cannot return to %s\n", home);
out:
    free_list(overrides, n);
    return p;
}

/* ---- the suites -------------------------------------------------------------------------- */

static void test_invalid_plans_give_their_exact_error(void)
{
    char **cases;
    int n = list_cases(INVALID_DIR, &cases);
    CHECK(n >= 35, "only %d cases in %s", n, INVALID_DIR);
    for (int i = 0; i < n; i++) {
        char dir[PATH_MAX], path[PATH_MAX + 16], case_abs[PATH_MAX] = "";
        snprintf(dir, sizeof dir, "%s/%s", INVALID_DIR, cases[i]);
        snprintf(path, sizeof path, "%s/error", dir);
        char *expected = fs_read_all(path, NULL, NULL);
        CHECK(expected, "invalid/%s: no error file", cases[i]);
        if (!expected) continue;
        drop_trailing_newlines(expected);
        struct plait_error err = {.text = ""};
        struct plan *p = load_case(dir, &err, case_abs);
        CHECK(!p, "invalid/%s: loaded without error\n    expected: %s", cases[i], expected);
        if (!p) {
            char *actual = substitute(err.text, case_abs, "$DIR");
            CHECK(strcmp(expected, actual) == 0, "invalid/%s:\n    expected: %s\n    actual:   %s",
                  cases[i], expected, actual);
            free(actual);
        }
        plan_free(p);
        free(expected);
    }
    printf("# %d invalid plans\n", n);
    free_list(cases, n);
}

static void test_valid_plans_resolve_to_expected_json_and_round_trip(void)
{
    char **cases;
    int n = list_cases(VALID_DIR, &cases);
    CHECK(n >= 6, "only %d cases in %s", n, VALID_DIR);
    for (int i = 0; i < n; i++) {
        char dir[PATH_MAX], path[PATH_MAX + 16], case_abs[PATH_MAX] = "";
        snprintf(dir, sizeof dir, "%s/%s", VALID_DIR, cases[i]);
        snprintf(path, sizeof path, "%s/expected.json", dir);
        char *expected = fs_read_all(path, NULL, NULL);
        CHECK(expected, "valid/%s: no expected.json", cases[i]);
        struct plait_error err = {.text = ""};
        struct plan *p = load_case(dir, &err, case_abs);
        CHECK(p, "valid/%s: %s", cases[i], err.text);
        if (p && expected) {
            char *json = plan_to_json(p);
            char *actual = substitute(json, case_abs, "$DIR");
            const char *update = getenv("PLAIT_UPDATE_GOLDEN"); /* as the other goldens */
            if (update && !strcmp(update, "1") && strcmp(expected, actual) != 0) {
                FILE *f = fopen(path, "w");
                CHECK(f && fputs(actual, f) >= 0 && fclose(f) == 0, "writing %s", path);
                printf("# updated %s\n", path);
            } else if (strcmp(expected, actual) != 0) {
                CHECK(0, "valid/%s: plan_to_json differs from expected.json", cases[i]);
                show_difference(cases[i], expected, actual);
            }
            /* Read back from elsewhere: every path is absolute, so nothing moves. */
            struct plan *again =
                plan_load_text(json, "round-trip.json", "/nonexistent", NULL, 0, &err);
            CHECK(again, "valid/%s: round trip: %s", cases[i], err.text);
            char *json2 = plan_to_json(again);
            CHECK(json2 && strcmp(json, json2) == 0, "valid/%s: round trip changed the plan",
                  cases[i]);
            if (json2 && strcmp(json, json2) != 0) show_difference(cases[i], json, json2);
            free(json2);
            plan_free(again);
            free(actual);
            free(json);
        }
        plan_free(p);
        free(expected);
    }
    printf("# %d valid plans\n", n);
    free_list(cases, n);
}

/* ---- focused cases ----------------------------------------------------------------------- */

/* The fixtures are what this generator writes: llm.c headers, zero bodies.
 * tiny_gpt2.bin: fp32 GPT-2, max T 4, vocab 8, padded 8, 1 layer, 2 heads, hidden 4.
 * tiny_tokens.bin: a token shard of 8 tokens 0..7 (a wrong file for model.init). */
static void test_fixtures_are_what_the_generator_writes(void)
{
    struct llmc_model_header h = {.version = LLMC_MODEL_VERSION_FP32,
                                  .max_seq_len = 4,
                                  .vocab = 8,
                                  .layers = 1,
                                  .heads = 2,
                                  .hidden = 4,
                                  .padded_vocab = 8};
    int32_t header[LLMC_HEADER_INTS];
    size_t params = (size_t)llmc_param_count(4, 8, 1, 4);
    size_t bytes = LLMC_HEADER_BYTES + params * 4;
    unsigned char *want = calloc(1, bytes);
    llmc_model_header_fill(header, &h);
    memcpy(want, header, LLMC_HEADER_BYTES);
    FILE *f = fopen(FIXTURES_DIR "/tiny_gpt2.bin", "rb");
    unsigned char *have = calloc(1, bytes + 1);
    size_t got = f ? fread(have, 1, bytes + 1, f) : 0;
    CHECK(got == bytes && memcmp(want, have, bytes) == 0, "tiny_gpt2.bin: %zu bytes, want %zu", got,
          bytes);
    if (f) fclose(f);

    unsigned char shard[LLMC_HEADER_BYTES + 16], read_back[sizeof shard + 1];
    llmc_tokens_header_fill(header, 8, 2);
    memcpy(shard, header, LLMC_HEADER_BYTES);
    for (int t = 0; t < 8; t++) {
        uint16_t token = (uint16_t)t;
        memcpy(shard + LLMC_HEADER_BYTES + 2 * t, &token, 2);
    }
    f = fopen(FIXTURES_DIR "/tiny_tokens.bin", "rb");
    got = f ? fread(read_back, 1, sizeof read_back, f) : 0;
    CHECK(got == sizeof shard && memcmp(shard, read_back, sizeof shard) == 0,
          "tiny_tokens.bin: %zu bytes, want %zu", got, sizeof shard);
    if (f) fclose(f);
    free(want);
    free(have);
}

static void test_defaults_land_in_the_struct(void)
{
    struct plait_error err;
    struct plan *p = plan_load_text(minimal_plan, "minimal.json", "/base", NULL, 0, &err);
    CHECK(p, "%s", err.text);
    if (!p) return;
    CHECK(strcmp(p->source, "minimal.json") == 0, "source %s", p->source);
    CHECK(strcmp(p->model.arch, "gpt2") == 0, "arch %s", p->model.arch);
    CHECK(p->model.layers == 2 && p->model.heads == 2 && p->model.hidden == 8, "model dims");
    CHECK(p->model.vocab == 50257 && p->model.padded_vocab == 50304, "padded_vocab %d",
          p->model.padded_vocab);
    CHECK(p->model.seq_len == 16 && p->model.max_seq_len == 16, "max_seq_len %d",
          p->model.max_seq_len);
    CHECK(p->model.seed == 1337 && !p->model.init, "model.seed");
    CHECK(strcmp(p->data.train, "/base/train.bin") == 0, "train %s", p->data.train);
    CHECK(!p->data.val && !p->data.shuffle && p->data.val_every == 0 && p->data.val_batches == 20 &&
              !p->data.tokenizer,
          "data defaults");
    CHECK(p->batch.micro_batch == 4 && p->batch.grad_accum == 1, "batch defaults");
    CHECK(p->optimizer.lr == 3e-4 && p->optimizer.beta1 == 0.9 && p->optimizer.beta2 == 0.95 &&
              p->optimizer.eps == 1e-8 && p->optimizer.weight_decay == 0.1 &&
              p->optimizer.grad_clip == 1.0 && p->optimizer.warmup_steps == 0 &&
              p->optimizer.schedule == PLAN_SCHEDULE_COSINE && p->optimizer.min_lr_ratio == 0.1,
          "optimizer defaults");
    CHECK(p->steps == 10 && p->precision == PLAN_PRECISION_FP32 &&
              p->recompute == PLAN_RECOMPUTE_NONE,
          "top-level defaults");
    CHECK(strcmp(p->checkpoint.dir, "checkpoints") == 0 && p->checkpoint.every == 0 &&
              p->checkpoint.keep == 3,
          "checkpoint defaults");
    CHECK(p->parallel.tp == 1 && p->parallel.pp == 1 && p->parallel.dp == 1 &&
              p->parallel.device == PLAN_DEVICE_AUTO,
          "parallel defaults");
    CHECK(p->sample.tokens == 0 && p->sample.temperature == 1.0 && p->sample.top_k == 0 &&
              strcmp(p->sample.prompt, "\n") == 0 && p->sample.seed == 42,
          "sample defaults");
    plan_free(p);
}

static void test_round_trip_keeps_awkward_values(void)
{
    const char *text =
        "{\"model\": {\"layers\": 1, \"heads\": 1, \"hidden\": 3, \"vocab\": 65536, \"seq_len\": "
        "1,\n"
        "           \"seed\": 9223372036854775807},\n"
        " \"data\": {\"train\": \"/d/tr\\\"ain \\u00e9*.bin\", \"val\": \"v?[0-9].bin\"},\n"
        " \"optimizer\": {\"lr\": 0.30000000000000004, \"beta2\": 0.999999, \"eps\": 1e-300,\n"
        "               \"grad_clip\": 0, \"schedule\": \"constant\", \"warmup_steps\": 7},\n"
        " \"sample\": {\"prompt\": \"tab\\there \\u0001 \\\\ end\", \"temperature\": 1e20},\n"
        " \"steps\": 7}\n";
    struct plait_error err;
    struct plan *p = plan_load_text(text, "awkward.json", "/b", NULL, 0, &err);
    CHECK(p, "%s", err.text);
    if (!p) return;
    CHECK(p->model.seed == UINT64_C(9223372036854775807), "seed");
    CHECK(p->model.padded_vocab == 65536, "padded_vocab %d", p->model.padded_vocab);
    CHECK(strcmp(p->data.train, "/d/tr\"ain \xc3\xa9*.bin") == 0, "train %s", p->data.train);
    CHECK(strcmp(p->data.val, "/b/v?[0-9].bin") == 0, "val %s", p->data.val);
    CHECK(strcmp(p->sample.prompt, "tab\there \x01 \\ end") == 0, "prompt");
    char *json = plan_to_json(p);
    struct plan *again = plan_load_text(json, "again.json", "/elsewhere", NULL, 0, &err);
    CHECK(again, "%s\n%s", err.text, json);
    char *json2 = again ? plan_to_json(again) : NULL;
    CHECK(json2 && strcmp(json, json2) == 0, "round trip changed:\n%s\n%s", json,
          json2 ? json2 : "(null)");
    if (again) {
        CHECK(again->optimizer.lr == p->optimizer.lr && again->optimizer.eps == 1e-300 &&
                  again->sample.temperature == 1e20 && again->optimizer.beta2 == 0.999999,
              "reals changed in the round trip");
        CHECK(strcmp(again->sample.prompt, p->sample.prompt) == 0, "prompt changed");
    }
    CHECK(strstr(json, "\"lr\": 0.30000000000000004,") && strstr(json, "\"grad_clip\": 0.0,") &&
              strstr(json, "\"min_lr_ratio\": 0.1\n"),
          "reals are written short and as reals:\n%s", json);
    free(json2);
    plan_free(again);
    free(json);
    plan_free(p);
}

/* Loads minimal_plan with one override; NULL on error (err filled). */
static struct plan *with_override(const char *override, struct plait_error *err)
{
    const char *overrides[] = {override};
    return plan_load_text(minimal_plan, "plan.json", "/base", overrides, 1, err);
}

static void expect_override_error(const char *override, const char *expected)
{
    struct plait_error err = {.text = ""};
    struct plan *p = with_override(override, &err);
    CHECK(!p, "%s: loaded", override);
    CHECK(p || strcmp(err.text, expected) == 0, "%s:\n    expected: %s\n    actual:   %s", override,
          expected, err.text);
    plan_free(p);
}

static void test_override_values_are_json_else_strings(void)
{
    struct plait_error err;
    struct plan *p = with_override("steps=2", &err); /* 2 -> integer */
    CHECK(p && p->steps == 2, "steps=2: %s", p ? "" : err.text);
    plan_free(p);
    p = with_override("optimizer.lr=1e-3", &err); /* 1e-3 -> real */
    CHECK(p && p->optimizer.lr == 1e-3, "lr=1e-3: %s", p ? "" : err.text);
    plan_free(p);
    p = with_override("optimizer.lr=2", &err); /* an integer is a fine real */
    CHECK(p && p->optimizer.lr == 2.0, "lr=2: %s", p ? "" : err.text);
    plan_free(p);
    p = with_override("precision=bf16", &err); /* not JSON -> string */
    CHECK(p && p->precision == PLAN_PRECISION_BF16, "precision=bf16: %s", p ? "" : err.text);
    plan_free(p);
    p = with_override("data.shuffle=true", &err); /* true -> boolean */
    CHECK(p && p->data.shuffle, "shuffle=true: %s", p ? "" : err.text);
    plan_free(p);
    p = with_override("sample.prompt=\"2\"", &err); /* a JSON string stays a string */
    CHECK(p && strcmp(p->sample.prompt, "2") == 0, "prompt=\"2\": %s", p ? "" : err.text);
    plan_free(p);
    p = with_override("sample.prompt=Once upon a time", &err);
    CHECK(p && strcmp(p->sample.prompt, "Once upon a time") == 0, "prompt: %s", p ? "" : err.text);
    plan_free(p);
    p = with_override("data.val=null", &err); /* null = the default */
    CHECK(p && !p->data.val, "val=null: %s", p ? "" : err.text);
    plan_free(p);
    p = with_override("model={\"layers\": 1, \"heads\": 1, \"hidden\": 4, \"vocab\": 8, "
                      "\"seq_len\": 2}",
                      &err); /* a whole section */
    CHECK(p && p->model.hidden == 4 && p->model.padded_vocab == 128, "model={...}: %s",
          p ? "" : err.text);
    plan_free(p);
    expect_override_error("steps=\"2\"",
                          "--set steps=\"2\": steps: must be an integer (got \"2\")");
    expect_override_error("data.train=2",
                          "--set data.train=2: data.train: must be a string (got 2)");
    expect_override_error(
        "data.shuffle=yes",
        "--set data.shuffle=yes: data.shuffle: must be true or false (got \"yes\")");
    expect_override_error("steps=2.5", "--set steps=2.5: steps: must be an integer (got 2.5)");
    expect_override_error("model.seq_len", "--set model.seq_len: expected dot.path=value");
    expect_override_error("=3", "--set =3: empty key in the path");
    expect_override_error("model..layers=3",
                          "--set model..layers=3: model..layers: empty key in the path");
    expect_override_error("steps.x=1",
                          "--set steps.x=1: steps.x: unknown key (steps is not an object)");
    expect_override_error(
        "model={\"layrs\": 2}",
        "--set model={\"layrs\": 2}: model.layrs: unknown key (did you mean \"layers\"?)");
    expect_override_error("lr=1", "--set lr=1: lr: unknown key (did you mean \"optimizer.lr\"?)");
}

static void test_relative_paths_resolve_against_plan_dir_but_overrides_against_cwd(void)
{
    char cwd[PATH_MAX], want[PATH_MAX * 2];
    CHECK(getcwd(cwd, sizeof cwd), "getcwd");
    const char *overrides[] = {"data.tokenizer=tok/gpt2.bin", "checkpoint.dir=runs/ckpt"};
    struct plait_error err;
    struct plan *p = plan_load(VALID_DIR "/relative_paths/plan.json", overrides, 2, &err);
    CHECK(p, "%s", err.text);
    if (!p) return;
    CHECK(strcmp(p->source, VALID_DIR "/relative_paths/plan.json") == 0, "source %s", p->source);
    snprintf(want, sizeof want, "%s/%s/relative_paths/shards/train_*.bin", cwd, VALID_DIR);
    CHECK(strcmp(p->data.train, want) == 0, "train %s, want %s", p->data.train, want);
    snprintf(want, sizeof want, "%s/%s/relative_paths/val.bin", cwd, VALID_DIR);
    CHECK(strcmp(p->data.val, want) == 0, "val %s, want %s", p->data.val, want);
    snprintf(want, sizeof want, "%s/tok/gpt2.bin", cwd);
    CHECK(strcmp(p->data.tokenizer, want) == 0, "tokenizer %s, want %s", p->data.tokenizer, want);
    CHECK(strcmp(p->checkpoint.dir, "runs/ckpt") == 0, "checkpoint.dir %s", p->checkpoint.dir);
    plan_free(p);

    /* plan_load_text: base_dir, relative base_dir, or the current directory. */
    p = plan_load_text(minimal_plan, "t.json", "/srv/plans", NULL, 0, &err);
    CHECK(p && strcmp(p->data.train, "/srv/plans/train.bin") == 0, "base /srv/plans: %s",
          p ? p->data.train : err.text);
    plan_free(p);
    p = plan_load_text(minimal_plan, "t.json", "sub/dir", NULL, 0, &err);
    snprintf(want, sizeof want, "%s/sub/dir/train.bin", cwd);
    CHECK(p && strcmp(p->data.train, want) == 0, "base sub/dir: %s", p ? p->data.train : err.text);
    plan_free(p);
    p = plan_load_text(minimal_plan, "t.json", NULL, NULL, 0, &err);
    snprintf(want, sizeof want, "%s/train.bin", cwd);
    CHECK(p && strcmp(p->data.train, want) == 0, "base NULL: %s", p ? p->data.train : err.text);
    plan_free(p);
}

static void test_errors_never_need_an_err(void)
{
    const char *bad_overrides[] = {"model.layrs=2", "nothing", "optimizer.lr=-1"};
    for (int i = 0; i < 3; i++)
        CHECK(!plan_load_text(minimal_plan, "x.json", NULL, bad_overrides + i, 1, NULL),
              "override %s", bad_overrides[i]);
    CHECK(!plan_load_text("{", "x.json", NULL, NULL, 0, NULL), "syntax");
    CHECK(!plan_load_text("[]", "x.json", NULL, NULL, 0, NULL), "array");
    CHECK(!plan_load_text(NULL, "x.json", NULL, NULL, 0, NULL), "NULL text");
    CHECK(!plan_load_text("{\"model\": {\"init\": \"/nonexistent.bin\", \"seq_len\": 2}, "
                          "\"data\": {\"train\": \"t\"}, \"steps\": 1}",
                          NULL, NULL, NULL, 0, NULL),
          "init");
    CHECK(!plan_load("tests/plans/no-such-plan.json", NULL, 0, NULL), "missing file");
    CHECK(!plan_load(NULL, NULL, 0, NULL), "NULL path");
    CHECK(!plan_load_text(minimal_plan, "x.json", NULL, NULL, 3, NULL), "3 overrides, no array");
    const char *null_override[] = {NULL};
    CHECK(!plan_load_text(minimal_plan, "x.json", NULL, null_override, 1, NULL), "NULL override");
    plan_free(NULL);
    CHECK(!plan_to_json(NULL), "plan_to_json(NULL)");
}

static void test_missing_file_names_the_path(void)
{
    struct plait_error err;
    CHECK(!plan_load("tests/plans/no-such-plan.json", NULL, 0, &err), "loaded");
    CHECK(strcmp(err.text, "tests/plans/no-such-plan.json: No such file or directory") == 0, "%s",
          err.text);
    CHECK(!plan_load_text("", "empty.json", NULL, NULL, 0, &err), "empty text loaded");
    CHECK(strncmp(err.text, "empty.json:1:0: invalid JSON: ", 30) == 0, "%s", err.text);
}

static void test_enum_names_match_the_plan_spelling(void)
{
    CHECK(strcmp(plan_precision_name(PLAN_PRECISION_BF16), "bf16") == 0, "bf16");
    CHECK(strcmp(plan_precision_name(PLAN_PRECISION_FP8), "fp8") == 0, "fp8");
    CHECK(strcmp(plan_fp8_scaling_name(PLAN_FP8_BLOCK), "block") == 0, "block");
    CHECK(strcmp(plan_fp8_scaling_name(PLAN_FP8_NONE), "none") == 0, "none");
    CHECK(strcmp(plan_recompute_name(PLAN_RECOMPUTE_SELECTIVE), "selective") == 0, "selective");
    CHECK(strcmp(plan_schedule_name(PLAN_SCHEDULE_CONSTANT), "constant") == 0, "constant");
    CHECK(strcmp(plan_device_name(PLAN_DEVICE_CUDA), "cuda") == 0, "cuda");
    CHECK(strcmp(plan_device_name((enum plan_device)7), "unknown") == 0, "out of range");
}

int main(void)
{
    RUN(test_fixtures_are_what_the_generator_writes);
    RUN(test_invalid_plans_give_their_exact_error);
    RUN(test_valid_plans_resolve_to_expected_json_and_round_trip);
    RUN(test_defaults_land_in_the_struct);
    RUN(test_round_trip_keeps_awkward_values);
    RUN(test_override_values_are_json_else_strings);
    RUN(test_relative_paths_resolve_against_plan_dir_but_overrides_against_cwd);
    RUN(test_errors_never_need_an_err);
    RUN(test_missing_file_names_the_path);
    RUN(test_enum_names_match_the_plan_spelling);
    return check_exit_code();
}
