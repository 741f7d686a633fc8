/* report.c — what one rank's training run says: the lines it opens with, a
 * step's figures (gathered from every rank) into metrics.jsonl and the
 * progress line, the evaluation's, run.json (machine, memory, modelled and
 * measured speed) and the summary it ends with. Not the training itself
 * (train.c) nor the files' formats (common/formats/). */
#include "runtime/report.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/formats/ckpt_state.h" // defines: MOE_STATS
#include "common/formats/rundir.h"
#include "common/gpt2/gpt2_layout.h"
#include "common/formats/runjson.h"
#include "common/log.h"
#include "common/place/cost.h"
#include "common/place/gpu.h" // defines: gpu_mfu
#include "common/place/layout.h"
#include "kernels/cpu/cpu_rate.h" // defines: cpu_rate_measure, what plait check measures too
#include "runtime/console.h"
#include "runtime/device.h" // defines: device_peak_gflops, device_gpu_peak_tflops
#include "runtime/host_step.h"
#include "runtime/model_moe.h" // defines: model_moe_stats_clear
#include "runtime/profile.h" // defines: prof_now
#include "runtime/train_batches.h" // defines: train_moe_stats

/* How bf16 products run when they are not native (one line), or NULL. */
static const char *bf16_emulation(const struct trainer *t)
{
    if (t->plan->precision != PLAN_PRECISION_BF16 || !t->m.ops->bf16_emulation) return NULL;
    return t->m.ops->bf16_emulation(t->m.ctx);
}

/* Tokens a second over this process's timed steps (its first warms up), 0
 * before any. */
static double measured_tokens_per_s(const struct trainer *t)
{
    const struct plan *p = t->plan;
    if (t->m.prof.steps == 0 || t->timed_s <= 0) return 0;
    return (double)p->batch.micro_batch * t->T * p->batch.grad_accum * t->where->dp *
           t->m.prof.steps / t->timed_s;
}

/* The machine this rank runs on, for run.json. */
static void machine_of(const struct trainer *t, struct run_machine *m)
{
    memset(m, 0, sizeof *m);
    snprintf(m->hostname, sizeof m->hostname, "?");
    snprintf(m->cpu, sizeof m->cpu, "?");
    gethostname(m->hostname, sizeof m->hostname - 1);
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) == 0 && colon) {
            snprintf(m->cpu, sizeof m->cpu, "%s", colon + 2);
            m->cpu[strcspn(m->cpu, "\n")] = '\0';
            break;
        }
    }
    if (f) fclose(f);
    m->cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    m->threads = omp_get_max_threads();
    snprintf(m->backend, sizeof m->backend, "%s", t->m.ops->name);
    m->peak_gflops = t->peak_gflops;
    const char *emulation = bf16_emulation(t);
    snprintf(m->bf16_emulation, sizeof m->bf16_emulation, "%s", emulation ? emulation : "");
}

/* run.json, rewritten whole each time: the run as it started; once this
 * process has taken a step, memory (memory_report); and plait check's modelled
 * tokens/s beside the measured (null until a timed step). */
static int write_run_json(struct trainer *t, struct plait_error *err)
{
    struct run_record *r = &t->run;
    machine_of(t, &r->machine);
    r->parameters = (int64_t)t->m.shard.total;
    r->activation_bytes = (int64_t)t->m.allocated.activations;
    r->measured_tokens_per_s = measured_tokens_per_s(t);
    r->has_checkpoint = t->ckpt_write_s > 0;
    r->checkpoint_async = t->plan->checkpoint.async;
    r->checkpoint_write_s = t->ckpt_write_s;
    r->checkpoint_stall_s = t->ckpt_stall_s;
    return runjson_write(t->run_dir, r, err);
}

double report_proc_status_bytes(const char *field)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    size_t n = strlen(field);
    double kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, field, n) && line[n] == ':' && sscanf(line + n + 1, "%lf kB", &kb) == 1)
            break;
    if (f) fclose(f);
    return kb * 1024;
}

