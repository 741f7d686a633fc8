/* train_setup.c — one rank's training run as it starts: the layout checked,
 * the device and the other ranks, the run directory, the pipeline schedule,
 * the model shard and what a step needs beside it, the state (the newest
 * checkpoint's, or fresh weights), the data, the developer's switches; and
 * as it ends, all of it given back. The loop is train.c's. */
#include "common/formats/hf_model.h"
#include "runtime/train_setup.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/place/cost.h" // defines: cost_stage_part
#include "common/place/env.h"
#include "common/place/gpu.h"        // defines: gpu_flops_per_token
#include "common/place/rank_order.h" // defines: rank_shard_of, rank_replica_of
#include "kernels/ops.h"             // defines: ops_cpu
#include "runtime/ckpt.h"
#include "runtime/ckpt_parts.h"
#include "runtime/ckpt_resume.h" // defines: ckpt_load_latest, ckpt_parts_load
#include "runtime/device.h"
#include "runtime/gpt2.h"
#include "runtime/lanes.h"
#include "runtime/model_moe.h" // defines: moe_ep_lane_enter
#include "runtime/profile.h"   // defines: prof_now
#include "runtime/report.h"
#include "runtime/run_dir.h"

/* The layout the launcher gave this rank must be the plan's ("auto" is
 * whatever the launcher chose); this runtime trains it on one rank so far. */
static int check_layout(const struct plan *p, const struct env_rank *where, struct plait_error *err)
{
    const struct {
        const char *name;
        int plan, env;
    } d[] = {{"tp", p->parallel.tp, where->tp},
             {"cp", p->parallel.cp, where->cp},
             {"pp", p->parallel.pp, where->pp},
             {"dp", p->parallel.dp, where->dp / where->cp}}; /* (where's dp is dp·cp) */
    for (size_t k = 0; k < sizeof d / sizeof d[0]; k++)
        if (d[k].plan != PLAN_AUTO && d[k].plan != d[k].env)
            return error_set(err,
                             "%s: parallel.%s is %d, but the launcher started this rank in a "
                             "layout with %s %d (PLAIT_%c%c)",
                             p->source, d[k].name, d[k].plan, d[k].name, d[k].env,
                             d[k].name[0] - 32, d[k].name[1] - 32);
    const struct plan_parallel *par = &p->parallel;
    if (par->sequence_parallel && where->tp == 1)
        return error_set(err,
                         "%s: parallel.sequence_parallel needs tensor parallelism, but the "
                         "launcher chose tp 1 for parallel.tp \"auto\" (set parallel.tp)",
                         p->source);
    return 0;
}

/* Initialised from the seed: this rank's shard alone (ZeRO 3: its slice of
 * it), never the whole model in memory; on the CPU backend straight into the
 * model's weights (its memory is the host's), else through a host copy. */
static int seeded_weights(struct trainer *t, struct plait_error *err)
{
    struct model *m = &t->m;
    bool z3 = m->zero == 3, direct = m->ops == ops_cpu();
    size_t P = m->shard.total, lo = z3 ? m->slice_at : 0, hi = z3 ? m->slice_at + m->slice_n : P;
    size_t held = z3 ? m->slice_n : m->n_padded; /* the weights' buffer */
    if (hi > P) hi = P > lo ? P : lo;            /* the padding past the shard: zeros */
    float *buf = direct ? m->params : malloc((hi - lo) * sizeof(float) + 1);
    if (!buf) return error_set(err, "out of memory for %zu parameters", hi - lo);
    int rc = gpt2_init_shard_range(&m->shard, lo, hi, buf, t->plan->model.seed, err);
    if (rc == 0 && direct) {
        memset(buf + (hi - lo), 0, (held - (hi - lo)) * sizeof(float));
        model_refresh_bf16(m);
        model_refresh_fp8(m);
    } else if (rc == 0) {
        if (z3)
            model_set_param_slice(m, buf, hi - lo);
        else
            model_set_params(m, buf);
    }
    if (!direct) free(buf);
    return rc;
}

/* The whole model in llm.c order from model.init, then this rank's shard of
 * it; or initialised from the seed (seeded_weights). */
