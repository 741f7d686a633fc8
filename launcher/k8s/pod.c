/* pod.c — plait launch in a Kubernetes pod: the pod's place in the gang
 * (launcher/k8s/k8s_env.h), pod 0's rendezvous store, the gang barrier with its
 * deadline, the job's rank map computed alike by every pod from all pods'
 * topologies, and this pod's ranks (gang.c) until they end or a peer is lost.
 * Not here: the Slurm task's path (cmd_launch.c), the manifests (k8s render). */
#include "launcher/k8s/pod.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/place/env.h"
#include "common/fsutil.h"
#include "common/place/layout.h"
#include "common/log.h"
#include "common/place/place.h"
#include "common/plan/plan.h"
#include "common/store/store.h"
#include "common/place/topo.h"
#include "launcher/gang.h"
#include "launcher/k8s/k8s_env.h"

#define DNS_BYTES 256
#define END_WAIT_FAILED_S 5.0   /* pod 0 keeps its store this long for the others after a failure */
#define WATCH_POLL_S 0.5        /* how often the watcher looks whether it should stop */
#define GANG_END_LINGER_MS 1000 /* pod 0's store after the gang did not form */

/* The gang as this pod sees it. */
struct pod {
    int index, pods, ranks_per_pod, port, attempt;
    double gang_timeout_s, deadline; /* deadline: monotonic seconds */
    char dns[DNS_BYTES];             /* this pod's name */
    char dns0[DNS_BYTES];            /* pod 0's, where the store is */
    const char *pattern;             /* PLAIT_K8S_POD_DNS */
    const char *secret;
    char prefix[64]; /* "k8s/a<attempt>/": this gang's keys, never an earlier one's */
    struct store *st;
    /* the watcher: its own connection, waiting for an abort or for pod 0 to vanish */
    struct store *watch;
    pthread_t watcher;
    bool watching;
    atomic_int quit, lost;
    char lost_why[1024];
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

bool pod_is_kubernetes(void)
{
    return getenv(K8S_ENV_COMPLETION_INDEX) != NULL;
}

/* An integer variable of the pod's environment in [lo, hi]; absent: def, or
 * an error when def < lo. */
static int env_int(const char *name, long lo, long hi, long def, long *out)
{
    const char *v = getenv(name);
    if (!v || !*v) {
        if (def < lo) {
            log_error("pod: %s is not set (plait k8s render writes it into every pod)", name);
            return -1;
        }
        *out = def;
        return 0;
    }
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || end == v || x < lo || x > hi) {
        log_error("pod: %s=%s is not a number from %ld to %ld", name, v, lo, hi);
        return -1;
    }
    *out = x;
    return 0;
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
    snprintf(p->prefix, sizeof p->prefix, "k8s/a%d/", p->attempt);
    return 0;
}

static void key(const struct pod *p, char *out, size_t bytes, const char *what, int i)
{
    if (i >= 0)
        snprintf(out, bytes, "%s%s/%d", p->prefix, what, i);
    else
        snprintf(out, bytes, "%s%s", p->prefix, what);
}

static double left_s(const struct pod *p)
{
    double left = p->deadline - now_s();
    return left > 0.01 ? left : 0.01;
}

/* ---- rendezvous ------------------------------------------------------------------------- */

/* "pod 1 (train-1.train), pod 3 (train-3.train)": the pods not in the arrival list. */
static void missing_pods(const struct pod *p, const char *arrived, char *out, size_t bytes)
{
    char *seen = calloc((size_t)p->pods, 1);
    size_t len = 0, named = 0, n_missing = 0;
    out[0] = '\0';
    for (const char *s = arrived; seen && s && *s;) {
        char *end;
        long i = strtol(s, &end, 10);
        if (end == s) break;
        if (i >= 0 && i < p->pods) seen[i] = 1;
        s = *end ? end + 1 : end;
    }
    for (int i = 0; i < p->pods; i++) {
        if (seen && seen[i]) continue;
        n_missing++;
        char dns[DNS_BYTES];
        if (named < 16 && len < bytes && !pod_dns(p->pattern, i, dns)) {
            len +=
                (size_t)snprintf(out + len, bytes - len, "%spod %d (%s)", len ? ", " : "", i, dns);
            named++;
        }
    }
    if (n_missing > named && len < bytes)
        snprintf(out + len, bytes - len, " and %zu more", n_missing - named);
    free(seen);
}

/* Every pod sets its host name and topology, then meets the others at the gang
 * barrier; -1 (said) when the gang does not form by the deadline. */
