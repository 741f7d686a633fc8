/* ckpt_parts.c — saving and loading the checkpoint of a job of several ranks:
 * each rank's part files, rank 0's gathering of their checksums and its
 * commit, the choice of the checkpoint every rank loads. The single-rank
 * files are ckpt.c's; the directory protocol is common/formats/ckptdir.c's. */
#include "runtime/ckpt_parts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/formats/ckpt_shards.h"
#include "common/formats/ckpt_state.h"
#include "common/fsutil.h"
#include "common/formats/llmc.h"
#include "common/log.h"
#include "common/formats/rundir.h"

#define MAX_FILES CKPT_PART_FILES

static void part_name(char *out, size_t n, enum ckpt_part_kind kind, const struct model *m,
                      const struct env_rank *w, bool with_dp)
{
    ckpt_part_name(out, n, kind, m->shard.part.tp_rank, m->shard.part.pp_rank, w->dp_rank, with_dp);
}

static void header_fill(int32_t h[LLMC_HEADER_INTS], enum ckpt_part_kind kind,
                        const struct model *m, const struct env_rank *w, size_t count, int arrays)
{
    struct ckpt_part_id id = {w->tp,
                              w->tp_rank,
                              w->pp,
                              w->pp_rank,
                              w->dp,
                              w->dp_rank,
                              m->zero,
                              m->shard.part.chunks,
                              count,
                              arrays,
                              m->shard.part.layer_begin,
                              m->shard.part.layer_end};
    ckpt_part_header(h, kind, &id);
}

/* The dp ranks of a shard group, which write its slices (ZeRO): the slices' ranks, and with
 * expert parallelism each ep rank's (its experts sliced over its expert peers:
 * plan_zero_slices), ep × dp of them. */
static int shard_ranks(const struct model *m)
{
    return m->dp * (m->zero && m->shard.part.ep > 1 ? m->shard.part.ep : 1);
}

/* ---- writing ----------------------------------------------------------------------------- */

/* What rank 0 needs of a written file for the manifest. */
static void record(struct ckpt_manifest_file *rec, const char *name, const struct ckpt_file *f)
{
    snprintf(rec->name, sizeof rec->name, "%s", name);
    rec->bytes = (int64_t)f->bytes;
    rec->crc32c = f->crc;
}

/* n floats of backend memory as they lie (src NULL: offloaded moment k's). */
static int put_raw(struct ckpt_file *f, const struct model *m, const float *src, int k, size_t n,
                   float *host, struct plait_error *err)
{
    struct ckpt_put a = {f, m->ops, m->ctx, src, host, err, m->offload, k};
    return ckpt_put_instance(&a, 0, 0, 0, n);
}

/* Writes one part file: header, then each array (instances, or raw slices). */
static int write_part(const char *tmp, const char *name, enum ckpt_part_kind kind,
                      const struct model *m, const struct env_rank *w, const float *const *arrays,
                      int n_arrays, bool raw, float *host, struct ckpt_manifest_file *rec,
                      struct plait_error *err)
{
    struct ckpt_file f = {.fd = -1};
    int32_t h[LLMC_HEADER_INTS];
    size_t count = raw ? m->slice_n : m->shard.total;
    header_fill(h, kind, m, w, count, n_arrays);
    int rc = ckpt_file_open(&f, tmp, name, err) || ckpt_file_put(&f, h, sizeof h, err) ? -1 : 0;
    for (int i = 0; i < n_arrays && rc == 0; i++) {
        if (raw) {
            rc = put_raw(&f, m, arrays[i], i, m->slice_n, host, err);
        } else {
            struct ckpt_put a = {&f, m->ops, m->ctx, arrays[i], host, err, m->offload, i};
            rc = gpt2_shard_each(&m->shard, ckpt_put_instance, &a);
        }
    }
    if (rc == 0) rc = ckpt_file_close(&f, NULL, err);
    ckpt_file_discard(&f);
    if (rc == 0) record(rec, name, &f);
    return rc;
}

