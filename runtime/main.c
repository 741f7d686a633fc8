/* main.c — plait-train, the runtime a launcher execs. It reads only the env
 * contract (common/place/env.h), installs the stop signals, sets rank 0's console,
 * runs the training and records how it ended (end.json); the exit code says
 * how (PLAIT_EXIT_*). */
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>

#include "common/formats/ckpt_shards.h"
#include "common/place/elastic_batch.h" // defines: elastic_batch_grad_accum
#include "common/place/env.h"
#include "common/log.h"
#include "common/plan/plan.h"
#include "common/formats/runend.h"
#include "runtime/console.h"
#include "runtime/selftest.h"
#include "runtime/train.h"

static volatile sig_atomic_t interrupts, announce;

/* SIGTERM, SIGUSR1, SIGHUP and a first SIGINT: checkpoint after this
 * micro-batch and exit 75. A second SIGINT (Ctrl-C again): stop at once. */
static void on_stop_signal(int sig)
{
    static const char msg[] = "plait-train: stopping after this micro-batch, writing a checkpoint "
                              "(Ctrl-C again stops at once, losing the work since the last one)\n";
    if (sig == SIGINT && interrupts++) {
        signal(SIGINT, SIG_DFL);
        raise(SIGINT);
        return;
    }
    if (!train_stop_signal) train_stop_signal = sig;
    if (announce && (sig == SIGINT || sig == SIGHUP)) console_note(msg, sizeof msg - 1);
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: plait-train          (configured by the environment; normally run by "
            "`plait train`)\n"
            "  %s  the resolved plan itself (or %s: its path; the text wins when both\n"
            "                   are set, as the Slurm plugin sets the text it checked)\n"
            "  %s  run directory (required)\n"
            "  %s, %s  this rank and the gang's size, and the other variables of\n"
            "                   the env contract (README: The env contract) a launcher sets\n"
            "       plait-train --selftest   each CUDA op against its CPU twin (device: %s,\n"
            "                                else 0): a table of errors and the verdict\n"
            "exit codes: 0 done, 1 error, 2 usage, 75 stopped by SIGTERM, SIGUSR1, SIGINT "
            "or SIGHUP after a checkpoint (resumable), 76 a peer was lost (restart the whole "
            "gang from the newest checkpoint), 77 --selftest skipped (no GPU or no CUDA\n"
            "backend in this build), 130 a second SIGINT\n",
            PLAIT_ENV_PLAN_JSON, PLAIT_ENV_PLAN, PLAIT_ENV_RUN_DIR, PLAIT_ENV_RANK,
            PLAIT_ENV_WORLD_SIZE, PLAIT_ENV_DEVICE);
}

/* The launcher's layout written into the plan's "auto" degrees, so that the
 * run's plan.json, run.json and checkpoints record the layout that ran; and,
 * with dp "auto", the grad_accum that keeps the resumed run's global batch
 * (elastic_batch_grad_accum, the launchers' rule too): a requeue onto fewer
 * nodes goes on as if nothing happened. Every rank reads the same checkpoint,
 * so all decide alike; where the dp does not divide it, the resume says that
 * the global batch changes. */
static void resolve_layout(struct plan *plan, const struct env_rank *w, const char *run_dir)
{
    struct plan_parallel *par = &plan->parallel;
    struct ckpt_batch before;
    bool resumed = par->dp == PLAN_AUTO && ckpt_newest_batch(plan, run_dir, &before);
    int grad_accum = elastic_batch_grad_accum(plan, w->dp, w->pp, resumed ? &before : NULL);
    if (grad_accum != plan->batch.grad_accum) {
        if (w->rank == 0)
            log_info("parallel.dp auto: %d data-parallel replica%s (the run had %d); "
                     "batch.grad_accum %d (the plan says %d) keeps its global batch of %lld "
                     "micro-batches",
                     w->dp, w->dp == 1 ? "" : "s", before.dp, grad_accum, plan->batch.grad_accum,
                     (long long)before.global);
        plan->batch.grad_accum = grad_accum;
    }
    if (par->tp == PLAN_AUTO) par->tp = w->tp;
    if (par->pp == PLAN_AUTO) par->pp = w->pp;
    if (par->dp == PLAN_AUTO) par->dp = w->dp;
}

/* plait-train with an argument: --version, --selftest, --help; anything
 * else is a usage error. Returns the exit code. */
static int command_line(const char *arg)
{
    if (!strcmp(arg, "--version")) {
        printf("plait-train %s\n", PLAIT_VERSION);
        return PLAIT_EXIT_OK;
    }
    if (!strcmp(arg, "--selftest")) return selftest_run(stdout);
    usage(strcmp(arg, "--help") ? stderr : stdout);
    return strcmp(arg, "--help") ? PLAIT_EXIT_USAGE : PLAIT_EXIT_OK;
}

