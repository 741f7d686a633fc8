/* policy.h — the admin's rules applied to one job: the plan against the
 * limits (GPUs, nodes, precision, checkpoint interval), and GPU quotas per
 * user and per account counted through libslurm. Submit-time checks count the
 * user's running and pending jobs plus this one; start-time checks count the
 * running jobs, this one included. Counts are 64-bit and saturate instead of
 * wrapping (a count that large is over any limit anyway). */
#ifndef PLAIT_SPANK_POLICY_H
#define PLAIT_SPANK_POLICY_H

#include <stdint.h>
#include <sys/types.h>

#include "common/error.h"
#include "common/plan/plan.h"
#include "spank-plugin/config.h"

struct policy_job {
    const struct plan *plan;
    int64_t gpus;  /* GPUs it uses; 0 when not known yet (dp "auto" at submit) */
    int64_t nodes; /* 0 when not known (at submit) */
    uid_t uid;
    const char *user;
    const char *account; /* may be NULL (not known at submit) */
    uint32_t job_id;     /* 0 at submit; at start, the job itself (it is running) */
};

/* The plan and size limits of plugstack.conf. */
int policy_check_limits(const struct plait_config *c, const struct policy_job *j,
                        struct plait_error *err);

/* The quota file, if configured. It asks slurmctld for every job
 * (slurm_load_jobs): call it once per job, not once per task. */
int policy_check_quota(const struct plait_config *c, const struct policy_job *j,
                       struct plait_error *err);

#endif
