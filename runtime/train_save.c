/* train_save.c — the checkpoints of the training loop: written at once or in
 * the background (checkpoint.async) and committed when every rank's is, due
 * by checkpoint.every_minutes, and written to keep the work done when the data
 * fails. The files are ckpt.c's (one rank) and ckpt_parts.c's (several). */
#include "runtime/train_save.h"

#include <string.h>

#include "common/log.h"
#include "runtime/ckpt.h"
#include "runtime/ckpt_async.h"
#include "runtime/ckpt_parts.h"
#include "runtime/profile.h" // defines: prof_now
#include "runtime/report.h" // defines: report_progress_flush
#include "runtime/train_batches.h" // defines: train_holds_loss, train_moe_stats

/* Where this rank's part of a checkpoint goes. */
static struct ckpt_target ckpt_target(struct trainer *t)
{
    return (struct ckpt_target){
        .d = !t->multi || t->where->rank == 0 ? &t->ckpts : NULL,
        .dir = t->ckpt_dir,
        .par = t->multi ? &t->par : NULL,
        .keep = t->plan->checkpoint.keep,
    };
}

int train_save(struct trainer *t, bool background, struct plait_error *err)
{
    report_progress_flush(t); /* the step checkpointed */
    struct ckpt_target to = ckpt_target(t);
    background = background && t->plan->checkpoint.async && t->st.micro == 0;
    if (!background && ckpt_async_wait(&t->async, &to, err)) return -1;
    if (t->reads_data) t->st.data = t->train.pos;
    /* mid-step, the loss so far is every data-parallel rank's: the state holds the sum */
    double mine = t->st.loss_sum;
    if (t->multi && t->st.micro > 0) {
        double v = train_holds_loss(t) ? mine : 0;
        if (t->par.g_world.allreduce_f64(t->par.g_world.ctx, &v, 1, err)) return -1;
        t->st.loss_sum = v;
    }
    /* mixture of experts: the routing so far, as the loss (zero at a step's end) */
    t->st.moe_stats_n = gpt2_moe(&t->m.cfg) ? MOE_STATS(t->m.cfg.experts) : 0;
    memset(t->st.moe_stats, 0, sizeof t->st.moe_stats);
    if (t->st.micro > 0 && train_moe_stats(t, t->st.moe_stats, err)) return -1;
    memcpy(t->st.sample_rng, t->sample_rng.s, sizeof t->st.sample_rng);
    double t0 = prof_now();
    int rc;
    if (background) {
        rc = ckpt_async_save(&t->async, &to, &t->m, &t->st, t->plan_json, err);
    } else {
        rc = t->multi
                 ? ckpt_parts_save(to.d, to.dir, &t->m, &t->st, to.keep, t->plan_json, &t->par, err)
                 : ckpt_save(to.d, &t->m, &t->st, to.keep, t->plan_json, err);
    }
    t->st.loss_sum = mine;
    if (rc) return -1;
    t->ckpt_stall_s = prof_now() - t0;
    if (!background) {
        t->ckpt_write_s = t->ckpt_stall_s;
        log_info("checkpoint step %d%s written in %.1f s", t->st.step,
                 t->st.micro ? " (mid-step)" : "", t->ckpt_write_s);
    }
    t->saved_at_s = prof_now();
    return 0;
}

int train_save_poll(struct trainer *t, struct plait_error *err)
{
    struct ckpt_target to = ckpt_target(t);
    int committed = ckpt_async_poll(&t->async, &to, err);
    if (committed < 0) return -1;
    if (committed) t->ckpt_write_s = t->async.written_s;
    return 0;
}

int train_save_due_by_time(struct trainer *t, struct plait_error *err)
{
    const struct plan_checkpoint *c = &t->plan->checkpoint;
    if (c->every > 0 || c->every_minutes <= 0) return 0;
    int due = t->where->rank == 0 && prof_now() - t->saved_at_s >= 60.0 * c->every_minutes;
    if (t->multi && parallel_max_int(&t->par, &due, err)) return -1;
    return due;
}

int train_save_failing(struct trainer *t, struct plait_error *err)
{
    if (t->multi) return -1; /* a checkpoint takes every rank, and the others are elsewhere */
    struct plait_error why = *err, save_err;
    if (train_save(t, false, &save_err))
        return error_set(err, "%s; the checkpoint of the work so far failed too: %s", why.text,
                         save_err.text);
    return error_set(err,
                     "%s; the work so far is in a checkpoint (step %d%s): fix the data and "
                     "run again to resume from there",
                     why.text, t->st.step,
                     t->st.eval_pending ? ", before its evaluation"
                     : t->st.micro      ? ", mid-step"
                                        : "");
}