/* Every rank's device memory into run.json, after this process's first step
 * (by then every buffer has been written, so the resident set holds them):
 * what plait check predicts for its stage (cost_memory_stage), what its
 * model_init allocated (counted), and its peak resident set. Collective. */
static int memory_report(struct trainer *t, int step, struct plait_error *err)
{
    enum { K = 13 };
    const struct env_rank *w = t->where;
    const struct model_bytes *a = &t->m.allocated;
    double mine[K] = {w->tp_rank,
                      w->pp_rank,
                      rank_data_of(w->dp_rank, w->cp),
                      (double)a->params,
                      (double)a->grads,
                      (double)a->optimizer,
                      (double)a->activations,
                      report_proc_status_bytes("VmHWM"),
                      t->rss_before_model,
                      w->cp_rank,
                      t->m.host_step ? (double)t->m.host_step->bytes : -1,
                      -1,
                      (double)t->m.scratch_bytes};
    uint64_t used = 0, total = 0;
    if (t->m.ops->memory_in_use) {
        t->m.ops->memory_in_use(t->m.ctx, &used, &total);
        mine[11] = total ? (double)used : -1;
    }
    int n = w->world;
    double *all = malloc((size_t)n * K * sizeof *all);
    if (!all) return error_set(err, "out of memory");
    if (parallel_gather(&t->par, mine, K, all, err)) {
        free(all);
        return -1;
    }
    if (w->rank != 0) {
        free(all);
        return 0;
    }
    struct run_rank_memory *ranks = calloc((size_t)n, sizeof *ranks);
    if (!ranks) {
        free(all);
        return error_set(err, "out of memory");
    }
    struct cost_layout l = {w->tp, w->pp, w->dp / w->cp}; /* (the plan's dp: where's is dp·cp) */
    bool on_cpu = strcmp(t->m.ops->name, "cpu") == 0;
    /* the plan with the device it ran on (a GPU's attention keeps no probabilities) */
    struct plan as_run = *t->plan;
    as_run.parallel.device = on_cpu ? PLAN_DEVICE_CPU : PLAN_DEVICE_CUDA;
    for (int r = 0; r < n; r++) {
        const double *v = all + (size_t)r * K;
        struct cost_memory c;
        cost_memory_stage(&as_run, l, (int)v[1], &c);
        ranks[r] = (struct run_rank_memory){
            .rank = r,
            .tp = (int)v[0],
            .pp = (int)v[1],
            .dp = (int)v[2],
            .predicted = {(int64_t)c.params, (int64_t)c.grads, (int64_t)c.optimizer,
                          (int64_t)c.activations, -1, c.host ? (int64_t)c.host : -1,
                          (int64_t)c.scratch, (int64_t)c.cuda_context},
            .allocated = {(int64_t)v[3], (int64_t)v[4], (int64_t)v[5], (int64_t)v[6], -1,
                          (int64_t)v[10], (int64_t)v[12], 0},
            .rss_peak_bytes = (int64_t)v[7],
            .rss_before_model_bytes = (int64_t)v[8],
            .cp = (int)v[9],
            .device_used_bytes = (int64_t)v[11]};
        if (on_cpu && n > 1) /* host memory beside the model's: the socket backend's rings */
            ranks[r].predicted.comm_rings = (int64_t)cost_comm_ring_bytes(t->plan, l, (int)v[1]);
    }
    free(all);
    free(t->run.ranks);
    t->run.ranks = ranks;
    t->run.n_ranks = n;
    t->run.cp = w->cp;
    t->run.memory_after_step = step;
    return write_run_json(t, err);
}

/* This rank's CPU rates at the plan's shapes, measured as plait check measures them
 * (kernels/cpu/cpu_rate.h), once: into t->cpu_rate; false (with a warning) when they
 * cannot be. */
