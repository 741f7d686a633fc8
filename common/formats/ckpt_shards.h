/* ckpt_shards.h — the files inside a checkpoint directory, whatever layout
 * wrote them: their names, the header each part file starts with, which slice
 * of every GPT-2 tensor each holds, and reading any range of any other
 * layout's part out of them (resharding). The runtime writes part files
 * through the names and headers here; it and `plait ckpt` (verify, export)
 * read through ckpt_source. The directory protocol (manifest, checksums,
 * commit) is ckptdir.h's.
 *
 * Two kinds of checkpoint:
 *   whole   model.bin (an llm.c GPT-2 file, fp32), optim.bin (OPTIM header,
 *           then AdamW m and v over the whole model in llm.c order and,
 *           mid-step, the gradients): one rank, or tp = pp = 1 without ZeRO
 *   parts   model-tpT-ppP.bin        the part's parameters
 *           model-tpT-ppP-dpD.bin    ZeRO 3: dp rank D's slice of them, as the
 *                                    moments' below
 *           optim-tpT-ppP.bin        its moments m then v (ZeRO 0)
 *           optim-tpT-ppP-dpD.bin    dp rank D's slice of them (ZeRO >= 1): m's
 *                                    slice then v's, of the part's layer-major
 *                                    buffer padded to a multiple of dp
 *           grads-tpT-ppP-dpD.bin    mid-step: a rank's accumulated gradients
 * Every file but the two text ones (state.json, plan.json) starts with a
 * 1 KiB header; the instances of a part file are in llm.c order (tensor, then
 * layer: gpt2_shard_instance_at), each the tp rank's slice as gpt2_shard.h
 * cuts it. */
#ifndef PLAIT_CKPT_SHARDS_H
#define PLAIT_CKPT_SHARDS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/formats/ckpt_manifest.h"
#include "common/error.h"
#include "common/gpt2/gpt2_shard.h"
#include "common/formats/llmc.h"
#include "common/plan/plan.h"

#define CKPT_PART_MAGIC 20261124
#define CKPT_PART_VERSION 1
#define CKPT_OPTIM_MAGIC 20261122 /* optim.bin of a whole checkpoint */
#define CKPT_OPTIM_VERSION 1

enum ckpt_part_kind { CKPT_PART_MODEL = 1, CKPT_PART_OPTIM = 2, CKPT_PART_GRADS = 3 };

/* Where a part file's rank sits, and what it holds. */
struct ckpt_part_id {
    int tp, tp_rank, pp, pp_rank, dp, dp_rank, zero;
    int chunks;   /* model chunks of the stage (interleaved), 1 otherwise */
    size_t count; /* floats of each array */
    int arrays;   /* arrays one after the other (m and v: 2) */
    /* the stage's layers [layer_begin, layer_end) (its first chunk's, when
     * chunked): said by every part so a manifest's stages cannot be swapped
     * under them; files before this say none (header words 0) */
    int layer_begin, layer_end;
};

/* "model-tp0-pp1.bin", "optim-tp0-pp1-dp2.bin": with_dp adds the dp rank. */
void ckpt_part_name(char *out, size_t bytes, enum ckpt_part_kind kind, int tp_rank, int pp_rank,
                    int dp_rank, bool with_dp);
void ckpt_part_header(int32_t h[LLMC_HEADER_INTS], enum ckpt_part_kind kind,
                      const struct ckpt_part_id *id);
/* optim.bin's header: {magic, version, count (low, high 32 bits), has_grads}. */
void ckpt_optim_header(int32_t h[LLMC_HEADER_INTS], size_t count, bool grads);

/* The batch the newest checkpoint of the run in run_dir was trained with: its
 * plan's grad_accum, the dp its manifest records, and their product, the
 * global batch in micro-batches a step. 1 when found; 0 when the run has no
 * checkpoint that reads, or its plan's batch.micro_batch is not p's (its
 * micro-batches are then not p's). A launcher whose plan leaves dp "auto" keeps
 * that global batch when the ranks it is given change (a node lost). */
struct ckpt_batch {
    int64_t global;
    int dp, grad_accum;
};
int ckpt_newest_batch(const struct plan *p, const char *run_dir, struct ckpt_batch *out);

/* A checkpoint to read any part of any layout from. */
struct ckpt_source {
    char dir[4096];
    struct gpt2_config cfg;
    struct ckpt_layout layout;
    int step, micro;           /* from state.json */
    struct gpt2_shard *stages; /* pp shards, tp rank 0 (the others differ only in rank) */
    size_t *slice;             /* per stage: floats of a dp rank's ZeRO slice */
    int *layer_stage;          /* per layer: the stage that holds it */
    int *fds;                  /* open part files, -1 closed: see ckpt_shards.c */
    size_t n_fds;
    int64_t bytes_read;
};

/* Opens the checkpoint at cdir: its manifest's layout, its plan.json (the
 * model's dimensions and the stage split) and state.json. It reads no part
 * yet; ckptdir_verify is the caller's. */
int ckpt_source_open(struct ckpt_source *s, const char *cdir, struct plait_error *err);
void ckpt_source_close(struct ckpt_source *s);

/* Whether the checkpoint is complete: its manifest lists every file its
 * layout writes (every part of every rank; an unfinished step's gradients of
 * every rank) and each part file's header says the place the manifest gives
 * it. Sizes and checksums are ckptdir_verify's. -1 with err naming the first
 * file missing or wrong. */
int ckpt_source_check(struct ckpt_source *s, struct plait_error *err);

/* Whether checkpoint `name` of d can be loaded: its files against the
 * manifest (ckptdir_verify: sizes, checksums), then every part against its
 * own header (ckpt_source_check: what it holds, all its bytes). What plait
 * ckpt verify says, and what a run's start takes. 0, or -1 with why. */
struct ckptdir;
int ckpt_verify_all(struct ckptdir *d, const char *name, struct plait_error *why);

enum ckpt_array { CKPT_PARAMS, CKPT_ADAM_M, CKPT_ADAM_V };

/* Elements [lo, hi) of array a of the part `dst` (its layer-major buffer,
 * gpt2_shard.h) into out, read from the source's files: only the slices that
 * hold them, each file's header checked on first use. Elements at or beyond
 * dst->total (the ZeRO padding) are 0. dst's model must be the source's
 * (same dimensions); its layout may be any. */
int ckpt_source_read(struct ckpt_source *s, enum ckpt_array a, const struct gpt2_shard *dst,
                     size_t lo, size_t hi, float *out, struct plait_error *err);

#endif
