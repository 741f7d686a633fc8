/* k8s_render.c — plait k8s render: the plan checked as plait check checks it
 * (same parser, placement, memory model, layout choice), then one gang-scheduled
 * job's manifests: ConfigMap (the resolved plan), Secret (the store's), the
 * gang's objects, and the JobSet or Indexed Job whose pods run `plait launch`
 * with launcher/k8s/k8s_env.h's env. Not here: options (cmd_k8s.c), YAML, lint. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/place/env.h"
#include "common/place/layout.h"
#include "common/log.h"
#include "common/plan/plan.h"
#include "common/store/store.h"
#include "launcher/k8s/k8s.h"
#include "launcher/k8s/k8s_env.h"
#include "launcher/k8s/k8s_lint.h"
#include "launcher/plan_fit.h"

#define CONTAINER "trainer"
#define REPLICATED_JOB "workers"
#define RUN_MOUNT "/plait"
/* a test-only knob: a fixed store secret, so that golden manifests compare */
#define TEST_SECRET_ENV "PLAIT_K8S_TEST_STORE_SECRET"

/* What the plan check decided, and what the manifests derive from it. */
struct job {
    const struct k8s_render_args *a;
    bool jobset;
    int pods, ranks_per_pod;
    struct cost_layout layout;
    char plan_cm[96], secret[96], service[96];
    char pod_dns[192];
    char *plan_json;
    char store_secret[STORE_SECRET_HEX_BYTES];
    int grace_s;
    char grace_why[256];
    int shm_gib;
    int max_restarts; /* --max-restarts, else the plan's checkpoint.max_restarts */
};

/* ---- estimates ---------------------------------------------------------------------- */

/* terminationGracePeriodSeconds: on SIGTERM the runtime finishes the
 * micro-batch it is in and writes a checkpoint (examples/slurm/ADMIN.md sizes
 * Slurm's GraceTime the same way): the cost model's step time over the
 * micro-batches, and about 16 bytes per parameter of each rank's shard (its
 * fp32 weights and AdamW moments, the most loaded stage) at the pod's write
 * rate, or the write time measured by a run (run.json's last_write_s); twice
 * the write with checkpoint.async (one still in the background is finished
 * first); plus a margin for start-up, fsync and exit. */
static void grace_estimate(struct job *j, const struct plan *p, const struct layout_eval *e)
{
    const double margin_s = 30, bytes_per_param = 16;
    const struct k8s_render_args *a = j->a;
    double micro_s = e->time.total_s / (p->batch.grad_accum > 0 ? p->batch.grad_accum : 1);
    double pod_bytes = (double)e->mem.param_count * bytes_per_param * j->ranks_per_pod;
    double one_s = a->ckpt_write_s > 0 ? a->ckpt_write_s : pod_bytes / (a->ckpt_gbps * 1e9);
    int writes = p->checkpoint.async ? 2 : 1;
    char how[128];
    if (a->ckpt_write_s > 0)
        snprintf(how, sizeof how, "as measured");
    else
        snprintf(how, sizeof how, "%.2f GB per pod at %g GB/s", pod_bytes / 1e9, a->ckpt_gbps);
    j->grace_s = (int)ceil(micro_s + writes * one_s + margin_s);
    snprintf(j->grace_why, sizeof j->grace_why,
             "%d s = one micro-batch %.2f s + %scheckpoint write %.1f s (%s) + %.0f s margin",
             j->grace_s, micro_s, writes == 2 ? "2 × " : "", one_s, how, margin_s);
}

/* /dev/shm: NCCL's shared-memory transport between the ranks of a pod keeps
 * buffers per ordered pair of local ranks (NCCL_BUFFSIZE 4 MiB on up to 16
 * channels: 64 MiB a pair), and the socket backend of CPU ranks its rings; 1
 * GiB on top for everything else. */
