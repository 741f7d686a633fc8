/* test_run_formats.c — the files of a run directory and of a checkpoint, each
 * through its one module (common/rundir, runjson, metrics, runend,
 * ckpt_state, ckpt_manifest): what is written reads back as the same struct,
 * and a malformed file is refused with an error naming the file and the
 * member that is wrong. On a real file system (a temp directory). */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "common/formats/ckpt_manifest.h"
#include "common/formats/ckpt_state.h"
#include "common/formats/ckptdir.h"
#include "common/fsutil.h"
#include "common/formats/metrics.h"
#include "common/formats/rundir.h"
#include "common/formats/runend.h"
#include "common/formats/runjson.h"

/* paths here are short temp paths; the 4096-byte buffers only look tight to gcc */
#pragma GCC diagnostic ignored "-Wformat-truncation"

static char root[] = "/tmp/plait-test-formats.XXXXXX";

static const char *const plan_text =
    "{\"model\": {\"layers\": 4, \"heads\": 2, \"hidden\": 8, \"vocab\": 256, \"seq_len\": 16},\n"
    " \"data\": {\"train\": \"/data/train.bin\"},\n"
    " \"parallel\": {\"tp\": 2, \"pp\": 2, \"dp\": 1},\n"
    " \"steps\": 10}\n";

/* A fresh directory under root for one test. */
static const char *fresh_dir(const char *name)
{
    static char path[4096];
    struct plait_error err;
    snprintf(path, sizeof path, "%s/%s", root, name);
    fs_mkdir_p(path, &err);
    return path;
}

/* Writes text as dir/name. */
static void put_file(const char *dir, const char *name, const char *text)
{
    char path[4096];
    struct plait_error err;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (fs_write_atomic(path, text, strlen(text), &err)) printf("  %s\n", err.text);
}

/* Whether err names the file (its name's end) and the member. */
static bool names(const struct plait_error *err, const char *file, const char *member)
{
    return strstr(err->text, file) && strstr(err->text, member);
}

/* Field by field (padding aside). */
static bool same_step(const struct step_metrics *a, const struct step_metrics *b)
{
    return a->step == b->step && a->loss == b->loss && a->lr == b->lr &&
           a->grad_norm == b->grad_norm && a->tokens == b->tokens &&
           a->tokens_total == b->tokens_total && a->ms == b->ms &&
           a->tokens_per_s == b->tokens_per_s && a->peak_pct == b->peak_pct && a->mfu == b->mfu &&
           a->ranks == b->ranks && a->compute_pct == b->compute_pct && a->comm_pct == b->comm_pct &&
           a->idle_pct == b->idle_pct && a->bubble_sim_pct == b->bubble_sim_pct &&
           a->bytes_tp == b->bytes_tp && a->bytes_pp == b->bytes_pp && a->bytes_dp == b->bytes_dp &&
           a->wait_tp_ms == b->wait_tp_ms && a->wait_pp_ms == b->wait_pp_ms &&
           a->wait_dp_ms == b->wait_dp_ms && a->bytes_cp == b->bytes_cp &&
           a->wait_cp_ms == b->wait_cp_ms && a->bytes_ep == b->bytes_ep &&
           a->wait_ep_ms == b->wait_ep_ms && a->step_ms == b->step_ms &&
           a->straggler == b->straggler && a->busy_ms == b->busy_ms &&
           a->median_busy_ms == b->median_busy_ms;
}

static bool same_state(const struct train_state *a, const struct train_state *b)
{
    return a->step == b->step && a->micro == b->micro && a->loss_sum == b->loss_sum &&
           a->tokens == b->tokens && a->eval_pending == b->eval_pending &&
           a->data.epoch == b->data.epoch && a->data.shard == b->data.shard &&
           a->data.index == b->data.index &&
           !memcmp(a->sample_rng, b->sample_rng, sizeof a->sample_rng) &&
           a->moe_stats_n == b->moe_stats_n &&
           !memcmp(a->moe_stats, b->moe_stats, (size_t)a->moe_stats_n * sizeof *a->moe_stats);
}

