/* ckptdir.h — a directory of checkpoints, whatever is inside them: names,
 * listing, the manifest (sizes and CRC-32C of every file), verifying, and the
 * commit protocol that makes a checkpoint visible only when complete.
 *
 * A checkpoint is a directory step_SSSSSSSS_MMMM (S optimizer steps done, M
 * micro-batches done of the next step; at least 8 and 4 digits, more when the
 * numbers need them), ordered by (S, M). It is written under .tmp-<name>,
 * every file and the manifest fsynced, then renamed. Re-saving a name that
 * exists moves the old one to .old-<name> first; ckptdir_open finishes or
 * undoes a commit that a crash interrupted, so every state on disk between
 * any two system calls leads back to a complete checkpoint, and removes the
 * temporaries of writers that died. The runtime writes the files' contents;
 * `plait ckpt` and `plait status` read through this module too. The
 * manifest's format is ckpt_manifest.h's. */
#ifndef PLAIT_CKPTDIR_H
#define PLAIT_CKPTDIR_H

#include <stdbool.h>
#include <stdint.h>

#include "common/ckpt_manifest.h"
#include "common/error.h"
#include "common/runlock.h" // defines: struct runlock

struct ckpt_entry {
    char name[48];
    int64_t step, micro;
};

/* A checkpoint's directory name ("step_00000012_0003") read into e: false
 * for any other name (temporaries, or not this canonical spelling). */
bool ckptdir_parse_name(const char *name, struct ckpt_entry *e);

/* One process's view of a checkpoint directory: which checkpoints it has seen
 * verify (or wrote itself) and which failed, so each is read at most once. */
struct ckptdir {
    char *path;
    char **good, **bad;
    int n_good, n_bad;
};

/* Opens dir (created if missing), recovers an interrupted commit and removes
 * abandoned temporaries. The caller holds the directory's lock (runlock). */
int ckptdir_open(struct ckptdir *d, const char *dir, struct plait_error *err);

/* ckptdir_open for any command that writes or cleans the checkpoints of the
 * run in run_dir (whose lock the caller holds): first the checkpoint
 * directory's own lock into *lock (not taken when dir is run_dir itself),
 * since ckptdir_open's cleaning removes temporaries only a dead writer may
 * have left, and a run writing into dir holds its lock. dir must exist. On
 * failure no lock is held. */
int ckptdir_open_locked(struct ckptdir *d, struct runlock *lock, const char *dir,
                        const char *run_dir, struct plait_error *err);
void ckptdir_close(struct ckptdir *d);

/* The checkpoint name for (step, micro). */
void ckptdir_name(char *out, size_t bytes, int64_t step, int64_t micro);

/* The checkpoints present, newest first (malloc'ed array into *out). */
int ckptdir_list(const struct ckptdir *d, struct ckpt_entry **out, int *n, struct plait_error *err);

/* Verifies checkpoint `name` against its manifest (every listed file's size
 * and checksum; state.json and a model must be listed: model.bin with
 * optim.bin, or model-*.bin parts), once per process. 0 good, -1 with err
 * saying what is wrong. */
int ckptdir_verify(struct ckptdir *d, const char *name, struct plait_error *err);

/* Writing one checkpoint: begin makes an empty temporary directory (its path
 * into tmp), each file is written with ckpt_file_* (and listed in a
 * manifest), commit writes the manifest (its step, micro-batch and version
 * set here; describe as ckpt_manifest_write) and makes it visible as `name`;
 * abort removes the temporary. A failed commit removes it too: no temporary
 * outlives a failure. */
struct ckpt_file {
    int fd;
    char path[4096];
    const char *name;
    uint64_t bytes;
    uint32_t crc;
};
int ckptdir_begin(struct ckptdir *d, const char *name, char *tmp, size_t tmp_bytes,
                  struct plait_error *err);
int ckpt_file_open(struct ckpt_file *f, const char *tmp, const char *name, struct plait_error *err);
int ckpt_file_put(struct ckpt_file *f, const void *buf, size_t bytes, struct plait_error *err);
/* fsyncs and closes; lists the file (its bytes and CRC-32C) in m unless m is NULL. */
int ckpt_file_close(struct ckpt_file *f, struct ckpt_manifest *m, struct plait_error *err);
void ckpt_file_discard(struct ckpt_file *f);
/* A whole file at once: open, put, close (f keeps its bytes and crc). */
int ckpt_file_write(struct ckpt_file *f, const char *tmp, const char *name, const void *data,
                    size_t bytes, struct ckpt_manifest *m, struct plait_error *err);
int ckptdir_commit(struct ckptdir *d, const char *name, const char *tmp, struct ckpt_manifest *m,
                   const struct gpt2_config *describe, struct plait_error *err);
void ckptdir_abort(const char *tmp);

/* Removes every checkpoint beyond the newest `keep` that verify; ones that do
 * not verify never count (and older ones go too). */
void ckptdir_prune(struct ckptdir *d, int keep);

/* Removes every checkpoint and temporary (plait train --fresh); returns how
 * many checkpoints were removed, or -1. */
int ckptdir_remove_all(struct ckptdir *d, struct plait_error *err);

#endif