static int shm_gib(int ranks_per_pod)
{
    double pairs = (double)ranks_per_pod * (ranks_per_pod - 1);
    return 1 + (int)ceil(pairs * 64.0 / 1024.0);
}

/* ---- the pieces ------------------------------------------------------------------------- */

/* Starts the next document unless an earlier one failed (*rc != 0). */
static bool begin(struct ky_doc *d, struct plait_error *err, int *rc)
{
    if (*rc) return false;
    if (ky_init(d)) *rc = error_set(err, "building a manifest: out of memory");
    return *rc == 0;
}

static void labels(struct ky_doc *d, int meta, const struct job *j)
{
    int l = ky_set_map(d, meta, "labels");
    ky_set_str(d, l, "app.kubernetes.io/name", "plait");
    ky_set_str(d, l, "plait.dev/job", j->a->name);
    if (j->a->gang == K8S_GANG_KUEUE) {
        ky_set_str(d, l, "kueue.x-k8s.io/queue-name", j->a->queue);
        if (j->a->priority) ky_set_str(d, l, "kueue.x-k8s.io/priority-class", j->a->priority);
    }
}

static void plan_config_map(struct ky_stream *s, const struct job *j, struct plait_error *err,
                            int *rc)
{
    struct ky_doc d;
    if (!begin(&d, err, rc)) return;
    int meta = ky_object(&d, "v1", "ConfigMap", j->plan_cm, j->a->ns);
    labels(&d, meta, j);
    int data = ky_set_map(&d, ky_root(&d), "data");
    ky_set(&d, data, "plan.json", ky_literal(&d, j->plan_json));
    *rc = ky_stream_add(s, &d, err);
}

static void store_secret(struct ky_stream *s, const struct job *j, struct plait_error *err, int *rc)
{
    struct ky_doc d;
    if (!begin(&d, err, rc)) return;
    int meta = ky_object(&d, "v1", "Secret", j->secret, j->a->ns);
    labels(&d, meta, j);
    ky_set_str(&d, ky_root(&d), "type", "Opaque");
    int data = ky_set_map(&d, ky_root(&d), "stringData");
    ky_set_str(&d, data, "secret", j->store_secret);
    *rc = ky_stream_add(s, &d, err);
}

static void headless_service(struct ky_stream *s, const struct job *j, struct plait_error *err,
                             int *rc)
{
    struct ky_doc d;
    if (!begin(&d, err, rc)) return;
    int meta = ky_object(&d, "v1", "Service", j->service, j->a->ns);
    labels(&d, meta, j);
    int spec = ky_set_map(&d, ky_root(&d), "spec");
    ky_set_str(&d, spec, "clusterIP", "None");
    /* DNS before readiness: pod 0 must resolve while the gang meets */
    ky_set_bool(&d, spec, "publishNotReadyAddresses", true);
    int sel = ky_set_map(&d, spec, "selector");
    ky_set_str(&d, sel, "plait.dev/job", j->a->name);
    int port = ky_push(&d, ky_set_seq(&d, spec, "ports"), ky_map(&d));
    ky_set_str(&d, port, "name", "store");
    ky_set_int(&d, port, "port", j->a->port);
    *rc = ky_stream_add(s, &d, err);
}

static void pod_group(struct ky_stream *s, const struct job *j, struct plait_error *err, int *rc)
{
    struct ky_doc d;
    if (!begin(&d, err, rc)) return;
    bool volcano = j->a->gang == K8S_GANG_VOLCANO;
    int meta =
        ky_object(&d, volcano ? "scheduling.volcano.sh/v1beta1" : "scheduling.x-k8s.io/v1alpha1",
                  "PodGroup", j->a->name, j->a->ns);
    labels(&d, meta, j);
    int spec = ky_set_map(&d, ky_root(&d), "spec");
    ky_set_int(&d, spec, "minMember", j->pods); /* all or nothing */
    char gpus[32];
    snprintf(gpus, sizeof gpus, "%d", j->pods * j->a->gpus_per_node);
    int min_res = ky_set_map(&d, spec, "minResources");
    ky_set_str(&d, min_res, "nvidia.com/gpu", gpus);
    if (volcano) {
        ky_set_str(&d, spec, "queue", j->a->queue);
        if (j->a->priority) ky_set_str(&d, spec, "priorityClassName", j->a->priority);
    } else {
        ky_set_int(&d, spec, "scheduleTimeoutSeconds", j->a->schedule_timeout_s);
    }
    *rc = ky_stream_add(s, &d, err);
}

