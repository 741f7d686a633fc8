/* ring_attention.c — context parallelism's part of a model's passes
 * (ring_attention.h): the chunks' positions, the embedding and rotary
 * positions by chunk, and the ring attention over kernels/ops.h's one block
 * at a time ops. Not here: the ring's ranks (runtime/parallel.c), the data a
 * rank reads (runtime/train_batches.c takes its chunks with ring_take_chunks). */
#include "runtime/ring_attention.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/ops.h"
#include "runtime/model.h"

enum { TAG_KV = 0x43500001, TAG_DKV = 0x43500002 }; /* the two shifts in flight at once */

int ring_chunk(int cp, int r, int half)
{
    return half ? 2 * cp - 1 - r : r;
}

void ring_positions(int32_t *pos, int T, int cp, int r)
{
    int h = T / 2;
    for (int t = 0; t < h; t++) {
        pos[t] = ring_chunk(cp, r, 0) * h + t;
        pos[h + t] = ring_chunk(cp, r, 1) * h + t;
    }
}

void ring_chunks(int32_t *mine, const int32_t *whole, int B, int T, int cp, int r)
{
    int h = T / 2;
    for (int b = 0; b < B; b++) {
        const int32_t *seq = whole + (size_t)b * T * cp;
        for (int half = 0; half < 2; half++)
            memcpy(mine + (size_t)b * T + (size_t)half * h,
                   seq + (size_t)ring_chunk(cp, r, half) * h, (size_t)h * sizeof *mine);
    }
}

int ring_init(struct model *m, struct plait_error *err)
{
    const struct ops *o = m->ops;
    if (!o->attention_block_forward || !o->attention_block_backward)
        return error_set(err, "parallel.cp %d: the %s backend has no block attention", m->cp,
                         o->name);
    if (m->T % 2 || !m->cp_group || m->cp_group->size != m->cp || !m->cp_group->ishift)
        return error_set(err, "model: context parallelism over %d ranks with %d tokens a rank",
                         m->cp, m->T);
    int32_t *pos = malloc((size_t)m->cp * m->T * sizeof *pos);
    if (!pos) return error_set(err, "out of memory");
    for (int r = 0; r < m->cp; r++) ring_positions(pos + (size_t)r * m->T, m->T, m->cp, r);
    o->upload(m->ctx, m->cp_pos, pos, (size_t)m->cp * m->T * sizeof *pos);
    free(pos);
    return 0;
}

/* Where chunk `half` (0, 1) of this rank starts in the whole sequence */
static int chunk_start(const struct model *m, int half, int T)
{
    return ring_chunk(m->cp, m->cp_rank, half) * (T / 2);
}

void ring_encoder_forward(struct model *m, float *out, const int32_t *tokens, const float *wte,
                          const float *wpe, int B, int T)
{
    int C = m->cfg.hidden, h = T / 2;
    for (int b = 0; b < B; b++)
        for (int half = 0; half < 2; half++) {
            size_t row = (size_t)b * T + (size_t)half * h;
            m->ops->encoder_forward(m->ctx, out + row * C, tokens + row, wte, m->v0, m->Vpl,
                                    wpe ? wpe + (size_t)chunk_start(m, half, T) * C : NULL, 1, h,
                                    C);
        }
}

void ring_encoder_backward(struct model *m, float *dwte, float *dwpe, const float *dout,
                           const int32_t *tokens, int B, int T, bool accumulate)
{
    int C = m->cfg.hidden, h = T / 2;
    /* the rank's positions are some of wpe's rows: the others written as zeros */
    if (dwpe && !accumulate) m->ops->zero(m->ctx, dwpe, m->shard.elems[GPT2_WPE] * sizeof(float));
    for (int b = 0; b < B; b++)
        for (int half = 0; half < 2; half++) {
            size_t row = (size_t)b * T + (size_t)half * h;
            m->ops->encoder_backward(m->ctx, dwte, m->v0, m->Vpl,
                                     dwpe ? dwpe + (size_t)chunk_start(m, half, T) * C : NULL,
                                     dout + row * C, tokens + row, 1, h, C, true);
        }
}

void ring_rope(struct model *m, float *x, float *expanded, int B, int T, bool backward)
{
    const struct ops *o = m->ops;
    int h = T / 2, width = m->QKVl;
    size_t wide = 3 * (size_t)m->Cl;
    double theta = m->cfg.rope_theta;
    for (int b = 0; b < B; b++)
        for (int half = 0; half < 2; half++) {
            size_t row = (size_t)b * T + (size_t)half * h;
            float *rows = x + row * width, *ex = expanded ? expanded + row * wide : NULL;
            int pos0 = chunk_start(m, half, T);
            if (ex && backward)
                o->rope_kv_expand_backward(m->ctx, rows, ex, 1, h, m->NHl, m->KVl, m->hs, theta,
                                           pos0);
            else if (ex)
                o->rope_kv_expand(m->ctx, ex, rows, 1, h, m->NHl, m->KVl, m->hs, theta, pos0);
            else
                (backward ? o->rope_backward : o->rope_forward)(m->ctx, rows, 1, h, m->NHl, m->KVl,
                                                                m->hs, theta, pos0);
        }
}

/* k and v of each of the N rows of qkv (N,3C/tp) into kv (N,2C/tp), or back
 * from kv into dqkv's k and v columns */
