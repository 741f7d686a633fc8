/* sampler.c — sampling text from a whole model and decoding tokens: one token
 * at a time through the decoder's key/value cache (decode.h), on the CPU. */
#include "sample/sampler.h"

#include <math.h>
#include <omp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "kernels/ops.h"
#include "sample/decode.h"

/* Text written as it comes, only ever valid UTF-8: bytes that begin a character wait for the
 * rest of it; a byte that cannot be part of one, or a character cut short, is written as
 * \xNN (as are control characters other than \n and \t). */
struct utf8_out {
    FILE *f;
    unsigned char pending[4];
    int n, want; /* bytes held, and the character's length */
};

static void escape(struct utf8_out *o, unsigned char b)
{
    fprintf(o->f, "\\x%02x", b);
}

static void flush_pending(struct utf8_out *o)
{
    for (int i = 0; i < o->n; i++) escape(o, o->pending[i]);
    o->n = o->want = 0;
}

/* the length of the character a lead byte starts, 0: none */
static int utf8_length(unsigned char b)
{
    return b < 0x80 ? 1 : b >= 0xc2 && b <= 0xdf ? 2 : b >= 0xe0 && b <= 0xef ? 3
                                                 : b >= 0xf0 && b <= 0xf4 ? 4 : 0;
}

/* whether b may follow lead byte `lead` as its first continuation (no overlong form, no
 * surrogate, nothing past U+10FFFF) */
static bool second_ok(unsigned char lead, unsigned char b)
{
    unsigned char lo = lead == 0xe0 ? 0xa0 : lead == 0xf0 ? 0x90 : 0x80,
                  hi = lead == 0xed ? 0x9f : lead == 0xf4 ? 0x8f : 0xbf;
    return b >= lo && b <= hi;
}

static void put_byte(struct utf8_out *o, unsigned char b)
{
    if (o->n && (b & 0xc0) == 0x80 && (o->n > 1 || second_ok(o->pending[0], b))) {
        o->pending[o->n++] = b;
        if (o->n == o->want) {
            fwrite(o->pending, 1, (size_t)o->n, o->f);
            o->n = o->want = 0;
        }
        return;
    }
    flush_pending(o); /* cut short */
    int len = utf8_length(b);
    if (len == 1 && ((b < 0x20 && b != '\n' && b != '\t') || b == 0x7f))
        escape(o, b);
    else if (len == 1)
        fputc(b, o->f);
    else if (len == 0)
        escape(o, b);
    else
        o->pending[o->n++] = b, o->want = len;
}

static void put_token(struct utf8_out *o, int token, int vocab, const struct tokenizer *tok)
{
    size_t bytes;
    const char *piece = tok ? tokenizer_piece(tok, token, &bytes) : NULL;
    if (piece) {
        for (size_t i = 0; i < bytes; i++) put_byte(o, (unsigned char)piece[i]);
    } else if (vocab <= 256) { /* bytes */
        put_byte(o, (unsigned char)token);
    } else {
        flush_pending(o);
        fprintf(o->f, "[%d]", token);
    }
    fflush(o->f);
}

