/* llmc.c — headers of llm.c token shards and GPT-2 checkpoints: read, check,
 * fill. Parameter and token bodies are read by the runtime, not here. */
#include "common/formats/llmc.h"

#include "common/fsutil.h"
#include "common/gpt2/gpt2_layout.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static int read_header(const char *path, int32_t h[LLMC_HEADER_INTS], int64_t *file_bytes,
                       struct plait_error *err)
{
    FILE *f = fs_fopen_regular(path, err);
    if (!f) return -1;
    struct stat st;
    if (fstat(fileno(f), &st) != 0) {
        fclose(f);
        return error_errno(err, "%s", path);
    }
    size_t got = fread(h, 4, LLMC_HEADER_INTS, f);
    fclose(f);
    if (got != LLMC_HEADER_INTS)
        return error_set(err, "%s: too short for an llm.c header (%lld bytes, need %d)", path,
                         (long long)st.st_size, LLMC_HEADER_BYTES);
    *file_bytes = st.st_size;
    return 0;
}

int64_t llmc_param_count(int max_seq_len, int padded_vocab, int layers, int hidden)
{
    struct gpt2_config cfg = {.max_seq_len = max_seq_len,
                              .padded_vocab = padded_vocab,
                              .layers = layers,
                              .hidden = hidden};
    struct gpt2_layout layout;
    if (gpt2_layout(&cfg, &layout)) return -1;
    return (int64_t)layout.total;
}

int llmc_read_model_header(const char *path, struct llmc_model_header *out, struct plait_error *err)
{
    int32_t h[LLMC_HEADER_INTS];
    int64_t bytes;
    if (read_header(path, h, &bytes, err)) return -1;
    if (h[0] != LLMC_MODEL_MAGIC)
        return error_set(err, "%s: not an llm.c GPT-2 checkpoint (magic %d, expected %d)", path,
                         h[0], LLMC_MODEL_MAGIC);
    if (h[1] != LLMC_MODEL_VERSION_FP32 && h[1] != LLMC_MODEL_VERSION_BF16 &&
        h[1] != LLMC_MODEL_VERSION_LLAMA_FP32 && h[1] != LLMC_MODEL_VERSION_EXPERTS_FP32)
        return error_set(err,
                         "%s: unsupported checkpoint version %d (3 = fp32 and 5 = bf16 are; 103 "
                         "a plait Llama's, 104 a plait model with experts)",
                         path, h[1]);
    struct llmc_model_header m = {.version = h[1],
                                  .max_seq_len = h[2],
                                  .vocab = h[3],
                                  .layers = h[4],
                                  .heads = h[5],
                                  .hidden = h[6],
                                  .padded_vocab = h[7]};
    bool experts = m.version == LLMC_MODEL_VERSION_EXPERTS_FP32;
    if (experts) {
        m.llama = h[11], m.experts = h[12], m.moe_every = h[13], m.shared_experts = h[14];
        m.moe_ffn = h[15];
        if ((m.llama & ~1) || m.experts < 2 || m.moe_every < 1 || m.shared_experts < 0 ||
            m.moe_ffn < 1)
            return error_set(err,
                             "%s: inconsistent header of a model with experts (%d experts every "
                             "%d layers, %d shared, width %d)",
                             path, m.experts, m.moe_every, m.shared_experts, m.moe_ffn);
    }
    bool llama = m.version == LLMC_MODEL_VERSION_LLAMA_FP32 || (experts && m.llama);
    if (llama) {
        m.kv_heads = h[8], m.ffn_hidden = h[9], m.untied = h[10];
        if (m.kv_heads < 1 || m.heads % m.kv_heads || m.ffn_hidden < 1 || (m.untied & ~1))
            return error_set(err, "%s: inconsistent Llama header (key/value heads %d, MLP %d)",
                             path, m.kv_heads, m.ffn_hidden);
    }
    if (m.max_seq_len < 1 || m.vocab < 1 || m.layers < 1 || m.heads < 1 || m.hidden < 1 ||
        m.padded_vocab < m.vocab || m.hidden % m.heads != 0)
        return error_set(err,
                         "%s: inconsistent header (max T %d, vocab %d, padded vocab %d, layers "
                         "%d, heads %d, hidden %d)",
                         path, m.max_seq_len, m.vocab, m.padded_vocab, m.layers, m.heads, m.hidden);
    struct gpt2_config cfg = llmc_model_config(&m);
    struct gpt2_layout layout;
    int64_t n = gpt2_layout(&cfg, &layout) ? -1 : (int64_t)layout.total;
    if (n < 0)
        return error_set(err,
                         "%s: its header describes a model too large to address (max T %d, "
                         "padded vocab %d, layers %d, hidden %d): not a GPT-2 checkpoint",
                         path, m.max_seq_len, m.padded_vocab, m.layers, m.hidden);
    int64_t want = LLMC_HEADER_BYTES + n * (m.version == LLMC_MODEL_VERSION_BF16 ? 2 : 4);
    if (bytes != want)
        return error_set(err,
                         "%s: %lld bytes, but its header describes %lld parameters (%lld "
                         "bytes): truncated or not a GPT-2 checkpoint",
                         path, (long long)bytes, (long long)n, (long long)want);
    *out = m;
    return 0;
}