static void env_value(struct ky_doc *d, int env, const char *name, const char *value)
{
    int e = ky_push(d, env, ky_map(d));
    ky_set_str(d, e, "name", name);
    ky_set_str(d, e, "value", value);
}

static void env_int(struct ky_doc *d, int env, const char *name, long long value)
{
    char text[32];
    snprintf(text, sizeof text, "%lld", value);
    env_value(d, env, name, text);
}

/* extended resources: nvidia.com/gpu and the RDMA devices, requests = limits */
static void resources(struct ky_doc *d, int container, const struct job *j)
{
    int res = ky_set_map(d, container, "resources");
    const char *which[] = {"requests", "limits"};
    for (int k = 0; k < 2; k++) {
        int m = ky_set_map(d, res, which[k]);
        ky_set_int(d, m, "nvidia.com/gpu", j->a->gpus_per_node);
        if (j->a->rdma) ky_set_int(d, m, j->a->rdma, j->a->rdma_per_pod);
    }
}

static void container(struct ky_doc *d, int spec, const struct job *j)
{
    const struct k8s_render_args *a = j->a;
    int c = ky_push(d, ky_set_seq(d, spec, "containers"), ky_map(d));
    ky_set_str(d, c, "name", CONTAINER);
    ky_set_str(d, c, "image", a->image);
    int cmd = ky_set(d, c, "command", ky_flow_seq(d));
    ky_push(d, cmd, ky_str(d, "plait"));
    ky_push(d, cmd, ky_str(d, "launch"));
    int env = ky_set_seq(d, c, "env");
    env_int(d, env, K8S_ENV_PODS, j->pods);
    env_int(d, env, K8S_ENV_RANKS_PER_POD, j->ranks_per_pod);
    env_value(d, env, K8S_ENV_POD_DNS, j->pod_dns);
    env_int(d, env, K8S_ENV_STORE_PORT, a->port);
    env_int(d, env, K8S_ENV_GANG_TIMEOUT_S, a->gang_timeout_s);
    env_value(d, env, PLAIT_ENV_PLAN, K8S_PLAN_PATH);
    env_value(d, env, PLAIT_ENV_RUN_DIR, a->run_dir);
    int e = ky_push(d, env, ky_map(d));
    ky_set_str(d, e, "name", PLAIT_ENV_STORE_SECRET);
    int ref = ky_set_map(d, ky_set_map(d, e, "valueFrom"), "secretKeyRef");
    ky_set_str(d, ref, "name", j->secret);
    ky_set_str(d, ref, "key", "secret");
    if (j->jobset) { /* JobSet counts its restarts of the gang in a pod label */
        e = ky_push(d, env, ky_map(d));
        ky_set_str(d, e, "name", K8S_ENV_RESTART_ATTEMPT);
        int field = ky_set_map(d, ky_set_map(d, e, "valueFrom"), "fieldRef");
        ky_set_str(d, field, "fieldPath", "metadata.labels['jobset.sigs.k8s.io/restart-attempt']");
    }
    int port = ky_push(d, ky_set_seq(d, c, "ports"), ky_map(d));
    ky_set_str(d, port, "name", "store");
    ky_set_int(d, port, "containerPort", a->port);
    resources(d, c, j);
    if (a->rdma) { /* verbs pin memory */
        int caps = ky_set_map(d, ky_set_map(d, c, "securityContext"), "capabilities");
        ky_push(d, ky_set(d, caps, "add", ky_flow_seq(d)), ky_str(d, "IPC_LOCK"));
    }
    int mounts = ky_set_seq(d, c, "volumeMounts");
    const char *names[] = {"plan", "dshm", "run"}, *paths[] = {"/etc/plait", "/dev/shm", RUN_MOUNT};
    for (int k = 0; k < 3; k++) {
        int m = ky_push(d, mounts, ky_map(d));
        ky_set_str(d, m, "name", names[k]);
        ky_set_str(d, m, "mountPath", paths[k]);
        if (k == 0) ky_set_bool(d, m, "readOnly", true);
    }
}

