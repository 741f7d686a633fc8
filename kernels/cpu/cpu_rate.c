/* cpu_rate.c — the measurement behind cpu_rate.h: short timings of the CPU op
 * table at one rank's shapes (a layer's products, the attention, a layer's
 * memory-bound ops, the optimizer), each the best of a few after a warm-up, and
 * of a tiny op's start; on
 * buffers written first so that no read hits the kernel's shared zero page.
 * What the rates predict is common/place/cost.c's business, not this file's. */
#include "kernels/cpu/cpu_rate.h"

#include <math.h>
#include <omp.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kernels/ops.h" // defines: ops_cpu, the op table measured

/* Timed repetitions: the products take the longest, the others are short. */
enum { MATMUL_REPS = 2, REPS = 3, MAX_BUFS = 64 };
#define FLOP_CAP 1.2e10        /* per repetition of the products (GPT-2 124M's layer at B·T 256) */
#define ATTENTION_FLOP_CAP 2e9 /* per repetition of the attention */
#define BYTES_CAP (64.0 * 1048576)        /* the layer ops' buffers: more than a cache */
#define WEIGHT_BYTES (48.0 * 1048576)     /* the weight sets the products take in turn */
#define OPTIMIZER_BYTES (128.0 * 1048576) /* weights, gradients, moments: 4 × a cache */

/* One measurement's context and buffers, freed together. */
struct bench {
    const struct ops *o;
    struct ops_ctx *ctx;
    void *bufs[MAX_BUFS];
    int n_bufs;
    bool failed;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* n floats in [-0.5, 0.5), written by the threads that will read them; NULL
 * (and b->failed) when out of memory. */
static float *take(struct bench *b, size_t n)
{
    float *p = b->n_bufs < MAX_BUFS ? b->o->alloc(b->ctx, (n ? n : 1) * sizeof *p) : NULL;
    if (!p) {
        b->failed = true;
        return NULL;
    }
    b->bufs[b->n_bufs++] = p;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) p[i] = (float)((i * 2654435761u >> 8) & 0xffff) / 65536 - 0.5f;
    return p;
}

/* bytes, zeroed and not written: for a buffer the warm-up writes first. */
static void *take_unwritten(struct bench *b, size_t bytes)
{
    void *p = b->n_bufs < MAX_BUFS ? b->o->alloc(b->ctx, bytes ? bytes : 1) : NULL;
    if (p) b->bufs[b->n_bufs++] = p;
    b->failed |= !p;
    return p;
}

static void release(struct bench *b)
{
    for (int i = 0; i < b->n_bufs; i++) b->o->free(b->ctx, b->bufs[i]);
    b->n_bufs = 0;
}

/* The least seconds of `reps` runs of round(arg), after one to warm up (page
 * faults, oneDNN's primitives, the thread pool): what the machine does when
 * nothing else runs (on a shared machine noise only ever slows a run down). */
static double best_s(void (*round)(void *arg), void *arg, int reps)
{
    double best = HUGE_VAL;
    round(arg);
    for (int i = 0; i < reps; i++) {
        double t0 = now_s();
        round(arg);
        double t = now_s() - t0;
        best = t < best ? t : best;
    }
    return best;
}

/* ---- the four timings ---------------------------------------------------------------- */

/* A layer's four products, as training runs them: qkv (C → 3w), the
 * attention's projection (w → C), the MLP's two (C → 4w, 4w → C); x is the
 * LayerNorm's output, each product's own output the next one's gradient. As
 * in training, a round's weights are not the last round's: the rounds take
 * the layers' weight sets in turn, as many as hold more than WEIGHT_BYTES. */
enum { QKV, PROJ, FC, FCPROJ, PRODUCTS, MAX_SETS = 4 };

struct matmul_args {
    struct bench *b;
    int rows, in[PRODUCTS], out[PRODUCTS], sets, set;
    float *inp[PRODUCTS], *y[PRODUCTS], *bias[PRODUCTS], *dinp, *db; /* dinp (rows, max(C, 4w)) */
    float *w[MAX_SETS][PRODUCTS], *dw[MAX_SETS][PRODUCTS];
    uint16_t *w16[MAX_SETS][PRODUCTS]; /* bf16 copies, or NULL (fp32) */
};

static void matmul_round(void *arg)
{
    struct matmul_args *a = arg;
    const struct ops *o = a->b->o;
    struct ops_ctx *ctx = a->b->ctx;
    int s = a->set = (a->set + 1) % a->sets;
    for (int k = 0; k < PRODUCTS; k++)
        o->matmul_forward(ctx, a->y[k], a->inp[k], a->w[s][k], a->w16[s][k], a->bias[k], a->rows,
                          a->in[k], a->out[k]);
    for (int k = PRODUCTS - 1; k >= 0; k--)
        o->matmul_backward(ctx, a->dinp, a->dw[s][k], a->db, a->y[k], a->inp[k], a->w[s][k],
                           a->w16[s][k], a->rows, a->in[k], a->out[k], false);
}

