/* policy.c — limits and GPU quotas for spank_plait. Quotas come from a JSON
 * file ({"users": {"alice": 8, "*": 16}, "accounts": {"research": 32}}) and
 * are counted over the jobs slurmctld reports (slurm_load_jobs). */
#include "spank-plugin/policy.h"

#include "spank-plugin/count.h"

#include <jansson.h>
#include <slurm/slurm.h>
#include <stdlib.h>
#include <string.h>

int policy_check_limits(const struct plait_config *c, const struct policy_job *j,
                        struct plait_error *err)
{
    const struct plan *p = j->plan;
    if (c->max_gpus_per_job && j->gpus > c->max_gpus_per_job)
        return error_set(err,
                         "the plan needs %lld GPUs (parallel.tp × cp × pp × dp); this cluster allows "
                         "at most %d per job (max_gpus_per_job)",
                         (long long)j->gpus, c->max_gpus_per_job);
    if (c->max_nodes && j->nodes > c->max_nodes)
        return error_set(err,
                         "the job has %lld nodes; this cluster allows at most %d per job "
                         "(max_nodes)",
                         (long long)j->nodes, c->max_nodes);
    if (!(c->allowed_precisions & (1u << p->precision))) {
        char allowed[64] = "";
        for (int i = 0; i < PLAN_PRECISIONS; i++)
            if (c->allowed_precisions & (1u << i))
                snprintf(allowed + strlen(allowed), sizeof allowed - strlen(allowed), "%s%s",
                         allowed[0] ? "," : "", plan_precision_name((enum plan_precision)i));
        return error_set(err,
                         "precision: \"%s\" is not allowed on this cluster (allowed_precisions: "
                         "%s)",
                         plan_precision_name(p->precision), allowed);
    }
    if (c->min_checkpoint_every) {
        int every = p->checkpoint.every;
        if (every == 0 && p->steps > c->min_checkpoint_every)
            return error_set(err,
                             "checkpoint.every: 0 checkpoints only at the end of %d steps; "
                             "this cluster asks for one at least every %d steps "
                             "(min_checkpoint_every), so that preemption loses little",
                             p->steps, c->min_checkpoint_every);
        if (every > c->min_checkpoint_every)
            return error_set(err,
                             "checkpoint.every: %d is more than this cluster's %d steps between "
                             "checkpoints (min_checkpoint_every), so that preemption loses little",
                             every, c->min_checkpoint_every);
    }
    return 0;
}

/* ---- quotas ----------------------------------------------------------------------------- */

/* The GPUs in a comma (or semicolon) separated GRES list: "gpu:8",
 * "gpu:a100:8", "gres:gpu:4", "gres/gpu=4" (the count after the last ':' or
 * '='), each times `times`; other GRES are skipped. */
static int64_t gres_gpus(const char *spec, const char *prefix, int64_t times)
{
    int64_t total = 0;
    char *copy = spec ? strdup(spec) : NULL, *save = NULL;
    size_t plen = strlen(prefix);
    for (char *t = copy ? strtok_r(copy, ",;", &save) : NULL; t; t = strtok_r(NULL, ",;", &save)) {
        if (strncmp(t, prefix, plen) != 0 && strncmp(t, "gres/gpu", 8) != 0) continue;
        char *last = strrchr(t, ':'), *eq = strrchr(t, '=');
        char *num = eq && (!last || eq > last) ? eq : last;
        int64_t n = num ? count_parse(num + 1, NULL) : -1;
        if (n > 0) total = count_add(total, count_mul(n, times));
    }
    free(copy);
    return total;
}

/* The GPUs a job holds (running) or asks for (pending), from libslurm's view. */
static int64_t job_gpus(const slurm_job_info_t *job)
{
    /* running: "gpu:8" or "gpu:a100:8", possibly among other GRES */
    if (job->gres_total && *job->gres_total) return gres_gpus(job->gres_total, "gpu:", 1);
    /* pending: "gres:gpu:4" per job, per node (× nodes) or per task (× tasks) */
    return count_add(
        gres_gpus(job->tres_per_job, "gres:gpu", 1),
        count_add(gres_gpus(job->tres_per_node, "gres:gpu", job->num_nodes ? job->num_nodes : 1),
                  gres_gpus(job->tres_per_task, "gres:gpu", job->num_tasks ? job->num_tasks : 1)));
}