static void volumes(struct ky_doc *d, int spec, const struct job *j)
{
    int vols = ky_set_seq(d, spec, "volumes");
    int v = ky_push(d, vols, ky_map(d));
    ky_set_str(d, v, "name", "plan");
    ky_set_str(d, ky_set_map(d, v, "configMap"), "name", j->plan_cm);
    v = ky_push(d, vols, ky_map(d));
    ky_set_str(d, v, "name", "dshm");
    int shm = ky_set_map(d, v, "emptyDir");
    ky_set_str(d, shm, "medium", "Memory");
    char size[32];
    snprintf(size, sizeof size, "%dGi", j->shm_gib);
    ky_set_str(d, shm, "sizeLimit", size);
    v = ky_push(d, vols, ky_map(d));
    ky_set_str(d, v, "name", "run");
    if (j->a->pvc)
        ky_set_str(d, ky_set_map(d, v, "persistentVolumeClaim"), "claimName", j->a->pvc);
    else
        ky_set(d, v, "emptyDir", ky_flow_map(d));
}

/* All pods in one --topology-key domain: required when pipelines cross pods
 * (in Megatron's rank order a pipeline's stages are tp·dp ranks apart, so
 * each pipeline spans the whole pod index range), preferred otherwise (only
 * data-parallel reductions cross pods; tensor-parallel groups never do), unless
 * --topology-mode says. */
static bool topology_required(const struct job *j)
{
    return j->a->topology_required >= 0 ? j->a->topology_required == 1 : j->layout.pp > 1;
}

static void affinity(struct ky_doc *d, int spec, const struct job *j)
{
    int pa = ky_set_map(d, ky_set_map(d, spec, "affinity"), "podAffinity");
    int term;
    if (topology_required(j)) {
        term = ky_push(d, ky_set_seq(d, pa, "requiredDuringSchedulingIgnoredDuringExecution"),
                       ky_map(d));
    } else {
        int w = ky_push(d, ky_set_seq(d, pa, "preferredDuringSchedulingIgnoredDuringExecution"),
                        ky_map(d));
        ky_set_int(d, w, "weight", 100);
        term = ky_set_map(d, w, "podAffinityTerm");
    }
    ky_set_str(d, term, "topologyKey", j->a->topology_key);
    int sel = ky_set_map(d, ky_set_map(d, term, "labelSelector"), "matchLabels");
    ky_set_str(d, sel, "plait.dev/job", j->a->name);
}

