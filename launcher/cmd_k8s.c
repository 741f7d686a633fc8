/* cmd_k8s.c — the plait k8s commands' command lines: `k8s render PLAN`, `k8s
 * admin` and `k8s lint FILE...`, parsed into launcher/k8s/k8s.h's structs and
 * handed to launcher/k8s/ (k8s_render.c, k8s_admin.c, k8s_lint.c). Only the
 * command lines: nothing under launcher/k8s/ calls back into this file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/place/env.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "launcher/commands.h"
#include "launcher/k8s/k8s.h"
#include "launcher/k8s/k8s_lint.h"

#define MAX_PRIORITIES 8
#define MAX_LEVELS 8

/* ---- shared parsing ------------------------------------------------------------------ */

static int positive(const struct cli_command *cli, const char *opt, const char *v, int max,
                    int *out)
{
    char *end;
    long n = strtol(v, &end, 10);
    if (*end || n < 1 || n > max)
        return cli_usage_error(cli, "%s must be an integer from 1 to %d (got %s)", opt, max, v);
    *out = (int)n;
    return CLI_CONTINUE;
}

static int non_negative(const struct cli_command *cli, const char *opt, const char *v, int *out)
{
    char *end;
    long n = strtol(v, &end, 10);
    if (*end || n < 0 || n > 1000000)
        return cli_usage_error(cli, "%s must be a whole number (got %s)", opt, v);
    *out = (int)n;
    return CLI_CONTINUE;
}

static int positive_real(const struct cli_command *cli, const char *opt, const char *v, double *out)
{
    char *end;
    double x = strtod(v, &end);
    if (*end || !(x > 0) || x > 1e9)
        return cli_usage_error(cli, "%s must be a positive number (got %s)", opt, v);
    *out = x;
    return CLI_CONTINUE;
}

static int gang_of(const struct cli_command *cli, const char *v, bool admin, enum k8s_gang *out)
{
    for (int g = 0; g < 5; g++) {
        bool allowed =
            admin ? g != K8S_GANG_JOBSET && g != K8S_GANG_COSCHEDULING : g != K8S_GANG_QUOTA;
        if (allowed && !strcmp(v, k8s_gang_name((enum k8s_gang)g))) {
            *out = (enum k8s_gang)g;
            return CLI_CONTINUE;
        }
    }
    return cli_usage_error(
        cli, "--gang must be %s (got %s)",
        admin ? "kueue, volcano or quota" : "jobset, kueue, volcano or coscheduling", v);
}

/* A name that becomes part of DNS names: refused before anything is built. */
static int dns_name(const struct cli_command *cli, const char *opt, const char *v, size_t max)
{
    const char *why = k8s_dns_label_problem(v, max);
    if (why) return cli_usage_error(cli, "%s \"%s\" %s", opt, v, why);
    return CLI_CONTINUE;
}

/* An option's DNS name into *out (dns_name). */
static int dns_option(const struct cli_command *cli, const char *opt, const char *v, size_t max,
                      const char **out)
{
    *out = v;
    return dns_name(cli, opt, v, max);
}

/* ---- plait k8s render ---------------------------------------------------------------- */