static int init_weights(struct trainer *t, struct plait_error *err)
{
    const struct plan_model *pm = &t->plan->model;
    if (!pm->init) return seeded_weights(t, err);
    struct gpt2_layout full_layout;
    gpt2_layout(&t->m.cfg, &full_layout); /* addressable: the plan checked it */
    float *full = malloc(full_layout.total * sizeof(float));
    float *shard = malloc(t->m.shard.total * sizeof(float));
    int rc = 0;
    if (!full || !shard) {
        rc = error_set(err, "out of memory for %zu parameters", full_layout.total);
    } else if (hf_is_model_dir(pm->init) ? hf_model_read(pm->init, &t->m.cfg, full, err)
                                         : gpt2_read_llmc(pm->init, &t->m.cfg, full, NULL, err)) {
        rc = error_prefix(err, "model.init: ");
    }
    if (rc == 0) {
        gpt2_shard_copy(&t->m.shard, full, shard, true);
        model_set_params(&t->m, shard);
    }
    free(full);
    free(shard);
    return rc;
}

/* This rank's device and the other ranks: the launcher's layout checked
 * against the plan, the op backend, the collectives' backend, the
 * communicators. */
static int connect_ranks(struct trainer *t, struct plait_error *err)
{
    const struct plan *p = t->plan;
    const struct env_rank *w = t->where;
    if (check_layout(p, w, err)) return -1;
    if (!(t->ops = device_open(p, w, &t->ctx, t->device_note, sizeof t->device_note, err)))
        return -1;
    struct parallel_device dev = {.ops = t->ops, .ctx = t->ctx};
    if (device_comm_backend(p, w, t->ops, &dev.backend, err)) return -1;
    /* ZeRO's slices over a shard group's cp ranks too (the folded dp: parallel_fold) */
    int shard = plan_dp_shard(&p->parallel, w->dp / w->cp) * w->cp;
    if (parallel_init(&t->par, w, shard, p->parallel.ep, p->parallel.timeout_s, &dev, err))
        return -1;
    t->par_ready = true;
    return schedule_moe_lanes(p, w->pp, NULL) ? parallel_ep_lane(&t->par, err) : 0;
}

/* DualPipeV with experts over ep ranks: each pair of its main steps in two lanes, the
 * experts' all-to-all of one moving while the other computes (runtime/lanes.h), said once
 * (on a GPU both lanes issue to the rank's stream in turn, the second lane's thread bound to
 * its device); one pass after the other where schedule_moe_lanes says why, or with
 * PLAIT_DEBUG_NO_MOE_OVERLAP=1 (the second lane's memory is held all the same: the plan
 * decides it, as plait check predicts). */
static int open_lanes(struct trainer *t, struct plait_error *err)
{
    const char *serial = getenv(PLAIT_ENV_DEBUG_NO_MOE_OVERLAP), *why = NULL;
    bool pairs = schedule_moe_lanes(t->plan, t->where->pp, &why);
    if (pairs && serial && !strcmp(serial, "1")) why = PLAIT_ENV_DEBUG_NO_MOE_OVERLAP "=1";
    if (pairs && !why && !(t->m.lanes = lanes_open(moe_ep_lane_enter, &t->m, err))) return -1;
    if (t->where->rank == 0 && t->m.lanes)
        log_info("DualPipeV with experts: each pair's forward and backward run as two lanes, "
                 "the all-to-all of one moving while the other computes");
    else if (t->where->rank == 0 && why)
        log_info("DualPipeV with experts: each pair's forward and backward run one after the "
                 "other (%s)",
                 why);
    return 0;
}

/* The pipeline schedule of a step, and its bubble simulated as plait check
 * does (pp > 1). */
static int make_schedule(struct trainer *t, struct plait_error *err)
{
    if (schedule_make_for_plan(&t->sched, t->plan, t->where->pp, err)) return -1;
    t->sched_ready = true;
    struct sched_sim sim;
    if (schedule_simulate_textbook(&t->sched, &sim, err)) return -1;
    t->bubble_sim = t->where->pp > 1 ? sim.bubble : -1;
    return 0;
}

