/* ckpt_resume.c — which checkpoint a run resumes from, and loading it whatever layout wrote
 * it (ckpt_resume.h). Writing and reading one layout's files are ckpt.c's (whole) and
 * ckpt_parts.c's (in parts). */
#include "runtime/ckpt_resume.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/formats/ckpt_shards.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/formats/rundir.h"
#include "common/plan/lr_schedule.h"

/* The plan a checkpoint of `step` steps was written by, against the one resuming it; a
 * learning rate that jumps at the resumed step is warned of. */
int ckpt_check_plan(const char *cdir, int64_t step, const struct plan *plan, char *notes,
                    size_t notes_bytes, struct plait_error *err)
{
    struct plan *before = rundir_plan_load(cdir, err); /* plan_to_json's, read back as written */
    if (!before) return error_prefix(err, "cannot tell which plan wrote it: ");
    int rc = plan_resumable(before, plan, notes, notes_bytes, err);
    char jump[256];
    if (!rc && step < INT_MAX && plan_lr_jump(before, plan, (int)step, jump, sizeof jump))
        log_warn("%s", jump);
    plan_free(before);
    return rc;
}

int ckpt_choose(struct ckptdir *d, const struct plan *plan, const struct model *m,
                int (*accept)(const char *cdir, void *ctx, struct plait_error *why), void *ctx,
                char *name, size_t name_bytes, char *notes, size_t notes_bytes,
                struct plait_error *err)
{
    struct ckpt_entry *list;
    int n;
    name[0] = '\0';
    if (ckptdir_list(d, &list, &n, err)) return -1;
    int rc = 0;
    for (int i = 0; i < n; i++) {
        char cdir[4096];
        struct plait_error why;
        if (fs_join(cdir, sizeof cdir, d->path, list[i].name, &why) ||
            ckpt_verify_all(d, list[i].name, &why)) {
            log_warn("checkpoint %s is unusable: %s; trying an older one", cdir, why.text);
            continue;
        }
        if (ckpt_check_plan(cdir, list[i].step, plan, notes, notes_bytes, &why)) {
            error_set(err, "checkpoint %s was written by a different plan: %s", cdir, why.text);
            rc = CKPT_NOT_THIS_RUN;
            break;
        }
        if (ckpt_layout_check(cdir, m, &why)) { /* not unusable: not to skip */
            error_set(err, "checkpoint %s: %s", cdir, why.text);
            rc = CKPT_NOT_THIS_RUN;
            break;
        }
        if (accept && accept(cdir, ctx, &why)) {
            log_warn("checkpoint %s is unusable: %s; trying an older one", cdir, why.text);
            continue;
        }
        snprintf(name, name_bytes, "%s", list[i].name);
        rc = 1;
        break;
    }
    if (rc == 0 && n > 0) {
        error_set(err, "%s: none of its %d checkpoint%s is usable (see the warnings above)",
                  d->path, n, n == 1 ? "" : "s");
        rc = CKPT_NOT_THIS_RUN;
    }
    free(list);
    return rc;
}

struct load_into {
    struct model *m;
    struct train_state *st;
};

static int load_one(const char *cdir, void *ctx, struct plait_error *why)
{
    struct load_into *l = ctx;
    struct ckpt_layout layout;
    if (ckpt_layout_read(cdir, &layout, why)) return -1;
    bool whole = layout.whole;
    ckpt_layout_free(&layout);
    return whole ? ckpt_load_whole(cdir, l->m, l->st, why)
                 : ckpt_load_resharded(cdir, l->m, l->st, why);
}

int ckpt_load_latest(struct ckptdir *d, const struct plan *plan, struct model *m,
                     struct train_state *st, char *name, size_t name_bytes, char *notes,
                     size_t notes_bytes, struct plait_error *err)
{
    struct load_into l = {m, st};
    return ckpt_choose(d, plan, m, load_one, &l, name, name_bytes, notes, notes_bytes, err);
}

int ckpt_parts_load(struct ckptdir *d, const char *dir, const struct plan *plan, struct model *m,
                    struct train_state *st, char *name, size_t name_bytes, char *notes,
                    size_t notes_bytes, struct parallel *par, struct plait_error *err)
{
    const struct env_rank *w = &par->where;
    /* rank 0 chooses: the name, or "" for none, or "!<why none belongs>", or "#<error>" */
    char choice[1100] = "";
    if (w->rank == 0) {
        struct plait_error why;
        int rc =
            ckpt_choose(d, plan, m, NULL, NULL, choice, sizeof choice, notes, notes_bytes, &why);
        if (rc < 0)
            snprintf(choice, sizeof choice, "%c%s", rc == CKPT_NOT_THIS_RUN ? '!' : '#', why.text);
    }
    if (parallel_share_text(par, "the checkpoint to resume", choice, sizeof choice, err)) return -1;
    if (choice[0] == '!' || choice[0] == '#') {
        error_set(err, "%s", choice + 1);
        return choice[0] == '!' ? CKPT_NOT_THIS_RUN : -1;
    }
    if (!choice[0]) return 0;
    char cdir[4096];
    if (fs_join(cdir, sizeof cdir, dir, choice, err)) return -1;
    struct ckpt_layout l;
    int failed = ckpt_layout_read(cdir, &l, err) != 0;
    struct plait_error why = {.text = ""};
    if (!failed && l.whole) {
        failed = ckpt_load_whole(cdir, m, st, &why) != 0;
    } else if (!failed) {
        /* parameters and moments from any layout; an unfinished step's own
         * gradients (the same layout only) from this rank's file */
        failed = ckpt_load_resharded(cdir, m, st, &why) != 0;
        if (!failed && st->micro > 0) failed = ckpt_load_grads(cdir, m, w, &why) != 0;
        if (!failed && !ckpt_layout_same(&l, m) && w->rank == 0)
            log_info("checkpoint %s: resharded from tp %d × pp %d × dp %d (ZeRO %d) to tp %d × "
                     "pp %d × dp %d (ZeRO %d)",
                     choice, l.tp, l.pp, l.dp, l.zero, w->tp, w->pp, w->dp, m->zero);
    }
    ckpt_layout_free(&l);
    int any = failed;
    if (parallel_max_int(par, &any, err)) return -1;
    if (any)
        return error_set(err, "checkpoint %s: %s", cdir,
                         failed ? why.text : "another rank could not load its part");
    snprintf(name, name_bytes, "%s", choice);
    return 1;
}