static bool measure_cpu_rates(struct trainer *t)
{
    const struct plan *p = t->plan;
    if (t->has_cpu_rate) return true;
    struct cpu_rate_shape shape = cpu_rate_shape_of(
        p->batch.micro_batch, p->model.seq_len, p->model.hidden, p->model.heads, p->model.layers,
        p->model.padded_vocab, t->where->tp, t->where->pp, p->precision != PLAN_PRECISION_FP32);
    char why[256];
    if (cpu_rate_measure(&shape, 0, &t->cpu_rate, why, sizeof why)) {
        log_warn("this CPU's rates could not be measured: %s", why);
        return false;
    }
    return t->has_cpu_rate = true;
}

void report_measure_cpu_early(struct trainer *t)
{
    if (t->ops == ops_cpu() && !getenv(PLAIT_ENV_PEAK_GFLOPS)) measure_cpu_rates(t);
}

void report_measure_peak(struct trainer *t)
{
    const char *env = getenv(PLAIT_ENV_PEAK_GFLOPS);
    t->gpu_peak_tflops = device_gpu_peak_tflops(&t->m, t->where->device, t->plan->precision);
    if (env && atof(env) > 0) {
        t->peak_gflops = atof(env);
        t->peak_source = PLAIT_ENV_PEAK_GFLOPS;
    } else if (t->gpu_peak_tflops > 0) {
        t->peak_gflops = 1e3 * t->gpu_peak_tflops;
        t->peak_source = "the GPU's datasheet";
    } else if (t->m.ops == ops_cpu() && measure_cpu_rates(t)) {
        t->peak_gflops = t->cpu_rate.matmul_gflops * t->cpu_rate.cpus;
        t->peak_source = "products measured at start";
    } else {
        t->peak_gflops = device_peak_gflops(&t->m);
        t->peak_source = "a product measured at start";
    }
}

/* plait check's modelled tokens/s for this run here (run.json, plait status):
 * on the CPU from this rank's CPU rates (measure_cpu_rates); 0 when it cannot tell. */
static double modelled_tokens_per_s(struct trainer *t)
{
    const struct plan *p = t->plan;
    if (t->m.ops != ops_cpu()) return layout_modelled_tokens_per_s(p, NULL);
    if (!measure_cpu_rates(t)) {
        log_warn("no modelled speed in run.json");
        return 0;
    }
    const struct cpu_rate r = t->cpu_rate;
    struct cost_cpu_rates rates = {r.matmul_gflops, r.attention_gflops, r.activation_gbps,
                                   r.memory_gbps,   r.parallel_op_us,   omp_get_max_threads()};
    double modelled = layout_modelled_tokens_per_s(p, &rates);
    log_info("the cost model's CPU rates at this plan's shapes, per CPU on %d (measured in "
             "%.2f s): products %.0f GFLOP/s, attention %.0f GFLOP/s, layer ops %.1f GB/s, "
             "parameter pass %.1f GB/s, %.1f µs to start an op: %.0f tokens/s modelled",
             r.cpus, r.seconds, r.matmul_gflops, r.attention_gflops, r.activation_gbps,
             r.memory_gbps, r.parallel_op_us, modelled);
    return modelled;
}

static double median_of(double *times, int n);

/* The median step time (s) of the last (up to 50) steps a resumed run's metrics keep, 0 when
 * none: until this process has a step of its own timed (its first warms up), the ETA's. */
static double prior_step_s(const struct trainer *t)
{
    struct metrics_series series;
    struct plait_error why;
    if (metrics_read(t->run_dir, &series, &why)) return 0;
    enum { LAST = 50 };
    double ms[LAST], median = 0;
    int n = 0;
    for (int i = series.n_steps - 1; i >= 0 && n < LAST; i--)
        if (series.steps[i].step <= t->st.step && series.steps[i].ms > 0) ms[n++] = series.steps[i].ms;
    if (n) median = median_of(ms, n) / 1e3;
    metrics_series_free(&series);
    return median;
}

