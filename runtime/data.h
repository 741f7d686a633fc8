/* data.h — micro-batches from llm.c token shards (uint16 or uint32 tokens, llmc.h). A position in the data is
 * three integers, so a checkpoint can restore it exactly.
 *
 * In order (shuffle off): micro-batch k reads the B·T+1 tokens at the current
 * position (inputs = window[0:B·T], targets = window[1:B·T+1], row-major B×T),
 * then the position advances by B·T; when a window no longer fits, reading
 * moves to the next shard (after the last, back to the first).
 * Shards are read with pread (never mapped: a shard truncated while training
 * is an error, not SIGBUS). Shuffled: each epoch visits the shards in a seeded random order and the
 * B·T-token windows of each shard in a seeded random order; the permutations
 * are functions of (seed, epoch, shard), so a position restores them. */
#ifndef PLAIT_RUNTIME_DATA_H
#define PLAIT_RUNTIME_DATA_H

#include <stdbool.h>
#include <stdint.h>

#include "common/formats/ckpt_state.h" /* struct data_position */
#include "common/error.h"

struct data_shard {
    char *path;
    int64_t tokens;
    int token_bytes; /* 2 or 4 */
};

struct data_loader {
    int B, T, vocab;
    bool shuffle;
    uint64_t seed;
    struct data_shard *shards;
    int n_shards;
    struct data_position pos;
    /* the shard being read */
    int open_shard;        /* index into shards, or -1 */
    int fd;                /* its file */
    uint32_t *window;      /* B·T+1 tokens read from it */
    int64_t *shard_order;  /* this epoch's order (shuffle) */
    int64_t *window_order; /* the current shard's window order (shuffle) */
    int64_t order_epoch;   /* which epoch shard_order is for */
    int64_t window_key;    /* (epoch, shard) window_order is for, as one number */
};

/* Opens the shards matching a file name or glob (sorted by name); every shard
 * is checked (a regular file; magic, version, size; every token below vocab,
 * in one pass) and at least one must hold a window. */
int data_open(struct data_loader *d, const char *pattern, int B, int T, int vocab, bool shuffle,
              uint64_t seed, struct plait_error *err);
void data_close(struct data_loader *d); /* also on a zeroed loader never opened */

/* The next micro-batch: inputs and targets of B·T tokens each. A token not
 * below the vocabulary size, or a shard that shrank or vanished since it was
 * opened, is an error naming the shard and offset, and leaves the position
 * where it was (so a checkpoint taken then resumes at that micro-batch). */
int data_next(struct data_loader *d, int32_t *inputs, int32_t *targets, struct plait_error *err);

/* The same for one of `ranks` readers that share the data (data parallelism):
 * of the next `ranks` windows, this reader takes the rank-th, and every
 * reader's position moves past all of them, so that at each micro-batch
 * boundary all readers stand at the same position, the one a single reader
 * taking every window would have. */
int data_next_of(struct data_loader *d, int rank, int ranks, int32_t *inputs, int32_t *targets,
                 struct plait_error *err);

/* Back to the start (for evaluation) or to a saved position. */
void data_rewind(struct data_loader *d);
int data_seek(struct data_loader *d, const struct data_position *pos, struct plait_error *err);

#endif