/* Rank 0 reports; the others speak only of trouble. */
static void quiet_other_ranks(const struct env_rank *where)
{
    if (where->rank == 0) return;
    char prefix[48];
    snprintf(prefix, sizeof prefix, "plait-train[rank %d]", where->rank);
    log_set_prefix(prefix);
    log_set_quiet(1);
    if (!freopen("/dev/null", "w", stdout)) log_warn("cannot quiet stdout");
}

static void install_stop_signals(void)
{
    struct sigaction sa = {.sa_handler = on_stop_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    /* Ctrl-C, a closed terminal; not where ignored (nohup, a shell's background job) */
    const int polite[2] = {SIGINT, SIGHUP};
    for (int i = 0; i < 2; i++) {
        struct sigaction old;
        if (sigaction(polite[i], NULL, &old) == 0 && old.sa_handler != SIG_IGN)
            sigaction(polite[i], &sa, NULL);
    }
    signal(SIGPIPE, SIG_IGN); /* a closed pipe or terminal ends the printing, not the run */
}

/* PLAIT_CONSOLE (plait train --json, --quiet): rank 0's console. */
static void set_console(const struct env_rank *where)
{
    const char *console = getenv(PLAIT_ENV_CONSOLE);
    console_mode = console && !strcmp(console, "json")    ? CONSOLE_JSON
                   : console && !strcmp(console, "quiet") ? CONSOLE_QUIET
                                                          : CONSOLE_PROGRESS;
    if (where->rank == 0) {
        announce = 1;
        if (console_mode == CONSOLE_QUIET) log_set_quiet(1);
    }
}

/* The run's outcome said (a lost peer, an error, a stop), and the exit code
 * of train_run's rc. */
static int say_how_it_ended(int rc, const struct plait_error *err)
{
    if (rc < 0 && err->peer_lost)
        log_error("a peer was lost (exit %d: restart the gang from the newest checkpoint): %s",
                  PLAIT_EXIT_RESTART, err->text);
    else if (rc < 0)
        log_error("%s", err->text);
    if (rc == PLAIT_EXIT_PREEMPTED)
        log_info("stopped by SIG%s; a checkpoint was written: run the same command again to "
                 "resume",
                 sigabbrev_np(train_stop_signal) ? sigabbrev_np(train_stop_signal) : "TERM");
    return rc >= 0 ? rc : err->peer_lost ? PLAIT_EXIT_RESTART : PLAIT_EXIT_ERROR;
}

/* How it ended, for plait status (not when another process holds the run, nor
 * when a first start failed and left no run directory behind). */
static void record_end(const struct env_rank *where, const char *run_dir, int code, int rc,
                       struct plait_error *err)
{
    struct stat run_st;
    struct run_end end;
    runend_of(&end, code, train_stop_signal, rc < 0 ? err->text : "");
    if (where->rank == 0 && train_run_held && stat(run_dir, &run_st) == 0 &&
        runend_write(run_dir, &end, err))
        log_warn("%s", err->text);
}

int main(int argc, char **argv)
{
    log_set_prefix("plait-train");
    if (argc > 1) return command_line(argv[1]);
    const char *plan_path = getenv(PLAIT_ENV_PLAN), *run_dir = getenv(PLAIT_ENV_RUN_DIR);
    const char *plan_text = getenv(PLAIT_ENV_PLAN_JSON);
    if ((!plan_path && !plan_text) || !run_dir || !*run_dir) {
        log_error("%s (or %s) and %s must be set", PLAIT_ENV_PLAN, PLAIT_ENV_PLAN_JSON,
                  PLAIT_ENV_RUN_DIR);
        usage(stderr);
        return PLAIT_EXIT_USAGE;
    }
    struct plait_error err;
    struct env_rank where;
    if (env_rank_read(&where, &err)) {
        log_error("%s", err.text);
        return PLAIT_EXIT_ERROR;
    }
    quiet_other_ranks(&where);
    install_stop_signals();
    set_console(&where);
    /* the text first: a launcher that checked a plan passes it as text, and a
     * path the user exported must not replace it */
    struct plan *plan = plan_text
                            ? plan_load_text(plan_text, PLAIT_ENV_PLAN_JSON, NULL, NULL, 0, &err)
                            : plan_load(plan_path, NULL, 0, &err);
    if (!plan) {
        log_error("%s", err.text);
        console_stop();
        return PLAIT_EXIT_ERROR;
    }
    resolve_layout(plan, &where, run_dir);
    char *plan_json = plan_to_json(plan);
    int rc = train_run(plan, plan_json, run_dir, &where, &err);
    int code = say_how_it_ended(rc, &err);
    record_end(&where, run_dir, code, rc, &err);
    free(plan_json);
    plan_free(plan);
    console_stop();
    return code;
}