static bool same_machine(const struct run_machine *a, const struct run_machine *b)
{
    return !strcmp(a->hostname, b->hostname) && !strcmp(a->cpu, b->cpu) && a->cores == b->cores &&
           a->threads == b->threads && !strcmp(a->backend, b->backend) &&
           a->peak_gflops == b->peak_gflops && !strcmp(a->bf16_emulation, b->bf16_emulation);
}

/* ---- plan.json ---------------------------------------------------------------------------- */

static void test_run_plan_reads_back_through_plan_load(void)
{
    const char *dir = fresh_dir("plan");
    struct plait_error err;
    struct plan *p = plan_load_text(plan_text, "plan", "/", NULL, 0, &err);
    CHECK(p, "%s", err.text);
    if (!p) return;
    char *json = plan_to_json(p);
    CHECK(rundir_plan_write(dir, json, &err) == 0, "%s", err.text);
    struct plan *back = rundir_plan_load(dir, &err);
    CHECK(back, "%s", err.text);
    struct plan_change ch[4];
    CHECK(back && plan_diff(p, back, ch, 4) == 0, "the plan read back differs (%s)",
          back && plan_diff(p, back, ch, 4) ? ch[0].path : "");
    char out[4096], want[4096];
    CHECK(rundir_checkpoint_dir(p, dir, out, sizeof out, &err) == 0, "%s", err.text);
    snprintf(want, sizeof want, "%s/" RUNDIR_CHECKPOINTS, dir);
    CHECK(!strcmp(out, want), "checkpoint.dir's default: %s, want %s", out, want);
    free(p->checkpoint.dir);
    p->checkpoint.dir = strdup("/elsewhere/ckpts");
    CHECK(rundir_checkpoint_dir(p, dir, out, sizeof out, &err) == 0 &&
              !strcmp(out, "/elsewhere/ckpts"),
          "an absolute checkpoint.dir is kept: %s", out);
    plan_free(back);
    plan_free(p);
    free(json);
}

static void test_run_plan_that_does_not_load_names_the_file_and_field(void)
{
    const char *dir = fresh_dir("badplan");
    char text[1024];
    snprintf(text, sizeof text, "%s", plan_text);
    char *layers = strstr(text, "\"layers\": 4");
    if (layers) layers[10] = '0'; /* "layers": 0 */
    put_file(dir, RUNDIR_PLAN, text);
    struct plait_error err;
    struct plan *p = rundir_plan_load(dir, &err);
    CHECK(!p, "a malformed plan.json loaded");
    CHECK(!p && names(&err, "badplan/plan.json", "model.layers"), "%s", err.text);
    plan_free(p);
}

/* ---- run.json ----------------------------------------------------------------------------- */

static void fill_run(struct run_record *r, struct run_rank_memory ranks[2])
{
    memset(r, 0, sizeof *r);
    snprintf(r->version, sizeof r->version, "v1.2-3-gabc");
    snprintf(r->started, sizeof r->started, "2026-01-02T03:04:05Z");
    r->plan_json = strdup(plan_text);
    snprintf(r->resumed_from, sizeof r->resumed_from, "step_00000004_0000");
    r->parameters = 123456, r->activation_bytes = 789;
    r->machine = (struct run_machine){"host", "A CPU", 16, 4, "cpu", 123.25, ""};
    for (int i = 0; i < 2; i++)
        ranks[i] = (struct run_rank_memory){
            i,
            i,
            0,
            0,
            /* rank 0 a GPU's: its scratch and CUDA context predicted, its scratch reserved */
            {10 + i, 20, 30, 40, i ? 5000 : -1, i ? -1 : 60, i ? 0 : 70, i ? 0 : 80},
            {11, 21, 31, 41 + i, -1, i ? -1 : 61, i ? 0 : 71, 0},
            1 << 20,
            1 << 19,
            i,
            i ? -1 : 3LL << 32};
    r->memory_after_step = 1, r->ranks = ranks, r->n_ranks = 2, r->cp = 2; /* cp written */
    r->modelled_tokens_per_s = 1000.5, r->measured_tokens_per_s = 0.1 + 0.2;
    r->has_checkpoint = true, r->checkpoint_async = true;
    r->checkpoint_write_s = 1.0 / 3, r->checkpoint_stall_s = 0.25;
}

