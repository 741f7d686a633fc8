/* plait_spank.h — what the context files of spank_plait provide to the
 * dispatcher (spank_plait.c): submit-time checks (sbatch, salloc, srun),
 * per-task set-up (slurmstepd) and the messages they print (msg.c, always
 * "spank_plait: " and escaped). */
#ifndef PLAIT_SPANK_PLAIT_SPANK_H
#define PLAIT_SPANK_PLAIT_SPANK_H

#include <slurm/spank.h>
#include <stdarg.h>
#include <stddef.h>

#include "spank-plugin/config.h"

/* The variable that carries the resolved plan from the submit host to the
 * tasks (through spank_job_control_setenv; tasks see it prefixed SLURM_SPANK_). */
#define PLAIT_SPANK_PLAN_VAR "PLAIT_PLAN_JSON"
/* The environment fallback for --train-plan. */
#define PLAIT_SPANK_PLAN_ENV "PLAIT_TRAIN_PLAN"

/* Allocator/local context, after the options: validate plan_path (NULL: the
 * option was not given; then PLAIT_TRAIN_PLAN) and check the policy. */
int submit_check(spank_t sp, const struct plait_config *c, const char *plan_path);

/* Remote context, in each task: check the allocation and the policy again,
 * place the ranks and export this task's env contract. */
int task_setup(spank_t sp, const struct plait_config *c, const char *plan_path);

/* The longest message, in bytes, before escaping. */
#define MSG_MAX 2048

/* Formats into out (n bytes) with control characters escaped; returns out. */
char *msg_vformat(char *out, size_t n, const char *fmt, va_list ap);

/* Logs "spank_plait: <message>" through slurm_error, escaped; returns -1. */
int msg_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
