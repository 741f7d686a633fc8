/* ckpt_parts.h — checkpoints of a job of several ranks. Each rank writes its
 * part into the checkpoint's temporary directory (a shared file system
 * across nodes), rank 0 gathers every file's size and checksum, writes the
 * manifest (with the layout) and commits, and the step becomes visible only
 * when every part is durable. Files:
 *   model-tpT-ppP.bin         the part's parameters (dp rank 0 writes it)
 *   optim-tpT-ppP.bin         its AdamW moments (ZeRO 0: dp rank 0)
 *   optim-tpT-ppP-dpD.bin     a dp rank's slice of them (ZeRO >= 1)
 *   grads-tpT-ppP-dpD.bin     mid-step: this rank's accumulated gradients
 *   state.json, plan.json     rank 0
 * Tensors are written instance by instance in llm.c order (tensor, then
 * layer), slices as they lie in memory; each file starts with a 1 KiB
 * header saying what it holds.
 *
 * Loading (which checkpoint: ckpt_resume.h): each rank reads its part. A checkpoint of
 * the same layout is read part by part; one written whole (model.bin and
 * optim.bin, by a single rank or tp = pp = 1 without ZeRO) by any layout,
 * each rank taking its part of it. Any other layout is resharded: each rank
 * reads the slices of its part out of the other layout's files
 * (common/formats/ckpt_shards.h); only an unfinished step's gradients need the
 * layout that made them. */
#ifndef PLAIT_RUNTIME_CKPT_PARTS_H
#define PLAIT_RUNTIME_CKPT_PARTS_H

#include "common/formats/ckptdir.h"
#include "common/error.h"
#include "common/plan/plan.h"
#include "runtime/ckpt.h"
#include "runtime/model.h"
#include "runtime/parallel.h"

/* Every rank calls it; d is rank 0's directory (NULL on the others, which
 * use dir). ckpt_parts_begin, _write and _commit, in that order. */
int ckpt_parts_save(struct ckptdir *d, const char *dir, const struct model *m,
                    const struct train_state *st, int keep, const char *plan_json,
                    struct parallel *par, struct plait_error *err);

/* The phases of a save, so that the files can be written by another thread
 * (checkpoint.async): begin (every rank: rank 0 makes the temporary
 * directory), write (this rank's files; no collective, so any thread),
 * commit (every rank: the records to rank 0, which writes the manifest and
 * makes the checkpoint visible, then prunes). */
#define CKPT_PART_FILES 5 /* a rank's files at most: model, optim, grads, state, plan */
struct ckpt_parts_job {
    char name[48], tmp[4096];
    struct ckpt_manifest_file mine[CKPT_PART_FILES]; /* gathered by rank 0; bytes < 0: none */
    int failed;                                      /* the write's outcome */
    struct plait_error why;
};
int ckpt_parts_begin(struct ckptdir *d, const char *dir, const struct train_state *st,
                     struct parallel *par, struct ckpt_parts_job *job, struct plait_error *err);
void ckpt_parts_write(struct ckpt_parts_job *job, const struct model *m,
                      const struct train_state *st, const char *plan_json,
                      const struct env_rank *w);
int ckpt_parts_commit(struct ckptdir *d, struct ckpt_parts_job *job, const struct model *m,
                      int keep, struct parallel *par, struct plait_error *err);

/* Whether this rank's model can resume the checkpoint at cdir: its own
 * layout, a whole model (ckpt_load_whole says more), or any other layout at
 * the end of a step. -1 with err saying why not. */
int ckpt_layout_check(const char *cdir, const struct model *m, struct plait_error *err);

/* Loads the parameters and optimizer moments of this rank's part (and the
 * state) from a checkpoint in parts written by any layout, reading only the
 * slices the part needs. */
int ckpt_load_resharded(const char *cdir, struct model *m, struct train_state *st,
                        struct plait_error *err);

/* Whether the checkpoint's layout is this model's own (the same parts, ZeRO and chunks). */
bool ckpt_layout_same(const struct ckpt_layout *l, const struct model *m);

/* Loads this rank's accumulated gradients of an unfinished step (its own layout's file). */
int ckpt_load_grads(const char *cdir, struct model *m, const struct env_rank *w,
                    struct plait_error *err);

#endif