static bool same_bytes(const struct run_bytes *a, const struct run_bytes *b)
{
    return a->params == b->params && a->grads == b->grads && a->optimizer == b->optimizer &&
           a->activations == b->activations && a->comm_rings == b->comm_rings &&
           a->host == b->host && a->scratch == b->scratch && a->cuda_context == b->cuda_context;
}

/* Field by field (a struct's padding is no field: memcmp would read it). */
static bool same_rank_memory(const struct run_rank_memory *a, const struct run_rank_memory *b)
{
    return a->rank == b->rank && a->tp == b->tp && a->pp == b->pp && a->dp == b->dp &&
           same_bytes(&a->predicted, &b->predicted) && same_bytes(&a->allocated, &b->allocated) &&
           a->rss_peak_bytes == b->rss_peak_bytes &&
           a->rss_before_model_bytes == b->rss_before_model_bytes &&
           a->device_used_bytes == b->device_used_bytes && a->cp == b->cp;
}

static void test_run_json_reads_back_what_was_written(void)
{
    const char *dir = fresh_dir("run");
    struct run_rank_memory ranks[2];
    struct run_record w, r;
    struct plait_error err;
    fill_run(&w, ranks);
    CHECK(runjson_write(dir, &w, &err) == 0, "%s", err.text);
    CHECK(runjson_read(dir, &r, &err) == 0, "%s", err.text);
    CHECK(!strcmp(r.version, w.version) && !strcmp(r.started, w.started) &&
              !strcmp(r.resumed_from, w.resumed_from),
          "version, started or resumed_from differ");
    CHECK(r.parameters == w.parameters && r.activation_bytes == w.activation_bytes,
          "the model's sizes differ");
    CHECK(same_machine(&r.machine, &w.machine), "machine differs");
    CHECK(r.memory_after_step == 1 && r.n_ranks == 2 && r.ranks &&
              same_rank_memory(&r.ranks[0], &ranks[0]) && same_rank_memory(&r.ranks[1], &ranks[1]),
          "memory differs");
    CHECK(run_bytes_total(&r.ranks[0].predicted) == 10 + 20 + 30 + 40 + 70 + 80 &&
              run_bytes_total(&r.ranks[0].allocated) == 11 + 21 + 31 + 41 + 71,
          "a GPU rank's total leaves out its scratch or CUDA context");
    CHECK(r.modelled_tokens_per_s == w.modelled_tokens_per_s &&
              r.measured_tokens_per_s == w.measured_tokens_per_s,
          "throughput differs");
    CHECK(r.has_checkpoint && r.checkpoint_async && r.checkpoint_write_s == w.checkpoint_write_s &&
              r.checkpoint_stall_s == w.checkpoint_stall_s,
          "checkpoint differs");
    struct plan *a = plan_load_text(w.plan_json, "w", "/", NULL, 0, &err);
    struct plan *b = r.plan_json ? plan_load_text(r.plan_json, "r", "/", NULL, 0, &err) : NULL;
    struct plan_change ch[1];
    CHECK(a && b && plan_diff(a, b, ch, 1) == 0, "the plan read back differs");
    plan_free(a);
    plan_free(b);
    runjson_free(&r);
    /* a run that has not measured yet: no memory, nulls, no checkpoint */
    w.memory_after_step = 0, w.n_ranks = 0, w.ranks = NULL;
    w.modelled_tokens_per_s = w.measured_tokens_per_s = 0;
    w.has_checkpoint = false, w.checkpoint_async = false;
    w.checkpoint_write_s = w.checkpoint_stall_s = 0;
    w.resumed_from[0] = '\0';
    CHECK(runjson_write(dir, &w, &err) == 0, "%s", err.text);
    CHECK(runjson_read(dir, &r, &err) == 0, "%s", err.text);
    CHECK(r.n_ranks == 0 && r.memory_after_step == 0 && !r.has_checkpoint &&
              r.modelled_tokens_per_s == 0 && r.measured_tokens_per_s == 0 && !r.resumed_from[0],
          "the fields not yet known read back as known");
    runjson_free(&r);
    free(w.plan_json);
    CHECK(runjson_read(fresh_dir("norun"), &r, &err) == RUNJSON_NONE, "a missing run.json");
}

