/* ckpt_shards.c — part file names and headers, the layout in a manifest, and
 * reading any part of any layout out of a checkpoint's files by runs of
 * contiguous elements (pread, no whole-model buffer). What the runtime does
 * with what it read is runtime/ckpt_parts.c's. */
#include "common/formats/ckpt_shards.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/formats/ckpt_state.h"
#include "common/formats/ckptdir.h"
#include "common/place/cost.h"
#include "common/fsutil.h"
#include "common/formats/rundir.h"

void ckpt_part_name(char *out, size_t bytes, enum ckpt_part_kind kind, int tp_rank, int pp_rank,
                    int dp_rank, bool with_dp)
{
    const char *what = kind == CKPT_PART_MODEL   ? "model"
                       : kind == CKPT_PART_OPTIM ? "optim"
                                                 : "grads";
    if (with_dp)
        snprintf(out, bytes, "%s-tp%d-pp%d-dp%d.bin", what, tp_rank, pp_rank, dp_rank);
    else
        snprintf(out, bytes, "%s-tp%d-pp%d.bin", what, tp_rank, pp_rank);
}

void ckpt_part_header(int32_t h[LLMC_HEADER_INTS], enum ckpt_part_kind kind,
                      const struct ckpt_part_id *id)
{
    memset(h, 0, LLMC_HEADER_BYTES);
    h[0] = CKPT_PART_MAGIC;
    h[1] = CKPT_PART_VERSION;
    h[2] = kind;
    h[3] = id->tp, h[4] = id->tp_rank, h[5] = id->pp, h[6] = id->pp_rank, h[7] = id->dp;
    h[8] = id->dp_rank, h[9] = id->zero;
    h[10] = (int32_t)(uint32_t)(id->count & 0xffffffffu);
    h[11] = (int32_t)(uint32_t)((uint64_t)id->count >> 32);
    h[12] = id->arrays;
    h[13] = id->chunks > 1 ? id->chunks : 0; /* 0: one chunk (older files) */
    h[14] = 1;                               /* the layer range follows (0: older files) */
    h[15] = id->layer_begin, h[16] = id->layer_end;
}

void ckpt_optim_header(int32_t h[LLMC_HEADER_INTS], size_t count, bool grads)
{
    memset(h, 0, LLMC_HEADER_BYTES);
    h[0] = CKPT_OPTIM_MAGIC;
    h[1] = CKPT_OPTIM_VERSION;
    h[2] = (int32_t)(uint32_t)(count & 0xffffffffu);
    h[3] = (int32_t)(uint32_t)((uint64_t)count >> 32);
    h[4] = grads;
}

int ckpt_newest_batch(const struct plan *p, const char *run_dir, struct ckpt_batch *out)
{
    struct plait_error err;
    char dir[4096];
    struct ckptdir d = {.path = dir};
    struct ckpt_entry *list = NULL;
    int n = 0, found = 0;
    memset(out, 0, sizeof *out);
    if (rundir_checkpoint_dir(p, run_dir, dir, sizeof dir, &err) ||
        ckptdir_list(&d, &list, &n, &err))
        return 0;
    for (int i = 0; i < n && !found; i++) { /* newest first; one that does not read is passed */
        char cdir[4096];
        struct ckpt_layout l;
        if (fs_join(cdir, sizeof cdir, dir, list[i].name, &err) || ckpt_layout_read(cdir, &l, &err))
            continue;
        ckpt_layout_free(&l);
        struct plan *before = rundir_plan_load(cdir, &err);
        if (!before) continue;
        if (before->batch.micro_batch == p->batch.micro_batch) {
            int dp = l.dp / l.cp; /* the data-parallel replicas */
            *out = (struct ckpt_batch){(int64_t)before->batch.grad_accum * dp, dp,
                                       before->batch.grad_accum};
            found = 1;
        }
        plan_free(before);
        break; /* the newest that reads decides */
    }
    free(list);
    return found;
}