enum {
    R_IMAGE,
    R_NODES,
    R_GPUS,
    R_NAME,
    R_NAMESPACE,
    R_GANG,
    R_WORKLOAD,
    R_QUEUE,
    R_PRIORITY,
    R_TOPOLOGY_KEY,
    R_TOPOLOGY_MODE,
    R_RDMA,
    R_GPU_PRODUCT,
    R_GPU_MEMORY,
    R_TOPOLOGY,
    R_PVC,
    R_RUN_DIR,
    R_MAX_RESTARTS,
    R_PORT,
    R_GANG_TIMEOUT,
    R_SCHEDULE_TIMEOUT,
    R_SCHEDULER,
    R_CKPT_GBPS,
    R_CKPT_WRITE_S,
    R_SHM,
    R_SECRET,
    R_SECRET_FILE,
    R_CPUS,
    R_MEMORY,
    R_GUARANTEED,
    R_RUN_AS_USER,
    R_RUN_AS_GROUP,
    R_RUN_AS_NON_ROOT,
    R_PULL_SECRET,
    R_NODE_SELECTOR,
    R_TOLERATION,
    R_MOUNT_PVC,
    R_MOUNT_HOST,
    R_SET,
};
const struct cli_command cmd_k8s_render_cli = {
    .name = "k8s render",
    .operands = "PLAN",
    .min_operands = 1,
    .max_operands = 1,
    .summary = "check a plan for a Kubernetes gang and print its manifests",
    .description = "Checks PLAN as plait check does (parser, placement, memory, layout choice) on\n"
                   "--nodes pods of --gpus-per-node GPUs each, then prints on stdout, for kubectl\n"
                   "apply -f -: a ConfigMap with the resolved plan, the gang's objects and a\n"
                   "JobSet (or an Indexed Job and its headless Service, or a Volcano Job) whose\n"
                   "pods run `plait launch`, asking for the CPUs and host memory the memory model\n"
                   "predicts. The store secret is read from an existing Secret (--secret), not\n"
                   "rendered unless --secret-file says. Every manifest passes plait k8s lint\n"
                   "before it is printed; the layout and the estimates go to stderr.",
    .options =
        (const struct cli_option[]){
            [R_IMAGE] = {"--image", "IMG", "the container image (holds plait and plait-train)",
                         .required = true},
            [R_NODES] = {"--nodes", "N", "pods of the gang, one per node", .required = true},
            [R_GPUS] = {"--gpus-per-node", "G", "GPUs (nvidia.com/gpu) each pod asks for",
                        .required = true},
            [R_NAME] = {"--name", "NAME", "the job's name, a DNS-1123 label (default train)"},
            [R_NAMESPACE] = {"--namespace", "NS", "its namespace (default default)"},
            [R_GANG] = {"--gang", "KIND",
                        "jobset (default), kueue, volcano or coscheduling: who holds\n"
                        "the pods back until all of them can run"},
            [R_WORKLOAD] = {"--workload", "KIND",
                            "jobset, job (an Indexed Job and its headless Service) or\n"
                            "vcjob (a Volcano Job, --gang volcano); default: jobset for\n"
                            "jobset and kueue, job otherwise"},
            [R_QUEUE] = {"--queue", "Q",
                         "Kueue LocalQueue, or Volcano Queue NS-Q (cluster-wide,\n"
                         "named per namespace as plait k8s admin names it); default\n"
                         "training"},
            [R_PRIORITY] = {"--priority", "P",
                            "PriorityClass of the pods (and Kueue's\n"
                            "WorkloadPriorityClass of the same name)"},
            [R_TOPOLOGY_KEY] = {"--topology-key", "LABEL",
                                "node label of a network domain (a rack, an NVLink\n"
                                "domain): the gang's pods land in one (required when\n"
                                "pipelines cross pods, preferred otherwise)"},
            [R_TOPOLOGY_MODE] = {"--topology-mode", "MODE",
                                 "auto (default), required or preferred: how\n"
                                 "--topology-key binds"},
            [R_RDMA] = {"--rdma", "RESOURCE[=N]",
                        "RDMA devices each pod asks for (default N 1), with IPC_LOCK"},
            [R_GPU_PRODUCT] = {"--gpu-product", "PRODUCT",
                               "nvidia.com/gpu.product the nodes must have (e.g.\n"
                               "NVIDIA-H100-80GB-HBM3); gives the cost model the GPU's\n"
                               "speed and memory"},
            [R_GPU_MEMORY] = {"--gpu-memory", "GB",
                              "device memory in GB (10^9 bytes, as plait check prints\n"
                              "it), when the product does not say"},
            [R_TOPOLOGY] = {"--topology", "FILE.xml",
                            "hwloc XML of one node (default: --gpus-per-node GPUs in\n"
                            "one NVLink domain)"},
            [R_PVC] = {"--pvc", "CLAIM",
                       "a ReadWriteMany PersistentVolumeClaim mounted at /plait for the\n"
                       "run directory (default: an emptyDir, lost on a restart)"},
            [R_RUN_DIR] = {"--run-dir", "DIR", "PLAIT_RUN_DIR in the pods (default /plait/NAME)"},
            [R_MAX_RESTARTS] = {"--max-restarts", "N",
                                "restarts of the whole gang before the job fails\n"
                                "(default: the plan's checkpoint.max_restarts)"},
            [R_PORT] = {"--port", "PORT", "pod 0's store port (default 29500)"},
            [R_GANG_TIMEOUT] = {"--gang-timeout", "S",
                                "seconds the pods wait for each other (default 600)"},
            [R_SCHEDULE_TIMEOUT] = {"--schedule-timeout", "S",
                                    "coscheduling's wait for the whole gang (default 300;\n"
                                    "less than --gang-timeout)"},
            [R_SCHEDULER] = {"--scheduler-name", "NAME",
                             "coscheduling's scheduler (default\n"
                             "scheduler-plugins-scheduler)"},
            [R_CKPT_GBPS] = {"--ckpt-gbps", "B",
                             "checkpoint write rate of one pod, GB/s, for the grace\n"
                             "period (default 2)"},
            [R_CKPT_WRITE_S] = {"--ckpt-write-s", "S",
                                "a checkpoint write as a run measured it (run.json's\n"
                                "checkpoint.last_write_s), instead of the estimate"},
            [R_SHM] = {"--shm", "GB", "/dev/shm size (default: sized for NCCL)"},
            [R_SECRET] = {"--secret", "NAME",
                          "the existing Secret (key \"secret\") holding the store\n"
                          "secret (default NAME-store); see k8s/ADMIN.md"},
            [R_SECRET_FILE] = {"--secret-file", "FILE",
                               "render the Secret too, with FILE's secret (the same\n"
                               "file gives the same manifest; it then sits in the YAML)"},
            [R_CPUS] = {"--cpus", "N", "CPUs a pod requests (default: its ranks' cores as placed)"},
            [R_MEMORY] = {"--memory", "GB",
                          "host memory a pod requests and is limited to (default:\n"
                          "the estimate, /dev/shm included)"},
            [R_GUARANTEED] = {"--guaranteed", NULL,
                              "limit CPUs to the request too: QoS class Guaranteed\n"
                              "(default Burstable: memory limited, CPUs not)"},
            [R_RUN_AS_USER] = {"--run-as-user", "UID", "the pods' securityContext.runAsUser"},
            [R_RUN_AS_GROUP] = {"--run-as-group", "GID",
                                "runAsGroup, and fsGroup: the volumes' files"},
            [R_RUN_AS_NON_ROOT] = {"--run-as-non-root", NULL, "securityContext.runAsNonRoot"},
            [R_PULL_SECRET] = {"--image-pull-secret", "NAME", "a Secret for the registry",
                               .repeats = true},
            [R_NODE_SELECTOR] = {"--node-selector", "KEY=VALUE", "a node label the pods need",
                                 .repeats = true},
            [R_TOLERATION] = {"--toleration", "KEY[=VALUE][:EFFECT]",
                              "a taint the pods tolerate (beside\n"
                              "nvidia.com/gpu's)",
                              .repeats = true},
            [R_MOUNT_PVC] = {"--mount-pvc", "CLAIM:/PATH[:ro]",
                             "a PersistentVolumeClaim at /PATH, for data\n"
                             "and checkpoints: give the plan's paths under it",
                             .repeats = true},
            [R_MOUNT_HOST] = {"--mount-host", "/DIR:/PATH[:ro]",
                              "a directory of every node (hostPath) at\n"
                              "/PATH",
                              .repeats = true},
            [R_SET] = {"--set", "path=value", "override a plan field, as for plait train",
                       .repeats = true},
            {0}},
    .epilog = "exit codes: 0 printed, 1 the plan cannot run there (the reason is printed), 2 usage",
};

