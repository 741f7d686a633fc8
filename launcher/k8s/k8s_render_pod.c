/* k8s_render_pod.c — the pod template of plait k8s render's workloads: the
 * trainer container (plait launch, launcher/k8s/k8s_env.h's env, the GPUs, the
 * CPUs and host memory the memory model predicts), its volumes (plan, /dev/shm,
 * run directory, data), who it runs as and where it may run. Not here: the
 * workloads around it and the plan check (k8s_render.c). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "common/place/env.h"
#include "launcher/k8s/k8s_env.h"
#include "launcher/k8s/k8s_lint.h"
#include "launcher/k8s/k8s_render.h"

/* A CUDA rank's own host memory beside what it copies: its CUDA context, the
 * CUDA, cuBLAS and NCCL libraries and their host buffers, the data loader. */
#define RANK_PROCESS_GIB 2.0
#define GIB 1073741824.0

/* ---- what a pod asks for ------------------------------------------------------------ */

/* Per rank: the process, and with checkpoint.async the host copy of its part
 * (at most its parameters, gradients and optimizer state as gpt2_memory counts
 * them on the device); per pod: the sampler's copy of the whole model (rank 0
 * only, but every pod has the same template) and /dev/shm. */
void k8s_pod_resources(struct k8s_job *j, const struct plan *p, const struct layout_eval *e)
{
    const struct k8s_render_args *a = j->a;
    int cores = 0;
    for (int r = 0; r < e->map.world; r++)
        if (e->map.ranks[r].node == 0) cores += e->map.ranks[r].n_cores;
    j->cpus = a->cpus > 0 ? a->cpus : cores > 0 ? cores : j->ranks_per_pod;
    double async_b = p->checkpoint.async ? (double)e->mem.params + e->mem.grads + e->mem.optimizer
                                         : 0;
    double sample_b = p->sample.tokens > 0
                          ? 4.0 * e->mem.param_count * j->layout.tp * j->layout.pp
                          : 0;
    double rank_b = RANK_PROCESS_GIB * GIB + async_b;
    double pod_b = j->ranks_per_pod * rank_b + sample_b + j->shm_gib * GIB;
    j->memory_gib = a->memory_gb > 0 ? (int)ceil(a->memory_gb * 1e9 / GIB) : (int)ceil(pod_b / GIB);
    char *w = j->resources_why;
    size_t n = sizeof j->resources_why, at;
    at = (size_t)snprintf(w, n, "%d CPUs (%s), %d Gi memory", j->cpus,
                          a->cpus > 0 ? "--cpus" : "the ranks' cores as placed", j->memory_gib);
    if (a->memory_gb > 0) {
        snprintf(w + at, n - at, " (--memory)");
        return;
    }
    at += (size_t)snprintf(w + at, n - at, " = %d rank%s × (%.0f GiB a CUDA process", j->ranks_per_pod,
                           j->ranks_per_pod == 1 ? "" : "s", RANK_PROCESS_GIB);
    if (async_b > 0 && at < n)
        at += (size_t)snprintf(w + at, n - at, " + %.2f GiB checkpoint.async copy", async_b / GIB);
    if (sample_b > 0 && at < n)
        at += (size_t)snprintf(w + at, n - at, ") + %.2f GiB the sampler's model", sample_b / GIB);
    else if (at < n)
        at += (size_t)snprintf(w + at, n - at, ")");
    if (at < n) snprintf(w + at, n - at, " + %d GiB /dev/shm", j->shm_gib);
}

/* ---- volumes and paths ---------------------------------------------------------------- */

static bool under(const char *path, const char *dir)
{
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    return !strncmp(path, dir, n) && (path[n] == '/' || path[n] == '\0');
}

/* Whether path is on a volume the pods mount: a --mount-*, or /plait (only
 * with --pvc when persistent_only: else an emptyDir). */
static bool on_mount(const struct k8s_render_args *a, const char *path, bool persistent_only)
{
    for (int k = 0; k < a->n_mounts; k++)
        if (under(path, a->mounts[k].path)) return true;
    return under(path, K8S_RUN_MOUNT) && (a->pvc || !persistent_only);
}

bool k8s_run_dir_persists(const struct k8s_render_args *a)
{
    return on_mount(a, a->run_dir, true);
}

