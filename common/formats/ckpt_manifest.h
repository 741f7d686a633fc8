/* ckpt_manifest.h — a checkpoint's manifest.json: its step and micro-batch,
 * the plait that wrote it, every file's size and CRC-32C, and for a
 * checkpoint in parts the layout that wrote it, with (for readers without
 * our code) each tensor's shape and tensor-parallel cut and each part
 * file's slice. ckptdir_commit writes it; ckptdir_verify, ckpt_shards.h
 * (the layout), the runtime's loaders and plait ckpt read it, all through
 * here. What the other files hold is ckpt_shards.h's and ckpt_state.h's. */
#ifndef PLAIT_CKPT_MANIFEST_H
#define PLAIT_CKPT_MANIFEST_H

#include <stdbool.h>
#include <stdint.h>

#include "common/error.h"
#include "common/gpt2/gpt2_shard.h"

/* The layout a checkpoint was written in (a whole checkpoint, model.bin, or
 * one without "layout": all 1). stage_begin/stage_end, when the manifest has
 * "stages", are each stage's first chunk's layers; otherwise NULL (the
 * writer's plan says: cost_stage_part). */
struct ckpt_layout {
    int tp, pp, dp, zero, chunks;
    bool whole; /* it lists model.bin (then no "layout" is written, and the rest is all 1) */
    int *stage_begin, *stage_end; /* pp each, or NULL */
    int dp_shard; /* ZeRO's slices: one per rank of a shard group (hybrid sharding: each
                     replica's ranks hold the same, replica 0's wrote them); read: dp
                     where the manifest says none; written only when not dp */
    bool v_shape;                 /* DualPipeV's two chunks a stage in a V (gpt2_part's) */
    int cp; /* context parallelism (0 or 1: none; written when more): dp counts the dp·cp
               ranks whose slices the parts are, dp/cp of them the data-parallel replicas */
    int ep; /* expert parallelism (0 or 1: none; written when more): dp ranks 0..ep-1 each
               wrote its part (model and optim files named with the dp rank), holding its
               E/ep routed experts (gpt2_shard.h) */
};
void ckpt_layout_free(struct ckpt_layout *l);

struct ckpt_manifest_file { /* int64 words: ranks send them to rank 0 so (ckpt_parts.c) */
    char name[48];
    int64_t bytes, crc32c;
};

struct ckpt_manifest {
    int64_t step, micro;
    char version[64];                 /* of the plait that wrote it */
    struct ckpt_manifest_file *files; /* n_files, in the file's order (by name) */
    int n_files, cap_files;
    struct ckpt_layout layout;
};

/* Adds a file (a name too long for a file record is an error). */
int ckpt_manifest_add(struct ckpt_manifest *m, const char *name, int64_t bytes, uint32_t crc32c,
                      struct plait_error *err);
/* The file `name` lists, or NULL. */
const struct ckpt_manifest_file *ckpt_manifest_find(const struct ckpt_manifest *m,
                                                    const char *name);

/* Writes dir/manifest.json (whole: it appears at once). describe, for a
 * checkpoint in parts with its stages, is the model: "tensors" and each part
 * file's "slice" are written from it (NULL: neither). */
int ckpt_manifest_write(const char *dir, const struct ckpt_manifest *m,
                        const struct gpt2_config *describe, struct plait_error *err);

/* cdir/manifest.json into m; -1 with err naming the file and the member that
 * is wrong (or the layout that is not one). */
int ckpt_manifest_read(const char *cdir, struct ckpt_manifest *m, struct plait_error *err);
void ckpt_manifest_free(struct ckpt_manifest *m);

/* Only the layout of the manifest at cdir (ckpt_layout_free it). */
int ckpt_layout_read(const char *cdir, struct ckpt_layout *out, struct plait_error *err);

#endif
