/* ckpt_parts.c — saving and loading the checkpoint of a job of several ranks:
 * each rank's part files, rank 0's gathering of their checksums and its
 * commit, the choice of the checkpoint every rank loads. The single-rank
 * files are ckpt.c's; the directory protocol is common/ckptdir.c's. */
#include "runtime/ckpt_parts.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fsutil.h"
#include "common/llmc.h"
#include "common/log.h"

#define PART_MAGIC 20261124
#define PART_VERSION 1
#define MAX_FILES 5 /* per rank: model, optim, grads, state, plan */

enum part_kind { PART_MODEL = 1, PART_OPTIM = 2, PART_GRADS = 3 };

/* One file a rank wrote, as rank 0 gathers it (a fixed record of int64 words). */
struct file_record {
    char name[48];
    int64_t bytes, crc; /* bytes < 0: no file */
};

static void part_name(char *out, size_t n, const char *kind, const struct model *m,
                      const struct env_rank *w, bool with_dp)
{
    if (with_dp)
        snprintf(out, n, "%s-tp%d-pp%d-dp%d.bin", kind, m->shard.part.tp_rank,
                 m->shard.part.pp_rank, w->dp_rank);
    else
        snprintf(out, n, "%s-tp%d-pp%d.bin", kind, m->shard.part.tp_rank, m->shard.part.pp_rank);
}

static void header_fill(int32_t h[LLMC_HEADER_INTS], enum part_kind kind, const struct model *m,
                        const struct env_rank *w, size_t count, int arrays)
{
    memset(h, 0, LLMC_HEADER_BYTES);
    h[0] = PART_MAGIC;
    h[1] = PART_VERSION;
    h[2] = kind;
    h[3] = w->tp, h[4] = w->tp_rank, h[5] = w->pp, h[6] = w->pp_rank, h[7] = w->dp;
    h[8] = w->dp_rank, h[9] = m->zero;
    h[10] = (int32_t)(uint32_t)(count & 0xffffffffu);
    h[11] = (int32_t)(uint32_t)(count >> 32);
    h[12] = arrays;
    h[13] = m->shard.part.chunks > 1 ? m->shard.part.chunks : 0; /* 0: one chunk (older files) */
}

/* ---- writing ----------------------------------------------------------------------------- */

/* What rank 0 needs of a written file for the manifest. */
static void record(struct file_record *rec, const char *name, const struct ckpt_file *f)
{
    snprintf(rec->name, sizeof rec->name, "%s", name);
    rec->bytes = (int64_t)f->bytes;
    rec->crc = f->crc;
}

/* n floats of backend memory as they lie. */
static int put_raw(struct ckpt_file *f, const struct ops *ops, const float *src, size_t n,
                   float *host, struct plait_error *err)
{
    struct ckpt_put a = {f, ops, src, host, err};
    return ckpt_put_instance(&a, 0, 0, 0, n);
}

/* Writes one part file: header, then each array (instances, or raw slices). */
static int write_part(const char *tmp, const char *name, enum part_kind kind, const struct model *m,
                      const struct env_rank *w, const float *const *arrays, int n_arrays, bool raw,
                      float *host, struct file_record *rec, struct plait_error *err)
{
    struct ckpt_file f = {.fd = -1};
    int32_t h[LLMC_HEADER_INTS];
    size_t count = raw ? m->slice_n : m->shard.total;
    header_fill(h, kind, m, w, count, n_arrays);
    json_t *files = json_object();
    int rc = files && !ckpt_file_open(&f, tmp, name, err) && !ckpt_file_put(&f, h, sizeof h, err)
                 ? 0
                 : -1;
    for (int i = 0; i < n_arrays && rc == 0; i++) {
        if (raw) {
            rc = put_raw(&f, m->ops, arrays[i], m->slice_n, host, err);
        } else {
            struct ckpt_put a = {&f, m->ops, arrays[i], host, err};
            rc = gpt2_shard_each(&m->shard, ckpt_put_instance, &a);
        }
    }
    if (rc == 0) rc = ckpt_file_close(&f, files, err);
    ckpt_file_discard(&f);
    if (rc == 0) record(rec, name, &f);
    json_decref(files);
    return rc;
}

