/* cmd_ckpt.c — `plait ckpt ls|verify|export|import`: a run's checkpoints
 * listed, checked (checksums, every shard of the layout present, headers
 * consistent), exported from any layout's shards as one llm.c GPT-2 file or
 * a Hugging Face directory, and an llm.c file or a Hugging Face directory
 * imported as a new run's first checkpoint.
 * Through common/ckptdir, ckpt_shards and ckpt_state; ls, verify and export
 * take no lock and change nothing. */
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/formats/ckpt_shards.h"
#include "common/formats/ckpt_state.h"
#include "common/formats/ckptdir.h"
#include "common/formats/hf_model.h"
#include "common/place/env.h"
#include "common/place/place.h" // defines: place_layout_text
#include "common/fsutil.h"
#include "common/log.h"
#include "common/formats/rundir.h"
#include "common/formats/runlock.h"
#include "launcher/commands.h"

enum { OPT_JSON };
const struct cli_command cmd_ckpt_ls_cli = {
    .name = "ckpt ls",
    .operands = "DIR",
    .min_operands = 1,
    .max_operands = 1,
    .summary = "a run's checkpoints: steps, layouts, sizes, verified",
    .description = "DIR is a run directory, its checkpoint directory or one checkpoint. Each\n"
                   "checkpoint is verified (every file's size and checksum, every shard of its\n"
                   "layout present, each shard's header consistent with the manifest).",
    .options = (const struct cli_option[]){[OPT_JSON] = {"--json", NULL,
                                                         "one JSON object per checkpoint, one per "
                                                         "line"},
                                           {0}},
    .epilog = "exit codes: 0 listed (damaged ones say so), 1 DIR holds no checkpoint directory",
};

const struct cli_command cmd_ckpt_verify_cli = {
    .name = "ckpt verify",
    .operands = "DIR",
    .min_operands = 1,
    .max_operands = 1,
    .summary = "check every checksum and shard of a run's checkpoints",
    .description = "DIR is a run directory, its checkpoint directory or one checkpoint. Prints\n"
                   "one line per checkpoint and names the first problem of each damaged one.",
    .options = (const struct cli_option[]){{0}},
    .epilog = "exit codes: 0 every checkpoint verifies, 1 one does not (or there is none)",
};

enum { OPT_LLMC, OPT_HF, OPT_SHARD_MB, OPT_DTYPE };
const struct cli_command cmd_ckpt_export_cli = {
    .name = "ckpt export",
    .operands = "DIR",
    .min_operands = 1,
    .max_operands = 1,
    .summary = "an llm.c GPT-2 file or a Hugging Face directory from a checkpoint of any layout",
    .description =
        "DIR is one checkpoint, or a run directory or checkpoint directory (its\n"
        "newest checkpoint that verifies). The parameters are gathered from the\n"
        "shards of whatever tp × pp × dp layout wrote it into one fp32 llm.c GPT-2\n"
        "checkpoint (--llmc), or into a Hugging Face model directory (--hf: config.json,\n"
        "fp32 (or --dtype bf16) safetensors in transformers' names, sharded with an\n"
        "index), which\n"
        "model.init, llm.c and transformers load. Each file is written to a temporary\n"
        "name, fsynced, renamed.",
    .options =
        (const struct cli_option[]){
            [OPT_LLMC] = {"--llmc", "OUT.bin", "the llm.c file to write (GPT-2 only)"},
            [OPT_HF] = {"--hf", "OUT_DIR", "the Hugging Face directory to write"},
            [OPT_SHARD_MB] = {"--shard-mb", "MB", "--hf: the most MB of tensors a file holds "
                                                  "(default 5000)"},
            [OPT_DTYPE] = {"--dtype", "fp32|bf16", "--hf: the tensors' dtype (default fp32; "
                                                   "bf16 rounds to nearest even)"},
            {0}},
    .epilog = "exit codes: 0 written, 1 no checkpoint that verifies, or a write failed",
};

