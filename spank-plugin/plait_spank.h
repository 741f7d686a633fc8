/* plait_spank.h — what the context files of spank_plait provide to the
 * dispatcher (spank_plait.c): submit-time checks (sbatch, salloc, srun),
 * per-task set-up (slurmstepd) and the messages they print (msg.c, always
 * "spank_plait: " and escaped). */
#ifndef PLAIT_SPANK_PLAIT_SPANK_H
#define PLAIT_SPANK_PLAIT_SPANK_H

#include <slurm/spank.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

#include "spank-plugin/config.h"

/* Where Slurm carries --train-plan of plugin "plait" to the job and its steps
 * (_SLURM_SPANK_OPTION_<plugin>_<option>; prefixed SLURM_SPANK_ in the job's
 * environment, from which sbatch, salloc and srun read it back as the option). */
#define PLAIT_SPANK_OPTION_VAR "_SLURM_SPANK_OPTION_plait_train_plan"
/* The variable that carries the resolved plan from the submit host to the
 * tasks (through spank_job_control_setenv; tasks see it prefixed SLURM_SPANK_). */
#define PLAIT_SPANK_PLAN_VAR "PLAIT_PLAN_JSON"
/* The environment fallback for --train-plan. */
#define PLAIT_SPANK_PLAN_ENV "PLAIT_TRAIN_PLAN"
/* The port of the store srun hosts for a step (store_host.c), in srun's
 * environment and so in every task's, where task.c reads it. */
#define PLAIT_SPANK_STORE_PORT_VAR "PLAIT_SPANK_STORE_PORT"

/* Allocator context (sbatch, salloc), before the options are read: a job
 * submitted from inside a plait job is a new job, so the parent's option and
 * plan (inherited SLURM_SPANK_* variables, which sbatch would read back as
 * --train-plan) and the env contract the plugin gave the parent's tasks are
 * removed from this process's environment, which the new job inherits. */
void submit_forget_parent_job(void);

/* Allocator/local context, after the options: validate plan_path (NULL: the
 * option was not given; then PLAIT_TRAIN_PLAN) and check the policy. */
int submit_check(spank_t sp, const struct plait_config *c, const char *plan_path);

/* Whether the command being run (sbatch, salloc, srun) starts a plait job or
 * step: --train-plan, PLAIT_TRAIN_PLAN, or (srun in a job) the job's plan. */
bool submit_is_plait(const char *plan_path);

/* Local context (srun), once the step exists and before its tasks start: a
 * step of more than one task gets its rendezvous store, served by a thread of
 * srun until store_host_stop (slurm_spank_exit). */
int store_host_start(spank_t sp, const struct plait_config *c);
void store_host_stop(void);

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
