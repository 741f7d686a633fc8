/* k8s_render.h — what plait k8s render's two files share: the job as the plan
 * check decided it (k8s_render.c: the plan, the layout, the workloads), and the
 * pod template every workload carries (k8s_render_pod.c: the container, its
 * resources and volumes, where the pods may run). Not an interface outside
 * launcher/k8s/. */
#ifndef PLAIT_LAUNCHER_K8S_RENDER_H
#define PLAIT_LAUNCHER_K8S_RENDER_H

#include "common/place/cost.h"
#include "common/place/layout.h"
#include "common/plan/plan.h"
#include "common/store/store.h"
#include "launcher/k8s/k8s.h"

#define K8S_CONTAINER "trainer"
#define K8S_REPLICATED_JOB "workers" /* the JobSet's replicated Job, the vcjob's task */
#define K8S_RUN_MOUNT "/plait"

/* What the plan check decided, and what the manifests derive from it. */
struct k8s_job {
    const struct k8s_render_args *a;
    int pods, ranks_per_pod;
    struct cost_layout layout;
    int cp; /* the plan's parallel.cp: a pod's ranks are tp·cp·pp·dp over the pods */
    char plan_cm[96], secret[96], service[96], queue[160];
    char pod_dns[192];
    char *plan_json;
    char store_secret[STORE_SECRET_HEX_BYTES]; /* --secret-file's; "" when referenced */
    int grace_s;
    char grace_why[256];
    int shm_gib;
    int max_restarts; /* --max-restarts, else the plan's checkpoint.max_restarts */
    int cpus;         /* CPUs a pod requests */
    int memory_gib;   /* host memory a pod requests, /dev/shm included */
    char resources_why[320];
};

static inline bool k8s_job_is_jobset(const struct k8s_job *j)
{
    return j->a->workload == K8S_WORKLOAD_JOBSET;
}

/* The pod's CPUs and host memory (j->cpus, j->memory_gib, j->resources_why):
 * its ranks' cores as placed (e->map), and per rank a CUDA process's own
 * memory, the host copy of checkpoint.async, the sampler's model on rank 0,
 * plus /dev/shm (a memory-backed volume counts against the pod's memory). */
void k8s_pod_resources(struct k8s_job *j, const struct plan *p, const struct layout_eval *e);

/* Warns (stderr) about each absolute path of the plan (data, init,
 * checkpoint.dir) under no volume the pods mount: a path of the submitting
 * host. Returns how many. */
int k8s_warn_host_paths(const struct k8s_job *j, const struct plan *p);

/* Whether the run directory lies on a volume that outlives the pods. */
bool k8s_run_dir_persists(const struct k8s_render_args *a);

/* The pod template (metadata and spec) of every pod of the gang into tpl. */
void k8s_pod_template(struct ky_doc *d, int tpl, const struct k8s_job *j);

#endif