int report_open(struct trainer *t, const char *resumed_from, struct plait_error *err)
{
    t->prior_step_s = t->st.step > 0 ? prior_step_s(t) : 0;
    if (rundir_plan_write(t->run_dir, t->plan_json, err)) return -1;
    if (metrics_open(&t->metrics, t->run_dir, t->st.step, err)) return -1;
    if (t->plan->train.tensorboard && metrics_tensorboard(&t->metrics, t->run_dir,
                                                          t->plan->train.tensorboard, t->st.step, err))
        return -1;
    if (console_mode == CONSOLE_JSON) t->metrics.echo = stdout; /* plait train --json */
    struct run_record *run = &t->run;
    snprintf(run->version, sizeof run->version, "%s", PLAIT_VERSION);
    time_t now = time(NULL);
    strftime(run->started, sizeof run->started, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    snprintf(run->resumed_from, sizeof run->resumed_from, "%s", resumed_from);
    if (!(run->plan_json = strdup(t->plan_json))) return error_set(err, "out of memory");
    run->modelled_tokens_per_s = modelled_tokens_per_s(t);
    return write_run_json(t, err);
}

void report_start(const struct trainer *t)
{
    const struct plan *plan = t->plan;
    const struct env_rank *where = t->where;
    /* the model's parameters (padding of the vocabulary included), not this rank's part */
    /* why not a GPU: after the data opened (a run that fails on its data says that alone),
       once (rank 0's) */
    if (*t->device_note && where->rank == 0) log_info("%s", t->device_note);
    struct gpt2_layout whole;
    size_t params = gpt2_layout(&t->m.cfg, &whole) == 0 ? whole.total : t->m.shard.total;
    log_info("%s of %zu parameters, %d layers, hidden %d, %s, micro-batch %d×%d, %d step%s of "
             "%d micro-batch%s, %d thread%s, %.0f GFLOP/s peak (%s: \"%% of peak\"'s), "
             "activations %.1f MB (recompute %s)",
             t->m.cfg.llama ? "Llama" : "GPT-2", params, plan->model.layers, plan->model.hidden,
             plan_precision_name(plan->precision), plan->batch.micro_batch, plan->model.seq_len,
             plan->steps, plan->steps == 1 ? "" : "s", plan->batch.grad_accum,
             plan->batch.grad_accum == 1 ? "" : "es", omp_get_max_threads(),
             omp_get_max_threads() == 1 ? "" : "s", t->peak_gflops, t->peak_source,
             t->m.allocated.activations / 1e6, plan_recompute_name(plan->recompute));
    int data_dp = where->dp / where->cp; /* (where's dp is dp·cp) */
    char cp[32] = "";
    if (where->cp > 1) snprintf(cp, sizeof cp, " × cp %d", where->cp);
    if (t->multi)
        log_info("tp %d%s × pp %d × dp %d = %d ranks (%s schedule%s%s): a global batch of %d "
                 "micro-batch%s × %d sequence%s × %d tokens per step",
                 where->tp, cp, where->pp, data_dp, where->world,
                 plan_pipeline_name(plan->parallel.schedule), plan->parallel.zero ? ", ZeRO" : "",
                 plan->parallel.sequence_parallel ? ", sequence parallel" : "",
                 plan->batch.grad_accum * data_dp,
                 plan->batch.grad_accum * data_dp == 1 ? "" : "es", plan->batch.micro_batch,
                 plan->batch.micro_batch == 1 ? "" : "s", plan->model.seq_len);
    if (bf16_emulation(t) && where->rank == 0) log_warn("%s", bf16_emulation(t));
    if (plan->precision == PLAN_PRECISION_FP8 && strcmp(t->m.ops->name, "cpu") == 0 &&
        where->rank == 0)
        log_info("fp8 matrix products emulated on the CPU: operands quantised to fp8 "
                 "(kernels/fp8.h, %s scaling) and multiplied in fp32: fp8's numerics, below "
                 "fp32's speed",
                 plan_fp8_scaling_name(plan->fp8_scaling));
}

/* The figures of a step each rank sends rank 0 (step_figures' order), and
 * where its own work is among them. */
enum { STEP_FIGURES = 15, OWN_WORK = 7 };

/* This rank's figures of the step that took dt seconds: its time; its seconds
 * computing, in collectives and idle; the bytes it sent by tp, pp (with the
 * ends') and dp; its own work; the seconds blocked in tp, pp and dp; the bytes
 * and seconds of context parallelism's ring, and of expert parallelism's all-to-alls. */
static void step_figures(struct trainer *t, double dt, const double bytes0[PAR_NCOMM],
                         const double wait0[PAR_NCOMM], double mine[STEP_FIGURES])
{
    double bytes[PAR_NCOMM], wait[PAR_NCOMM], d[PAR_NCOMM];
    parallel_comm_totals(&t->par, bytes, wait);
    for (int i = 0; i < PAR_NCOMM; i++) d[i] = bytes[i] - bytes0[i];
    const struct pipe_times *pt = &t->times;
    /* waits inside a pass: tensor parallelism's, context parallelism's ring, the experts' */
    double tp_wait = wait[PAR_TP] - wait0[PAR_TP], cp_wait = wait[PAR_CP] - wait0[PAR_CP];
    double ep_wait = wait[PAR_EP] - wait0[PAR_EP];
    double inside = tp_wait + cp_wait + ep_wait; /* (counted in the passes' compute time) */
    double coll = inside + (wait[PAR_DP] - wait0[PAR_DP]) + (wait[PAR_ENDS] - wait0[PAR_ENDS]) +
                  (wait[PAR_WORLD] - wait0[PAR_WORLD]) + pt->send_s;
    double figures[STEP_FIGURES] = {dt, pt->compute_s - inside, coll, pt->idle_s, d[PAR_TP],
                                    d[PAR_PP] + d[PAR_ENDS], d[PAR_DP],
                                    /* this rank's own work: computing and reading its data */
                                    pt->compute_s - inside + pt->data_s,
                                    /* blocked in each communicator (the pipeline's: its receives,
                                       the bubble among them, and its ends' sum) */
                                    tp_wait,
                                    wait[PAR_PP] - wait0[PAR_PP] + wait[PAR_ENDS] - wait0[PAR_ENDS],
                                    wait[PAR_DP] - wait0[PAR_DP], d[PAR_CP], cp_wait,
                                    d[PAR_EP], ep_wait};
    memcpy(mine, figures, sizeof figures);
}

/* The median of n times, sorting them (insertion sort: a few ranks). */
static double median_of(double *times, int n)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && times[j - 1] > times[j]; j--) {
            double x = times[j];
            times[j] = times[j - 1];
            times[j - 1] = x;
        }
    return n % 2 ? times[n / 2] : (times[n / 2 - 1] + times[n / 2]) / 2;
}