static int write_text(const char *tmp, const char *name, const char *text, struct file_record *rec,
                      struct plait_error *err)
{
    struct ckpt_file f = {.fd = -1};
    json_t *files = json_object();
    int rc = files && !ckpt_file_open(&f, tmp, name, err) &&
                     !ckpt_file_put(&f, text, strlen(text), err) && !ckpt_file_close(&f, files, err)
                 ? 0
                 : -1;
    ckpt_file_discard(&f);
    if (rc == 0) record(rec, name, &f);
    json_decref(files);
    return rc;
}

/* This rank's files into tmp. */
static int write_mine(const char *tmp, const struct model *m, const struct train_state *st,
                      const char *plan_json, const struct env_rank *w,
                      struct file_record recs[MAX_FILES], struct plait_error *err)
{
    float *host = malloc(CKPT_HOST_FLOATS * sizeof(float));
    if (!host) return error_set(err, "out of memory");
    char name[64];
    int rc = 0, k = 0;
    if (w->dp_rank == 0) {
        const float *params[] = {m->params};
        part_name(name, sizeof name, "model", m, w, false);
        rc = write_part(tmp, name, PART_MODEL, m, w, params, 1, false, host, &recs[k++], err);
    }
    const float *moments[] = {m->adam_m, m->adam_v};
    if (rc == 0 && (m->zero || w->dp_rank == 0)) {
        part_name(name, sizeof name, "optim", m, w, m->zero > 0);
        rc =
            write_part(tmp, name, PART_OPTIM, m, w, moments, 2, m->zero > 0, host, &recs[k++], err);
    }
    if (rc == 0 && st->micro > 0) { /* every rank's own accumulated gradients */
        const float *grads[] = {m->zero == 2 ? m->grad_slice : m->grads};
        part_name(name, sizeof name, "grads", m, w, true);
        rc = write_part(tmp, name, PART_GRADS, m, w, grads, 1, m->zero == 2, host, &recs[k++], err);
    }
    if (rc == 0 && w->rank == 0) {
        json_t *state = ckpt_state_json(st);
        char *text = state ? json_dumps(state, JSON_INDENT(2) | JSON_REAL_PRECISION(17)) : NULL;
        json_decref(state);
        rc = text ? write_text(tmp, "state.json", text, &recs[k++], err)
                  : error_set(err, "out of memory");
        free(text);
        if (rc == 0 && plan_json) rc = write_text(tmp, "plan.json", plan_json, &recs[k++], err);
    }
    free(host);
    return rc;
}