/* Whether a developer switch of common/place/env.h is "1". */
static bool debug_on(const char *name)
{
    const char *v = getenv(name);
    return v && !strcmp(v, "1");
}

/* Where the optimizer's state goes (parallel.offload), said once: on a GPU rank the step
 * runs on the CPU with the state in host memory ("host") or the moments in files ("nvme"),
 * runtime/host_step.h (so does a CPU rank under PLAIT_DEBUG_HOST_STEP=1); on a CPU rank
 * "nvme" moves the moments to files and "host" changes nothing. */
static bool offload_says(const struct trainer *t)
{
    const struct plan_parallel *par = &t->plan->parallel;
    bool host_step = par->offload != PLAN_OFFLOAD_NONE &&
                     (t->ops != ops_cpu() || debug_on(PLAIT_ENV_DEBUG_HOST_STEP));
    if (t->where->rank != 0) return host_step;
    if (host_step)
        log_info("parallel.offload \"%s\": the optimizer steps on the CPU, the slice's fp32 "
                 "master weights, its gradient and %s in host memory; the device keeps no "
                 "optimizer state",
                 plan_offload_name(par->offload),
                 par->offload == PLAN_OFFLOAD_HOST ? "the AdamW moments"
                                                   : "two windows of each AdamW moment (the "
                                                     "moments in files)");
    else if (par->offload == PLAN_OFFLOAD_HOST)
        log_info("parallel.offload \"host\": on CPU ranks the optimizer state is in host memory "
                 "already; nothing moves");
    return host_step;
}

/* This rank's model shard: its stage's layers, its tp part, room for the
 * micro-batches its stage holds at once. */
static int make_model(struct trainer *t, struct plait_error *err)
{
    const struct plan *p = t->plan;
    const struct env_rank *w = t->where;
    struct gpt2_config cfg = gpt2_config_of_plan(&p->model);
    struct gpt2_part part = cost_stage_part(p, w->tp, w->tp_rank, w->pp, w->pp_rank);
    part.ep_rank = rank_shard_of(w->dp_rank, p->parallel.ep); /* dp's inner factor */
    /* ZeRO's slices: over the shard group (HSDP), or with expert parallelism over the
     * expert peers in it (plan_zero_slices); the ranks beside those hold the same slice
     * (of the dense part at least), its replicas: the ep ranks, then the shard groups */
    int S = t->par.dp_shard, slices = plan_zero_slices(&p->parallel, S), in = S / slices,
        shard_rank = rank_shard_of(w->dp_rank, S);
    struct model_shape shape = {
        .B = p->batch.micro_batch,
        .T = t->T,
        .cp = w->cp,
        .cp_rank = w->cp_rank,
        .cp_group = &t->par.g_cp,
        .ep_group = &t->par.g_ep,
        .ep_lane_group = t->par.ep_lane_comm ? &t->par.g_ep_lane : NULL,
        .precision = p->precision,
        .fp8_scaling = p->fp8_scaling,
        .recompute = p->recompute,
        .slots = schedule_max_in_flight(&t->sched, w->pp_rank),
        .dp = slices,
        .dp_rank = shard_rank / in,
        .replicas = w->dp / slices,
        .replica = shard_rank % in + in * rank_replica_of(w->dp_rank, S),
        .zero = p->parallel.zero,
        .dp_group = parallel_slices(&t->par, p->parallel.zero),
        .keep_gathered = !p->parallel.reshard_after_forward,
        .split_backward = t->sched.split_backward,
        .sequence_parallel = p->parallel.sequence_parallel,
        .offload_dir = p->parallel.offload == PLAN_OFFLOAD_NVME ? p->parallel.offload_dir : NULL,
        .offload_rank = w->rank,
        .offload_window_mb = p->parallel.offload_window_mb,
        .logits_chunk_mb = p->logits_chunk_mb,
        .host_step = offload_says(t),
        .activations_f32 = debug_on(PLAIT_ENV_DEBUG_ACTIVATIONS_F32),
        .moe_capacity_factor = p->model.moe.capacity_factor,
        .moe_aux_loss = p->model.moe.aux_loss,
        .moe_z_loss = p->model.moe.router_z_loss};
    t->rss_before_model = report_proc_status_bytes("VmRSS");
    if (model_init(&t->m, &cfg, &part, &t->par.g_tp, t->ops, t->ctx, &shape, err)) return -1;
    t->model_ready = true;
    if (t->m.attention_bf16 && w->rank == 0) log_info("attention on the bf16 tensor cores");
    if (t->m.logits_rows && w->rank == 0) /* other ranks' logs are quiet */
        log_info("logits_chunk_mb %g: the logits %d row(s) at a time, the LM head's gradients made "
                 "as they go",
                 p->logits_chunk_mb, t->m.logits_rows);
    if (p->parallel.ep > 1 && p->parallel.zero > 0 && t->m.zero == 0 && w->rank == 0)
        log_info("parallel.zero %d with parallel.ep %d: a shard group's expert peers are one "
                 "rank each (its dp_shard × cp ranks = ep), so nothing is sliced; the gradients "
                 "are summed as at ZeRO 0",
                 p->parallel.zero, p->parallel.ep);
    return 0;
}