/* An option that is a name or a number into a: where each goes, and its
 * bounds (a DNS name's length; 0: any text). */
static int render_value(const struct cli_command *cli, int opt, const char *o, const char *v,
                        struct k8s_render_args *a)
{
    const struct {
        int opt;
        size_t dns_max;
        const char **to;
    } names[] = {{R_IMAGE, 0, &a->image},       {R_NAME, 0, &a->name},
                 {R_TOPOLOGY, 0, &a->topology}, {R_SCHEDULER, 0, &a->scheduler},
                 {R_TOPOLOGY_KEY, 0, &a->topology_key},
                 {R_GPU_PRODUCT, 0, &a->gpu_product},
                 {R_NAMESPACE, 63, &a->ns},     {R_QUEUE, 63, &a->queue},
                 {R_PRIORITY, 253, &a->priority},
                 {R_PVC, 253, &a->pvc},         {R_SECRET, 253, &a->secret_name},
                 {R_SECRET_FILE, 0, &a->secret_file}};
    const struct {
        int opt, max;
        int *to;
    } counts[] = {{R_NODES, 100000, &a->nodes},
                  {R_GPUS, 1024, &a->gpus_per_node},
                  {R_PORT, 65535, &a->port},
                  {R_GANG_TIMEOUT, 86400, &a->gang_timeout_s},
                  {R_CPUS, 100000, &a->cpus},
                  {R_SCHEDULE_TIMEOUT, 86400, &a->schedule_timeout_s}};
    const struct {
        int opt;
        double *to;
    } reals[] = {{R_GPU_MEMORY, &a->gpu_memory_gb},
                 {R_CKPT_WRITE_S, &a->ckpt_write_s},
                 {R_CKPT_GBPS, &a->ckpt_gbps},
                 {R_SHM, &a->shm_gb},
                 {R_MEMORY, &a->memory_gb}};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (names[i].opt == opt)
            return names[i].dns_max ? dns_option(cli, o, v, names[i].dns_max, names[i].to)
                                    : (*names[i].to = v, CLI_CONTINUE);
    for (size_t i = 0; i < sizeof counts / sizeof *counts; i++)
        if (counts[i].opt == opt) return positive(cli, o, v, counts[i].max, counts[i].to);
    for (size_t i = 0; i < sizeof reals / sizeof *reals; i++)
        if (reals[i].opt == opt) return positive_real(cli, o, v, reals[i].to);
    if (opt == R_MAX_RESTARTS) return non_negative(cli, o, v, &a->max_restarts);
    if (opt == R_RUN_AS_USER || opt == R_RUN_AS_GROUP) {
        int id = -1, rc = non_negative(cli, o, v, &id);
        *(opt == R_RUN_AS_USER ? &a->run_as_user : &a->run_as_group) = id;
        return rc;
    }
    return CLI_CONTINUE;
}

