/* spank_plait.c — the SPANK entry points of spank_plait.so and nothing else:
 * registers --train-plan in every context (sbatch ignores a static options
 * table) and routes each callback by context: submit.c on the submit host
 * (sbatch, salloc, srun), store_host.c in srun, task.c in slurmstepd. Config
 * parsing is config.c's.
 */
#include <slurm/slurm_version.h>
#include <slurm/spank.h>
#include <stdlib.h>
#include <string.h>

#include "spank-plugin/config.h"
#include "spank-plugin/plait_spank.h"

SPANK_PLUGIN(plait, 1);

static struct plait_config config;
static char *plan_path; /* --train-plan's value, NULL if not given */

static int on_train_plan(int val, const char *optarg, int remote)
{
    (void)val;
    (void)remote;
    if (!optarg || !*optarg) return msg_error("--train-plan needs a FILE");
    free(plan_path);
    plan_path = strdup(optarg);
    return plan_path ? 0 : -1;
}

static struct spank_option train_plan_option = {
    .name = "train-plan",
    .arginfo = "FILE",
    .usage = "Train this plait plan (checked at submit)",
    .has_arg = 1,
    .val = 0,
    .cb = on_train_plan,
};

/* The Slurm release whose spank.h built this plugin (a test builds one that says another) */
#ifndef PLAIT_SLURM_BUILT
#define PLAIT_SLURM_BUILT SLURM_VERSION_NUMBER
#endif

/* SPANK plugins are not ABI compatible between Slurm's major releases (YY.MM), and Slurm does
 * not check a SPANK plugin's version as it does its own plugins': refuse to run in another
 * release than the one built against, saying how to rebuild. A Slurm that does not say its
 * release is trusted. */
static int check_slurm_release(spank_t sp)
{
    char *major = NULL, *minor = NULL;
    if (spank_get_item(sp, S_SLURM_VERSION_MAJOR, &major) != ESPANK_SUCCESS ||
        spank_get_item(sp, S_SLURM_VERSION_MINOR, &minor) != ESPANK_SUCCESS || !major || !minor)
        return 0;
    int built_major = SLURM_VERSION_MAJOR(PLAIT_SLURM_BUILT),
        built_minor = SLURM_VERSION_MINOR(PLAIT_SLURM_BUILT);
    if (atoi(major) == built_major && atoi(minor) == built_minor) return 0;
    return msg_error("spank_plait.so was built against Slurm %d.%02d, but this is Slurm %s.%s: "
                     "SPANK plugins are not compatible across Slurm's major releases; rebuild "
                     "it against this Slurm (make SLURM_HOME=<its prefix>; "
                     "examples/slurm/ADMIN.md)",
                     built_major, built_minor, major, minor);
}

int slurm_spank_init(spank_t sp, int argc, char **argv)
{
    spank_context_t ctx = spank_context();
    if (ctx != S_CTX_ALLOCATOR && ctx != S_CTX_LOCAL && ctx != S_CTX_REMOTE) return 0;
    if (check_slurm_release(sp)) return -1;
    struct plait_error err;
    if (config_parse(argc, argv, &config, &err)) return msg_error("%s", err.text);
    /* before sbatch/salloc read the options, some of which come from the
     * environment: a new job does not inherit its parent's plan */
    if (ctx == S_CTX_ALLOCATOR) submit_forget_parent_job();
    if (spank_option_register(sp, &train_plan_option) != ESPANK_SUCCESS)
        return msg_error("cannot register --train-plan");
    return 0;
}

int slurm_spank_init_post_opt(spank_t sp, int argc, char **argv)
{
    (void)argc;
    (void)argv;
    spank_context_t ctx = spank_context();
    if (ctx == S_CTX_ALLOCATOR || ctx == S_CTX_LOCAL) return submit_check(sp, &config, plan_path);
    return 0;
}

/* srun, once the step exists: its store, when it is a plait step of several tasks. */
int slurm_spank_local_user_init(spank_t sp, int argc, char **argv)
{
    (void)argc;
    (void)argv;
    if (spank_context() != S_CTX_LOCAL || !submit_is_plait(plan_path)) return 0;
    return store_host_start(sp, &config);
}

/* Failing here fails the job without draining the node (a failure in
 * user_init or task_post_fork would drain it). */
int slurm_spank_task_init(spank_t sp, int argc, char **argv)
{
    (void)argc;
    (void)argv;
    if (spank_context() != S_CTX_REMOTE) return 0;
    return task_setup(sp, &config, plan_path);
}

int slurm_spank_exit(spank_t sp, int argc, char **argv)
{
    (void)sp;
    (void)argc;
    (void)argv;
    if (spank_context() == S_CTX_LOCAL) store_host_stop();
    config_free(&config);
    free(plan_path);
    plan_path = NULL;
    return 0;
}
