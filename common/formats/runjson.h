/* runjson.h — RUN_DIR/run.json, the run as its process started it and what
 * it measured: plait's version, the start time, the plan as run, the
 * checkpoint it resumed from, the model's size, the machine, every rank's
 * memory after its first step (plait check's prediction beside what was
 * allocated), modelled against measured tokens/s, and the last checkpoint's
 * write time. plait-train's rank 0 writes it whole, again as it learns more;
 * plait status reads it. Nothing else opens it. */
#ifndef PLAIT_RUNJSON_H
#define PLAIT_RUNJSON_H

#include <stdbool.h>
#include <stdint.h>

#include "common/error.h"

struct run_bytes { /* one rank's memory by what it holds ("total" in the file: their sum) */
    int64_t params, grads, optimizer, activations;
    int64_t comm_rings; /* predicted, CPU ranks of a job of several: the socket backend's
                           rings; -1 elsewhere (not written) */
    int64_t host;       /* host memory beside the device's, not in the total (a GPU rank's
                           offloaded optimizer step, runtime/host_step.h); -1: none (not
                           written) */
    /* a GPU rank's, in the total (0 elsewhere: not written) */
    int64_t scratch;      /* the CUDA backend's scratch slots (common/gpt2/gpt2_scratch.h):
                             predicted, and reserved when the model was made */
    int64_t cuda_context; /* predicted only: cuBLASLt's workspace and the CUDA context's
                             allowance (an estimate) */
};

struct run_rank_memory {
    int rank, tp, pp, dp;
    struct run_bytes predicted, allocated; /* plait check's (cost_memory_stage), model_init's */
    int64_t rss_peak_bytes, rss_before_model_bytes;
    int64_t device_used_bytes; /* a GPU rank's device memory in use after the step (every
                                  allocation: the CUDA context and workspaces too); -1 on a
                                  CPU rank (not written) */
    int cp; /* its cp coordinate (written when the run had context parallelism; read: 0
               where absent) */
};

struct run_machine {
    char hostname[256], cpu[256];
    int cores, threads;
    char backend[32];         /* the op backend ("cpu", "cuda") */
    double peak_gflops;       /* its matrix product's rate, measured at start */
    char bf16_emulation[512]; /* how bf16 products are emulated, "" when they are not */
};

struct run_record {
    char version[64];      /* the plait that ran it */
    char started[32];      /* when this process started the run, UTC ISO 8601 */
    char *plan_json;       /* the plan as run: plan_to_json's text when written, re-encoded
                              when read (plan_load_text takes either); freed by runjson_free */
    char resumed_from[64]; /* the checkpoint it resumed from, "" none */
    int64_t parameters, activation_bytes;
    struct run_machine machine;
    int memory_after_step;         /* the step after which memory was measured; 0: not yet (then no
                                      memory section) */
    struct run_rank_memory *ranks; /* n_ranks, in rank order; freed by runjson_free */
    int n_ranks;
    int cp; /* the layout's context parallelism when written (0 or 1: none, no rank's "cp"
               written); not read back */
    double modelled_tokens_per_s, measured_tokens_per_s; /* 0: not known (null) */
    bool has_checkpoint;                                 /* a checkpoint was written: */
    bool checkpoint_async;
    double checkpoint_write_s, checkpoint_stall_s; /* its files' write time, the step's pause */
};

int64_t run_bytes_total(const struct run_bytes *b);

/* Writes RUN_DIR/run.json (whole: it appears at once). */
int runjson_write(const char *run_dir, const struct run_record *r, struct plait_error *err);

/* RUN_DIR/run.json into r: 0, RUNJSON_NONE when there is none, -1 with err
 * naming the file and the member that is wrong. */
#define RUNJSON_NONE 1
int runjson_read(const char *run_dir, struct run_record *r, struct plait_error *err);
void runjson_free(struct run_record *r);

#endif
