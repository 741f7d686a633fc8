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
#include "common/fsutil.h"
#include "launcher/k8s/k8s_render.h"
#include "launcher/plan_fit.h"

#define CONTAINER K8S_CONTAINER
#define REPLICATED_JOB K8S_REPLICATED_JOB
#define RUN_MOUNT K8S_RUN_MOUNT

/* ---- estimates ---------------------------------------------------------------------- */

/* terminationGracePeriodSeconds: on SIGTERM the runtime finishes the
 * micro-batch it is in and writes a checkpoint (examples/slurm/ADMIN.md sizes
 * Slurm's GraceTime the same way): the cost model's step time over the
 * micro-batches, and about 16 bytes per parameter of each rank's shard (its
 * fp32 weights and AdamW moments, the most loaded stage) at the pod's write
 * rate, or the write time measured by a run (run.json's last_write_s); twice
 * the write with checkpoint.async (one still in the background is finished
 * first); plus a margin for start-up, fsync and exit. */
static void grace_estimate(struct k8s_job *j, const struct plan *p, const struct layout_eval *e)
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

static void labels(struct ky_doc *d, int meta, const struct k8s_job *j)
{
    int l = ky_set_map(d, meta, "labels");
    ky_set_str(d, l, "app.kubernetes.io/name", "plait");
    ky_set_str(d, l, "plait.dev/job", j->a->name);
    if (j->a->gang == K8S_GANG_KUEUE) {
        ky_set_str(d, l, "kueue.x-k8s.io/queue-name", j->a->queue);
        if (j->a->priority) ky_set_str(d, l, "kueue.x-k8s.io/priority-class", j->a->priority);
    }
}

static void plan_config_map(struct ky_stream *s, const struct k8s_job *j, struct plait_error *err,
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

/* Only with --secret-file: the same file, the same manifest. */
static void store_secret(struct ky_stream *s, const struct k8s_job *j, struct plait_error *err,
                         int *rc)
{
    struct ky_doc d;
    if (!j->store_secret[0] || !begin(&d, err, rc)) return;
    int meta = ky_object(&d, "v1", "Secret", j->secret, j->a->ns);
    labels(&d, meta, j);
    ky_set_str(&d, ky_root(&d), "type", "Opaque");
    int data = ky_set_map(&d, ky_root(&d), "stringData");
    ky_set_str(&d, data, "secret", j->store_secret);
    *rc = ky_stream_add(s, &d, err);
}

static void headless_service(struct ky_stream *s, const struct k8s_job *j, struct plait_error *err,
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

static void pod_group(struct ky_stream *s, const struct k8s_job *j, struct plait_error *err, int *rc)
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
        ky_set_str(&d, spec, "queue", j->queue);
        if (j->a->priority) ky_set_str(&d, spec, "priorityClassName", j->a->priority);
    } else {
        ky_set_int(&d, spec, "scheduleTimeoutSeconds", j->a->schedule_timeout_s);
    }
    *rc = ky_stream_add(s, &d, err);
}

/* podFailurePolicy: 75 (preempted, checkpoint written) does not count;
 * 1 and 2 (bad plan, bad command line) fail the job at once; a disruption
 * (preemption, eviction, node drain) does not count. Anything else (76: a peer
 * was lost) counts against backoffLimit. */
static void job_spec(struct ky_doc *d, int spec, const struct k8s_job *j, int backoff)
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
    k8s_pod_template(d, ky_set_map(d, spec, "template"), j);
}

static void annotations(struct ky_doc *d, int meta, const struct k8s_job *j)
{
    int ann = ky_set_map(d, meta, "annotations");
    char text[160], layout[96];
    snprintf(
        text, sizeof text, "%s = %d ranks, %d pods × %d",
        place_layout_text(layout, sizeof layout, j->layout.tp, j->cp, j->layout.pp, j->layout.dp),
        j->pods * j->ranks_per_pod, j->pods, j->ranks_per_pod);
    ky_set_str(d, ann, "plait.dev/layout", text);
    ky_set_str(d, ann, "plait.dev/termination-grace", j->grace_why);
}

static void jobset(struct ky_stream *s, const struct k8s_job *j, struct plait_error *err, int *rc)
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

static void indexed_job(struct ky_stream *s, const struct k8s_job *j, struct plait_error *err, int *rc)
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

/* A Volcano Job: its controller makes the PodGroup (minAvailable) and, with
 * the svc plugin, the headless Service NAME and the pods' host names
 * NAME-workers-I; its policies are the gang's restart policy: a lost or
 * evicted pod restarts the whole gang (up to maxRetry), exit 1 or 2 (a bad
 * plan or command line) aborts it. */
