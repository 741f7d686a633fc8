/* ckpt.h — checkpoints of one rank: weights (an llm.c GPT-2 file, so other
 * tools can read them), AdamW moments, the gradients of an unfinished step,
 * the training state (step, data position, RNG) and the resolved plan, tied
 * together by a manifest of sizes and CRC-32C checksums.
 *
 * The directory, naming, manifest and the commit protocol are
 * common/formats/ckptdir.h's: a checkpoint is visible only when complete.
 * Which checkpoint a run resumes from is ckpt_resume.h's. */
#ifndef PLAIT_RUNTIME_CKPT_H
#define PLAIT_RUNTIME_CKPT_H

#include <stdint.h>

#include "common/formats/ckpt_state.h"
#include "common/formats/ckptdir.h"
#include "common/error.h"
#include "common/plan/plan.h"
#include "runtime/data.h"
#include "runtime/model.h"

/* Backend memory streamed into a checkpoint file through a host buffer of
 * CKPT_HOST_FLOATS floats (ckpt.c's files and ckpt_parts.c's alike). */
#define CKPT_HOST_FLOATS (1u << 18) /* 1 MiB through host memory at a time */
struct ckpt_put {
    struct ckpt_file *f;
    const struct ops *ops;
    struct ops_ctx *ctx;
    const float *src; /* a parameter-shaped buffer of backend memory */
    float *host;      /* CKPT_HOST_FLOATS floats */
    struct plait_error *err;
    const struct offload *off; /* or, where src is NULL, moment `moment` of these files */
    int moment;
};

/* gpt2_shard_each's visitor (ctx: a struct ckpt_put): src's elements
 * [off, off + n) into the file. Visiting the whole model in llm.c order
 * writes exactly an llm.c file's body. */
int ckpt_put_instance(void *ctx, enum gpt2_tensor t, int layer, size_t off, size_t n);

/* Writes a checkpoint of the model and state into d and keeps the newest
 * `keep` that verify. The gradients are saved when st->micro > 0. plan_json
 * (the resolved plan) is stored beside. On failure nothing of it remains. */
int ckpt_save(struct ckptdir *d, const struct model *m, const struct train_state *st, int keep,
              const char *plan_json, struct plait_error *err);

/* ckpt_save's phases (checkpoint.async writes in another thread): begin
 * makes the temporary directory, write writes and fsyncs the files (any
 * thread), commit makes the checkpoint visible (or removes the temporary of a
 * failed write, returning its error) and prunes. */
struct ckpt_job {
    char name[48], tmp[4096];
    struct ckpt_manifest manifest; /* the files written */
    bool begun;                    /* between begin and commit */
    int failed;
    struct plait_error why;
};
int ckpt_begin(struct ckptdir *d, const struct train_state *st, struct ckpt_job *job,
               struct plait_error *err);
void ckpt_write(struct ckpt_job *job, const struct model *m, const struct train_state *st,
                const char *plan_json);
int ckpt_commit(struct ckptdir *d, struct ckpt_job *job, int keep, struct plait_error *err);

/* Loads a whole-model checkpoint (model.bin, optim.bin) into any part of the model (each rank
 * takes its part, ZeRO its slice; a mid-step one only with dp = 1). */
int ckpt_load_whole(const char *cdir, struct model *m, struct train_state *st,
                    struct plait_error *err);

#endif
