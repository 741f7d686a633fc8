/* slurm_nodes.c — plait launch PLAN in a Slurm step that no plait plugin
 * prepared: one task per node, the task's place from Slurm's own variables,
 * task 0 hosting the store on a free port that it publishes, with the secret
 * when it made one, in a 0600 file of the run directory (a shared file
 * system, as checkpoints need), the host from the step's node list. The
 * gang itself is node_gang.c's, its restarts restart.c's. */
#include "launcher/slurm_nodes.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/fsutil.h"
#include "common/hostlist.h"
#include "common/log.h"
#include "common/place/env.h"
#include "common/place/place.h" // defines: place_layout_text
#include "common/plan/plan.h"
#include "common/store/store.h"
#include "launcher/node_gang.h"
#include "launcher/restart.h"

#define FILE_POLL_MS 100

/* The step as this task sees it. */
struct step {
    long job, step, node, nodes, tasks, requeues;
    const char *node_list;
    int ranks_per_node;
    char store_host[HOSTLIST_NAME_BYTES];
    char run_dir[PATH_MAX];
    char store_file[PATH_MAX + 64]; /* where task 0 publishes the store */
    char secret[STORE_MAX_SECRET_BYTES + 1];
    int port;
    bool secret_from_env;
};

/* A variable Slurm sets, as a number in [lo, hi] (node_gang_env_int). */
static int slurm_int(const char *name, long lo, long hi, long def, long *out)
{
    return node_gang_env_int(name, lo, hi, def, out, "launch",
                             "plait launch PLAN runs as a task of an srun step: srun "
                             "--ntasks-per-node=1 plait launch PLAN; on one machine, plait train "
                             "PLAN");
}

/* The first of the variables that is set. */
static const char *first_set(const char *a, const char *b)
{
    return getenv(a) ? a : b;
}

static int read_step(struct step *s)
{
    if (slurm_int("SLURM_JOB_ID", 0, LONG_MAX, -1, &s->job) ||
        slurm_int("SLURM_STEP_ID", 0, LONG_MAX, 0, &s->step) ||
        slurm_int(first_set("SLURM_STEP_NUM_NODES", "SLURM_NNODES"), 1, PLAN_MAX_RANKS, -1,
                  &s->nodes) ||
        slurm_int(first_set("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"), 1, PLAN_MAX_RANKS, -1,
                  &s->tasks) ||
        slurm_int("SLURM_NODEID", 0, s->nodes - 1, -1, &s->node) ||
        slurm_int("SLURM_RESTART_COUNT", 0, 1 << 30, 0, &s->requeues))
        return -1;
    if (s->tasks != s->nodes) {
        log_error("launch: this step runs %ld tasks on %ld nodes, but plait launch PLAN runs one "
                  "task per node, which starts that node's ranks: srun --ntasks-per-node=1 "
                  "plait launch PLAN",
                  s->tasks, s->nodes);
        return -1;
    }
    s->node_list = getenv(first_set("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"));
    struct plait_error err;
    int listed = hostlist_count(s->node_list, &err);
    if (listed < 0 || listed != s->nodes) {
        log_error("launch: the step's node list (SLURM_STEP_NODELIST): %s",
                  listed < 0 ? err.text : "it does not name one node per task");
        return -1;
    }
    const char *host = getenv(SLURM_NODES_ENV_STORE_HOST);
    if (host && *host)
        snprintf(s->store_host, sizeof s->store_host, "%s", host);
    else if (hostlist_nth(s->node_list, 0, s->store_host, &err)) {
        log_error("launch: the step's node list: %s", err.text);
        return -1;
    }
    return 0;
}

/* Ranks on each node: the plan's fixed layout shared by the nodes, else the
 * GPUs Slurm gave this task. -1 (said) when neither tells. */
static int ranks_per_node(const struct step *s, const struct plan *plan)
{
    const struct plan_parallel *par = &plan->parallel;
    if (par->tp != PLAN_AUTO && par->pp != PLAN_AUTO && par->dp != PLAN_AUTO) {
        long world = (long)plan_ranks(plan);
        if (world % s->nodes == 0) return (int)(world / s->nodes);
        char text[96];
        log_error("launch: the plan's %s = %ld ranks do not fill %ld nodes alike (srun -N with a "
                  "divisor of %ld)",
                  place_layout_text(text, sizeof text, par->tp, par->cp, par->pp, par->dp), world,
                  s->nodes, world);
        return -1;
    }
    const char *gpus = getenv("CUDA_VISIBLE_DEVICES");
    if (par->device != PLAN_DEVICE_CPU && gpus && *gpus) {
        int n = 1;
        for (const char *c = gpus; *c; c++) n += *c == ',';
        return n;
    }
    log_error("launch: the plan's layout has \"auto\" degrees and Slurm gave this task no GPUs "
              "to count ranks by: ask for them (srun --gpus-per-node=N) or give the plan's tp, "
              "pp and dp");
    return -1;
}