enum { OPT_OUT, OPT_SET };
const struct cli_command cmd_ckpt_import_cli = {
    .name = "ckpt import",
    .operands = "IN PLAN",
    .min_operands = 2,
    .max_operands = 2,
    .summary = "a run's first checkpoint from an llm.c GPT-2 file or a Hugging Face directory",
    .description =
        "The reverse of export: IN (an fp32 llm.c GPT-2 checkpoint, or a Hugging Face\n"
        "directory with config.json and safetensors, of PLAN's model) becomes the\n"
        "step-0 checkpoint of a new run of PLAN in DIR (its weights, AdamW moments of\n"
        "zero, the state of a run before its first step). plait train PLAN --out DIR\n"
        "then trains from it in any layout, as model.init would.",
    .options =
        (const struct cli_option[]){
            [OPT_OUT] = {"--out", "DIR", "the run directory to create it in (required)"},
            [OPT_SET] = {"--set", "path=value", "override a plan field, as plait train does",
                         .repeats = true},
            {0}},
    .epilog = "exit codes: 0 written, 1 IN is not PLAN's model, DIR holds checkpoints "
              "already, or a write failed",
};

/* DIR as (checkpoint directory, one checkpoint's name or ""). */
static int resolve(const char *arg, char *dir, size_t dir_bytes, char *name, size_t name_bytes,
                   struct plait_error *err)
{
    char path[4096];
    struct stat st;
    name[0] = '\0';
    if (fs_join(path, sizeof path, arg, CKPT_MANIFEST, err)) return -1;
    if (stat(path, &st) == 0) { /* one checkpoint */
        char *parent = fs_dirname(arg);
        const char *base = strrchr(arg, '/');
        base = base ? base + 1 : arg;
        if (!parent) return error_set(err, "out of memory");
        snprintf(dir, dir_bytes, "%s", parent);
        snprintf(name, name_bytes, "%s", base);
        free(parent);
        return 0;
    }
    if (fs_join(path, sizeof path, arg, RUNDIR_PLAN, err)) return -1;
    if (stat(path, &st) == 0) { /* a run directory */
        struct plan *plan = rundir_plan_load(arg, err);
        int rc = plan ? rundir_checkpoint_dir(plan, arg, dir, dir_bytes, err) : -1;
        plan_free(plan);
        return rc;
    }
    if (stat(arg, &st) != 0 || !S_ISDIR(st.st_mode))
        return error_set(err, "%s: not a run directory, a checkpoint directory or a checkpoint",
                         arg);
    snprintf(dir, dir_bytes, "%s", arg);
    return 0;
}

/* What one checkpoint is: its layout and size, verified or why not. */
struct ckpt_info {
    char name[48];
    int64_t step, micro, bytes, files;
    struct ckpt_layout layout;
    bool ok;
    struct plait_error why;
};

static void describe(struct ckptdir *d, const char *name, struct ckpt_info *out)
{
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", name);
    char cdir[4096];
    struct ckpt_manifest man;
    if (fs_join(cdir, sizeof cdir, d->path, name, &out->why) ||
        ckpt_manifest_read(cdir, &man, &out->why))
        return;
    out->files = man.n_files;
    for (int i = 0; i < man.n_files; i++) out->bytes += man.files[i].bytes;
    out->step = man.step, out->micro = man.micro;
    out->layout = man.layout;
    out->layout.stage_begin = out->layout.stage_end = NULL; /* only the degrees are kept */
    ckpt_manifest_free(&man);
    out->ok = ckpt_verify_all(d, name, &out->why) == 0;
}

