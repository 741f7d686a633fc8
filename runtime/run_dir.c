/* run_dir.c — the run directory as rank 0 takes it: made, locked with its
 * checkpoint directory, emptied by --fresh, checked against the plan that
 * made it; and, after a first start that failed, taken away again. What the
 * run writes there is report.c's (plan.json, metrics, run.json) and the
 * checkpoints'; the files' formats are common/formats/'s. */
#include "runtime/run_dir.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/formats/ckpt_shards.h" // defines: ckpt_verify_all
#include "common/formats/ckptdir.h"
#include "common/formats/rundir.h"
#include "common/formats/runend.h"
#include "common/formats/runlock.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "runtime/console.h"
#include "runtime/train.h" // defines: train_run_held

bool run_dir_has_history(struct trainer *t, bool own)
{
    char path[4096];
    struct stat st;
    struct plait_error err;
    if (!fs_join(path, sizeof path, t->run_dir, RUNDIR_METRICS, &err) && stat(path, &st) == 0 &&
        st.st_size > 0)
        return true;
    size_t len = strlen(t->run_dir);
    if (own && (strncmp(t->ckpt_dir, t->run_dir, len) != 0 || t->ckpt_dir[len] != '/'))
        return false;
    struct ckpt_entry *list;
    int n = 0;
    if (ckptdir_list(&t->ckpts, &list, &n, &err) == 0) free(list);
    return n > 0;
}

const char *run_dir_fresh_advice(struct trainer *t)
{
    struct ckpt_entry *list = NULL;
    int n = 0;
    struct plait_error why;
    bool imported = false;
    if (t->ckpts_open && ckptdir_list(&t->ckpts, &list, &n, &why) == 0)
        for (int i = 0; i < n; i++) imported |= list[i].step == 0 && list[i].micro == 0;
    free(list);
    if (imported)
        return "its checkpoints hold the weights plait ckpt import put there "
               "(step_00000000_0000), which --fresh would remove: to train this plan from them, "
               "import them again into another directory (plait ckpt import IN.bin PLAN --out "
               "DIR)";
    return "to start this plan from scratch there, run plait train with --fresh (removes that "
           "run's checkpoints and metrics), or train into another directory (--out)";
}

/* The run directory belongs to the plan that started it (its plan.json): a
 * different plan may not take it over while it holds history, nor any plan
 * when its plan.json is gone (nothing says which plan made the history). */
static int check_run_plan(struct trainer *t, struct plait_error *err)
{
    char path[4096];
    struct stat st;
    if (fs_join(path, sizeof path, t->run_dir, RUNDIR_PLAN, err)) return -1;
    if (stat(path, &st) != 0 && run_dir_has_history(t, true))
        return error_set(err,
                         "%s holds a run's history (metrics or checkpoints) but no %s, so "
                         "nothing says which plan made it; put its plan back (every checkpoint "
                         "keeps a copy: %s/<checkpoint>/%s); or, %s",
                         t->run_dir, RUNDIR_PLAN, t->ckpt_dir, RUNDIR_PLAN, run_dir_fresh_advice(t));
    if (stat(path, &st) != 0 || !run_dir_has_history(t, false)) return 0;
    struct plan *before = rundir_plan_load(t->run_dir, err);
    char notes[1024];
    struct plait_error why;
    int rc = before ? plan_resumable(before, t->plan, notes, sizeof notes, &why) : -1;
    if (rc)
        error_set(err, "%s holds a run of a different plan (%s: %s); %s", t->run_dir,
                  before ? "fields that may not change" : "its plan.json does not load",
                  before ? why.text : err->text, run_dir_fresh_advice(t));
    plan_free(before);
    return rc;
}

/* plait train --fresh: the run directory's history goes. */
static int start_fresh(struct trainer *t, struct plait_error *err)
{
    int n = ckptdir_remove_all(&t->ckpts, err);
    if (n < 0) return error_prefix(err, "--fresh: ");
    static const char *const files[] = {RUNDIR_METRICS, RUNDIR_PLAN, RUNDIR_RUN, RUNDIR_LOG};
    char path[4096];
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        if (fs_join(path, sizeof path, t->run_dir, files[i], err)) return -1;
        if (unlink(path) != 0 && errno != ENOENT)
            return error_errno(err, "--fresh: removing %s", path);
    }
    log_info("--fresh: removed %d checkpoint%s and the metrics of the previous run in %s", n,
             n == 1 ? "" : "s", t->run_dir);
    return 0;
}

