/* fuzz_ckpt_parts.c — libFuzzer target for a checkpoint's part files as
 * plait ckpt verify (ckpt_verify_all: sizes, checksums, every part's header)
 * and a resume (ckpt_source_open, ckpt_source_read of every array) read
 * them. At start-up it writes three small, valid checkpoints of a tiny GPT-2
 * with the project's own writers; each input replaces one of their part files
 * (the first byte picks which, and whether the manifest is rewritten to agree
 * with it), the rest being the file. Not here: the other files of a checkpoint
 * (fuzz_rundir) and a mid-step checkpoint's gradients (read by the runtime). */
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "common/crc32c.h"
#include "common/formats/ckpt_shards.h"
#include "common/formats/ckpt_state.h"
#include "common/formats/ckptdir.h"
#include "common/formats/llmc.h"
#include "common/formats/rundir.h"
#include "common/fsutil.h"
#include "tests/fuzz/harness.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The model of every checkpoint here: 1032 parameters. */
static const char plan_text[] =
    "{\"model\": {\"layers\": 4, \"heads\": 2, \"hidden\": 4, \"vocab\": 8, \"padded_vocab\": 8,"
    " \"seq_len\": 4}, \"data\": {\"train\": \"tokens.bin\"}, \"steps\": 10}";

/* The checkpoints: step_0000000<i+1>_0000 is written in layout i. */
static const struct ckpt_layout layouts[] = {
    {.tp = 1, .pp = 1, .dp = 1, .zero = 0, .chunks = 1, .whole = true}, /* model.bin, optim.bin */
    {.tp = 2, .pp = 2, .dp = 1, .zero = 0, .chunks = 1},                /* parts, whole moments */
    {.tp = 1, .pp = 2, .dp = 2, .zero = 1, .chunks = 2}, /* interleaved, ZeRO slices */
};
#define CKPTS (int)(sizeof layouts / sizeof *layouts)
#define MAX_PARTS 16

struct ckpt {
    char name[48], dir[4096];
    struct ckpt_manifest man; /* as committed */
};

/* A part file, in the order the input's first byte counts them: per
 * checkpoint, the model files (stage, then tp rank), then the moments. */
struct part {
    const struct ckpt *ckpt;
    char name[48];
    enum ckpt_part_kind kind;
    struct gpt2_shard shard; /* what its rank holds */
    int dp_rank;             /* a ZeRO slice of the moments: its dp rank; -1 otherwise */
    size_t count;            /* floats of each array: the slice's, or shard.total */
};

static struct ckpt ckpts[CKPTS];
static struct part parts[MAX_PARTS];
static int n_parts;
static struct gpt2_config cfg;
static char root[4096];

/* Makes name in dir a symbolic link to target. */
static void point(const char *dir, const char *name, const char *target)
{
    char link[4096];
    snprintf(link, sizeof link, "%s/%s", dir, name);
    FUZZ_CHECK(unlink(link) == 0 || errno == ENOENT, "%s: %s", link, strerror(errno));
    FUZZ_CHECK(symlink(target, link) == 0, "%s: %s", link, strerror(errno));
}

/* Where a checkpoint's file lies as written (its name in the checkpoint a link to it). */
static const char *pristine(const struct ckpt *c, const char *name)
{
    static char path[4096];
    snprintf(path, sizeof path, "%s/%s.%s", fuzz_dir(), c->name, name);
    return path;
}

/* Moves a written file aside and links it back. */
static void keep(const struct ckpt *c, const char *name)
{
    char from[4096];
    snprintf(from, sizeof from, "%s/%s", c->dir, name);
    FUZZ_CHECK(rename(from, pristine(c, name)) == 0, "%s: %s", from, strerror(errno));
    point(c->dir, name, pristine(c, name));
}

static void add_part(const struct ckpt *c, enum ckpt_part_kind kind, const struct gpt2_part *gp,
                     int dp_rank)
{
    const struct ckpt_layout *l = &layouts[c - ckpts];
    FUZZ_CHECK(n_parts < MAX_PARTS, "more than %d part files", MAX_PARTS);
    struct part *p = &parts[n_parts++];
    struct plait_error err;
    *p = (struct part){.ckpt = c, .kind = kind, .dp_rank = dp_rank};
    FUZZ_CHECK(gpt2_shard_init(&p->shard, &cfg, gp, &err) == 0, "%s", err.text);
    p->count = p->shard.total;
    if (dp_rank >= 0) p->count = (p->shard.total + (size_t)l->dp - 1) / (size_t)l->dp;
    if (l->whole)
        snprintf(p->name, sizeof p->name, "%s",
                 kind == CKPT_PART_MODEL ? "model.bin" : "optim.bin");
    else
        ckpt_part_name(p->name, sizeof p->name, kind, gp->tp_rank, gp->pp_rank, dp_rank,
                       dp_rank >= 0);
}