/* The pod template: what every pod of the gang is. */
static void pod_template(struct ky_doc *d, int tpl, const struct job *j)
{
    const struct k8s_render_args *a = j->a;
    int meta = ky_set_map(d, tpl, "metadata");
    int l = ky_set_map(d, meta, "labels");
    ky_set_str(d, l, "app.kubernetes.io/name", "plait");
    ky_set_str(d, l, "plait.dev/job", a->name);
    if (a->gang == K8S_GANG_COSCHEDULING) /* joined by a label */
        ky_set_str(d, l, "scheduling.x-k8s.io/pod-group", a->name);
    int ann = ky_set_map(d, meta, "annotations");
    ky_set_str(d, ann, "plait.dev/termination-grace", j->grace_why);
    if (a->gang == K8S_GANG_VOLCANO) /* the only key Volcano's scheduler reads for membership */
        ky_set_str(d, ann, "scheduling.k8s.io/group-name", a->name);
    if (a->gang == K8S_GANG_KUEUE && a->topology_key)
        ky_set_str(d, ann,
                   topology_required(j) ? "kueue.x-k8s.io/podset-required-topology"
                                        : "kueue.x-k8s.io/podset-preferred-topology",
                   a->topology_key);
    int spec = ky_set_map(d, tpl, "spec");
    ky_set_str(d, spec, "restartPolicy", "Never");
    if (!j->jobset) ky_set_str(d, spec, "subdomain", j->service);
    if (a->gang == K8S_GANG_VOLCANO) ky_set_str(d, spec, "schedulerName", "volcano");
    if (a->gang == K8S_GANG_COSCHEDULING) ky_set_str(d, spec, "schedulerName", a->scheduler);
    if (a->priority) ky_set_str(d, spec, "priorityClassName", a->priority);
    ky_set_int(d, spec, "terminationGracePeriodSeconds", j->grace_s);
    ky_set_bool(d, spec, "enableServiceLinks", false);
    if (a->gpu_product)
        ky_set_str(d, ky_set_map(d, spec, "nodeSelector"), "nvidia.com/gpu.product",
                   a->gpu_product);
    if (a->topology_key && a->gang != K8S_GANG_KUEUE) affinity(d, spec, j);
    int tol = ky_push(d, ky_set_seq(d, spec, "tolerations"), ky_map(d));
    ky_set_str(d, tol, "key", "nvidia.com/gpu");
    ky_set_str(d, tol, "operator", "Exists");
    ky_set_str(d, tol, "effect", "NoSchedule");
    container(d, spec, j);
    volumes(d, spec, j);
}

/* podFailurePolicy: 75 (preempted, checkpoint written) does not count;
 * 1 and 2 (bad plan, bad command line) fail the job at once; a disruption
 * (preemption, eviction, node drain) does not count. Anything else (76: a peer
 * was lost) counts against backoffLimit. */
static void job_spec(struct ky_doc *d, int spec, const struct job *j, int backoff)
{
    ky_set_str(d, spec, "completionMode", "Indexed");
    ky_set_int(d, spec, "completions", j->pods);
    ky_set_int(d, spec, "parallelism", j->pods);
    ky_set_int(d, spec, "backoffLimit", backoff);
    /* a pod's replacement starts only once it is gone: one pod per index at the barrier */
    ky_set_str(d, spec, "podReplacementPolicy", "Failed");
    int rules = ky_set_seq(d, ky_set_map(d, spec, "podFailurePolicy"), "rules");
    const struct {
        const char *action;
        int codes[2], n;
    } by_code[] = {{"Ignore", {PLAIT_EXIT_PREEMPTED}, 1},
                   {"FailJob", {PLAIT_EXIT_ERROR, PLAIT_EXIT_USAGE}, 2}};
    for (int k = 0; k < 2; k++) {
        int r = ky_push(d, rules, ky_map(d));
        ky_set_str(d, r, "action", by_code[k].action);
        int on = ky_set_map(d, r, "onExitCodes");
        ky_set_str(d, on, "containerName", CONTAINER);
        ky_set_str(d, on, "operator", "In");
        int vals = ky_set(d, on, "values", ky_flow_seq(d));
        for (int c = 0; c < by_code[k].n; c++) ky_push(d, vals, ky_int(d, by_code[k].codes[c]));
    }
    int r = ky_push(d, rules, ky_map(d));
    ky_set_str(d, r, "action", "Ignore");
    int cond = ky_push(d, ky_set_seq(d, r, "onPodConditions"), ky_map(d));
    ky_set_str(d, cond, "type", "DisruptionTarget");
    pod_template(d, ky_set_map(d, spec, "template"), j);
}