static void layout_text(const struct ckpt_info *c, char *out, size_t bytes)
{
    const struct ckpt_layout *l = &c->layout;
    int cp = l->cp > 1 ? l->cp : 1; /* the manifest's dp counts the dp·cp ranks */
    char degrees[96];
    place_layout_text(degrees, sizeof degrees, l->tp, cp, l->pp, l->dp / cp);
    if (l->whole)
        snprintf(out, bytes, "whole (one rank)");
    else if (l->dp_shard && l->dp_shard < l->dp) /* hybrid sharding */
        snprintf(out, bytes, "%s (%d replicas of %d) ZeRO %d%s", degrees, l->dp / l->dp_shard,
                 l->dp_shard, l->zero, l->chunks > 1 ? " interleaved" : "");
    else
        snprintf(out, bytes, "%s%s%.0d%s", degrees, l->zero ? " ZeRO " : "", l->zero,
                 l->v_shape      ? " dualpipev"
                 : l->chunks > 1 ? " interleaved"
                                 : "");
    size_t at = strlen(out);
    if (l->ep > 1 && at < bytes) /* expert parallelism: its ranks' parts */
        snprintf(out + at, bytes - at, " ep %d", l->ep);
}

/* The checkpoints DIR names (newest first), described. */
static int collect(const char *arg, struct ckptdir *d, struct ckpt_info **out, int *n,
                   struct plait_error *err)
{
    char dir[4096], one[256];
    struct ckpt_entry *list = NULL;
    *out = NULL;
    *n = 0;
    memset(d, 0, sizeof *d);
    if (resolve(arg, dir, sizeof dir, one, sizeof one, err)) return -1;
    if (!(d->path = strdup(dir))) return error_set(err, "out of memory");
    if (one[0]) {
        *out = calloc(1, sizeof **out);
        if (!*out) return error_set(err, "out of memory");
        describe(d, one, *out);
        *n = 1;
        return 0;
    }
    int count;
    if (ckptdir_list(d, &list, &count, err)) return -1;
    *out = calloc((size_t)count + 1, sizeof **out);
    if (!*out) {
        free(list);
        return error_set(err, "out of memory");
    }
    for (int i = 0; i < count; i++) describe(d, list[i].name, &(*out)[i]);
    *n = count;
    free(list);
    return 0;
}

int cmd_ckpt_ls(int argc, char **argv)
{
    struct cli_args a;
    int parsed = cli_parse(&cmd_ckpt_ls_cli, argc, argv, &a);
    if (parsed != CLI_CONTINUE) return parsed;
    bool json = false;
    const char *arg = NULL;
    for (int i = 0; i < a.n; i++)
        if (a.v[i].opt == OPT_JSON)
            json = true;
        else
            arg = a.v[i].value;
    struct ckptdir d;
    struct ckpt_info *c;
    int n;
    struct plait_error err;
    int rc = PLAIT_EXIT_OK;
    if (collect(arg, &d, &c, &n, &err)) {
        log_error("ckpt ls: %s", err.text);
        rc = PLAIT_EXIT_ERROR;
        goto out;
    }
    if (!json)
        printf("%-22s %8s %-28s %5s %12s  %s\n", "CHECKPOINT", "STEP", "LAYOUT", "FILES", "BYTES",
               "VERIFIED");
    for (int i = 0; i < n; i++) {
        char layout[96], step[32];
        layout_text(&c[i], layout, sizeof layout);
        if (json) {
            json_t *o = json_pack("{s:s,s:I,s:I,s:s,s:I,s:I,s:b}", "name", c[i].name, "step",
                                  (json_int_t)c[i].step, "micro", (json_int_t)c[i].micro, "layout",
                                  layout, "files", (json_int_t)c[i].files, "bytes",
                                  (json_int_t)c[i].bytes, "verified", c[i].ok);
            if (!c[i].ok) json_object_set_new(o, "error", json_string(c[i].why.text));
            char *line = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
            if (line) printf("%s\n", line);
            free(line);
            json_decref(o);
            continue;
        }
        if (c[i].micro)
            snprintf(step, sizeof step, "%lld+%lld", (long long)c[i].step, (long long)c[i].micro);
        else
            snprintf(step, sizeof step, "%lld", (long long)c[i].step);
        char verdict[1100];
        if (c[i].ok)
            snprintf(verdict, sizeof verdict, "yes");
        else
            error_escape(verdict, sizeof verdict, c[i].why.text);
        printf("%-22s %8s %-28s %5lld %12lld  %s%s\n", c[i].name, step, layout,
               (long long)c[i].files, (long long)c[i].bytes, c[i].ok ? "" : "NO: ", verdict);
    }
out:
    free(c);
    ckptdir_close(&d);
    cli_args_free(&a);
    return rc;
}

