/* bpe.h — byte-level BPE tokenizers: a Hugging Face tokenizer.json (model "BPE" with a
 * byte-level pre-tokenizer and decoder: GPT-2, Llama 3, Mistral Tekken, ...) or a tiktoken
 * ranks file (gpt2, cl100k_base, o200k_base), encoded and decoded as those libraries do.
 * Text is pre-tokenized with the tokenizer's regex (PCRE2, Unicode classes), each piece is
 * merged pair by pair in rank order, and special tokens are matched only when asked.
 * A loaded tokenizer is read-only: threads share it, each with its own bpe_session. */
#ifndef PLAIT_TOKENIZER_BPE_H
#define PLAIT_TOKENIZER_BPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

struct bpe;         /* a tokenizer (bpe_load) */
struct bpe_session; /* one thread's matcher and cache of encoded pieces */

/* The token ids an encode appends to. */
struct bpe_ids {
    int32_t *id;
    size_t n, cap;
};

/* The tiktoken encodings whose regex and special tokens plait knows, by name. */
extern const char *const bpe_tiktoken_names[]; /* NULL-terminated */

/* Loads `path`: a tokenizer.json, or (when `tiktoken_name` is not NULL, or the file's name
 * ends in .tiktoken) a tiktoken ranks file whose encoding is tiktoken_name, else the file's
 * name without its extension ("cl100k_base.tiktoken"). Errors name the file and the JSON
 * path or line. */
struct bpe *bpe_load(const char *path, const char *tiktoken_name, struct plait_error *err);
void bpe_free(struct bpe *b);

/* How many ids there are (the largest id + 1): the model's vocabulary must hold them. */
int bpe_vocab(const struct bpe *b);
/* The end-of-text token put between documents (<|endoftext|>, <|end_of_text|>, </s>), or -1. */
int bpe_eot(const struct bpe *b);
/* "tokenizer.json" or "NAME.tiktoken": the name a copy beside the shards is given. */
const char *bpe_file_name(const struct bpe *b);

/* An id's bytes (*bytes long), NULL for an id that is not a token. */
const unsigned char *bpe_token_bytes(const struct bpe *b, int id, size_t *bytes);

struct bpe_session *bpe_session_new(const struct bpe *b, struct plait_error *err);
void bpe_session_free(struct bpe_session *s);

/* Appends the ids of text[0, bytes) to out. With `special`, the special tokens' texts in it
 * are their ids; without, they are text like any other. Any bytes encode (text that is not
 * UTF-8 too: its bytes are pieces of their own). -1 only when memory runs out. */
int bpe_encode(struct bpe_session *s, const char *text, size_t bytes, bool special,
               struct bpe_ids *out, struct plait_error *err);

/* Appends the bytes of ids[0, n) to *text (*bytes long, *cap allocated; realloc'd). An id
 * that is not a token is an error naming it. */
int bpe_decode(const struct bpe *b, const int32_t *ids, size_t n, char **text, size_t *bytes,
               size_t *cap, struct plait_error *err);

/* Appends one id to out; -1 when memory runs out. */
int bpe_ids_push(struct bpe_ids *out, int32_t id);
void bpe_ids_free(struct bpe_ids *ids);

#endif
