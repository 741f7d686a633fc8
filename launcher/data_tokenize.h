/* data_tokenize.h — plait data prepare --tokenizer: the inputs (data_source.h) tokenized by
 * threads a batch of chunks at a time, written in the inputs' order (the same shard whatever
 * the thread count) with the end-of-text token between documents, into an llm.c shard
 * (shard_writer.h), the tokenizer's file copied beside it. */
#ifndef PLAIT_LAUNCHER_DATA_TOKENIZE_H
#define PLAIT_LAUNCHER_DATA_TOKENIZE_H

#include <stddef.h>

#include "common/error.h"

struct data_tokenize_opts {
    char *const *inputs; /* files, globs, "-" */
    int n_inputs;
    const char *out, *val; /* val: NULL, or where the end of the tokens goes */
    double val_fraction;
    const char *tokenizer, *tiktoken_name; /* tiktoken_name: NULL unless --tiktoken */
    const char *field;                     /* JSONL's member, or NULL for plain text */
    int threads;
    size_t chunk_bytes;
};

/* Writes the shards and prints what it wrote; -1 with err. */
int data_tokenize(const struct data_tokenize_opts *o, struct plait_error *err);

#endif
