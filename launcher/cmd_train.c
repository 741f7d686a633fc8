/* cmd_train.c — `plait train PLAN [--out DIR] [--fresh] [--set path=value ...]`:
 * checks the plan, sets what every local rank shares of the env contract (the
 * resolved plan travels as text; the runtime locks the run directory, checks
 * that it belongs to this plan and records it there) and runs the ranks, one
 * or many, as a supervised gang (gang.h: signals passed on, restarts). */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/place/env.h"
#include "common/log.h"
#include "common/plan/plan.h"
#include "launcher/commands.h"
#include "launcher/elastic.h"
#include "launcher/gang.h"

enum { OPT_OUT, OPT_FRESH, OPT_SET, OPT_RANKS, OPT_JSON, OPT_QUIET };
const struct cli_command cmd_train_cli = {
    .name = "train",
    .operands = "PLAN",
    .min_operands = 1,
    .max_operands = 1,
    .summary = "train a plan on this machine",
    .description =
        "Trains PLAN on this machine: one rank, or, when parallel.tp x pp x dp is more than\n"
        "one, that many ranks as processes meeting through a rendezvous store that plait\n"
        "train hosts. Running it again with the same --out resumes from the newest complete\n"
        "checkpoint. A rank that is lost (killed, or exiting 76) restarts the whole gang\n"
        "from the newest complete checkpoint, up to checkpoint.max_restarts times.",
    .options =
        (const struct cli_option[]){
            [OPT_OUT] = {"--out", "DIR",
                         "run directory (default runs/<plan name>); if it holds a\n"
                         "checkpoint of this plan, training resumes from the newest\n"
                         "complete one (a different plan is refused: see --fresh)"},
            [OPT_FRESH] = {"--fresh", NULL,
                           "start from scratch: remove the run directory's checkpoints\n"
                           "and metrics first"},
            [OPT_SET] = {"--set", "path=value",
                         "override a plan field by its dot path, e.g.\n"
                         "--set model.layers=2 --set optimizer.lr=1e-3 (repeatable)",
                         .repeats = true},
            [OPT_RANKS] = {"--ranks", "N",
                           "the ranks this machine may run: with parallel.dp \"auto\", as\n"
                           "many data-parallel replicas as fit (resuming a run, its global\n"
                           "batch is kept: grad_accum grows when dp shrinks); default: the\n"
                           "plan's layout, \"auto\" as 1"},
            [OPT_JSON] = {"--json", NULL,
                          "stdout: one JSON object per step and evaluation (the\n"
                          "records of metrics.jsonl) instead of progress lines"},
            [OPT_QUIET] = {"--quiet", NULL, "only warnings, errors and the final summary"},
            {0}},
    .epilog = "The console is also kept in the run directory (train.log).\n"
              "exit codes: 0 done, 1 error, 2 usage, 75 stopped by Ctrl-C (SIGINT), SIGHUP,\n"
              "SIGTERM or SIGUSR1 after a checkpoint (run the same command again to resume),\n"
              "76 a rank was lost and checkpoint.max_restarts restarts were used up (run the\n"
              "same command again to resume), 130 a second Ctrl-C (stopped at once)",
};

static char *default_run_dir(const char *plan_path)
{
    const char *base = strrchr(plan_path, '/');
    base = base ? base + 1 : plan_path;
    size_t len = strlen(base);
    if (len > 5 && !strcmp(base + len - 5, ".json")) len -= 5;
    char *dir = malloc(len + sizeof "runs/");
    if (dir) sprintf(dir, "runs/%.*s", (int)len, base);
    return dir;
}

/* What the command line says. */
struct train_args {
    const char *plan_path, *out;
    const char *console; /* PLAIT_CONSOLE: --json, --quiet */
    bool fresh;
    int slots;
    const char **sets;
    int n_sets;
};

/* Returns CLI_CONTINUE, or the exit code; t->sets to free either way. */
static int parse_train(int argc, char **argv, struct train_args *t)
{
    struct cli_args a;
    *t = (struct train_args){0};
    int parsed = cli_parse(&cmd_train_cli, argc, argv, &a);
    if (parsed != CLI_CONTINUE) return parsed;
    t->sets = calloc((size_t)a.n + 1, sizeof *t->sets);
    if (!t->sets) {
        cli_args_free(&a);
        return PLAIT_EXIT_ERROR;
    }
    for (int k = 0; k < a.n; k++) {
        const char *v = a.v[k].value;
        switch (a.v[k].opt) {
        case OPT_OUT:
            t->out = v;
            break;
        case OPT_FRESH:
            t->fresh = true;
            break;
        case OPT_SET:
            t->sets[t->n_sets++] = v;
            break;
        case OPT_RANKS: {
            char *end;
            long n = strtol(v, &end, 10);
            if (*end || n < 1 || n > PLAN_MAX_RANKS) {
                cli_args_free(&a);
                return cli_usage_error(&cmd_train_cli, "--ranks %s: a count of ranks, 1 to %d", v,
                                       PLAN_MAX_RANKS);
            }
            t->slots = (int)n;
            break;
        }
        case OPT_JSON:
            t->console = "json";
            break;
        case OPT_QUIET:
            t->console = "quiet";
            break;
        default:
            t->plan_path = v;
        }
    }
    cli_args_free(&a);
    if (t->out && !*t->out) {
        log_error("train: --out: the run directory must not be empty");
        return PLAIT_EXIT_USAGE;
    }
    return CLI_CONTINUE;
}

