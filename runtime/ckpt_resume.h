/* ckpt_resume.h — which checkpoint a run resumes from, and loading it whatever
 * layout wrote it. The newest that verifies (a corrupt or truncated one is
 * reported and skipped), and only if it belongs to the run being resumed: a
 * checkpoint written by a plan that differs in anything but the fields that
 * may change on resume (plan_resumable) is refused, never trained on top of.
 * One rank alone: ckpt_load_latest; every rank of a job: ckpt_parts_load
 * (rank 0 chooses and tells the others). */
#ifndef PLAIT_RUNTIME_CKPT_RESUME_H
#define PLAIT_RUNTIME_CKPT_RESUME_H

#include "runtime/ckpt.h"
#include "runtime/ckpt_parts.h"

/* The newest checkpoint of d to resume: the newest that verifies (older ones
 * are tried past one that does not, with a warning), provided it was written
 * by a plan this one may resume (notes: what changed) in a layout this model
 * can load, and that accept (may be NULL) takes (a failure there counts as
 * unusable). Returns 1 with its name, 0 when d has none, CKPT_NOT_THIS_RUN as
 * ckpt_load_latest, -1 on any other failure. */
int ckpt_choose(struct ckptdir *d, const struct plan *plan, const struct model *m,
                int (*accept)(const char *cdir, void *ctx, struct plait_error *why), void *ctx,
                char *name, size_t name_bytes, char *notes, size_t notes_bytes,
                struct plait_error *err);

/* Loads the newest checkpoint of d that verifies. Returns 1 when one was
 * loaded (its name into name, what changed from its plan into notes), 0 when
 * there is none, CKPT_NOT_THIS_RUN when none is usable or the newest usable
 * one belongs to another plan or layout (err names the differing fields:
 * starting afresh is the user's call), -1 on any other failure. */
enum { CKPT_NOT_THIS_RUN = -2 };
int ckpt_load_latest(struct ckptdir *d, const struct plan *plan, struct model *m,
                     struct train_state *st, char *name, size_t name_bytes, char *notes,
                     size_t notes_bytes, struct plait_error *err);

/* The plan a checkpoint of `step` steps was written by, against the one resuming it (notes:
 * what changed); a learning rate that jumps at the resumed step is warned of. */
int ckpt_check_plan(const char *cdir, int64_t step, const struct plan *plan, char *notes,
                    size_t notes_bytes, struct plait_error *err);

/* Every rank calls it: 1 loaded (name, notes as ckpt_load_latest), 0 none,
 * CKPT_NOT_THIS_RUN or -1 as ckpt_load_latest (on every rank). */
int ckpt_parts_load(struct ckptdir *d, const char *dir, const struct plan *plan, struct model *m,
                    struct train_state *st, char *name, size_t name_bytes, char *notes,
                    size_t notes_bytes, struct parallel *par, struct plait_error *err);

#endif
