/* hf_model.h — a Hugging Face model directory as plait's tensors: its
 * config.json (GPT2LMHeadModel, or a Llama-shaped model: LlamaForCausalLM,
 * MistralForCausalLM, Qwen3ForCausalLM's dense layout) and its weights, one
 * model.safetensors or shards named by model.safetensors.index.json, read by
 * transformers' names into llm.c's order (common/gpt2/gpt2_layout.h says how
 * a Llama fills GPT-2's tensors). */
#ifndef PLAIT_FORMATS_HF_MODEL_H
#define PLAIT_FORMATS_HF_MODEL_H

#include <stdbool.h>

#include "common/error.h"
#include "common/formats/safetensors.h"
#include "common/gpt2/gpt2_layout.h"

struct hf_config {
    char arch[64]; /* architectures[0] */
    bool llama;    /* the Llama family (else GPT-2) */
    int layers, heads, kv_heads, hidden, ffn_hidden, vocab, max_seq_len;
    double rope_theta, norm_eps;
    bool tied; /* tie_word_embeddings */
};

/* Whether path is a directory holding a config.json. */
bool hf_is_model_dir(const char *path);

/* dir/config.json: -1 with err naming the file and member when it is not a
 * model plait trains (another architecture, biases on q/k/v, a rope_scaling,
 * sliding windows). */
int hf_config_read(const char *dir, struct hf_config *out, struct plait_error *err);

/* The whole model of cfg (its dimensions the directory's) into full, in
 * llm.c order (gpt2_layout): each tensor found by its name, its shape
 * checked, packed (q, k, v; gate, up) and, for GPT-2's Conv1D weights,
 * transposed; the vocabulary's padding rows zero. A tied model's
 * lm_head.weight, if the directory has one, must equal the embedding. -1 with
 * err naming the file and tensor that is missing, of another shape, or a
 * tied head that differs. */
int hf_model_read(const char *dir, const struct gpt2_config *cfg, float *full,
                  struct plait_error *err);

/* The reverse: the whole model of cfg (full, in llm.c order) written into
 * dir (created if needed) as config.json and safetensors of dtype (ST_F32, or
 * ST_BF16 rounded to nearest even) in transformers' names, files of at most
 * shard_bytes of tensors each (one tensor larger than that has a file of its
 * own) with model.safetensors.index.json, each written to a temporary name,
 * fsynced, renamed. The vocabulary's padding rows are not written. */
int hf_model_write(const char *dir, const struct gpt2_config *cfg, const float *full,
                   size_t shard_bytes, enum st_dtype dtype, struct plait_error *err);

/* Whether the directory's config.json describes cfg's model (its tensors'
 * shapes); -1 with err naming the first dimension that differs. */
int hf_config_check(const char *dir, const struct gpt2_config *cfg, struct plait_error *err);

#endif