/* The part files of checkpoint c, into parts[], and its stages into its manifest's layout. */
static void add_parts(struct ckpt *c)
{
    const struct ckpt_layout *l = &layouts[c - ckpts];
    struct ckpt_layout *ml = &c->man.layout;
    *ml = *l;
    if (!l->whole) {
        ml->stage_begin = calloc((size_t)l->pp, sizeof *ml->stage_begin);
        ml->stage_end = calloc((size_t)l->pp, sizeof *ml->stage_end);
        FUZZ_CHECK(ml->stage_begin && ml->stage_end, "out of memory");
    }
    for (enum ckpt_part_kind kind = CKPT_PART_MODEL; kind <= CKPT_PART_OPTIM; kind++)
        for (int st = 0; st < l->pp; st++)
            for (int tr = 0; tr < l->tp; tr++) {
                struct gpt2_part gp = {
                    .tp = l->tp, .tp_rank = tr, .pp = l->pp, .pp_rank = st, .chunks = l->chunks};
                gpt2_stage_chunks(cfg.layers, l->pp, l->chunks, st, &gp);
                if (!l->whole) ml->stage_begin[st] = gp.layer_begin;
                if (!l->whole) ml->stage_end[st] = gp.layer_end;
                bool sliced = kind == CKPT_PART_OPTIM && l->zero > 0;
                for (int d = 0; d < (sliced ? l->dp : 1); d++)
                    add_part(c, kind, &gp, sliced ? d : -1);
            }
}

/* The 1 KiB header the writers put before part p's floats. */
static void header_of(const struct part *p, int32_t h[LLMC_HEADER_INTS])
{
    const struct ckpt_layout *l = &layouts[p->ckpt - ckpts];
    const struct gpt2_part *gp = &p->shard.part;
    if (l->whole && p->kind == CKPT_PART_MODEL) {
        struct llmc_model_header mh = {.version = LLMC_MODEL_VERSION_FP32,
                                       .max_seq_len = cfg.max_seq_len,
                                       .vocab = cfg.vocab,
                                       .layers = cfg.layers,
                                       .heads = cfg.heads,
                                       .hidden = cfg.hidden,
                                       .padded_vocab = cfg.padded_vocab};
        llmc_model_header_fill(h, &mh);
    } else if (l->whole) {
        ckpt_optim_header(h, p->count, false);
    } else {
        struct ckpt_part_id id = {l->tp,           gp->tp_rank,
                                  l->pp,           gp->pp_rank,
                                  l->dp,           p->dp_rank < 0 ? 0 : p->dp_rank,
                                  l->zero,         gp->chunks,
                                  p->count,        p->kind == CKPT_PART_OPTIM ? 2 : 1,
                                  gp->layer_begin, gp->layer_end};
        ckpt_part_header(h, p->kind, &id);
    }
}

/* Part p into the checkpoint being written at tmp: its header, then its
 * arrays (any values: only their place is checked), listed in m. */
static void write_part(const char *tmp, const struct part *p, struct ckpt_manifest *m)
{
    int32_t h[LLMC_HEADER_INTS];
    header_of(p, h);
    size_t n = p->count * (p->kind == CKPT_PART_OPTIM ? 2 : 1);
    float *values = malloc(n * sizeof *values + 1);
    FUZZ_CHECK(values, "out of memory");
    for (size_t i = 0; i < n; i++) values[i] = (float)((i * 7 + (size_t)n_parts) % 61) / 8 - 3;
    struct ckpt_file f;
    struct plait_error err;
    FUZZ_CHECK(ckpt_file_open(&f, tmp, p->name, &err) == 0 &&
                   ckpt_file_put(&f, h, sizeof h, &err) == 0 &&
                   ckpt_file_put(&f, values, n * sizeof *values, &err) == 0 &&
                   ckpt_file_close(&f, m, &err) == 0,
               "%s", err.text);
    ckpt_file_discard(&f);
    free(values);
}

