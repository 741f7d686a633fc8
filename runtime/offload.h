/* offload.h — the AdamW moments of a rank's slice in files on a fast disk
 * (parallel.offload "nvme"), never more than a window of each in memory: the
 * optimizer step walks the slice window by window, the next window read ahead
 * and the last one written behind by an I/O thread (pread/pwrite, in the
 * order asked: a buffer is read again only after its write), so the disk
 * works while the CPU steps. Where the file system takes O_DIRECT, a
 * window's 4 KiB-aligned part moves past the page cache (the moments are
 * offloaded to leave memory free, page cache included), the rest through it. Each rank's files are <dir>/rank-<N>/adam_m.bin
 * and adam_v.bin, slice_n floats each, zeros when opened, their disk space
 * reserved then (a full disk fails at the start, naming the file and the
 * rank), removed when closed: scratch, a resume writes a checkpoint's moments
 * in. Checkpoints read and write the moments through offload_read and
 * offload_write, so they are the same files with offload or without.
 *
 * A GPU rank's "host" offload (runtime/host_step.h) keeps the moments in host
 * memory through the same calls: offload_open_memory, no files, no thread. */
#ifndef PLAIT_RUNTIME_OFFLOAD_H
#define PLAIT_RUNTIME_OFFLOAD_H

#include <stdbool.h>
#include <stddef.h>

#include "common/error.h"

struct offload_io; /* the I/O thread and its queue */

struct offload {
    int fd[2];            /* adam_m.bin, adam_v.bin */
    int direct[2];        /* the same files opened O_DIRECT, -1 where the file system refuses */
    char dir[4096];       /* <dir>/rank-<N> */
    size_t n;             /* floats in each file (the slice) */
    size_t window;        /* floats of each moment in memory at once */
    float *buf[2][2];     /* [buffer][moment] two windows of each moment, host memory */
    struct offload_io *io;
    bool in_memory; /* offload_open_memory's: the moments are mem's, no files */
    float *mem[2];  /* in_memory: the moments, n floats each (the caller's memory) */
};

/* Nothing open: no files, no thread, no windows (what offload_close may be given). */
void offload_init(struct offload *o);

/* Creates <dir>/rank-<rank>/ and its two files of n zeros, the window
 * buffers and the I/O thread. -1 with err naming the path (and the rank). */
int offload_open(struct offload *o, const char *dir, int rank, size_t n, size_t window,
                 struct plait_error *err);
void offload_close(struct offload *o);

/* The moments in host memory: m and v, n floats each, which the caller owns and
 * frees after offload_close; offload_each_window hands out windows of them in
 * place, offload_read and offload_write copy. */
void offload_open_memory(struct offload *o, size_t n, size_t window, float *m, float *v);

/* The optimizer's pass: fn(ctx, lo, n, m, v) for each window [lo, lo + n)
 * of the slice in turn, m and v its moments in memory (fn updates them in
 * place; they are written back after it returns). -1 with err when fn fails
 * or the disk does (naming the file). */
int offload_each_window(struct offload *o,
                        int (*fn)(void *ctx, size_t lo, size_t n, float *m, float *v,
                                  struct plait_error *err),
                        void *ctx, struct plait_error *err);

/* Floats [at, at + n) of moment k (0: m, 1: v), to or from host memory. */
int offload_read(const struct offload *o, int k, size_t at, float *host, size_t n,
                 struct plait_error *err);
int offload_write(const struct offload *o, int k, size_t at, const float *host, size_t n,
                  struct plait_error *err);

#endif