/* The quota for name in section ("users"/"accounts"), "*" as the default; -1 = none. */
static int quota_for(json_t *root, const char *section, const char *name, const char *file,
                     int64_t *out, struct plait_error *err)
{
    *out = -1;
    json_t *s = json_object_get(root, section);
    if (!s) return 0;
    if (!json_is_object(s)) return error_set(err, "%s: \"%s\" must be an object", file, section);
    json_t *v = name ? json_object_get(s, name) : NULL;
    if (!v) v = json_object_get(s, "*");
    if (!v) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return error_set(err, "%s: %s.%s must be a non-negative integer", file, section,
                         name && json_object_get(s, name) ? name : "*");
    *out = (int64_t)json_integer_value(v);
    return 0;
}

int policy_check_quota(const struct plait_config *c, const struct policy_job *j,
                       struct plait_error *err)
{
    if (!c->quota_file) return 0;
    json_error_t jerr;
    json_t *root = json_load_file(c->quota_file, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return error_set(err, "%s:%d: %s (the GPU quota file of this cluster; ask its admin)",
                         c->quota_file, jerr.line, jerr.text);
    int rc = -1;
    job_info_msg_t *jobs = NULL;
    const char *key;
    json_t *value;
    json_object_foreach(root, key, value)
    {
        if (strcmp(key, "users") && strcmp(key, "accounts")) {
            error_set(err, "%s: unknown key \"%s\" (known: \"users\", \"accounts\")", c->quota_file,
                      key);
            goto out;
        }
    }
    int64_t user_quota, account_quota;
    if (quota_for(root, "users", j->user, c->quota_file, &user_quota, err) ||
        quota_for(root, "accounts", j->account, c->quota_file, &account_quota, err))
        goto out;
    if (user_quota < 0 && account_quota < 0) {
        rc = 0;
        goto out;
    }
    if (slurm_load_jobs(0, &jobs, SHOW_ALL) != 0) {
        error_set(err, "cannot count GPUs in use for the quota: %s",
                  slurm_strerror(slurm_get_errno()));
        goto out;
    }
    int64_t user_gpus = j->job_id ? 0 : j->gpus, account_gpus = user_gpus;
    for (uint32_t k = 0; k < jobs->record_count; k++) {
        const slurm_job_info_t *job = &jobs->job_array[k];
        uint32_t state = job->job_state & JOB_STATE_BASE;
        bool counts =
            j->job_id ? (state == JOB_RUNNING || state == JOB_SUSPENDED)
                      : (state == JOB_RUNNING || state == JOB_SUSPENDED || state == JOB_PENDING);
        if (!counts) continue;
        int64_t g = job_gpus(job);
        if (job->user_id == j->uid) user_gpus = count_add(user_gpus, g);
        if (j->account && job->account && !strcmp(job->account, j->account))
            account_gpus = count_add(account_gpus, g);
    }
    const char *when = j->job_id ? "running" : "running and pending";
    if (user_quota >= 0 && user_gpus > user_quota) {
        error_set(err,
                  "GPU quota: user %s would have %lld GPUs in %s jobs with this one; the quota is "
                  "%lld (%s)",
                  j->user, (long long)user_gpus, when, (long long)user_quota, c->quota_file);
        goto out;
    }
    if (account_quota >= 0 && j->account && account_gpus > account_quota) {
        error_set(err,
                  "GPU quota: account %s would have %lld GPUs in %s jobs with this one; the "
                  "quota is %lld (%s)",
                  j->account, (long long)account_gpus, when, (long long)account_quota,
                  c->quota_file);
        goto out;
    }
    rc = 0;
out:
    if (jobs) slurm_free_job_info_msg(jobs);
    json_decref(root);
    return rc;
}