int ckpt_parts_save(struct ckptdir *d, const char *dir, const struct model *m,
                    const struct train_state *st, int keep, const char *plan_json,
                    struct parallel *par, struct plait_error *err)
{
    const struct env_rank *w = &par->where;
    char name[48], tmp[4096];
    ckptdir_name(name, sizeof name, st->step, st->micro);
    char tmp_name[96];
    snprintf(tmp_name, sizeof tmp_name, ".tmp-%s", name);
    int failed = 0;
    struct plait_error why = {.text = ""};
    /* rank 0 makes the temporary directory; every rank writes its files into it */
    if (w->rank == 0) failed = ckptdir_begin(d, name, tmp, sizeof tmp, &why) != 0;
    if (parallel_max_int(par, &failed, err)) return -1;
    if (failed)
        return error_set(err, "checkpoint %s: %s", name,
                         w->rank == 0 ? why.text : "rank 0 could not start it");
    if (fs_join(tmp, sizeof tmp, dir, tmp_name, err)) return -1;
    struct file_record mine[MAX_FILES];
    memset(mine, 0, sizeof mine);
    for (int i = 0; i < MAX_FILES; i++) mine[i].bytes = -1;
    failed = write_mine(tmp, m, st, plan_json, w, mine, &why) != 0;
    int any = failed;
    if (parallel_max_int(par, &any, err)) return -1;
    /* every rank's records to rank 0 (all to all: a few hundred bytes each) */
    size_t words = (sizeof mine) / (sizeof(int64_t)); /* the records as int64 words */
    struct file_record *all = calloc((size_t)w->world * MAX_FILES, sizeof *all);
    int rc = -1;
    if (!all) {
        error_set(err, "out of memory");
        goto out;
    }
    if (comm_allgather(par->world, mine, all, words, COMM_INT64, err)) goto out;
    if (any) {
        error_set(err, "checkpoint %s: %s", name,
                  failed ? why.text : "another rank could not write its part (see its message)");
        goto out;
    }
    if (w->rank == 0) {
        json_t *files = json_object(),
               *extra = json_pack("{s:{s:i,s:i,s:i,s:i}}", "layout", "tp", w->tp, "pp", w->pp, "dp",
                                  w->dp, "zero", m->zero);
        if (m->chunks > 1) /* interleaved: which layers a stage holds */
            json_object_set_new(json_object_get(extra, "layout"), "virtual_stages",
                                json_integer(m->chunks));
        for (int i = 0; i < w->world * MAX_FILES; i++)
            if (all[i].bytes >= 0)
                json_object_set_new(files, all[i].name,
                                    json_pack("{s:I,s:I}", "bytes", (json_int_t)all[i].bytes,
                                              "crc32c", (json_int_t)all[i].crc));
        failed = ckptdir_commit(d, name, tmp, files, extra, &why) != 0;
        json_decref(files);
        json_decref(extra);
        if (!failed) ckptdir_prune(d, keep);
    }
    if (parallel_max_int(par, &failed, err)) goto out;
    if (failed) {
        error_set(err, "checkpoint %s: %s", name,
                  w->rank == 0 ? why.text : "rank 0 could not commit it");
        goto out;
    }
    rc = 0;
out:
    if (rc && w->rank == 0) ckptdir_abort(tmp);
    free(all);
    return rc;
}

/* ---- loading ----------------------------------------------------------------------------- */

/* Reads a part file written by this rank's place into dst arrays. */
static int read_part(const char *cdir, const char *name, enum part_kind kind, const struct model *m,
                     const struct env_rank *w, float *const *dst, int n_arrays, bool raw,
                     struct plait_error *err)
{
    char path[4096];
    if (fs_join(path, sizeof path, cdir, name, err)) return -1;
    FILE *f = fs_fopen_regular(path, err);
    if (!f) return -1;
    int32_t h[LLMC_HEADER_INTS], want[LLMC_HEADER_INTS];
    size_t count = raw ? m->slice_n : m->shard.total;
    header_fill(want, kind, m, w, count, n_arrays);
    float *host = malloc(count * sizeof(float) + 1);
    int rc = -1;
    if (!host) {
        error_set(err, "out of memory");
    } else if (fread(h, 4, LLMC_HEADER_INTS, f) != LLMC_HEADER_INTS ||
               memcmp(h, want, sizeof h) != 0) {
        error_set(err, "%s: not this rank's part (its header says another layout or size)", path);
    } else {
        rc = 0;
        for (int i = 0; i < n_arrays && rc == 0; i++) {
            if (fread(host, sizeof(float), count, f) != count) {
                rc = error_set(err, "%s: short read", path);
                break;
            }
            if (raw) {
                m->ops->upload(dst[i], host, count * sizeof(float));
                continue;
            }
            float *shard = malloc(count * sizeof(float) + 1);
            if (!shard) {
                rc = error_set(err, "out of memory");
                break;
            }
            /* the file holds the instances in llm.c order: lay them out as the shard does */
            size_t at = 0;
            for (int t = 0; t < GPT2_TENSORS; t++) {
                if (!gpt2_shard_holds(&m->shard, t)) continue;
                bool global = t == GPT2_WTE || t == GPT2_WPE || t == GPT2_LNFW || t == GPT2_LNFB;
                int n_layers = global ? 1 : gpt2_shard_layers(&m->shard);
                for (int j = 0; j < n_layers; j++) {
                    int l = global ? 0 : gpt2_shard_layer(&m->shard, j);
                    size_t off = gpt2_shard_offset(&m->shard, t, l), n = m->shard.elems[t];
                    memcpy(shard + off, host + at, n * sizeof(float));
                    at += n;
                }
            }
            m->ops->upload(dst[i], shard, count * sizeof(float));
            free(shard);
        }
    }
    free(host);
    fclose(f);
    return rc;
}

