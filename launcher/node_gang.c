/* node_gang.c — a job's launchers, one per machine, meeting at member 0's
 * store: the gang barrier with its deadline, the job's rank map computed alike
 * by every member from all members' topologies, this member's ranks (gang.c)
 * with a watcher for a peer lost elsewhere, and the end said to member 0.
 * Not here: who the members are (launcher/k8s/pod.c, slurm_nodes.c), hosting
 * the store, restarts. */
#include "launcher/node_gang.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/fsutil.h"
#include "common/log.h"
#include "common/place/env.h"
#include "common/place/layout.h"
#include "common/place/place.h"
#include "common/place/topo.h"
#include "common/store/store.h"

#define WATCH_POLL_S 0.5        /* how often the watcher looks whether it should stop */
#define GANG_END_LINGER_MS 1000 /* member 0's store after the gang did not form */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void key(const struct node_gang *g, char *out, size_t bytes, const char *what, int i)
{
    if (i >= 0)
        snprintf(out, bytes, "%s%s/%d", g->prefix, what, i);
    else
        snprintf(out, bytes, "%s%s", g->prefix, what);
}

static double left_s(const struct node_gang *g)
{
    double left = g->deadline - now_s();
    return left > 0.01 ? left : 0.01;
}

static void member_name(const struct node_gang *g, int i, char out[NODE_GANG_NAME_BYTES])
{
    if (g->member_name(g, i, out)) snprintf(out, NODE_GANG_NAME_BYTES, "?");
}

int node_gang_env_int(const char *name, long lo, long hi, long def, long *out, const char *who,
                      const char *if_unset)
{
    const char *v = getenv(name);
    if (!v || !*v) {
        if (def < lo) {
            log_error("%s: %s is not set (%s)", who, name, if_unset);
            return -1;
        }
        *out = def;
        return 0;
    }
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || end == v || x < lo || x > hi) {
        log_error("%s: %s=%s is not a number from %ld to %ld", who, name, v, lo, hi);
        return -1;
    }
    *out = x;
    return 0;
}

/* ---- rendezvous ------------------------------------------------------------------------- */

/* "pod 1 (train-1.train), pod 3 (train-3.train)": the members not in the arrival list. */
static void missing_members(const struct node_gang *g, const char *arrived, char *out,
                            size_t bytes)
{
    char *seen = calloc((size_t)g->members, 1);
    size_t len = 0, named = 0, n_missing = 0;
    out[0] = '\0';
    for (const char *s = arrived; seen && s && *s;) {
        char *end;
        long i = strtol(s, &end, 10);
        if (end == s) break;
        if (i >= 0 && i < g->members) seen[i] = 1;
        s = *end ? end + 1 : end;
    }
    for (int i = 0; i < g->members; i++) {
        if (seen && seen[i]) continue;
        n_missing++;
        char name[NODE_GANG_NAME_BYTES];
        if (named < 16 && len < bytes && !g->member_name(g, i, name)) {
            len += (size_t)snprintf(out + len, bytes - len, "%s%s %d (%s)", len ? ", " : "",
                                    g->noun, i, name);
            named++;
        }
    }
    if (n_missing > named && len < bytes)
        snprintf(out + len, bytes - len, " and %zu more", n_missing - named);
    free(seen);
}

/* Every member sets its host name and topology, then meets the others at the
 * gang barrier; -1 (said) when the gang does not form by the deadline. */