/* The run directory, absolute: the caller's, else PLAIT_RUN_DIR, else the
 * plugin's default, $SLURM_SUBMIT_DIR/runs/slurm-<job>. */
static int choose_run_dir(struct step *s, const char *given)
{
    const char *dir = given && *given ? given : getenv(PLAIT_ENV_RUN_DIR);
    char cwd[PATH_MAX] = "", rel[PATH_MAX];
    const char *submit = getenv("SLURM_SUBMIT_DIR");
    if (!dir || !*dir) {
        snprintf(rel, sizeof rel, "%s/runs/slurm-%ld", submit ? submit : ".", s->job);
        dir = rel;
    }
    if (dir[0] != '/' && !getcwd(cwd, sizeof cwd)) {
        log_error("launch: cannot read the current directory: %s", strerror(errno));
        return -1;
    }
    int n = snprintf(s->run_dir, sizeof s->run_dir, "%s%s%s", cwd, *cwd ? "/" : "", dir);
    if (n < 0 || (size_t)n >= sizeof s->run_dir) {
        log_error("launch: the run directory %s: path too long", dir);
        return -1;
    }
    snprintf(s->store_file, sizeof s->store_file, "%s/store-%ld.%ld.%ld", s->run_dir, s->job,
             s->requeues, s->step);
    return 0;
}

/* Task 0: the store on a free port, published with the secret it made (none
 * when every task has PLAIT_STORE_SECRET). 0, or -1 (said). */
static int host_store(struct step *s, struct store_server **srv)
{
    struct plait_error err;
    char text[STORE_MAX_SECRET_BYTES + 32];
    if (!s->secret_from_env && store_secret_generate(s->secret, &err)) goto fail;
    if (store_server_start(srv, NULL, 0, s->secret, &err)) goto fail;
    s->port = store_server_port(*srv);
    int n = snprintf(text, sizeof text, "%d\n%s\n", s->port, s->secret_from_env ? "" : s->secret);
    if (fs_mkdir_p(s->run_dir, &err) || fs_write_private(s->store_file, text, (size_t)n, &err))
        goto fail;
    char first[HOSTLIST_NAME_BYTES] = "?";
    hostlist_nth(s->node_list, 0, first, &err);
    log_info("launch: node 0 (%s) hosts the step's store at %s:%d", first, s->store_host, s->port);
    return 0;
fail:
    log_error("launch: node 0: the step's store: %s", err.text);
    return -1;
}

/* The others: the port (and secret) task 0 published, waited for until the
 * deadline. 0, or -1 (said). */
static int find_store(struct step *s, double timeout_s)
{
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        FILE *f = fopen(s->store_file, "r");
        if (f) {
            char secret[sizeof s->secret] = "";
            int got = fscanf(f, "%d %256s", &s->port, secret);
            fclose(f);
            if (got >= 1 && (s->secret_from_env || got == 2)) {
                if (!s->secret_from_env) memcpy(s->secret, secret, sizeof secret);
                return 0;
            }
        }
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((double)(t.tv_sec - t0.tv_sec) > timeout_s) break;
        usleep(FILE_POLL_MS * 1000);
    }
    log_error("launch: node %ld: task 0 (on %s) did not publish the step's store in %s within "
              "%.0f s: is the run directory on a file system every node shares?",
              s->node, s->store_host, s->store_file, timeout_s);
    return -1;
}

/* The secret every task gets from its environment, when it is set. 0, or -1. */
static int secret_from_env(struct step *s)
{
    const char *env = getenv(PLAIT_ENV_STORE_SECRET);
    if (!env || !*env) return 0;
    const char *weak = store_secret_problem(env);
    if (weak || strlen(env) > STORE_MAX_SECRET_BYTES) {
        log_error("launch: %s is not a job's secret: %s; leave it unset, and task 0 makes one",
                  PLAIT_ENV_STORE_SECRET, weak ? weak : "too long");
        return -1;
    }
    snprintf(s->secret, sizeof s->secret, "%s", env);
    s->secret_from_env = true;
    return 0;
}

/* ---- the gang, started again while restarts are left ------------------------------------ */