/* Every rank's figures (all: n × STEP_FIGURES) into the step's: the slowest
 * rank's time, the straggler, the shares averaged over the ranks, and the
 * bytes and waits of the communicators there are. times: room for n. */
static void summarise_ranks(const struct trainer *t, const double *all, double *times, int n,
                            struct step_metrics *sm)
{
    double slowest = 0, share[3] = {0}, sent[3] = {0}, blocked[3] = {0}, ring[2] = {0},
           experts[2] = {0};
    int has[3] = {t->par.tp != NULL, t->par.pp != NULL, t->par.dp != NULL};
    for (int r = 0; r < n; r++) slowest = fmax(slowest, all[(size_t)r * STEP_FIGURES]);
    for (int r = 0; r < n; r++) {
        const double *v = all + (size_t)r * STEP_FIGURES;
        times[r] = v[OWN_WORK];
        if (v[OWN_WORK] > all[(size_t)sm->straggler * STEP_FIGURES + OWN_WORK]) sm->straggler = r;
        for (int k = 0; k < 3; k++) {
            share[k] += v[1 + k] / slowest / n;
            sent[k] += v[4 + k] / n;
            blocked[k] += v[8 + k] / n;
        }
        ring[0] += v[11] / n;
        ring[1] += v[12] / n;
        experts[0] += v[13] / n;
        experts[1] += v[14] / n;
    }
    sm->step_ms = 1e3 * slowest;
    sm->busy_ms = 1e3 * all[(size_t)sm->straggler * STEP_FIGURES + OWN_WORK];
    sm->median_busy_ms = 1e3 * median_of(times, n);
    sm->compute_pct = 100 * share[0];
    sm->comm_pct = 100 * share[1];
    sm->idle_pct = 100 * share[2];
    sm->bytes_tp = has[0] ? sent[0] : 0;
    sm->bytes_pp = has[1] ? sent[1] : 0;
    sm->bytes_dp = has[2] ? sent[2] : 0;
    sm->wait_tp_ms = has[0] ? 1e3 * blocked[0] : 0;
    sm->wait_pp_ms = has[1] ? 1e3 * blocked[1] : 0;
    sm->wait_dp_ms = has[2] ? 1e3 * blocked[2] : 0;
    sm->bytes_cp = t->par.cp ? ring[0] : 0;
    sm->wait_cp_ms = t->par.cp ? 1e3 * ring[1] : 0;
    sm->bytes_ep = t->par.ep_comm ? experts[0] : 0;
    sm->wait_ep_ms = t->par.ep_comm ? 1e3 * experts[1] : 0;
}

