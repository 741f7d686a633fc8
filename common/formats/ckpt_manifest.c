/* ckpt_manifest.c — a checkpoint's manifest.json written and read back
 * (ckpt_manifest.h), with the description of the model it gives readers
 * without our code. The commit protocol around it is ckptdir.c's. */
#include "common/formats/ckpt_manifest.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fsutil.h"
#include "common/json_read.h"
#include "common/formats/rundir.h"

void ckpt_layout_free(struct ckpt_layout *l)
{
    free(l->stage_begin);
    free(l->stage_end);
    l->stage_begin = l->stage_end = NULL;
}

int ckpt_manifest_add(struct ckpt_manifest *m, const char *name, int64_t bytes, uint32_t crc32c,
                      struct plait_error *err)
{
    struct ckpt_manifest_file f = {.bytes = bytes, .crc32c = crc32c};
    if (snprintf(f.name, sizeof f.name, "%s", name) >= (int)sizeof f.name)
        return error_set(err, "%s: a checkpoint's file name has at most %zu bytes", name,
                         sizeof f.name - 1);
    if (m->n_files == m->cap_files) {
        int cap = m->cap_files ? 2 * m->cap_files : 16;
        struct ckpt_manifest_file *more = realloc(m->files, (size_t)cap * sizeof *more);
        if (!more) return error_set(err, "out of memory");
        m->files = more;
        m->cap_files = cap;
    }
    m->files[m->n_files++] = f;
    return 0;
}

const struct ckpt_manifest_file *ckpt_manifest_find(const struct ckpt_manifest *m, const char *name)
{
    for (int i = 0; i < m->n_files; i++)
        if (!strcmp(m->files[i].name, name)) return &m->files[i];
    return NULL;
}

void ckpt_manifest_free(struct ckpt_manifest *m)
{
    free(m->files);
    ckpt_layout_free(&m->layout);
    memset(m, 0, sizeof *m);
}

/* ---- what the manifest says of the model ------------------------------------------------- */

/* "tensors": each tensor's name, global shape (llm.c's, per-layer tensors
 * stacked over layers) and how tensor parallelism cuts it; those the
 * architecture has (gpt2_layout.h). */
static json_t *tensors_json(const struct gpt2_config *cfg)
{
    static const char *const cut[GPT2_TENSORS] = {[GPT2_WTE] = "rows (vocabulary)",
                                                  [GPT2_QKVW] = "rows of each of q, k, v (heads)",
                                                  [GPT2_QKVB] = "rows of each of q, k, v",
                                                  [GPT2_ATTPROJW] = "columns",
                                                  [GPT2_FCW] = "rows",
                                                  [GPT2_FCB] = "rows",
                                                  [GPT2_FCPROJW] = "columns",
                                                  [GPT2_LMHEAD] = "rows (vocabulary)"};
    long long C = cfg->hidden, L = cfg->layers, QKV = gpt2_qkv_rows(cfg);
    long long FC = gpt2_fc_rows(cfg), F = gpt2_ffn(cfg);
    struct gpt2_layout layout;
    if (gpt2_layout(cfg, &layout)) return NULL;
    long long shapes[GPT2_TENSORS][3] = {[GPT2_WTE] = {cfg->padded_vocab, C},
                                         [GPT2_WPE] = {cfg->max_seq_len, C},
                                         [GPT2_LN1W] = {L, C},
                                         [GPT2_LN1B] = {L, C},
                                         [GPT2_QKVW] = {L, QKV, C},
                                         [GPT2_QKVB] = {L, QKV},
                                         [GPT2_ATTPROJW] = {L, C, C},
                                         [GPT2_ATTPROJB] = {L, C},
                                         [GPT2_LN2W] = {L, C},
                                         [GPT2_LN2B] = {L, C},
                                         [GPT2_FCW] = {L, FC, C},
                                         [GPT2_FCB] = {L, F},
                                         [GPT2_FCPROJW] = {L, C, F},
                                         [GPT2_FCPROJB] = {L, C},
                                         [GPT2_LNFW] = {C},
                                         [GPT2_LNFB] = {C},
                                         [GPT2_LMHEAD] = {cfg->padded_vocab, C}};
    json_t *out = json_array();
    for (int t = 0; t < GPT2_TENSORS && out; t++) {
        if (!layout.elems[t]) continue;
        json_t *shape = json_array();
        for (int k = 0; k < 3 && shapes[t][k]; k++)
            json_array_append_new(shape, json_integer(shapes[t][k]));
        json_array_append_new(out, json_pack("{s:s,s:o,s:s}", "name", gpt2_tensor_names[t], "shape",
                                             shape, "tp_cut",
                                             cut[t] ? cut[t] : "whole on every tp rank"));
    }
    return out;
}