static int rendezvous(struct pod *p, const char *host, const char *xml, size_t xml_bytes)
{
    struct plait_error err;
    char k[STORE_MAX_KEY_BYTES], line[32];
    snprintf(line, sizeof line, "%d\n", p->index);
    key(p, k, sizeof k, "host", p->index);
    if (store_set(p->st, k, host, strlen(host), &err)) goto lost;
    key(p, k, sizeof k, "topology", p->index);
    if (store_set(p->st, k, xml, xml_bytes, &err)) goto lost;
    key(p, k, sizeof k, "arrived", -1);
    if (store_append(p->st, k, line, strlen(line), NULL, &err)) goto lost;
    key(p, k, sizeof k, "gang", -1);
    if (store_barrier(p->st, k, p->pods, left_s(p), &err) == 0) return 0;
    if (now_s() < p->deadline - 0.05) goto lost; /* not our deadline: an abort, or the store went */
    /* this pod's deadline: name who never came, and end the gang for everyone */
    void *arrived = NULL;
    size_t bytes = 0;
    char missing[700] = "", reason[900];
    struct plait_error ignored;
    key(p, k, sizeof k, "arrived", -1);
    if (store_get(p->st, k, &arrived, &bytes, 1.0, &ignored) == 0)
        missing_pods(p, arrived, missing, sizeof missing);
    free(arrived);
    snprintf(reason, sizeof reason,
             "the gang of %d pods did not form within %.0f s (%s): %s never arrived", p->pods,
             p->gang_timeout_s, K8S_ENV_GANG_TIMEOUT_S, *missing ? missing : "some pods");
    store_abort(p->st, reason, &ignored);
    log_error("pod %d (%s): %s; exit %d (restart the gang)", p->index, p->dns, reason,
              PLAIT_EXIT_RESTART);
    /* pod 0 keeps its store a moment for a pod whose deadline came at the same time and
     * is reading who arrived */
    if (p->index == 0) usleep(GANG_END_LINGER_MS * 1000);
    return -1;
lost:
    log_error("pod %d (%s): the gang did not form: %s; exit %d (restart the gang)", p->index,
              p->dns, err.text, PLAIT_EXIT_RESTART);
    return -1;
}

/* Connects to pod 0's store by its DNS name, retrying until the deadline (the
 * headless Service's record appears only once pod 0 has an address). */
static int connect_store(struct pod *p, struct store **st)
{
    struct plait_error err;
    int rc = store_connect(st, p->dns0, p->port, p->secret, p->index, left_s(p), &err);
    if (rc == STORE_REFUSED) {
        log_error("pod %d (%s): pod 0's store at %s:%d refused this pod: its %s is not the job's "
                  "(every pod must get the job's own Secret; is this pod from another job or "
                  "an older one of the same name?)",
                  p->index, p->dns, p->dns0, p->port, PLAIT_ENV_STORE_SECRET);
        return PLAIT_EXIT_ERROR;
    }
    if (rc) {
        log_error("pod %d (%s): the gang of %d pods did not form within %.0f s (%s): pod 0 (%s), "
                  "which hosts the store, never answered: %s; exit %d (restart the gang)",
                  p->index, p->dns, p->pods, p->gang_timeout_s, K8S_ENV_GANG_TIMEOUT_S, p->dns0,
                  err.text, PLAIT_EXIT_RESTART);
        return PLAIT_EXIT_RESTART;
    }
    return 0;
}

/* ---- the job's rank map ------------------------------------------------------------------ */

/* Every pod's host name and topology, read back from the store in pod order
 * (this pod's too), so that every pod places the same inputs. */
struct nodes {
    struct topo *topos;
    char **hosts;
    struct place_node *nodes;
    int n;
};

static void nodes_free(struct nodes *n)
{
    for (int i = 0; i < n->n; i++) {
        if (n->topos) topo_free(&n->topos[i]);
        if (n->hosts) free(n->hosts[i]);
    }
    free(n->topos);
    free(n->hosts);
    free(n->nodes);
}