static int rendezvous(struct node_gang *g, const char *host, const char *xml, size_t xml_bytes)
{
    struct plait_error err;
    char k[STORE_MAX_KEY_BYTES], line[32];
    snprintf(line, sizeof line, "%d\n", g->index);
    key(g, k, sizeof k, "host", g->index);
    if (store_set(g->st, k, host, strlen(host), &err)) goto lost;
    key(g, k, sizeof k, "topology", g->index);
    if (store_set(g->st, k, xml, xml_bytes, &err)) goto lost;
    key(g, k, sizeof k, "arrived", -1);
    if (store_append(g->st, k, line, strlen(line), NULL, &err)) goto lost;
    key(g, k, sizeof k, "gang", -1);
    if (store_barrier(g->st, k, g->members, left_s(g), &err) == 0) return 0;
    if (now_s() < g->deadline - 0.05) goto lost; /* not our deadline: an abort, or the store went */
    /* this member's deadline: name who never came, and end the gang for everyone */
    void *arrived = NULL;
    size_t bytes = 0;
    char missing[700] = "", reason[900], some[32];
    struct plait_error ignored;
    key(g, k, sizeof k, "arrived", -1);
    if (store_get(g->st, k, &arrived, &bytes, 1.0, &ignored) == 0)
        missing_members(g, arrived, missing, sizeof missing);
    free(arrived);
    snprintf(some, sizeof some, "some %ss", g->noun);
    snprintf(reason, sizeof reason,
             "the gang of %d %ss did not form within %.0f s (%s): %s never arrived", g->members,
             g->noun, g->gang_timeout_s, g->timeout_var, *missing ? missing : some);
    store_abort(g->st, reason, &ignored);
    log_error("%s %d (%s): %s; %s", g->noun, g->index, g->name, reason, g->on_lost);
    /* member 0 keeps its store a moment for a member whose deadline came at the same time
     * and is reading who arrived */
    if (g->index == 0) usleep(GANG_END_LINGER_MS * 1000);
    return -1;
lost:
    log_error("%s %d (%s): the gang did not form: %s; %s", g->noun, g->index, g->name, err.text,
              g->on_lost);
    return -1;
}

/* Connects to member 0's store, retrying until the deadline (a pod's DNS
 * record appears only once the pod has an address; a task may start first). */
static int connect_store(struct node_gang *g, struct store **st)
{
    struct plait_error err;
    int rc = store_connect(st, g->store_host, g->port, g->secret, g->index, left_s(g), &err);
    if (rc == STORE_REFUSED) {
        log_error("%s %d (%s): %s 0's store at %s:%d refused this %s: its %s is not the job's "
                  "(every %s must get the job's own secret; is this %s from another job or "
                  "an older one of the same name?)",
                  g->noun, g->index, g->name, g->noun, g->store_host, g->port, g->noun,
                  PLAIT_ENV_STORE_SECRET, g->noun, g->noun);
        return PLAIT_EXIT_ERROR;
    }
    if (rc) {
        log_error("%s %d (%s): the gang of %d %ss did not form within %.0f s (%s): %s 0 (%s), "
                  "which hosts the store, never answered: %s; %s",
                  g->noun, g->index, g->name, g->members, g->noun, g->gang_timeout_s,
                  g->timeout_var, g->noun, g->name0, err.text, g->on_lost);
        return PLAIT_EXIT_RESTART;
    }
    return 0;
}

/* This member's part of forming the gang: it connects to the store, says its
 * host name and topology, and meets the others. 0, or the exit code (said). */
static int join_gang(struct node_gang *g)
{
    struct plait_error err;
    char host[256] = "", *xml = NULL;
    size_t xml_bytes = 0;
    int code = PLAIT_EXIT_ERROR;
    if (gethostname(host, sizeof host - 1) || !*host) snprintf(host, sizeof host, "%s", g->name);
    if (topo_export_xml(NULL, &xml, &xml_bytes, &err)) {
        log_error("%s %d (%s): this node's topology: %s", g->noun, g->index, g->name, err.text);
        goto out;
    }
    if ((code = connect_store(g, &g->st)) != 0) goto out;
    code = PLAIT_EXIT_RESTART;
    if (rendezvous(g, host, xml, xml_bytes)) goto out;
    log_info("%s %d (%s): the gang of %d %ss is complete", g->noun, g->index, g->name,
             g->members, g->noun);
    code = 0;
out:
    free(xml);
    return code;
}

/* ---- the job's rank map ------------------------------------------------------------------ */