/* A part file's slice (files named as ckpt_part_name makes them; NULL for
 * another file): its tp rank of tp (the cut), its stage's layers (one
 * [begin, end) per chunk), and for a ZeRO slice of the moments, which
 * elements of the part's layer-major buffer. */
static json_t *slice_json(const char *file, const struct gpt2_config *cfg,
                          const struct ckpt_layout *l)
{
    char kind[8];
    int tr, st, d = -1, n = 0;
    if (sscanf(file, "%5[a-z]-tp%d-pp%d-dp%d.bin%n", kind, &tr, &st, &d, &n) != 4 || file[n]) {
        d = -1;
        n = 0;
        if (sscanf(file, "%5[a-z]-tp%d-pp%d.bin%n", kind, &tr, &st, &n) != 3 || file[n])
            return NULL; /* not a part file */
    }
    int tp = l->tp, pp = l->pp, dp = l->dp_shard ? l->dp_shard : l->dp;
    if (st < 0 || st >= pp || tr < 0 || tr >= tp) return NULL;
    int b = l->stage_begin[st], e = l->stage_end[st], c = l->chunks > 1 ? l->chunks : 1;
    struct gpt2_part part = {.tp = tp,
                             .tp_rank = tr,
                             .pp = pp,
                             .pp_rank = st,
                             .layer_begin = b,
                             .layer_end = e,
                             .chunks = c,
                             .v_shape = l->v_shape};
    int stride = gpt2_part_chunk_stride(&part);
    json_t *layers = json_array();
    for (int k = 0; k < c; k++)
        json_array_append_new(layers, json_pack("[i,i]", b + k * stride, e + k * stride));
    json_t *out =
        json_pack("{s:i,s:i,s:i,s:o}", "tp_rank", tr, "tp", tp, "pp_rank", st, "layers", layers);
    if (d >= 0) json_object_set_new(out, "dp_rank", json_integer(d));
    /* its routed experts: dp rank d's ep rank's (with ZeRO, a slice of them over its expert
     * peers, dp ranks d % ep + ep·k: plan_zero_slices) */
    int ep = l->ep > 1 ? l->ep : 1, s = d / ep;
    if (d >= 0 && ep > 1 && strcmp(kind, "grads")) {
        int n_ep = cfg->experts / ep, er = d % ep;
        json_object_set_new(out, "experts", json_pack("[i,i]", er * n_ep, (er + 1) * n_ep));
    }
    if (d >= 0 &&
        ((l->zero > 0 && !strcmp(kind, "optim")) || (l->zero == 3 && !strcmp(kind, "model")))) {
        struct gpt2_shard sh;
        struct plait_error err;
        size_t slices = (size_t)(dp / ep);
        if (gpt2_shard_init(&sh, cfg, &part, &err) == 0) {
            size_t slice = (sh.total + slices - 1) / slices;
            json_object_set_new(out, "elements",
                                json_pack("[I,I]", (json_int_t)(slice * (size_t)s),
                                          (json_int_t)(slice * (size_t)(s + 1))));
        }
    }
    return out;
}

/* ---- writing ---------------------------------------------------------------------------- */