static void annotations(struct ky_doc *d, int meta, const struct job *j)
{
    int ann = ky_set_map(d, meta, "annotations");
    char text[160];
    snprintf(text, sizeof text, "tp %d × pp %d × dp %d = %d ranks, %d pods × %d", j->layout.tp,
             j->layout.pp, j->layout.dp, j->pods * j->ranks_per_pod, j->pods, j->ranks_per_pod);
    ky_set_str(d, ann, "plait.dev/layout", text);
    ky_set_str(d, ann, "plait.dev/termination-grace", j->grace_why);
}

static void jobset(struct ky_stream *s, const struct job *j, struct plait_error *err, int *rc)
{
    struct ky_doc d;
    if (!begin(&d, err, rc)) return;
    int meta = ky_object(&d, "jobset.x-k8s.io/v1alpha2", "JobSet", j->a->name, j->a->ns);
    labels(&d, meta, j);
    annotations(&d, meta, j);
    int spec = ky_set_map(&d, ky_root(&d), "spec");
    if (j->a->gang == K8S_GANG_KUEUE) ky_set_bool(&d, spec, "suspend", true); /* Kueue admits */
    int net = ky_set_map(&d, spec, "network");
    ky_set_bool(&d, net, "enableDNSHostnames", true);
    ky_set_str(&d, net, "subdomain", j->service);
    ky_set_bool(&d, net, "publishNotReadyAddresses", true);
    int success = ky_set_map(&d, spec, "successPolicy");
    ky_set_str(&d, success, "operator", "All");
    ky_push(&d, ky_set(&d, success, "targetReplicatedJobs", ky_flow_seq(&d)),
            ky_str(&d, REPLICATED_JOB));
    /* a lost pod fails its Job (backoffLimit 0), and the whole gang is recreated */
    int fail = ky_set_map(&d, spec, "failurePolicy");
    ky_set_int(&d, fail, "maxRestarts", j->max_restarts);
    ky_set_str(&d, fail, "restartStrategy", "Recreate");
    int rules = ky_set_seq(&d, fail, "rules");
    int r = ky_push(&d, rules, ky_map(&d));
    ky_set_str(&d, r, "name", "failOnBadConfig");
    ky_set_str(&d, r, "action", "FailJobSet");
    ky_push(&d, ky_set(&d, r, "onJobFailureReasons", ky_flow_seq(&d)),
            ky_str(&d, "PodFailurePolicy"));
    r = ky_push(&d, rules, ky_map(&d));
    ky_set_str(&d, r, "name", "restartTheGang");
    ky_set_str(&d, r, "action", "RestartJobSet");
    int rj = ky_push(&d, ky_set_seq(&d, spec, "replicatedJobs"), ky_map(&d));
    ky_set_str(&d, rj, "name", REPLICATED_JOB);
    ky_set_int(&d, rj, "replicas", 1); /* one Job: JOB_COMPLETION_INDEX is the gang's index */
    job_spec(&d, ky_set_map(&d, ky_set_map(&d, rj, "template"), "spec"), j, 0);
    *rc = ky_stream_add(s, &d, err);
}

static void indexed_job(struct ky_stream *s, const struct job *j, struct plait_error *err, int *rc)
{
    struct ky_doc d;
    if (!begin(&d, err, rc)) return;
    int meta = ky_object(&d, "batch/v1", "Job", j->a->name, j->a->ns);
    labels(&d, meta, j);
    annotations(&d, meta, j);
    int spec = ky_set_map(&d, ky_root(&d), "spec");
    if (j->a->gang == K8S_GANG_KUEUE) ky_set_bool(&d, spec, "suspend", true);
    /* no JobSet to restart the gang: every pod of a restart may fail once */
    job_spec(&d, spec, j, (long long)j->max_restarts * j->pods);
    *rc = ky_stream_add(s, &d, err);
}

/* ---- the command --------------------------------------------------------------------- */

