/* cmd_status.c — `plait status RUN_DIR [RUN_DIR ...] [--json]`: a run at a
 * glance from what its directory holds: the plan, how far it got (metrics),
 * its checkpoints (verified), whether a process runs it now (its lock) or how
 * it ended (end.json), and plait check's predicted memory beside the
 * measured. Reads only; never takes the run's lock. */
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/ckptdir.h"
#include "common/env.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/runlock.h"
#include "launcher/commands.h"
#include "launcher/run_read.h"

enum { OPT_JSON };
const struct cli_command cmd_status_cli = {
    .name = "status",
    .operands = "RUN_DIR...",
    .min_operands = 1,
    .max_operands = 1 << 20,
    .summary = "a run at a glance",
    .description = "For each run directory: the plan, step / steps, last loss and validation\n"
                   "loss, tokens/s (the last 20 steps'), ETA, checkpoints (the newest, verified),\n"
                   "whether a process runs it now or how it ended, and plait check's predicted\n"
                   "memory beside the measured.",
    .options = (const struct cli_option[]){[OPT_JSON] = {"--json", NULL,
                                                         "one JSON object per run directory, "
                                                         "one per line"},
                                           {0}},
    .epilog = "exit codes: 0 every directory was read, 1 one is not a run directory",
};

static json_t *load_json(const char *dir, const char *name)
{
    char path[4096];
    struct plait_error err;
    if (fs_join(path, sizeof path, dir, name, &err)) return NULL;
    return json_load_file(path, 0, NULL);
}

static json_int_t int_at(json_t *root, const char *section, const char *key)
{
    json_t *v = json_object_get(section ? json_object_get(root, section) : root, key);
    return json_is_integer(v) ? json_integer_value(v) : 0;
}

/* The pace of the last (up to) 20 steps: mean seconds per step, tokens/s */
static void recent_pace(const struct run_series *s, double *step_s, double *tokens_per_s)
{
    int from = s->n_steps > 20 ? s->n_steps - 20 : 0;
    double ms = 0, tokens = 0;
    for (int i = from; i < s->n_steps; i++) {
        ms += s->steps[i].ms;
        tokens += s->steps[i].tokens_per_s * s->steps[i].ms / 1e3;
    }
    *step_s = ms / 1e3 / (s->n_steps - from);
    *tokens_per_s = ms > 0 ? tokens / (ms / 1e3) : 0;
}

/* The checkpoints: how many, the newest and whether it verifies. */
static json_t *checkpoints_json(const char *run_dir)
{
    char path[4096];
    struct plait_error err;
    if (run_checkpoint_dir(run_dir, path, sizeof path, &err))
        return json_pack("{s:i,s:s}", "count", 0, "error", err.text);
    struct ckptdir d = {.path = strdup(path)};
    struct ckpt_entry *list = NULL;
    int n = 0;
    if (!d.path || ckptdir_list(&d, &list, &n, &err)) {
        ckptdir_close(&d);
        return json_pack("{s:i}", "count", 0);
    }
    json_t *out = json_pack("{s:i,s:s}", "count", n, "dir", path);
    if (n > 0) {
        int ok = ckptdir_verify(&d, list[0].name, &err) == 0;
        json_object_set_new(out, "newest", json_string(list[0].name));
        json_object_set_new(out, "newest_step", json_integer(list[0].step));
        json_object_set_new(out, "verified", json_boolean(ok));
        if (!ok) json_object_set_new(out, "verify_error", json_string(err.text));
    }
    free(list);
    ckptdir_close(&d);
    return out;
}

/* Running now (the lock is held), else how the last process ended. */
static json_t *state_json(const char *run_dir)
{
    char holder[512] = "";
    struct plait_error err;
    int held = runlock_holder(run_dir, holder, sizeof holder, &err);
    if (held == 1) return json_pack("{s:s,s:s}", "state", "running", "holder", holder);
    json_t *end = load_json(run_dir, "end.json");
    if (!end) return json_pack("{s:s}", "state", held < 0 ? "unknown" : "not running");
    json_t *out = json_pack("{s:s,s:O}", "state", "ended", "end", end);
    json_decref(end);
    return out;
}

/* plait check's predictions beside what the runtime measured (run.json's
 * memory section, rank 0) */