static void test_run_json_malformed_names_the_file_and_member(void)
{
    const char *dir = fresh_dir("badrun");
    struct run_rank_memory ranks[2];
    struct run_record w, r;
    struct plait_error err;
    fill_run(&w, ranks);
    runjson_write(dir, &w, &err);
    free(w.plan_json);
    char path[4096];
    snprintf(path, sizeof path, "%s/" RUNDIR_RUN, dir);
    char *text = fs_read_all(path, NULL, &err);
    char *at = text ? strstr(text, "\"allocated\"") : NULL;
    at = at ? strstr(at, "\"grads\": ") : NULL;
    if (at) { /* rank 0's allocated grads: a string */
        at += strlen("\"grads\": ");
        char *rest = at + strspn(at, "0123456789"), edited[8192];
        snprintf(edited, sizeof edited, "%.*s\"x\"%s", (int)(at - text), text, rest);
        put_file(dir, RUNDIR_RUN, edited);
    }
    free(text);
    CHECK(at && runjson_read(dir, &r, &err) < 0, "a string for a byte count read");
    CHECK(names(&err, "badrun/run.json", "memory.ranks[0].allocated.grads"), "%s", err.text);
    put_file(dir, RUNDIR_RUN, "{\"version\": \"x\", \"started\": ");
    CHECK(runjson_read(dir, &r, &err) < 0 && names(&err, "badrun/run.json", "line 1"), "%s",
          err.text);
}

/* ---- metrics.jsonl ------------------------------------------------------------------------ */

/* A one-rank step, an eight-rank step and an evaluation, as plait-train writes them. */
static const struct step_metrics step_one = {.step = 1,
                                             .loss = 5.25,
                                             .lr = 1e-3,
                                             .grad_norm = 0.1 + 0.2,
                                             .tokens = 64,
                                             .tokens_total = 64,
                                             .ms = 12.5,
                                             .tokens_per_s = 5120,
                                             .peak_pct = 3.5,
                                             .ranks = 1,
                                             .bubble_sim_pct = -1};
static const struct step_metrics step_many = {.step = 2,
                                              .loss = 4.5,
                                              .lr = 1e-3,
                                              .grad_norm = 2.0,
                                              .tokens = 64,
                                              .tokens_total = 128,
                                              .ms = 10.0,
                                              .tokens_per_s = 6400,
                                              .peak_pct = 4.0,
                                              .mfu = 0.31,
                                              .ranks = 8,
                                              .compute_pct = 70.0,
                                              .comm_pct = 20.0,
                                              .idle_pct = 5.0,
                                              .bubble_sim_pct = 4.5,
                                              .bytes_tp = 1e6,
                                              .bytes_pp = 2e6,
                                              .bytes_dp = 3e6,
                                              .wait_tp_ms = 1.5,
                                              .wait_pp_ms = 2.5,
                                              .wait_dp_ms = 3.5,
                                              .bytes_cp = 4e6, /* context parallelism's ring */
                                              .wait_cp_ms = 4.5,
                                              .bytes_ep = 5e6, /* the experts' all-to-alls */
                                              .wait_ep_ms = 5.5,
                                              .straggler = 3,
                                              .busy_ms = 9.5,
                                              .median_busy_ms = 8.0};
