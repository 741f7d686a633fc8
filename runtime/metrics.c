/* metrics.c — appending records to metrics.jsonl, and cutting it back to a
 * checkpoint's step on resume (through a temp file and rename). */
#include "runtime/metrics.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fsutil.h"

/* The step a record belongs to (step or eval_step), or -1 if it has none. */
static json_int_t record_step(const char *line)
{
    json_t *j = json_loads(line, 0, NULL);
    if (!j) return -1;
    json_t *s = json_object_get(j, "step");
    if (!s) s = json_object_get(j, "eval_step");
    json_int_t step = json_is_integer(s) ? json_integer_value(s) : -1;
    json_decref(j);
    return step;
}

int metrics_open(struct metrics *mt, const char *run_dir, int keep_step, struct plait_error *err)
{
    snprintf(mt->path, sizeof mt->path, "%s/metrics.jsonl", run_dir);
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

int metrics_step(struct metrics *mt, const struct step_metrics *s, struct plait_error *err)
{
    json_t *j = json_pack("{s:i,s:f,s:f,s:f,s:I,s:I,s:f,s:f,s:f}", "step", s->step, "loss", s->loss,
                          "lr", s->lr, "grad_norm", s->grad_norm, "tokens", (json_int_t)s->tokens,
                          "tokens_total", (json_int_t)s->tokens_total, "ms", s->ms, "tokens_per_s",
                          s->tokens_per_s, "peak_pct", s->peak_pct);
    if (j && s->mfu > 0) json_object_set_new(j, "mfu", json_real(s->mfu));
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
    if (j && s->ranks > 1 && s->bubble_sim_pct >= 0)
        json_object_set_new(json_object_get(j, "parallel"), "bubble_simulated_pct",
                            json_real(s->bubble_sim_pct));
    return put(mt, j, err);
}

int metrics_eval(struct metrics *mt, int step, double val_loss, int64_t val_tokens,
                 struct plait_error *err)
{
    json_t *j = json_pack("{s:i,s:f,s:I}", "eval_step", step, "val_loss", val_loss, "val_tokens",
                          (json_int_t)val_tokens);
    return put(mt, j, err);
}

void metrics_close(struct metrics *mt)
{
    if (mt->f) fclose(mt->f);
    mt->f = NULL;
}