/* ---- a source ---------------------------------------------------------------------------- */

void ckpt_source_close(struct ckpt_source *s)
{
    for (size_t i = 0; s->fds && i < s->n_fds; i++)
        if (s->fds[i] >= 0) close(s->fds[i]);
    free(s->fds);
    free(s->stages);
    free(s->slice);
    free(s->layer_stage);
    ckpt_layout_free(&s->layout);
    memset(s, 0, sizeof *s);
}

/* Where the checkpoint stopped: state.json's step and micro-batch. */
static int read_state(struct ckpt_source *s, struct plait_error *err)
{
    struct train_state st;
    if (ckpt_read_state(s->dir, &st, err)) return -1;
    s->step = st.step, s->micro = st.micro;
    return 0;
}

int ckpt_source_open(struct ckpt_source *s, const char *cdir, struct plait_error *err)
{
    memset(s, 0, sizeof *s);
    snprintf(s->dir, sizeof s->dir, "%s", cdir);
    struct plan *plan = NULL;
    if (ckpt_layout_read(cdir, &s->layout, err) || read_state(s, err) ||
        !(plan = rundir_plan_load(cdir, err)))
        goto fail;
    const struct ckpt_layout *l = &s->layout;
    s->cfg = gpt2_config_of_plan(&plan->model);
    int pp = l->pp, L = s->cfg.layers;
    s->stages = calloc((size_t)pp, sizeof *s->stages);
    s->slice = calloc((size_t)pp, sizeof *s->slice);
    s->layer_stage = calloc((size_t)L, sizeof *s->layer_stage);
    s->n_fds = (size_t)l->tp * (size_t)pp * (size_t)(2 + 2 * l->dp);
    s->fds = malloc(s->n_fds * sizeof *s->fds);
    if (!s->stages || !s->slice || !s->layer_stage || !s->fds) {
        error_set(err, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < s->n_fds; i++) s->fds[i] = -1;
    for (int i = 0; i < L; i++) s->layer_stage[i] = -1;
    for (int st = 0; st < pp; st++) {
        struct gpt2_part part;
        if (l->stage_begin) {
            part = (struct gpt2_part){.tp = l->tp,
                                      .pp = pp,
                                      .pp_rank = st,
                                      .layer_begin = l->stage_begin[st],
                                      .layer_end = l->stage_end[st],
                                      .chunks = l->chunks,
                                      .v_shape = l->v_shape,
                                      .ep = l->ep};
        } else {
            part = cost_stage_part(plan, l->tp, 0, pp, st);
            part.ep = l->ep; /* the checkpoint's layout's, not the plan's */
            if (part.chunks != l->chunks || part.v_shape != l->v_shape) { /* the even split */
                part.chunks = l->chunks;
                part.v_shape = false;
                if (l->v_shape)
                    gpt2_stage_vshape(L, pp, st, &part);
                else if (l->chunks > 1)
                    gpt2_stage_chunks(L, pp, l->chunks, st, &part);
            }
        }
        struct gpt2_shard *sh = &s->stages[st];
        if (gpt2_shard_init(sh, &s->cfg, &part, err)) {
            error_prefix(err, "%s: stage %d: ", cdir, st);
            goto fail;
        }
        /* the slices: one per rank of a shard group (with ep: of each ep rank's part, over
         * its expert peers, plan_zero_slices) */
        size_t dp = (size_t)(l->ep > 1 ? l->dp_shard / l->ep : l->dp_shard);
        s->slice[st] = l->zero ? (sh->total + dp - 1) / dp : sh->total;
        for (int i = 0; i < gpt2_shard_layers(sh); i++)
            s->layer_stage[gpt2_shard_layer(sh, i)] = st;
    }
    for (int i = 0; i < L; i++)
        if (s->layer_stage[i] < 0) {
            error_set(err, "%s: no stage of its layout holds layer %d", cdir, i);
            goto fail;
        }
    plan_free(plan);
    return 0;
fail:
    plan_free(plan);
    ckpt_source_close(s);
    return -1;
}

/* The file name of (kind, tp rank, stage, dp rank: -1 for none) in this
 * checkpoint: a part's, or model.bin / optim.bin of a whole one. */
static void source_name(const struct ckpt_source *s, enum ckpt_part_kind kind, int tr, int st,
                        int d, char *name, size_t bytes)
{
    if (s->layout.whole)
        snprintf(name, bytes, "%s", kind == CKPT_PART_MODEL ? "model.bin" : "optim.bin");
    else
        ckpt_part_name(name, bytes, kind, tr, st, d, d >= 0);
}

/* Whether h, the header of a whole checkpoint's model.bin or optim.bin, says
 * what the whole loader (runtime/ckpt.c) takes: the plan's model in fp32 (every
 * dimension, the vocabulary too); the moments of every parameter, followed by
 * the gradients exactly when state.json says the step stopped midway. *floats:
 * what follows the header. */
static bool whole_header_ok(const struct ckpt_source *s, enum ckpt_part_kind kind,
                            const int32_t h[LLMC_HEADER_INTS], uint64_t *floats)
{
    const struct gpt2_config *c = &s->cfg;
    size_t total = s->stages[0].total;
    if (kind == CKPT_PART_MODEL) {
        *floats = total;
        int32_t want[LLMC_HEADER_INTS];
        struct llmc_model_header mh = llmc_model_header_of(c);
        llmc_model_header_fill(want, &mh);
        return memcmp(h, want, 16 * sizeof *h) == 0; /* (ints 8..15: a Llama's, experts') */
    }
    size_t count = (size_t)(uint32_t)h[2] | (size_t)(uint32_t)h[3] << 32;
    *floats = (uint64_t)count * (h[4] ? 3 : 2); /* m, v and, mid-step, the gradients */
    return h[0] == CKPT_OPTIM_MAGIC && h[1] == CKPT_OPTIM_VERSION && count == total &&
           (h[4] != 0) == (s->micro > 0);
}

/* The open file of (kind, tp rank, stage, dp rank: -1 for none), its header
 * checked when first opened. */
static int source_file(struct ckpt_source *s, enum ckpt_part_kind kind, int tr, int st, int d,
                       struct plait_error *err)
{
    const struct ckpt_layout *l = &s->layout;
    /* per part: its whole model and optim files, then each dp rank's optim slice and
     * (ZeRO 3) model slice */
    size_t slot = ((size_t)st * (size_t)l->tp + (size_t)tr) * (size_t)(2 + 2 * l->dp) +
                  (d < 0                     ? (kind == CKPT_PART_MODEL ? 0 : 1)
                   : kind == CKPT_PART_OPTIM ? 2 + (size_t)d
                                             : 2 + (size_t)l->dp + (size_t)d);
    if (s->fds[slot] >= 0) return s->fds[slot];
    char name[64], path[4096];
    source_name(s, kind, tr, st, d, name, sizeof name);
    if (fs_join(path, sizeof path, s->dir, name, err)) return -1;
    int fd = fs_open_regular(path, err);
    if (fd < 0) return -1;
    int32_t h[LLMC_HEADER_INTS], want[LLMC_HEADER_INTS];
    ssize_t got = pread(fd, h, sizeof h, 0);
    const struct gpt2_shard *sh = &s->stages[st];
    bool ok;
    uint64_t floats = 0; /* what the header promises after it */
    if (l->whole) {
        ok = got == (ssize_t)sizeof h && whole_header_ok(s, kind, h, &floats);
    } else {
        /* a slice (ZeRO's moments, ZeRO 3's parameters, ZeRO 2's gradients), or the whole
         * part (by dp rank: an ep rank's, a rank's gradients) */
        int from = kind == CKPT_PART_MODEL ? 3 : kind == CKPT_PART_GRADS ? 2 : 1;
        bool sliced = d >= 0 && l->zero >= from;
        struct ckpt_part_id id = {l->tp,
                                  tr,
                                  l->pp,
                                  st,
                                  l->dp,
                                  d < 0 ? 0 : d,
                                  l->zero,
                                  l->chunks,
                                  sliced ? s->slice[st] : sh->total,
                                  kind == CKPT_PART_OPTIM ? 2 : 1,
                                  sh->part.layer_begin,
                                  sh->part.layer_end};
        ckpt_part_header(want, kind, &id);
        if (got == (ssize_t)sizeof h && h[14] == 0) /* a part from before layer ranges */
            want[14] = want[15] = want[16] = 0;
        ok = got == (ssize_t)sizeof h && memcmp(h, want, sizeof h) == 0;
        floats = (uint64_t)id.count * (uint64_t)id.arrays;
    }
    /* every byte the header promises, and no more: what verify and a load both check */
    struct stat fst;
    uint64_t want_bytes = LLMC_HEADER_BYTES + floats * sizeof(float);
    if (ok && (fstat(fd, &fst) != 0 || (uint64_t)fst.st_size != want_bytes)) {
        close(fd);
        return error_set(err, "%s: %lld bytes, but its header promises %llu: a truncated part",
                         path, (long long)fst.st_size, (unsigned long long)want_bytes);
    }
    if (!ok && l->whole) {
        close(fd);
        return error_set(err,
                         "%s: its header does not say what the plan and state.json do (the "
                         "model's dimensions in fp32; the moments of every parameter, with the "
                         "gradients exactly when it stopped mid-step, here micro-batch %d): not "
                         "this checkpoint's file",
                         path, s->micro);
    }
    if (!ok) {
        close(fd);
        return error_set(err,
                         "%s: its header does not say what the manifest does (tp %d × pp %d × "
                         "dp %d, ZeRO %d, this part's size and layers): not this checkpoint's file",
                         path, l->tp, l->pp, l->dp, l->zero);
    }
    s->fds[slot] = fd;
    return fd;
}

static int read_floats(struct ckpt_source *s, int fd, size_t at, float *out, size_t n,
                       enum ckpt_part_kind kind, int tr, int st, int d, struct plait_error *err)
{
    off_t pos = (off_t)LLMC_HEADER_BYTES + (off_t)at * (off_t)sizeof(float);
    size_t bytes = n * sizeof(float), done = 0;
    while (done < bytes) {
        ssize_t k = pread(fd, (char *)out + done, bytes - done, pos + (off_t)done);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            char name[64];
            source_name(s, kind, tr, st, d, name, sizeof name);
            return k < 0 ? error_errno(err, "%s/%s", s->dir, name)
                         : error_set(err, "%s/%s: ends before byte %lld (truncated)", s->dir, name,
                                     (long long)(pos + (off_t)bytes));
        }
        done += (size_t)k;
    }
    s->bytes_read += (int64_t)bytes;
    return 0;
}

