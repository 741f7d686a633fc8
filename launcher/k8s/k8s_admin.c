/* k8s_admin.c — plait k8s admin: what an admin applies once per team so that jobs
 * rendered by plait k8s render are admitted and preempted by priority: Kueue's
 * ResourceFlavor, ClusterQueue (nvidia.com/gpu quota), LocalQueue and
 * WorkloadPriorityClasses, or a Volcano Queue, or a ResourceQuota on
 * requests.nvidia.com/gpu; PriorityClasses in every case. */
#include <stdio.h>
#include <string.h>

#include "common/place/env.h"
#include "common/log.h"
#include "launcher/k8s/k8s.h"

static bool begin(struct ky_doc *d, struct plait_error *err, int *rc)
{
    if (*rc) return false;
    if (ky_init(d)) *rc = error_set(err, "building a manifest: out of memory");
    return *rc == 0;
}

static void label_plait(struct ky_doc *d, int meta)
{
    ky_set_str(d, ky_set_map(d, meta, "labels"), "app.kubernetes.io/name", "plait");
}

/* highest first: 100000, 10000, 1000, ... */
static long long priority_value(int k)
{
    long long v = 100000;
    for (int i = 0; i < k && v > 1; i++) v /= 10;
    return v;
}

static void priority_classes(struct ky_stream *s, const struct k8s_admin_args *a, bool kueue,
                             struct plait_error *err, int *rc)
{
    for (int k = 0; k < a->n_priorities; k++) {
        struct ky_doc d;
        bool lowest = k == a->n_priorities - 1;
        if (!begin(&d, err, rc)) return;
        int meta = ky_object(&d, "scheduling.k8s.io/v1", "PriorityClass", a->priorities[k], NULL);
        label_plait(&d, meta);
        ky_set_int(&d, ky_root(&d), "value", priority_value(k));
        ky_set_bool(&d, ky_root(&d), "globalDefault", false);
        ky_set_str(&d, ky_root(&d), "preemptionPolicy", lowest ? "Never" : "PreemptLowerPriority");
        ky_set_str(&d, ky_root(&d), "description",
                   lowest ? "plait training: preempted first, preempts nothing"
                          : "plait training: preempts lower priorities");
        *rc = ky_stream_add(s, &d, err);
        if (!kueue) continue;
        /* Kueue orders and preempts workloads by its own class of the same name */
        if (!begin(&d, err, rc)) return;
        meta = ky_object(&d, a->kueue_api, "WorkloadPriorityClass", a->priorities[k], NULL);
        label_plait(&d, meta);
        ky_set_int(&d, ky_root(&d), "value", priority_value(k));
        *rc = ky_stream_add(s, &d, err);
    }
}

static void gpu_tolerations(struct ky_doc *d, int spec)
{
    int tol = ky_push(d, ky_set_seq(d, spec, "tolerations"), ky_map(d));
    ky_set_str(d, tol, "key", "nvidia.com/gpu");
    ky_set_str(d, tol, "operator", "Exists");
    ky_set_str(d, tol, "effect", "NoSchedule");
}