/* Every rank's step, to rank 0: the slowest rank's wall time (the step's),
 * the straggler (the rank whose own work, computing and reading data, took
 * longest) against the median, the
 * shares spent computing, in collectives and waiting for a
 * pipeline neighbour, and the bytes each communicator sent (the pipeline's
 * include the tied wte's sum between its ends). */
static int step_report(struct trainer *t, double dt, const double bytes0[PAR_NCOMM],
                       const double wait0[PAR_NCOMM], struct step_metrics *sm,
                       struct plait_error *err)
{
    double mine[STEP_FIGURES];
    step_figures(t, dt, bytes0, wait0, mine);
    int n = t->where->world;
    double *all = malloc((size_t)n * STEP_FIGURES * sizeof *all);
    double *times = malloc((size_t)n * sizeof *times);
    int rc = all && times ? parallel_gather(&t->par, mine, STEP_FIGURES, all, err)
                          : error_set(err, "out of memory");
    if (rc == 0) summarise_ranks(t, all, times, n, sm);
    free(all);
    free(times);
    return rc;
}

/* Mixture of experts: the step's routing summed over the ranks into sm (its load in
 * *buf, the caller's to free), and the model's counts cleared for the next step. */
static int report_moe(struct trainer *t, struct step_metrics *sm, double **buf,
                      struct plait_error *err)
{
    int E = t->m.cfg.experts;
    double *sums = *buf = calloc(MOE_STATS(E), sizeof *sums);
    if (!sums) return error_set(err, "out of memory");
    if (train_moe_stats(t, sums, err)) return -1;
    model_moe_stats_clear(&t->m);
    double micro_batches = (double)t->plan->batch.grad_accum * t->where->dp;
    sm->moe_experts = E;
    sm->moe_balance_loss = sums[MOE_STAT_BALANCE] / micro_batches;
    sm->moe_z_loss = sums[MOE_STAT_Z] / micro_batches;
    sm->moe_dropped = sums[MOE_STAT_DROPPED];
    sm->moe_load = sums + MOE_STAT_ROUTED; /* each expert's choices, then their share */
    for (int e = 0; e < E; e++)
        sm->moe_load[e] /= sums[MOE_STAT_CHOICES] > 0 ? sums[MOE_STAT_CHOICES] : 1;
    return 0;
}