static int read_nodes(struct pod *p, const struct plan *plan, struct nodes *n)
{
    struct plait_error err;
    n->n = p->pods;
    n->topos = calloc((size_t)p->pods, sizeof *n->topos);
    n->hosts = calloc((size_t)p->pods, sizeof *n->hosts);
    n->nodes = calloc((size_t)p->pods, sizeof *n->nodes);
    if (!n->topos || !n->hosts || !n->nodes) {
        log_error("pod %d (%s): out of memory reading %d pods' topologies", p->index, p->dns,
                  p->pods);
        return PLAIT_EXIT_ERROR;
    }
    for (int i = 0; i < p->pods; i++) {
        char k[STORE_MAX_KEY_BYTES], label[DNS_BYTES + 32], dns[DNS_BYTES] = "?";
        void *value = NULL;
        size_t bytes = 0;
        pod_dns(p->pattern, i, dns);
        key(p, k, sizeof k, "host", i);
        if (store_get(p->st, k, &value, &bytes, p->gang_timeout_s, &err)) goto lost;
        n->hosts[i] = value;
        key(p, k, sizeof k, "topology", i);
        if (store_get(p->st, k, &value, &bytes, p->gang_timeout_s, &err)) goto lost;
        snprintf(label, sizeof label, "pod %d (%s)'s topology", i, dns);
        int rc = topo_load_xml_text(&n->topos[i], value, bytes, label, &err);
        free(value);
        if (rc) {
            log_error("pod %d (%s): %s", p->index, p->dns, err.text);
            return PLAIT_EXIT_ERROR;
        }
        n->nodes[i] = (struct place_node){.name = n->hosts[i],
                                          .topo = &n->topos[i],
                                          .slots = p->ranks_per_pod,
                                          .cpu_ranks = plan->parallel.device == PLAN_DEVICE_CPU};
    }
    return 0;
lost:
    log_error("pod %d (%s): reading the gang's topologies: %s; exit %d (restart the gang)",
              p->index, p->dns, err.text, PLAIT_EXIT_RESTART);
    return PLAIT_EXIT_RESTART;
}

/* ---- while the ranks run ----------------------------------------------------------------- */

/* The watcher thread: an abort (a rank or a pod anywhere gave up) or the store
 * gone (pod 0 lost) while this pod's ranks run makes it stop them. */
static void *watch_main(void *arg)
{
    struct pod *p = arg;
    while (!atomic_load(&p->quit)) {
        struct plait_error err;
        void *reason = NULL;
        size_t bytes = 0;
        double t0 = now_s();
        int rc = store_get(p->watch, STORE_ABORT_KEY, &reason, &bytes, WATCH_POLL_S, &err);
        if (rc == 0) {
            snprintf(p->lost_why, sizeof p->lost_why, "the job was aborted: %.900s",
                     (char *)reason);
            free(reason);
        } else if (now_s() - t0 >= 0.9 * WATCH_POLL_S) {
            continue; /* nothing happened */
        } else {
            snprintf(p->lost_why, sizeof p->lost_why,
                     "pod 0 (%s), which hosts the store, is gone: %.600s", p->dns0, err.text);
        }
        if (!atomic_load(&p->quit)) atomic_store(&p->lost, 1);
        break;
    }
    return NULL;
}

static int poll_lost(void *ctx)
{
    struct pod *p = ctx;
    return atomic_load(&p->lost);
}

/* The first failed rank of this pod: tell every pod at once. */
static void rank_failed(void *ctx, const char *how)
{
    struct pod *p = ctx;
    char reason[DNS_BYTES + 192];
    struct plait_error ignored;
    snprintf(reason, sizeof reason, "pod %d (%s): %s", p->index, p->dns, how);
    store_abort(p->st, reason, &ignored);
}

/* This pod's ranks of the map, with their env contract, until they end. */
static int run_ranks(struct pod *p, const struct rank_map *map, const struct nodes *n,
                     double grace_s)
{
    int code = PLAIT_EXIT_ERROR, local = 0;
    char ***envs = calloc((size_t)p->ranks_per_pod, sizeof *envs);
    int *ranks = calloc((size_t)p->ranks_per_pod, sizeof *ranks);
    char addr[DNS_BYTES + 16];
    struct plait_error err;
    if (!envs || !ranks) {
        log_error("pod %d (%s): out of memory", p->index, p->dns);
        goto out;
    }
    if (store_addr_format(addr, sizeof addr, p->dns0, p->port, &err)) {
        log_error("pod %d (%s): %s", p->index, p->dns, err.text);
        goto out;
    }
    for (int r = 0; r < map->world; r++) {
        if (map->ranks[r].node != p->index) continue;
        ranks[local] = r;
        if (!(envs[local++] = place_rank_env(map, n->nodes, r))) {
            log_error("pod %d (%s): out of memory", p->index, p->dns);
            goto out;
        }
    }
    const struct topo *t = &n->topos[p->index];
    struct gang_ranks procs = {.n = local,
                               .envs = envs,
                               .global_rank = ranks,
                               .store_addr = addr,
                               .secret = p->secret,
                               .restart_count = -1, /* this pod's, in its environment */
                               .threads = t->n_cores > 0 && local >= t->n_cores ? 1 : 0,
                               .grace_s = grace_s,
                               .poll = poll_lost,
                               .failed = rank_failed,
                               .ctx = p};
    struct gang_outcome outcome;
    gang_run_ranks(&procs, &outcome);
    code = outcome.code;
    if (outcome.stopped) {
        log_error("pod %d (%s): stopped its ranks: %s; exit %d (restart the gang)", p->index,
                  p->dns, p->lost_why, PLAIT_EXIT_RESTART);
        code = PLAIT_EXIT_RESTART;
    } else if (outcome.error) { /* its own failure (bad data, a bad plan): not to restart */
        log_error("pod %d (%s): rank %d failed by itself: exit %d (a restart would fail again)",
                  p->index, p->dns, outcome.failed_rank, code);
    } else if (outcome.failed_rank >= 0) {
        log_error("pod %d (%s): rank %d failed; exit %d (restart the gang)", p->index, p->dns,
                  outcome.failed_rank, PLAIT_EXIT_RESTART);
        code = PLAIT_EXIT_RESTART;
    }
out:
    for (int i = 0; envs && i < local; i++) place_env_free(envs[i]);
    free(envs);
    free(ranks);
    return code;
}

