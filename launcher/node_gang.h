/* node_gang.h — a job's launchers, one per machine (a Kubernetes pod, a Slurm
 * node), meeting at member 0's rendezvous store: each says its host name and
 * hwloc topology at the gang barrier, every one places the job's ranks alike
 * on all the topologies, and runs its own share of them (gang.c) while a
 * watcher stops them when a peer anywhere is lost. Who the members are, where
 * the store is and what happens after a run are the caller's: launcher/k8s/
 * pod.c (a pod, once) and slurm_nodes.c (srun without the plugin, restarted
 * inside the step). */
#ifndef PLAIT_LAUNCHER_NODE_GANG_H
#define PLAIT_LAUNCHER_NODE_GANG_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "common/plan/plan.h"
#include "launcher/gang.h"

#define NODE_GANG_NAME_BYTES 256

struct node_gang {
    /* the caller's, before node_gang_run */
    const char *noun;          /* "pod", "node": messages say "pod 1 (train-1.train): …" */
    int index, members, ranks_per_member;
    const char *store_host;    /* member 0's address */
    int port;                  /* its store's */
    const char *secret;
    double gang_timeout_s;     /* how long the members wait for each other */
    const char *timeout_var;   /* where that comes from, for messages */
    const char *shape_vars;    /* where members and ranks_per_member come from, for messages */
    const char *on_lost;       /* what follows a lost peer: "exit 76 (restart the gang)" */
    /* member i's name, for messages ("train-1.train", "node2"); 0, or -1 when unknown */
    int (*member_name)(const struct node_gang *g, int i, char out[NODE_GANG_NAME_BYTES]);
    const void *ctx;           /* member_name's */
    int restart_count;         /* the ranks' PLAIT_RESTART_COUNT; -1: the launcher's own */
    char prefix[64];           /* this run's keys, never an earlier one's ("k8s/a0/") */
    /* set by node_gang_run */
    char name[NODE_GANG_NAME_BYTES]; /* this member's */
    char name0[NODE_GANG_NAME_BYTES];
    struct store *st;          /* the connection to the store, open until node_gang_close */
    bool met;                  /* the gang formed */
    bool outside;              /* a stop signal from outside reached its ranks */
    /* its own */
    double deadline;           /* monotonic seconds */
    struct store *watch;
    pthread_t watcher;
    bool watching;
    atomic_int quit, lost;
    char lost_why[1024];
};

/* An integer variable of the launcher's environment (what Kubernetes or Slurm
 * says of its place) in [lo, hi]; absent: def, or when def < lo an error
 * "<who>: NAME is not set (<if_unset>)". 0, or -1 (said). */
int node_gang_env_int(const char *name, long lo, long hi, long def, long *out, const char *who,
                      const char *if_unset);

/* One run of the gang: connects to member 0's store (retrying until the gang
 * timeout), meets the others, places the plan's layout on every member's
 * topology (the plan's degrees, "auto" chosen by the cost model; its world
 * must be members × ranks_per_member), creates the run directory
 * (PLAIT_RUN_DIR) and runs this member's ranks until they end, or a peer is
 * lost. The caller has set what every rank shares (the plan, the run
 * directory) in its environment. Returns the member's exit code: 0 done, 75
 * preempted, 76 a peer never came or was lost, or one of this member's ranks
 * was lost; 1 a refused plan or secret, a rank that failed by itself. */
int node_gang_run(struct node_gang *g, const struct plan *plan);

/* After a run that met: says how this member ended; member 0 waits until
 * every member has said so, up to wait_s, so that no member's ranks lose the
 * store while they finish. */
void node_gang_finish(struct node_gang *g, int code, double wait_s);

/* Stops the watcher, closes the connections; the gang may be run again. */
void node_gang_close(struct node_gang *g);

#endif