/* The options given more than once: each into its list (room for args.n made
 * by the caller), checked; mount_text: room for --mount-*'s parts. */
static int render_list(const struct cli_command *cli, int opt, const char *v,
                       struct k8s_render_args *a, char *mount_text, size_t mount_text_bytes)
{
    const char *o = cli->options[opt].name, *why = NULL;
    switch (opt) {
    case R_SET:
        a->sets[a->n_sets++] = v;
        return CLI_CONTINUE;
    case R_PULL_SECRET:
        a->pull_secrets[a->n_pull_secrets++] = v;
        return dns_name(cli, o, v, 253);
    case R_NODE_SELECTOR:
        a->node_selectors[a->n_node_selectors++] = v;
        why = k8s_node_selector_problem(v);
        break;
    case R_TOLERATION:
        a->tolerations[a->n_tolerations++] = v;
        why = k8s_toleration_problem(v);
        break;
    default: /* R_MOUNT_PVC, R_MOUNT_HOST */
        why = k8s_mount_parse(v, opt == R_MOUNT_HOST, mount_text + a->n_mounts * mount_text_bytes,
                              mount_text_bytes, &a->mounts[a->n_mounts]);
        a->n_mounts++;
    }
    return why ? cli_usage_error(cli, "%s %s %s", o, v, why) : CLI_CONTINUE;
}