static int load_node(const struct k8s_render_args *a, struct topo *t, struct plait_error *err)
{
    if (a->topology) return topo_load(t, a->topology, err);
    char source[160];
    snprintf(source, sizeof source, "--gpus-per-node %d%s%s, one NVLink domain", a->gpus_per_node,
             a->gpu_product ? " of " : "", a->gpu_product ? a->gpu_product : "");
    struct fit_node_spec spec = {.n_gpus = a->gpus_per_node,
                                 .product = a->gpu_product,
                                 .memory_bytes = fit_product_memory(a->gpu_product),
                                 .nvlink = true,
                                 .cores_per_gpu = 4,
                                 .rdma = a->rdma != NULL,
                                 .source = source};
    return fit_topo_synthetic(t, &spec, err);
}

static int secret_for(struct job *j, struct plait_error *err)
{
    const char *fixed = getenv(TEST_SECRET_ENV);
    if (!fixed || !*fixed) return store_secret_generate(j->store_secret, err);
    size_t n = strlen(fixed);
    if (n != STORE_SECRET_HEX_BYTES - 1 || strspn(fixed, "0123456789abcdef") != n)
        return error_set(err, "%s must be %d lower-case hex digits", TEST_SECRET_ENV,
                         STORE_SECRET_HEX_BYTES - 1);
    memcpy(j->store_secret, fixed, n + 1);
    log_warn("%s is set: the manifests carry its fixed store secret, not a fresh one (a test "
             "hook: unset it to render a job to apply)",
             TEST_SECRET_ENV);
    return 0;
}

/* The layout on --nodes pods of --gpus-per-node GPUs (layout_choose, as plait
 * check chooses it), placed and fitting, with one rank per GPU of each pod. */
static int choose_layout(const struct k8s_render_args *a, const struct plan *p, struct topo *topo,
                         struct fit_nodes *fit, struct layout_eval *best)
{
    struct plait_error err;
    if (load_node(a, topo, &err) ||
        fit_nodes_make(p, a->nodes, a->gpus_per_node, topo, 1, NULL, fit, &err)) {
        log_error("k8s render: %s", err.text);
        return -1;
    }
    struct layout_inputs in = {.device_memory_bytes =
                                   layout_device_memory(fit->v, fit->n, a->gpu_memory_gb),
                               .bw = {.pcie_gbps = 25, .network_gbps = 50, .memory_gbps = 100}};
    if (layout_choose(p, fit->v, fit->n, &in, NULL, NULL, best, &err)) {
        log_error("k8s render: %s: %s", p->source, err.text);
        return -1;
    }
    if (!best->fits) {
        log_error("k8s render: %s: %s", p->source, best->why);
        return -1;
    }
    int world = best->map.world, slots = a->nodes * a->gpus_per_node;
    if (world != slots) {
        log_error("k8s render: %s: the layout tp %d × pp %d × dp %d is %d ranks, but %d pods × "
                  "%d GPUs are %d: every pod runs one rank per GPU it asks for; set parallel.dp "
                  "to \"auto\" or change --nodes / --gpus-per-node",
                  p->source, best->layout.tp, best->layout.pp, best->layout.dp, world, a->nodes,
                  a->gpus_per_node, slots);
        return -1;
    }
    if (in.device_memory_bytes)
        log_info("k8s render: %s: tp %d × pp %d × dp %d on %d pods × %d GPUs; %.2f GB per rank "
                 "of %.2f GB",
                 p->source, best->layout.tp, best->layout.pp, best->layout.dp, a->nodes,
                 a->gpus_per_node, best->mem.total / 1e9, in.device_memory_bytes / 1e9);
    else
        log_info("k8s render: %s: tp %d × pp %d × dp %d on %d pods × %d GPUs; %.2f GB per rank "
                 "(device memory unknown: give --gpu-memory GB or --gpu-product to check the fit)",
                 p->source, best->layout.tp, best->layout.pp, best->layout.dp, a->nodes,
                 a->gpus_per_node, best->mem.total / 1e9);
    return 0;
}