static const struct eval_metrics eval_two = {2, 4.75, 1024, 0};

static void write_metrics(const char *dir)
{
    struct metrics mt = {0};
    struct plait_error err;
    CHECK(metrics_open(&mt, dir, 0, &err) == 0, "%s", err.text);
    CHECK(metrics_step(&mt, &step_one, &err) == 0 && metrics_step(&mt, &step_many, &err) == 0 &&
              metrics_eval(&mt, &eval_two, &err) == 0,
          "%s", err.text);
    metrics_close(&mt);
    /* a line being written, and a record of neither kind, are passed over */
    char path[4096];
    snprintf(path, sizeof path, "%s/" RUNDIR_METRICS, dir);
    FILE *f = fopen(path, "a");
    if (f) fputs("{\"event\": \"start\"}\n{\"step\": 3, \"loss\": 4.", f);
    if (f) fclose(f);
}

static void test_metrics_read_back_what_was_written(void)
{
    const char *dir = fresh_dir("metrics");
    struct plait_error err;
    write_metrics(dir);
    struct metrics_series s;
    CHECK(metrics_read(dir, &s, &err) == 0, "%s", err.text);
    CHECK(s.n_steps == 2 && s.n_evals == 1, "%d steps, %d evaluations", s.n_steps, s.n_evals);
    if (s.n_steps == 2 && s.n_evals == 1) {
        CHECK(same_step(&s.steps[0], &step_one), "the one-rank step differs");
        CHECK(same_step(&s.steps[1], &step_many), "the eight-rank step differs");
        CHECK(s.evals[0].step == 2 && s.evals[0].val_loss == 4.75 &&
                  s.evals[0].val_tokens == 1024 && s.evals[0].tokens_total == 128,
              "the evaluation differs");
    }
    metrics_series_free(&s);
    CHECK(metrics_read(fresh_dir("nometrics"), &s, &err) == 0 && s.n_steps == 0,
          "a missing metrics.jsonl is an empty series");
}

/* A mixture of experts' step: its losses, drops and each expert's load read back; a
 * "moe" without its load names the member. */
static void test_metrics_moe_reads_back_and_names_a_missing_load(void)
{
    const char *dir = fresh_dir("moemetrics");
    double load[3] = {0.5, 0.125, 0.375};
    struct step_metrics w = step_one;
    w.moe_experts = 3, w.moe_balance_loss = 0.0125, w.moe_z_loss = 0.25, w.moe_dropped = 17;
    w.moe_load = load;
    struct metrics mt = {0};
    struct plait_error err;
    CHECK(metrics_open(&mt, dir, 0, &err) == 0 && metrics_step(&mt, &w, &err) == 0, "%s", err.text);
    metrics_close(&mt);
    struct metrics_series s;
    CHECK(metrics_read(dir, &s, &err) == 0 && s.n_steps == 1, "%s", err.text);
    if (s.n_steps == 1) {
        const struct step_metrics *r = &s.steps[0];
        CHECK(same_step(r, &step_one) && r->moe_experts == 3 && r->moe_balance_loss == 0.0125 &&
                  r->moe_z_loss == 0.25 && r->moe_dropped == 17 &&
                  !memcmp(r->moe_load, load, sizeof load),
              "the mixture of experts' step differs");
    }
    metrics_series_free(&s);
    put_file(dir, RUNDIR_METRICS,
             "{\"step\": 2, \"loss\": 4.5, \"lr\": 0.1, \"grad_norm\": 1, \"tokens\": 1, "
             "\"tokens_total\": 2, \"ms\": 1, \"tokens_per_s\": 1, \"peak_pct\": 1, "
             "\"moe\": {\"balance_loss\": 0.1, \"z_loss\": 0, \"dropped\": 0}}\n");
    CHECK(metrics_read(dir, &s, &err) < 0 && names(&err, "moemetrics/metrics.jsonl:1", "moe.load"),
          "%s", err.text);
}