static int descending(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

/* Draws from softmax(logits / temperature) over the top_k largest logits (all
 * when top_k is 0); scratch holds V floats. */
static int draw(const float *logits, int V, double temperature, int top_k, float *scratch,
                struct rng *r)
{
    double mx = -INFINITY, cutoff = -INFINITY;
    for (int i = 0; i < V; i++) mx = logits[i] > mx ? logits[i] : mx;
    if (top_k > 0 && top_k < V) {
        memcpy(scratch, logits, (size_t)V * sizeof *scratch);
        qsort(scratch, (size_t)V, sizeof *scratch, descending);
        cutoff = scratch[top_k - 1];
    }
    double sum = 0;
    for (int i = 0; i < V; i++)
        if (logits[i] >= cutoff) sum += exp((logits[i] - mx) / temperature);
    double u = rng_uniform(r) * sum, acc = 0;
    int last = 0;
    for (int i = 0; i < V; i++) {
        if (logits[i] < cutoff) continue;
        acc += exp((logits[i] - mx) / temperature);
        last = i;
        if (acc > u) return i;
    }
    return last;
}

/* Feeds seq[from, n) to the decoder; when its context is full, it starts again on the last
 * half of the sequence (positions are absolute: the cache cannot slide). */
static int feed(struct decoder *d, const int32_t *seq, size_t n, size_t *fed,
                struct plait_error *err)
{
    if (n - *fed > (size_t)(d->T - d->pos)) {
        decoder_reset(d);
        size_t keep = (size_t)d->T / 2;
        *fed = n > keep ? n - keep : 0;
    }
    for (; *fed < n; (*fed)++)
        if (decoder_feed(d, seq[*fed], err)) return -1;
    return 0;
}

/* The prompt's tokens into seq (room for strlen(prompt) + 1): its bytes for a byte
 * vocabulary, a BPE tokenizer's encoding (its special tokens' texts are those tokens), else
 * none, said (an llm.c tokenizer file only decodes). */
static int prompt_tokens(const char *prompt, int V, const struct tokenizer *tok, int32_t *seq,
                         size_t *n, struct plait_error *err)
{
    if (!*prompt) return 0;
    if (tok && tok->bpe) {
        struct bpe_session *s = bpe_session_new(tok->bpe, err);
        struct bpe_ids ids = {0};
        int rc = s ? bpe_encode(s, prompt, strlen(prompt), true, &ids, err) : -1;
        for (size_t i = 0; rc == 0 && i < ids.n; i++)
            if (ids.id[i] >= V)
                rc = error_set(err, "sample.prompt: its token %d is not below model.vocab %d",
                               ids.id[i], V);
        if (rc == 0) memcpy(seq, ids.id, ids.n * sizeof *ids.id), *n = ids.n;
        bpe_ids_free(&ids);
        bpe_session_free(s);
        return rc;
    }
    if (V <= 256 && !tok) { /* the prompt's bytes are its tokens */
        for (const unsigned char *p = (const unsigned char *)prompt; *p; p++)
            if (*p < V) seq[(*n)++] = *p;
        return 0;
    }
    log_warn("sample.prompt is not used: %s", tok ? "an llm.c tokenizer file cannot encode text "
                                                    "(a tokenizer.json or .tiktoken file can)"
                                                  : "this model's vocabulary is not bytes and the "
                                                    "run has no tokenizer (plait data prepare "
                                                    "--tokenizer leaves one beside the shards)");
    return 0;
}

static int sample_with(const struct gpt2_shard *whole, const float *params,
                       const struct plan_sample *s, const struct tokenizer *tok, struct rng *r,
                       FILE *out, struct plait_error *err)
{
    int V = whole->cfg.vocab;
    size_t cap = (size_t)s->tokens + strlen(s->prompt) + 1, n = 0, fed = 0;
    int32_t *seq = malloc(cap * sizeof *seq);
    float *scratch = malloc((size_t)V * sizeof *scratch);
    struct decoder d = {0};
    struct utf8_out text = {.f = out};
    int rc = -1;
    if (!seq || !scratch) {
        error_set(err, "out of memory");
        goto out;
    }
    if (decoder_init(&d, whole, params, err) || prompt_tokens(s->prompt, V, tok, seq, &n, err))
        goto out;
    if (n == 0) seq[n++] = tok && tok->eot >= 0 ? tok->eot : V - 1;
    for (size_t i = 0; i < n; i++)
        if (!(tok && seq[i] == tok->eot)) put_token(&text, seq[i], V, tok);
    for (int k = 0; k < s->tokens; k++) {
        if (feed(&d, seq, n, &fed, err)) goto out;
        int next = draw(d.logits, V, s->temperature, s->top_k, scratch, r);
        seq[n++] = next;
        put_token(&text, next, V, tok);
    }
    flush_pending(&text);
    fputc('\n', out);
    rc = 0;
out:
    decoder_free(&d);
    free(seq);
    free(scratch);
    return rc;
}

/* Threads for one row at a time: a row's ops are too small to share below about 4M
 * parameters a thread (OpenMP's wake-ups cost more than the work), larger models are
 * memory-bound and take them all. */
static int decode_threads(const struct gpt2_shard *whole)
{
    size_t per = (size_t)4 << 20, want = whole->total / per;
    int most = omp_get_max_threads();
    return want < 1 ? 1 : want < (size_t)most ? (int)want : most;
}

int sample_tokens(const struct gpt2_shard *whole, const float *params, const struct plan_sample *s,
                  const struct tokenizer *tok, struct rng *r, FILE *out, struct plait_error *err)
{
    int threads = omp_get_max_threads();
    omp_set_num_threads(decode_threads(whole));
    int rc = sample_with(whole, params, s, tok, r, out, err);
    omp_set_num_threads(threads);
    return rc;
}