/* This rank's files into tmp. */
static int write_mine(const char *tmp, const struct model *m, const struct train_state *st,
                      const char *plan_json, const struct env_rank *w,
                      struct ckpt_manifest_file recs[MAX_FILES], struct plait_error *err)
{
    float *host = malloc(CKPT_HOST_FLOATS * sizeof(float));
    if (!host) return error_set(err, "out of memory");
    char name[64];
    int rc = 0, k = 0;
    bool z3 = m->zero == 3; /* the parameters in slices too, as the moments */
    int ep = m->shard.part.ep > 1 ? m->shard.part.ep : 0; /* each ep rank its experts */
    if (z3 ? w->dp_rank < shard_ranks(m) : w->dp_rank < (ep ? ep : 1)) {
        const float *params[] = {m->params};
        part_name(name, sizeof name, CKPT_PART_MODEL, m, w, z3 || ep);
        rc = write_part(tmp, name, CKPT_PART_MODEL, m, w, params, 1, z3, host, &recs[k++], err);
    }
    const float *moments[] = {m->adam_m, m->adam_v};
    /* the slices: replica 0's shard group (hybrid sharding: the others hold the same) */
    if (rc == 0 && (m->zero ? w->dp_rank < shard_ranks(m) : w->dp_rank < (ep ? ep : 1))) {
        part_name(name, sizeof name, CKPT_PART_OPTIM, m, w, m->zero > 0 || ep);
        rc = write_part(tmp, name, CKPT_PART_OPTIM, m, w, moments, 2, m->zero > 0, host, &recs[k++],
                        err);
    }
    if (rc == 0 && st->micro > 0) { /* every rank's own accumulated gradients */
        const float *grads[] = {m->zero >= 2 ? m->grad_slice : m->grads};
        part_name(name, sizeof name, CKPT_PART_GRADS, m, w, true);
        rc = write_part(tmp, name, CKPT_PART_GRADS, m, w, grads, 1, m->zero >= 2, host, &recs[k++],
                        err);
    }
    struct ckpt_file f = {.fd = -1};
    if (rc == 0 && w->rank == 0) { /* the text files */
        rc = ckpt_state_write(tmp, st, &f, NULL, err);
        if (rc == 0) record(&recs[k++], CKPT_STATE, &f);
        if (rc == 0 && plan_json)
            rc = ckpt_file_write(&f, tmp, CKPT_PLAN, plan_json, strlen(plan_json), NULL, err);
        if (rc == 0 && plan_json) record(&recs[k++], CKPT_PLAN, &f);
    }
    free(host);
    return rc;
}

int ckpt_parts_begin(struct ckptdir *d, const char *dir, const struct train_state *st,
                     struct parallel *par, struct ckpt_parts_job *job, struct plait_error *err)
{
    const struct env_rank *w = &par->where;
    memset(job, 0, sizeof *job);
    ckptdir_name(job->name, sizeof job->name, st->step, st->micro);
    char tmp_name[96];
    snprintf(tmp_name, sizeof tmp_name, ".tmp-%s", job->name);
    int failed = 0;
    struct plait_error why = {.text = ""};
    /* rank 0 makes the temporary directory; every rank writes its files into it */
    if (w->rank == 0) failed = ckptdir_begin(d, job->name, job->tmp, sizeof job->tmp, &why) != 0;
    if (parallel_max_int(par, &failed, err)) return -1;
    if (failed)
        return error_set(err, "checkpoint %s: %s", job->name,
                         w->rank == 0 ? why.text : "rank 0 could not start it");
    for (int i = 0; i < MAX_FILES; i++) job->mine[i].bytes = -1;
    return fs_join(job->tmp, sizeof job->tmp, dir, tmp_name, err);
}

void ckpt_parts_write(struct ckpt_parts_job *job, const struct model *m,
                      const struct train_state *st, const char *plan_json, const struct env_rank *w)
{
    job->failed = write_mine(job->tmp, m, st, plan_json, w, job->mine, &job->why) != 0;
}

/* Rank 0's part of a commit: the manifest (every rank's files, the layout
 * with each stage's layers, the model described) written, and the commit. */
