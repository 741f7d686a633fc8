/* host_step.h — the optimizer step of a GPU rank whose optimizer state is offloaded
 * (parallel.offload "host" or "nvme", as ZeRO-Offload does): the slice's fp32 master
 * weights and its gradient in page-locked host memory beside the AdamW moments ("host":
 * in host memory too, through runtime/offload.h's offload_open_memory; "nvme": in files,
 * two windows of each in host memory), AdamW on the CPU's threads (the CPU backend's op)
 * window by window, while a copy thread brings the gradient down ahead of the step and
 * takes each window's updated weights up behind it. The device holds no optimizer state.
 *
 * Where no data-parallel sum follows the backward (dp 1), the gradient comes down during
 * the step's last backward instead, a layer's range as soon as the model's grads_final
 * hook says it is final (host_step_expect, host_step_grads_final: ops download_after,
 * behind the device's work and overlapping the layers below); the copy thread brings the
 * rest (the embeddings) at the step. Where the buckets reduce it (dp > 1, ZeRO 0 to 2:
 * runtime/buckets.h), the slice's layers come down as their buckets' sums arrive
 * (host_step_landed): during backward where a poll finds them done, else as the reduction's
 * end waits for them, before the step.
 *
 * The master weights are read from the device once, at the first step (after whatever a
 * run loaded); from then on the device's slice is what the host step wrote. */
#ifndef PLAIT_RUNTIME_HOST_STEP_H
#define PLAIT_RUNTIME_HOST_STEP_H

#include <stdbool.h>
#include <stddef.h>

#include "common/error.h"
#include "kernels/ops.h"
#include "runtime/offload.h"

struct host_step_io; /* the copy thread and its state */

struct host_step {
    const struct ops *dev; /* the rank's device, and its context */
    struct ops_ctx *dev_ctx;
    struct ops_ctx *cpu_ctx; /* the CPU backend's, for the AdamW op (ops_cpu()) */
    size_t n;                /* the slice's floats */
    size_t chunk;            /* floats a copy moves and an AdamW call takes at once */
    float *master, *grad;    /* (n) host memory */
    float *moments[2];       /* (n) host memory ("host"), or NULL ("nvme": in files) */
    float *windows[2][2];    /* "nvme": the offload's [buffer][moment] windows in host memory */
    uint64_t bytes;          /* of host memory held (gpt2_memory's host) */
    bool master_ready;       /* master holds the device's slice */
    struct host_step_io *io;
    /* host_step_expect's: the device's gradient whose final ranges come down during the
     * backward (NULL: none expected), the buffer's top (its elements at or above it are
     * padding), and [early, n) of the slice, on its way down since */
    const float *early_src;
    size_t top, early;
    size_t early_backward; /* [early_backward, n): what of it came down during the backward */
    /* over the steps taken: the gradient's floats brought down before the step, of them
     * after the backward (as its reduction ended), and in all */
    uint64_t floats_early, floats_after, floats_down;
};

/* Host memory for a slice of n floats and its moments (in host memory, which
 * host_step_moments hands to runtime/offload.h; or, in_files, two windows of each for the
 * moments' files), the CPU backend's context and the copy thread; window floats are what a
 * copy moves and an AdamW call takes at once. -1 with err (out of host memory names the
 * bytes). */
int host_step_open(struct host_step *h, const struct ops *dev, struct ops_ctx *dev_ctx, size_t n,
                   size_t window, bool in_files, struct plait_error *err);

/* The moments where host_step_open put them: o opened on the host arrays ("host"), or its
 * windows set to the host's for offload_open ("nvme"). */
void host_step_moments(struct host_step *h, struct offload *o);
void host_step_close(struct host_step *h);

/* Before the micro-batches of a step whose gradient comes down early: in its last backward
 * the model's grads_final hook (host_step_grads_final, ctx h; dp 1), or the buckets' landed
 * hook as their sums arrive (host_step_landed; dp > 1), reports the gradient dev_grad (the
 * device's, the slice's n floats: the buffer at ZeRO 0, the slice at 1 and 2) final in
 * ranges, and a range up to top (the shard's total, the padding above it never written; a
 * ZeRO slice's n) comes down at once, behind the device's work on it. What came down is the
 * step's only when host_step_run gets the same dev_grad; another call (a step stopped
 * before its last backward) forgets it. */
void host_step_expect(struct host_step *h, const float *dev_grad, size_t top);

/* The model's grads_final hook (ctx: a host_step after host_step_expect): elements
 * [from, to) of the gradient are final. A range up to the top brings [from, what came
 * down before) down now (ops download_after; download where the device has none);
 * others come down at the step. Returns 0. */
int host_step_grads_final(void *ctx, size_t from, size_t to, struct plait_error *err);

/* The same as the buckets' landed hook (runtime/buckets.h), ctx a host_step: [from, to) of
 * the slice summed and final; after_backward: the backward was over (counted apart). */
int host_step_landed(void *ctx, size_t from, size_t to, bool after_backward,
                     struct plait_error *err);

/* One step: fn (offload_each_window's visitor) over each window of the slice as o hands
 * them out, with h->master and h->grad holding the window's weights and gradient when it
 * is called (dev_grad, the device's n floats of the slice's gradient, brought down ahead);
 * after it returns the window's master weights go up into dev_master (the device's slice of
 * fp32 weights). What came down during the backward (host_step_expect) is waited for, not
 * copied again. Returns when every copy is done; -1 with err when fn fails. */
int host_step_run(struct host_step *h, struct offload *o, const float *dev_grad, float *dev_master,
                  int (*fn)(void *ctx, size_t lo, size_t n, float *m, float *v,
                            struct plait_error *err),
                  void *ctx, struct plait_error *err);

#endif