static json_t *memory_json(json_t *run)
{
    json_t *r0 = json_array_get(json_object_get(json_object_get(run, "memory"), "ranks"), 0);
    if (!r0) return NULL;
    json_t *pred = json_object_get(r0, "predicted"), *alloc = json_object_get(r0, "allocated");
    return json_pack("{s:I,s:I,s:I,s:I,s:I}", "predicted_bytes", int_at(pred, NULL, "total"),
                     "allocated_bytes", int_at(alloc, NULL, "total"), "predicted_activation_bytes",
                     int_at(pred, NULL, "activations"), "allocated_activation_bytes",
                     int_at(alloc, NULL, "activations"), "rss_peak_bytes",
                     int_at(r0, NULL, "rss_peak_bytes"));
}

/* What plait check's cost model gave for the run's plan on this machine when
 * it started: run.json's, modelled from the CPU kernels' rates plait-train
 * measured then (re-measuring now, beside a running run, would measure a
 * shared machine); 0 when it does not say. */
static double modelled_tokens_per_s(json_t *run)
{
    json_t *v = json_object_get(json_object_get(run, "throughput"), "modelled_tokens_per_s");
    return json_is_number(v) ? json_number_value(v) : 0;
}

static json_t *status_json(const char *run_dir, struct plait_error *err)
{
    json_t *plan = load_json(run_dir, "plan.json");
    if (!plan) {
        error_set(err, "%s: not a run directory (no plan.json: has plait train run there?)",
                  run_dir);
        return NULL;
    }
    json_t *run = load_json(run_dir, "run.json");
    struct run_series s;
    if (run_series_read(run_dir, &s, err)) {
        json_decref(plan);
        json_decref(run);
        return NULL;
    }
    const char *base = strrchr(run_dir, '/');
    base = base && base[1] ? base + 1 : run_dir;
    json_int_t steps = int_at(plan, NULL, "steps");
    json_t *o = json_pack(
        "{s:s,s:s,s:{s:I,s:I,s:I},s:{s:I,s:I,s:I},s:I}", "run_dir", run_dir, "name", base, "model",
        "layers", int_at(plan, "model", "layers"), "hidden", int_at(plan, "model", "hidden"),
        "seq_len", int_at(plan, "model", "seq_len"), "layout", "tp", int_at(plan, "parallel", "tp"),
        "pp", int_at(plan, "parallel", "pp"), "dp", int_at(plan, "parallel", "dp"), "steps", steps);
    if (s.n_steps > 0) {
        const struct run_step *last = &s.steps[s.n_steps - 1];
        json_object_set_new(o, "step", json_integer(last->step));
        json_object_set_new(o, "loss", json_real(last->loss));
        double step_s, rate;
        recent_pace(&s, &step_s, &rate);
        json_object_set_new(o, "tokens_per_s", json_real(rate)); /* the last 20 steps' */
        json_object_set_new(o, "tokens_total", json_integer(last->tokens_total));
        double modelled = modelled_tokens_per_s(run);
        if (modelled > 0) json_object_set_new(o, "modelled_tokens_per_s", json_real(modelled));
        json_object_set_new(o, "eta_s", json_real(step_s * (double)(steps - last->step)));
    } else {
        json_object_set_new(o, "step", json_integer(0));
    }
    if (s.n_evals > 0) {
        json_object_set_new(o, "val_loss", json_real(s.evals[s.n_evals - 1].val_loss));
        json_object_set_new(o, "val_step", json_integer(s.evals[s.n_evals - 1].step));
    }
    json_object_set_new(o, "checkpoints", checkpoints_json(run_dir));
    json_t *state = state_json(run_dir);
    json_object_update(o, state);
    json_decref(state);
    json_t *mem = memory_json(run);
    if (mem) json_object_set_new(o, "memory", mem);
    run_series_free(&s);
    json_decref(plan);
    json_decref(run);
    return o;
}

