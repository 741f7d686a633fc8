/* config.h — the admin's policy for spank_plait, from its plugstack.conf
 * arguments (key=value; unknown keys are refused):
 *   max_gpus_per_job=N  max_nodes=N  allowed_precisions=fp32,bf16,fp8
 *   min_checkpoint_every=STEPS  quota_file=/etc/slurm/plait-quota.json
 *   topology_xml=/etc/slurm/plait/%n.xml  run_root=/scratch/runs
 *   store_ports=60001-61000 */
#ifndef PLAIT_SPANK_CONFIG_H
#define PLAIT_SPANK_CONFIG_H

#include <stdbool.h>

#include "common/error.h"

struct plait_config {
    int max_gpus_per_job; /* 0 = no limit */
    int max_nodes;        /* 0 = no limit */
    unsigned allowed_precisions; /* bit 1 << enum plan_precision per allowed one */
    int min_checkpoint_every;         /* 0 = no minimum */
    char *quota_file;                 /* NULL = no quotas */
    char *topology_xml;               /* NULL = discover; "%n" becomes the node name */
    char *run_root;                   /* NULL = $SLURM_SUBMIT_DIR/runs */
    int store_port_lo, store_port_hi; /* the ports srun may host a step's store on; 0 = any */
};

int config_parse(int argc, char **argv, struct plait_config *c, struct plait_error *err);
void config_free(struct plait_config *c);

#endif