static void vcjob(struct ky_stream *s, const struct k8s_job *j, struct plait_error *err, int *rc)
{
    struct ky_doc d;
    if (!begin(&d, err, rc)) return;
    int meta = ky_object(&d, "batch.volcano.sh/v1alpha1", "Job", j->a->name, j->a->ns);
    labels(&d, meta, j);
    annotations(&d, meta, j);
    int spec = ky_set_map(&d, ky_root(&d), "spec");
    ky_set_str(&d, spec, "schedulerName", "volcano");
    ky_set_str(&d, spec, "queue", j->queue);
    if (j->a->priority) ky_set_str(&d, spec, "priorityClassName", j->a->priority);
    ky_set_int(&d, spec, "minAvailable", j->pods); /* all or nothing */
    ky_set_int(&d, spec, "maxRetry", j->max_restarts);
    int plugins = ky_set_map(&d, spec, "plugins"); /* DNS before readiness, as for a Job */
    ky_push(&d, ky_set(&d, plugins, "svc", ky_flow_seq(&d)),
            ky_str(&d, "--publish-not-ready-addresses"));
    int policies = ky_set_seq(&d, spec, "policies");
    const int fatal[] = {PLAIT_EXIT_ERROR, PLAIT_EXIT_USAGE};
    for (int k = 0; k < 2; k++) {
        int pol = ky_push(&d, policies, ky_map(&d));
        ky_set_int(&d, pol, "exitCode", fatal[k]);
        ky_set_str(&d, pol, "action", "AbortJob");
    }
    const char *events[] = {"PodEvicted", "PodFailed"};
    for (int k = 0; k < 2; k++) {
        int pol = ky_push(&d, policies, ky_map(&d));
        ky_set_str(&d, pol, "event", events[k]);
        ky_set_str(&d, pol, "action", "RestartJob");
    }
    int task = ky_push(&d, ky_set_seq(&d, spec, "tasks"), ky_map(&d));
    ky_set_str(&d, task, "name", REPLICATED_JOB);
    ky_set_int(&d, task, "replicas", j->pods);
    k8s_pod_template(&d, ky_set_map(&d, task, "template"), j);
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

/* --secret-file: its secret (the file's first line), refused when it could
 * not be a job's (store_secret_problem, as the pods refuse it). */
static int secret_from_file(struct k8s_job *j, struct plait_error *err)
{
    const char *path = j->a->secret_file;
    size_t len;
    char *text = fs_read_all(path, &len, err);
    if (!text) return -1;
    text[strcspn(text, "\r\n")] = '\0';
    const char *weak = store_secret_problem(text);
    int rc = 0;
    if (weak)
        rc = error_set(err, "--secret-file %s: not a job's store secret: %s (make one with "
                       "`openssl rand -hex 32 >%s`)", path, weak, path);
    else if (strlen(text) >= sizeof j->store_secret)
        rc = error_set(err, "--secret-file %s: longer than %zu characters", path,
                       sizeof j->store_secret - 1);
    else
        memcpy(j->store_secret, text, strlen(text) + 1);
    free(text);
    return rc;
}

/* The layout on --nodes pods of --gpus-per-node GPUs (layout_choose, as plait
 * check chooses it), placed and fitting, with one rank per GPU of each pod. */
static int choose_layout(const struct k8s_render_args *a, const struct plan *p, struct topo *topo,
                         struct fit_nodes *fit, struct layout_eval *best)
{
    struct plait_error err;
    if (load_node(a, topo, &err) ||
        fit_nodes_make(p, a->nodes, a->gpus_per_node, 1, topo, 1, NULL, fit, &err)) {
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
    char layout[96];
    place_layout_text(layout, sizeof layout, best->layout.tp, best->map.cp, best->layout.pp,
                      best->layout.dp);
    char pods[64]; /* "2 pods × 1 GPU" */
    snprintf(pods, sizeof pods, "%d pod%s × %d GPU%s", a->nodes, a->nodes == 1 ? "" : "s",
             a->gpus_per_node, a->gpus_per_node == 1 ? "" : "s");
    if (world != slots) {
        log_error("k8s render: %s: the layout %s is %d ranks, but %s are %d: every pod runs one "
                  "rank per GPU it asks for; set parallel.dp to \"auto\" or change --nodes / "
                  "--gpus-per-node",
                  p->source, layout, world, pods, slots);
        return -1;
    }
    /* GB: 10^9 bytes, as plait check prints device memory */
    if (in.device_memory_bytes)
        log_info("k8s render: %s: %s on %s; %.2f GB per rank of %.2f GB device memory (GB: 10^9 "
                 "bytes)",
                 p->source, layout, pods, best->mem.total / 1e9, in.device_memory_bytes / 1e9);
    else
        log_info("k8s render: %s: %s on %s; %.2f GB per rank (GB: 10^9 bytes; device memory "
                 "unknown: give --gpu-memory GB or --gpu-product to check the fit)",
                 p->source, layout, pods, best->mem.total / 1e9);
    return 0;
}

/* The objects' names and the pods' DNS names, from --name. */
static void name_objects(struct k8s_job *j)
{
    const struct k8s_render_args *a = j->a;
    snprintf(j->plan_cm, sizeof j->plan_cm, "%s-plan", a->name);
    if (a->secret_name)
        snprintf(j->secret, sizeof j->secret, "%s", a->secret_name);
    else
        snprintf(j->secret, sizeof j->secret, "%s-store", a->name);
    snprintf(j->service, sizeof j->service, "%s", a->name);
    /* Volcano's Queue is cluster-wide: named per namespace, as plait k8s admin names it */
    if (a->gang == K8S_GANG_VOLCANO)
        snprintf(j->queue, sizeof j->queue, "%s-%s", a->ns, a->queue);
    else
        snprintf(j->queue, sizeof j->queue, "%s", a->queue);
    if (k8s_job_is_jobset(j))
        snprintf(j->pod_dns, sizeof j->pod_dns, "%s-%s-0-{index}.%s", a->name, REPLICATED_JOB,
                 j->service);
    else if (a->workload == K8S_WORKLOAD_VCJOB) /* the svc plugin's names */
        snprintf(j->pod_dns, sizeof j->pod_dns, "%s-%s-{index}.%s", a->name, REPLICATED_JOB,
                 j->service);
    else
        snprintf(j->pod_dns, sizeof j->pod_dns, "%s-{index}.%s", a->name, j->service);
}

/* Every manifest of the job, in the order they are applied; 0, or -1 with err. */
static int build_manifests(struct ky_stream *s, const struct k8s_job *j, struct plait_error *err)
{
    int built = ky_stream_open(s, err);
    plan_config_map(s, j, err, &built);
    store_secret(s, j, err, &built);
    enum k8s_workload w = j->a->workload;
    if (w == K8S_WORKLOAD_JOB) headless_service(s, j, err, &built);
    if (w == K8S_WORKLOAD_JOB &&
        (j->a->gang == K8S_GANG_VOLCANO || j->a->gang == K8S_GANG_COSCHEDULING))
        pod_group(s, j, err, &built);
    if (w == K8S_WORKLOAD_JOBSET) jobset(s, j, err, &built);
    if (w == K8S_WORKLOAD_JOB) indexed_job(s, j, err, &built);
    if (w == K8S_WORKLOAD_VCJOB) vcjob(s, j, err, &built);
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
    struct k8s_job j = {.a = a};
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
    j.cp = best.map.cp;
    j.pods = a->nodes;
    j.ranks_per_pod = a->gpus_per_node;
    grace_estimate(&j, p, &best);
    log_info("k8s render: terminationGracePeriodSeconds %s", j.grace_why);
    if (!k8s_run_dir_persists(a))
        log_warn("k8s render: the run directory %s is on an emptyDir: checkpoints do not survive "
                 "a restart of the gang (give --pvc CLAIM, a ReadWriteMany claim, or a --run-dir "
                 "on a --mount-pvc or --mount-host volume)",
                 a->run_dir);
    j.shm_gib = a->shm_gb > 0 ? (int)ceil(a->shm_gb) : shm_gib(j.ranks_per_pod);
    k8s_pod_resources(&j, p, &best);
    log_info("k8s render: each pod requests %s", j.resources_why);
    k8s_warn_host_paths(&j, p);
    name_objects(&j);
    /* the plan the pods train: every default filled in, "auto" decided here */
    p->parallel.tp = best.layout.tp;
    p->parallel.pp = best.layout.pp;
    p->parallel.dp = best.layout.dp;
    if (!(j.plan_json = plan_to_json(p))) {
        log_error("k8s render: out of memory");
        goto out;
    }
    if (a->secret_file && secret_from_file(&j, &err)) {
        log_error("k8s render: %s", err.text);
        goto out;
    }
    if (!a->secret_file)
        log_info("k8s render: the pods read the store secret from the Secret %s (key \"secret\"), "
                 "which this does not render: create it once, e.g. kubectl -n %s create secret "
                 "generic %s --from-literal=secret=$(openssl rand -hex 32)",
                 j.secret, a->ns, j.secret);
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
