/* cpu_rate.h — how fast this machine's CPU kernels run one rank's work, measured
 * in a fifth of a second or less through the CPU op table itself (kernels/cpu: the
 * products oneDNN runs, fp32 or the bf16 path, emulated or native as training
 * runs them) at the plan's shapes. The cost model (common/cost.h) turns these
 * rates into a modelled step; nothing here knows plans or layouts. */
#ifndef PLAIT_KERNELS_CPU_CPU_RATE_H
#define PLAIT_KERNELS_CPU_CPU_RATE_H

#include <stdbool.h>
#include <stddef.h>

/* One rank's micro-batch, in the kernels' terms. */
struct cpu_rate_shape {
    int rows;      /* B·T tokens */
    int batch;     /* B sequences */
    int seq_len;   /* T */
    int hidden;    /* C */
    int width;     /* the rank's share of the attention's width, C/tp (its MLP's is 4·width) */
    int heads;     /* the rank's heads, NH/tp */
    int layers;    /* the rank's layers: how much activation memory the layer ops stream */
    double params; /* the rank's parameters: how much memory AdamW streams */
    bool bf16;     /* the bf16 path: products take bf16 inputs, AdamW writes the bf16 copy */
};

/* One rank of a GPT model with micro-batch B × T, hidden C, NH heads, the
 * given layers and (padded) vocabulary, split tp × pp ways (tp and pp ≥ 1; a
 * plan's rules make them divide NH and the layers); its parameters counted
 * as its layers' products and the vocabulary's share. */
struct cpu_rate_shape cpu_rate_shape_of(int B, int T, int C, int NH, int layers, int vocab, int tp,
                                        int pp, bool bf16);

/* Rates per CPU: each is what the calling process reached on its OpenMP
 * threads, divided by the CPUs they ran on (but parallel_op_us). */
struct cpu_rate {
    int cpus;                /* the CPUs measured on: min(OpenMP threads, CPUs allowed) */
    double matmul_gflops;    /* the MLP's first product forward and backward (bias included):
                                6·rows·C·4·width FLOPs */
    double attention_gflops; /* the attention forward and backward (per-head products, causal
                                softmax): 12·B·T²·width FLOPs, as the cost model counts them */
    double activation_gbps;  /* a layer's memory-bound ops, each once: 2 LayerNorms forward and
                                backward, 2 residual adds, GELU forward and backward, over
                                (18·C + 20·width)·4 bytes per row (cost.c counts the same) */
    double memory_gbps;      /* the optimizer's pass over the rank's parameters (64k to 8M of
                                them): the gradient norm's read and AdamW's, 32 bytes a
                                parameter as cost.c counts them (36 with the bf16 copy) */
    double parallel_op_us;   /* not per CPU: what an op's parallel region costs beyond its
                                work, µs (its threads woken and joined; a tiny op's time after
                                the threads slept, the median of 31) */
    double seconds;          /* how long measuring took */
};

/* Measures the rates for `shape` on `threads` OpenMP threads (0: the
 * calling thread's; a rank measures with the CPUs it was bound to, plait check
 * with those a rank would get). Each is the best of a few timed repetitions
 * after a warm-up (on a shared machine noise only slows a repetition down);
 * the products take turns over more weights than a cache holds, the layer
 * ops and AdamW stream more than one, as training does; work is capped so that
 * large shapes stay quick (fewer rows or heads, never another width). 0, or -1
 * with the reason in errbuf (out of memory, a kernel's error, a shape the
 * kernels cannot run). */
int cpu_rate_measure(const struct cpu_rate_shape *shape, int threads, struct cpu_rate *out,
                     char *errbuf, size_t errbuf_bytes);

#endif
