/* fp8_bench.c — the fp8 matrix products against the bf16 ones on this
 * machine's GPU, through kernels/ops.h's CUDA backend, for GPT-2 124M's four
 * block products (qkv, attention projection, fc, fc projection; C = 768) at
 * micro-batch 16 × 1024 tokens: forward, input gradient and weight gradient,
 * each as training runs it (the activations' bf16 rounding or fp8
 * quantisation included, the weight's copy made beforehand, as the optimizer
 * step does). Prints the median time of each and the ratio bf16 / fp8 (the
 * goal: 1.3 or more over the step's products). The LM head stays fp32 in fp8
 * training and is left out. Not a test: it asserts nothing.
 *
 *   fp8-bench [tensor|block] [--reps N]   exit 77 without a GPU with fp8 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/rng.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/ops.h"

enum { B = 16, T = 1024, C = 768, N = B * T };

struct product {
    const char *name;
    int in, out; /* the weight (out, in) */
};

static const struct product products[] = {
    {"qkv", C, 3 * C}, {"attproj", C, C}, {"fc", C, 4 * C}, {"fcproj", 4 * C, C}};
#define N_PRODUCTS (sizeof products / sizeof products[0])

static struct ops_ctx *cx; /* GPU 0's context: the one this program uses */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* device buffers of one product: inputs random, outputs scratch */
struct bufs {
    float *x, *w, *dy, *y, *dx, *dw, *bias, *db, *w_scales;
    uint16_t *w16;
    uint8_t *w8;
};

static void *must(const struct ops *o, size_t bytes)
{
    void *p = o->alloc(cx, bytes);
    if (!p) {
        char msg[512] = "";
        o->take_error(cx, msg, sizeof msg);
        fprintf(stderr, "fp8-bench: out of GPU memory for %zu bytes: %s\n", bytes, msg);
        exit(1);
    }
    return p;
}

static float *random_dev(const struct ops *o, struct rng *r, size_t n, float scale)
{
    float *h = malloc(n * sizeof *h), *d = must(o, n * sizeof *h);
    if (!h) exit(1);
    for (size_t i = 0; i < n; i++) h[i] = (float)rng_normal(r) * scale;
    o->upload(cx, d, h, n * sizeof *h);
    free(h);
    return d;
}

/* one pass (fwd 0, dinp 1, dw 2) of one product */
static void run(const struct ops *o, const struct product *p, struct bufs *b, bool fp8,
                enum fp8_scaling sc, int pass)
{
    if (pass == 0 && fp8)
        o->matmul_forward_fp8(cx, b->y, b->x, b->w8, b->w_scales, b->bias, N, p->in, p->out, sc);
    else if (pass == 0)
        o->matmul_forward(cx, b->y, b->x, b->w, b->w16, b->bias, N, p->in, p->out);
    else if (fp8)
        o->matmul_backward_fp8(cx, pass == 1 ? b->dx : NULL, pass == 2 ? b->dw : NULL,
                               pass == 2 ? b->db : NULL, b->dy, b->x, b->w8, b->w_scales, N, p->in,
                               p->out, false, sc);
    else
        o->matmul_backward(cx, pass == 1 ? b->dx : NULL, pass == 2 ? b->dw : NULL,
                           pass == 2 ? b->db : NULL, b->dy, b->x, b->w, b->w16, N, p->in, p->out,
                           false);
}

/* Seconds a pass takes: the median over 5 batches of reps back-to-back runs
 * (a batch waits for the GPU once, at its end), after 3 warm-up runs. */
static double timed(const struct ops *o, const struct product *p, struct bufs *b, bool fp8,
                    enum fp8_scaling sc, int pass, int reps)
{
    double t[5];
    float first;
    for (int i = 0; i < 3; i++) run(o, p, b, fp8, sc, pass);
    for (int k = 0; k < 5; k++) {
        o->download(cx, &first, b->y, sizeof first); /* waits for earlier work */
        double t0 = now_s();
        for (int i = 0; i < reps; i++) run(o, p, b, fp8, sc, pass);
        o->download(cx, &first, pass == 0 ? b->y : pass == 1 ? b->dx : b->dw, sizeof first);
        t[k] = (now_s() - t0) / reps;
    }
    char msg[512];
    if (o->take_error(cx, msg, sizeof msg)) {
        fprintf(stderr, "fp8-bench: %s %s: %s\n", p->name, fp8 ? "fp8" : "bf16", msg);
        exit(1);
    }
    qsort(t, 5, sizeof *t, cmp);
    return t[2];
}