int report_step(struct trainer *t, const struct step_taken *st, struct step_metrics *sm,
                double *dt_s, struct plait_error *err)
{
    const struct plan *p = t->plan;
    int B = p->batch.micro_batch, T = t->T, A = p->batch.grad_accum; /* (dp·cp ranks) */
    /* the step took as long as its slowest rank */
    double dt = prof_now() - st->t0;
    *sm = (struct step_metrics){.ranks = t->where->world, .bubble_sim_pct = 100 * t->bubble_sim};
    if (t->multi && step_report(t, dt, st->bytes0, st->wait0, sm, err)) return -1;
    if (t->multi) dt = sm->step_ms / 1e3;
    double tokens = (double)B * T * A * t->where->dp;
    sm->step = st->index + 1;
    sm->loss = st->loss;
    sm->lr = st->lr;
    sm->grad_norm = st->grad_norm;
    sm->tokens = (int64_t)tokens;
    sm->tokens_total = t->st.tokens;
    sm->ms = 1e3 * dt;
    sm->tokens_per_s = tokens / dt;
    sm->peak_pct = t->peak_gflops > 0 ? 100.0 * t->flops_per_token * tokens / dt /
                                            (t->peak_gflops * 1e9 * t->where->world)
                                      : 0.0;
    sm->mfu = gpu_mfu(t->flops_per_token, sm->tokens_per_s, t->gpu_peak_tflops, t->where->world);
    sm->resumed = st->warm_up && t->run.resumed_from[0]; /* rank 0's run record says */
    *dt_s = dt;
    double *moe = NULL;
    int rc = gpt2_moe(&t->m.cfg) ? report_moe(t, sm, &moe, err) : 0;
    rc = rc || (t->where->rank == 0 && metrics_step(&t->metrics, sm, err)) ? -1 : 0;
    free(moe); /* (the load's numbers: written) */
    sm->moe_load = NULL;
    sm->moe_experts = 0;
    return rc;
}

int report_first_step(struct trainer *t, int step, struct plait_error *err)
{
    const char *fp8_fallback = t->m.ops->fp8_fallback ? t->m.ops->fp8_fallback(t->m.ctx) : NULL;
    if (fp8_fallback && t->where->rank == 0) log_warn("%s", fp8_fallback);
    /* any rank's: each counts its own shard's scratch */
    const char *grown = t->m.ops->scratch_grown ? t->m.ops->scratch_grown(t->m.ctx) : NULL;
    if (grown) log_warn("rank %d: %s", t->where->rank, grown);
    return memory_report(t, step, err);
}

/* The progress line of step s (avg_step_s for the ETA). */
static void print_progress(const struct trainer *t, const struct step_metrics *s, double avg_step_s)
{
    char eta[32];
    log_format_duration(eta, sizeof eta, avg_step_s * (t->plan->steps - s->step));
    char ranks[160] = "", sim[32] = ""; /* several: where the time went, and the straggler */
    if (s->bubble_sim_pct >= 0) snprintf(sim, sizeof sim, " (%.0f%% simulated)", s->bubble_sim_pct);
    char bubble[64] = ""; /* a pipeline's: without one, no rank waits for a neighbour */
    if (t->where->pp > 1) snprintf(bubble, sizeof bubble, " bubble %.0f%%%s", s->idle_pct, sim);
    if (s->ranks > 1)
        snprintf(ranks, sizeof ranks, " | comm %.0f%%%s | straggler rank %d +%.0f%%", s->comm_pct,
                 bubble, s->straggler,
                 s->median_busy_ms > 0 ? 100 * (s->busy_ms / s->median_busy_ms - 1) : 0.0);
    char mfu[32] = ""; /* a GPU whose datasheet peak plait knows */
    if (s->mfu > 0) snprintf(mfu, sizeof mfu, " | MFU %.1f%%", 100 * s->mfu);
    printf("step %*d/%d | loss %.4f | lr %.2e | norm %.3f | %.0f tok/s | %.0f ms | %.1f%% of "
           "peak%s%s | ETA %s\n",
           (int)snprintf(NULL, 0, "%d", t->plan->steps), s->step, t->plan->steps, s->loss, s->lr,
           s->grad_norm, s->tokens_per_s, s->ms, s->peak_pct, mfu, ranks, eta);
    fflush(stdout);
}

