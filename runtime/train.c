/* train.c — one rank's training run: set up (train_setup.c), samples before
 * and after, the loop of optimizer steps, each step the named parts it takes
 * in turn (micro-batches, the gradients' sums and the optimizer, the loss,
 * the report, evaluation, a stop, a checkpoint). A step's micro-batches are
 * train_batches.c's, its checkpoints train_save.c's, what it says report.c's;
 * the maths is the model's (runtime/model*.c) and optim.c's. */
#include "runtime/train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/plan/lr_schedule.h" // defines: plan_lr
#include "runtime/buckets.h"
#include "runtime/console.h"
#include "runtime/lanes.h" // defines: lanes_switches
#include "runtime/optim.h"
#include "runtime/profile.h" // defines: prof_now, profile_print
#include "runtime/report.h"
#include "runtime/run_dir.h"
#include "runtime/train_batches.h"
#include "runtime/train_save.h"
#include "runtime/train_setup.h"
#include "runtime/trainer.h"

volatile sig_atomic_t train_stop_signal;
bool train_run_held;

/* ---- the steps of a step ------------------------------------------------------ */

/* What a step returns: go on to the next, or the run's end (PLAIT_EXIT_OK
 * after the last, PLAIT_EXIT_PREEMPTED after a stop's checkpoint), or -1. */
enum { STEP_GO_ON = 0 };

/* An evaluation a stop left owed (a checkpoint between a step and its
 * evaluation), taken before the next step. */
static int owed_evaluation(struct trainer *t, struct plait_error *err)
{
    if (!(t->st.eval_pending && t->has_val)) return STEP_GO_ON;
    int r = train_evaluate(t, err);
    if (r < 0) return -1;
    if (r == 1) return train_save(t, false, err) ? -1 : PLAIT_EXIT_PREEMPTED;
    t->st.eval_pending = 0;
    return STEP_GO_ON;
}

/* The step's micro-batches; a stop between them ends the run with a
 * checkpoint (of the step so far). */
static int step_micro_batches(struct trainer *t, int s, float grad_scale, struct plait_error *err)
{
    int stopped = train_micro_batches(t, s, grad_scale, err);
    if (stopped < 0) return -1;
    if (!stopped) return STEP_GO_ON;
    log_info("signal %d: stopping after micro-batch %d of step %d (of %d%s)",
             (int)train_stop_signal, t->st.micro, s + 1, t->plan->batch.grad_accum,
             t->where->pp > 1 ? "; the pipeline drained" : "");
    return train_save(t, false, err) ? -1 : PLAIT_EXIT_PREEMPTED;
}

/* The step's gradients completed (dump: this is the dumped step), then the
 * optimizer's step with st's learning rate; st->grad_norm its norm. */
static int reduce_and_step(struct trainer *t, struct step_taken *st, bool dump,
                           struct plait_error *err)
{
    const struct plan *p = t->plan;
    int B = p->batch.micro_batch, T = t->T;
    struct optim_groups groups = {.dp = parallel_slices(&t->par, t->m.zero),
                                  .replicas = &t->par.g_replicas,
                                  .mp = &t->par.g_mp,
                                  .ep = &t->par.g_ep,
                                  .experts = &t->par.g_experts,
                                  .summed = t->bucketed};
    /* The sums over dp (ZeRO 0) or reduce-scatters (1) started during
     * backward (not in a dump's step: the dump shows every rank's own
     * gradients) are waited for, then the LayerNorms' sum over tp is taken
     * in what they reduced; the embeddings' bucket starts only after the
     * tied wte's sum. ZeRO 2 did its reductions after each micro-batch. */
    bool in_flight = t->bucketed && !dump && t->m.zero < 2;
    bool after = t->bucketed && dump && t->m.zero < 2;
    if ((t->m.zero < 2 && train_tied_sum(t, err)) ||
        (in_flight && buckets_finish(&t->buckets, B, T, true, err)) ||
        (t->m.zero < 2 && !in_flight && model_sum_layernorm_grads(&t->m, err)) ||
        (dump && train_dump_step1(t, err)) ||
        (after && buckets_finish(&t->buckets, B, T, false, err)) ||
        optim_step(&t->m, &p->optimizer, st->lr, st->index + 1, &groups, &st->grad_norm, err))
        return -1;
    return 0;
}

/* The step's loss: the last stage's, over the dp ranks' micro-batches. A loss
 * or gradient norm that is not finite ends the run. */