static double num(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

static void print_text(json_t *o)
{
    json_t *layout = json_object_get(o, "layout"), *model = json_object_get(o, "model");
    printf("%s\n", json_string_value(json_object_get(o, "run_dir")));
    printf("  plan         %s: %d layers, hidden %d, seq %d; tp %d × pp %d × dp %d\n",
           json_string_value(json_object_get(o, "name")), (int)int_at(model, NULL, "layers"),
           (int)int_at(model, NULL, "hidden"), (int)int_at(model, NULL, "seq_len"),
           (int)int_at(layout, NULL, "tp"), (int)int_at(layout, NULL, "pp"),
           (int)int_at(layout, NULL, "dp"));
    json_int_t step = int_at(o, NULL, "step"), steps = int_at(o, NULL, "steps");
    printf("  step         %lld/%lld (%.0f%%)", (long long)step, (long long)steps,
           steps > 0 ? 100.0 * (double)step / (double)steps : 0.0);
    if (isfinite(num(o, "loss"))) printf(", loss %.4f", num(o, "loss"));
    if (isfinite(num(o, "val_loss")))
        printf(", val loss %.4f (step %lld)", num(o, "val_loss"),
               (long long)int_at(o, NULL, "val_step"));
    printf("\n");
    if (isfinite(num(o, "tokens_per_s"))) {
        char eta[32];
        log_format_duration(eta, sizeof eta, num(o, "eta_s"));
        printf("  speed        %.0f tokens/s, ETA %s", num(o, "tokens_per_s"),
               step >= steps ? "-" : eta);
        double modelled = num(o, "modelled_tokens_per_s");
        if (isfinite(modelled))
            printf(" (plait check's cost model: %.0f tokens/s here, measured/modelled %.2f)",
                   modelled, num(o, "tokens_per_s") / modelled);
        printf("\n");
    }
    json_t *ck = json_object_get(o, "checkpoints");
    json_int_t n_ck = int_at(ck, NULL, "count");
    if (n_ck > 0)
        printf("  checkpoints  %lld, newest %s (%s)\n", (long long)n_ck,
               json_string_value(json_object_get(ck, "newest")),
               json_is_true(json_object_get(ck, "verified")) ? "verified" : "DOES NOT VERIFY");
    else
        printf("  checkpoints  none\n");
    const char *state = json_string_value(json_object_get(o, "state"));
    json_t *end = json_object_get(o, "end");
    if (!strcmp(state, "running")) {
        printf("  state        running: %s\n", json_string_value(json_object_get(o, "holder")));
    } else if (end) {
        const char *how = json_string_value(json_object_get(end, "end"));
        const char *sig = json_string_value(json_object_get(end, "signal"));
        const char *msg = json_string_value(json_object_get(end, "message"));
        printf("  state        %s (exit %d) at %s", how, (int)int_at(end, NULL, "exit_code"),
               json_string_value(json_object_get(end, "time")));
        if (sig && *sig) printf(" by %s", sig);
        if (!strcmp(how, "preempted")) printf(": run plait train again to resume");
        if (msg && *msg) printf(": %s", msg);
        printf("\n");
    } else {
        printf("  state        not running (how its last process ended is not recorded)\n");
    }
    json_t *mem = json_object_get(o, "memory");
    if (mem) {
        double pred = (double)int_at(mem, NULL, "predicted_bytes");
        double got = (double)int_at(mem, NULL, "allocated_bytes");
        double pa = (double)int_at(mem, NULL, "predicted_activation_bytes");
        double ga = (double)int_at(mem, NULL, "allocated_activation_bytes");
        printf("  memory       rank 0: plait check predicted %.1f MB (activations %.1f MB), "
               "allocated %.1f MB (activations %.1f MB), peak resident %.1f MB\n",
               pred / 1e6, pa / 1e6, got / 1e6, ga / 1e6,
               (double)int_at(mem, NULL, "rss_peak_bytes") / 1e6);
    }
}

int cmd_status(int argc, char **argv)
{
    struct cli_args a;
    int parsed = cli_parse(&cmd_status_cli, argc, argv, &a);
    if (parsed != CLI_CONTINUE) return parsed;
    bool as_json = false;
    int rc = PLAIT_EXIT_OK;
    for (int k = 0; k < a.n; k++)
        if (a.v[k].opt == OPT_JSON) as_json = true;
    bool first = true;
    for (int k = 0; k < a.n; k++) {
        if (a.v[k].opt != -1) continue;
        struct plait_error err;
        json_t *o = status_json(a.v[k].value, &err);
        if (!o) {
            log_error("%s", err.text);
            rc = PLAIT_EXIT_ERROR;
            continue;
        }
        if (as_json) {
            char *text = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
            if (text) printf("%s\n", text);
            free(text);
        } else {
            if (!first) printf("\n");
            print_text(o);
        }
        first = false;
        json_decref(o);
    }
    cli_args_free(&a);
    return rc;
}