/* The run directory as an absolute path, for the ranks; the runtime creates
 * it (and removes it again if the first start fails), so a plan that cannot
 * start leaves nothing behind. */
static int absolute_run_dir(const char *run_dir, char *abs_dir, size_t bytes)
{
    char cwd[PATH_MAX] = "";
    if (run_dir[0] != '/' && !getcwd(cwd, sizeof cwd)) {
        log_error("cannot read the current directory: %s", strerror(errno));
        return -1;
    }
    if (snprintf(abs_dir, bytes, "%s%s%s", cwd, *cwd ? "/" : "", run_dir) >= (int)bytes) {
        log_error("train: --out %s: path too long", run_dir);
        return -1;
    }
    return 0;
}

/* What every local rank shares of the env contract; what is each rank's own
 * (gang.c sets it) is cleared. */
static void export_shared_env(const struct train_args *t, const struct plan *plan,
                              const char *json, const char *abs_dir, int64_t world)
{
    setenv(PLAIT_ENV_PLAN_JSON, json, 1);
    unsetenv(PLAIT_ENV_PLAN);
    if (t->fresh)
        setenv(PLAIT_ENV_FRESH, "1", 1);
    else
        unsetenv(PLAIT_ENV_FRESH);
    setenv(PLAIT_ENV_RUN_DIR, abs_dir, 1);
    signal(SIGPIPE, SIG_IGN); /* a closed pipe or terminal ends the printing, not the run */
    if (t->console)
        setenv(PLAIT_ENV_CONSOLE, t->console, 1);
    else
        unsetenv(PLAIT_ENV_CONSOLE);
    /* one rank or many: the gang, supervised (a store, and each rank its place) */
    static const char *const mine[] = {PLAIT_ENV_RANK, PLAIT_ENV_WORLD_SIZE, PLAIT_ENV_TP,
                                       PLAIT_ENV_PP,   PLAIT_ENV_DP,         PLAIT_ENV_DEVICE};
    for (size_t k = 0; k < sizeof mine / sizeof *mine; k++) unsetenv(mine[k]);
    /* one rank's device: the CPU when the plan says so; else plait-train chooses (GPU 0
     * when one is usable, see choose_backend in runtime/train.c) */
    if (world == 1 && plan->parallel.device == PLAN_DEVICE_CPU) setenv(PLAIT_ENV_DEVICE, "cpu", 1);
    setenv(PLAIT_ENV_RESTART_COUNT, "0", 0);
    /* idle OpenMP threads sleep instead of spinning: on shared or oversubscribed
     * cores spinning threads steal the time of working ones (measured: up to 2x
     * slower steps); the user's own setting wins */
    setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
}

int cmd_train(int argc, char **argv)
{
    struct train_args t;
    int parsed = parse_train(argc, argv, &t);
    if (parsed != CLI_CONTINUE) {
        free(t.sets);
        return parsed;
    }
    struct plait_error err;
    struct plan *plan = plan_load(t.plan_path, t.sets, t.n_sets, &err);
    free(t.sets);
    if (!plan) {
        log_error("%s", err.text);
        return PLAIT_EXIT_ERROR;
    }
    char *run_dir = t.out ? strdup(t.out) : default_run_dir(t.plan_path);
    char *json = NULL;
    char abs_dir[PATH_MAX];
    int rc = PLAIT_EXIT_ERROR;
    if (!run_dir) {
        log_error("out of memory");
        goto out;
    }
    /* the layout on this machine: the plan's degrees ("auto" tp, pp as 1), an
     * "auto" dp filling --ranks, written into the plan the ranks get */
    if (elastic_resolve(plan, t.slots, t.fresh ? NULL : run_dir, &err)) {
        log_error("train: %s", err.text);
        goto out;
    }
    const struct plan_parallel *par = &plan->parallel;
    struct gang_spec gang = {.tp = par->tp,
                             .cp = par->cp,
                             .pp = par->pp,
                             .dp = par->dp,
                             .timeout_s = par->timeout_s,
                             .max_restarts = plan->checkpoint.max_restarts};
    int64_t world = plan_ranks(plan); /* tp·cp·pp·dp <= PLAN_MAX_RANKS */
    if (!(json = plan_to_json(plan))) {
        log_error("out of memory");
        goto out;
    }
    if (absolute_run_dir(run_dir, abs_dir, sizeof abs_dir)) goto out;
    export_shared_env(&t, plan, json, abs_dir, world);
    rc = gang_run_local(plan, &gang, &err);
    if (rc < 0) {
        log_error("%s", err.text);
        rc = PLAIT_EXIT_ERROR;
    }
out:
    free(json);
    free(run_dir);
    plan_free(plan);
    return rc;
}
