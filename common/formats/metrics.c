/* metrics.c — RUN_DIR/metrics.jsonl (metrics.h): appending records, cutting
 * it back to a checkpoint's step on resume (through a temp file and rename),
 * reading it back as records. What is measured is plait-train's. */
#include "common/formats/metrics.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fsutil.h"
#include "common/json_read.h"
#include "common/formats/rundir.h"

/* The step a record belongs to: its "step" (*eval false) or "eval_step"
 * (*eval true) member; NULL when it has neither. */
static json_t *step_member(json_t *j, bool *eval)
{
    json_t *s = json_object_get(j, "step");
    *eval = !s && (s = json_object_get(j, "eval_step")) != NULL;
    return s;
}

/* The step a record belongs to (step or eval_step), or -1 if it has none. */
static json_int_t record_step(const char *line)
{
    json_t *j = json_loads(line, 0, NULL);
    if (!j) return -1;
    bool eval;
    json_t *s = step_member(j, &eval);
    json_int_t step = json_is_integer(s) ? json_integer_value(s) : -1;
    json_decref(j);
    return step;
}

int metrics_open(struct metrics *mt, const char *run_dir, int keep_step, struct plait_error *err)
{
    mt->f = NULL;
    mt->tb.f = NULL;
    snprintf(mt->path, sizeof mt->path, "%s/" RUNDIR_METRICS, run_dir);
    size_t bytes;
    struct plait_error ignored;
    char *old = fs_read_all(mt->path, &bytes, &ignored);
    if (old) { /* keep the records up to keep_step */
        size_t out_len = 0;
        char *out = malloc(bytes + 1);
        if (!out) {
            free(old);
            return error_set(err, "out of memory");
        }
        for (char *line = old, *next; *line; line = next) {
            char *nl = strchr(line, '\n');
            next = nl ? nl + 1 : line + strlen(line);
            if (!nl) break; /* a torn last line */
            *nl = '\0';
            json_int_t s = record_step(line);
            if (s >= 1 && s <= keep_step) {
                size_t n = strlen(line);
                memcpy(out + out_len, line, n);
                out[out_len + n] = '\n';
                out_len += n + 1;
            }
        }
        int rc = fs_write_atomic(mt->path, out, out_len, err);
        free(out);
        free(old);
        if (rc) return -1;
    }
    mt->f = fopen(mt->path, "a");
    if (!mt->f) return error_errno(err, "opening %s", mt->path);
    return 0;
}

static int put(struct metrics *mt, json_t *j, struct plait_error *err)
{
    char *text = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(17) | JSON_PRESERVE_ORDER);
    json_decref(j);
    if (!text) return error_set(err, "out of memory");
    int bad = fprintf(mt->f, "%s\n", text) < 0 || fflush(mt->f) != 0;
    if (mt->echo) { /* a console: a closed one is not the metrics' failure */
        fprintf(mt->echo, "%s\n", text);
        fflush(mt->echo);
    }
    free(text);
    if (bad) return error_errno(err, "writing %s", mt->path);
    return 0;
}

/* The "moe" member of a step's record. */
static json_t *moe_json(const struct step_metrics *s)
{
    json_t *load = json_array();
    for (int e = 0; load && e < s->moe_experts; e++)
        json_array_append_new(load, json_real(s->moe_load[e]));
    return json_pack("{s:f,s:f,s:f,s:o*}", "balance_loss", s->moe_balance_loss, "z_loss",
                     s->moe_z_loss, "dropped", s->moe_dropped, "load", load);
}

/* A communicator only some layouts have, under parallel's bytes and wait_ms when it sent */
static void put_optional_comm(json_t *par, const char *name, double bytes, double wait_ms)
{
    if (!par || bytes <= 0) return;
    json_object_set_new(json_object_get(par, "bytes"), name, json_real(bytes));
    json_object_set_new(json_object_get(par, "wait_ms"), name, json_real(wait_ms));
}

/* Its reading back (0 where it is not written) */
static void read_optional_comm(struct json_read *r, json_t *b, json_t *w, const char *name,
                               double *bytes, double *wait_ms)
{
    if (json_read_has(b, name)) *bytes = json_read_number(r, b, "parallel.bytes", name);
    if (json_read_has(w, name)) *wait_ms = json_read_number(r, w, "parallel.wait_ms", name);
}

