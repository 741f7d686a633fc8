/* submit.c — spank_plait on the submit host (sbatch, salloc, srun): the plan
 * is parsed and checked against the cluster's policy so that a bad plan is
 * refused by the command itself, and the resolved plan travels with the job.
 * A new job reads its own plan; only srun inside a job (a step of it) keeps
 * the plan that travelled with the job. These checks are for the user's
 * benefit; task.c enforces them again. */
#include <errno.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/place/env.h"
#include "common/plan/plan.h"
#include "spank-plugin/plait_spank.h"
#include "spank-plugin/policy.h"

/* What the plugin gave a plait job's batch script and tasks (task.c), which
 * a job submitted from there would otherwise inherit as its own. */
static const char *const parent_contract[] = {
    PLAIT_ENV_PLAN_JSON,    PLAIT_ENV_RESTART_COUNT,
    PLAIT_ENV_RANK,         PLAIT_ENV_WORLD_SIZE,
    PLAIT_ENV_LOCAL_RANK,   PLAIT_ENV_LOCAL_WORLD_SIZE,
    PLAIT_ENV_NODE_RANK,    PLAIT_ENV_NODES,
    PLAIT_ENV_TP,           PLAIT_ENV_PP,
    PLAIT_ENV_DP,           PLAIT_ENV_TP_RANK,
    PLAIT_ENV_PP_RANK,      PLAIT_ENV_DP_RANK,
    PLAIT_ENV_DEVICE,       PLAIT_ENV_GPU_BUSID,
    PLAIT_ENV_NIC,          PLAIT_ENV_CPUS,
    PLAIT_ENV_NUMA,         PLAIT_ENV_STORE_ADDR,
    PLAIT_ENV_STORE_SECRET, PLAIT_SPANK_STORE_PORT_VAR,
};

static void forget(const char *name)
{
    if (unsetenv(name)) msg_error("cannot unset %s: %s", name, strerror(errno));
}

void submit_forget_parent_job(void)
{
    const char *job = getenv("SLURM_JOB_ID");
    bool in_plait_job = job && (getenv("SLURM_SPANK_" PLAIT_SPANK_PLAN_VAR) ||
                                getenv("SLURM_SPANK_" PLAIT_SPANK_OPTION_VAR));
    /* the parent's --train-plan (sbatch would read it back as this job's
     * option) and its checked plan (the new job's tasks would train it) */
    forget("SLURM_SPANK_" PLAIT_SPANK_OPTION_VAR);
    forget(PLAIT_SPANK_OPTION_VAR);
    forget("SLURM_SPANK_" PLAIT_SPANK_PLAN_VAR);
    if (!in_plait_job) return;
    for (size_t k = 0; k < sizeof parent_contract / sizeof parent_contract[0]; k++)
        forget(parent_contract[k]);
    /* the parent's own run directory (<root>/slurm-<job>), not one the user named */
    const char *dir = getenv(PLAIT_ENV_RUN_DIR);
    char suffix[64];
    snprintf(suffix, sizeof suffix, "/slurm-%s", job);
    size_t dlen = dir ? strlen(dir) : 0, slen = strlen(suffix);
    if (dlen >= slen && !strcmp(dir + dlen - slen, suffix)) forget(PLAIT_ENV_RUN_DIR);
}

bool submit_is_plait(const char *plan_path)
{
    if (!plan_path) plan_path = getenv(PLAIT_SPANK_PLAN_ENV);
    bool in_job = spank_context() == S_CTX_LOCAL && getenv("SLURM_JOB_ID");
    return (plan_path && *plan_path) || (in_job && getenv("SLURM_SPANK_" PLAIT_SPANK_PLAN_VAR));
}

int submit_check(spank_t sp, const struct plait_config *c, const char *plan_path)
{
    if (!plan_path) plan_path = getenv(PLAIT_SPANK_PLAN_ENV);
    if (!plan_path || !*plan_path) return 0; /* not a plait job */
    /* srun inside a job starts a step of it: the plan checked when the job
     * was submitted, not the file (which may have changed or gone since).
     * sbatch and salloc, anywhere, start a new job: its own file. */
    bool new_job = spank_context() == S_CTX_ALLOCATOR || !getenv("SLURM_JOB_ID");
    const char *carried = new_job ? NULL : getenv("SLURM_SPANK_" PLAIT_SPANK_PLAN_VAR);
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
    int rc = -1;
    /* a step's GPUs are counted with its job's */
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
