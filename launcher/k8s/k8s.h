/* k8s.h — plait k8s: what its subcommands were asked (cmd_k8s.c parses the
 * command lines into these) and the functions that write the manifests
 * (k8s_render.c: a training job; k8s_admin.c: queues, quotas, priorities).
 * Both lint what they wrote (k8s_lint.h) before it reaches stdout. */
#ifndef PLAIT_LAUNCHER_K8S_H
#define PLAIT_LAUNCHER_K8S_H

#include <stdbool.h>
#include <stdio.h>

#include "launcher/k8s/k8s_yaml.h"

/* Who holds the pods back until all of them can run. */
enum k8s_gang {
    K8S_GANG_JOBSET,       /* a JobSet alone (kube-scheduler, no gang admission) */
    K8S_GANG_KUEUE,        /* Kueue admits the whole workload's quota at once */
    K8S_GANG_VOLCANO,      /* Volcano PodGroup, scheduler "volcano" */
    K8S_GANG_COSCHEDULING, /* scheduler-plugins PodGroup */
    K8S_GANG_QUOTA,        /* admin only: a plain ResourceQuota, no gang */
};

/* What carries the pods: a JobSet of one Job, an Indexed Job with its
 * headless Service, or a Volcano Job (vcjob: its svc plugin makes the
 * Service, its policies restart the gang). */
enum k8s_workload { K8S_WORKLOAD_DEFAULT, K8S_WORKLOAD_JOBSET, K8S_WORKLOAD_JOB, K8S_WORKLOAD_VCJOB };

/* A volume the pods mount besides the run directory's: a PersistentVolumeClaim
 * or a directory of the node (hostPath), for data and checkpoints. */
struct k8s_mount {
    const char *claim;     /* the claim's name, or NULL: host_path */
    const char *host_path; /* a directory of every node */
    const char *path;      /* where the pods see it (absolute) */
    bool read_only;
};

/* --mount-pvc CLAIM:/PATH[:ro] or --mount-host /DIR:/PATH[:ro] into m (pointers
 * into buf); NULL, or what is wrong. */
const char *k8s_mount_parse(const char *spec, bool host, char *buf, size_t buf_bytes,
                            struct k8s_mount *m);

/* --toleration KEY[=VALUE][:EFFECT] and --node-selector KEY=VALUE: NULL, or
 * what is wrong. */
const char *k8s_toleration_problem(const char *spec);
const char *k8s_node_selector_problem(const char *spec);

struct k8s_render_args {
    const char *plan_path;
    const char **sets;
    int n_sets;
    const char *image;
    int nodes, gpus_per_node;
    const char *name, *ns;
    enum k8s_gang gang;
    enum k8s_workload workload;
    const char *queue, *priority, *topology_key;
    int topology_required; /* -1: when pipelines cross pods, 0 preferred, 1 required */
    const char *rdma;      /* an RDMA device resource, or NULL */
    int rdma_per_pod;
    const char *gpu_product; /* nvidia.com/gpu.product to select, or NULL */
    double gpu_memory_gb;    /* 0: from the product name or the topology */
    const char *topology;    /* hwloc XML of a node, or NULL */
    int max_restarts;        /* gang restarts */
    int port;                /* pod 0's store */
    int gang_timeout_s;      /* the in-pod gang barrier's deadline */
    int schedule_timeout_s;  /* the scheduler's own wait for the whole gang */
    const char *pvc;         /* a PersistentVolumeClaim for the run directory, or NULL */
    const char *run_dir;     /* PLAIT_RUN_DIR in the pods */
    double ckpt_gbps;        /* checkpoint write rate of one pod, GB/s */
    double ckpt_write_s;     /* a measured checkpoint write (run.json), or 0: the estimate */
    const char *scheduler;   /* schedulerName for coscheduling */
    double shm_gb;           /* /dev/shm size; 0: sized for NCCL */
    const char *secret_name; /* an existing Secret with key "secret"; default NAME-store */
    const char *secret_file; /* render the Secret, with this file's secret, or NULL */
    bool guaranteed;         /* CPU limit = request too: the pods' QoS class Guaranteed */
    int cpus;                /* CPUs a pod requests; 0: its ranks' cores as placed */
    double memory_gb;        /* host memory a pod requests, GB; 0: the estimate */
    long run_as_user, run_as_group; /* -1: the image's */
    bool run_as_non_root;
    const char **pull_secrets, **tolerations, **node_selectors; /* as given */
    int n_pull_secrets, n_tolerations, n_node_selectors;
    struct k8s_mount *mounts;
    int n_mounts;
};

struct k8s_admin_args {
    const char *ns;
    int gpus;
    const char *cohort;
    const char **priorities; /* highest first */
    int n_priorities;
    enum k8s_gang gang; /* KUEUE, VOLCANO or QUOTA */
    const char *queue;
    const char *gpu_product; /* ResourceFlavor's node label, or NULL */
    const char *rdma;        /* another resource the ClusterQueue covers, or NULL */
    const char *kueue_api;   /* "kueue.x-k8s.io/v1beta2" (Kueue 0.15+) or ".../v1beta1" */
    const char **levels;     /* Kueue Topology levels (node labels, widest first), or none */
    int n_levels;
};

/* Print the manifests on out; return the exit code (messages on stderr). */
int k8s_render(const struct k8s_render_args *a, FILE *out);
int k8s_admin(const struct k8s_admin_args *a, FILE *out);

/* plait check --k8s-nodes FILE (k8s_nodes.c): the plan on each kind of GPU
 * node of `kubectl get nodes -o json` output, on `nodes` of them (0: as many
 * as the plan's ranks need, or all) with gpus_per_node ranks each (0: all
 * their GPUs); in->device_memory_bytes, when set, overrides the nodes'. Prints
 * which nodes it fits on (or one JSON object); returns the exit code: 0 when
 * it fits on some kind. */
struct plan;
struct layout_inputs;
int k8s_nodes_check(const struct plan *p, const char *path, int nodes, int gpus_per_node,
                    const struct layout_inputs *in, bool as_json);

/* The gang's name as spelled on the command line. */
const char *k8s_gang_name(enum k8s_gang g);

/* Closes the stream, lints its text and prints it on out, or says what the
 * lint found and prints nothing. Returns the exit code. */
int k8s_print_linted(struct ky_stream *s, const char *what, FILE *out);

#endif
