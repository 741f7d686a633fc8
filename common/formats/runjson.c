/* runjson.c — RUN_DIR/run.json written and read back (runjson.h). What goes
 * into it (measuring the machine, the memory, the pace) is plait-train's;
 * what plait status makes of it is the launcher's. */
#include "common/formats/runjson.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/fsutil.h"
#include "common/json_read.h"
#include "common/formats/rundir.h"

int64_t run_bytes_total(const struct run_bytes *b)
{
    return b->params + b->grads + b->optimizer + b->activations + b->scratch + b->cuda_context;
}

/* ---- writing ---------------------------------------------------------------------------- */

static json_t *bytes_json(const struct run_bytes *b, bool predicted)
{
    json_t *o =
        json_pack("{s:I,s:I,s:I,s:I,s:I}", "params", (json_int_t)b->params, "grads",
                  (json_int_t)b->grads, "optimizer", (json_int_t)b->optimizer, "activations",
                  (json_int_t)b->activations, "total", (json_int_t)run_bytes_total(b));
    if (o && predicted && b->comm_rings >= 0)
        json_object_set_new(o, "comm_rings", json_integer((json_int_t)b->comm_rings));
    if (o && b->host >= 0) json_object_set_new(o, "host", json_integer((json_int_t)b->host));
    if (o && b->scratch > 0)
        json_object_set_new(o, "scratch", json_integer((json_int_t)b->scratch));
    if (o && b->cuda_context > 0)
        json_object_set_new(o, "cuda_context", json_integer((json_int_t)b->cuda_context));
    return o;
}

static json_t *memory_json(const struct run_record *r)
{
    json_t *ranks = json_array();
    for (int i = 0; ranks && i < r->n_ranks; i++) {
        const struct run_rank_memory *m = &r->ranks[i];
        json_array_append_new(
            ranks, json_pack("{s:i,s:i,s:i,s:i,s:o,s:o,s:I,s:I}", "rank", m->rank, "tp", m->tp,
                             "pp", m->pp, "dp", m->dp, "predicted", bytes_json(&m->predicted, true),
                             "allocated", bytes_json(&m->allocated, false), "rss_peak_bytes",
                             (json_int_t)m->rss_peak_bytes, "rss_before_model_bytes",
                             (json_int_t)m->rss_before_model_bytes));
        json_t *last = json_array_get(ranks, json_array_size(ranks) - 1);
        if (last && r->cp > 1) json_object_set_new(last, "cp", json_integer(m->cp));
        if (last && m->device_used_bytes >= 0)
            json_object_set_new(last, "device_used_bytes",
                                json_integer((json_int_t)m->device_used_bytes));
    }
    return json_pack("{s:i,s:o}", "after_step", r->memory_after_step, "ranks", ranks);
}

static json_t *real_or_null(double v)
{
    return v > 0 ? json_real(v) : json_null();
}

static json_t *record_json(const struct run_record *r)
{
    const struct run_machine *m = &r->machine;
    json_error_t jerr;
    json_t *plan = r->plan_json ? json_loads(r->plan_json, 0, &jerr) : NULL;
    json_t *run =
        json_pack("{s:s,s:s,s:o*,s:s?,s:I,s:I,s:{s:s,s:s,s:i,s:i,s:s,s:f,s:s?},s:o*}", "version",
                  r->version, "started", r->started, "plan", plan, "resumed_from",
                  *r->resumed_from ? r->resumed_from : NULL, "parameters",
                  (json_int_t)r->parameters, "activation_bytes", (json_int_t)r->activation_bytes,
                  "machine", "hostname", m->hostname, "cpu", m->cpu, "cores", m->cores, "threads",
                  m->threads, "backend", m->backend, "peak_gflops", m->peak_gflops,
                  "bf16_emulation", *m->bf16_emulation ? m->bf16_emulation : NULL, "memory",
                  r->memory_after_step > 0 ? memory_json(r) : NULL);
    if (run)
        json_object_set_new(
            run, "throughput",
            json_pack("{s:o,s:o}", "modelled_tokens_per_s", real_or_null(r->modelled_tokens_per_s),
                      "measured_tokens_per_s", real_or_null(r->measured_tokens_per_s)));
    if (run && r->has_checkpoint) /* what a preemption's grace time must allow for */
        json_object_set_new(run, "checkpoint",
                            json_pack("{s:b,s:f,s:f}", "async", r->checkpoint_async, "last_write_s",
                                      r->checkpoint_write_s, "last_stall_s",
                                      r->checkpoint_stall_s));
    return run;
}