/* One set of a layer's weights and their gradients (and bf16 copies). */
static void take_weights(struct bench *b, struct matmul_args *a, int set, bool bf16)
{
    for (int k = 0; k < PRODUCTS && !b->failed; k++) {
        size_t weights = (size_t)a->in[k] * a->out[k];
        a->w[set][k] = take(b, weights), a->dw[set][k] = take(b, weights);
        uint16_t *w16 = bf16 && !b->failed ? take_unwritten(b, weights * 2) : NULL;
        if (w16) b->o->to_bf16(b->ctx, w16, a->w[set][k], weights);
        a->w16[set][k] = w16;
    }
}

/* A layer's products forward and backward: GFLOP/s of 6·rows·12·C·width.
 * Fewer rows when one repetition would pass FLOP_CAP. */
static double matmul_gflops(struct bench *b, const struct cpu_rate_shape *s)
{
    int C = s->hidden, w = s->width;
    double per_row = 6.0 * 12 * C * w, set_bytes = 2.0 * 12 * C * w * sizeof(float);
    int rows = s->rows;
    if (rows * per_row > FLOP_CAP) rows = per_row * 64 > FLOP_CAP ? 64 : (int)(FLOP_CAP / per_row);
    struct matmul_args a = {
        .b = b, .rows = rows, .in = {C, w, C, 4 * w}, .out = {3 * w, C, 4 * w, C}, .sets = 1};
    while (a.sets < MAX_SETS && a.sets < s->layers && a.sets * set_bytes < WEIGHT_BYTES) a.sets++;
    float *x = take(b, (size_t)rows * C), *atty = take(b, (size_t)rows * w);
    /* the widest input (C or 4w) and output (4w or C): C is the wider above tp 4 */
    int widest = C > 4 * w ? C : 4 * w;
    a.dinp = take(b, (size_t)rows * widest), a.db = take(b, (size_t)widest);
    for (int k = 0; k < PRODUCTS; k++)
        a.y[k] = take(b, (size_t)rows * a.out[k]), a.bias[k] = take(b, (size_t)a.out[k]);
    for (int set = 0; set < a.sets; set++) take_weights(b, &a, set, s->bf16);
    a.inp[QKV] = a.inp[FC] = x, a.inp[PROJ] = atty, a.inp[FCPROJ] = a.y[FC];
    double s_round = b->failed ? 0 : best_s(matmul_round, &a, MATMUL_REPS);
    release(b);
    return s_round > 0 ? rows * per_row / s_round / 1e9 : 0;
}

struct attention_args {
    struct bench *b;
    float *qkv, *out, *att, *dqkv, *datt; /* qkv (B,T,3w), out (B,T,w), att (B,NH,T,T) */
    int B, T, width, heads;
};

static void attention_round(void *arg)
{
    struct attention_args *a = arg;
    const struct ops *o = a->b->o;
    o->attention_forward(a->b->ctx, a->out, a->att, a->qkv, a->B, a->T, a->width, a->heads);
    o->attention_backward(a->b->ctx, a->dqkv, a->datt, a->out, a->qkv, a->att, a->B, a->T, a->width,
                          a->heads);
}

/* The attention forward and backward: GFLOP/s as 12·B·T²·width. Fewer
 * sequences, then fewer heads (of the same size), when one repetition would
 * pass ATTENTION_FLOP_CAP or its probabilities and their gradient BYTES_CAP
 * (small heads make many probabilities per FLOP: the measurement must not be
 * what sets a rank's peak memory), and a shorter sequence when one head's
 * would. */
static double attention_gflops(struct bench *b, const struct cpu_rate_shape *s)
{
    int T = s->seq_len, hs = s->width / (s->heads > 0 ? s->heads : 1), heads = s->heads, B = 1;
    while (T > 16 && 8.0 * T * T > BYTES_CAP) T /= 2;
    double per_head = 12.0 * T * T * hs, head_bytes = 8.0 * T * T; /* att and datt, fp32 */
    double cap = fmin(ATTENTION_FLOP_CAP / per_head, BYTES_CAP / head_bytes);
    if (heads > cap) heads = cap < 1 ? 1 : (int)cap;
    while (B < s->batch && (B + 1.0) * heads <= cap) B++;
    struct attention_args a = {.b = b, .B = B, .T = T, .width = heads * hs, .heads = heads};
    size_t tokens = (size_t)B * T, probs = (size_t)B * heads * T * T;
    a.qkv = take(b, tokens * 3 * a.width), a.dqkv = take(b, tokens * 3 * a.width);
    a.out = take(b, tokens * a.width), a.att = take(b, probs), a.datt = take(b, probs);
    double s_round = b->failed ? 0 : best_s(attention_round, &a, REPS);
    release(b);
    return s_round > 0 ? B * heads * per_head / s_round / 1e9 : 0;
}