static int step_loss(struct trainer *t, struct step_taken *st, struct plait_error *err)
{
    int A = t->plan->batch.grad_accum;
    st->loss = t->st.loss_sum / A;
    if (t->multi) {
        double v = train_holds_loss(t) ? t->st.loss_sum : 0;
        if (t->par.g_world.allreduce_f64(t->par.g_world.ctx, &v, 1, err)) return -1;
        st->loss = v / ((double)A * t->where->dp);
    }
    if (!isfinite(st->loss) || !isfinite(st->grad_norm))
        return error_set(err,
                         "step %d: loss %g, gradient norm %g: training diverged (lower "
                         "optimizer.lr or set optimizer.grad_clip)",
                         st->index + 1, st->loss, st->grad_norm);
    return 0;
}

/* The step's time: a process's first step warms up (not in the averages; the
 * profile starts again after it, and the memory is reported); the others are
 * timed. */
static int count_step_time(struct trainer *t, const struct step_taken *st, double dt,
                           struct plait_error *err)
{
    if (!st->warm_up) {
        t->timed_s += dt;
        t->m.prof.steps++;
        return 0;
    }
    struct profile kept = t->m.prof;
    memset(&t->m.prof, 0, sizeof t->m.prof);
    t->m.prof.sync = kept.sync, t->m.prof.sync_ctx = kept.sync_ctx;
    return report_first_step(t, st->index + 1, err);
}

/* The step's metrics, its time counted, rank 0's progress line. */
static int record_step(struct trainer *t, const struct step_taken *st, struct plait_error *err)
{
    struct step_metrics sm;
    double dt;
    if (report_step(t, st, &sm, &dt, err) || count_step_time(t, st, dt, err)) return -1;
    double step_s = t->m.prof.steps ? t->timed_s / t->m.prof.steps
                    : t->prior_step_s > 0 ? t->prior_step_s
                                          : dt;
    if (t->where->rank == 0) report_progress(t, &sm, step_s, st->warm_up);
    return 0;
}

/* The evaluation, when due (every data.val_every steps, and after the last);
 * data that fails keeps the work done, a stop during it ends the run with a
 * checkpoint; either way it is owed. */
static int evaluate_if_due(struct trainer *t, struct plait_error *err)
{
    const struct plan *p = t->plan;
    bool last = t->st.step == p->steps;
    bool eval_due =
        t->has_val && (last || (p->data.val_every > 0 && t->st.step % p->data.val_every == 0));
    if (!eval_due) return STEP_GO_ON;
    int r = train_evaluate(t, err);
    if (r < 0 && t->data_failed) {
        t->st.eval_pending = 1;
        return train_save_failing(t, err);
    }
    if (r < 0) return -1;
    if (r == 1) {
        t->st.eval_pending = 1;
        log_info("signal %d: stopping during the evaluation after step %d", (int)train_stop_signal,
                 t->st.step);
        return train_save(t, false, err) ? -1 : PLAIT_EXIT_PREEMPTED;
    }
    return STEP_GO_ON;
}

/* Whether to stop after this step: any rank's stop is every rank's. 1 stop,
 * 0 not, -1 with err. */
static int stop_after_step(struct trainer *t, struct plait_error *err)
{
    int stop = train_stop_signal != 0;
    if (t->multi && parallel_max_int(&t->par, &stop, err)) return -1;
    if (stop && !train_stop_signal) train_stop_signal = SIGTERM;
    return stop;
}

/* The checkpoint a step ends with when one is due (the last step, a stop,
 * checkpoint.every, checkpoint.every_minutes): periodic ones may be written
 * in the background, the last one and a stop's are written at once. With
 * none due, one written in the background is committed once every rank's is. */
static int checkpoint_if_due(struct trainer *t, bool stop, struct plait_error *err)
{
    const struct plan *p = t->plan;
    bool last = t->st.step == p->steps;
    int by_time = train_save_due_by_time(t, err);
    if (by_time < 0) return -1;
    bool ckpt_due = last || stop || by_time ||
                    (p->checkpoint.every > 0 && t->st.step % p->checkpoint.every == 0);
    return ckpt_due ? train_save(t, !last && !stop, err) : train_save_poll(t, err);
}

/* ---- the loop ---------------------------------------------------------------------- */

/* One optimizer step, the state's next: STEP_GO_ON, the run's end, or -1. */
static int take_step(struct trainer *t, float grad_scale, int first_step, struct plait_error *err)
{
    const struct plan *p = t->plan;
    int s = t->st.step; /* 0-based index of the step being taken */
    struct step_taken st = {.index = s, .warm_up = s == first_step, .t0 = prof_now()};
    parallel_comm_totals(&t->par, st.bytes0, st.wait0);
    st.lr = plan_lr(&p->optimizer, p->steps, s);
    bool dump = t->dump_dir && s == t->dump_step && t->st.micro == 0; /* not resumed mid-way */
    int rc = step_micro_batches(t, s, grad_scale, err);
    if (rc != STEP_GO_ON) return rc;
    if (reduce_and_step(t, &st, dump, err) || step_loss(t, &st, err)) return -1;
    t->st.step = s + 1;
    t->st.micro = 0;
    t->st.loss_sum = 0;
    if (record_step(t, &st, err)) return -1;
    if ((rc = evaluate_if_due(t, err)) != STEP_GO_ON) return rc;
    int stop = stop_after_step(t, err);
    if (stop < 0 || checkpoint_if_due(t, stop, err)) return -1;
    if (stop && t->st.step != p->steps) {
        log_info("signal %d: stopped after step %d", (int)train_stop_signal, t->st.step);
        return PLAIT_EXIT_PREEMPTED;
    }
    return STEP_GO_ON;
}

