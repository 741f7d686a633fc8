/* llmc.h — the file formats of llm.c that plait reads and writes, so existing
 * datasets and weights work: token shards and GPT-2 model checkpoints. Only the
 * headers live here (the plan validator needs them); the runtime streams the
 * bodies. */
#ifndef PLAIT_LLMC_H
#define PLAIT_LLMC_H

#include <stdint.h>

#include "common/error.h"
#include "common/gpt2/gpt2_layout.h"

#define LLMC_HEADER_INTS 256
#define LLMC_HEADER_BYTES (LLMC_HEADER_INTS * 4)

/* Token shard: int32 header {magic, version, n_tokens, 0...}, then n_tokens tokens: uint16
 * for GPT-2's magic and version, uint32 for the ones llm.c's dev/data/data_common.py
 * writes for Llama 3 (HEADERS_INFO["llama-3"]), which vocabularies above 65536 need. */
#define LLMC_TOKENS_MAGIC 20240520
#define LLMC_TOKENS_VERSION 1
#define LLMC_TOKENS32_MAGIC 20240801
#define LLMC_TOKENS32_VERSION 7

/* GPT-2 model: int32 header {magic, version, max_seq_len, vocab, layers, heads,
 * hidden, padded_vocab, 0...}, then the parameters (fp32 for version 3, bf16
 * for version 5) in llm.c order (see runtime/params.h). */
#define LLMC_MODEL_MAGIC 20240326
#define LLMC_MODEL_VERSION_FP32 3
#define LLMC_MODEL_VERSION_BF16 5
/* plait's whole-model file of a Llama (a one-rank checkpoint's model.bin):
 * the same header with version 103, which llm.c refuses, and {kv_heads,
 * ffn_hidden, untied} at ints 8..10; the parameters fp32 in llm.c order
 * (common/gpt2/gpt2_layout.h says how a Llama fills GPT-2's tensors). */
#define LLMC_MODEL_VERSION_LLAMA_FP32 103
/* plait's whole-model file of a model with experts (model.moe, GPT-2 or Llama): version
 * 104, ints 8..10 as 103's (zeros for a GPT-2), then {llama, experts, moe_every,
 * shared_experts, moe_ffn} at ints 11..15; the parameters fp32 in gpt2_layout's order
 * (the experts' tensors after the dense ones). */
#define LLMC_MODEL_VERSION_EXPERTS_FP32 104

struct llmc_model_header {
    int version; /* 3 = fp32 parameters, 5 = bf16, 103 = a Llama's fp32 */
    int max_seq_len, vocab, layers, heads, hidden, padded_vocab;
    int kv_heads, ffn_hidden, untied; /* versions 103 and 104 only */
    int llama, experts, moe_every, shared_experts, moe_ffn; /* version 104 only */
};

/* The fp32 header of cfg's model: version 3 for a GPT-2, 103 for a Llama, 104 with experts;
 * and the model a header describes. */
struct llmc_model_header llmc_model_header_of(const struct gpt2_config *cfg);
struct gpt2_config llmc_model_config(const struct llmc_model_header *h);

/* Reads and checks the header of an llm.c GPT-2 checkpoint, including that the
 * file is long enough for the parameters the header announces. */
int llmc_read_model_header(const char *path, struct llmc_model_header *out,
                           struct plait_error *err);

/* Reads and checks the header of a token shard; *n_tokens gets the token count and
 * *token_bytes each token's size (2 or 4). The file size must match the count exactly. */
int llmc_read_tokens_header(const char *path, int64_t *n_tokens, int *token_bytes,
                            struct plait_error *err);

/* Fills a 256-int header for a GPT-2 checkpoint / a token shard of 2- or 4-byte tokens. */
void llmc_model_header_fill(int32_t header[LLMC_HEADER_INTS], const struct llmc_model_header *h);
void llmc_tokens_header_fill(int32_t header[LLMC_HEADER_INTS], int64_t n_tokens, int token_bytes);

/* Number of parameters of a GPT-2 with these dimensions (llm.c layout); -1
 * when that many could not be addressed (gpt2_layout). */
int64_t llmc_param_count(int max_seq_len, int padded_vocab, int layers, int hidden);

#endif