static int commit_manifest(struct ckptdir *d, const struct ckpt_parts_job *job,
                           const struct model *m, const struct env_rank *w,
                           const struct ckpt_manifest_file *all, const int64_t *stage_of,
                           struct plait_error *err)
{
    struct ckpt_manifest man = {.layout = {.tp = w->tp,
                                           .pp = w->pp,
                                           .dp = w->dp,
                                           .zero = m->zero,
                                           .chunks = m->chunks,
                                           .v_shape = m->shard.part.v_shape,
                                           .dp_shard = m->zero ? shard_ranks(m) : w->dp,
                                           .cp = w->cp,
                                           .ep = m->shard.part.ep > 1 ? m->shard.part.ep : 1}};
    struct ckpt_layout *l = &man.layout;
    int rc = -1;
    l->stage_begin = calloc((size_t)w->pp, sizeof *l->stage_begin);
    l->stage_end = calloc((size_t)w->pp, sizeof *l->stage_end);
    if (!l->stage_begin || !l->stage_end) {
        error_set(err, "out of memory");
        goto out;
    }
    for (int r = 0; r < w->world; r++) {
        l->stage_begin[stage_of[3 * r]] = (int)stage_of[3 * r + 1];
        l->stage_end[stage_of[3 * r]] = (int)stage_of[3 * r + 2];
    }
    for (int i = 0; i < w->world * MAX_FILES; i++)
        if (all[i].bytes >= 0 &&
            ckpt_manifest_add(&man, all[i].name, all[i].bytes, (uint32_t)all[i].crc32c, err))
            goto out;
    rc = ckptdir_commit(d, job->name, job->tmp, &man, &m->cfg, err);
out:
    ckpt_manifest_free(&man);
    return rc;
}

int ckpt_parts_commit(struct ckptdir *d, struct ckpt_parts_job *job, const struct model *m,
                      int keep, struct parallel *par, struct plait_error *err)
{
    const struct env_rank *w = &par->where;
    const char *name = job->name, *tmp = job->tmp;
    int failed = job->failed, any = failed;
    struct plait_error why = job->why;
    if (parallel_max_int(par, &any, err)) /* this rank's own failure is the one to tell */
        return failed ? error_set(err, "checkpoint %s: %s", name, why.text) : -1;
    /* every rank's records to rank 0 (all to all: a few hundred bytes each) */
    size_t words = (sizeof job->mine) / (sizeof(int64_t)); /* the records as int64 words */
    struct ckpt_manifest_file *all = calloc((size_t)w->world * MAX_FILES, sizeof *all);
    /* and every rank's stage: the layers it holds go into the manifest */
    int64_t my_stage[3] = {w->pp_rank, m->shard.part.layer_begin, m->shard.part.layer_end};
    int64_t *stage_of = calloc((size_t)w->world * 3, sizeof *stage_of);
    int rc = -1;
    if (!all || !stage_of) {
        error_set(err, "out of memory");
        goto out;
    }
    if (comm_allgather(par->world, job->mine, all, words, COMM_INT64, err) ||
        comm_allgather(par->world, my_stage, stage_of, 3, COMM_INT64, err))
        goto out;
    if (any) {
        error_set(err, "checkpoint %s: %s", name,
                  failed ? why.text : "another rank could not write its part (see its message)");
        goto out;
    }
    if (w->rank == 0) {
        failed = commit_manifest(d, job, m, w, all, stage_of, &why) != 0;
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
    /* a rank that could not write its part says why, even when a later collective failed
     * first (another rank, told of the failure, may have aborted the job) */
    if (rc && job->failed) error_set(err, "checkpoint %s: %s", name, job->why.text);
    if (rc && w->rank == 0) ckptdir_abort(tmp);
    free(stage_of);
    free(all);
    return rc;
}

int ckpt_parts_save(struct ckptdir *d, const char *dir, const struct model *m,
                    const struct train_state *st, int keep, const char *plan_json,
                    struct parallel *par, struct plait_error *err)
{
    struct ckpt_parts_job job;
    if (ckpt_parts_begin(d, dir, st, par, &job, err)) return -1;
    ckpt_parts_write(&job, m, st, plan_json, &par->where);
    return ckpt_parts_commit(d, &job, m, keep, par, err);
}

/* ---- loading ----------------------------------------------------------------------------- */

/* gpt2_shard_each's visitor: the next instance of a file in llm.c order into
 * its place in the shard's buffer. */
struct unpack {
    const float *file;
    float *shard;
    size_t at;
};

static int unpack_instance(void *ctx, enum gpt2_tensor t, int layer, size_t off, size_t n)
{
    (void)t;
    (void)layer;
    struct unpack *u = ctx;
    memcpy(u->shard + off, u->file + u->at, n * sizeof(float));
    u->at += n;
    return 0;
}

/* Reads a part file written by this rank's place into dst arrays. */
static int read_part(const char *cdir, const char *name, enum ckpt_part_kind kind,
                     const struct model *m, const struct env_rank *w, float *const *dst,
                     int n_arrays, bool raw, struct plait_error *err)
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
                m->ops->upload(m->ctx, dst[i], host, count * sizeof(float));
                continue;
            }
            float *shard = malloc(count * sizeof(float) + 1);
            if (!shard) {
                rc = error_set(err, "out of memory");
                break;
            }
            /* the file holds the instances in llm.c order: lay them out as the shard does */
            struct unpack u = {host, shard, 0};
            gpt2_shard_each(&m->shard, unpack_instance, &u);
            m->ops->upload(m->ctx, dst[i], shard, count * sizeof(float));
            free(shard);
        }
    }
    free(host);
    fclose(f);
    return rc;
}