/* What a step needs beside the model: the gradients' buckets (dp > 1, where
 * the collectives can run during backward), the background checkpoint's
 * room, a micro-batch's tokens and targets. */
static int make_step_buffers(struct trainer *t, struct plait_error *err)
{
    const struct plan *p = t->plan;
    int B = p->batch.micro_batch, T = p->model.seq_len;
    /* (ZeRO 3 reduce-scatters each unit's gradients itself: runtime/model_zero3.h) */
    const struct group *dp = parallel_slices(&t->par, t->m.zero); /* ZeRO 0: the shard group */
    if (dp->size > 1 && dp->iallreduce && t->m.zero < 3 &&
        (t->m.zero == 0 || dp->ireduce_scatter_v)) {
        if (buckets_init(&t->buckets, &t->m, dp, &t->par.g_experts, p->parallel.bucket_mb, err))
            return -1;
        t->bucketed = true;
    }
    /* the offloaded step's gradient down before the step where it is final there: at dp 1
     * (ZeRO 0 whole, its buffer the slice) during the last backward as the model reports
     * its layers final; at dp > 1 (ZeRO 0 to 2) its layers as their buckets' sums arrive
     * (polled during backward, else waited for after it). Not where a sum follows those:
     * over the replicas, over tp (sequence parallelism's LayerNorms), a slice's dense part
     * over ep; nor at ZeRO 3 (each unit reduce-scattered into the slice as the pass goes,
     * runtime/model_zero3.h), nor with PLAIT_DEBUG_NO_OFFLOAD_OVERLAP=1: at the step */
    t->grads_early = t->m.host_step && ((t->m.zero == 0 && dp->size == 1) || t->bucketed) &&
                     t->par.g_replicas.size == 1 && !t->m.sp && t->m.shard.part.ep <= 1 &&
                     !debug_on(PLAIT_ENV_DEBUG_NO_OFFLOAD_OVERLAP);
    if (p->checkpoint.async && ckpt_async_reserve(&t->async, &t->m, err)) return -1;
    t->flops_per_token = gpu_flops_per_token(&t->m.cfg, T);
    t->inputs = malloc((size_t)B * T * sizeof *t->inputs);
    t->targets = malloc((size_t)B * T * sizeof *t->targets);
    if (!t->inputs || !t->targets) return error_set(err, "out of memory");
    if (t->where->cp > 1 && (!(t->whole_tokens = malloc((size_t)B * T * sizeof(int32_t))) ||
                             !(t->whole_targets = malloc((size_t)B * T * sizeof(int32_t)))))
        return error_set(err, "out of memory");
    return 0;
}

/* A new run's state: the weights (init_weights) and step 0. */
static int fresh_state(struct trainer *t, struct plait_error *err)
{
    if (init_weights(t, err)) return -1;
    ckpt_state_fresh(&t->st, t->plan);
    memcpy(t->sample_rng.s, t->st.sample_rng, sizeof t->sample_rng.s);
    return 0;
}

