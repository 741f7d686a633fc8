/* slurm_nodes.h — plait launch PLAN in a Slurm step without the plait SPANK
 * plugin (`srun --ntasks-per-node=1 plait launch PLAN`): task 0 hosts the
 * step's rendezvous store, every task meets it on the first node of the
 * step's node list, places the job's ranks on every node's own topology and
 * runs its node's ranks (node_gang.h), restarted together when a rank is lost
 * (restart.h). */
#ifndef PLAIT_LAUNCHER_SLURM_NODES_H
#define PLAIT_LAUNCHER_SLURM_NODES_H

#include <signal.h>

/* The store's host, where the first node's name is not how the others reach
 * it (a cluster whose NodeName is not a host name): a name or an address. */
#define SLURM_NODES_ENV_STORE_HOST "PLAIT_STORE_HOST"

/* Runs this task's node: plan_path the plan, run_dir the run directory (NULL:
 * PLAIT_RUN_DIR, else $SLURM_SUBMIT_DIR/runs/slurm-<job>, the same for every
 * requeue). signals_seen: the stop signals the task got (bits), as
 * cmd_launch's handler records them. Returns the task's exit code: 0 done, 1
 * error, 75 preempted after a checkpoint, 76 restarts ran out or a node never
 * came or reported. */
int slurm_nodes_launch(const char *plan_path, const char *run_dir,
                       volatile sig_atomic_t *signals_seen);

#endif