int k8s_warn_host_paths(const struct k8s_job *j, const struct plan *p)
{
    const struct {
        const char *field, *path;
    } paths[] = {{"data.train", p->data.train},         {"data.val", p->data.val},
                 {"data.tokenizer", p->data.tokenizer}, {"model.init", p->model.init},
                 {"checkpoint.dir", p->checkpoint.dir},
                 {"parallel.offload_dir", p->parallel.offload_dir}};
    int warned = 0;
    for (size_t k = 0; k < sizeof paths / sizeof *paths; k++) {
        const char *path = paths[k].path;
        if (!path || path[0] != '/' || on_mount(j->a, path, false)) continue;
        log_warn("k8s render: %s: %s \"%s\" is a path of this host, and the pods mount nothing "
                 "there: give it as the pods see it, on a volume they mount (--pvc at %s, "
                 "--mount-pvc CLAIM:/DIR, --mount-host /DIR:/DIR)",
                 p->source, paths[k].field, path, K8S_RUN_MOUNT);
        warned++;
    }
    return warned;
}

const char *k8s_mount_parse(const char *spec, bool host, char *buf, size_t buf_bytes,
                            struct k8s_mount *m)
{
    if ((size_t)snprintf(buf, buf_bytes, "%s", spec) >= buf_bytes) return "is too long";
    *m = (struct k8s_mount){0};
    char *save = NULL, *source = strtok_r(buf, ":", &save), *path = strtok_r(NULL, ":", &save);
    char *mode = strtok_r(NULL, ":", &save);
    if (!source || !path || strtok_r(NULL, ":", &save) || (mode && strcmp(mode, "ro")))
        return host ? "must be /DIR:/PATH or /DIR:/PATH:ro" : "must be CLAIM:/PATH or CLAIM:/PATH:ro";
    if (path[0] != '/') return "needs an absolute PATH, where the pods see the volume";
    if (host && source[0] != '/') return "needs an absolute /DIR of the nodes";
    if (!host && k8s_dns_label_problem(source, 253)) return "needs a claim's name (DNS-1123)";
    if (under(path, "/etc/plait") || under(path, "/dev/shm") || !strcmp(path, K8S_RUN_MOUNT) ||
        !strcmp(path, "/"))
        return "may not be at /, /etc/plait, /dev/shm or /plait (the run directory's: --pvc)";
    m->claim = host ? NULL : source;
    m->host_path = host ? source : NULL;
    m->path = path;
    m->read_only = mode != NULL;
    return NULL;
}

static const char *const effects[] = {"NoSchedule", "PreferNoSchedule", "NoExecute"};

/* KEY[=VALUE][:EFFECT] into its parts (pointers into buf); NULL or what is wrong */
static const char *toleration_split(const char *spec, char *buf, size_t bytes, const char **key,
                                    const char **value, const char **effect)
{
    if ((size_t)snprintf(buf, bytes, "%s", spec) >= bytes) return "is too long";
    char *colon = strrchr(buf, ':'), *eq;
    *effect = NULL;
    if (colon) {
        *colon = '\0';
        *effect = colon + 1;
        bool known = false;
        for (int k = 0; k < 3; k++) known |= !strcmp(*effect, effects[k]);
        if (!known) return "has an EFFECT that is not NoSchedule, PreferNoSchedule or NoExecute";
    }
    *key = buf;
    *value = (eq = strchr(buf, '=')) ? eq + 1 : NULL;
    if (eq) *eq = '\0';
    return **key ? NULL : "needs a KEY";
}

const char *k8s_toleration_problem(const char *spec)
{
    char buf[512];
    const char *key, *value, *effect;
    return toleration_split(spec, buf, sizeof buf, &key, &value, &effect);
}

const char *k8s_node_selector_problem(const char *spec)
{
    const char *eq = strchr(spec, '=');
    return eq && eq > spec ? NULL : "must be KEY=VALUE";
}

/* ---- the container ---------------------------------------------------------------------- */

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

static void env_field(struct ky_doc *d, int env, const char *name, const char *field_path)
{
    int e = ky_push(d, env, ky_map(d));
    ky_set_str(d, e, "name", name);
    int field = ky_set_map(d, ky_set_map(d, e, "valueFrom"), "fieldRef");
    ky_set_str(d, field, "fieldPath", field_path);
}

static void env(struct ky_doc *d, int c, const struct k8s_job *j)
{
    const struct k8s_render_args *a = j->a;
    int env = ky_set_seq(d, c, "env");
    if (a->workload == K8S_WORKLOAD_VCJOB) /* a vcjob's pods carry their index in a label */
        env_field(d, env, K8S_ENV_COMPLETION_INDEX, "metadata.labels['volcano.sh/task-index']");
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
    if (k8s_job_is_jobset(j)) /* JobSet counts its restarts of the gang in a pod label */
        env_field(d, env, K8S_ENV_RESTART_ATTEMPT,
                  "metadata.labels['jobset.sigs.k8s.io/restart-attempt']");
}

/* GPUs and RDMA devices, requests = limits; CPUs and memory requested, memory
 * limited (a pod over its estimate is killed, not its node's neighbours) and,
 * with --guaranteed, CPUs too: QoS class Guaranteed. */