/* A resumed run's state, loaded from checkpoint `name` (read since load_t0),
 * checked against the plan. */
static int resumed_state(struct trainer *t, const char *name, const char *notes, double load_t0,
                         struct plait_error *err)
{
    const struct plan *p = t->plan;
    log_info("resuming from %s/%s (step %d%s), read in %.2f s", t->ckpt_dir, name, t->st.step,
             t->st.micro ? ", mid-step" : "", prof_now() - load_t0);
    if (*notes) log_info("the plan changed since that checkpoint: %s", notes);
    if (t->st.micro >= p->batch.grad_accum)
        return error_set(err,
                         "checkpoint %s stopped after micro-batch %d of a step, but the "
                         "plan has batch.grad_accum %d",
                         name, t->st.micro, p->batch.grad_accum);
    memcpy(t->sample_rng.s, t->st.sample_rng, sizeof t->sample_rng.s);
    /* a mid-step loss so far is the job's: one rank carries it into the step's sum */
    bool carrier = t->m.last && t->where->tp_rank == 0 && t->where->dp_rank == 0;
    if (t->multi && !carrier) t->st.loss_sum = 0;
    /* and the routing of a mixture of experts so far, when the checkpoint has it */
    if ((!t->multi || carrier) && gpt2_moe(&t->m.cfg) &&
        t->st.moe_stats_n == MOE_STATS(t->m.cfg.experts))
        memcpy(t->m.moe_stats, t->st.moe_stats, (size_t)t->st.moe_stats_n * sizeof(double));
    return 0;
}

/* The state from the newest checkpoint (every rank's part of it, with
 * several), or a fresh one where there is none; resumed_from: the
 * checkpoint's name, left as it is when none. */
static int resume_or_start(struct trainer *t, char resumed_from[64], struct plait_error *err)
{
    const struct plan *p = t->plan;
    char name[64] = "", notes[1024] = "";
    double load_t0 = prof_now();
    int loaded =
        t->multi ? ckpt_parts_load(t->where->rank == 0 ? &t->ckpts : NULL, t->ckpt_dir, p, &t->m,
                                   &t->st, name, sizeof name, notes, sizeof notes, &t->par, err)
                 : ckpt_load_latest(&t->ckpts, p, &t->m, &t->st, name, sizeof name, notes,
                                    sizeof notes, err);
    if (loaded == CKPT_NOT_THIS_RUN) {
        struct plait_error reason = *err;
        return error_set(err, "%s; %s", reason.text, run_dir_fresh_advice(t));
    }
    if (loaded < 0) return -1;
    if (!loaded) return fresh_state(t, err);
    memcpy(resumed_from, name, sizeof name);
    return resumed_state(t, name, notes, load_t0, err);
}

/* The run's tokenizer (data.tokenizer, or the one beside the shards), for the samples (one
 * rank: they need the whole model). */
static int load_tokenizer(struct trainer *t, struct plait_error *err)
{
    const struct plan *p = t->plan;
    if (tokenizer_open(&t->tok, p, &t->has_tok, err)) return -1;
    if (t->has_tok && t->tok.eot >= t->m.cfg.vocab)
        return error_set(err,
                         "data.tokenizer: %s: its end-of-text token %d is not below "
                         "model.vocab %d (a tokenizer of another model?)",
                         p->data.tokenizer ? p->data.tokenizer : "the tokenizer beside data.train",
                         t->tok.eot, t->m.cfg.vocab);
    return 0;
}

/* The data: read by the pipeline's ends (tokens first, targets last), the
 * training data at the state's position; and the tokenizer. */
static int open_data(struct trainer *t, struct plait_error *err)
{
    const struct plan *p = t->plan;
    int B = p->batch.micro_batch, T = p->model.seq_len, vocab = t->m.cfg.vocab;
    t->reads_data = t->m.first || t->m.last;
    if (t->reads_data) {
        if (data_open(&t->train, p->data.train, B, T, vocab, p->data.shuffle, p->model.seed, err))
            return error_prefix(err, "data.train: ");
        if (data_seek(&t->train, &t->st.data, err)) return error_prefix(err, "data.train: ");
    }
    if (p->data.val && t->reads_data) {
        if (data_open(&t->val, p->data.val, B, T, vocab, false, 0, err))
            return error_prefix(err, "data.val: ");
    }
    t->has_val = p->data.val != NULL;
    return !t->multi && (p->data.tokenizer || p->sample.tokens > 0) ? load_tokenizer(t, err) : 0;
}