struct layer_args {
    struct bench *b;
    float *x, *ln, *res, *dres, *dln, *stats, *fch, *gelu, *dfch, *lw, *lb, *dw, *db;
    int rows, C, W; /* W = 4·width, the MLP's */
};

/* What a layer runs besides its products and attention, each op once: 2
 * LayerNorms forward and backward, 2 residual adds, GELU forward and backward. */
static void layer_round(void *arg)
{
    struct layer_args *a = arg;
    const struct ops *o = a->b->o;
    struct ops_ctx *ctx = a->b->ctx;
    size_t nc = (size_t)a->rows * a->C, nw = (size_t)a->rows * a->W;
    float *mean = a->stats, *rstd = a->stats + a->rows;
    o->layernorm_forward(ctx, a->ln, mean, rstd, a->x, a->lw, a->lb, a->rows, a->C);
    o->residual_forward(ctx, a->res, a->x, a->ln, nc);
    o->layernorm_forward(ctx, a->ln, mean, rstd, a->res, a->lw, a->lb, a->rows, a->C);
    o->gelu_forward(ctx, a->gelu, a->fch, nw);
    o->residual_forward(ctx, a->res, a->res, a->ln, nc);
    o->gelu_backward(ctx, a->dfch, a->fch, a->gelu, nw);
    o->layernorm_backward(ctx, a->dres, a->dw, a->db, a->dln, a->res, a->lw, mean, rstd, a->rows,
                          a->C, false);
    o->layernorm_backward(ctx, a->dres, a->dw, a->db, a->dln, a->x, a->lw, mean, rstd, a->rows,
                          a->C, false);
}

/* A layer's memory-bound ops over the rows of all the rank's layers (its
 * activations, as far as BYTES_CAP: more than a cache, as in training): GB/s
 * of (18·C + 20·width)·4 bytes per row — LayerNorm forward reads and writes a
 * row (2C values), backward reads the gradient and input and updates the
 * input's gradient (4C), a residual add reads two and writes one (3C), GELU
 * forward 2 and backward 3 values per element of the 4·width. */
static double activation_gbps(struct bench *b, const struct cpu_rate_shape *s)
{
    int C = s->hidden, W = 4 * s->width;
    double row_bytes = (5.0 * C + 3.0 * W + 2) * sizeof(float); /* the buffers below */
    double rows = (double)s->rows * (s->layers > 0 ? s->layers : 1);
    if (rows * row_bytes > BYTES_CAP) rows = BYTES_CAP / row_bytes;
    struct layer_args a = {.b = b, .rows = rows < 64 ? 64 : (int)rows, .C = C, .W = W};
    size_t nc = (size_t)a.rows * C, nw = (size_t)a.rows * W;
    a.x = take(b, nc), a.ln = take(b, nc), a.res = take(b, nc), a.dres = take(b, nc);
    a.dln = take(b, nc), a.stats = take(b, 2 * (size_t)a.rows);
    a.fch = take(b, nw), a.gelu = take(b, nw), a.dfch = take(b, nw);
    a.lw = take(b, C), a.lb = take(b, C), a.dw = take(b, C), a.db = take(b, C);
    double s_round = b->failed ? 0 : best_s(layer_round, &a, REPS);
    release(b);
    return s_round > 0 ? a.rows * (18.0 * C + 20.0 * s->width) * sizeof(float) / s_round / 1e9 : 0;
}

struct optimizer_args {
    struct bench *b;
    float *p, *g, *m, *v;
    uint16_t *p16;
    size_t n;
};

/* The optimizer step as optim.c runs it: the gradient's sum of squares (for
 * its norm), then AdamW. */
static void optimizer_round(void *arg)
{
    struct optimizer_args *a = arg;
    double sum;
    const float *g = a->g;
    a->b->o->sum_squares(a->b->ctx, &sum, &g, &a->n, 1);
    a->b->o->adamw(a->b->ctx, a->p, a->p16, a->g, a->m, a->v, a->n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f,
                   1.0f, 1);
}

/* The optimizer's pass over the rank's parameters (as many as fit in
 * OPTIMIZER_BYTES, no fewer than 64k: a model whose state a cache holds is
 * measured in the cache), GB/s of the bytes cost.c counts for it: AdamW
 * reads and writes the weights and both moments and reads the gradients,
 * 2·(4 + 8) + 4 bytes a parameter, 2·(6 + 8) + 4 with the bf16 copy; the
 * norm reads the gradients, 4 more. The weights and moments are not written
 * first: the warm-up's writes fault them in. */