static void resources(struct ky_doc *d, int container, const struct k8s_job *j)
{
    int res = ky_set_map(d, container, "resources");
    const char *which[] = {"requests", "limits"};
    char memory[32];
    snprintf(memory, sizeof memory, "%dGi", j->memory_gib);
    for (int k = 0; k < 2; k++) {
        int m = ky_set_map(d, res, which[k]);
        if (k == 0 || j->a->guaranteed) ky_set_int(d, m, "cpu", j->cpus);
        ky_set_str(d, m, "memory", memory);
        ky_set_int(d, m, "nvidia.com/gpu", j->a->gpus_per_node);
        if (j->a->rdma) ky_set_int(d, m, j->a->rdma, j->a->rdma_per_pod);
    }
}

static void mount(struct ky_doc *d, int mounts, const char *name, const char *path, bool ro)
{
    int m = ky_push(d, mounts, ky_map(d));
    ky_set_str(d, m, "name", name);
    ky_set_str(d, m, "mountPath", path);
    if (ro) ky_set_bool(d, m, "readOnly", true);
}

static void container(struct ky_doc *d, int spec, const struct k8s_job *j)
{
    const struct k8s_render_args *a = j->a;
    int c = ky_push(d, ky_set_seq(d, spec, "containers"), ky_map(d));
    ky_set_str(d, c, "name", K8S_CONTAINER);
    ky_set_str(d, c, "image", a->image);
    int cmd = ky_set(d, c, "command", ky_flow_seq(d));
    ky_push(d, cmd, ky_str(d, "plait"));
    ky_push(d, cmd, ky_str(d, "launch"));
    env(d, c, j);
    int port = ky_push(d, ky_set_seq(d, c, "ports"), ky_map(d));
    ky_set_str(d, port, "name", "store");
    ky_set_int(d, port, "containerPort", a->port);
    resources(d, c, j);
    int sc = ky_set_map(d, c, "securityContext");
    ky_set_bool(d, sc, "allowPrivilegeEscalation", false);
    if (a->rdma) /* verbs pin memory */
        ky_push(d, ky_set(d, ky_set_map(d, sc, "capabilities"), "add", ky_flow_seq(d)),
                ky_str(d, "IPC_LOCK"));
    int mounts = ky_set_seq(d, c, "volumeMounts");
    mount(d, mounts, "plan", "/etc/plait", true);
    mount(d, mounts, "dshm", "/dev/shm", false);
    mount(d, mounts, "run", K8S_RUN_MOUNT, false);
    for (int k = 0; k < a->n_mounts; k++) {
        char name[32];
        snprintf(name, sizeof name, "mount-%d", k);
        mount(d, mounts, name, a->mounts[k].path, a->mounts[k].read_only);
    }
}

static void volumes(struct ky_doc *d, int spec, const struct k8s_job *j)
{
    const struct k8s_render_args *a = j->a;
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
    if (a->pvc)
        ky_set_str(d, ky_set_map(d, v, "persistentVolumeClaim"), "claimName", a->pvc);
    else
        ky_set(d, v, "emptyDir", ky_flow_map(d));
    for (int k = 0; k < a->n_mounts; k++) {
        char name[32];
        snprintf(name, sizeof name, "mount-%d", k);
        v = ky_push(d, vols, ky_map(d));
        ky_set_str(d, v, "name", name);
        if (a->mounts[k].claim) {
            int pvc = ky_set_map(d, v, "persistentVolumeClaim");
            ky_set_str(d, pvc, "claimName", a->mounts[k].claim);
            if (a->mounts[k].read_only) ky_set_bool(d, pvc, "readOnly", true);
        } else {
            int hp = ky_set_map(d, v, "hostPath");
            ky_set_str(d, hp, "path", a->mounts[k].host_path);
            ky_set_str(d, hp, "type", "Directory");
        }
    }
}

/* ---- where the pods run, and as whom ------------------------------------------------- */

/* All pods in one --topology-key domain: required when pipelines cross pods
 * (in Megatron's rank order a pipeline's stages are tp·dp ranks apart, so
 * each pipeline spans the whole pod index range), preferred otherwise (only
 * data-parallel reductions cross pods; tensor-parallel groups never do), unless
 * --topology-mode says. */
static bool topology_required(const struct k8s_job *j)
{
    return j->a->topology_required >= 0 ? j->a->topology_required == 1 : j->layout.pp > 1;
}

static void affinity(struct ky_doc *d, int spec, const struct k8s_job *j)
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

static void toleration(struct ky_doc *d, int tols, const char *key, const char *value,
                       const char *effect)
{
    int tol = ky_push(d, tols, ky_map(d));
    ky_set_str(d, tol, "key", key);
    ky_set_str(d, tol, "operator", value ? "Equal" : "Exists");
    if (value) ky_set_str(d, tol, "value", value);
    if (effect) ky_set_str(d, tol, "effect", effect);
}