/* --rdma RESOURCE[=N]: the resource's name into rdma (room made by the caller) */
static int rdma_of(const struct cli_command *cli, const char *o, const char *v,
                   struct k8s_render_args *a, char *rdma, size_t rdma_bytes)
{
    int rc = CLI_CONTINUE;
    const char *eq = strchr(v, '=');
    a->rdma_per_pod = 1;
    if (eq) rc = positive(cli, o, eq + 1, 1024, &a->rdma_per_pod);
    snprintf(rdma, rdma_bytes, "%.*s", eq ? (int)(eq - v) : (int)strlen(v), v);
    if (!strchr(rdma, '/'))
        rc = cli_usage_error(cli,
                             "--rdma names an extended resource, e.g. "
                             "rdma/rdma_shared_device_a (got %s)",
                             v);
    a->rdma = rdma;
    return rc;
}

/* One of the words an option takes, into a. */
static int render_choice(const struct cli_command *cli, int opt, const char *v,
                         struct k8s_render_args *a)
{
    if (opt == R_GANG) return gang_of(cli, v, false, &a->gang);
    if (opt == R_WORKLOAD) {
        const char *names[] = {"jobset", "job", "vcjob"};
        const enum k8s_workload kinds[] = {K8S_WORKLOAD_JOBSET, K8S_WORKLOAD_JOB,
                                           K8S_WORKLOAD_VCJOB};
        for (int k = 0; k < 3; k++)
            if (!strcmp(v, names[k])) {
                a->workload = kinds[k];
                return CLI_CONTINUE;
            }
        return cli_usage_error(cli, "--workload must be jobset, job or vcjob (got %s)", v);
    }
    if (strcmp(v, "auto") && strcmp(v, "required") && strcmp(v, "preferred"))
        return cli_usage_error(cli,
                               "--topology-mode must be auto, required or preferred "
                               "(got %s)",
                               v);
    a->topology_required = v[0] == 'a' ? -1 : v[0] == 'r';
    return CLI_CONTINUE;
}

/* One option (or the operand, opt < 0) into a; rdma: room for --rdma's name. */
static int render_option(const struct cli_command *cli, int opt, const char *v,
                         struct k8s_render_args *a, char *rdma, size_t rdma_bytes)
{
    const char *o = opt >= 0 ? cli->options[opt].name : NULL;
    switch (opt) {
    case R_GUARANTEED:
        a->guaranteed = true;
        return CLI_CONTINUE;
    case R_RUN_AS_NON_ROOT:
        a->run_as_non_root = true;
        return CLI_CONTINUE;
    case R_RUN_DIR:
        a->run_dir = v;
        return v[0] != '/' ? cli_usage_error(cli, "--run-dir must be absolute (got %s)", v)
                           : CLI_CONTINUE;
    case R_RDMA:
        return rdma_of(cli, o, v, a, rdma, rdma_bytes);
    case R_GANG:
    case R_WORKLOAD:
    case R_TOPOLOGY_MODE:
        return render_choice(cli, opt, v, a);
    }
    if (opt >= 0) return render_value(cli, opt, o, v, a);
    a->plan_path = v;
    return CLI_CONTINUE;
}

/* What the options say together: the required ones, the defaults that
 * depend on others, and the combinations refused. */