/* The end, once the gang has formed: say how this pod ended; pod 0 keeps the
 * store up until every pod has said so (or a while, after a failure), so that
 * no pod's ranks lose it while they finish, and no pod still reading the
 * others' topologies loses it when pod 0 refuses the plan. */
static void finish(struct pod *p, int code, double wait_s)
{
    struct plait_error err;
    char k[STORE_MAX_KEY_BYTES], text[16];
    snprintf(text, sizeof text, "%d", code);
    key(p, k, sizeof k, "exit", p->index);
    if (store_set(p->st, k, text, strlen(text), &err)) return;
    if (p->index != 0 || p->pods < 2) return;
    char(*keys)[STORE_MAX_KEY_BYTES] = calloc((size_t)p->pods - 1, sizeof *keys);
    const char **names = calloc((size_t)p->pods - 1, sizeof *names);
    if (keys && names) {
        for (int i = 1; i < p->pods; i++) {
            key(p, keys[i - 1], sizeof keys[i - 1], "exit", i);
            names[i - 1] = keys[i - 1];
        }
        if (store_wait(p->st, names, (size_t)p->pods - 1, wait_s, &err) &&
            (code == PLAIT_EXIT_OK || code == PLAIT_EXIT_PREEMPTED))
            log_warn("pod 0 (%s): not every pod said how it ended within %.0f s (%s); closing "
                     "the store",
                     p->dns, wait_s, err.text);
    }
    free(keys);
    free(names);
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

/* This pod's part of forming the gang: pod 0 hosts the store, every pod
 * connects to it, says its host name and topology, and meets the others.
 * 0, or the exit code (said). */
static int join_gang(struct pod *p, struct store_server **srv)
{
    struct plait_error err;
    char host[256] = "", *xml = NULL;
    size_t xml_bytes = 0;
    int code = PLAIT_EXIT_ERROR;
    if (gethostname(host, sizeof host - 1) || !*host) snprintf(host, sizeof host, "%s", p->dns);
    if (topo_export_xml(NULL, &xml, &xml_bytes, &err)) {
        log_error("pod %d (%s): this node's topology: %s", p->index, p->dns, err.text);
        goto out;
    }
    if (p->index == 0 && store_server_start(srv, NULL, p->port, p->secret, &err)) {
        log_error("pod 0 (%s): cannot host the gang's store on port %d (%s): %s", p->dns, p->port,
                  K8S_ENV_STORE_PORT, err.text);
        goto out;
    }
    if ((code = connect_store(p, &p->st)) != 0) goto out;
    code = PLAIT_EXIT_RESTART;
    if (rendezvous(p, host, xml, xml_bytes)) goto out;
    log_info("pod %d (%s): the gang of %d pods is complete", p->index, p->dns, p->pods);
    code = 0;
out:
    free(xml);
    return code;
}

/* The layout, as on Slurm: the plan's degrees, "auto" chosen by the cost
 * model, on the gang's nodes with every pod's ranks. 0, or -1 (said). */
static int pod_layout(const struct pod *p, const struct plan *plan, const struct nodes *nodes,
                      struct layout_eval *chosen)
{
    struct plait_error err;
    struct layout_inputs in = {.bw = {25, 50, 100}};
    in.device_memory_bytes = layout_device_memory(nodes->nodes, p->pods, 0);
    if (layout_choose(plan, nodes->nodes, p->pods, &in, NULL, NULL, chosen, &err)) {
        log_error("pod %d (%s): %s on %d pods × %d ranks (%s, %s)", p->index, p->dns, err.text,
                  p->pods, p->ranks_per_pod, K8S_ENV_PODS, K8S_ENV_RANKS_PER_POD);
        return -1;
    }
    int world = p->pods * p->ranks_per_pod;
    if (chosen->map.world != world) {
        log_error("pod %d (%s): the gang runs %d pods × %d ranks (%s, %s) = %d ranks, but the "
                  "plan's layout tp %d × pp %d × dp %d has %d",
                  p->index, p->dns, p->pods, p->ranks_per_pod, K8S_ENV_PODS,
                  K8S_ENV_RANKS_PER_POD, world, chosen->map.tp, chosen->map.pp, chosen->map.dp,
                  chosen->map.world);
        return -1;
    }
    char shared[256];
    place_shared_cores_text(&chosen->map, nodes->nodes, shared, sizeof shared);
    if (*shared && p->index == 0) log_warn("%s", shared);
    return 0;
}

/* The watcher of the gang's end: its own connection to the store and its
 * thread. 0, or -1 (said). */
static int start_watching(struct pod *p)
{
    struct plait_error err;
    if (store_connect(&p->watch, p->dns0, p->port, p->secret, p->index, left_s(p) + 5, &err)) {
        log_error("pod %d (%s): %s; exit %d (restart the gang)", p->index, p->dns, err.text,
                  PLAIT_EXIT_RESTART);
        return -1;
    }
    if (pthread_create(&p->watcher, NULL, watch_main, p)) {
        log_error("pod %d (%s): cannot start the watcher thread", p->index, p->dns);
        return -1;
    }
    p->watching = true;
    return 0;
}

int pod_launch(void)
{
    struct pod p = {0};
    struct plan *plan = NULL;
    struct store_server *srv = NULL;
    struct layout_eval chosen = {0};
    struct nodes nodes = {0};
    struct plait_error err;
    int code = PLAIT_EXIT_ERROR;
    bool met = false; /* the gang formed: every way out says how this pod ended */
    atomic_init(&p.quit, 0);
    atomic_init(&p.lost, 0);
    if (read_pod(&p)) return PLAIT_EXIT_ERROR;
    on_stop_signals(stop_before_ranks);
    p.deadline = now_s() + p.gang_timeout_s;
    /* the plan the ConfigMap mounts, unless the pod says otherwise */
    setenv(PLAIT_ENV_PLAN, K8S_PLAN_PATH, 0);
    const char *plan_path = getenv(PLAIT_ENV_PLAN);
    if (!(plan = plan_load(plan_path, NULL, 0, &err))) {
        log_error("pod %d (%s): %s", p.index, p.dns, err.text);
        goto out;
    }
    if ((code = join_gang(&p, &srv)) != 0) goto out;
    met = true;
    if ((code = read_nodes(&p, plan, &nodes)) != 0) goto out;
    code = PLAIT_EXIT_ERROR;
    if (pod_layout(&p, plan, &nodes, &chosen)) goto out;
    /* what every rank of this pod shares */
    char attempt[16];
    snprintf(attempt, sizeof attempt, "%d", p.attempt);
    setenv(PLAIT_ENV_RESTART_COUNT, attempt, 1);
    unsetenv(PLAIT_ENV_FRESH);
    setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
    if (fs_mkdir_p(getenv(PLAIT_ENV_RUN_DIR), &err)) {
        log_error("pod %d (%s): %s", p.index, p.dns, err.text);
        goto out;
    }
    code = PLAIT_EXIT_RESTART;
    if (start_watching(&p)) goto out;
    code = run_ranks(&p, &chosen.map, &nodes, plan->parallel.timeout_s + 5);
    on_stop_signals(SIG_IGN); /* the ranks are done: the end is said however it came */
out:
    if (p.watching) {
        atomic_store(&p.quit, 1);
        pthread_join(p.watcher, NULL);
    }
    if (met) {
        bool ok = code == PLAIT_EXIT_OK || code == PLAIT_EXIT_PREEMPTED;
        finish(&p, code, ok ? p.gang_timeout_s + plan->parallel.timeout_s : END_WAIT_FAILED_S);
    }
    store_close(p.watch);
    store_close(p.st);
    store_server_stop(srv);
    layout_eval_free(&chosen);
    nodes_free(&nodes);
    plan_free(plan);
    return code;
}
