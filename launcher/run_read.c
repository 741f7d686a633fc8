/* run_read.c — metrics.jsonl read back as columns for plait status and
 * plait plot (run_read.h). */
#include "launcher/run_read.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fsutil.h"

static double num(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_number(v) ? json_number_value(v) : 0;
}

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

int run_series_read(const char *run_dir, struct run_series *s, struct plait_error *err)
{
    char path[4096];
    memset(s, 0, sizeof *s);
    if (fs_join(path, sizeof path, run_dir, "metrics.jsonl", err)) return -1;
    FILE *f = fopen(path, "r");
    if (!f && errno == ENOENT) return 0;
    if (!f) return error_errno(err, "opening %s", path);
    char *line = NULL;
    size_t line_cap = 0;
    int cap_steps = 0, cap_evals = 0, rc = 0;
    int64_t tokens = 0;
    while (getline(&line, &line_cap, f) > 0) {
        json_t *j = json_loads(line, 0, NULL);
        if (!json_is_object(j)) {
            json_decref(j);
            continue;
        }
        if (json_is_integer(json_object_get(j, "step"))) {
            if (grow((void **)&s->steps, s->n_steps, &cap_steps, sizeof *s->steps)) rc = -1;
            if (rc == 0) {
                tokens = (int64_t)num(j, "tokens_total");
                s->steps[s->n_steps++] = (struct run_step){
                    .step = (int)num(j, "step"),
                    .loss = num(j, "loss"),
                    .lr = num(j, "lr"),
                    .ms = num(j, "ms"),
                    .tokens_per_s = num(j, "tokens_per_s"),
                    .tokens_total = tokens,
                };
            }
        } else if (json_is_integer(json_object_get(j, "eval_step"))) {
            if (grow((void **)&s->evals, s->n_evals, &cap_evals, sizeof *s->evals)) rc = -1;
            if (rc == 0)
                s->evals[s->n_evals++] = (struct run_eval){.step = (int)num(j, "eval_step"),
                                                           .val_loss = num(j, "val_loss"),
                                                           .tokens_total = tokens};
        }
        json_decref(j);
        if (rc) break;
    }
    free(line);
    fclose(f);
    if (rc) {
        run_series_free(s);
        return error_set(err, "out of memory reading %s", path);
    }
    return 0;
}

void run_series_free(struct run_series *s)
{
    free(s->steps);
    free(s->evals);
    memset(s, 0, sizeof *s);
}

int run_checkpoint_dir(const char *run_dir, char *out, size_t out_bytes, struct plait_error *err)
{
    char path[4096];
    if (fs_join(path, sizeof path, run_dir, "plan.json", err)) return -1;
    json_t *plan = json_load_file(path, 0, NULL);
    const char *dir =
        json_string_value(json_object_get(json_object_get(plan, "checkpoint"), "dir"));
    if (!dir) dir = "checkpoints";
    int rc = 0;
    if (dir[0] == '/') {
        if ((size_t)snprintf(out, out_bytes, "%s", dir) >= out_bytes)
            rc = error_set(err, "%s: path too long", dir);
    } else {
        rc = fs_join(out, out_bytes, run_dir, dir, err);
    }
    json_decref(plan);
    return rc;
}