/* Every member's host name and topology, read back from the store in member
 * order (this member's too), so that every member places the same inputs. */
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

static int read_nodes(struct node_gang *g, const struct plan *plan, struct nodes *n)
{
    struct plait_error err;
    n->n = g->members;
    n->topos = calloc((size_t)g->members, sizeof *n->topos);
    n->hosts = calloc((size_t)g->members, sizeof *n->hosts);
    n->nodes = calloc((size_t)g->members, sizeof *n->nodes);
    if (!n->topos || !n->hosts || !n->nodes) {
        log_error("%s %d (%s): out of memory reading %d %ss' topologies", g->noun, g->index,
                  g->name, g->members, g->noun);
        return PLAIT_EXIT_ERROR;
    }
    for (int i = 0; i < g->members; i++) {
        char k[STORE_MAX_KEY_BYTES], label[NODE_GANG_NAME_BYTES + 64], name[NODE_GANG_NAME_BYTES];
        void *value = NULL;
        size_t bytes = 0;
        member_name(g, i, name);
        key(g, k, sizeof k, "host", i);
        if (store_get(g->st, k, &value, &bytes, g->gang_timeout_s, &err)) goto lost;
        n->hosts[i] = value;
        key(g, k, sizeof k, "topology", i);
        if (store_get(g->st, k, &value, &bytes, g->gang_timeout_s, &err)) goto lost;
        snprintf(label, sizeof label, "%s %d (%s)'s topology", g->noun, i, name);
        int rc = topo_load_xml_text(&n->topos[i], value, bytes, label, &err);
        free(value);
        if (rc) {
            log_error("%s %d (%s): %s", g->noun, g->index, g->name, err.text);
            return PLAIT_EXIT_ERROR;
        }
        n->nodes[i] = (struct place_node){.name = n->hosts[i],
                                          .topo = &n->topos[i],
                                          .slots = g->ranks_per_member,
                                          .cpu_ranks = plan->parallel.device == PLAN_DEVICE_CPU};
    }
    return 0;
lost:
    log_error("%s %d (%s): reading the gang's topologies: %s; %s", g->noun, g->index, g->name,
              err.text, g->on_lost);
    return PLAIT_EXIT_RESTART;
}

/* The layout, as on Slurm with the plugin: the plan's degrees, "auto" chosen
 * by the cost model, on the gang's nodes with every member's ranks. 0, or -1
 * (said). */
static int gang_layout(const struct node_gang *g, const struct plan *plan,
                       const struct nodes *nodes, struct layout_eval *chosen)
{
    struct plait_error err;
    struct layout_inputs in = {.bw = {25, 50, 100}};
    in.device_memory_bytes = layout_device_memory(nodes->nodes, g->members, 0);
    if (layout_choose(plan, nodes->nodes, g->members, &in, NULL, NULL, chosen, &err)) {
        log_error("%s %d (%s): %s on %d %ss × %d ranks (%s)", g->noun, g->index, g->name,
                  err.text, g->members, g->noun, g->ranks_per_member, g->shape_vars);
        return -1;
    }
    int world = g->members * g->ranks_per_member;
    if (chosen->map.world != world) {
        const struct rank_map *m = &chosen->map;
        char text[96];
        log_error("%s %d (%s): the gang runs %d %ss × %d ranks (%s) = %d ranks, but the "
                  "plan's layout %s has %d",
                  g->noun, g->index, g->name, g->members, g->noun, g->ranks_per_member,
                  g->shape_vars, world,
                  place_layout_text(text, sizeof text, m->tp, m->cp, m->pp, m->dp), m->world);
        return -1;
    }
    char shared[256];
    place_shared_cores_text(&chosen->map, nodes->nodes, shared, sizeof shared);
    if (*shared && g->index == 0) log_warn("%s", shared);
    return 0;
}

/* ---- while the ranks run ----------------------------------------------------------------- */

/* The watcher thread: an abort (a rank or a member anywhere gave up) or the
 * store gone (member 0 lost) while this member's ranks run makes it stop them. */