int main(int argc, char **argv)
{
    enum fp8_scaling sc = FP8_SCALING_TENSOR;
    int reps = 20;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "block"))
            sc = FP8_SCALING_BLOCK;
        else if (!strcmp(argv[i], "tensor"))
            sc = FP8_SCALING_TENSOR;
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc && atoi(argv[i + 1]) > 0)
            reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: fp8-bench [tensor|block] [--reps N]\n");
            return 2;
        }
    }
    char why[512] = "";
    const struct ops *o =
        ops_cuda_device_count(why, sizeof why) > 0 ? ops_cuda(why, sizeof why) : NULL;
    if (o && !(cx = o->open(0, why, sizeof why))) o = NULL;
    if (!o) {
        printf("fp8-bench: no GPU here (%s); nothing measured\n", why);
        return 77;
    }
    if (!o->matmul_forward_fp8) {
        printf("fp8-bench: GPU 0 has no fp8 tensor cores (sm_89 and later); nothing measured\n");
        return 77;
    }
    struct rng r;
    rng_seed(&r, 20261123, 8);
    printf("fp8-bench: GPT-2 124M block products at %dx%d = %d rows, C %d, %s scaling "
           "(median of 5 × %d runs)\n",
           B, T, N, C, sc == FP8_SCALING_BLOCK ? "block" : "tensor", reps);
    printf("%-8s %-6s %10s %10s %7s\n", "product", "pass", "bf16 ms", "fp8 ms", "ratio");
    static const char *const pass_name[] = {"fwd", "dinp", "dw"};
    double total16 = 0, total8 = 0;
    for (size_t k = 0; k < N_PRODUCTS; k++) {
        const struct product *p = &products[k];
        size_t wn = (size_t)p->out * p->in;
        int e = fp8_weight_tile(sc);
        struct bufs b = {
            .x = random_dev(o, &r, (size_t)N * p->in, 1.0f),
            .w = random_dev(o, &r, wn, 0.02f),
            .dy = random_dev(o, &r, (size_t)N * p->out, 1e-3f),
            .bias = random_dev(o, &r, (size_t)p->out, 0.02f),
            .y = must(o, (size_t)N * p->out * sizeof(float)),
            .dx = must(o, (size_t)N * p->in * sizeof(float)),
            .dw = must(o, wn * sizeof(float)),
            .db = must(o, (size_t)p->out * sizeof(float)),
            .w16 = must(o, wn * sizeof(uint16_t)),
            .w8 = must(o, wn),
            .w_scales = must(o, fp8_scale_count(p->out, p->in, e, e) * sizeof(float)),
        };
        o->to_bf16(cx, b.w16, b.w, wn);
        o->quantize_fp8(cx, b.w8, b.w_scales, b.w, p->out, p->in, e, e, FP8_E4M3);
        for (int pass = 0; pass < 3; pass++) {
            double t16 = timed(o, p, &b, false, sc, pass, reps);
            double t8 = timed(o, p, &b, true, sc, pass, reps);
            total16 += t16;
            total8 += t8;
            printf("%-8s %-6s %10.3f %10.3f %7.2f\n", p->name, pass_name[pass], 1e3 * t16, 1e3 * t8,
                   t16 / t8);
        }
        void *all[] = {b.x, b.w, b.dy, b.bias, b.y, b.dx, b.dw, b.db, b.w16, b.w8, b.w_scales};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) o->free(cx, all[i]);
    }
    printf("all      step   %10.3f %10.3f %7.2f  (bf16 / fp8 over a layer's products; goal >= "
           "1.30)\n",
           1e3 * total16, 1e3 * total8, total16 / total8);
    const char *fallback = o->fp8_fallback ? o->fp8_fallback(cx) : NULL;
    if (fallback) printf("fp8-bench: %s\n", fallback);
    return 0;
}
