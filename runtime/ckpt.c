/* ckpt.c — what a checkpoint holds: model.bin (llm.c GPT-2, fp32), optim.bin
 * (our header, then AdamW m, v and, mid-step, the gradients), state.json and
 * plan.json; writing them, and loading the newest usable one of this run.
 * Naming, manifests, verification and the commit are common/formats/ckptdir.c's. */
#include "runtime/ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/formats/ckpt_shards.h"
#include "common/formats/ckpt_state.h"
#include "common/crc32c.h"
#include "common/fsutil.h"
#include "common/formats/llmc.h"
#include "common/log.h"
#include "common/formats/rundir.h"

/* Streams a parameter-shaped buffer of backend memory to f in llm.c order
 * (tensor, then layer), one tensor instance at a time through a host buffer. */
int ckpt_put_instance(void *ctx, enum gpt2_tensor t, int layer, size_t off, size_t n)
{
    (void)t;
    (void)layer;
    struct ckpt_put *a = ctx;
    for (size_t done = 0; done < n;) {
        size_t k = n - done < CKPT_HOST_FLOATS ? n - done : CKPT_HOST_FLOATS;
        if (a->src)
            a->ops->download(a->ctx, a->host, a->src + off + done, k * sizeof(float));
        else if (offload_read(a->off, a->moment, off + done, a->host, k, a->err))
            return -1;
        if (ckpt_file_put(a->f, a->host, k * sizeof(float), a->err)) return -1;
        done += k;
    }
    return 0;
}

/* src's instances, or (src NULL) offloaded moment k's */
static int put_tensors(struct ckpt_file *f, const struct model *m, const float *src, int k,
                       float *host, struct plait_error *err)
{
    struct ckpt_put a = {f, m->ops, m->ctx, src, host, err, m->offload, k};
    return gpt2_shard_each(&m->shard, ckpt_put_instance, &a);
}

static int write_checkpoint_files(const char *tmp, const struct model *m,
                                  const struct train_state *st, const char *plan_json,
                                  struct ckpt_manifest *files, struct plait_error *err)
{
    size_t P = m->shard.total;
    float *host = malloc(CKPT_HOST_FLOATS * sizeof(float));
    if (!host) return error_set(err, "out of memory");
    struct ckpt_file w = {.fd = -1};
    int rc = -1;

    /* model.bin: an llm.c GPT-2 checkpoint, fp32 (a Llama's: llmc.h's version 103) */
    int32_t header[LLMC_HEADER_INTS];
    struct llmc_model_header mh = llmc_model_header_of(&m->cfg);
    llmc_model_header_fill(header, &mh);
    if (ckpt_file_open(&w, tmp, "model.bin", err) ||
        ckpt_file_put(&w, header, sizeof header, err) || put_tensors(&w, m, m->params, 0, host, err) ||
        ckpt_file_close(&w, files, err))
        goto out;

    /* optim.bin: {magic, version, params (low, high 32 bits), has_grads}, m, v[, grads],
     * each in llm.c order like model.bin */
    ckpt_optim_header(header, P, st->micro > 0);
    if (ckpt_file_open(&w, tmp, "optim.bin", err) ||
        ckpt_file_put(&w, header, sizeof header, err) || put_tensors(&w, m, m->adam_m, 0, host, err) ||
        put_tensors(&w, m, m->adam_v, 1, host, err) ||
        (st->micro > 0 && put_tensors(&w, m, m->grads, 0, host, err)) ||
        ckpt_file_close(&w, files, err))
        goto out;

    rc = ckpt_state_write(tmp, st, &w, files, err);
    if (rc == 0 && plan_json)
        rc = ckpt_file_write(&w, tmp, CKPT_PLAN, plan_json, strlen(plan_json), files, err);
out:
    ckpt_file_discard(&w);
    free(host);
    return rc;
}

int ckpt_begin(struct ckptdir *d, const struct train_state *st, struct ckpt_job *job,
               struct plait_error *err)
{
    memset(job, 0, sizeof *job);
    ckptdir_name(job->name, sizeof job->name, st->step, st->micro);
    if (ckptdir_begin(d, job->name, job->tmp, sizeof job->tmp, err))
        return error_prefix(err, "writing checkpoint %s/%s: ", d->path, job->name);
    job->begun = true;
    return 0;
}

void ckpt_write(struct ckpt_job *job, const struct model *m, const struct train_state *st,
                const char *plan_json)
{
    job->failed =
        write_checkpoint_files(job->tmp, m, st, plan_json, &job->manifest, &job->why) != 0;
}

int ckpt_commit(struct ckptdir *d, struct ckpt_job *job, int keep, struct plait_error *err)
{
    int rc = -1;
    if (job->failed) {
        *err = job->why;
        ckptdir_abort(job->tmp);
    } else {
        rc = ckptdir_commit(d, job->name, job->tmp, &job->manifest, NULL, err);
    }
    ckpt_manifest_free(&job->manifest);
    job->begun = false;
    if (rc) return error_prefix(err, "writing checkpoint %s/%s: ", d->path, job->name);
    ckptdir_prune(d, keep);
    return 0;
}