static json_t *layout_json(const struct ckpt_layout *l, const struct gpt2_config *describe)
{
    json_t *o =
        json_pack("{s:i,s:i,s:i,s:i}", "tp", l->tp, "pp", l->pp, "dp", l->dp, "zero", l->zero);
    if (o && l->dp_shard && l->dp_shard != l->dp) /* hybrid sharding */
        json_object_set_new(o, "dp_shard", json_integer(l->dp_shard));
    if (o && l->cp > 1) /* context parallelism: dp counts its ranks */
        json_object_set_new(o, "cp", json_integer(l->cp));
    if (o && l->ep > 1) /* expert parallelism: its ranks' parts */
        json_object_set_new(o, "ep", json_integer(l->ep));
    if (o && l->chunks > 1) /* interleaved: which layers a stage holds */
        json_object_set_new(o, "virtual_stages", json_integer(l->chunks));
    if (o && l->v_shape) /* DualPipeV: its second chunk runs back up the stages */
        json_object_set_new(o, "v_shape", json_true());
    if (o && l->stage_begin) {
        json_t *stages = json_array();
        for (int s = 0; s < l->pp; s++)
            json_array_append_new(stages, json_pack("[i,i]", l->stage_begin[s], l->stage_end[s]));
        json_object_set_new(o, "stages", stages);
    }
    if (o && describe) json_object_set_new(o, "tensors", tensors_json(describe));
    return o;
}

static json_t *files_json(const struct ckpt_manifest *m, const struct gpt2_config *describe)
{
    json_t *files = json_object();
    const struct ckpt_layout *l = &m->layout;
    for (int i = 0; files && i < m->n_files; i++) {
        const struct ckpt_manifest_file *f = &m->files[i];
        json_t *entry =
            json_pack("{s:I,s:I}", "bytes", (json_int_t)f->bytes, "crc32c", (json_int_t)f->crc32c);
        json_t *slice = describe && l->stage_begin ? slice_json(f->name, describe, l) : NULL;
        if (entry && slice) json_object_set_new(entry, "slice", slice);
        json_object_set_new(files, f->name, entry);
    }
    return files;
}