int cmd_ckpt_verify(int argc, char **argv)
{
    struct cli_args a;
    int parsed = cli_parse(&cmd_ckpt_verify_cli, argc, argv, &a);
    if (parsed != CLI_CONTINUE) return parsed;
    struct ckptdir d;
    struct ckpt_info *c = NULL;
    int n, bad = 0;
    struct plait_error err;
    if (collect(a.v[0].value, &d, &c, &n, &err)) {
        log_error("ckpt verify: %s", err.text);
        bad = 1;
    } else if (n == 0) {
        log_error("ckpt verify: %s holds no checkpoint", d.path);
        bad = 1;
    }
    for (int i = 0; i < n; i++) {
        char layout[96];
        layout_text(&c[i], layout, sizeof layout);
        if (c[i].ok) {
            printf("ok %s (step %lld%s, %s, %lld files, %lld bytes)\n", c[i].name,
                   (long long)c[i].step, c[i].micro ? " mid-step" : "", layout,
                   (long long)c[i].files, (long long)c[i].bytes);
        } else {
            log_error("ckpt verify: %s/%s: %s", d.path, c[i].name, c[i].why.text);
            bad++;
        }
    }
    free(c);
    ckptdir_close(&d);
    cli_args_free(&a);
    return bad ? PLAIT_EXIT_ERROR : PLAIT_EXIT_OK;
}

/* gpt2_shard_each's visitor over the whole model: one instance read out of
 * the source's shards and appended to the file. */
struct put_whole {
    struct ckpt_source *src;
    const struct gpt2_shard *whole;
    float *buf;
    FILE *f;
    struct plait_error *err;
    bool write_failed; /* (errno says why) */
};

static int put_whole_instance(void *ctx, enum gpt2_tensor t, int layer, size_t off, size_t n)
{
    (void)t;
    (void)layer;
    struct put_whole *p = ctx;
    if (ckpt_source_read(p->src, CKPT_PARAMS, p->whole, off, off + n, p->buf, p->err)) return -1;
    if (fwrite(p->buf, sizeof(float), n, p->f) != n) {
        p->write_failed = true;
        return -1;
    }
    return 0;
}

/* gpt2_shard_each's visitor: one instance of the whole model read from the
 * source's shards straight to its place in llm.c order. */
struct gather {
    struct ckpt_source *src;
    const struct gpt2_shard *whole;
    float *full;
    struct plait_error *err;
};

static int gather_instance(void *ctx, enum gpt2_tensor t, int layer, size_t off, size_t n)
{
    struct gather *g = ctx;
    return ckpt_source_read(g->src, CKPT_PARAMS, g->whole, off, off + n,
                            g->full + gpt2_shard_instance_at(g->whole, t, layer), g->err);
}

/* The source's whole model in llm.c order, malloc'ed. */
static float *gather_whole(struct ckpt_source *src, struct plait_error *err)
{
    struct gpt2_shard whole;
    struct gpt2_part part = gpt2_part_whole(&src->cfg);
    if (gpt2_shard_init(&whole, &src->cfg, &part, err)) return NULL;
    float *full = malloc(whole.total * sizeof(float) + 1);
    if (!full) {
        error_set(err, "out of memory for %zu parameters", whole.total);
        return NULL;
    }
    struct gather g = {src, &whole, full, err};
    if (gpt2_shard_each(&whole, gather_instance, &g)) {
        free(full);
        return NULL;
    }
    return full;
}

/* The source's whole model as a Hugging Face directory. */
static int export_hf(struct ckpt_source *src, const char *out, size_t shard_bytes,
                     enum st_dtype dtype, struct plait_error *err)
{
    float *full = gather_whole(src, err);
    if (!full) return -1;
    int rc = hf_model_write(out, &src->cfg, full, shard_bytes, dtype, err);
    free(full);
    return rc;
}