/* n elements from element `local` of tp rank tr's (with expert parallelism: of ep rank
 * er's part) instance (t, l) of array a. */
static int read_source_run(struct ckpt_source *s, enum ckpt_array a, int tr, int st, int er,
                           enum gpt2_tensor t, int l, size_t local, size_t n, float *out,
                           struct plait_error *err)
{
    const struct gpt2_shard *sh = &s->stages[st];
    int fd, d = s->layout.ep > 1 ? er : -1; /* ep's parts are named with their dp rank */
    if (a == CKPT_PARAMS && s->layout.zero < 3) {
        if ((fd = source_file(s, CKPT_PART_MODEL, tr, st, d, err)) < 0) return -1;
        return read_floats(s, fd, gpt2_shard_instance_at(sh, t, l) + local, out, n, CKPT_PART_MODEL,
                           tr, st, d, err);
    }
    size_t k = a == CKPT_ADAM_V; /* the array within an optim file (a model file's one) */
    enum ckpt_part_kind kind = a == CKPT_PARAMS ? CKPT_PART_MODEL : CKPT_PART_OPTIM;
    if (s->layout.zero == 0) {
        if ((fd = source_file(s, CKPT_PART_OPTIM, tr, st, d, err)) < 0) return -1;
        return read_floats(s, fd, k * sh->total + gpt2_shard_instance_at(sh, t, l) + local, out, n,
                           CKPT_PART_OPTIM, tr, st, d, err);
    }
    /* ZeRO: the layer-major buffer cut in dp slices of s->slice[st] (ZeRO 3's parameters
     * too); with ep, ep rank er's over its expert peers, dp ranks er, er + ep, ... */
    size_t o = gpt2_shard_offset(sh, t, l) + local, slice = s->slice[st];
    int ep = s->layout.ep > 1 ? s->layout.ep : 1;
    while (n > 0) {
        int sd = (int)(o / slice) * ep + (ep > 1 ? er : 0); /* the slice's dp rank */
        size_t within = o % slice, c = slice - within < n ? slice - within : n;
        if ((fd = source_file(s, kind, tr, st, sd, err)) < 0 ||
            read_floats(s, fd, k * slice + within, out, c, kind, tr, st, sd, err))
            return -1;
        o += c, out += c, n -= c;
    }
    return 0;
}