static void test_metrics_bad_record_names_the_file_line_and_member(void)
{
    const char *dir = fresh_dir("badmetrics");
    put_file(dir, RUNDIR_METRICS,
             "{\"eval_step\": 1, \"val_loss\": 2.5, \"val_tokens\": 10}\n"
             "{\"step\": 2, \"loss\": 4.5, \"lr\": 0.1, \"grad_norm\": 1, \"tokens\": 1, "
             "\"tokens_total\": 2, \"ms\": 1, \"tokens_per_s\": 1, \"peak_pct\": 1, "
             "\"parallel\": {\"ranks\": 2, \"compute_pct\": 1, \"comm_pct\": 1, \"bubble_pct\": 1, "
             "\"bytes\": {\"tp\": 1, \"pp\": 1, \"dp\": 1}, \"wait_ms\": {\"tp\": 1, \"pp\": 1}, "
             "\"straggler\": {\"rank\": 0, \"busy_ms\": 1, \"median_busy_ms\": 1}}}\n");
    struct metrics_series s;
    struct plait_error err;
    CHECK(metrics_read(dir, &s, &err) < 0, "a record without wait_ms.dp read");
    CHECK(names(&err, "badmetrics/metrics.jsonl:2", "parallel.wait_ms.dp: missing"), "%s",
          err.text);
}

/* ---- end.json ----------------------------------------------------------------------------- */

static void test_end_json_reads_back_what_was_written(void)
{
    const char *dir = fresh_dir("end");
    struct run_end w, r;
    struct plait_error err;
    CHECK(runend_read(dir, &r, &err) == RUNEND_NONE, "a missing end.json");
    runend_of(&w, 75, 15, "stopped \"here\"");
    CHECK(!strcmp(w.end, "preempted") && !strcmp(w.signal, "SIGTERM"), "%s, %s", w.end, w.signal);
    CHECK(runend_write(dir, &w, &err) == 0, "%s", err.text);
    CHECK(runend_read(dir, &r, &err) == 0, "%s", err.text);
    CHECK(!memcmp(&w, &r, sizeof w), "end.json read back differs");
    runend_clear(dir);
    CHECK(runend_read(dir, &r, &err) == RUNEND_NONE, "end.json stayed after runend_clear");
    put_file(dir, RUNDIR_END, "{\"exit_code\": \"0\", \"end\": \"finished\"}");
    CHECK(runend_read(dir, &r, &err) < 0 && names(&err, "end/end.json", "exit_code"), "%s",
          err.text);
}

/* ---- state.json and manifest.json --------------------------------------------------------- */

static void test_state_json_reads_back_what_was_written(void)
{
    const char *dir = fresh_dir("state");
    struct train_state w = {7, 2,  1.0 / 3, 1 << 20, 1, {1, 2, 3}, {1, 0xffffffffffffffffull, 3, 4},
                            0, {0}};
    struct train_state r;
    struct ckpt_file f;
    struct ckpt_manifest m = {0};
    struct plait_error err;
    CHECK(ckpt_state_write(dir, &w, &f, &m, &err) == 0, "%s", err.text);
    CHECK(m.n_files == 1 && !strcmp(m.files[0].name, CKPT_STATE) && m.files[0].bytes > 0,
          "state.json not listed in the manifest");
    CHECK(ckpt_read_state(dir, &r, &err) == 0, "%s", err.text);
    CHECK(same_state(&w, &r), "state.json read back differs");
    ckpt_manifest_free(&m);
    /* with mixture of experts, the routing so far (2 experts) */
    w.moe_stats_n = MOE_STATS(2);
    for (int i = 0; i < w.moe_stats_n; i++) w.moe_stats[i] = 1.0 / (i + 3);
    CHECK(ckpt_state_write(dir, &w, &f, NULL, &err) == 0, "%s", err.text);
    CHECK(ckpt_read_state(dir, &r, &err) == 0 && same_state(&w, &r),
          "state.json with moe_stats read back differs: %s", err.text);
    put_file(dir, CKPT_STATE,
             "{\"step\": 1, \"micro\": 0, \"loss_sum\": 0, \"tokens\": 0, \"eval_pending\": false,"
             " \"data\": {\"epoch\": 0, \"shard\": -1, \"index\": 0}, \"sample_rng\": []}");
    CHECK(ckpt_read_state(dir, &r, &err) < 0 && names(&err, "state/state.json", "data.shard"), "%s",
          err.text);
}

