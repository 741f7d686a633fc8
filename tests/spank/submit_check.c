/* submit_check.c — spank_plait's submit-time check as a program, for tests:
 * `submit_check [KEY=VALUE ...] PLAN` runs submit_check (spank-plugin/submit.c)
 * with the plugstack.conf arguments given, as sbatch would at submit, and
 * exits 0 when the plan is accepted, 1 with the plugin's message (on stderr,
 * through libslurm's slurm_error) when refused, 2 on a bad plugstack argument.
 * Only the SPANK calls are stand-ins here: the context is the allocator's
 * (sbatch), and the plan attached to the job is printed on stdout. */
#include <stdio.h>
#include <slurm/spank.h>

#include "spank-plugin/config.h"
#include "spank-plugin/plait_spank.h"

spank_context_t spank_context(void)
{
    return S_CTX_ALLOCATOR;
}

spank_err_t spank_job_control_setenv(spank_t sp, const char *var, const char *val, int overwrite)
{
    (void)sp;
    (void)overwrite;
    printf("%s=%s\n", var, val);
    return ESPANK_SUCCESS;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: submit_check [KEY=VALUE ...] PLAN\n");
        return 2;
    }
    struct plait_config config;
    struct plait_error err;
    if (config_parse(argc - 2, argv + 1, &config, &err)) {
        fprintf(stderr, "submit_check: %s\n", err.text);
        return 2;
    }
    int rc = submit_check(NULL, &config, argv[argc - 1]);
    config_free(&config);
    return rc ? 1 : 0;
}