struct read_ctx {
    struct ckpt_source *s;
    enum ckpt_array a;
    const struct gpt2_shard *dst;
    size_t lo, hi;
    float *out;
    struct plait_error *err;
};

static int read_instance(void *ctx, enum gpt2_tensor t, int l, size_t off, size_t elems)
{
    struct read_ctx *c = ctx;
    size_t a = off > c->lo ? off : c->lo, b = off + elems < c->hi ? off + elems : c->hi;
    if (a >= b) return 0;
    struct ckpt_source *s = c->s;
    const struct gpt2_shard *dst = c->dst;
    /* the stage that holds it: the tied wte is read from the first; the head from the
     * last (in a V the first: its chunk 1 ends the model) */
    int last = s->layout.v_shape ? 0 : s->layout.pp - 1;
    int st = t == GPT2_WTE || t == GPT2_WPE                            ? 0
             : t == GPT2_LNFW || t == GPT2_LNFB || t == GPT2_LMHEAD ? last
                                                                    : s->layer_stage[l];
    size_t all, ignored; /* the instance at ep 1 (on a tp rank), then whole */
    gpt2_ep_to_all(&dst->cfg, t, dst->part.ep, dst->part.ep_rank, 0, elems, &all, &ignored);
    bool cut = !gpt2_tensor_tp_replicated(t);
    size_t whole = cut ? all * (size_t)dst->part.tp : all; /* tp divides every cut tensor */
    size_t src_all = cut ? whole / (size_t)s->layout.tp : whole;
    size_t src_elems = s->stages[st].elems[t];
    for (size_t i = a - off; i < b - off;) {
        size_t run1, run2, run3, at, local;
        size_t g = gpt2_shard_to_whole(dst, t, i, elems, &run1);
        int tr = gpt2_tp_owner(&s->cfg, t, s->layout.tp, g, whole, &at, &run2);
        int er = gpt2_ep_owner(&s->cfg, t, s->layout.ep, at, src_all, &local, &run3);
        size_t n = b - off - i;
        if (run1 < n) n = run1;
        if (run2 < n) n = run2;
        if (run3 < n) n = run3;
        if (local + n > src_elems)
            return error_set(c->err, "%s: %s of layer %d: the layouts disagree on its size", s->dir,
                             gpt2_tensor_names[t], gpt2_tensor_per_layer(t) ? l : 0);
        if (read_source_run(s, c->a, tr, st, er, t, l, local, n, c->out + (off + i - c->lo),
                            c->err))
            return -1;
        i += n;
    }
    return 0;
}