static void *watch_main(void *arg)
{
    struct node_gang *g = arg;
    while (!atomic_load(&g->quit)) {
        struct plait_error err;
        void *reason = NULL;
        size_t bytes = 0;
        double t0 = now_s();
        int rc = store_get(g->watch, STORE_ABORT_KEY, &reason, &bytes, WATCH_POLL_S, &err);
        if (rc == 0 && bytes == 0) { /* an abort cleared for this start (store_abort_clear) */
            free(reason);
            usleep((useconds_t)(WATCH_POLL_S * 1e6));
            continue;
        }
        if (rc == 0) {
            snprintf(g->lost_why, sizeof g->lost_why, "the job was aborted: %.900s",
                     (char *)reason);
            free(reason);
        } else if (now_s() - t0 >= 0.9 * WATCH_POLL_S) {
            continue; /* nothing happened */
        } else {
            snprintf(g->lost_why, sizeof g->lost_why,
                     "%s 0 (%s), which hosts the store, is gone: %.600s", g->noun, g->name0,
                     err.text);
        }
        if (!atomic_load(&g->quit)) atomic_store(&g->lost, 1);
        break;
    }
    return NULL;
}

static int poll_lost(void *ctx)
{
    struct node_gang *g = ctx;
    return atomic_load(&g->lost);
}

/* The first failed rank of this member: tell every member at once. */
static void rank_failed(void *ctx, const char *how)
{
    struct node_gang *g = ctx;
    char reason[NODE_GANG_NAME_BYTES + 192];
    struct plait_error ignored;
    snprintf(reason, sizeof reason, "%s %d (%s): %s", g->noun, g->index, g->name, how);
    store_abort(g->st, reason, &ignored);
}

/* The watcher of the gang's end: its own connection to the store and its
 * thread. 0, or -1 (said). */
static int start_watching(struct node_gang *g)
{
    struct plait_error err;
    atomic_store(&g->quit, 0);
    atomic_store(&g->lost, 0);
    if (store_connect(&g->watch, g->store_host, g->port, g->secret, g->index, left_s(g) + 5,
                      &err)) {
        log_error("%s %d (%s): %s; %s", g->noun, g->index, g->name, err.text, g->on_lost);
        return -1;
    }
    if (pthread_create(&g->watcher, NULL, watch_main, g)) {
        log_error("%s %d (%s): cannot start the watcher thread", g->noun, g->index, g->name);
        return -1;
    }
    g->watching = true;
    return 0;
}

/* This member's ranks of the map, with their env contract, until they end. */
static int run_ranks(struct node_gang *g, const struct rank_map *map, const struct nodes *n,
                     double grace_s)
{
    int code = PLAIT_EXIT_ERROR, local = 0;
    char ***envs = calloc((size_t)g->ranks_per_member, sizeof *envs);
    int *ranks = calloc((size_t)g->ranks_per_member, sizeof *ranks);
    char addr[NODE_GANG_NAME_BYTES + 16];
    struct plait_error err;
    if (!envs || !ranks) {
        log_error("%s %d (%s): out of memory", g->noun, g->index, g->name);
        goto out;
    }
    if (store_addr_format(addr, sizeof addr, g->store_host, g->port, &err)) {
        log_error("%s %d (%s): %s", g->noun, g->index, g->name, err.text);
        goto out;
    }
    for (int r = 0; r < map->world; r++) {
        if (map->ranks[r].node != g->index) continue;
        ranks[local] = r;
        if (!(envs[local++] = place_rank_env(map, n->nodes, r))) {
            log_error("%s %d (%s): out of memory", g->noun, g->index, g->name);
            goto out;
        }
    }
    const struct topo *t = &n->topos[g->index];
    struct gang_ranks procs = {.n = local,
                               .envs = envs,
                               .global_rank = ranks,
                               .store_addr = addr,
                               .secret = g->secret,
                               .restart_count = g->restart_count,
                               .threads = t->n_cores > 0 && local >= t->n_cores ? 1 : 0,
                               .grace_s = grace_s,
                               .poll = poll_lost,
                               .failed = rank_failed,
                               .ctx = g};
    struct gang_outcome outcome;
    gang_run_ranks(&procs, &outcome);
    g->outside = outcome.outside;
    code = outcome.code;
    if (outcome.stopped) {
        log_error("%s %d (%s): stopped its ranks: %s; %s", g->noun, g->index, g->name,
                  g->lost_why, g->on_lost);
        code = PLAIT_EXIT_RESTART;
    } else if (outcome.error) { /* its own failure (bad data, a bad plan): not to restart */
        log_error("%s %d (%s): rank %d failed by itself: exit %d (a restart would fail again)",
                  g->noun, g->index, g->name, outcome.failed_rank, code);
    } else if (outcome.failed_rank >= 0) {
        log_error("%s %d (%s): rank %d failed; %s", g->noun, g->index, g->name,
                  outcome.failed_rank, g->on_lost);
        code = PLAIT_EXIT_RESTART;
    }
out:
    for (int i = 0; envs && i < local; i++) place_env_free(envs[i]);
    free(envs);
    free(ranks);
    return code;
}