/* Checkpoint i, written as a run writes it, its files then moved aside (keep). */
static void write_ckpt(struct ckptdir *d, int i, const struct plan *plan, const char *plan_json)
{
    struct ckpt *c = &ckpts[i];
    struct plait_error err;
    char tmp[4096];
    int first = n_parts;
    ckptdir_name(c->name, sizeof c->name, i + 1, 0);
    snprintf(c->dir, sizeof c->dir, "%s/%s", root, c->name);
    add_parts(c);
    FUZZ_CHECK(ckptdir_begin(d, c->name, tmp, sizeof tmp, &err) == 0, "%s", err.text);
    for (int k = first; k < n_parts; k++) write_part(tmp, &parts[k], &c->man);
    struct train_state st;
    struct ckpt_file f;
    ckpt_state_fresh(&st, plan);
    st.step = i + 1;
    FUZZ_CHECK(
        ckpt_state_write(tmp, &st, &f, &c->man, &err) == 0 &&
            ckpt_file_write(&f, tmp, CKPT_PLAN, plan_json, strlen(plan_json), &c->man, &err) == 0 &&
            ckptdir_commit(d, c->name, tmp, &c->man, c->man.layout.whole ? NULL : &cfg, &err) == 0,
        "%s", err.text);
    for (int k = first; k < n_parts; k++) keep(c, parts[k].name);
    keep(c, CKPT_MANIFEST);
}

static void remove_root(void)
{
    fs_remove_tree(root, NULL);
}

static void setup(void)
{
    struct plait_error err;
    struct plan *plan = plan_load_text(plan_text, "fuzz_ckpt_parts", fuzz_dir(), NULL, 0, &err);
    FUZZ_CHECK(plan, "%s", err.text);
    char *plan_json = plan_to_json(plan);
    FUZZ_CHECK(plan_json, "out of memory");
    cfg = gpt2_config_of_plan(&plan->model);
    snprintf(root, sizeof root, "%s/checkpoints", fuzz_dir());
    atexit(remove_root); /* before the harness removes fuzz_dir */
    struct ckptdir d;
    FUZZ_CHECK(ckptdir_open(&d, root, &err) == 0, "%s", err.text);
    for (int i = 0; i < CKPTS; i++) write_ckpt(&d, i, plan, plan_json);
    ckptdir_close(&d);
    free(plan_json);
    plan_free(plan);
}

/* Rewrites p's checkpoint's manifest so that it lists p as the n bytes now are. */
static void list_as_is(const struct part *p, const uint8_t *bytes, size_t n)
{
    struct ckpt *c = (struct ckpt *)p->ckpt;
    struct ckpt_manifest_file *f =
        (struct ckpt_manifest_file *)ckpt_manifest_find(&c->man, p->name);
    struct ckpt_manifest_file was = *f;
    struct plait_error err;
    f->bytes = (int64_t)n, f->crc32c = crc32c_update(0, bytes, n);
    FUZZ_CHECK(ckpt_manifest_write(c->dir, &c->man, c->man.layout.whole ? NULL : &cfg, &err) == 0,
               "%s", err.text);
    *f = was;
}

/* What plait ckpt verify does. */
static int verify(const struct ckpt *c, struct plait_error *why)
{
    struct ckptdir d;
    FUZZ_CHECK(ckptdir_open(&d, root, why) == 0, "%s", why->text);
    int rc = ckpt_verify_all(&d, c->name, why);
    ckptdir_close(&d);
    return rc;
}

/* gpt2_shard_each's visitor: whether each instance read (layer-major, out
 * holding elements [lo, hi)) is what the file holds there: the next instance
 * in llm.c order, or for a ZeRO slice, the same place in the slice. Only the
 * copies that count (gpt2_shard_counts) come from this file: a tensor whole on
 * every tp rank is read from tp rank 0's, the tied wte from the first stage's
 * (ckpt_shards.c). */
struct expect {
    const struct gpt2_shard *shard;
    const float *out;
    const uint8_t *file; /* the array's first float in the file */
    size_t lo, hi, at;
    bool sliced;
};