static int render_complete(const struct cli_command *cli, struct k8s_render_args *a,
                           char *run_dir, size_t run_dir_bytes)
{
    int rc;
    if ((rc = dns_name(cli, "--name", a->name, 63)) != CLI_CONTINUE) return rc;
    if (a->queue && a->gang != K8S_GANG_KUEUE && a->gang != K8S_GANG_VOLCANO)
        return cli_usage_error(cli, "--queue is for --gang kueue or volcano");
    if (!a->queue) a->queue = "training";
    if (a->workload == K8S_WORKLOAD_DEFAULT)
        a->workload = a->gang == K8S_GANG_JOBSET || a->gang == K8S_GANG_KUEUE ? K8S_WORKLOAD_JOBSET
                                                                              : K8S_WORKLOAD_JOB;
    if (a->gang == K8S_GANG_JOBSET && a->workload == K8S_WORKLOAD_JOB)
        return cli_usage_error(cli, "--gang jobset renders a JobSet: --workload job needs "
                                    "--gang kueue, volcano or coscheduling");
    if (a->workload == K8S_WORKLOAD_VCJOB && a->gang != K8S_GANG_VOLCANO)
        return cli_usage_error(cli, "--workload vcjob is Volcano's: it needs --gang volcano");
    if (a->secret_name && a->secret_file)
        return cli_usage_error(cli, "--secret names an existing Secret, --secret-file renders "
                                    "one: give one of them");
    if (a->gang == K8S_GANG_COSCHEDULING && a->schedule_timeout_s >= a->gang_timeout_s)
        return cli_usage_error(cli,
                               "--gang-timeout (%d s) must exceed --schedule-timeout (%d s): the "
                               "pods must outwait the scheduler",
                               a->gang_timeout_s, a->schedule_timeout_s);
    if (!a->run_dir) {
        snprintf(run_dir, run_dir_bytes, "/plait/%s", a->name);
        a->run_dir = run_dir;
    }
    return CLI_CONTINUE;
}

/* What parse_render makes for the arguments: the defaults that depend on
 * others, --rdma's name, and the lists of the options given more than once. */
#define MOUNT_TEXT_BYTES 512
struct render_room {
    char run_dir[128], rdma[256];
    char *mount_text; /* a MOUNT_TEXT_BYTES slice for each --mount-* */
};

static void render_room_free(struct k8s_render_args *a, struct render_room *room)
{
    free(a->sets);
    free(a->pull_secrets);
    free(a->node_selectors);
    free(a->tolerations);
    free(a->mounts);
    free(room->mount_text);
}

static int parse_render(int argc, char **argv, struct k8s_render_args *a, struct render_room *room)
{
    const struct cli_command *cli = &cmd_k8s_render_cli;
    *a = (struct k8s_render_args){.name = "train",
                                  .topology_required = -1,
                                  .ns = "default",
                                  .max_restarts = -1,
                                  .port = 29500,
                                  .gang_timeout_s = 600,
                                  .schedule_timeout_s = 300,
                                  .ckpt_gbps = 2,
                                  .scheduler = "scheduler-plugins-scheduler",
                                  .run_as_user = -1,
                                  .run_as_group = -1};
    struct cli_args args;
    int rc = cli_parse(cli, argc, argv, &args);
    if (rc != CLI_CONTINUE) return rc;
    size_t n = (size_t)args.n + 1;
    a->sets = calloc(n, sizeof *a->sets);
    a->pull_secrets = calloc(n, sizeof *a->pull_secrets);
    a->node_selectors = calloc(n, sizeof *a->node_selectors);
    a->tolerations = calloc(n, sizeof *a->tolerations);
    a->mounts = calloc(n, sizeof *a->mounts);
    room->mount_text = calloc(n, MOUNT_TEXT_BYTES);
    if (!a->sets || !a->pull_secrets || !a->node_selectors || !a->tolerations || !a->mounts ||
        !room->mount_text)
        rc = PLAIT_EXIT_ERROR;
    for (int k = 0; k < args.n && rc == CLI_CONTINUE; k++) {
        int opt = args.v[k].opt;
        if (opt >= 0 && cli->options[opt].repeats)
            rc = render_list(cli, opt, args.v[k].value, a, room->mount_text, MOUNT_TEXT_BYTES);
        else
            rc = render_option(cli, opt, args.v[k].value, a, room->rdma, sizeof room->rdma);
    }
    cli_args_free(&args);
    if (rc != CLI_CONTINUE) return rc;
    return render_complete(cli, a, room->run_dir, sizeof room->run_dir);
}

int cmd_k8s_render(int argc, char **argv)
{
    struct k8s_render_args a = {0};
    struct render_room room = {0};
    int rc = parse_render(argc, argv, &a, &room);
    if (rc == CLI_CONTINUE) rc = k8s_render(&a, stdout);
    render_room_free(&a, &room);
    return rc;
}

/* ---- plait k8s admin ----------------------------------------------------------------- */