static int run_steps(struct trainer *t, struct plait_error *err)
{
    const struct plan *p = t->plan;
    int B = p->batch.micro_batch, T = t->T, A = p->batch.grad_accum;
    /* the mean over the global batch: A micro-batches on each of the dp ranks (with
     * context parallelism, each of the dp·cp ranks has T of a sequence's tokens) */
    float grad_scale = 1.0f / ((float)B * T * A * t->where->dp);
    int first_step = t->st.step;
    int rc = owed_evaluation(t, err);
    while (rc == STEP_GO_ON && t->st.step < p->steps)
        rc = take_step(t, grad_scale, first_step, err);
    return rc == STEP_GO_ON ? PLAIT_EXIT_OK : rc;
}

static int print_sample(struct trainer *t, const char *when, struct plait_error *err)
{
    if (t->plan->sample.tokens <= 0) return 0;
    /* --json and --quiet print no samples, but take them all the same: the
     * sampler's random state (in the checkpoints) does not depend on the console */
    FILE *out = console_mode == CONSOLE_PROGRESS ? stdout : fopen("/dev/null", "w");
    if (!out) return error_errno(err, "/dev/null");
    fprintf(out, "---- sample %s ----\n", when);
    t->m.prof.paused++; /* sampling is not training time */
    int rc =
        sample_text(&t->m, &t->plan->sample, t->has_tok ? &t->tok : NULL, &t->sample_rng, out, err);
    t->m.prof.paused--;
    fprintf(out, "----\n");
    if (out == stdout)
        fflush(stdout);
    else
        fclose(out);
    return rc;
}

/* The steps, with samples before and after them (one rank: they need the
 * whole model) and the profile when asked for (PLAIT_PROFILE). */
static int train(struct trainer *t, struct plait_error *err)
{
    bool samples = !t->multi;
    if (samples && t->st.step == 0 && t->st.micro == 0 && print_sample(t, "before training", err))
        return -1;
    t->saved_at_s = prof_now();
    /* a printed profile on an asynchronous backend waits for the device around each phase */
    if (getenv(PLAIT_ENV_PROFILE) && t->m.ops->synchronize)
        t->m.prof.sync = t->m.ops->synchronize, t->m.prof.sync_ctx = t->m.ctx;
    int rc = run_steps(t, err);
    if (t->m.lanes && t->where->rank == 0) /* what the tests see of the two lanes */
        log_info("DualPipeV's pairs: %ld lane switches at the experts' all-to-alls on rank 0",
                 lanes_switches(t->m.lanes));
    if (getenv(PLAIT_ENV_PROFILE) && t->m.prof.steps > 0 && t->where->rank == 0)
        profile_print(&t->m.prof, t->timed_s / t->m.prof.steps, stdout);
    if (samples && rc == PLAIT_EXIT_OK && !train_stop_signal &&
        print_sample(t, "after training", err))
        rc = -1;
    return rc;
}

int train_run(const struct plan *plan, const char *plan_json, const char *run_dir,
              const struct env_rank *where, struct plait_error *err)
{
    struct env_rank folded = parallel_fold(where);
    struct trainer t = {.plan = plan,
                        .last_loss = NAN,
                        .last_val = NAN,
                        .where = &folded,
                        .T = plan->model.seq_len / where->cp,
                        .plan_json = plan_json,
                        .run_dir = run_dir,
                        .run_lock = {-1},
                        .ckpt_lock = {-1}};
    int rc = -1;
    if (train_setup(&t, err)) goto out;
    if (t.st.step >= plan->steps) {
        log_info("the run in %s already finished its %d step%s", run_dir, plan->steps,
                 plan->steps == 1 ? "" : "s");
        rc = PLAIT_EXIT_OK;
        goto out;
    }
    report_start(&t);
    rc = train(&t, err);
    if (rc >= 0 && where->rank == 0) report_end(&t, rc);
out:
    if (rc < 0 && t.par_ready) parallel_abort(&t.par, err->text);
    bool history = rc >= 0 || (t.ckpts_open && run_dir_has_history(&t, false));
    train_teardown(&t);
    run_dir_undo_failed_start(&t, history);
    return rc;
}