/* nodeSelector and tolerations: the GPU product's and taint's, and the options' */
static void placement(struct ky_doc *d, int spec, const struct k8s_job *j)
{
    const struct k8s_render_args *a = j->a;
    if (a->gpu_product || a->n_node_selectors) {
        int sel = ky_set_map(d, spec, "nodeSelector");
        if (a->gpu_product) ky_set_str(d, sel, "nvidia.com/gpu.product", a->gpu_product);
        for (int k = 0; k < a->n_node_selectors; k++) {
            char key[512];
            const char *eq = strchr(a->node_selectors[k], '=');
            snprintf(key, sizeof key, "%.*s", (int)(eq - a->node_selectors[k]),
                     a->node_selectors[k]);
            ky_set_str(d, sel, key, eq + 1);
        }
    }
    if (a->topology_key && a->gang != K8S_GANG_KUEUE) affinity(d, spec, j);
    int tols = ky_set_seq(d, spec, "tolerations");
    toleration(d, tols, "nvidia.com/gpu", NULL, "NoSchedule");
    for (int k = 0; k < a->n_tolerations; k++) {
        char buf[512];
        const char *key, *value, *effect;
        if (!toleration_split(a->tolerations[k], buf, sizeof buf, &key, &value, &effect))
            toleration(d, tols, key, value, effect);
    }
}

static void security(struct ky_doc *d, int spec, const struct k8s_job *j)
{
    const struct k8s_render_args *a = j->a;
    if (a->n_pull_secrets) {
        int ps = ky_set_seq(d, spec, "imagePullSecrets");
        for (int k = 0; k < a->n_pull_secrets; k++)
            ky_set_str(d, ky_push(d, ps, ky_map(d)), "name", a->pull_secrets[k]);
    }
    if (!a->run_as_non_root && a->run_as_user < 0 && a->run_as_group < 0) return;
    int sc = ky_set_map(d, spec, "securityContext");
    if (a->run_as_non_root) ky_set_bool(d, sc, "runAsNonRoot", true);
    if (a->run_as_user >= 0) ky_set_int(d, sc, "runAsUser", a->run_as_user);
    if (a->run_as_group >= 0) { /* and the volumes' files writable by that group */
        ky_set_int(d, sc, "runAsGroup", a->run_as_group);
        ky_set_int(d, sc, "fsGroup", a->run_as_group);
    }
}

void k8s_pod_template(struct ky_doc *d, int tpl, const struct k8s_job *j)
{
    const struct k8s_render_args *a = j->a;
    bool group_annotation = a->gang == K8S_GANG_VOLCANO && a->workload != K8S_WORKLOAD_VCJOB;
    int meta = ky_set_map(d, tpl, "metadata");
    int l = ky_set_map(d, meta, "labels");
    ky_set_str(d, l, "app.kubernetes.io/name", "plait");
    ky_set_str(d, l, "plait.dev/job", a->name);
    if (a->gang == K8S_GANG_COSCHEDULING) /* joined by a label */
        ky_set_str(d, l, "scheduling.x-k8s.io/pod-group", a->name);
    int ann = ky_set_map(d, meta, "annotations");
    ky_set_str(d, ann, "plait.dev/termination-grace", j->grace_why);
    ky_set_str(d, ann, "plait.dev/resources", j->resources_why);
    if (group_annotation) /* the only key Volcano's scheduler reads; a vcjob makes its own */
        ky_set_str(d, ann, "scheduling.k8s.io/group-name", a->name);
    if (a->gang == K8S_GANG_KUEUE && a->topology_key)
        ky_set_str(d, ann,
                   topology_required(j) ? "kueue.x-k8s.io/podset-required-topology"
                                        : "kueue.x-k8s.io/podset-preferred-topology",
                   a->topology_key);
    int spec = ky_set_map(d, tpl, "spec");
    ky_set_str(d, spec, "restartPolicy", "Never");
    if (a->workload == K8S_WORKLOAD_JOB) ky_set_str(d, spec, "subdomain", j->service);
    if (a->gang == K8S_GANG_VOLCANO) ky_set_str(d, spec, "schedulerName", "volcano");
    if (a->gang == K8S_GANG_COSCHEDULING) ky_set_str(d, spec, "schedulerName", a->scheduler);
    if (a->priority) ky_set_str(d, spec, "priorityClassName", a->priority);
    ky_set_int(d, spec, "terminationGracePeriodSeconds", j->grace_s);
    ky_set_bool(d, spec, "enableServiceLinks", false);
    security(d, spec, j);
    placement(d, spec, j);
    container(d, spec, j);
    volumes(d, spec, j);
}
