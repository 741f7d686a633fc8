/* dump.c — step 1's logits and gradients, whole, for the PyTorch referee
 * (PLAIT_DUMP_STEP1): gathered from the ranks' vocabulary and tp × pp × dp
 * shards into llm.c's order. A debugging path: simple, not fast, its buffers
 * outside the model's count. The forward that leaves the logits is the
 * training loop's (train_batches.c). */
#include "runtime/dump.h"

#include <stdlib.h>
#include <string.h>

#include "common/fsutil.h"
#include "common/gpt2/gpt2_layout.h"

/* Writes n host floats to dir/name. */
static int write_floats(const char *dir, const char *name, const float *host, size_t n,
                        struct plait_error *err)
{
    char path[4096];
    if (fs_join(path, sizeof path, dir, name, err) || fs_mkdir_p(dir, err) ||
        fs_write_atomic(path, host, n * sizeof *host, err))
        return error_prefix(err, "PLAIT_DUMP_STEP1: ");
    return 0;
}

float *dump_logits_buffer(struct model *m, int B, int T)
{
    if (!m->last) return NULL;
    return m->logits_out = m->ops->alloc(m->ctx, (size_t)B * T * m->Vpl * sizeof(float));
}

int dump_logits(struct model *m, const char *dir, int B, int T, struct plait_error *err)
{
    if (!m->last) return 0;
    const struct ops *o = m->ops;
    size_t N = (size_t)B * T, Vpl = (size_t)m->Vpl, tp = (size_t)m->tp.size;
    size_t Vp = Vpl * tp;
    float *blocks = malloc(N * Vp * sizeof(float)); /* (tp, N, Vp/tp): rank r's vocabulary shard */
    float *logits = malloc(N * Vp * sizeof(float)); /* (N, Vp) */
    float *gathered = tp > 1 ? o->alloc(m->ctx, N * Vp * sizeof(float)) : NULL;
    int rc = blocks && logits && (tp == 1 || gathered) && m->logits_out
                 ? 0
                 : error_set(err, "out of memory");
    if (rc == 0 && tp > 1) {
        rc = m->tp.allgather(m->tp.ctx, m->logits_out, gathered, N * Vpl, err);
        if (rc == 0) o->download(m->ctx, blocks, gathered, N * Vp * sizeof(float));
    } else if (rc == 0) {
        o->download(m->ctx, blocks, m->logits_out, N * Vp * sizeof(float));
    }
    if (rc == 0 && m->tp.rank == 0 && m->dp_rank == 0 && m->replica == 0) {
        for (size_t r = 0; r < tp; r++) /* rank r holds vocabulary entries [r·Vp/tp, (r+1)·Vp/tp) */
            for (size_t n = 0; n < N; n++)
                memcpy(logits + n * Vp + r * Vpl, blocks + (r * N + n) * Vpl, Vpl * sizeof(float));
        rc = write_floats(dir, "logits.f32", logits, N * Vp, err);
    }
    if (gathered) o->free(m->ctx, gathered);
    if (m->logits_out) o->free(m->ctx, m->logits_out);
    m->logits_out = NULL;
    free(blocks);
    free(logits);
    return rc;
}

struct host_shard {
    const struct gpt2_shard *shard;
    float *buf; /* (shard->total) on the host */
};

/* Zeroes an instance that another rank of the model copy counts (gpt2_shard_counts). */
static int zero_uncounted(void *ctx, enum gpt2_tensor t, int layer, size_t off, size_t n)
{
    (void)layer;
    struct host_shard *h = ctx;
    if (!gpt2_shard_counts(h->shard, t)) memset(h->buf + off, 0, n * sizeof(float));
    return 0;
}

int dump_grads(struct model *m, const struct group *world, const char *dir, struct plait_error *err)
{
    const struct ops *o = m->ops;
    struct gpt2_layout full_layout;
    gpt2_layout(&m->cfg, &full_layout);
    size_t n_full = full_layout.total, n_shard = m->shard.total;
    float *shard = calloc(n_shard, sizeof(float)); /* this rank's part, shard order */
    float *full = calloc(n_full, sizeof(float));   /* its share of the sum, llm.c order */
    float *sum = world->size > 1 ? o->alloc(m->ctx, n_full * sizeof(float)) : NULL;
    int rc = shard && full && (world->size == 1 || sum) ? 0 : error_set(err, "out of memory");
    if (rc) goto out;
    /* ZeRO 2 and 3 hold the step's gradients as this dp rank's slice of the dp sum; below
     * stage 2 every dp rank holds its own micro-batches' whole, summed over the world */
    if (m->zero >= 2) {
        size_t n = m->slice_at >= n_shard                ? 0
                   : m->slice_at + m->slice_n <= n_shard ? m->slice_n
                                                         : n_shard - m->slice_at;
        o->download(m->ctx, shard + m->slice_at, m->grad_slice, n * sizeof(float));
    } else {
        o->download(m->ctx, shard, m->grads, n_shard * sizeof(float));
    }
    gpt2_shard_each(&m->shard, zero_uncounted, &(struct host_shard){&m->shard, shard});
    gpt2_shard_copy(&m->shard, full, shard, false);
    if (world->size > 1) {
        o->upload(m->ctx, sum, full, n_full * sizeof(float));
        rc = world->allreduce(world->ctx, sum, n_full, false, err);
        if (rc) goto out;
        o->download(m->ctx, full, sum, n_full * sizeof(float));
    }
    if (world->rank == 0) rc = write_floats(dir, "grads.f32", full, n_full, err);
    if (!rc && world->size == 1) { /* the weights the step started from (a referee's start) */
        o->download(m->ctx, shard, m->params, n_shard * sizeof(float));
        gpt2_shard_copy(&m->shard, full, shard, false);
        rc = write_floats(dir, "params.f32", full, n_full, err);
    }
out:
    if (sum) o->free(m->ctx, sum);
    free(shard);
    free(full);
    return rc;
}