/* ---- one run, and its end ---------------------------------------------------------------- */

int node_gang_run(struct node_gang *g, const struct plan *plan)
{
    struct layout_eval chosen = {0};
    struct nodes nodes = {0};
    struct plait_error err;
    int code;
    g->met = g->outside = false;
    g->deadline = now_s() + g->gang_timeout_s;
    member_name(g, g->index, g->name);
    member_name(g, 0, g->name0);
    if ((code = join_gang(g)) != 0) goto out;
    g->met = true;
    if ((code = read_nodes(g, plan, &nodes)) != 0) goto out;
    code = PLAIT_EXIT_ERROR;
    if (gang_layout(g, plan, &nodes, &chosen)) goto out;
    if (fs_mkdir_p(getenv(PLAIT_ENV_RUN_DIR), &err)) {
        log_error("%s %d (%s): %s", g->noun, g->index, g->name, err.text);
        goto out;
    }
    code = PLAIT_EXIT_RESTART;
    if (start_watching(g)) goto out;
    code = run_ranks(g, &chosen.map, &nodes, plan->parallel.timeout_s + 5);
out:
    if (g->watching) {
        atomic_store(&g->quit, 1);
        pthread_join(g->watcher, NULL);
        g->watching = false;
    }
    layout_eval_free(&chosen);
    nodes_free(&nodes);
    return code;
}

void node_gang_finish(struct node_gang *g, int code, double wait_s)
{
    struct plait_error err;
    char k[STORE_MAX_KEY_BYTES], text[16];
    snprintf(text, sizeof text, "%d", code);
    key(g, k, sizeof k, "exit", g->index);
    if (store_set(g->st, k, text, strlen(text), &err)) return;
    if (g->index != 0 || g->members < 2) return;
    char(*keys)[STORE_MAX_KEY_BYTES] = calloc((size_t)g->members - 1, sizeof *keys);
    const char **names = calloc((size_t)g->members - 1, sizeof *names);
    if (keys && names) {
        for (int i = 1; i < g->members; i++) {
            key(g, keys[i - 1], sizeof keys[i - 1], "exit", i);
            names[i - 1] = keys[i - 1];
        }
        if (store_wait(g->st, names, (size_t)g->members - 1, wait_s, &err) &&
            (code == PLAIT_EXIT_OK || code == PLAIT_EXIT_PREEMPTED))
            log_warn("%s 0 (%s): not every %s said how it ended within %.0f s (%s); closing "
                     "the store",
                     g->noun, g->name, g->noun, wait_s, err.text);
    }
    free(keys);
    free(names);
}

void node_gang_close(struct node_gang *g)
{
    store_close(g->watch);
    store_close(g->st);
    g->watch = g->st = NULL;
}
