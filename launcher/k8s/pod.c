/* pod.c — plait launch in a Kubernetes pod: the pod's place in the gang
 * (launcher/k8s/k8s_env.h), pod 0 hosting the rendezvous store, and one run
 * of the gang of pods (launcher/node_gang.c: the barrier, the rank map on
 * every pod's topology, this pod's ranks); a lost peer ends the pod with 76,
 * for JobSet to restart the gang. Not here: the Slurm task's path
 * (cmd_launch.c, slurm_nodes.c), the manifests (k8s render). */
#include "launcher/k8s/pod.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/place/env.h"
#include "common/plan/plan.h"
#include "common/store/store.h"
#include "launcher/k8s/k8s_env.h"
#include "launcher/node_gang.h"

#define DNS_BYTES NODE_GANG_NAME_BYTES
#define END_WAIT_FAILED_S 5.0 /* pod 0 keeps its store this long for the others after a failure */

/* The gang as this pod sees it. */
struct pod {
    int index, pods, ranks_per_pod, port, attempt;
    double gang_timeout_s;
    char dns[DNS_BYTES];  /* this pod's name */
    char dns0[DNS_BYTES]; /* pod 0's, where the store is */
    const char *pattern;  /* PLAIT_K8S_POD_DNS */
    const char *secret;
};

bool pod_is_kubernetes(void)
{
    return getenv(K8S_ENV_COMPLETION_INDEX) != NULL;
}

/* An integer variable of the pod's environment (node_gang_env_int). */
static int env_int(const char *name, long lo, long hi, long def, long *out)
{
    return node_gang_env_int(name, lo, hi, def, out, "pod",
                             "plait k8s render writes it into every pod");
}

/* PLAIT_K8S_POD_DNS with "{index}" replaced by i. */
static int pod_dns(const char *pattern, int i, char out[DNS_BYTES])
{
    const char *at = strstr(pattern, "{index}");
    if (!at) return -1;
    int n = snprintf(out, DNS_BYTES, "%.*s%d%s", (int)(at - pattern), pattern, i,
                     at + sizeof "{index}" - 1);
    return n > 0 && n < DNS_BYTES ? 0 : -1;
}

static int read_pod(struct pod *p)
{
    long index, pods, per_pod, port, timeout_s, attempt;
    if (env_int(K8S_ENV_PODS, 1, PLAN_MAX_RANKS, -1, &pods) ||
        env_int(K8S_ENV_COMPLETION_INDEX, 0, pods - 1, -1, &index) ||
        env_int(K8S_ENV_RANKS_PER_POD, 1, PLAN_MAX_RANKS / pods, -1, &per_pod) ||
        env_int(K8S_ENV_STORE_PORT, 1, 65535, -1, &port) ||
        env_int(K8S_ENV_GANG_TIMEOUT_S, 1, 7 * 24 * 3600, -1, &timeout_s))
        return -1;
    /* the restart attempt: ours, else a PLAIT_RESTART_COUNT the pod spec maps it to, else 0 */
    const char *attempt_var =
        getenv(K8S_ENV_RESTART_ATTEMPT) ? K8S_ENV_RESTART_ATTEMPT : PLAIT_ENV_RESTART_COUNT;
    if (env_int(attempt_var, 0, 1 << 30, 0, &attempt)) return -1;
    p->index = (int)index;
    p->pods = (int)pods;
    p->ranks_per_pod = (int)per_pod;
    p->port = (int)port;
    p->attempt = (int)attempt;
    p->gang_timeout_s = (double)timeout_s;
    p->pattern = getenv(K8S_ENV_POD_DNS);
    if (!p->pattern || pod_dns(p->pattern, p->index, p->dns) || pod_dns(p->pattern, 0, p->dns0)) {
        log_error("pod %d: %s=%s must be the pods' DNS name with {index} for the pod's index, "
                  "e.g. train-workers-0-{index}.train",
                  p->index, K8S_ENV_POD_DNS, p->pattern ? p->pattern : "(not set)");
        return -1;
    }
    p->secret = getenv(PLAIT_ENV_STORE_SECRET);
    if (!p->secret || !*p->secret) {
        log_error("pod %d (%s): %s is not set: every pod of a job needs the job's Secret", p->index,
                  p->dns, PLAIT_ENV_STORE_SECRET);
        return -1;
    }
    const char *weak = store_secret_problem(p->secret);
    if (weak) {
        log_error("pod %d (%s): %s is not a job's secret: %s; render the job with plait k8s "
                  "render, which makes a fresh one",
                  p->index, p->dns, PLAIT_ENV_STORE_SECRET, weak);
        return -1;
    }
    if (!getenv(PLAIT_ENV_RUN_DIR) || !*getenv(PLAIT_ENV_RUN_DIR)) {
        log_error("pod %d (%s): %s is not set", p->index, p->dns, PLAIT_ENV_RUN_DIR);
        return -1;
    }
    return 0;
}

