/* submit.c — spank_plait on the submit host (sbatch, salloc, srun): the plan
 * is parsed and checked against the cluster's policy so that a bad plan is
 * refused by the command itself, and the resolved plan travels with the job.
 * These checks are for the user's benefit; task.c enforces them again. */
#include <pwd.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/plan.h"
#include "spank-plugin/plait_spank.h"
#include "spank-plugin/policy.h"

int submit_check(spank_t sp, const struct plait_config *c, const char *plan_path)
{
    if (!plan_path) plan_path = getenv(PLAIT_SPANK_PLAN_ENV);
    if (!plan_path || !*plan_path) return 0; /* not a plait job */
    /* srun inside a job whose plan was checked at submit: that plan, not the
     * file (which may have changed or gone since) */
    const char *carried =
        getenv("SLURM_JOB_ID") ? getenv("SLURM_SPANK_" PLAIT_SPANK_PLAN_VAR) : NULL;
    struct plait_error err;
    struct plan *p = carried ? plan_load_text(carried, "the job's plan", NULL, NULL, 0, &err)
                             : plan_load(plan_path, NULL, 0, &err);
    if (!p) return msg_error("%s", err.text);
    struct passwd *pw = getpwuid(getuid());
    const char *account = getenv("SBATCH_ACCOUNT");
    if (!account) account = getenv("SLURM_ACCOUNT");
    struct policy_job job = {.plan = p,
                             .gpus = plan_ranks(p), /* 0: dp "auto", not known yet */
                             .uid = getuid(),
                             .user = pw ? pw->pw_name : "?",
                             .account = account};
    /* srun inside an allocation starts a step of a job whose GPUs are counted */
    bool new_job = spank_context() == S_CTX_ALLOCATOR || !getenv("SLURM_JOB_ID");
    int rc = -1;
    if (policy_check_limits(c, &job, &err) || (new_job && policy_check_quota(c, &job, &err))) {
        msg_error("%s: %s", plan_path, err.text);
        goto out;
    }
    char *line = plan_to_json_line(p);
    if (!line) {
        msg_error("out of memory");
        goto out;
    }
    if (spank_job_control_setenv(sp, PLAIT_SPANK_PLAN_VAR, line, 1) != ESPANK_SUCCESS)
        msg_error("could not attach the plan to the job; tasks will read %s", plan_path);
    free(line);
    rc = 0;
out:
    plan_free(p);
    return rc;
}