/* state.json is checked against the width the runtime keeps each count in,
 * and against the checkpoint's own name: step 2^32 + 10 had read as 10,
 * 2^31 − 1 made a run "already finished", tokens 2^63 − 1 overflowed. */
static void test_state_json_is_checked_against_its_widths_and_name(void)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s/step_00000005_0000", fresh_dir("state_name"));
    mkdir(dir, 0755);
    const struct {
        const char *step, *tokens, *member;
    } cases[] = {{"5", "100", NULL},
                 {"4294967306", "100", "step"},
                 {"2147483647", "100", "step"},
                 {"5", "9223372036854775807", "tokens"}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char text[512];
        snprintf(text, sizeof text,
                 "{\"step\": %s, \"micro\": 0, \"loss_sum\": 0, \"tokens\": %s, "
                 "\"eval_pending\": false, \"data\": {\"epoch\": 0, \"shard\": 0, "
                 "\"index\": 0}, \"sample_rng\": [\"1\", \"2\", \"3\", \"4\"]}",
                 cases[i].step, cases[i].tokens);
        put_file(dir, CKPT_STATE, text);
        struct train_state r;
        struct plait_error err = {.text = ""};
        int rc = ckpt_read_state(dir, &r, &err);
        if (!cases[i].member)
            CHECK(rc == 0 && r.step == 5, "step %s: %s", cases[i].step, err.text);
        else
            CHECK(rc < 0 && names(&err, "step_00000005_0000/state.json", cases[i].member),
                  "step %s tokens %s: %s", cases[i].step, cases[i].tokens, err.text);
    }
}

