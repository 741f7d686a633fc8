/* data_tokenize.c — data prepare's tokenizing pipeline (data_tokenize.h): read a batch of
 * chunks, encode them on all threads (one bpe_session each), write them in order; then the
 * validation split, the tokenizer's copy and the summary. */
#include "launcher/data_tokenize.h"

#include <math.h>
#include <omp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/fsutil.h"
#include "launcher/data_source.h"
#include "launcher/shard_writer.h"
#include "tokenizer/bpe.h"

struct work {
    struct data_chunk chunk;
    bool eot_before; /* a document after the first: the end-of-text token goes first */
    struct bpe_ids ids;
    int rc;
    struct plait_error err;
};

struct run {
    const struct data_tokenize_opts *o;
    struct bpe *bpe;
    struct bpe_session **session; /* one a thread */
    struct data_source src;
    struct shard_writer out, val;
    uint64_t *count; /* each id's count */
    int64_t documents;
    double started;
    bool progress; /* a terminal to draw it on */
};

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void encode_work(struct run *r, struct work *w, int eot)
{
    struct bpe_session *s = r->session[omp_get_thread_num()];
    w->rc = w->eot_before && eot >= 0 ? bpe_ids_push(&w->ids, eot) : 0;
    if (w->rc) error_set(&w->err, "out of memory");
    if (w->rc == 0) w->rc = bpe_encode(s, w->chunk.text, w->chunk.bytes, false, &w->ids, &w->err);
}

/* Up to threads × chunk bytes of chunks into batch; their count (0: the end), or -1. */
static int read_batch(struct run *r, struct work *batch, int most, struct plait_error *err)
{
    size_t bytes = 0, want = (size_t)r->o->threads * r->o->chunk_bytes;
    int k = 0;
    while (k < most && bytes < want) {
        struct work *w = &batch[k];
        memset(w, 0, sizeof *w);
        int rc = data_source_next(&r->src, &w->chunk, err);
        if (rc < 0) return -1;
        if (rc == 0) break;
        w->eot_before = w->chunk.starts_document && r->documents++ > 0;
        bytes += w->chunk.bytes;
        k++;
    }
    return k;
}

static void show_progress(struct run *r, bool last)
{
    if (!r->progress) return;
    double s = now_s() - r->started, mb = (double)r->src.bytes_read / 1e6;
    fprintf(stderr, "\rplait: %.1f MB read, %lld tokens, %lld documents, %.1f MB/s   %s", mb,
            (long long)r->out.tokens, (long long)r->documents, s > 0 ? mb / s : 0,
            last ? "\n" : "");
    fflush(stderr);
}

/* the batch's tokens, in order, into the shard and the counts */
static int write_batch(struct run *r, struct work *batch, int k, struct plait_error *err)
{
    int rc = 0;
    for (int i = 0; i < k; i++) {
        struct work *w = &batch[i];
        if (rc == 0 && w->rc) rc = error_set(err, "%s", w->err.text);
        if (rc == 0) rc = shard_writer_put(&r->out, w->ids.id, w->ids.n, err);
        for (size_t t = 0; rc == 0 && t < w->ids.n; t++) r->count[w->ids.id[t]]++;
        free(w->chunk.text);
        bpe_ids_free(&w->ids);
    }
    return rc;
}

static int tokenize_all(struct run *r, struct plait_error *err)
{
    enum { MOST = 4096 };
    struct work *batch = calloc(MOST, sizeof *batch);
    if (!batch) return error_set(err, "out of memory");
    int k, rc = 0, eot = bpe_eot(r->bpe);
    while (rc == 0 && (k = read_batch(r, batch, MOST, err)) > 0) {
#pragma omp parallel for num_threads(r->o->threads) schedule(dynamic, 1)
        for (int i = 0; i < k; i++) encode_work(r, &batch[i], eot);
        rc = write_batch(r, batch, k, err);
        show_progress(r, false);
    }
    if (k < 0) rc = -1;
    show_progress(r, true);
    free(batch);
    return rc;
}