/* The layout a checkpoint was written in (its manifest), or all 1 for one
 * rank; *v: the model chunks a stage held (1 but interleaved). */
static int read_layout(const char *cdir, int *tp, int *pp, int *dp, int *zero, int *v, bool *whole,
                       struct plait_error *err)
{
    char path[4096];
    if (fs_join(path, sizeof path, cdir, "manifest.json", err)) return -1;
    json_error_t jerr;
    json_t *man = json_load_file(path, 0, &jerr);
    if (!man) return error_set(err, "manifest.json: %s", jerr.text);
    *tp = *pp = *dp = *v = 1;
    *zero = 0;
    *whole = json_object_get(json_object_get(man, "files"), "model.bin") != NULL;
    json_t *l = json_object_get(man, "layout");
    if (l)
        json_unpack(l, "{s?i,s?i,s?i,s?i,s?i}", "tp", tp, "pp", pp, "dp", dp, "zero", zero,
                    "virtual_stages", v);
    json_decref(man);
    return 0;
}

/* Can this rank's part come out of the checkpoint at cdir? */
static int check_layout(const char *cdir, const struct model *m, const struct env_rank *w,
                        struct plait_error *err)
{
    int tp, pp, dp, zero, v;
    bool whole;
    if (read_layout(cdir, &tp, &pp, &dp, &zero, &v, &whole, err)) return -1;
    if (whole) return 0; /* any layout takes its part of a whole model */
    if (tp == w->tp && pp == w->pp && dp == w->dp && zero == m->zero && v == m->chunks) return 0;
    return error_set(err,
                     "it was written by tp %d × pp %d × dp %d (ZeRO %d, %d model chunk(s) a "
                     "stage); this run is tp %d × pp %d × dp %d (ZeRO %d, %d chunk(s)): "
                     "resharding a checkpoint to another layout is not in this version (resume "
                     "with the layout that wrote it)",
                     tp, pp, dp, zero, v, w->tp, w->pp, w->dp, m->zero, m->chunks);
}

/* Rank 0: the newest checkpoint that verifies and belongs to this plan and
 * layout, into name ("" for none); CKPT_NOT_THIS_RUN when none is usable or
 * the newest does not belong, -1 when the directory cannot be listed. */
static int choose(struct ckptdir *d, const struct plan *plan, const struct model *m,
                  const struct env_rank *w, char *name, size_t name_bytes, char *notes,
                  size_t notes_bytes, struct plait_error *err)
{
    struct ckpt_entry *list;
    int n;
    name[0] = '\0';
    if (ckptdir_list(d, &list, &n, err)) return -1;
    int rc = 0;
    for (int i = 0; i < n; i++) {
        char cdir[4096];
        struct plait_error why;
        if (fs_join(cdir, sizeof cdir, d->path, list[i].name, &why) ||
            ckptdir_verify(d, list[i].name, &why)) {
            log_warn("checkpoint %s is unusable: %s; trying an older one", cdir, why.text);
            continue;
        }
        if (ckpt_check_plan(cdir, plan, notes, notes_bytes, &why)) {
            error_set(err, "checkpoint %s was written by a different plan: %s", cdir, why.text);
            rc = CKPT_NOT_THIS_RUN;
            break;
        }
        if (check_layout(cdir, m, w, &why)) {
            error_set(err, "checkpoint %s: %s", cdir, why.text);
            rc = CKPT_NOT_THIS_RUN;
            break;
        }
        snprintf(name, name_bytes, "%s", list[i].name);
        break;
    }
    if (rc == 0 && !name[0] && n > 0) {
        error_set(err, "%s: none of its %d checkpoint%s is usable (see the warnings above)",
                  d->path, n, n == 1 ? "" : "s");
        rc = CKPT_NOT_THIS_RUN;
    }
    free(list);
    return rc;
}