static void test_manifest_reads_back_what_was_written(void)
{
    const char *dir = fresh_dir("manifest");
    int begin[2] = {0, 1}, end[2] = {1, 2};
    struct ckpt_manifest w = {
        .step = 12, .micro = 3, .version = "v9", .layout = {2, 2, 2, 1, 2, false, begin, end}};
    struct plait_error err;
    const char *files[] = {"model-tp0-pp0.bin", "optim-tp1-pp1-dp1.bin", CKPT_PLAN, CKPT_STATE};
    for (int i = 0; i < 4; i++)
        CHECK(ckpt_manifest_add(&w, files[i], 100 + i, 0xfedcba98u - i, &err) == 0, "%s", err.text);
    struct gpt2_config cfg = {.max_seq_len = 16, .vocab = 256, .padded_vocab = 256, .layers = 4, .heads = 2, .hidden = 8};
    CHECK(ckpt_manifest_write(dir, &w, &cfg, &err) == 0, "%s", err.text);
    struct ckpt_manifest r;
    CHECK(ckpt_manifest_read(dir, &r, &err) == 0, "%s", err.text);
    CHECK(r.step == 12 && r.micro == 3 && !strcmp(r.version, "v9"), "step, micro or version");
    CHECK(r.n_files == 4, "%d files", r.n_files);
    for (int i = 0; i < 4 && r.n_files == 4; i++) {
        const struct ckpt_manifest_file *f = ckpt_manifest_find(&r, files[i]);
        CHECK(f && f->bytes == 100 + i && f->crc32c == 0xfedcba98u - i, "%s differs", files[i]);
    }
    const struct ckpt_layout *l = &r.layout;
    CHECK(!l->whole && l->tp == 2 && l->pp == 2 && l->dp == 2 && l->zero == 1 && l->chunks == 2,
          "the layout differs");
    CHECK(l->stage_begin && l->stage_end && !memcmp(l->stage_begin, begin, sizeof begin) &&
              !memcmp(l->stage_end, end, sizeof end),
          "the stages differ");
    ckpt_manifest_free(&r);
    w.layout.stage_begin = w.layout.stage_end = NULL;
    ckpt_manifest_free(&w);
    /* a whole checkpoint: no layout written, read as all 1 */
    struct ckpt_manifest whole = {.version = "v9"};
    ckpt_manifest_add(&whole, "model.bin", 1, 2, &err);
    CHECK(ckpt_manifest_write(dir, &whole, NULL, &err) == 0 &&
              ckpt_manifest_read(dir, &r, &err) == 0,
          "%s", err.text);
    CHECK(r.layout.whole && r.layout.tp == 1 && r.layout.pp == 1 && r.layout.dp == 1 &&
              r.layout.chunks == 1 && !r.layout.stage_begin,
          "a whole checkpoint's layout");
    ckpt_manifest_free(&r);
    ckpt_manifest_free(&whole);
}

static void test_manifest_malformed_names_the_file_and_member(void)
{
    const char *dir = fresh_dir("badmanifest");
    struct ckpt_manifest r;
    struct plait_error err;
    put_file(dir, CKPT_MANIFEST,
             "{\"step\": 1, \"micro\": 0, \"version\": \"x\", \"files\": "
             "{\"state.json\": {\"bytes\": 3, \"crc32c\": \"abc\"}}}");
    CHECK(ckpt_manifest_read(dir, &r, &err) < 0, "a string checksum read");
    CHECK(names(&err, "badmanifest/manifest.json", "files.state.json.crc32c"), "%s", err.text);
    put_file(dir, CKPT_MANIFEST,
             "{\"step\": 1, \"micro\": 0, \"version\": \"x\", \"files\": {}, "
             "\"layout\": {\"tp\": 2, \"pp\": 2, \"stages\": [[0, 1]]}}");
    CHECK(ckpt_manifest_read(dir, &r, &err) < 0 &&
              names(&err, "badmanifest/manifest.json", "layout.stages"),
          "%s", err.text);
    put_file(dir, CKPT_MANIFEST,
             "{\"step\": 1, \"micro\": 0, \"version\": \"x\", \"files\": {}, \"layout\": "
             "{\"tp\": 0}}");
    CHECK(ckpt_manifest_read(dir, &r, &err) < 0 &&
              names(&err, "badmanifest/manifest.json", "is not a layout"),
          "%s", err.text);
}

int main(void)
{
    if (!mkdtemp(root)) return 1;
    RUN(test_run_plan_reads_back_through_plan_load);
    RUN(test_run_plan_that_does_not_load_names_the_file_and_field);
    RUN(test_run_json_reads_back_what_was_written);
    RUN(test_run_json_malformed_names_the_file_and_member);
    RUN(test_metrics_read_back_what_was_written);
    RUN(test_metrics_moe_reads_back_and_names_a_missing_load);
    RUN(test_metrics_bad_record_names_the_file_line_and_member);
    RUN(test_end_json_reads_back_what_was_written);
    RUN(test_state_json_reads_back_what_was_written);
    RUN(test_state_json_is_checked_against_its_widths_and_name);
    RUN(test_manifest_reads_back_what_was_written);
    RUN(test_manifest_malformed_names_the_file_and_member);
    fs_remove_tree(root, NULL);
    return check_exit_code();
}