static int differs(void *ctx, enum gpt2_tensor t, int layer, size_t off, size_t n)
{
    struct expect *e = ctx;
    size_t a = off > e->lo ? off : e->lo, b = off + n < e->hi ? off + n : e->hi;
    size_t in_file = e->sliced ? a - e->lo : e->at;
    e->at += n;
    if (a >= b || !gpt2_shard_counts(e->shard, t)) return 0;
    FUZZ_CHECK(memcmp(e->out + (a - e->lo), e->file + in_file * sizeof(float),
                      (b - a) * sizeof(float)) == 0,
               "%s of layer %d read is not what the file holds", gpt2_tensor_names[t], layer);
    return 0;
}

/* Part p, accepted, reads back as the floats after its header. */
static int reads_what_it_holds(struct ckpt_source *src, const struct part *p, const uint8_t *floats,
                               float *out, struct plait_error *err)
{
    const struct gpt2_shard *sh = &p->shard;
    struct expect e = {.shard = sh, .out = out, .hi = sh->total, .sliced = p->dp_rank >= 0};
    if (e.sliced) { /* its slice of the part's layer-major buffer */
        e.lo = (size_t)p->dp_rank * p->count;
        e.hi = e.lo + p->count < e.hi ? e.lo + p->count : e.hi;
    }
    for (int k = 0; k < (p->kind == CKPT_PART_OPTIM ? 2 : 1); k++) {
        enum ckpt_array a = p->kind == CKPT_PART_MODEL ? CKPT_PARAMS
                            : k                        ? CKPT_ADAM_V
                                                       : CKPT_ADAM_M;
        if (ckpt_source_read(src, a, sh, e.lo, e.hi, out, err)) return -1;
        e.file = floats + (size_t)k * p->count * sizeof(float);
        e.at = 0;
        gpt2_shard_each(sh, differs, &e);
    }
    return 0;
}

/* What a resume does: every array of the whole model out of the checkpoint
 * (so every part file is opened), then part p's own as it holds them. */
static int load(const struct part *p, const uint8_t *bytes, struct plait_error *err)
{
    struct ckpt_source src;
    FUZZ_CHECK(ckpt_source_open(&src, p->ckpt->dir, err) == 0, "%s", err->text);
    struct gpt2_part whole_part = gpt2_part_whole(&cfg);
    struct gpt2_shard whole;
    FUZZ_CHECK(gpt2_shard_init(&whole, &cfg, &whole_part, err) == 0, "%s", err->text);
    float *out = malloc(whole.total * sizeof *out);
    FUZZ_CHECK(out, "out of memory");
    int rc = 0;
    for (enum ckpt_array a = CKPT_PARAMS; a <= CKPT_ADAM_V && rc == 0; a++)
        rc = ckpt_source_read(&src, a, &whole, 0, whole.total, out, err);
    if (rc == 0) rc = reads_what_it_holds(&src, p, bytes + LLMC_HEADER_BYTES, out, err);
    free(out);
    ckpt_source_close(&src);
    return rc;
}

/* a refusal: one printable line that names the part file */
static void refused(const struct plait_error *err, const char *name)
{
    fuzz_check_message(err->text);
    FUZZ_CHECK(strstr(err->text, name) != NULL, "the error does not name %s: %s", name, err->text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    if (n_parts == 0) setup();
    const struct part *p = &parts[(data[0] & 0x7f) % n_parts];
    bool agrees = !(data[0] & 0x80); /* the manifest rewritten to list the bytes as they are */
    const uint8_t *bytes = data + 1;
    size_t n = size - 1;
    point(p->ckpt->dir, p->name, fuzz_file(FUZZ_FD, bytes, n));
    if (agrees) list_as_is(p, bytes, n);
    struct plait_error why = {.text = ""}, err = {.text = ""};
    int verified = verify(p->ckpt, &why), loaded = load(p, bytes, &err);
    if (verified < 0) refused(&why, p->name);
    if (loaded < 0) refused(&err, p->name);
    /* verify and the loader apply the same checks (a stale manifest: verify's own) */
    FUZZ_CHECK(agrees ? verified == loaded : verified <= loaded,
               "verify %s it, the loader %s it: %s", verified ? "refuses" : "accepts",
               loaded ? "refuses" : "accepts", verified ? why.text : err.text);
    point(p->ckpt->dir, p->name, pristine(p->ckpt, p->name));
    if (agrees) point(p->ckpt->dir, CKPT_MANIFEST, pristine(p->ckpt, CKPT_MANIFEST));
    fuzz_close(FUZZ_FD);
    return 0;
}