/* The checkpoint directory, locked like the run directory: another run
 * directory's plan could name the same one. */
static int checkpoint_path(struct trainer *t, struct plait_error *err)
{
    return rundir_checkpoint_dir(t->plan, t->run_dir, t->ckpt_dir, sizeof t->ckpt_dir, err);
}

static int open_checkpoints(struct trainer *t, struct plait_error *err)
{
    if (fs_mkdir_p_made(t->ckpt_dir, &t->made_ckpt_dir, err))
        return error_prefix(err, "checkpoint.dir: ");
    /* locked even inside the run directory: another run may name it as its own */
    if (ckptdir_open_locked(&t->ckpts, &t->ckpt_lock, t->ckpt_dir, t->run_dir, err)) return -1;
    t->ckpts_open = true;
    return 0;
}

/* Whether the run trained all its steps already: its newest checkpoint ends a step at or past
 * the plan's steps, and verifies. Such a rerun changes nothing in the run directory. */
static bool already_finished(struct trainer *t)
{
    struct ckpt_entry *list;
    int n;
    struct plait_error why;
    if (ckptdir_list(&t->ckpts, &list, &n, &why)) return false;
    bool done = n > 0 && list[0].micro == 0 && list[0].step >= t->plan->steps &&
                ckpt_verify_all(&t->ckpts, list[0].name, &why) == 0;
    free(list);
    return done;
}

/* Rank 0 owns the run directory: its lock, its checkpoints' directory, a
 * fresh start, and the check that it belongs to this plan. */
static int open_run(struct trainer *t, struct plait_error *err)
{
    if (fs_mkdir_p_made(t->run_dir, &t->made_run_dir, err) ||
        runlock_acquire(&t->run_lock, t->run_dir, "run directory", err))
        return -1;
    const char *fresh = getenv(PLAIT_ENV_FRESH);
    if (open_checkpoints(t, err) || (fresh && !strcmp(fresh, "1") && start_fresh(t, err)) ||
        check_run_plan(t, err))
        return -1;
    if (already_finished(t)) return 0; /* its end stays, and its console log */
    /* the run is this process's now (a refused start leaves it as it was): no
     * end yet, and the console kept in train.log */
    train_run_held = true;
    runend_clear(t->run_dir);
    struct plait_error why;
    if (console_start(t->run_dir, &why))
        log_warn("the console is not kept in the run directory: %s", why.text);
    return 0;
}

/* Every rank learns whether any failed: one with its own reason keeps it,
 * the others say who failed (rank 0, owner of the run directory, for setup). */
static int agree(struct trainer *t, int failed, const struct plait_error *why, const char *others,
                 struct plait_error *err)
{
    int any = failed;
    if (parallel_max_int(&t->par, &any, err)) return -1;
    if (!any) return 0;
    if (failed) {
        *err = *why;
        return -1;
    }
    return error_set(err, "%s", others);
}

int run_dir_open(struct trainer *t, struct plait_error *err)
{
    struct plait_error why = {.text = ""};
    int failed = checkpoint_path(t, &why) || (t->where->rank == 0 && open_run(t, &why));
    return agree(t, failed, &why, "rank 0 could not open the run (see its message)", err);
}

void run_dir_undo_failed_start(struct trainer *t, bool history)
{
    static const char *const files[] = {RUNDIR_LOCK, RUNDIR_PLAN, RUNDIR_RUN, RUNDIR_METRICS,
                                        RUNDIR_LOG};
    char path[4096];
    struct plait_error ignored;
    if (!history && t->made_ckpt_dir &&
        !fs_join(path, sizeof path, t->ckpt_dir, RUNDIR_LOCK, &ignored)) {
        unlink(path);
        fs_rmdir_up(t->ckpt_dir, t->made_ckpt_dir);
    }
    for (size_t k = 0; !history && t->made_run_dir && k < sizeof files / sizeof *files; k++)
        if (!fs_join(path, sizeof path, t->run_dir, files[k], &ignored)) unlink(path);
    if (!history) fs_rmdir_up(t->run_dir, t->made_run_dir);
    free(t->made_run_dir);
    free(t->made_ckpt_dir);
}