int ckpt_manifest_write(const char *dir, const struct ckpt_manifest *m,
                        const struct gpt2_config *describe, struct plait_error *err)
{
    json_t *man =
        json_pack("{s:I,s:I,s:s,s:o}", "step", (json_int_t)m->step, "micro", (json_int_t)m->micro,
                  "version", m->version, "files", files_json(m, describe));
    if (man && !ckpt_manifest_find(m, "model.bin")) /* in parts: the layout that wrote it */
        json_object_set_new(man, "layout", layout_json(&m->layout, describe));
    char *text = man ? json_dumps(man, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
    json_decref(man);
    if (!text) return error_set(err, "out of memory");
    char path[4096];
    int rc = fs_join(path, sizeof path, dir, CKPT_MANIFEST, err) ||
                     fs_write_atomic(path, text, strlen(text), err)
                 ? -1
                 : 0;
    free(text);
    return rc;
}

/* ---- reading ---------------------------------------------------------------------------- */

static void read_files(struct json_read *r, json_t *files, struct ckpt_manifest *m)
{
    const char *name;
    json_t *entry;
    json_object_foreach(files, name, entry)
    {
        char at[128];
        snprintf(at, sizeof at, "files.%s", name);
        if (!json_is_object(entry)) json_read_fail(r, "files", name, "not an object");
        int64_t bytes = json_read_int(r, entry, at, "bytes");
        int64_t crc = json_read_int(r, entry, at, "crc32c");
        if (!r->failed && (bytes < 0 || crc < 0 || crc > UINT32_MAX))
            json_read_fail(r, at, bytes < 0 ? "bytes" : "crc32c", "out of range");
        if (!r->failed && strlen(name) >= sizeof m->files->name)
            json_read_fail(r, "files", name, "a checkpoint's file name has at most %zu bytes",
                           sizeof m->files->name - 1);
        if (!r->failed && ckpt_manifest_add(m, name, bytes, (uint32_t)crc, r->err)) r->failed = -1;
    }
}

/* An optional int member of the layout (absent: *out stays). */
static void layout_int(struct json_read *r, json_t *l, const char *key, int *out)
{
    if (json_read_has(l, key)) *out = (int)json_read_int(r, l, "layout", key);
}

static void read_stages(struct json_read *r, json_t *stages, struct ckpt_layout *out)
{
    if (json_array_size(stages) != (size_t)out->pp) {
        json_read_fail(r, "layout", "stages", "must hold one [begin, end) per stage (%d)", out->pp);
        return;
    }
    out->stage_begin = calloc((size_t)out->pp, sizeof(int));
    out->stage_end = calloc((size_t)out->pp, sizeof(int));
    if (!out->stage_begin || !out->stage_end) {
        r->failed = error_set(r->err, "out of memory");
        return;
    }
    for (int i = 0; i < out->pp && !r->failed; i++)
        if (json_unpack(json_array_get(stages, (size_t)i), "[ii]", &out->stage_begin[i],
                        &out->stage_end[i])) {
            char key[32];
            snprintf(key, sizeof key, "stages[%d]", i);
            json_read_fail(r, "layout", key, "must be [begin, end)");
        }
}

static void read_layout(struct json_read *r, json_t *j, struct ckpt_layout *out)
{
    *out = (struct ckpt_layout){
        .tp = 1, .pp = 1, .dp = 1, .chunks = 1, .dp_shard = 1, .cp = 1, .ep = 1};
    out->whole = json_object_get(json_object_get(j, "files"), "model.bin") != NULL;
    if (!json_read_has(j, "layout")) return;
    json_t *l = json_read_object(r, j, NULL, "layout");
    layout_int(r, l, "tp", &out->tp);
    layout_int(r, l, "pp", &out->pp);
    layout_int(r, l, "dp", &out->dp);
    layout_int(r, l, "zero", &out->zero);
    layout_int(r, l, "virtual_stages", &out->chunks);
    if (json_read_has(l, "v_shape")) out->v_shape = json_read_bool(r, l, "layout", "v_shape");
    out->dp_shard = out->dp;
    layout_int(r, l, "dp_shard", &out->dp_shard);
    layout_int(r, l, "cp", &out->cp);
    layout_int(r, l, "ep", &out->ep);
    if (r->failed) return;
    if (out->v_shape && out->chunks != 2) {
        r->failed = error_set(r->err, "%s: layout: a V shape has 2 chunks a stage, not %d",
                              r->file, out->chunks);
        return;
    }
    if (out->tp < 1 || out->pp < 1 || out->dp < 1 || out->chunks < 1 || out->zero < 0 ||
        out->zero > 3 || (int64_t)out->tp * out->pp * out->dp > (1 << 24) || out->dp_shard < 1 ||
        out->dp % out->dp_shard != 0 || out->cp < 1 || out->dp % out->cp || out->ep < 1 ||
        out->dp % out->ep || (out->ep > 1 && out->zero && out->dp_shard % out->ep)) {
        r->failed = error_set(r->err,
                              "%s: layout: tp %d × pp %d × dp %d (shard groups of %d, cp %d, "
                              "ep %d), ZeRO %d, %d chunk(s) is not a layout",
                              r->file, out->tp, out->pp, out->dp, out->dp_shard, out->cp, out->ep,
                              out->zero, out->chunks);
        return;
    }
    if (json_read_has(l, "stages")) read_stages(r, json_read_array(r, l, "layout", "stages"), out);
}

int ckpt_manifest_read(const char *cdir, struct ckpt_manifest *m, struct plait_error *err)
{
    char path[4096];
    memset(m, 0, sizeof *m);
    if (fs_join(path, sizeof path, cdir, CKPT_MANIFEST, err)) return -1;
    struct json_read r = {path, err, 0};
    json_t *j = json_read_file(&r, path);
    if (!j) return -1;
    m->step = json_read_int(&r, j, NULL, "step");
    m->micro = json_read_int(&r, j, NULL, "micro");
    const char *version = json_read_string(&r, j, NULL, "version");
    if (snprintf(m->version, sizeof m->version, "%s", version) >= (int)sizeof m->version)
        json_read_fail(&r, NULL, "version", "longer than %zu bytes", sizeof m->version - 1);
    read_files(&r, json_read_object(&r, j, NULL, "files"), m);
    read_layout(&r, j, &m->layout);
    json_decref(j);
    if (r.failed) ckpt_manifest_free(m);
    return r.failed;
}

int ckpt_layout_read(const char *cdir, struct ckpt_layout *out, struct plait_error *err)
{
    struct ckpt_manifest m;
    memset(out, 0, sizeof *out);
    if (ckpt_manifest_read(cdir, &m, err)) return -1;
    *out = m.layout;
    m.layout.stage_begin = m.layout.stage_end = NULL; /* now out's */
    ckpt_manifest_free(&m);
    return 0;
}