int metrics_step(struct metrics *mt, const struct step_metrics *s, struct plait_error *err)
{
    json_t *j = json_pack("{s:i,s:f,s:f,s:f,s:I,s:I,s:f,s:f,s:f}", "step", s->step, "loss", s->loss,
                          "lr", s->lr, "grad_norm", s->grad_norm, "tokens", (json_int_t)s->tokens,
                          "tokens_total", (json_int_t)s->tokens_total, "ms", s->ms, "tokens_per_s",
                          s->tokens_per_s, "peak_pct", s->peak_pct);
    if (j && s->mfu > 0) json_object_set_new(j, "mfu", json_real(s->mfu));
    if (j && s->resumed) json_object_set_new(j, "resumed", json_true());
    if (j && s->ranks > 1)
        json_object_set_new(
            j, "parallel",
            json_pack("{s:i,s:f,s:f,s:f,s:{s:f,s:f,s:f},s:{s:f,s:f,s:f},s:{s:i,s:f,s:"
                      "f}}",
                      "ranks", s->ranks, "compute_pct", s->compute_pct, "comm_pct", s->comm_pct,
                      "bubble_pct", s->idle_pct, "bytes", "tp", s->bytes_tp, "pp", s->bytes_pp,
                      "dp", s->bytes_dp, "wait_ms", "tp", s->wait_tp_ms, "pp", s->wait_pp_ms, "dp",
                      s->wait_dp_ms, "straggler", "rank", s->straggler, "busy_ms", s->busy_ms,
                      "median_busy_ms", s->median_busy_ms));
    json_t *par = json_object_get(j, "parallel");
    put_optional_comm(par, "cp", s->bytes_cp, s->wait_cp_ms); /* context parallelism's ring */
    put_optional_comm(par, "ep", s->bytes_ep, s->wait_ep_ms); /* the experts' all-to-alls */
    if (j && s->moe_experts > 0) json_object_set_new(j, "moe", moe_json(s));
    if (j && s->ranks > 1 && s->bubble_sim_pct >= 0)
        json_object_set_new(json_object_get(j, "parallel"), "bubble_simulated_pct",
                            json_real(s->bubble_sim_pct));
    if (put(mt, j, err)) return -1;
    const char *tags[] = {"train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s"};
    double values[] = {s->loss, s->lr, s->grad_norm, s->tokens_per_s};
    for (int i = 0; i < 4; i++)
        if (tensorboard_scalar(&mt->tb, tags[i], s->step, values[i], err)) return -1;
    return 0;
}

int metrics_eval(struct metrics *mt, const struct eval_metrics *e, struct plait_error *err)
{
    json_t *j = json_pack("{s:i,s:f,s:I}", "eval_step", e->step, "val_loss", e->val_loss,
                          "val_tokens", (json_int_t)e->val_tokens);
    return put(mt, j, err) || tensorboard_scalar(&mt->tb, "val/loss", e->step, e->val_loss, err);
}

int metrics_tensorboard(struct metrics *mt, const char *run_dir, const char *dir, int keep_step,
                        struct plait_error *err)
{
    char path[4096];
    if (dir[0] == '/' ? snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path
                      : fs_join(path, sizeof path, run_dir, dir, err) != 0)
        return error_set(err, "train.tensorboard: path too long");
    return tensorboard_open(&mt->tb, path, keep_step, err);
}

void metrics_close(struct metrics *mt)
{
    if (mt->f) fclose(mt->f);
    mt->f = NULL;
    tensorboard_close(&mt->tb);
}

/* ---- reading ---------------------------------------------------------------------------- */

/* Three members {tp, pp, dp} of object key of parallel. */
static void read_by_comm(struct json_read *r, json_t *par, const char *key, double out[3])
{
    char at[32];
    snprintf(at, sizeof at, "parallel.%s", key);
    json_t *o = json_read_object(r, par, "parallel", key);
    static const char *const names[3] = {"tp", "pp", "dp"};
    for (int i = 0; i < 3; i++) out[i] = json_read_number(r, o, at, names[i]);
}

static void read_parallel(struct json_read *r, json_t *par, struct step_metrics *s)
{
    s->ranks = (int)json_read_int(r, par, "parallel", "ranks");
    s->compute_pct = json_read_number(r, par, "parallel", "compute_pct");
    s->comm_pct = json_read_number(r, par, "parallel", "comm_pct");
    s->idle_pct = json_read_number(r, par, "parallel", "bubble_pct");
    if (json_read_has(par, "bubble_simulated_pct"))
        s->bubble_sim_pct = json_read_number(r, par, "parallel", "bubble_simulated_pct");
    double bytes[3], wait[3];
    read_by_comm(r, par, "bytes", bytes);
    read_by_comm(r, par, "wait_ms", wait);
    s->bytes_tp = bytes[0], s->bytes_pp = bytes[1], s->bytes_dp = bytes[2];
    s->wait_tp_ms = wait[0], s->wait_pp_ms = wait[1], s->wait_dp_ms = wait[2];
    json_t *b = json_object_get(par, "bytes"), *w = json_object_get(par, "wait_ms");
    read_optional_comm(r, b, w, "cp", &s->bytes_cp, &s->wait_cp_ms);
    read_optional_comm(r, b, w, "ep", &s->bytes_ep, &s->wait_ep_ms);
    json_t *st = json_read_object(r, par, "parallel", "straggler");
    s->straggler = (int)json_read_int(r, st, "parallel.straggler", "rank");
    s->busy_ms = json_read_number(r, st, "parallel.straggler", "busy_ms");
    s->median_busy_ms = json_read_number(r, st, "parallel.straggler", "median_busy_ms");
}