/* Writes the source's whole model, in llm.c order, into an llm.c file. */
static int export_llmc(struct ckpt_source *src, const char *out, struct plait_error *err)
{
    if (src->cfg.llama)
        return error_set(err, "llm.c's files hold GPT-2s; export a llama with --hf");
    if (gpt2_moe(&src->cfg))
        return error_set(err, "llm.c's files hold no experts (the checkpoint's model.moe)");
    struct gpt2_shard whole;
    struct gpt2_part part = gpt2_part_whole(&src->cfg);
    if (gpt2_shard_init(&whole, &src->cfg, &part, err)) return -1;
    char tmp[4096];
    int n = snprintf(tmp, sizeof tmp, "%s.tmp-%ld", out, (long)getpid());
    if (n < 0 || (size_t)n >= sizeof tmp) return error_set(err, "%s: path too long", out);
    size_t most = 0;
    for (int t = 0; t < GPT2_TENSORS; t++)
        if (whole.elems[t] > most) most = whole.elems[t];
    float *buf = malloc(most * sizeof(float) + 1);
    FILE *f = NULL;
    int rc = -1;
    if (!buf) {
        error_set(err, "out of memory");
        goto out;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 || !(f = fdopen(fd, "wb"))) {
        if (fd >= 0) close(fd);
        error_errno(err, "%s", tmp);
        goto out;
    }
    int32_t h[LLMC_HEADER_INTS];
    struct llmc_model_header mh = llmc_model_header_of(&src->cfg);
    llmc_model_header_fill(h, &mh);
    if (fwrite(h, sizeof h, 1, f) != 1) goto write_failed;
    /* the whole model's instances in llm.c order (tensor, then layer) */
    struct put_whole pw = {src, &whole, buf, f, err, false};
    if (gpt2_shard_each(&whole, put_whole_instance, &pw)) {
        if (pw.write_failed) goto write_failed;
        goto out;
    }
    if (fflush(f) || fsync(fileno(f))) goto write_failed;
    if (fclose(f)) {
        f = NULL;
        goto write_failed;
    }
    f = NULL;
    if (rename(tmp, out)) goto write_failed;
    char *parent = fs_dirname(out);
    rc = parent ? fs_fsync_dir(parent, err) : error_set(err, "out of memory");
    free(parent);
    goto out;
write_failed:
    error_errno(err, "writing %s", tmp);
out:
    if (f) fclose(f);
    if (rc) unlink(tmp);
    free(buf);
    return rc;
}

int cmd_ckpt_export(int argc, char **argv)
{
    struct cli_args a;
    int parsed = cli_parse(&cmd_ckpt_export_cli, argc, argv, &a);
    if (parsed != CLI_CONTINUE) return parsed;
    const char *arg = NULL, *out = NULL, *hf = NULL, *dtype = NULL;
    double shard_mb = 5000;
    char *end = NULL;
    for (int i = 0; i < a.n; i++)
        if (a.v[i].opt == OPT_LLMC)
            out = a.v[i].value;
        else if (a.v[i].opt == OPT_HF)
            hf = a.v[i].value;
        else if (a.v[i].opt == OPT_SHARD_MB)
            shard_mb = strtod(a.v[i].value, &end);
        else if (a.v[i].opt == OPT_DTYPE)
            dtype = a.v[i].value;
        else
            arg = a.v[i].value;
    bool bad_mb = end && (*end || !(shard_mb > 0) || shard_mb > 1e9);
    bool bad_dtype = dtype && (!hf || (strcmp(dtype, "fp32") != 0 && strcmp(dtype, "bf16") != 0));
    if (!out == !hf || bad_mb || bad_dtype) {
        cli_args_free(&a);
        return cli_usage_error(&cmd_ckpt_export_cli,
                               bad_mb      ? "--shard-mb takes a positive number of MB"
                               : bad_dtype ? "--dtype is fp32 or bf16, with --hf"
                                           : "one of --llmc OUT.bin and --hf OUT_DIR is required");
    }
    struct plait_error err;
    struct ckpt_source src;
    char cdir[4096], layout[96];
    int64_t step;
    int rc = PLAIT_EXIT_ERROR;
    if (ckpt_pick_newest("ckpt export", arg, cdir, sizeof cdir, &step, layout, sizeof layout,
                         &err) ||
        ckpt_source_open(&src, cdir, &err)) {
        log_error("ckpt export: %s", err.text);
        goto out;
    }
    enum st_dtype st = dtype && strcmp(dtype, "bf16") == 0 ? ST_BF16 : ST_F32;
    int failed = hf ? export_hf(&src, hf, (size_t)(shard_mb * (1 << 20)), st, &err)
                    : export_llmc(&src, out, &err);
    ckpt_source_close(&src);
    if (failed) {
        log_error("ckpt export: %s", err.text);
        goto out;
    }
    printf("%s: step %lld of %s, written as %s\n", cdir, (long long)step, layout, hf ? hf : out);
    rc = PLAIT_EXIT_OK;
out:
    cli_args_free(&a);
    return rc;
}

