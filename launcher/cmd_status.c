/* cmd_status.c — `plait status RUN_DIR [RUN_DIR ...] [--json]`: a run at a
 * glance from what its directory holds: the plan, how far it got (metrics),
 * its checkpoints (verified), whether a process runs it now (its lock) or how
 * it ended (end.json), and plait check's predicted memory beside the
 * measured. Reads only, and only through the formats' own modules (rundir,
 * metrics, runjson, runend, ckptdir); never takes the run's lock. */
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/formats/ckptdir.h"
#include "common/place/env.h"
#include "common/place/place.h" // defines: place_layout_text
#include "common/fsutil.h"
#include "common/log.h"
#include "common/formats/metrics.h"
#include "common/plan/plan.h"
#include "common/formats/rundir.h"
#include "common/formats/runend.h"
#include "common/formats/runjson.h"
#include "common/formats/runlock.h"
#include "launcher/commands.h"

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

static json_int_t int_at(json_t *root, const char *section, const char *key)
{
    json_t *v = json_object_get(section ? json_object_get(root, section) : root, key);
    return json_is_integer(v) ? json_integer_value(v) : 0;
}

/* The run's plan (its plan.json); NULL with err when it has none or it does
 * not load. */
static struct plan *run_plan(const char *run_dir, struct plait_error *err)
{
    char path[4096];
    struct stat st;
    if (fs_join(path, sizeof path, run_dir, RUNDIR_PLAN, err)) return NULL;
    if (stat(path, &st) != 0) {
        error_set(err, "%s: not a run directory (no " RUNDIR_PLAN ": has plait train run there?)",
                  run_dir);
        return NULL;
    }
    return rundir_plan_load(run_dir, err);
}

/* The pace of the last (up to) 20 steps: mean seconds per step, tokens/s */
static void recent_pace(const struct metrics_series *s, double *step_s, double *tokens_per_s)
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
static json_t *checkpoints_json(const struct plan *plan, const char *run_dir)
{
    char path[4096];
    struct plait_error err;
    if (rundir_checkpoint_dir(plan, run_dir, path, sizeof path, &err))
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
    struct run_end e;
    int got = runend_read(run_dir, &e, &err);
    if (got < 0) log_warn("%s", err.text);
    if (got != 0) return json_pack("{s:s}", "state", held < 0 ? "unknown" : "not running");
    return json_pack("{s:s,s:{s:i,s:s,s:s,s:s,s:s,s:s,s:i}}", "state", "ended", "end", "exit_code",
                     e.exit_code, "end", e.end, "signal", e.signal, "message", e.message, "time",
                     e.time, "host", e.host, "pid", e.pid);
}

/* plait check's predictions beside what the runtime measured (run.json's
 * memory section, rank 0) */
static json_t *memory_json(const char *run_dir)
{
    struct run_record run;
    struct plait_error err;
    int got = runjson_read(run_dir, &run, &err);
    if (got < 0) log_warn("%s", err.text);
    if (got != 0) return NULL;
    json_t *out = NULL;
    if (run.n_ranks > 0) {
        const struct run_rank_memory *r0 = &run.ranks[0];
        out = json_pack("{s:I,s:I,s:I,s:I,s:I}", "predicted_bytes",
                        (json_int_t)run_bytes_total(&r0->predicted), "allocated_bytes",
                        (json_int_t)run_bytes_total(&r0->allocated), "predicted_activation_bytes",
                        (json_int_t)r0->predicted.activations, "allocated_activation_bytes",
                        (json_int_t)r0->allocated.activations, "rss_peak_bytes",
                        (json_int_t)r0->rss_peak_bytes);
    }
    runjson_free(&run);
    return out;
}

/* What plait check's cost model gave for the run's plan on this machine when
 * it started: run.json's, modelled from the CPU kernels' rates plait-train
 * measured then (measuring now, beside a running run or after it, would
 * measure another moment of a shared machine); 0 when it does not say. */
static double modelled_tokens_per_s(const char *run_dir)
{
    struct run_record run;
    struct plait_error err;
    if (runjson_read(run_dir, &run, &err) != 0) return 0;
    double rate = run.modelled_tokens_per_s;
    runjson_free(&run);
    return rate;
}

/* A mixture of experts' last step: its losses, drops and the least and most loaded
 * experts' shares of the choices. */
static json_t *moe_json(const struct step_metrics *last)
{
    double lo = last->moe_load[0], hi = lo;
    for (int e = 1; e < last->moe_experts; e++) {
        lo = last->moe_load[e] < lo ? last->moe_load[e] : lo;
        hi = last->moe_load[e] > hi ? last->moe_load[e] : hi;
    }
    return json_pack("{s:i,s:f,s:f,s:f,s:f,s:f}", "experts", last->moe_experts, "balance_loss",
                     last->moe_balance_loss, "z_loss", last->moe_z_loss, "dropped",
                     last->moe_dropped, "load_min", lo, "load_max", hi);
}

/* How far the run got: its last step, loss and pace (with plait check's
 * cost model's for its plan on this machine, `modelled`; 0: none), its last
 * evaluation. */
