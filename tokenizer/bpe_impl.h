/* bpe_impl.h — what a loaded tokenizer holds, shared by its loaders (bpe_json.c,
 * bpe_tiktoken.c), its builder (bpe.c) and its encoder (bpe_encode.c). Internal to
 * tokenizer/; bpe.h is the interface. */
#ifndef PLAIT_TOKENIZER_BPE_IMPL_H
#define PLAIT_TOKENIZER_BPE_IMPL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdbool.h>

#include "tokenizer/bpe.h"
#include "tokenizer/table.h"

struct bpe_token {
    unsigned char *bytes; /* NULL: no token has this id */
    size_t n_bytes;
    bool special; /* an added token, matched as a whole (bpe_encode's `special`) */
};

struct bpe {
    char *path;
    char file_name[64];     /* bpe_file_name */
    int n_ids;              /* the largest id + 1 */
    int n_alloc;            /* tokens allocated */
    struct bpe_token *token;
    struct bytes_map id_of; /* an ordinary token's bytes -> its id */
    struct bytes_map special_of; /* a special token's bytes -> its id */
    struct pair_map merge;  /* two adjacent tokens -> their merge's rank and id */
    int32_t byte_id[256];   /* each byte's own token */
    bool whole_piece_first; /* a piece that is a token is that token (tiktoken; ignore_merges) */
    bool add_prefix_space;  /* a space before text that starts without one (ByteLevel) */
    pcre2_code *pattern;    /* the pre-tokenizer's regex; NULL: the text is one piece */
    pcre2_code *specials;   /* the special tokens' texts, longest first; NULL: none */
    int eot;
};

/* Records token `id` with these bytes (copied); ordinary tokens go into id_of. A second
 * token with the same id is an error. */
int bpe_add_token(struct bpe *b, int id, const unsigned char *bytes, size_t n, bool special,
                  struct plait_error *err);

/* Compiles b->pattern from a regex (what = where it came from, for errors). */
int bpe_set_pattern(struct bpe *b, const char *regex, const char *what, struct plait_error *err);

/* After the tokens and merges: each byte's token, the special tokens' matcher, the
 * end-of-text token. */
int bpe_finish(struct bpe *b, struct plait_error *err);

/* The GPT-2 pre-tokenizer regex (ByteLevel's use_regex, tiktoken's gpt2 and r50k_base). */
extern const char bpe_gpt2_pattern[];

#endif