int ckpt_pick_newest(const char *command, const char *arg, char *cdir, size_t cdir_bytes,
                     int64_t *step, char *layout, size_t layout_bytes, struct plait_error *err)
{
    /* newest first, each verified only until one does (every file of each is read) */
    char dir[4096], one[256];
    struct ckptdir d = {0};
    struct ckpt_entry *list = NULL;
    int n = 0, rc = -1;
    if (resolve(arg, dir, sizeof dir, one, sizeof one, err)) return -1;
    if (!(d.path = strdup(dir))) return error_set(err, "out of memory");
    if (one[0])
        n = 1;
    else if (ckptdir_list(&d, &list, &n, err))
        goto out;
    struct ckpt_info c = {0};
    int i = 0;
    for (; i < n; i++) {
        describe(&d, one[0] ? one : list[i].name, &c);
        if (c.ok) break;
        log_warn("%s: %s/%s does not verify: %s", command, d.path, c.name, c.why.text);
    }
    if (i == n) {
        error_set(err, "%s: no checkpoint that verifies", arg);
        goto out;
    }
    if (fs_join(cdir, cdir_bytes, d.path, c.name, err)) goto out;
    *step = c.step;
    layout_text(&c, layout, layout_bytes);
    rc = 0;
out:
    free(list);
    ckptdir_close(&d);
    return rc;
}

/* IN.bin's header against the plan's model: every dimension named. */
static int check_llmc(const char *in, const struct gpt2_config *c, struct plait_error *err)
{
    struct llmc_model_header h;
    if (llmc_read_model_header(in, &h, err)) return -1;
    if (h.version != LLMC_MODEL_VERSION_FP32)
        return error_set(err, "%s: version %d (bf16 weights); import takes fp32 (version %d)", in,
                         h.version, LLMC_MODEL_VERSION_FP32);
    const struct {
        const char *field;
        int want, got;
    } dims[] = {{"model.layers", c->layers, h.layers},
                {"model.heads", c->heads, h.heads},
                {"model.hidden", c->hidden, h.hidden},
                {"model.vocab", c->vocab, h.vocab},
                {"model.padded_vocab", c->padded_vocab, h.padded_vocab},
                {"model.max_seq_len", c->max_seq_len, h.max_seq_len}};
    for (size_t i = 0; i < sizeof dims / sizeof *dims; i++)
        if (dims[i].want != dims[i].got)
            return error_set(err, "%s: %s is %d, the plan's %s %d", in, dims[i].field + 6,
                             dims[i].got, dims[i].field, dims[i].want);
    return 0;
}