/* The objects' names and the pods' DNS names, from --name. */
static void name_objects(struct job *j)
{
    const struct k8s_render_args *a = j->a;
    snprintf(j->plan_cm, sizeof j->plan_cm, "%s-plan", a->name);
    snprintf(j->secret, sizeof j->secret, "%s-store", a->name);
    snprintf(j->service, sizeof j->service, "%s", a->name);
    if (j->jobset)
        snprintf(j->pod_dns, sizeof j->pod_dns, "%s-%s-0-{index}.%s", a->name, REPLICATED_JOB,
                 j->service);
    else
        snprintf(j->pod_dns, sizeof j->pod_dns, "%s-{index}.%s", a->name, j->service);
}

/* Every manifest of the job, in the order they are applied; 0, or -1 with err. */
static int build_manifests(struct ky_stream *s, const struct job *j, struct plait_error *err)
{
    int built = ky_stream_open(s, err);
    plan_config_map(s, j, err, &built);
    store_secret(s, j, err, &built);
    if (!j->jobset) headless_service(s, j, err, &built);
    if (j->a->gang == K8S_GANG_VOLCANO || j->a->gang == K8S_GANG_COSCHEDULING)
        pod_group(s, j, err, &built);
    if (j->jobset)
        jobset(s, j, err, &built);
    else
        indexed_job(s, j, err, &built);
    return built;
}

int k8s_render(const struct k8s_render_args *a, FILE *out)
{
    struct plait_error err;
    int rc = PLAIT_EXIT_ERROR;
    struct topo topo = {0};
    struct fit_nodes fit = {0};
    struct layout_eval best = {0};
    struct ky_stream s = {0};
    struct job j = {.a = a};
    j.jobset = a->workload == K8S_WORKLOAD_JOBSET;
    struct plan *p = plan_load(a->plan_path, a->sets, a->n_sets, &err);
    if (!p) {
        log_error("%s", err.text);
        goto out;
    }
    j.max_restarts = a->max_restarts >= 0 ? a->max_restarts : p->checkpoint.max_restarts;
    if (p->parallel.device == PLAN_DEVICE_CPU) {
        log_error("k8s render: %s: parallel.device is \"cpu\": the pods ask for GPUs "
                  "(nvidia.com/gpu); use \"auto\" or \"cuda\"",
                  p->source);
        goto out;
    }
    if (choose_layout(a, p, &topo, &fit, &best)) goto out;
    j.layout = best.layout;
    j.pods = a->nodes;
    j.ranks_per_pod = a->gpus_per_node;
    grace_estimate(&j, p, &best);
    log_info("k8s render: terminationGracePeriodSeconds %s", j.grace_why);
    if (!a->pvc)
        log_warn("k8s render: the run directory %s is an emptyDir: checkpoints do not survive a "
                 "restart of the gang (give --pvc CLAIM, a ReadWriteMany claim)",
                 a->run_dir);
    j.shm_gib = a->shm_gb > 0 ? (int)ceil(a->shm_gb) : shm_gib(j.ranks_per_pod);
    name_objects(&j);
    /* the plan the pods train: every default filled in, "auto" decided here */
    p->parallel.tp = best.layout.tp;
    p->parallel.pp = best.layout.pp;
    p->parallel.dp = best.layout.dp;
    if (!(j.plan_json = plan_to_json(p))) {
        log_error("k8s render: out of memory");
        goto out;
    }
    if (secret_for(&j, &err)) {
        log_error("k8s render: %s", err.text);
        goto out;
    }
    if (build_manifests(&s, &j, &err)) {
        log_error("k8s render: %s", err.text);
        goto out;
    }
    rc = k8s_print_linted(&s, "k8s render", out);
out:
    ky_stream_free(&s);
    free(j.plan_json);
    layout_eval_free(&best);
    fit_nodes_free(&fit);
    topo_free(&topo);
    plan_free(p);
    return rc;
}