int ckpt_parts_load(struct ckptdir *d, const char *dir, const struct plan *plan, struct model *m,
                    struct train_state *st, char *name, size_t name_bytes, char *notes,
                    size_t notes_bytes, struct parallel *par, struct plait_error *err)
{
    const struct env_rank *w = &par->where;
    /* rank 0 chooses: the name, or "" for none, or "!<why none belongs>", or "#<error>" */
    char choice[1100] = "";
    if (w->rank == 0) {
        struct plait_error why;
        int rc = choose(d, plan, m, w, choice, sizeof choice, notes, notes_bytes, &why);
        if (rc)
            snprintf(choice, sizeof choice, "%c%s", rc == CKPT_NOT_THIS_RUN ? '!' : '#', why.text);
    }
    if (parallel_share_text(par, "the checkpoint to resume", choice, sizeof choice, err)) return -1;
    if (choice[0] == '!' || choice[0] == '#') {
        error_set(err, "%s", choice + 1);
        return choice[0] == '!' ? CKPT_NOT_THIS_RUN : -1;
    }
    if (!choice[0]) return 0;
    char cdir[4096];
    if (fs_join(cdir, sizeof cdir, dir, choice, err)) return -1;
    int tp, pp, dp, zero, v;
    bool whole;
    int failed = read_layout(cdir, &tp, &pp, &dp, &zero, &v, &whole, err) != 0;
    struct plait_error why = {.text = ""};
    if (!failed && whole) {
        failed = ckpt_load_whole(cdir, m, st, &why) != 0;
    } else if (!failed) {
        char file[64];
        failed = ckpt_read_state(cdir, st, &why) != 0;
        float *params[] = {m->params}, *moments[] = {m->adam_m, m->adam_v};
        float *grads[] = {m->zero == 2 ? m->grad_slice : m->grads};
        /* the part's parameters (and, at ZeRO 0, its moments) were written by dp rank 0 */
        struct env_rank w0 = *w;
        w0.dp_rank = 0;
        if (!failed) {
            part_name(file, sizeof file, "model", m, &w0, false);
            failed = read_part(cdir, file, PART_MODEL, m, &w0, params, 1, false, &why) != 0;
        }
        if (!failed) {
            const struct env_rank *by = m->zero ? w : &w0;
            part_name(file, sizeof file, "optim", m, by, m->zero > 0);
            failed = read_part(cdir, file, PART_OPTIM, m, by, moments, 2, m->zero > 0, &why) != 0;
        }
        if (!failed && st->micro > 0) {
            part_name(file, sizeof file, "grads", m, w, true);
            failed = read_part(cdir, file, PART_GRADS, m, w, grads, 1, m->zero == 2, &why) != 0;
        }
        if (!failed && m->params16) m->ops->to_bf16(m->params16, m->params, m->shard.total);
    }
    int any = failed;
    if (parallel_max_int(par, &any, err)) return -1;
    if (any)
        return error_set(err, "checkpoint %s: %s", cdir,
                         failed ? why.text : "another rank could not load its part");
    snprintf(name, name_bytes, "%s", choice);
    return 1;
}