static void kv_columns(struct model *m, float *to, const float *from, int N, bool pack)
{
    size_t Cl = (size_t)m->Cl * sizeof(float), kv = 2 * Cl, qkv = 3 * Cl;
    if (pack)
        m->ops->copy_rows(m->ctx, to, kv, (const char *)from + Cl, qkv, kv, (size_t)N);
    else
        m->ops->copy_rows(m->ctx, (char *)to + Cl, qkv, from, kv, kv, (size_t)N);
}

/* A shift around the ring in flight: its send's and its receive's requests */
struct shift {
    void *send, *recv;
};

static int shift_wait(struct model *m, struct shift *s, struct plait_error *err);

static int shift_start(struct model *m, struct shift *s, const float *send, float *recv, size_t n,
                       uint32_t tag, struct plait_error *err)
{
    const struct group *g = m->cp_group;
    if (g->ishift(g->ctx, send, recv, n, tag, &s->send, &s->recv, err)) return -1;
    return m->cp_serial ? shift_wait(m, s, err) : 0; /* (a benchmark's: nothing overlaps) */
}

/* Both halves waited for, both freed whatever happens; 0 for a shift never started */
static int shift_wait(struct model *m, struct shift *s, struct plait_error *err)
{
    const struct group *g = m->cp_group;
    struct plait_error second;
    int a = s->send ? g->wait(s->send, err) : 0;
    int b = s->recv ? g->wait(s->recv, a ? &second : err) : 0;
    *s = (struct shift){0};
    return a || b ? -1 : 0;
}

static const int32_t *positions(const struct model *m, int r)
{
    return m->cp_pos + (size_t)r * m->T;
}

int ring_attention_forward(struct model *m, struct layer_acts *a, int B, int T,
                           struct plait_error *err)
{
    int Cl = m->Cl, N = B * T, cp = m->cp, me = m->cp_rank;
    size_t n = (size_t)N * 2 * (size_t)Cl;
    float *kv[2] = {m->cp_ring, m->cp_ring + n};
    kv_columns(m, kv[0], a->qkv, N, true);
    for (int s = 0; s < cp; s++) {
        struct shift next = {0};
        /* the next block arrives while this one is worked on */
        if (s + 1 < cp && shift_start(m, &next, kv[s % 2], kv[(s + 1) % 2], n, TAG_KV, err)) {
            shift_wait(m, &next, &(struct plait_error){0});
            return -1;
        }
        m->ops->attention_block_forward(m->ctx, a->atty, a->att, m->cp_scores, a->qkv, 3 * Cl,
                                        kv[s % 2], positions(m, me),
                                        positions(m, (me - s + cp) % cp), B, T, T, Cl, m->NHl,
                                        s == 0);
        if (shift_wait(m, &next, err)) return -1;
    }
    return 0;
}

/* Step s of the backward ring: the block of cp rank src, its key/value
 * gradient's partial sum so far in part (the rank's own term added there) */
static void block_backward(struct model *m, struct layer_acts *a, float *dqkv, float *dkv,
                           const float *dout, const float *kv, int src, int B, int T)
{
    m->ops->attention_block_backward(m->ctx, dqkv, dkv, m->cp_scores, dout, a->qkv, 3 * m->Cl, kv,
                                     a->atty, a->att, positions(m, m->cp_rank),
                                     positions(m, src), B, T, T, m->Cl, m->NHl);
}

int ring_attention_backward(struct model *m, struct layer_acts *a, float *dqkv,
                            const float *dout, int B, int T, struct plait_error *err)
{
    const struct ops *o = m->ops;
    int Cl = m->Cl, N = B * T, cp = m->cp, me = m->cp_rank;
    size_t n = (size_t)N * 2 * (size_t)Cl;
    float *kv[2] = {m->cp_ring, m->cp_ring + n}, *part[2] = {kv[1] + n, kv[1] + 2 * n};
    float *mine = kv[1] + 3 * n;
    struct shift kvs = {0}, dkvs = {0};
    o->zero(m->ctx, dqkv, (size_t)N * 3 * Cl * sizeof(float));
    kv_columns(m, kv[0], a->qkv, N, true);
    int rc = -1;
    for (int s = 0; s < cp; s++) {
        int src = (me - s + cp) % cp;
        if (s + 1 < cp && shift_start(m, &kvs, kv[s % 2], kv[(s + 1) % 2], n, TAG_KV, err))
            goto out;
        if (s == 0) { /* the own block's term starts its sum */
            o->zero(m->ctx, part[0], n * sizeof(float));
            block_backward(m, a, dqkv, part[0], dout, kv[0], src, B, T);
        } else { /* this rank's term, then the sum so far from the previous rank */
            o->zero(m->ctx, mine, n * sizeof(float));
            block_backward(m, a, dqkv, mine, dout, kv[s % 2], src, B, T);
            if (shift_wait(m, &dkvs, err)) goto out;
            o->residual_forward(m->ctx, part[s % 2], part[s % 2], mine, n);
        }
        /* on to the next rank; after the last step it is the block's own rank */
        if (shift_start(m, &dkvs, part[s % 2], part[(s + 1) % 2], n, TAG_DKV, err) ||
            shift_wait(m, &kvs, err))
            goto out;
    }
    if (shift_wait(m, &dkvs, err)) goto out;
    kv_columns(m, dqkv, part[cp % 2], N, false);
    rc = 0;
out:
    if (rc) {
        struct plait_error ignored;
        shift_wait(m, &kvs, &ignored);
        shift_wait(m, &dkvs, &ignored);
    }
    return rc;
}