/* Whether step s's line is printed when it is taken: train.log_every N, every Nth step;
 * "auto", a step a second or more after the last line. And always this process's first
 * step (a run's, a resumed run's), the last, and a step that warned. An evaluation or a
 * checkpoint prints a step's line that was held (report_progress_flush). */
static bool progress_due(const struct trainer *t, const struct step_metrics *s, bool first)
{
    int every = t->plan->train.log_every;
    bool by_rule = every != PLAN_AUTO ? s->step % every == 0
                                      : prof_now() - t->progress.printed_at_s >= 1.0;
    return by_rule || first || s->step == t->plan->steps ||
           log_warnings() != t->progress.warnings;
}

void report_progress(struct trainer *t, const struct step_metrics *s, double avg_step_s,
                     bool first)
{
    t->last_loss = s->loss;
    if (console_mode != CONSOLE_PROGRESS) return; /* --json: metrics echo it; --quiet */
    t->progress.held = *s;
    t->progress.held_step_s = avg_step_s;
    t->progress.holding = true;
    if (progress_due(t, s, first)) report_progress_flush(t);
}

void report_progress_flush(struct trainer *t)
{
    if (!t->progress.holding) return;
    print_progress(t, &t->progress.held, t->progress.held_step_s);
    t->progress.holding = false;
    t->progress.printed_at_s = prof_now();
    t->progress.warnings = log_warnings();
}

int report_eval(struct trainer *t, double val, struct plait_error *err)
{
    const struct plan *p = t->plan;
    int B = p->batch.micro_batch, T = p->model.seq_len;
    t->last_val = val;
    report_progress_flush(t); /* the step evaluated */
    if (console_mode == CONSOLE_PROGRESS) {
        printf("eval  step %d | val loss %.4f\n", t->st.step, val);
        fflush(stdout);
    }
    struct eval_metrics e = {t->st.step, val, (int64_t)p->data.val_batches * B * T, 0};
    return metrics_eval(&t->metrics, &e, err);
}

/* One line on stderr however quiet the console: how far the run got. */
static void final_summary(struct trainer *t, int rc)
{
    char val[48] = "", speed[48] = "";
    if (!isnan(t->last_val)) snprintf(val, sizeof val, ", val loss %.4f", t->last_val);
    if (t->m.prof.steps > 0)
        snprintf(speed, sizeof speed, ", %.0f tok/s", measured_tokens_per_s(t));
    fprintf(stderr, "plait-train: %s at step %d/%d: loss %.4f%s%s; run directory %s\n",
            rc == PLAIT_EXIT_OK ? "finished" : "stopped", t->st.step, t->plan->steps, t->last_loss,
            val, speed, t->run_dir);
    fflush(stderr);
}

void report_end(struct trainer *t, int rc)
{
    report_progress_flush(t); /* the step it stopped at */
    final_summary(t, rc);
    const struct host_step *h = t->m.host_step;
    if (h && h->floats_down && h->floats_after)
        log_info("offload: %llu of %llu gradient floats came down during backward and its "
                 "reduction (%llu of them after the backward, as its last buckets' sums arrived)",
                 (unsigned long long)h->floats_early, (unsigned long long)h->floats_down,
                 (unsigned long long)h->floats_after);
    else if (h && h->floats_down)
        log_info("offload: %llu of %llu gradient floats came down during backward",
                 (unsigned long long)h->floats_early, (unsigned long long)h->floats_down);
    struct plait_error why; /* the measured speed beside the modelled: a report */
    if (write_run_json(t, &why)) log_warn("run.json: %s", why.text);
}