static double memory_gbps(struct bench *b, const struct cpu_rate_shape *s)
{
    double n = s->params < OPTIMIZER_BYTES / 16 ? s->params : OPTIMIZER_BYTES / 16;
    struct optimizer_args a = {.b = b, .n = n > 65536 ? (size_t)n : 65536};
    a.g = take(b, a.n);
    a.p = take_unwritten(b, a.n * sizeof(float));
    a.m = take_unwritten(b, a.n * sizeof(float));
    a.v = take_unwritten(b, a.n * sizeof(float));
    if (s->bf16) a.p16 = take_unwritten(b, a.n * sizeof *a.p16);
    double s_round = b->failed ? 0 : best_s(optimizer_round, &a, REPS);
    release(b);
    return s_round > 0 ? (double)a.n * (s->bf16 ? 36 : 32) / s_round / 1e9 : 0;
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* What an op costs beyond its work: a residual add of 4096 values (well under
 * a microsecond of work) right after a small product, as most of training's
 * ops follow one: its threads, asleep since the product's region ended
 * (plait's OMP_WAIT_POLICY=PASSIVE), are woken and joined again. The median
 * of 31, µs. */
static double parallel_op_us(struct bench *b)
{
    enum { N = 4096, K = 64, OPS = 31 };
    float *x = take(b, 2 * N), *w = take(b, K * K), *y = take(b, K * K);
    double t[OPS];
    for (int i = 0; i < OPS && !b->failed; i++) {
        b->o->matmul_forward(b->ctx, y, w, w, NULL, NULL, K, K, K);
        double t0 = now_s();
        b->o->residual_forward(b->ctx, x + N, x, x + N, N);
        t[i] = 1e6 * (now_s() - t0);
    }
    release(b);
    if (b->failed) return 0;
    qsort(t, OPS, sizeof *t, by_value);
    return t[OPS / 2];
}

/* ---- the measurement ----------------------------------------------------------------- */

/* The CPUs the OpenMP threads run on: no more than the process may use. */
static int cpus_used(void)
{
    int threads = omp_get_max_threads();
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) < threads)
        return CPU_COUNT(&set);
    return threads > 0 ? threads : 1;
}

static void measure_all(struct bench *b, const struct cpu_rate_shape *s, struct cpu_rate *out)
{
    out->cpus = cpus_used();
    out->matmul_gflops = matmul_gflops(b, s) / out->cpus;
    out->attention_gflops = attention_gflops(b, s) / out->cpus;
    out->activation_gbps = activation_gbps(b, s) / out->cpus;
    out->memory_gbps = memory_gbps(b, s) / out->cpus;
    out->parallel_op_us = parallel_op_us(b);
}

struct cpu_rate_shape cpu_rate_shape_of(int B, int T, int C, int NH, int layers, int vocab, int tp,
                                        int pp, bool bf16)
{
    tp = tp > 0 ? tp : 1, pp = pp > 0 ? pp : 1;
    int stage_layers = (layers + pp - 1) / pp;
    return (struct cpu_rate_shape){.rows = B * T,
                                   .batch = B,
                                   .seq_len = T,
                                   .hidden = C,
                                   .width = C / tp,
                                   .heads = NH / tp,
                                   .layers = stage_layers,
                                   .params =
                                       12.0 * C * (C / tp) * stage_layers + (double)vocab / tp * C,
                                   .bf16 = bf16};
}

int cpu_rate_measure(const struct cpu_rate_shape *shape, int threads, struct cpu_rate *out,
                     char *errbuf, size_t errbuf_bytes)
{
    double t0 = now_s();
    const struct cpu_rate_shape *s = shape;
    *out = (struct cpu_rate){0};
    if (s->rows < 1 || s->batch < 1 || s->seq_len < 1 || s->hidden < 1 || s->width < 1 ||
        s->heads < 1 || s->width % s->heads) {
        if (errbuf && errbuf_bytes)
            snprintf(errbuf, errbuf_bytes,
                     "cpu rate: no such shape (%d rows, C %d, width %d, %d heads)", s->rows,
                     s->hidden, s->width, s->heads);
        return -1;
    }
    struct bench b = {.o = ops_cpu()};
    if (!(b.ctx = b.o->open(0, errbuf, errbuf_bytes))) return -1;
    int was = omp_get_max_threads();
    if (threads > 0) omp_set_num_threads(threads);
    measure_all(&b, s, out);
    omp_set_num_threads(was);
    char msg[256];
    int rc = b.o->take_error(b.ctx, msg, sizeof msg);
    if (rc == 0 && b.failed) snprintf(msg, sizeof msg, "out of memory"), rc = -1;
    if (rc && errbuf && errbuf_bytes) snprintf(errbuf, errbuf_bytes, "cpu rate: %s", msg);
    b.o->close(b.ctx);
    out->seconds = now_s() - t0;
    return rc ? -1 : 0;
}
