/* data_source.h — the text plait data prepare --tokenizer reads, as documents cut into
 * chunks a thread can tokenize alone: files (names, globs, "-" for stdin), each one document,
 * or JSONL files whose lines' --field strings are the documents. A file is read a chunk at a
 * time (never whole: files may be larger than memory), cut only where the pre-tokenizers cut
 * anyway, so the tokens are those of the whole text. */
#ifndef PLAIT_LAUNCHER_DATA_SOURCE_H
#define PLAIT_LAUNCHER_DATA_SOURCE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common/error.h"

struct data_chunk {
    char *text; /* malloc'ed, the chunk's bytes */
    size_t bytes;
    bool starts_document; /* the first chunk of a document */
};

struct data_source {
    char **paths; /* the inputs, globs expanded ("-": stdin) */
    int n_paths, next_path;
    const char *field; /* JSONL: the member whose string is a document; NULL: plain text */
    size_t chunk_bytes;
    FILE *f; /* the input being read, or NULL */
    const char *path;
    size_t line;        /* JSONL: the line read last */
    bool in_document;   /* plain text: a chunk of this file was given already */
    char *carry;        /* plain text: bytes read after the last cut */
    size_t carry_bytes;
    uint64_t bytes_read; /* for the progress line */
};

/* The inputs named (globs expanded, in name order; a glob matching nothing is an error). */
int data_source_open(struct data_source *s, char *const *names, int n, const char *field,
                     size_t chunk_bytes, struct plait_error *err);
/* The next chunk: 1, 0 at the end of the inputs, -1 with err (naming the file and line). */
int data_source_next(struct data_source *s, struct data_chunk *out, struct plait_error *err);
void data_source_close(struct data_source *s);

#endif