/* The developer's switches: PLAIT_DUMP_STEP1, and the faults tests inject
 * (a stop signal after N micro-batches, a slow rank). */
static int read_debug_switches(struct trainer *t, struct plait_error *err)
{
    const struct plan *p = t->plan;
    t->dump_dir = getenv(PLAIT_ENV_DUMP_STEP1);
    t->dump_step = t->st.step; /* 0 in a new run; a resumed one dumps its first step */
    size_t BT = (size_t)p->batch.micro_batch * p->model.seq_len;
    if (t->dump_dir && !(t->dump_tokens = calloc(BT, sizeof *t->dump_tokens)))
        return error_set(err, "out of memory");
    const char *inject = getenv(PLAIT_ENV_DEBUG_SIGNAL_AFTER_MICRO);
    int signal_rank;
    long after;
    if (inject && sscanf(inject, "%d:%ld", &signal_rank, &after) == 2) /* RANK:N, one rank */
        t->signal_after_micro = signal_rank == t->where->rank ? after : 0;
    else
        t->signal_after_micro = inject ? atol(inject) : 0;
    int slow_rank;
    double slow_ms;
    inject = getenv(PLAIT_ENV_DEBUG_SLOW_RANK);
    if (inject && sscanf(inject, "%d:%lf", &slow_rank, &slow_ms) == 2 &&
        slow_rank == t->where->rank)
        t->slow_read_s = slow_ms / 1e3;
    inject = getenv(PLAIT_ENV_DEBUG_NO_PREFETCH);
    t->m.z3_no_prefetch = inject && !strcmp(inject, "1");
    inject = getenv(PLAIT_ENV_DEBUG_NO_RING_OVERLAP);
    t->m.cp_serial = inject && !strcmp(inject, "1");
    return 0;
}

int train_setup(struct trainer *t, struct plait_error *err)
{
    char resumed_from[64] = "";
    t->multi = t->where->world > 1;
    if (connect_ranks(t, err) || run_dir_open(t, err) || make_schedule(t, err)) return -1;
    report_measure_cpu_early(t);
    if (make_model(t, err) || make_step_buffers(t, err) || resume_or_start(t, resumed_from, err) ||
        open_data(t, err) || read_debug_switches(t, err) || open_lanes(t, err))
        return -1;
    report_measure_peak(t);
    /* a run that trained all its steps already is only told so: its files stay as they are */
    bool finished = t->st.step >= t->plan->steps;
    return t->where->rank == 0 && !finished ? report_open(t, resumed_from, err) : 0;
}

void train_teardown(struct trainer *t)
{
    lanes_close(t->m.lanes); /* idle between pairs: nothing of it in flight */
    t->m.lanes = NULL;
    runjson_free(&t->run);
    ckpt_async_free(&t->async); /* after a failure: its writer joined, nothing committed */
    if (t->bucketed) buckets_free(&t->buckets);
    if (t->sched_ready) schedule_free(&t->sched);
    if (t->par_ready) parallel_free(&t->par);
    metrics_close(&t->metrics);
    if (t->ckpts_open) ckptdir_close(&t->ckpts);
    runlock_release(&t->ckpt_lock);
    runlock_release(&t->run_lock);
    if (t->has_tok) tokenizer_free(&t->tok);
    data_close(&t->val);
    data_close(&t->train);
    if (t->model_ready) model_free(&t->m);
    if (t->ctx) t->ops->close(t->ctx); /* after the model and the collectives that used it */
    t->ctx = NULL;
    free(t->inputs);
    free(t->targets);
    free(t->whole_tokens);
    free(t->whole_targets);
    free(t->dump_tokens);
}