static void kueue(struct ky_stream *s, const struct k8s_admin_args *a, struct plait_error *err,
                  int *rc)
{
    char flavor[128], cq[128], topology[128];
    snprintf(flavor, sizeof flavor, "%s-gpu", a->ns);
    snprintf(cq, sizeof cq, "%s-%s", a->ns, a->queue);
    snprintf(topology, sizeof topology, "%s-topology", a->ns);
    struct ky_doc d;
    if (a->n_levels) {
        if (!begin(&d, err, rc)) return;
        label_plait(&d, ky_object(&d, a->kueue_api, "Topology", topology, NULL));
        int levels = ky_set_seq(&d, ky_set_map(&d, ky_root(&d), "spec"), "levels");
        for (int k = 0; k < a->n_levels; k++)
            ky_set_str(&d, ky_push(&d, levels, ky_map(&d)), "nodeLabel", a->levels[k]);
        *rc = ky_stream_add(s, &d, err);
    }
    if (!begin(&d, err, rc)) return;
    label_plait(&d, ky_object(&d, a->kueue_api, "ResourceFlavor", flavor, NULL));
    int spec = ky_set_map(&d, ky_root(&d), "spec");
    if (a->gpu_product)
        ky_set_str(&d, ky_set_map(&d, spec, "nodeLabels"), "nvidia.com/gpu.product",
                   a->gpu_product);
    if (a->n_levels) ky_set_str(&d, spec, "topologyName", topology);
    gpu_tolerations(&d, spec);
    *rc = ky_stream_add(s, &d, err);

    if (!begin(&d, err, rc)) return;
    label_plait(&d, ky_object(&d, a->kueue_api, "ClusterQueue", cq, NULL));
    spec = ky_set_map(&d, ky_root(&d), "spec");
    int sel = ky_set_map(&d, ky_set_map(&d, spec, "namespaceSelector"), "matchLabels");
    ky_set_str(&d, sel, "kubernetes.io/metadata.name", a->ns);
    /* v1beta2 renamed the field */
    if (a->cohort)
        ky_set_str(&d, spec, strstr(a->kueue_api, "v1beta1") ? "cohort" : "cohortName", a->cohort);
    int pre = ky_set_map(&d, spec, "preemption");
    ky_set_str(&d, pre, "withinClusterQueue", "LowerPriority");
    if (a->cohort) ky_set_str(&d, pre, "reclaimWithinCohort", "Any");
    int group = ky_push(&d, ky_set_seq(&d, spec, "resourceGroups"), ky_map(&d));
    int covered = ky_set(&d, group, "coveredResources", ky_flow_seq(&d));
    ky_push(&d, covered, ky_str(&d, "nvidia.com/gpu"));
    if (a->rdma) ky_push(&d, covered, ky_str(&d, a->rdma));
    int fl = ky_push(&d, ky_set_seq(&d, group, "flavors"), ky_map(&d));
    ky_set_str(&d, fl, "name", flavor);
    int res = ky_set_seq(&d, fl, "resources");
    int r = ky_push(&d, res, ky_map(&d));
    ky_set_str(&d, r, "name", "nvidia.com/gpu");
    ky_set_int(&d, r, "nominalQuota", a->gpus);
    if (a->rdma) { /* as many RDMA devices as GPUs: the GPUs are the limit */
        r = ky_push(&d, res, ky_map(&d));
        ky_set_str(&d, r, "name", a->rdma);
        ky_set_int(&d, r, "nominalQuota", a->gpus);
    }
    *rc = ky_stream_add(s, &d, err);

    if (!begin(&d, err, rc)) return;
    label_plait(&d, ky_object(&d, a->kueue_api, "LocalQueue", a->queue, a->ns));
    ky_set_str(&d, ky_set_map(&d, ky_root(&d), "spec"), "clusterQueue", cq);
    *rc = ky_stream_add(s, &d, err);
}

static void volcano(struct ky_stream *s, const struct k8s_admin_args *a, struct plait_error *err,
                    int *rc)
{
    /* cluster-scoped: named per namespace, so that two teams' queues differ */
    char queue[160];
    snprintf(queue, sizeof queue, "%s-%s", a->ns, a->queue);
    struct ky_doc d;
    if (!begin(&d, err, rc)) return;
    label_plait(&d, ky_object(&d, "scheduling.volcano.sh/v1beta1", "Queue", queue, NULL));
    int spec = ky_set_map(&d, ky_root(&d), "spec");
    ky_set_int(&d, spec, "weight", 1);
    ky_set_bool(&d, spec, "reclaimable", true);
    char gpus[32];
    snprintf(gpus, sizeof gpus, "%d", a->gpus);
    ky_set_str(&d, ky_set_map(&d, spec, "capability"), "nvidia.com/gpu", gpus);
    *rc = ky_stream_add(s, &d, err);
}

static void quota(struct ky_stream *s, const struct k8s_admin_args *a, struct plait_error *err,
                  int *rc)
{
    struct ky_doc d;
    if (!begin(&d, err, rc)) return;
    label_plait(&d, ky_object(&d, "v1", "ResourceQuota", "gpu-quota", a->ns));
    char gpus[32];
    snprintf(gpus, sizeof gpus, "%d", a->gpus);
    /* extended resources: only the requests. prefix is legal in a quota */
    ky_set_str(&d, ky_set_map(&d, ky_set_map(&d, ky_root(&d), "spec"), "hard"),
               "requests.nvidia.com/gpu", gpus);
    *rc = ky_stream_add(s, &d, err);
}

int k8s_admin(const struct k8s_admin_args *a, FILE *out)
{
    struct plait_error err;
    struct ky_stream s;
    int built = ky_stream_open(&s, &err), rc = PLAIT_EXIT_ERROR;
    if (a->gang == K8S_GANG_KUEUE) kueue(&s, a, &err, &built);
    if (a->gang == K8S_GANG_VOLCANO) volcano(&s, a, &err, &built);
    if (a->gang == K8S_GANG_QUOTA) quota(&s, a, &err, &built);
    priority_classes(&s, a, a->gang == K8S_GANG_KUEUE, &err, &built);
    if (built)
        log_error("k8s admin: %s", err.text);
    else
        rc = k8s_print_linted(&s, "k8s admin", out);
    ky_stream_free(&s);
    return rc;
}