/* The "moe" member: its numbers, and the load into an array of the record's own. */
static void read_moe(struct json_read *r, json_t *moe, struct step_metrics *s)
{
    s->moe_balance_loss = json_read_number(r, moe, "moe", "balance_loss");
    s->moe_z_loss = json_read_number(r, moe, "moe", "z_loss");
    s->moe_dropped = json_read_number(r, moe, "moe", "dropped");
    json_t *load = json_read_array(r, moe, "moe", "load");
    size_t n = r->failed ? 0 : json_array_size(load);
    if (r->failed || n < 1) {
        if (!r->failed) json_read_fail(r, "moe", "load", "no expert's share");
        return;
    }
    if (!(s->moe_load = calloc(n, sizeof *s->moe_load))) {
        json_read_fail(r, "moe", "load", "out of memory");
        return;
    }
    s->moe_experts = (int)n;
    for (size_t e = 0; e < n && !r->failed; e++) {
        json_t *v = json_array_get(load, e);
        if (!json_is_number(v)) json_read_fail(r, "moe", "load", "share %zu: not a number", e);
        s->moe_load[e] = json_number_value(v);
    }
}

static void read_step(struct json_read *r, json_t *j, struct step_metrics *s)
{
    *s = (struct step_metrics){.ranks = 1, .bubble_sim_pct = -1};
    s->step = (int)json_read_int(r, j, NULL, "step");
    s->loss = json_read_number(r, j, NULL, "loss");
    s->lr = json_read_number(r, j, NULL, "lr");
    s->grad_norm = json_read_number(r, j, NULL, "grad_norm");
    s->tokens = json_read_int(r, j, NULL, "tokens");
    s->tokens_total = json_read_int(r, j, NULL, "tokens_total");
    s->ms = json_read_number(r, j, NULL, "ms");
    s->tokens_per_s = json_read_number(r, j, NULL, "tokens_per_s");
    s->peak_pct = json_read_number(r, j, NULL, "peak_pct");
    if (json_read_has(j, "mfu")) s->mfu = json_read_number(r, j, NULL, "mfu");
    if (json_read_has(j, "resumed")) s->resumed = json_read_bool(r, j, NULL, "resumed");
    if (json_read_has(j, "parallel")) read_parallel(r, json_read_object(r, j, NULL, "parallel"), s);
    if (json_read_has(j, "moe")) read_moe(r, json_read_object(r, j, NULL, "moe"), s);
}

static void read_eval(struct json_read *r, json_t *j, struct eval_metrics *e)
{
    e->step = (int)json_read_int(r, j, NULL, "eval_step");
    e->val_loss = json_read_number(r, j, NULL, "val_loss");
    e->val_tokens = json_read_int(r, j, NULL, "val_tokens");
}

/* Room for one more element of *arr (n used of *cap). */
static int grow(void **arr, int n, int *cap, size_t elem)
{
    if (n < *cap) return 0;
    int bigger_cap = *cap ? 2 * *cap : 256;
    void *bigger = realloc(*arr, (size_t)bigger_cap * elem);
    if (!bigger) return -1;
    *arr = bigger;
    *cap = bigger_cap;
    return 0;
}

/* One line's record into s (r names the file and line). */
static void read_record(struct json_read *r, json_t *j, struct metrics_series *s, int cap[2])
{
    bool eval;
    if (!step_member(j, &eval)) return; /* neither a step's nor an evaluation's */
    if (!eval && grow((void **)&s->steps, s->n_steps, &cap[0], sizeof *s->steps) == 0) {
        read_step(r, j, &s->steps[s->n_steps]);
        if (r->failed) free(s->steps[s->n_steps].moe_load);
        s->n_steps += !r->failed;
    } else if (eval && grow((void **)&s->evals, s->n_evals, &cap[1], sizeof *s->evals) == 0) {
        struct eval_metrics *e = &s->evals[s->n_evals];
        read_eval(r, j, e);
        e->tokens_total = s->n_steps ? s->steps[s->n_steps - 1].tokens_total : 0;
        s->n_evals += !r->failed;
    } else {
        r->failed = error_set(r->err, "out of memory reading %s", r->file);
    }
}

int metrics_read(const char *run_dir, struct metrics_series *s, struct plait_error *err)
{
    char path[4096], where[4200];
    memset(s, 0, sizeof *s);
    if (fs_join(path, sizeof path, run_dir, RUNDIR_METRICS, err)) return -1;
    FILE *f = fopen(path, "r");
    if (!f && errno == ENOENT) return 0;
    if (!f) return error_errno(err, "opening %s", path);
    char *line = NULL;
    size_t line_cap = 0;
    int cap[2] = {0, 0};
    struct json_read r = {where, err, 0};
    for (long n = 1; !r.failed && getline(&line, &line_cap, f) > 0; n++) {
        json_t *j = json_loads(line, 0, NULL);
        snprintf(where, sizeof where, "%s:%ld", path, n);
        if (json_is_object(j)) read_record(&r, j, s, cap);
        json_decref(j);
    }
    free(line);
    fclose(f);
    if (r.failed) metrics_series_free(s);
    return r.failed;
}

void metrics_series_free(struct metrics_series *s)
{
    for (int i = 0; s->steps && i < s->n_steps; i++) free(s->steps[i].moe_load);
    free(s->steps);
    free(s->evals);
    memset(s, 0, sizeof *s);
}