/* model.bin: an llm.c file as it is, header and all (checked: fp32, these dimensions). */
static int put_llmc_model(const char *in, FILE *src, char *buf, size_t chunk,
                          const struct gpt2_layout *full, const char *tmp,
                          struct ckpt_manifest *files, struct ckpt_file *f, struct plait_error *err)
{
    uint64_t left = LLMC_HEADER_BYTES + (uint64_t)full->total * sizeof(float);
    if (ckpt_file_open(f, tmp, "model.bin", err)) return -1;
    while (left) {
        size_t n = left < chunk ? (size_t)left : chunk;
        if (fread(buf, 1, n, src) != n) return error_set(err, "%s: shorter than its header says", in);
        if (ckpt_file_put(f, buf, n, err)) return -1;
        left -= n;
    }
    return ckpt_file_close(f, files, err);
}

/* model.bin from a Hugging Face directory: an llm.c header of the plan's
 * model, then its tensors in llm.c order. */
static int put_hf_model(const char *in, const struct gpt2_config *cfg, const char *tmp,
                        struct ckpt_manifest *files, struct ckpt_file *f, struct plait_error *err)
{
    struct gpt2_layout full;
    gpt2_layout(cfg, &full); /* addressable: the plan checked it */
    float *w = malloc(full.total * sizeof *w + 1);
    if (!w) return error_set(err, "out of memory for %zu parameters", full.total);
    int32_t h[LLMC_HEADER_INTS];
    struct llmc_model_header mh = llmc_model_header_of(cfg);
    llmc_model_header_fill(h, &mh);
    int rc = hf_model_read(in, cfg, w, err) || ckpt_file_open(f, tmp, "model.bin", err) ||
                     ckpt_file_put(f, h, sizeof h, err) ||
                     ckpt_file_put(f, w, full.total * sizeof *w, err) ||
                     ckpt_file_close(f, files, err)
                 ? -1
                 : 0;
    free(w);
    return rc;
}

/* The checkpoint's files: IN as model.bin, zero moments, a fresh state. */
static int write_import(const char *in, const struct plan *plan, const struct gpt2_config *cfg,
                        const char *tmp, struct ckpt_manifest *files, struct plait_error *err)
{
    struct gpt2_layout full;
    if (gpt2_layout(cfg, &full)) return error_set(err, "the plan's model is too large");
    enum { CHUNK = 1 << 20 };
    char *buf = calloc(1, CHUNK);
    FILE *src = hf_is_model_dir(in) ? NULL : fs_fopen_regular(in, err);
    struct ckpt_file f = {.fd = -1};
    int rc = -1;
    if (!buf || (!src && !hf_is_model_dir(in))) {
        if (!buf) error_set(err, "out of memory");
        goto out;
    }
    if ((hf_is_model_dir(in) ? put_hf_model(in, cfg, tmp, files, &f, err)
                             : put_llmc_model(in, src, buf, CHUNK, &full, tmp, files, &f, err)))
        goto out;
    /* optim.bin: AdamW's moments, zero as before a first step */
    int32_t h[LLMC_HEADER_INTS];
    ckpt_optim_header(h, full.total, false);
    memset(buf, 0, CHUNK);
    uint64_t left = 2 * (uint64_t)full.total * sizeof(float);
    if (ckpt_file_open(&f, tmp, "optim.bin", err) || ckpt_file_put(&f, h, sizeof h, err)) goto out;
    while (left) {
        size_t n = left < CHUNK ? (size_t)left : CHUNK;
        if (ckpt_file_put(&f, buf, n, err)) goto out;
        left -= n;
    }
    if (ckpt_file_close(&f, files, err)) goto out;
    /* state.json, plan.json */
    struct train_state st;
    ckpt_state_fresh(&st, plan);
    char *plan_json = plan_to_json(plan);
    rc = !plan_json ? error_set(err, "out of memory")
         : ckpt_state_write(tmp, &st, &f, files, err) ||
                 ckpt_file_write(&f, tmp, CKPT_PLAN, plan_json, strlen(plan_json), files, err)
             ? -1
             : 0;
    free(plan_json);
out:
    ckpt_file_discard(&f);
    if (src) fclose(src);
    free(buf);
    return rc;
}