int ckpt_save(struct ckptdir *d, const struct model *m, const struct train_state *st, int keep,
              const char *plan_json, struct plait_error *err)
{
    struct ckpt_job job;
    if (ckpt_begin(d, st, &job, err)) return -1;
    ckpt_write(&job, m, st, plan_json);
    return ckpt_commit(d, &job, keep, err);
}

/* ---- verifying and loading ---------------------------------------------------- */

/* Reads a parameter-shaped buffer in llm.c order (full) from f and uploads
 * the shard's part of it to dst. */
static int read_tensors(FILE *f, const struct model *m, float *dst, float *full, float *shard,
                        size_t full_count, const char *path, struct plait_error *err)
{
    if (fread(full, sizeof(float), full_count, f) != full_count)
        return error_set(err, "%s: short read", path);
    gpt2_shard_copy(&m->shard, full, shard, true);
    m->ops->upload(m->ctx, dst, shard, m->shard.total * sizeof(float));
    return 0;
}

/* The same for optimizer moment k: the part, then this rank's slice of it
 * (ZeRO; all of it at 0), zeros past the part's end. */
static int read_moment(FILE *f, struct model *m, int k, float *full, float *shard,
                       size_t full_count, const char *path, struct plait_error *err)
{
    if (fread(full, sizeof(float), full_count, f) != full_count)
        return error_set(err, "%s: short read", path);
    gpt2_shard_copy(&m->shard, full, shard, true);
    size_t end = m->slice_at + m->slice_n, have = m->shard.total;
    size_t n = m->slice_at >= have ? 0 : (end < have ? end : have) - m->slice_at;
    return model_moment_put(m, k, shard + m->slice_at, n, err);
}

/* Whether the checkpoint at cdir holds the whole model (model.bin); if not,
 * err says which layout wrote it. */
static int check_whole(const char *cdir, struct plait_error *err)
{
    struct ckpt_layout l;
    if (ckpt_layout_read(cdir, &l, err)) return -1;
    ckpt_layout_free(&l);
    if (l.whole) return 0;
    return error_set(err,
                     "it was written in parts by tp %d × pp %d × dp %d (ZeRO %d); resharding it "
                     "to one rank is not in this version (resume with that layout)",
                     l.tp, l.pp, l.dp, l.zero);
}

int ckpt_load_whole(const char *cdir, struct model *m, struct train_state *st,
                    struct plait_error *err)
{
    if (check_whole(cdir, err)) return -1;
    struct gpt2_layout full_layout;
    gpt2_layout(&m->cfg, &full_layout); /* addressable: the model's shard of it was */
    size_t P = m->shard.total, F = full_layout.total;
    char path[4096];
    if (ckpt_read_state(cdir, st, err)) return -1;
    if (st->micro > 0 && m->dp * m->replicas > 1)
        return error_set(err,
                         "it stopped mid-step on one data-parallel rank; resume it with "
                         "dp = 1 (its gradients cannot be split over %d ranks)",
                         m->dp * m->replicas);
    float *full = malloc(F * sizeof(float)), *shard = malloc(P * sizeof(float));
    FILE *f = NULL;
    int rc = -1;
    if (!full || !shard) {
        error_set(err, "out of memory");
        goto out;
    }
    if (fs_join(path, sizeof path, cdir, "model.bin", err) ||
        gpt2_read_llmc(path, &m->cfg, full, NULL, err))
        goto out;
    gpt2_shard_copy(&m->shard, full, shard, true);
    model_set_params(m, shard);

    if (fs_join(path, sizeof path, cdir, "optim.bin", err)) goto out;
    f = fs_fopen_regular(path, err);
    int32_t h[LLMC_HEADER_INTS];
    if (!f) goto out;
    if (fread(h, 4, LLMC_HEADER_INTS, f) != LLMC_HEADER_INTS || h[0] != CKPT_OPTIM_MAGIC ||
        h[1] != CKPT_OPTIM_VERSION) {
        error_set(err, "%s: not a plait optimizer state (magic/version)", path);
        goto out;
    }
    size_t count = (size_t)(uint32_t)h[2] | (size_t)(uint32_t)h[3] << 32;
    if (count != F) {
        error_set(err, "%s: holds %zu parameters, the model has %zu", path, count, F);
        goto out;
    }
    if ((h[4] != 0) != (st->micro > 0)) {
        error_set(err, "%s: gradients %s but state.json says micro-batch %d", path,
                  h[4] ? "present" : "absent", st->micro);
        goto out;
    }
    if (read_moment(f, m, 0, full, shard, F, path, err) ||
        read_moment(f, m, 1, full, shard, F, path, err) ||
        (h[4] && read_tensors(f, m, m->grads, full, shard, F, path, err)))
        goto out;
    if (h[4] && m->zero == 2) { /* the accumulated gradients live in the slice */
        m->ops->zero(m->ctx, m->grad_slice, m->slice_n * sizeof(float));
        size_t end = m->slice_at + m->slice_n, have = m->shard.total;
        size_t n = m->slice_at >= have ? 0 : (end < have ? end : have) - m->slice_at;
        if (n) m->ops->upload(m->ctx, m->grad_slice, shard + m->slice_at, n * sizeof(float));
    }
    rc = 0;
out:
    if (f) fclose(f);
    free(full);
    free(shard);
    return rc;
}