/* ---- plait launch in a pod --------------------------------------------------------------- */

/* Before the ranks start there is nothing to checkpoint: a stop (Kubernetes'
 * SIGTERM) ends the pod at once, resumable. The launcher may be the container's
 * process 1, which the kernel spares every signal it has no handler for. */
static void stop_before_ranks(int sig)
{
    (void)sig;
    _exit(PLAIT_EXIT_PREEMPTED);
}

static void on_stop_signals(void (*handler)(int))
{
    struct sigaction sa = {.sa_handler = handler}, old;
    sigemptyset(&sa.sa_mask);
    const int sigs[4] = {SIGINT, SIGTERM, SIGUSR1, SIGHUP};
    for (int i = 0; i < 4; i++) { /* what is ignored (nohup) stays ignored */
        sigaction(sigs[i], &sa, &old);
        if (old.sa_handler == SIG_IGN) sigaction(sigs[i], &old, NULL);
    }
}

/* Pod i's DNS name, for the gang's messages. */
static int member_dns(const struct node_gang *g, int i, char out[NODE_GANG_NAME_BYTES])
{
    const struct pod *p = g->ctx;
    return pod_dns(p->pattern, i, out);
}

int pod_launch(void)
{
    struct pod p = {0};
    struct plan *plan = NULL;
    struct store_server *srv = NULL;
    struct plait_error err;
    int code = PLAIT_EXIT_ERROR;
    if (read_pod(&p)) return PLAIT_EXIT_ERROR;
    on_stop_signals(stop_before_ranks);
    struct node_gang g = {.noun = "pod",
                          .index = p.index,
                          .members = p.pods,
                          .ranks_per_member = p.ranks_per_pod,
                          .store_host = p.dns0,
                          .port = p.port,
                          .secret = p.secret,
                          .gang_timeout_s = p.gang_timeout_s,
                          .timeout_var = K8S_ENV_GANG_TIMEOUT_S,
                          .shape_vars = K8S_ENV_PODS ", " K8S_ENV_RANKS_PER_POD,
                          .on_lost = "exit 76 (restart the gang)",
                          .member_name = member_dns,
                          .ctx = &p,
                          .restart_count = -1 /* this pod's, in its environment */};
    /* "k8s/a<attempt>/": this gang's keys, never an earlier one's */
    snprintf(g.prefix, sizeof g.prefix, "k8s/a%d/", p.attempt);
    /* the plan the ConfigMap mounts, unless the pod says otherwise */
    setenv(PLAIT_ENV_PLAN, K8S_PLAN_PATH, 0);
    const char *plan_path = getenv(PLAIT_ENV_PLAN);
    if (!(plan = plan_load(plan_path, NULL, 0, &err))) {
        log_error("pod %d (%s): %s", p.index, p.dns, err.text);
        goto out;
    }
    if (p.index == 0 && store_server_start(&srv, NULL, p.port, p.secret, &err)) {
        log_error("pod 0 (%s): cannot host the gang's store on port %d (%s): %s", p.dns, p.port,
                  K8S_ENV_STORE_PORT, err.text);
        goto out;
    }
    /* what every rank of this pod shares */
    char attempt[16];
    snprintf(attempt, sizeof attempt, "%d", p.attempt);
    setenv(PLAIT_ENV_RESTART_COUNT, attempt, 1);
    unsetenv(PLAIT_ENV_FRESH);
    setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
    code = node_gang_run(&g, plan);
    on_stop_signals(SIG_IGN); /* the ranks are done: the end is said however it came */
    if (g.met) {
        bool ok = code == PLAIT_EXIT_OK || code == PLAIT_EXIT_PREEMPTED;
        node_gang_finish(&g, code,
                         ok ? p.gang_timeout_s + plan->parallel.timeout_s : END_WAIT_FAILED_S);
    }
out:
    node_gang_close(&g);
    store_server_stop(srv);
    plan_free(plan);
    return code;
}