enum {
    A_NAMESPACE,
    A_GPUS,
    A_COHORT,
    A_PRIORITIES,
    A_GANG,
    A_QUEUE,
    A_GPU_PRODUCT,
    A_RDMA,
    A_LEVELS,
    A_KUEUE_API
};
const struct cli_command cmd_k8s_admin_cli = {
    .name = "k8s admin",
    .operands = "",
    .min_operands = 0,
    .max_operands = 0,
    .summary = "print a team's GPU quota, queue and priority classes",
    .description =
        "Prints what a cluster admin applies once per team: with --gang kueue (default)\n"
        "a ResourceFlavor, a ClusterQueue with a nvidia.com/gpu nominal quota that\n"
        "preempts lower priorities, a LocalQueue and WorkloadPriorityClasses; with\n"
        "volcano a Queue with its capability; with quota a ResourceQuota on\n"
        "requests.nvidia.com/gpu. PriorityClasses in every case. See k8s/ADMIN.md.",
    .options =
        (const struct cli_option[]){
            [A_NAMESPACE] = {"--namespace", "NS", "the team's namespace", .required = true},
            [A_GPUS] = {"--gpus", "N", "GPUs the team may use at once", .required = true},
            [A_COHORT] = {"--cohort", "C",
                          "Kueue cohort: borrow idle GPUs from its other queues, and\n"
                          "reclaim lent ones"},
            [A_PRIORITIES] = {"--priorities", "HIGH,LOW",
                              "priority classes, highest first (default\n"
                              "training-high,training-low)"},
            [A_GANG] = {"--gang", "KIND", "kueue (default), volcano or quota"},
            [A_QUEUE] = {"--queue", "Q",
                         "the LocalQueue, or the Volcano Queue NS-Q (cluster-wide);\n"
                         "default training"},
            [A_GPU_PRODUCT] = {"--gpu-product", "PRODUCT",
                               "the nodes of the Kueue ResourceFlavor\n"
                               "(nvidia.com/gpu.product)"},
            [A_RDMA] = {"--rdma", "RESOURCE", "an RDMA resource the ClusterQueue also covers"},
            [A_LEVELS] = {"--topology-levels", "LABELS",
                          "node labels of a Kueue Topology, comma-separated, widest\n"
                          "first (kubernetes.io/hostname is added last)"},
            [A_KUEUE_API] = {"--kueue-api", "VERSION",
                             "v1beta2 (default; Kueue 0.15 and later) or v1beta1\n"
                             "(Kueue 0.14 and earlier)"},
            {0}},
    .epilog = "exit codes: 0 printed, 1 the lint refused it, 2 usage",
};

/* "a,b,c" into out[] (pointers into buf) */
static int split_list(const struct cli_command *cli, const char *opt, const char *v, char *buf,
                      size_t bytes, const char **out, int max, int *n)
{
    snprintf(buf, bytes, "%s", v);
    *n = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (*n == max) return cli_usage_error(cli, "%s: at most %d entries", opt, max);
        out[(*n)++] = t;
    }
    if (!*n) return cli_usage_error(cli, "%s is empty", opt);
    return CLI_CONTINUE;
}