static void progress_json(json_t *o, const struct metrics_series *s, const struct plan *plan,
                          double modelled)
{
    if (s->n_steps > 0) {
        const struct step_metrics *last = &s->steps[s->n_steps - 1];
        json_object_set_new(o, "step", json_integer(last->step));
        json_object_set_new(o, "loss", json_real(last->loss));
        double step_s, rate;
        recent_pace(s, &step_s, &rate);
        json_object_set_new(o, "tokens_per_s", json_real(rate)); /* the last 20 steps' */
        json_object_set_new(o, "tokens_total", json_integer(last->tokens_total));
        if (modelled > 0) json_object_set_new(o, "modelled_tokens_per_s", json_real(modelled));
        json_object_set_new(o, "eta_s", json_real(step_s * (double)(plan->steps - last->step)));
        if (last->moe_experts > 0) json_object_set_new(o, "moe", moe_json(last));
    } else {
        json_object_set_new(o, "step", json_integer(0));
    }
    if (s->n_evals > 0) {
        json_object_set_new(o, "val_loss", json_real(s->evals[s->n_evals - 1].val_loss));
        json_object_set_new(o, "val_step", json_integer(s->evals[s->n_evals - 1].step));
    }
}

static json_t *status_json(const char *run_dir, struct plait_error *err)
{
    struct plan *plan = run_plan(run_dir, err);
    if (!plan) return NULL;
    struct metrics_series s;
    if (metrics_read(run_dir, &s, err)) {
        plan_free(plan);
        return NULL;
    }
    const char *base = strrchr(run_dir, '/');
    base = base && base[1] ? base + 1 : run_dir;
    const struct plan_model *m = &plan->model;
    const struct plan_parallel *par = &plan->parallel;
    json_t *o =
        json_pack("{s:s,s:s,s:{s:i,s:i,s:i},s:{s:i,s:i,s:i},s:i}", "run_dir", run_dir, "name", base,
                  "model", "layers", m->layers, "hidden", m->hidden, "seq_len", m->seq_len,
                  "layout", "tp", par->tp, "pp", par->pp, "dp", par->dp, "steps", plan->steps);
    if (par->cp > 1) /* context parallelism, named only where the run has it */
        json_object_set_new(json_object_get(o, "layout"), "cp", json_integer(par->cp));
    progress_json(o, &s, plan, modelled_tokens_per_s(run_dir));
    json_object_set_new(o, "checkpoints", checkpoints_json(plan, run_dir));
    json_t *state = state_json(run_dir);
    json_object_update(o, state);
    json_decref(state);
    json_t *mem = memory_json(run_dir);
    if (mem) json_object_set_new(o, "memory", mem);
    metrics_series_free(&s);
    plan_free(plan);
    return o;
}

static double num(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

/* A string of a run-directory file, made one printable line (run
 * directories are untrusted input: a hand-made end.json may hold escape
 * sequences). Four at a time may be in use. */
static const char *shown(const char *s)
{
    static char bufs[4][1024];
    static int next;
    char *b = bufs[next++ % 4];
    return s ? error_escape(b, sizeof bufs[0], s) : "?";
}

static const char *str(json_t *o, const char *key)
{
    return shown(json_string_value(json_object_get(o, key)));
}

static void print_text(json_t *o)
{
    json_t *layout = json_object_get(o, "layout"), *model = json_object_get(o, "model");
    printf("%s\n", str(o, "run_dir"));
    char degrees[96];
    json_t *cp = json_object_get(layout, "cp");
    place_layout_text(degrees, sizeof degrees, (int)int_at(layout, NULL, "tp"),
                      cp ? (int)json_integer_value(cp) : 1, (int)int_at(layout, NULL, "pp"),
                      (int)int_at(layout, NULL, "dp"));
    printf("  plan         %s: %d layers, hidden %d, seq %d; %s\n", str(o, "name"),
           (int)int_at(model, NULL, "layers"), (int)int_at(model, NULL, "hidden"),
           (int)int_at(model, NULL, "seq_len"), degrees);
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
    json_t *moe = json_object_get(o, "moe");
    if (moe)
        printf("  experts      %lld, each taking %.1f%%..%.1f%% of the choices, %.0f dropped; "
               "balance loss %.4g, z-loss %.4g (the last step's)\n",
               (long long)int_at(moe, NULL, "experts"), 100 * num(moe, "load_min"),
               100 * num(moe, "load_max"), num(moe, "dropped"), num(moe, "balance_loss"),
               num(moe, "z_loss"));
    json_t *ck = json_object_get(o, "checkpoints");
    json_int_t n_ck = int_at(ck, NULL, "count");
    if (n_ck > 0)
        printf("  checkpoints  %lld, newest %s (%s)\n", (long long)n_ck, str(ck, "newest"),
               json_is_true(json_object_get(ck, "verified")) ? "verified" : "DOES NOT VERIFY");
    else
        printf("  checkpoints  none\n");
    const char *state = json_string_value(json_object_get(o, "state"));
    json_t *end = json_object_get(o, "end");
    if (state && !strcmp(state, "running")) {
        printf("  state        running: %s\n", str(o, "holder"));
    } else if (end) {
        const char *how = json_string_value(json_object_get(end, "end"));
        const char *sig = json_string_value(json_object_get(end, "signal"));
        const char *msg = json_string_value(json_object_get(end, "message"));
        printf("  state        %s (exit %d) at %s", shown(how), (int)int_at(end, NULL, "exit_code"),
               str(end, "time"));
        if (sig && *sig) printf(" by %s", shown(sig));
        if (how && !strcmp(how, "preempted")) printf(": run plait train again to resume");
        if (msg && *msg) printf(": %s", shown(msg));
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
