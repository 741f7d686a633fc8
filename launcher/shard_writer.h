/* shard_writer.h — an llm.c token shard written as tokens come (never held whole): uint16
 * tokens, or uint32 ones for a vocabulary above 65536 (llmc.h), through PATH.tmp, renamed
 * to PATH when complete. plait data prepare --tokenizer writes with it. */
#ifndef PLAIT_LAUNCHER_SHARD_WRITER_H
#define PLAIT_LAUNCHER_SHARD_WRITER_H

#include <stdint.h>
#include <stdio.h>

#include "common/error.h"

struct shard_writer {
    char *path, *tmp;
    FILE *f;
    int token_bytes; /* 2 or 4 */
    int64_t tokens;
};

int shard_writer_open(struct shard_writer *w, const char *path, int vocab, struct plait_error *err);
int shard_writer_put(struct shard_writer *w, const int32_t *ids, size_t n, struct plait_error *err);
/* Moves the shard's tokens from `from` on to the end of `to` (an open writer), leaving the
 * first `from` (--val: the end of the text is held back). */
int shard_writer_split(struct shard_writer *w, int64_t from, struct shard_writer *to,
                       struct plait_error *err);
/* The header, fsync, the rename; 0 or -1 (the temporary is removed). */
int shard_writer_close(struct shard_writer *w, struct plait_error *err);
/* Removes the temporary of a writer not closed (after an error). */
void shard_writer_abandon(struct shard_writer *w);

#endif