/* IN.bin as the step-0 checkpoint of a new run of plan in out: its checkpoint
 * directory into dir, the checkpoint's name into name. */
static int import_checkpoint(const char *in, const struct plan *plan, const char *out, char *dir,
                             size_t dir_bytes, char name[48], struct plait_error *err)
{
    struct runlock lock = {-1}, ckpt_lock = {-1};
    struct ckptdir d = {0};
    struct ckpt_entry *list = NULL;
    struct ckpt_manifest files = {0};
    char tmp[4096];
    int n = 0, rc = -1;
    struct gpt2_config cfg = gpt2_config_of_plan(&plan->model);
    if ((hf_is_model_dir(in) ? hf_config_check(in, &cfg, err) : check_llmc(in, &cfg, err)) ||
        fs_mkdir_p(out, err) ||
        runlock_acquire(&lock, out, "run directory", err) ||
        rundir_checkpoint_dir(plan, out, dir, dir_bytes, err) || fs_mkdir_p(dir, err) ||
        ckptdir_open_locked(&d, &ckpt_lock, dir, out, err) || ckptdir_list(&d, &list, &n, err))
        goto out;
    if (n > 0) {
        error_set(err,
                  "%s holds %d checkpoint%s already (newest %s): import into a new run directory",
                  dir, n, n == 1 ? "" : "s", list[0].name);
        goto out;
    }
    ckptdir_name(name, 48, 0, 0);
    if (ckptdir_begin(&d, name, tmp, sizeof tmp, err)) goto out;
    if (write_import(in, plan, &cfg, tmp, &files, err)) {
        ckptdir_abort(tmp);
        goto out;
    }
    if (ckptdir_commit(&d, name, tmp, &files, NULL, err)) goto out;
    /* the run directory's own plan: a run with checkpoints and no plan.json
     * is one no plan may take over (and plait status, ckpt ls read it) */
    char *json = plan_to_json(plan);
    rc = json ? rundir_plan_write(out, json, err) : error_set(err, "out of memory");
    free(json);
out:
    ckpt_manifest_free(&files);
    free(list);
    if (d.path) ckptdir_close(&d);
    runlock_release(&ckpt_lock);
    runlock_release(&lock);
    return rc;
}

int cmd_ckpt_import(int argc, char **argv)
{
    struct cli_args a;
    int parsed = cli_parse(&cmd_ckpt_import_cli, argc, argv, &a);
    if (parsed != CLI_CONTINUE) return parsed;
    const char *ops[2] = {NULL, NULL}, *out = NULL;
    const char **sets = calloc((size_t)a.n + 1, sizeof *sets);
    int n_ops = 0, n_sets = 0, rc = PLAIT_EXIT_ERROR;
    for (int i = 0; i < a.n && sets; i++) {
        if (a.v[i].opt == OPT_OUT)
            out = a.v[i].value;
        else if (a.v[i].opt == OPT_SET)
            sets[n_sets++] = a.v[i].value;
        else if (n_ops < 2)
            ops[n_ops++] = a.v[i].value;
    }
    if (!out) {
        free(sets);
        cli_args_free(&a);
        return cli_usage_error(&cmd_ckpt_import_cli, "--out DIR is required");
    }
    struct plait_error err = {.text = "out of memory"};
    struct plan *plan = sets ? plan_load(ops[1], sets, n_sets, &err) : NULL;
    char dir[4096], name[48];
    if (!plan || import_checkpoint(ops[0], plan, out, dir, sizeof dir, name, &err)) {
        log_error("ckpt import: %s", err.text);
    } else {
        printf("%s/%s: %s as the step-0 checkpoint of %s (plait train %s --out %s trains from "
               "it)\n",
               dir, name, ops[0], ops[1], ops[1], out);
        rc = PLAIT_EXIT_OK;
    }
    plan_free(plan);
    free(sets);
    cli_args_free(&a);
    return rc;
}