int runjson_write(const char *run_dir, const struct run_record *r, struct plait_error *err)
{
    json_t *run = record_json(r);
    char *text = run ? json_dumps(run, JSON_INDENT(2)) : NULL;
    json_decref(run);
    if (!text) return error_set(err, "out of memory");
    char path[4096];
    int rc = fs_join(path, sizeof path, run_dir, RUNDIR_RUN, err) ||
                     fs_write_atomic(path, text, strlen(text), err)
                 ? -1
                 : 0;
    free(text);
    return rc;
}

/* ---- reading ---------------------------------------------------------------------------- */

/* A string member (or null: "", when may_be_null) into a buffer. */
static void read_text(struct json_read *rd, json_t *o, const char *at, const char *key,
                      bool may_be_null, char *out, size_t bytes)
{
    out[0] = '\0';
    if (may_be_null && !json_read_has(o, key)) return;
    const char *s = json_read_string(rd, o, at, key);
    if (snprintf(out, bytes, "%s", s) >= (int)bytes)
        json_read_fail(rd, at, key, "longer than %zu bytes", bytes - 1);
}

static void read_bytes(struct json_read *rd, json_t *o, const char *at, struct run_bytes *b)
{
    b->params = json_read_int(rd, o, at, "params");
    b->grads = json_read_int(rd, o, at, "grads");
    b->optimizer = json_read_int(rd, o, at, "optimizer");
    b->activations = json_read_int(rd, o, at, "activations");
    b->comm_rings = json_read_has(o, "comm_rings") ? json_read_int(rd, o, at, "comm_rings") : -1;
    b->host = json_read_has(o, "host") ? json_read_int(rd, o, at, "host") : -1;
    b->scratch = json_read_has(o, "scratch") ? json_read_int(rd, o, at, "scratch") : 0;
    b->cuda_context =
        json_read_has(o, "cuda_context") ? json_read_int(rd, o, at, "cuda_context") : 0;
}

static void read_rank(struct json_read *rd, json_t *o, const char *at, struct run_rank_memory *m)
{
    char sub[96];
    m->rank = (int)json_read_int(rd, o, at, "rank");
    m->tp = (int)json_read_int(rd, o, at, "tp");
    m->pp = (int)json_read_int(rd, o, at, "pp");
    m->dp = (int)json_read_int(rd, o, at, "dp");
    m->cp = json_read_has(o, "cp") ? (int)json_read_int(rd, o, at, "cp") : 0;
    snprintf(sub, sizeof sub, "%s.predicted", at);
    read_bytes(rd, json_read_object(rd, o, at, "predicted"), sub, &m->predicted);
    snprintf(sub, sizeof sub, "%s.allocated", at);
    read_bytes(rd, json_read_object(rd, o, at, "allocated"), sub, &m->allocated);
    m->allocated.comm_rings = -1;
    m->rss_peak_bytes = json_read_int(rd, o, at, "rss_peak_bytes");
    m->rss_before_model_bytes = json_read_int(rd, o, at, "rss_before_model_bytes");
    m->device_used_bytes = json_read_has(o, "device_used_bytes")
                               ? json_read_int(rd, o, at, "device_used_bytes")
                               : -1;
}

