/* rundir.c — a run directory's plan.json and the checkpoint directory its
 * plan names (rundir.h). The other files are their own modules'. */
#include "common/formats/rundir.h"

#include <stdio.h>
#include <string.h>

#include "common/fsutil.h"

int rundir_plan_write(const char *dir, const char *plan_json, struct plait_error *err)
{
    char path[4096];
    if (fs_join(path, sizeof path, dir, RUNDIR_PLAN, err)) return -1;
    return fs_write_atomic(path, plan_json, strlen(plan_json), err);
}

struct plan *rundir_plan_load(const char *dir, struct plait_error *err)
{
    char path[4096];
    if (fs_join(path, sizeof path, dir, RUNDIR_PLAN, err)) return NULL;
    return plan_load(path, NULL, 0, err);
}

int rundir_checkpoint_dir(const struct plan *p, const char *run_dir, char *out, size_t bytes,
                          struct plait_error *err)
{
    if (p->checkpoint.dir[0] == '/') {
        if (snprintf(out, bytes, "%s", p->checkpoint.dir) >= (int)bytes)
            return error_set(err, "checkpoint.dir: path too long");
        return 0;
    }
    return fs_join(out, bytes, run_dir, p->checkpoint.dir, err)
               ? error_prefix(err, "checkpoint.dir: ")
               : 0;
}