/* the tokenizer's file beside the shard, where a run finds it */
static int copy_tokenizer(struct run *r, char *dest, size_t dest_bytes, struct plait_error *err)
{
    char *dir = fs_dirname(r->o->out);
    int rc = dir ? fs_join(dest, dest_bytes, dir, bpe_file_name(r->bpe), err)
                 : error_set(err, "out of memory");
    free(dir);
    if (rc || fs_same_file(r->o->tokenizer, dest)) return rc;
    size_t bytes;
    char *text = fs_read_all(r->o->tokenizer, &bytes, err);
    rc = text ? fs_write_atomic(dest, text, bytes, err) : -1;
    free(text);
    return rc;
}

static double entropy_nats(const uint64_t *count, int vocab, int64_t n)
{
    double h = 0;
    for (int i = 0; i < vocab; i++)
        if (count[i]) h -= (double)count[i] / (double)n * log((double)count[i] / (double)n);
    return h;
}

/* --val: the end of the tokens moves to the validation shard */
static int split_val(struct run *r, struct plait_error *err)
{
    int64_t n = r->out.tokens, n_val = (int64_t)(r->o->val_fraction * (double)n);
    if (n - n_val < 2 || n_val < 2)
        return error_set(err, "%s: %lld tokens is too little text to hold back %g of it",
                         r->o->out, (long long)n, r->o->val_fraction);
    if (shard_writer_open(&r->val, r->o->val, bpe_vocab(r->bpe), err)) return -1;
    return shard_writer_split(&r->out, n - n_val, &r->val, err);
}

static int finish(struct run *r, struct plait_error *err)
{
    char dest[4096];
    int64_t total = r->out.tokens, n_val;
    if (total < 2) return error_set(err, "%lld tokens is too little text", (long long)total);
    if (r->o->val && split_val(r, err)) return -1;
    n_val = r->o->val ? r->val.tokens : 0;
    if (shard_writer_close(&r->out, err) || (r->o->val && shard_writer_close(&r->val, err)) ||
        copy_tokenizer(r, dest, sizeof dest, err))
        return -1;
    int vocab = bpe_vocab(r->bpe);
    printf("%s: %lld tokens (vocab %d, %s tokens), unigram entropy %.4f nats/token (of all "
           "%lld tokens)\n",
           r->o->out, (long long)(total - n_val), vocab, vocab <= 65536 ? "uint16" : "uint32",
           entropy_nats(r->count, vocab, total), (long long)total);
    if (r->o->val) printf("%s: %lld tokens\n", r->o->val, (long long)n_val);
    printf("%s: the tokenizer, for samples and prompts\n", dest);
    return 0;
}

int data_tokenize(const struct data_tokenize_opts *o, struct plait_error *err)
{
    struct run r = {.o = o, .started = now_s(), .progress = isatty(STDERR_FILENO)};
    int rc = -1;
    if (!(r.bpe = bpe_load(o->tokenizer, o->tiktoken_name, err))) return -1;
    if (!(r.session = calloc((size_t)o->threads, sizeof *r.session)) ||
        !(r.count = calloc((size_t)bpe_vocab(r.bpe), sizeof *r.count))) {
        error_set(err, "out of memory");
        goto out;
    }
    for (int t = 0; t < o->threads; t++)
        if (!(r.session[t] = bpe_session_new(r.bpe, err))) goto out;
    if (data_source_open(&r.src, o->inputs, o->n_inputs, o->field, o->chunk_bytes, err) ||
        shard_writer_open(&r.out, o->out, bpe_vocab(r.bpe), err) || tokenize_all(&r, err) ||
        finish(&r, err))
        goto out;
    rc = 0;
out:
    shard_writer_abandon(&r.out);
    shard_writer_abandon(&r.val);
    data_source_close(&r.src);
    for (int t = 0; r.session && t < o->threads; t++) bpe_session_free(r.session[t]);
    free(r.session);
    free(r.count);
    bpe_free(r.bpe);
    return rc;
}