int llmc_read_tokens_header(const char *path, int64_t *n_tokens, int *token_bytes,
                            struct plait_error *err)
{
    int32_t h[LLMC_HEADER_INTS];
    int64_t bytes;
    if (read_header(path, h, &bytes, err)) return -1;
    if (h[0] != LLMC_TOKENS_MAGIC && h[0] != LLMC_TOKENS32_MAGIC)
        return error_set(err, "%s: not an llm.c token shard (magic %d, expected %d or %d)", path,
                         h[0], LLMC_TOKENS_MAGIC, LLMC_TOKENS32_MAGIC);
    int want_version = h[0] == LLMC_TOKENS_MAGIC ? LLMC_TOKENS_VERSION : LLMC_TOKENS32_VERSION;
    if (h[1] != want_version)
        return error_set(err, "%s: unsupported token shard version %d (expected %d)", path, h[1],
                         want_version);
    int width = h[0] == LLMC_TOKENS_MAGIC ? 2 : 4;
    int64_t want = LLMC_HEADER_BYTES + (int64_t)h[2] * width;
    if (h[2] < 0 || bytes != want)
        return error_set(err, "%s: header says %d tokens (%lld bytes) but the file has %lld bytes",
                         path, h[2], (long long)want, (long long)bytes);
    *n_tokens = h[2];
    *token_bytes = width;
    return 0;
}

void llmc_model_header_fill(int32_t header[LLMC_HEADER_INTS], const struct llmc_model_header *h)
{
    memset(header, 0, LLMC_HEADER_BYTES);
    header[0] = LLMC_MODEL_MAGIC;
    header[1] = h->version;
    header[2] = h->max_seq_len;
    header[3] = h->vocab;
    header[4] = h->layers;
    header[5] = h->heads;
    header[6] = h->hidden;
    header[7] = h->padded_vocab;
    if (h->version == LLMC_MODEL_VERSION_LLAMA_FP32 ||
        h->version == LLMC_MODEL_VERSION_EXPERTS_FP32) {
        header[8] = h->kv_heads;
        header[9] = h->ffn_hidden;
        header[10] = h->untied;
    }
    if (h->version == LLMC_MODEL_VERSION_EXPERTS_FP32) {
        header[11] = h->llama;
        header[12] = h->experts;
        header[13] = h->moe_every;
        header[14] = h->shared_experts;
        header[15] = h->moe_ffn;
    }
}

struct llmc_model_header llmc_model_header_of(const struct gpt2_config *c)
{
    bool experts = gpt2_moe(c);
    return (struct llmc_model_header){
        .version = experts    ? LLMC_MODEL_VERSION_EXPERTS_FP32
                   : c->llama ? LLMC_MODEL_VERSION_LLAMA_FP32
                              : LLMC_MODEL_VERSION_FP32,
        .max_seq_len = c->max_seq_len,
        .vocab = c->vocab,
        .layers = c->layers,
        .heads = c->heads,
        .hidden = c->hidden,
        .padded_vocab = c->padded_vocab,
        .kv_heads = c->llama ? gpt2_kv_heads(c) : 0,
        .ffn_hidden = c->llama ? gpt2_ffn(c) : 0,
        .untied = c->untied,
        .llama = experts && c->llama,
        .experts = experts ? c->experts : 0,
        .moe_every = experts ? c->moe_every : 0,
        .shared_experts = experts ? c->shared_experts : 0,
        .moe_ffn = experts ? c->moe_ffn : 0};
}

struct gpt2_config llmc_model_config(const struct llmc_model_header *h)
{
    bool experts = h->version == LLMC_MODEL_VERSION_EXPERTS_FP32;
    bool llama = h->version == LLMC_MODEL_VERSION_LLAMA_FP32 || (experts && h->llama);
    return (struct gpt2_config){.max_seq_len = h->max_seq_len,
                                .vocab = h->vocab,
                                .padded_vocab = h->padded_vocab,
                                .layers = h->layers,
                                .heads = h->heads,
                                .hidden = h->hidden,
                                .llama = llama,
                                .kv_heads = llama ? h->kv_heads : 0,
                                .ffn_hidden = llama ? h->ffn_hidden : 0,
                                .untied = llama && h->untied,
                                .experts = experts ? h->experts : 0,
                                .moe_every = experts ? h->moe_every : 0,
                                .shared_experts = experts ? h->shared_experts : 0,
                                .moe_ffn = experts ? h->moe_ffn : 0};
}

void llmc_tokens_header_fill(int32_t header[LLMC_HEADER_INTS], int64_t n_tokens, int token_bytes)
{
    memset(header, 0, LLMC_HEADER_BYTES);
    header[0] = token_bytes == 4 ? LLMC_TOKENS32_MAGIC : LLMC_TOKENS_MAGIC;
    header[1] = token_bytes == 4 ? LLMC_TOKENS32_VERSION : LLMC_TOKENS_VERSION;
    header[2] = (int32_t)n_tokens;
}
