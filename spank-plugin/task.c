/* task.c — spank_plait in slurmstepd, for each task (task_init, where a
 * failure fails the job and does not drain the node): the plan that travelled
 * with the job (or the file, if the submit host had no plugin), the policy of
 * THIS node's plugstack.conf (quotas counted once per job: by the batch
 * script and by task 0 of a step), the allocation against the plan, the
 * placement every task computes alike from the allocation's node order, and
 * the task's env contract, with the address of the store srun hosts for the
 * step (store_host.c). Not here: what the submit host checks (submit.c). */
#include <limits.h>
#include <pwd.h>
#include <stdarg.h>
#include <slurm/slurm.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/place/env.h"
#include "common/fsutil.h"
#include "common/place/layout.h"
#include "common/place/place.h"
#include "common/plan/plan.h"
#include "common/store/store.h"
#include "common/place/topo.h"
#include "spank-plugin/count.h"
#include "spank-plugin/plait_spank.h"
#include "spank-plugin/policy.h"

#define MAX_NODES 4096

/* An error the user sees in the job's output, and the admin in slurmd's log. */
static int task_fail(uint32_t job, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int task_fail(uint32_t job, const char *fmt, ...)
{
    char msg[2 * MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    msg_vformat(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "spank_plait: error: job %u: %s\n", job, msg);
    fflush(stderr);
    slurm_error("spank_plait: job %u: %s", job, msg);
    return -1;
}

/* A job environment variable, malloc'ed, or NULL. */
static char *job_env(spank_t sp, const char *name)
{
    size_t cap = 1 << 12;
    for (;;) {
        char *buf = malloc(cap);
        if (!buf) return NULL;
        spank_err_t rc = spank_getenv(sp, name, buf, (int)cap);
        if (rc == ESPANK_SUCCESS) return buf;
        free(buf);
        if (rc != ESPANK_NOSPACE || cap > (1u << 24)) return NULL;
        cap *= 4;
    }
}

/* The plan of this job: the one checked at submit, or the file. */
static struct plan *job_plan(spank_t sp, const char *plan_path, uint32_t job, bool *is_plait)
{
    struct plait_error err;
    char *text = job_env(sp, "SLURM_SPANK_" PLAIT_SPANK_PLAN_VAR);
    char *env_path = plan_path ? NULL : job_env(sp, PLAIT_SPANK_PLAN_ENV);
    const char *path = plan_path ? plan_path : env_path;
    struct plan *p = NULL;
    *is_plait = text || (path && *path);
    if (text)
        p = plan_load_text(text, "the job's plan", NULL, NULL, 0, &err);
    else if (path && *path)
        p = plan_load(path, NULL, 0, &err);
    if (*is_plait && !p) task_fail(job, "%s", err.text);
    free(text);
    free(env_path);
    return p;
}

/* "4(x2),3" → counts[0..n): SLURM_*_TASKS_PER_NODE. Returns the node count,
 * -1 if the text is not that or a count is out of range. */
static int tasks_per_node(const char *spec, int *counts, int max)
{
    int n = 0;
    for (const char *s = spec; s && *s && n < max;) {
        const char *end;
        int64_t c = count_parse(s, &end), rep = 1;
        if (c < 0 || c > PLAN_MAX_RANKS) return -1;
        if (!strncmp(end, "(x", 2)) {
            rep = count_parse(end + 2, &end);
            if (rep < 1 || *end != ')') return -1;
            end++;
        }
        for (int64_t r = 0; r < rep && n < max; r++) counts[n++] = (int)c;
        s = *end == ',' ? end + 1 : end;
        if (*s && *end != ',') return -1;
    }
    return n;
}

/* "0,1,3" → CUDA indices granted on this node; -1 if not that. */
static int granted_gpus(const char *list, int *out, int max)
{
    int n = 0;
    for (const char *s = list; s && *s && n < max;) {
        const char *end;
        int64_t g = count_parse(s, &end);
        if (g < 0 || g > INT_MAX) return -1;
        out[n++] = (int)g;
        s = *end == ',' ? end + 1 : end;
        if (*s && *end != ',') return -1;
    }
    return n;
}

static char *expand_node_name(const char *pattern, const char *node)
{
    const char *at = strstr(pattern, "%n");
    if (!at) return strdup(pattern);
    size_t len = strlen(pattern) - 2 + strlen(node) + 1;
    char *out = malloc(len);
    if (out) snprintf(out, len, "%.*s%s%s", (int)(at - pattern), pattern, node, at + 2);
    return out;
}

struct step {
    uint32_t job, stepid, task, nnodes, ntasks, node_id;
    int ntasks_node[MAX_NODES];
    char *names[MAX_NODES];
    int n_names;
};

static int read_step(spank_t sp, struct step *s)
{
    if (spank_get_item(sp, S_TASK_GLOBAL_ID, &s->task) ||
        spank_get_item(sp, S_JOB_NNODES, &s->nnodes) ||
        spank_get_item(sp, S_JOB_TOTAL_TASK_COUNT, &s->ntasks) ||
        spank_get_item(sp, S_JOB_NODEID, &s->node_id))
        return task_fail(s->job, "cannot read the step from Slurm");
    char *list = job_env(sp, "SLURM_STEP_NODELIST");
    if (!list) list = job_env(sp, "SLURM_JOB_NODELIST");
    hostlist_t hl = list ? slurm_hostlist_create(list) : NULL;
    free(list);
    if (!hl) return task_fail(s->job, "cannot read the step's node list");
    char *name;
    while ((name = slurm_hostlist_shift(hl)) && s->n_names < MAX_NODES) {
        s->names[s->n_names++] = strdup(name);
        free(name);
    }
    slurm_hostlist_destroy(hl);
    char *per = job_env(sp, "SLURM_STEP_TASKS_PER_NODE");
    if (!per) per = job_env(sp, "SLURM_TASKS_PER_NODE");
    int n = tasks_per_node(per, s->ntasks_node, MAX_NODES);
    free(per);
    if (n != s->n_names || n != (int)s->nnodes)
        return task_fail(s->job,
                         "the step's node list (%d nodes) and tasks per node (%d entries) "
                         "disagree",
                         s->n_names, n);
    return 0;
}

static void free_step(struct step *s)
{
    for (int i = 0; i < s->n_names; i++) free(s->names[i]);
}

/* A path that names something below where it starts: at least one component
 * other than "." and none that is "..". */
static bool names_a_subdirectory(const char *path)
{
    bool named = false;
    for (const char *s = path; *s;) {
        size_t len = strcspn(s, "/");
        if (len == 2 && !strncmp(s, "..", 2)) return false;
        if (len > 0 && !(len == 1 && *s == '.')) named = true;
        s += len;
        s += strspn(s, "/");
    }
    return named;
}

/* The run directory, the same for every requeue of the job. Without
 * run_root: the user's PLAIT_RUN_DIR, else $SLURM_SUBMIT_DIR/runs/slurm-<job>.
 * With run_root (the admin's), it stays under run_root: the user's
 * PLAIT_RUN_DIR may name a subdirectory of it (relative to it, or absolute
 * under it, without ".."), else <run_root>/slurm-<job>. NULL after task_fail. */
static char *run_dir(spank_t sp, const struct plait_config *c, uint32_t job)
{
    char *user = job_env(sp, PLAIT_ENV_RUN_DIR), *dir = NULL;
    if (user && !*user) {
        free(user);
        user = NULL;
    }
    if (!c->run_root) {
        if (user) return user;
        char *submit = job_env(sp, "SLURM_SUBMIT_DIR");
        if (asprintf(&dir, "%s/runs/slurm-%u", submit ? submit : ".", job) < 0) dir = NULL;
        free(submit);
        if (!dir) task_fail(job, "out of memory");
        return dir;
    }
    const char *root = c->run_root;
    int root_len = (int)strlen(root);
    while (root_len > 0 && root[root_len - 1] == '/') root_len--; /* "/scratch/runs/", "/" */
    int rc;
    if (!user)
        rc = asprintf(&dir, "%.*s/slurm-%u", root_len, root, job);
    else if (user[0] != '/' && names_a_subdirectory(user))
        rc = asprintf(&dir, "%.*s/%s", root_len, root, user);
    else if (user[0] == '/' && !strncmp(user, root, (size_t)root_len) && user[root_len] == '/' &&
             names_a_subdirectory(user + root_len))
        rc = (dir = strdup(user)) ? 0 : -1;
    else {
        task_fail(job,
                  "%s=%s is not a directory under this cluster's run_root %s (plugstack.conf): "
                  "give a subdirectory of run_root, relative to it or absolute, without "
                  "\"..\", or leave %s unset",
                  PLAIT_ENV_RUN_DIR, user, root, PLAIT_ENV_RUN_DIR);
        free(user);
        return NULL;
    }
    free(user);
    if (rc < 0) {
        dir = NULL;
        task_fail(job, "out of memory");
    }
    return dir;
}

static int export_env(spank_t sp, const char *name, const char *value, uint32_t job)
{
    if (spank_setenv(sp, name, value, 1) != ESPANK_SUCCESS)
        return task_fail(job, "cannot set %s", name);
    return 0;
}

/* The step's rendezvous store, which srun hosts (store_host.c): its address
 * as this node reaches srun (the address Slurm launched the task from) and
 * the step's secret. A step of one task has none, and inherits none. */
static int export_store(spank_t sp, const struct step *s)
{
    char *port = job_env(sp, PLAIT_SPANK_STORE_PORT_VAR);
    char *secret = job_env(sp, PLAIT_ENV_STORE_SECRET);
    char *host = job_env(sp, "SLURM_LAUNCH_NODE_IPADDR");
    int rc = 0;
    spank_unsetenv(sp, PLAIT_SPANK_STORE_PORT_VAR);
    if (s->ntasks < 2) {
        spank_unsetenv(sp, PLAIT_ENV_STORE_ADDR);
        spank_unsetenv(sp, PLAIT_ENV_STORE_SECRET);
    } else if (!port || !secret || !*secret) {
        rc = task_fail(s->job,
                       "this step runs %u ranks, but srun hosted no rendezvous store for them: "
                       "the srun that started it needs the plait SPANK plugin (plugstack.conf "
                       "on the host where srun runs)",
                       s->ntasks);
    } else if (!host || !*host) {
        rc = task_fail(s->job, "Slurm did not say where the step was launched from "
                               "(SLURM_LAUNCH_NODE_IPADDR), where its store is");
    } else {
        char addr[320];
        struct plait_error err;
        int p = (int)count_parse(port, NULL);
        if (store_addr_format(addr, sizeof addr, host, p, &err))
            rc = task_fail(s->job, "the step's store: %s", err.text);
        else
            rc = export_env(sp, PLAIT_ENV_STORE_ADDR, addr, s->job);
    }
    free(port);
    free(secret);
    free(host);
    return rc;
}

/* The step's tasks against the plan's fixed degrees, one task per rank: dp
 * counted on the step as layout_fixed_dp counts it (layout_choose's count);
 * tp or pp "auto" is the cost model's choice, checked once it is made.
 * Counted in 64 bits: nothing wraps. */
static int check_task_count(const struct plan *p, const struct step *s)
{
    const struct plan_parallel *par = &p->parallel;
    int64_t ntasks = s->ntasks;
    if (par->tp != PLAN_AUTO && par->pp != PLAN_AUTO) {
        /* a replica's ranks: tp·cp·pp */
        int64_t tp_pp = count_mul(count_mul(par->tp, par->cp), par->pp);
        int64_t dp = layout_fixed_dp(p, ntasks, NULL), ranks = count_mul(tp_pp, dp);
        char replica[96], layout[96];
        place_layout_text(replica, sizeof replica, par->tp, par->cp, par->pp, 0);
        place_layout_text(layout, sizeof layout, par->tp, par->cp, par->pp, (int)dp);
        if (ranks != ntasks && par->dp == PLAN_AUTO && p->batch.global_batch &&
            ntasks % tp_pp == 0)
            return task_fail(s->job,
                             "the step has %u tasks, but batch.global_batch %d (micro_batch %d) "
                             "keeps at most dp %lld replicas of %s = %lld tasks (srun -n%lld, "
                             "or a global batch the step's %lld replicas divide)",
                             s->ntasks, p->batch.global_batch, p->batch.micro_batch, (long long)dp,
                             replica, (long long)ranks, (long long)ranks,
                             (long long)(ntasks / tp_pp));
        if (ranks != ntasks && par->dp == PLAN_AUTO)
            return task_fail(s->job,
                             "the step has %u tasks, which dp \"auto\" cannot fill: %s = %lld "
                             "does not divide it (srun -n with a multiple of %lld)",
                             s->ntasks, replica, (long long)tp_pp, (long long)tp_pp);
        if (ranks != ntasks)
            return task_fail(s->job,
                             "the step has %u tasks, but the plan needs %s = %lld (one task "
                             "per rank: srun -n%lld)",
                             s->ntasks, layout, (long long)ranks, (long long)ranks);
    }
    if (ntasks > PLAN_MAX_RANKS)
        return task_fail(s->job, "the step has %u tasks; plait runs at most %d ranks", s->ntasks,
                         PLAN_MAX_RANKS);
    return 0;
}

/* Node i's GPUs for its tasks: the topology's index of each GPU Slurm
 * granted (every node is taken to have the same grant), into g. */
static int node_grants(const struct step *s, uint32_t i, const struct topo *t, const int *granted,
                       int n_granted, int *g)
{
    if (n_granted < s->ntasks_node[i])
        return task_fail(s->job,
                         "node %s runs %d tasks but Slurm granted %d GPUs (ask for "
                         "--gpus-per-node=%d)",
                         s->names[i], s->ntasks_node[i], n_granted, s->ntasks_node[i]);
    for (int k = 0, m = 0; k < n_granted && m < s->ntasks_node[i]; k++) {
        int idx = -1;
        for (int q = 0; q < t->n_gpus; q++)
            if (t->gpus[q].cuda_index == granted[k]) idx = q;
        if (idx < 0)
            return task_fail(s->job,
                             "node %s: Slurm granted GPU %d, which its topology (%s) does not "
                             "have",
                             s->names[i], granted[k], t->source);
        g[m++] = idx;
    }
    return 0;
}

/* The step's nodes as placement sees them: each one's topology (one for all
 * nodes unless the admin gives one per node name), tasks and granted GPUs. */
static int step_nodes(const struct plait_config *c, const struct plan *p, const struct step *s,
                      const int *granted, int n_granted, struct topo *topos,
                      struct place_node *nodes, int *grants)
{
    struct plait_error err;
    bool per_node = c->topology_xml && strstr(c->topology_xml, "%n");
    for (uint32_t i = 0; i < s->nnodes; i++) {
        struct topo *t = &topos[per_node ? i : 0];
        if (i == 0 || per_node) {
            char *xml = c->topology_xml ? expand_node_name(c->topology_xml, s->names[i]) : NULL;
            int lrc = topo_load(t, xml, &err);
            free(xml);
            if (lrc) return task_fail(s->job, "node %s: %s", s->names[i], err.text);
        }
        bool cpu = p->parallel.device == PLAN_DEVICE_CPU;
        nodes[i] = (struct place_node){
            .name = s->names[i], .topo = t, .slots = s->ntasks_node[i], .cpu_ranks = cpu};
        if (t->n_gpus > 0 && !cpu) {
            int *g = grants + (size_t)i * 256;
            if (node_grants(s, i, t, granted, n_granted, g)) return -1;
            nodes[i].gpus = g;
        }
    }
    return 0;
}

/* The layout on the step's nodes (layout_choose, as plait check chooses it),
 * placed, and this task's variables exported. */
static int export_place(spank_t sp, const struct plan *p, const struct step *s,
                        const struct place_node *nodes, struct layout_eval *chosen)
{
    struct plait_error err;
    struct layout_inputs in = {.bw = {25, 50, 100}};
    in.device_memory_bytes = layout_device_memory(nodes, (int)s->nnodes, 0);
    if (layout_choose(p, nodes, (int)s->nnodes, &in, NULL, NULL, chosen, &err))
        return task_fail(s->job, "%s", err.text);
    const struct rank_map *m = &chosen->map;
    char layout[96];
    if (m->world != (int64_t)s->ntasks)
        return task_fail(
            s->job, "the step has %u tasks; the layout chosen for it, %s, has %d ranks", s->ntasks,
            place_layout_text(layout, sizeof layout, m->tp, m->cp, m->pp, m->dp), m->world);
    char shared[256]; /* more ranks than cores: said once, in slurmd's log */
    place_shared_cores_text(&chosen->map, nodes, shared, sizeof shared);
    if (*shared && s->task == 0) slurm_info("spank_plait: job %u: warning: %s", s->job, shared);
    char **env = place_rank_env(&chosen->map, nodes, (int)s->task);
    if (!env) return task_fail(s->job, "out of memory");
    int rc = 0;
    for (char **e = env; *e && rc == 0; e++) {
        char *eq = strchr(*e, '=');
        *eq = '\0';
        rc = export_env(sp, *e, eq + 1, s->job);
    }
    place_env_free(env);
    return rc;
}

/* Places the step's ranks and exports this task's variables. */
static int place_task(spank_t sp, const struct plait_config *c, const struct plan *p,
                      struct step *s)
{
    if (check_task_count(p, s)) return -1;
    /* GPUs granted here; every node is taken to have the same grant */
    char *gpus_env = job_env(sp, "SLURM_STEP_GPUS");
    if (!gpus_env) gpus_env = job_env(sp, "SLURM_JOB_GPUS");
    int granted[256], n_granted = gpus_env ? granted_gpus(gpus_env, granted, 256) : 0;
    free(gpus_env);
    if (n_granted < 0) return task_fail(s->job, "cannot read the GPUs Slurm granted");

    struct topo *topos = calloc(s->nnodes, sizeof *topos);
    struct place_node *nodes = calloc(s->nnodes, sizeof *nodes);
    int *grants = calloc((size_t)s->nnodes * 256, sizeof *grants);
    struct layout_eval chosen = {0};
    int rc = -1;
    if (!topos || !nodes || !grants)
        task_fail(s->job, "out of memory");
    else if (step_nodes(c, p, s, granted, n_granted, topos, nodes, grants) == 0)
        rc = export_place(sp, p, s, nodes, &chosen);
    layout_eval_free(&chosen);
    if (topos)
        for (uint32_t i = 0; i < s->nnodes; i++) topo_free(&topos[i]);
    free(topos);
    free(nodes);
    free(grants);
    return rc;
}

int task_setup(spank_t sp, const struct plait_config *c, const char *plan_path)
{
    struct step s = {0};
    uid_t uid = 0;
    spank_err_t ids = spank_get_item(sp, S_JOB_ID, &s.job);
    if (ids == ESPANK_SUCCESS) ids = spank_get_item(sp, S_JOB_STEPID, &s.stepid);
    if (ids == ESPANK_SUCCESS) ids = spank_get_item(sp, S_JOB_UID, &uid);
    bool is_plait, batch = s.stepid == SLURM_BATCH_SCRIPT || s.stepid == SLURM_EXTERN_CONT;
    struct plan *p = job_plan(sp, plan_path, s.job, &is_plait);
    if (!is_plait) return 0;
    if (!p) return -1;
    int rc = -1;
    if (ids != ESPANK_SUCCESS) {
        task_fail(s.job, "cannot read the job from Slurm: %s", spank_strerror(ids));
        goto out;
    }
    if (batch) {
        s.nnodes = 1;
        if (spank_get_item(sp, S_JOB_NNODES, &s.nnodes) != ESPANK_SUCCESS) {
            task_fail(s.job, "cannot read the job's node count from Slurm");
            goto out;
        }
    } else if (read_step(sp, &s)) {
        goto out;
    }
    /* the policy of this node, whatever the submit host did */
    struct passwd *pw = getpwuid(uid);
    char *account = job_env(sp, "SLURM_JOB_ACCOUNT");
    char *gpus_on_node = job_env(sp, "SLURM_GPUS_ON_NODE");
    int64_t per_node = gpus_on_node ? count_parse(gpus_on_node, NULL) : 0;
    int64_t job_gpus = per_node > 0 ? count_mul(per_node, s.nnodes) : 0;
    int64_t plan_gpus = plan_ranks(p); /* 0: "auto", as many as the job has */
    struct policy_job job = {.plan = p,
                             .gpus = plan_gpus > job_gpus ? plan_gpus : job_gpus,
                             .nodes = s.nnodes,
                             .uid = uid,
                             .user = pw ? pw->pw_name : "?",
                             .account = account,
                             .job_id = s.job};
    /* the limits cost nothing; the quota asks slurmctld for every job, so it
     * is counted once per job and step (the batch script, task 0 of a step),
     * not by each of a thousand tasks */
    bool count_quota = batch || s.task == 0;
    struct plait_error err;
    int prc =
        policy_check_limits(c, &job, &err) || (count_quota && policy_check_quota(c, &job, &err));
    free(account);
    free(gpus_on_node);
    if (prc) {
        task_fail(s.job, "%s", err.text);
        goto out;
    }
    /* what every task of every step gets: the plan checked here, and no
     * PLAIT_PLAN of the user's that would name another */
    char *dir = run_dir(sp, c, s.job);
    if (!dir) goto out;
    char *restarts = job_env(sp, "SLURM_RESTART_COUNT"), *line = plan_to_json_line(p);
    if (!line)
        rc = task_fail(s.job, "out of memory");
    else if (export_env(sp, PLAIT_ENV_RUN_DIR, dir, s.job) ||
             export_env(sp, PLAIT_ENV_PLAN_JSON, line, s.job) ||
             export_env(sp, PLAIT_ENV_RESTART_COUNT, restarts ? restarts : "0", s.job))
        rc = -1;
    else if (spank_unsetenv(sp, PLAIT_ENV_PLAN) != ESPANK_SUCCESS)
        rc = task_fail(s.job, "cannot unset %s", PLAIT_ENV_PLAN);
    else
        rc = 0;
    free(dir);
    free(restarts);
    free(line);
    /* the batch script itself is not a rank */
    if (rc == 0 && !batch) rc = place_task(sp, c, p, &s);
    if (rc == 0 && !batch) rc = export_store(sp, &s);
out:
    free_step(&s);
    plan_free(p);
    return rc;
}