bool ckpt_layout_same(const struct ckpt_layout *l, const struct model *m)
{
    return !l->whole && l->tp == m->shard.part.tp && l->pp == m->shard.part.pp &&
           l->dp == m->dp * m->replicas && (!m->zero || l->dp_shard == shard_ranks(m)) &&
           l->zero == m->zero && l->chunks == m->shard.part.chunks &&
           l->v_shape == m->shard.part.v_shape &&
           (l->ep > 1 ? l->ep : 1) == (m->shard.part.ep > 1 ? m->shard.part.ep : 1);
}

int ckpt_layout_check(const char *cdir, const struct model *m, struct plait_error *err)
{
    struct ckpt_layout l;
    struct train_state st;
    if (ckpt_layout_read(cdir, &l, err)) return -1;
    bool same = ckpt_layout_same(&l, m), whole = l.whole;
    ckpt_layout_free(&l);
    if (same || whole) return 0; /* ckpt_load_whole says what a whole one can go to */
    if (ckpt_read_state(cdir, &st, err)) return -1;
    if (st.micro == 0) return 0; /* resharded */
    return error_set(err,
                     "it stopped mid-step (micro-batch %d of step %d) in tp %d × pp %d × dp %d "
                     "(ZeRO %d, %d chunk(s), ep %d): the gradients of an unfinished step go only "
                     "to the layout that made them; resume in that layout to finish the step (the "
                     "next checkpoint can then go to any layout)",
                     st.micro, st.step + 1, l.tp, l.pp, l.dp, l.zero, l.chunks, l.ep);
}

int ckpt_load_resharded(const char *cdir, struct model *m, struct train_state *st,
                        struct plait_error *err)
{
    struct ckpt_source src;
    if (ckpt_source_open(&src, cdir, err)) return -1;
    size_t P = m->shard.total, n = P > m->slice_n ? P : m->slice_n;
    float *host = malloc(n * sizeof(float) + 1);
    int rc = -1;
    if (!host) {
        error_set(err, "out of memory");
        goto out;
    }
    if (src.micro > 0 && !ckpt_layout_same(&src.layout, m)) {
        ckpt_layout_check(cdir, m, err);
        goto out;
    }
    /* the parameters (ZeRO 3: its slice of them), then the moments of the optimizer's
     * slice (all of the part at ZeRO 0) */
    size_t lo = m->slice_at, hi = m->slice_at + m->slice_n;
    bool z3 = m->zero == 3;
    if (ckpt_read_state(cdir, st, err) ||
        ckpt_source_read(&src, CKPT_PARAMS, &m->shard, z3 ? lo : 0, z3 ? hi : P, host, err))
        goto out;
    if (z3)
        model_set_param_slice(m, host, m->slice_n);
    else
        model_set_params(m, host);
    if (ckpt_source_read(&src, CKPT_ADAM_M, &m->shard, lo, hi, host, err) ||
        model_moment_put(m, 0, host, m->slice_n, err) ||
        ckpt_source_read(&src, CKPT_ADAM_V, &m->shard, lo, hi, host, err) ||
        model_moment_put(m, 1, host, m->slice_n, err))
        goto out;
    rc = 0;
out:
    free(host);
    ckpt_source_close(&src);
    return rc;
}

int ckpt_load_grads(const char *cdir, struct model *m, const struct env_rank *w,
                    struct plait_error *err)
{
    char file[64];
    float *grads[] = {m->zero >= 2 ? m->grad_slice : m->grads};
    part_name(file, sizeof file, CKPT_PART_GRADS, m, w, true);
    return read_part(cdir, file, CKPT_PART_GRADS, m, w, grads, 1, m->zero >= 2, err);
}