struct run {
    struct step *s;
    struct node_gang g;
    const struct plan *plan;
    volatile sig_atomic_t *signals_seen;
};

/* Node i's name, from the step's node list. */
static int node_name(const struct node_gang *g, int i, char out[NODE_GANG_NAME_BYTES])
{
    const struct step *s = g->ctx;
    struct plait_error ignored;
    return hostlist_nth(s->node_list, i, out, &ignored);
}

/* One start of this node's ranks (restart_supervise's start). */
static enum gang_end start_node(void *ctx, int k, int *code, char *how, size_t how_bytes)
{
    struct run *r = ctx;
    (void)how;
    (void)how_bytes; /* gang_run_ranks named a lost rank */
    snprintf(r->g.prefix, sizeof r->g.prefix, "slurm/a%d/", k);
    r->g.restart_count = (int)r->s->requeues + k;
    *code = node_gang_run(&r->g, r->plan);
    node_gang_close(&r->g);
    if (r->g.outside) *r->signals_seen |= 1 << SIGTERM;
    return *code == PLAIT_EXIT_OK          ? GANG_END_OK
           : *code == PLAIT_EXIT_PREEMPTED ? GANG_END_PREEMPTED
           : *code == PLAIT_EXIT_RESTART   ? GANG_END_LOST
                                           : GANG_END_ERROR;
}

/* What every rank of this node shares of the env contract. 0, or -1 (said). */
static int export_shared_env(const struct step *s, const struct plan *plan)
{
    char *json = plan_to_json(plan);
    if (!json) {
        log_error("launch: out of memory");
        return -1;
    }
    setenv(PLAIT_ENV_PLAN_JSON, json, 1);
    free(json);
    unsetenv(PLAIT_ENV_PLAN);
    setenv(PLAIT_ENV_RUN_DIR, s->run_dir, 1);
    /* --fresh belongs to `plait train`: exported into a job, it would wipe the run at every
     * requeue */
    unsetenv(PLAIT_ENV_FRESH);
    setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
    return 0;
}

static int run_gang(struct step *s, const struct plan *plan, volatile sig_atomic_t *signals_seen)
{
    double timeout_s = plan->parallel.timeout_s + 10;
    struct run r = {.s = s, .plan = plan, .signals_seen = signals_seen};
    r.g = (struct node_gang){.noun = "node",
                             .index = (int)s->node,
                             .members = (int)s->nodes,
                             .ranks_per_member = s->ranks_per_node,
                             .store_host = s->store_host,
                             .port = s->port,
                             .secret = s->secret,
                             .gang_timeout_s = timeout_s,
                             .timeout_var = "parallel.timeout_s + 10 s",
                             .shape_vars = "the step's nodes, one task each",
                             .on_lost = "the step's nodes restart the gang while "
                                        "checkpoint.max_restarts allows",
                             .member_name = node_name,
                             .ctx = s};
    struct restart_member m = {.noun = "node",
                               .index = (int)s->node,
                               .members = (int)s->nodes,
                               .hosts_store = s->node == 0};
    struct plait_error err;
    if (store_connect(&m.st, s->store_host, s->port, s->secret, (int)s->node, timeout_s, &err)) {
        log_error("launch: node %ld: the step's store at %s:%d: %s", s->node, s->store_host,
                  s->port, err.text);
        return PLAIT_EXIT_RESTART;
    }
    int code = restart_supervise(&m, plan, start_node, &r, signals_seen);
    store_close(m.st);
    return code;
}

int slurm_nodes_launch(const char *plan_path, const char *run_dir,
                       volatile sig_atomic_t *signals_seen)
{
    struct step s = {0};
    struct plait_error err;
    struct store_server *srv = NULL;
    int code = PLAIT_EXIT_ERROR;
    struct plan *plan = plan_load(plan_path, NULL, 0, &err);
    if (!plan) {
        log_error("launch: %s", err.text);
        return PLAIT_EXIT_ERROR;
    }
    if (read_step(&s) || (s.ranks_per_node = ranks_per_node(&s, plan)) < 0 ||
        choose_run_dir(&s, run_dir) || secret_from_env(&s) || export_shared_env(&s, plan))
        goto out;
    if (s.node == 0 ? host_store(&s, &srv) : find_store(&s, plan->parallel.timeout_s + 10))
        goto out;
    code = run_gang(&s, plan, signals_seen);
out:
    if (srv) unlink(s.store_file);
    store_server_stop(srv);
    plan_free(plan);
    return code;
}