int ckpt_source_read(struct ckpt_source *s, enum ckpt_array a, const struct gpt2_shard *dst,
                     size_t lo, size_t hi, float *out, struct plait_error *err)
{
    const struct gpt2_config *c = &dst->cfg, *m = &s->cfg;
    if (!gpt2_config_same_tensors(c, m))
        return error_set(err, "%s: its model is not this one", s->dir);
    memset(out, 0, (hi - lo) * sizeof *out);
    struct read_ctx ctx = {s, a, dst, lo, hi, out, err};
    return gpt2_shard_each(dst, read_instance, &ctx) ? -1 : 0;
}

/* Whether manifest.json lists name. */
static int listed(const struct ckpt_manifest *m, const char *dir, const char *name,
                  const struct ckpt_layout *l, struct plait_error *err)
{
    if (ckpt_manifest_find(m, name)) return 0;
    return error_set(err,
                     "%s: manifest.json does not list %s, which a checkpoint of tp %d × pp %d × "
                     "dp %d (ZeRO %d) holds",
                     dir, name, l->tp, l->pp, l->dp, l->zero);
}

int ckpt_source_check(struct ckpt_source *s, struct plait_error *err)
{
    const struct ckpt_layout *l = &s->layout;
    char name[64];
    struct ckpt_manifest man;
    if (ckpt_manifest_read(s->dir, &man, err)) return -1;
    const struct ckpt_manifest *files = &man;
    int rc = listed(files, s->dir, CKPT_STATE, l, err) || listed(files, s->dir, CKPT_PLAN, l, err)
                 ? -1
                 : 0;
    if (l->whole) {
        if (rc == 0)
            rc = listed(files, s->dir, "model.bin", l, err) ||
                         listed(files, s->dir, "optim.bin", l, err) ||
                         source_file(s, CKPT_PART_MODEL, 0, 0, -1, err) < 0 ||
                         source_file(s, CKPT_PART_OPTIM, 0, 0, -1, err) < 0
                     ? -1
                     : 0;
        ckpt_manifest_free(&man);
        return rc;
    }
    for (int st = 0; st < l->pp && rc == 0; st++)
        for (int tr = 0; tr < l->tp && rc == 0; tr++) {
            bool ep = l->ep > 1; /* each ep rank's part (below ZeRO 3, its parameters) */
            int dps = l->zero ? l->dp_shard : ep ? l->ep : 1;
            bool z3 = l->zero == 3, by_dp = l->zero > 0 || ep; /* the parameters in slices */
            for (int d = 0; d < (z3 ? dps : ep ? l->ep : 1) && rc == 0; d++) {
                ckpt_part_name(name, sizeof name, CKPT_PART_MODEL, tr, st, d, z3 || ep);
                rc = listed(files, s->dir, name, l, err) ||
                             source_file(s, CKPT_PART_MODEL, tr, st, z3 || ep ? d : -1, err) < 0
                         ? -1
                         : 0;
            }
            for (int d = 0; d < dps && rc == 0; d++) {
                ckpt_part_name(name, sizeof name, CKPT_PART_OPTIM, tr, st, d, by_dp);
                rc = listed(files, s->dir, name, l, err) ||
                             source_file(s, CKPT_PART_OPTIM, tr, st, by_dp ? d : -1, err) < 0
                         ? -1
                         : 0;
            }
            for (int d = 0; d < l->dp && rc == 0 && s->micro > 0; d++) {
                ckpt_part_name(name, sizeof name, CKPT_PART_GRADS, tr, st, d, true);
                rc = listed(files, s->dir, name, l, err);
            }
        }
    ckpt_manifest_free(&man);
    return rc;
}

int ckpt_verify_all(struct ckptdir *d, const char *name, struct plait_error *why)
{
    char cdir[4096];
    struct ckpt_source src;
    if (fs_join(cdir, sizeof cdir, d->path, name, why) || ckptdir_verify(d, name, why) ||
        ckpt_source_open(&src, cdir, why))
        return -1;
    int rc = ckpt_source_check(&src, why);
    ckpt_source_close(&src);
    return rc;
}
