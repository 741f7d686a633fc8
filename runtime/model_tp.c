/* model_tp.c — a model's tensor-parallel collectives: sums and maxima over the
 * tp group, sequence parallelism's gathers and reduce-scatters of the residual
 * stream's rows, the row-parallel product summed over the group, and the
 * LayerNorms' gradients summed over it. The products themselves are
 * model_weights.c's. */
#include "runtime/model_tp.h"

#include <stdlib.h>

#include "runtime/model_moe.h" // defines: model_tp_allreduce
#include "runtime/model_weights.h"

/* ---- tensor parallelism ------------------------------------------------------------ */

/* The rows of the residual stream this rank holds of N: N/tp sequence parallel. */
int model_rows_of(const struct model *m, int N)
{
    return m->sp ? N / m->tp.size : N;
}

/* Sums (or maxes) n floats of buf over the tp group: a no-op without one. */
int model_tp_reduce(struct model *m, float *buf, size_t n, bool max, struct plait_error *err)
{
    if (m->tp.size == 1) return 0;
    if (m->tp.allreduce(m->tp.ctx, buf, n, max, err))
        return error_prefix(err, "tensor-parallel all-reduce: ");
    return 0;
}

int model_tp_allreduce(struct model *m, float *buf, size_t n, struct plait_error *err)
{
    return model_tp_reduce(m, buf, n, false, err);
}

/* Sequence parallelism's two collectives over (N,C) row blocks, R = N/tp
 * rows a rank. The residual stream's rows (R,C) -> *whole (N,C), every
 * rank's block in rank order, in m->whole (without sequence parallelism the
 * rows are already whole: *whole = rows). */
int model_sp_gather_into(struct model *m, const float *rows, int N, float *into,
                         const float **whole, struct plait_error *err)
{
    *whole = rows;
    if (!m->sp) return 0;
    size_t RC = (size_t)(N / m->tp.size) * m->cfg.hidden;
    if (m->tp.allgather(m->tp.ctx, rows, into, RC, err))
        return error_prefix(err, "sequence-parallel all-gather: ");
    *whole = into;
    return 0;
}

int model_sp_gather(struct model *m, const float *rows, int N, const float **whole,
                    struct plait_error *err)
{
    return model_sp_gather_into(m, rows, N, m->whole, whole, err);
}

int model_sp_gather_act(struct model *m, struct act rows, int N, struct act *whole,
                        struct plait_error *err)
{
    *whole = rows;
    if (!m->sp) return 0;
    if (rows.f32) {
        const float *gathered;
        if (model_sp_gather_into(m, rows.f32, N, m->whole, &gathered, err)) return -1;
        whole->f32 = m->whole;
        return 0;
    }
    size_t RC = (size_t)(N / m->tp.size) * m->cfg.hidden;
    whole->bf16 = (uint16_t *)m->whole; /* (N,C) floats' room holds (N,C) bf16 */
    if (m->tp.allgather16(m->tp.ctx, rows.bf16, whole->bf16, RC, err))
        return error_prefix(err, "sequence-parallel all-gather: ");
    return 0;
}

/* partial (N,C) summed over the group, this rank's R rows of the sum into
 * rows (R,C), another buffer. */
int model_sp_scatter(struct model *m, const float *partial, float *rows, int N,
                     struct plait_error *err)
{
    size_t RC = (size_t)(N / m->tp.size) * m->cfg.hidden;
    if (m->tp.reduce_scatter(m->tp.ctx, partial, rows, RC, err))
        return error_prefix(err, "sequence-parallel reduce-scatter: ");
    return 0;
}

/* partial (N,C), this rank's term of a sum over the group (a row-parallel
 * product, the input gradient of a column-parallel one) -> *rows: the sum's
 * rows this rank holds, (N,C) in place (all-reduce) or, sequence parallel,
 * its R rows in m->whole (reduce-scatter). */
int model_tp_sum_rows(struct model *m, float *partial, int N, float **rows, struct plait_error *err)
{
    *rows = m->sp ? m->whole : partial;
    return m->sp ? model_sp_scatter(m, partial, m->whole, N, err)
                 : model_tp_reduce(m, partial, (size_t)N * m->cfg.hidden, false, err);
}

/* *out = inp (N,in_cols) · wᵀ + bias for a row-parallel weight, on this
 * rank's rows of the residual stream: the partial product into m->proj, its
 * sum over the group, then the bias once (fused without tp). */
int model_row_parallel_forward(struct model *m, float **out, struct act inp, enum gpt2_tensor w,
                               enum gpt2_tensor bias, int l, int N, int in_cols,
                               struct plait_error *err)
{
    const struct ops *o = m->ops;
    int C = m->cfg.hidden;
    float *prod = m->proj;
    struct profile *pr = &m->prof;
    *out = prod;
    const float *b = model_held(m, PARAMS, bias, l);
    if (m->tp.size == 1) {
        PROF(pr, PROF_MATMUL_FWD, model_linear_forward(m, prod, inp, w, l, b, N, in_cols, C));
        return 0;
    }
    PROF(pr, PROF_MATMUL_FWD, model_linear_forward(m, prod, inp, w, l, NULL, N, in_cols, C));
    if (model_tp_sum_rows(m, prod, N, out, err)) return -1;
    if (b) PROF(pr, PROF_MATMUL_FWD, o->add_bias(m->ctx, *out, b, model_rows_of(m, N), C));
    return 0;
}

/* The LayerNorm tensors' instances in the shard, (offset, elements) pairs. */
struct ln_list {
    size_t (*at)[2];
    int n;
};

static int ln_instance(void *ctx, enum gpt2_tensor t, int layer, size_t off, size_t n)
{
    (void)layer;
    struct ln_list *l = ctx;
    if (t == GPT2_LN1W || t == GPT2_LN1B || t == GPT2_LN2W || t == GPT2_LN2B || t == GPT2_LNFW ||
        t == GPT2_LNFB) {
        l->at[l->n][0] = off;
        l->at[l->n++][1] = n;
    }
    return 0;
}

static int by_offset(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return (x > y) - (x < y);
}

int model_sum_layernorm_grads(struct model *m, struct plait_error *err)
{
    return model_sum_layernorm_grads_in(m, m->grads, 0, m->shard.total, err);
}

/* One all-reduce for each run of adjacent instances in the buffer (a layer's
 * weight and bias lie together), cut to [lo, lo + n). */
int model_sum_layernorm_grads_in(struct model *m, float *buf, size_t lo, size_t n,
                                 struct plait_error *err)
{
    if (!m->sp) return 0;
    struct ln_list l = {malloc((4 * (size_t)gpt2_shard_layers(&m->shard) + 2) * sizeof *l.at), 0};
    if (!l.at) return error_set(err, "out of memory");
    gpt2_shard_each(&m->shard, ln_instance, &l);
    qsort(l.at, (size_t)l.n, sizeof *l.at, by_offset);
    int rc = 0;
    for (int i = 0; i < l.n && rc == 0;) {
        size_t off = l.at[i][0], run = 0;
        for (; i < l.n && l.at[i][0] == off + run; i++) run += l.at[i][1];
        size_t a = off > lo ? off : lo, b = off + run < lo + n ? off + run : lo + n;
        if (b > a) rc = model_tp_reduce(m, buf + (a - lo), b - a, false, err);
    }
    free(l.at);
    return rc ? error_prefix(err, "the LayerNorms' gradients: ") : 0;
}