static void read_memory(struct json_read *rd, json_t *mem, struct run_record *r)
{
    r->memory_after_step = (int)json_read_int(rd, mem, "memory", "after_step");
    json_t *ranks = json_read_array(rd, mem, "memory", "ranks");
    size_t n = json_array_size(ranks);
    if (rd->failed || n == 0) return;
    if (!(r->ranks = calloc(n, sizeof *r->ranks))) {
        rd->failed = error_set(rd->err, "out of memory");
        return;
    }
    r->n_ranks = (int)n;
    for (size_t i = 0; i < n && !rd->failed; i++) {
        char at[64];
        snprintf(at, sizeof at, "memory.ranks[%zu]", i);
        json_t *o = json_array_get(ranks, i);
        if (!json_is_object(o)) json_read_fail(rd, NULL, at, "not an object");
        read_rank(rd, o, at, &r->ranks[i]);
    }
}

static void read_machine(struct json_read *rd, json_t *m, struct run_machine *out)
{
    read_text(rd, m, "machine", "hostname", false, out->hostname, sizeof out->hostname);
    read_text(rd, m, "machine", "cpu", false, out->cpu, sizeof out->cpu);
    out->cores = (int)json_read_int(rd, m, "machine", "cores");
    out->threads = (int)json_read_int(rd, m, "machine", "threads");
    read_text(rd, m, "machine", "backend", false, out->backend, sizeof out->backend);
    out->peak_gflops = json_read_number(rd, m, "machine", "peak_gflops");
    read_text(rd, m, "machine", "bf16_emulation", true, out->bf16_emulation,
              sizeof out->bf16_emulation);
}

/* Throughput's members (null: 0) and the last checkpoint's. */
static void read_pace(struct json_read *rd, json_t *j, struct run_record *r)
{
    json_t *tp = json_read_object(rd, j, NULL, "throughput");
    if (json_read_has(tp, "modelled_tokens_per_s"))
        r->modelled_tokens_per_s = json_read_number(rd, tp, "throughput", "modelled_tokens_per_s");
    if (json_read_has(tp, "measured_tokens_per_s"))
        r->measured_tokens_per_s = json_read_number(rd, tp, "throughput", "measured_tokens_per_s");
    if (!json_read_has(j, "checkpoint")) return;
    json_t *c = json_read_object(rd, j, NULL, "checkpoint");
    r->has_checkpoint = true;
    r->checkpoint_async = json_read_bool(rd, c, "checkpoint", "async");
    r->checkpoint_write_s = json_read_number(rd, c, "checkpoint", "last_write_s");
    r->checkpoint_stall_s = json_read_number(rd, c, "checkpoint", "last_stall_s");
}

int runjson_read(const char *run_dir, struct run_record *r, struct plait_error *err)
{
    char path[4096];
    struct stat st;
    memset(r, 0, sizeof *r);
    if (fs_join(path, sizeof path, run_dir, RUNDIR_RUN, err)) return -1;
    if (stat(path, &st) != 0 && errno == ENOENT) return RUNJSON_NONE;
    struct json_read rd = {path, err, 0};
    json_t *j = json_read_file(&rd, path);
    if (!j) return -1;
    read_text(&rd, j, NULL, "version", false, r->version, sizeof r->version);
    read_text(&rd, j, NULL, "started", false, r->started, sizeof r->started);
    json_t *plan = json_read_has(j, "plan") ? json_read_object(&rd, j, NULL, "plan") : NULL;
    if (plan && !(r->plan_json = json_dumps(plan, JSON_INDENT(2) | JSON_REAL_PRECISION(17))))
        rd.failed = error_set(err, "out of memory");
    read_text(&rd, j, NULL, "resumed_from", true, r->resumed_from, sizeof r->resumed_from);
    r->parameters = json_read_int(&rd, j, NULL, "parameters");
    r->activation_bytes = json_read_int(&rd, j, NULL, "activation_bytes");
    read_machine(&rd, json_read_object(&rd, j, NULL, "machine"), &r->machine);
    if (json_read_has(j, "memory")) read_memory(&rd, json_read_object(&rd, j, NULL, "memory"), r);
    read_pace(&rd, j, r);
    json_decref(j);
    if (rd.failed) runjson_free(r);
    return rd.failed;
}

void runjson_free(struct run_record *r)
{
    free(r->plan_json);
    free(r->ranks);
    r->plan_json = NULL;
    r->ranks = NULL;
    r->n_ranks = 0;
}