int cmd_k8s_admin(int argc, char **argv)
{
    const struct cli_command *cli = &cmd_k8s_admin_cli;
    static const char *default_priorities[] = {"training-high", "training-low"};
    const char *priorities[MAX_PRIORITIES], *levels[MAX_LEVELS + 1];
    char prio_buf[1024], level_buf[2048];
    struct k8s_admin_args a = {.gang = K8S_GANG_KUEUE,
                               .queue = "training",
                               .priorities = default_priorities,
                               .n_priorities = 2,
                               .kueue_api = "kueue.x-k8s.io/v1beta2"};
    struct cli_args args;
    int rc = cli_parse(cli, argc, argv, &args);
    if (rc != CLI_CONTINUE) return rc;
    for (int k = 0; k < args.n && rc == CLI_CONTINUE; k++) {
        int opt = args.v[k].opt;
        const char *v = args.v[k].value, *o = cli->options[opt].name;
        switch (opt) {
        case A_NAMESPACE:
            rc = dns_option(cli, o, v, 63, &a.ns);
            break;
        case A_GPUS:
            rc = positive(cli, o, v, 10000000, &a.gpus);
            break;
        case A_COHORT:
            rc = dns_option(cli, o, v, 63, &a.cohort);
            break;
        case A_PRIORITIES:
            rc = split_list(cli, o, v, prio_buf, sizeof prio_buf, priorities, MAX_PRIORITIES,
                            &a.n_priorities);
            a.priorities = priorities;
            for (int i = 0; i < a.n_priorities && rc == CLI_CONTINUE; i++)
                rc = dns_name(cli, o, priorities[i], 253);
            break;
        case A_GANG:
            rc = gang_of(cli, v, true, &a.gang);
            break;
        case A_QUEUE:
            rc = dns_option(cli, o, v, 63, &a.queue);
            break;
        case A_GPU_PRODUCT:
            a.gpu_product = v;
            break;
        case A_RDMA:
            a.rdma = v;
            break;
        case A_KUEUE_API:
            if (!strcmp(v, "v1beta2") || !strcmp(v, "v1beta1"))
                a.kueue_api = v[6] == '2' ? "kueue.x-k8s.io/v1beta2" : "kueue.x-k8s.io/v1beta1";
            else
                rc = cli_usage_error(cli, "--kueue-api must be v1beta2 or v1beta1 (got %s)", v);
            break;
        case A_LEVELS:
            rc =
                split_list(cli, o, v, level_buf, sizeof level_buf, levels, MAX_LEVELS, &a.n_levels);
            a.levels = levels;
            break;
        }
    }
    cli_args_free(&args);
    if (rc != CLI_CONTINUE) return rc;
    bool kueue_only = a.cohort || a.n_levels || a.gpu_product || a.rdma ||
                      strcmp(a.kueue_api, "kueue.x-k8s.io/v1beta2");
    if (a.gang != K8S_GANG_KUEUE && kueue_only)
        return cli_usage_error(cli, "--cohort, --topology-levels, --gpu-product, --rdma and "
                                    "--kueue-api are for --gang kueue");
    if (a.n_levels && strcmp(levels[a.n_levels - 1], "kubernetes.io/hostname"))
        levels[a.n_levels++] = "kubernetes.io/hostname"; /* lowest, so taints are respected */
    return k8s_admin(&a, stdout);
}

/* ---- plait k8s lint -------------------------------------------------------------------- */

const struct cli_command cmd_k8s_lint_cli = {
    .name = "k8s lint",
    .operands = "FILE...",
    .min_operands = 1,
    .max_operands = 64,
    .summary = "check manifests for what the Kubernetes schemas cannot see",
    .description = "Checks each YAML FILE for DNS-1123 names and the host names their pods get,\n"
                   "label keys and values, extended resources in a ResourceQuota (only\n"
                   "requests.<resource>), GPU and RDMA requests equal to their limits, a\n"
                   "PodGroup's minMember equal to its pods and an Indexed Job's headless Service.\n"
                   "plait k8s render and admin run the same lint before they print.",
    .options = (const struct cli_option[]){{0}},
    .epilog = "exit codes: 0 no problem, 1 problems (one line each, on stderr), 2 usage",
};

int cmd_k8s_lint(int argc, char **argv)
{
    struct cli_args args;
    int rc = cli_parse(&cmd_k8s_lint_cli, argc, argv, &args);
    if (rc != CLI_CONTINUE) return rc;
    rc = PLAIT_EXIT_OK;
    for (int k = 0; k < args.n; k++) {
        struct plait_error err;
        size_t len;
        char *text = fs_read_all(args.v[k].value, &len, &err);
        int problems = text ? k8s_lint_text(text, len, args.v[k].value, stderr, &err) : -1;
        if (problems < 0) log_error("k8s lint: %s", err.text);
        if (problems) rc = PLAIT_EXIT_ERROR;
        free(text);
    }
    cli_args_free(&args);
    return rc;
}
