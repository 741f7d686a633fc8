/* train.c — one rank's training run: set-up (fresh or from the newest
 * checkpoint), the loop of optimizer steps over micro-batches, evaluation,
 * progress lines, metrics, checkpoints, preemption, samples. The maths is in
 * model.c and optim.c; files in ckpt.c, metrics.c, data.c. */
#include "runtime/train.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/formats/ckpt_shards.h"
#include "common/formats/ckptdir.h"
#include "common/place/cost.h"
#include "common/place/env.h"
#include "common/fsutil.h"
#include "common/place/gpu.h" // defines: gpu_flops_per_token, gpu_mfu, gpu_peak_tflops
#include "common/place/layout.h"
#include "common/plan/lr_schedule.h"
#include "common/log.h"
#include "common/formats/metrics.h"
#include "common/formats/rundir.h"
#include "common/formats/runend.h"
#include "common/formats/runjson.h"
#include "common/formats/runlock.h"
#include "common/place/schedule.h"
#include "kernels/cpu/cpu_rate.h" // defines: cpu_rate_measure, what plait check measures too
#include "kernels/cuda/cuda_ops.h"
#include "runtime/ckpt.h"
#include "runtime/data.h"
#include "runtime/dump.h"
#include "runtime/model.h"
#include "runtime/optim.h"
#include "runtime/ckpt_async.h"
#include "runtime/ckpt_parts.h"
#include "runtime/ckpt_resume.h"
#include "runtime/buckets.h"
#include "runtime/parallel.h"
#include "runtime/pipeline.h"
#include "runtime/sample.h"
#include "runtime/console.h"

volatile sig_atomic_t train_stop_signal;
bool train_run_held;

struct trainer {
    const struct plan *plan;
    const struct env_rank *where; /* this rank's place (the env contract) */
    struct parallel par;          /* the other ranks (none with one rank) */
    bool par_ready, multi;        /* multi: more than one rank */
    struct schedule sched;        /* the pipeline schedule of a step */
    double bubble_sim;            /* its bubble simulated as plait check does (pp > 1) */
    bool sched_ready;
    const char *plan_json;
    const char *run_dir;
    char ckpt_dir[4096];
    struct runlock run_lock, ckpt_lock; /* one run per run and checkpoint directory */
    struct ckptdir ckpts;
    bool ckpts_open;
    const struct ops *ops; /* the op backend, */
    struct ops_ctx *ctx;   /* its context (the model's, the collectives' stream) */
    struct model m;
    bool model_ready;
    struct data_loader train, val;
    bool has_val;
    struct metrics metrics;
    struct train_state st;
    struct rng sample_rng;
    struct tokenizer tok;
    bool has_tok;
    int32_t *inputs, *targets;
    double peak_gflops;
    double flops_per_token;
    double gpu_peak_tflops;  /* the dense datasheet peak of this rank's GPU in the plan's
                                precision, the denominator of MFU; 0: a CPU rank, or a GPU
                                plait does not know */
    const char *dump_dir;    /* PLAIT_DUMP_STEP1, NULL = off */
    int dump_step;           /* the step dumped: the first this process takes (0-based) */
    int32_t *dump_tokens;    /* (B·T) its first micro-batch (the first stage's) */
    long signal_after_micro; /* PLAIT_DEBUG_SIGNAL_AFTER_MICRO, 0 = off */
    double slow_read_s;      /* PLAIT_DEBUG_SLOW_RANK's delay for this rank, 0 = off */
    long micro_done;         /* micro-batches run by this process */
    bool reads_data;         /* a pipeline end: its loaders are open */
    struct pipe_times times; /* where the last step went */
    struct buckets buckets;  /* dp > 1: the gradients' reduction overlapping backward */
    bool bucketed;
    bool hooked;      /* the buckets start during this call's backwards (not a dump's step) */
    bool data_failed; /* the last error came from reading data */
    double timed_s;   /* wall time of the steps in m.prof */
    double rss_before_model;    /* run.json: the resident set just before model_init, bytes */
    char *made_run_dir;         /* the outermost directory this start created for the run */
    char *made_ckpt_dir;        /* (fs_mkdir_p_made), or NULL: undone if it fails */
    double saved_at_s;          /* when the last checkpoint was written (or training began) */
    struct ckpt_async async;    /* checkpoint.async: the one being written in the background */
    double ckpt_write_s;        /* run.json: the last checkpoint's write time (its files), */
    double ckpt_stall_s;        /* and how long the step paused for it */
    double last_loss, last_val; /* the final summary's (NAN until known) */
    struct run_record run;      /* run.json as rank 0 last wrote it */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The CUDA runtime's index of PLAIT_DEVICE, a CUDA index in PCI bus order
 * among all the node's GPUs: its position in CUDA_VISIBLE_DEVICES when that
 * lists indices (the placement shows a rank its granted GPUs only), else itself. */
static int visible_index(int device)
{
    const char *list = getenv("CUDA_VISIBLE_DEVICES");
    for (int pos = 0; list && *list; pos++) {
        char *end;
        long v = strtol(list, &end, 10);
        if (end == list) break; /* a UUID or MIG name: leave the index as it is */
        if (v == device) return pos;
        list = *end == ',' ? end + 1 : end;
        if (*end != ',') break;
    }
    return device;
}

/* The op backend, from parallel.device and the device the launcher gave this
 * rank (PLAIT_DEVICE: a CUDA index; "cpu"; or unset, by hand or from plait
 * train on one rank, which leaves the choice here, GPU 0 if any):
 *   "cpu": the CPU.  "cuda": that GPU, or an error naming parallel.device.
 *   "auto": that GPU when one is usable, else the CPU, saying why when this
 *   build has the CUDA backend (precision fp8 needs a GPU of sm_89 or later). One rank per GPU;
 * several ranks on GPUs talk through nccl (comm_backend_of). */
static const struct ops *choose_device(const struct plan *p, const struct env_rank *w,
                                       struct ops_ctx **ctx, struct plait_error *err)
{
    enum plan_device device = p->parallel.device;
    bool placed_on_cpu = w->device < 0 && getenv(PLAIT_ENV_DEVICE) != NULL;
    if (device == PLAN_DEVICE_CPU || (device == PLAN_DEVICE_AUTO && placed_on_cpu))
        return ops_cpu();
    if (placed_on_cpu) {
        error_set(err,
                  "%s: parallel.device is \"cuda\", but the launcher placed rank %d on the CPU "
                  "(%s=cpu): use \"cpu\" or \"auto\", or run where the placement finds GPUs",
                  p->source, w->rank, PLAIT_ENV_DEVICE);
        return NULL;
    }
    int index = w->device >= 0 ? visible_index(w->device) : 0;
    char why[512] = "";
    const struct ops *o = NULL;
    if (ops_cuda_device_count(why, sizeof why) > 0) {
        if ((o = ops_cuda(why, sizeof why)) && !(*ctx = o->open(index, why, sizeof why))) o = NULL;
        /* open() leaves the fp8 ops out on a GPU without fp8 tensor cores */
        if (o && p->precision == PLAN_PRECISION_FP8 && !o->matmul_forward_fp8) {
            snprintf(why, sizeof why,
                     "precision \"fp8\" needs fp8 tensor cores, which start with compute "
                     "capability 8.9 (Ada, Hopper); CUDA device %d is older (sm_80: use "
                     "precision \"bf16\" on it, or parallel.device \"cpu\" for fp8 emulated)",
                     index);
            o->close(*ctx);
            *ctx = NULL;
            o = NULL;
        }
    }
    if (o) {
        log_info("parallel.device \"%s\": training on CUDA device %d", plan_device_name(device),
                 index);
        return o;
    }
    if (device == PLAN_DEVICE_CUDA) {
        error_set(err,
                  "%s: parallel.device: \"cuda\" is not available: %s (use \"cpu\" or \"auto\")",
                  p->source, why);
        return NULL;
    }
    if (ops_cuda_built()) log_info("parallel.device \"auto\": %s; training on the CPU", why);
    return ops_cpu();
}

/* choose_device's backend and a context of it (*ctx), or NULL with err. */
static const struct ops *choose_backend(const struct plan *p, const struct env_rank *w,
                                        struct ops_ctx **ctx, struct plait_error *err)
{
    char why[512] = "";
    *ctx = NULL;
    const struct ops *o = choose_device(p, w, ctx, err);
    if (o && !*ctx && !(*ctx = o->open(0, why, sizeof why))) {
        error_set(err, "the %s backend: %s", o->name, why);
        return NULL;
    }
    return o;
}

/* ---- start: fresh or resumed ------------------------------------------------- */

/* The whole model in llm.c order (from model.init, or initialised from the
 * seed), then this rank's shard of it. */
static int init_weights(struct trainer *t, struct plait_error *err)
{
    const struct plan_model *pm = &t->plan->model;
    struct gpt2_layout full_layout;
    gpt2_layout(&t->m.cfg, &full_layout); /* addressable: the plan checked it */
    float *full = malloc(full_layout.total * sizeof(float));
    float *shard = malloc(t->m.shard.total * sizeof(float));
    int rc = 0;
    if (!full || !shard) {
        rc = error_set(err, "out of memory for %zu parameters", full_layout.total);
    } else if (pm->init) {
        if (gpt2_read_llmc(pm->init, &t->m.cfg, full, NULL, err))
            rc = error_prefix(err, "model.init: ");
    } else {
        gpt2_init_weights(&t->m.cfg, &full_layout, full, pm->seed);
    }
    if (rc == 0) {
        gpt2_shard_copy(&t->m.shard, full, shard, true);
        model_set_params(&t->m, shard);
    }
    free(full);
    free(shard);
    return rc;
}

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
    return (double)p->batch.micro_batch * p->model.seq_len * p->batch.grad_accum * t->where->dp *
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

/* A size line of /proc/self/status ("VmHWM" the peak resident set, "VmRSS"
 * the current one), bytes; 0 where the kernel does not say. */
static double proc_status_bytes(const char *field)
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
    enum { K = 9 };
    const struct env_rank *w = t->where;
    const struct model_bytes *a = &t->m.allocated;
    double mine[K] = {w->tp_rank,
                      w->pp_rank,
                      w->dp_rank,
                      (double)a->params,
                      (double)a->grads,
                      (double)a->optimizer,
                      (double)a->activations,
                      proc_status_bytes("VmHWM"),
                      t->rss_before_model};
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
    struct cost_layout l = {w->tp, w->pp, w->dp};
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
                          (int64_t)c.activations, -1},
            .allocated = {(int64_t)v[3], (int64_t)v[4], (int64_t)v[5], (int64_t)v[6], -1},
            .rss_peak_bytes = (int64_t)v[7],
            .rss_before_model_bytes = (int64_t)v[8]};
        if (on_cpu && n > 1) /* host memory beside the model's: the socket backend's rings */
            ranks[r].predicted.comm_rings = (int64_t)cost_comm_ring_bytes(t->plan, l, (int)v[1]);
    }
    free(all);
    free(t->run.ranks);
    t->run.ranks = ranks;
    t->run.n_ranks = n;
    t->run.memory_after_step = step;
    return write_run_json(t, err);
}

/* The dense datasheet peak (TFLOP/s) of the GPU this rank trains on, in the plan's precision,
 * from common/place/gpu.h's table: the GPU is this machine's CUDA device `device` (hwloc, PCI id or
 * NVML name, as plait check finds it). 0 for a CPU rank, or when plait does not know the GPU:
 * no MFU is reported then. */
static double gpu_peak_of_rank(const struct model *m, int device, enum plan_precision precision)
{
    if (m->ops == ops_cpu()) return 0;
    struct topo topo;
    struct plait_error err;
    if (topo_load(&topo, NULL, &err)) {
        log_warn("no MFU: %s", err.text);
        return 0;
    }
    double peak = gpu_peak_tflops(topo_gpu_spec(&topo, device >= 0 ? device : 0), precision);
    topo_free(&topo);
    return peak;
}

/* The rate of the device's matrix product in this precision, as the
 * denominator of "% of peak": PLAIT_PEAK_GFLOPS, or measured now. */
static double measure_peak_gflops(struct model *m)
{
    const char *env = getenv(PLAIT_ENV_PEAK_GFLOPS);
    if (env && atof(env) > 0) return atof(env);
    const struct ops *o = m->ops;
    int N = 256, C = 1024, OC = 2048;
    float *x = o->alloc(m->ctx, (size_t)N * C * 4), *w = o->alloc(m->ctx, (size_t)OC * C * 4);
    float *y = o->alloc(m->ctx, (size_t)N * OC * 4);
    bool fp8 = m->precision == PLAN_PRECISION_FP8;
    int e = fp8_weight_tile(m->fp8_scaling);
    uint16_t *w16 = m->params16 ? o->alloc(m->ctx, (size_t)OC * C * 2) : NULL;
    uint8_t *w8 = fp8 ? o->alloc(m->ctx, (size_t)OC * C) : NULL;
    float *s8 = fp8 ? o->alloc(m->ctx, fp8_scale_count(OC, C, e, e) * sizeof(float)) : NULL;
    double best = 0;
    if (x && w && y && (w16 || !m->params16) && (!fp8 || (w8 && s8))) {
        if (w16) o->to_bf16(m->ctx, w16, w, (size_t)OC * C);
        if (fp8) o->quantize_fp8(m->ctx, w8, s8, w, OC, C, e, e, FP8_E4M3);
        /* the best of a dozen after warm-up: noise only ever slows a product down */
        for (int i = 0; i < 14; i++) {
            double t0 = now_s();
            if (fp8) /* the input's quantising included, as in training (the weight's copy is made
                        once a step) */
                o->matmul_forward_fp8(m->ctx, y, x, w8, s8, NULL, N, C, OC, m->fp8_scaling);
            else
                o->matmul_forward(m->ctx, y, x, w, w16, NULL, N, C, OC);
            float first; /* waits for the product (a GPU's runs asynchronously) */
            o->download(m->ctx, &first, y, sizeof first);
            double rate = 2.0 * N * C * OC / (now_s() - t0) / 1e9;
            if (i >= 2 && rate > best) best = rate;
        }
    }
    o->free(m->ctx, x);
    o->free(m->ctx, w);
    o->free(m->ctx, y);
    if (w16) o->free(m->ctx, w16);
    if (w8) o->free(m->ctx, w8);
    if (s8) o->free(m->ctx, s8);
    o->take_error(m->ctx, NULL, 0);
    return best;
}

/* plait check's modelled tokens/s for this run here (run.json, plait status):
 * on the CPU from this rank's CPU kernels, measured now at the plan's shapes
 * as plait check measures them (kernels/cpu/cpu_rate.h); 0 when it cannot tell. */
static double modelled_tokens_per_s(const struct trainer *t)
{
    const struct plan *p = t->plan;
    if (t->m.ops != ops_cpu()) return layout_modelled_tokens_per_s(p, NULL);
    struct cpu_rate_shape shape = cpu_rate_shape_of(
        p->batch.micro_batch, p->model.seq_len, p->model.hidden, p->model.heads, p->model.layers,
        p->model.padded_vocab, t->where->tp, t->where->pp, p->precision != PLAN_PRECISION_FP32);
    struct cpu_rate r;
    char why[256];
    if (cpu_rate_measure(&shape, 0, &r, why, sizeof why)) {
        log_warn("no modelled speed in run.json: %s", why);
        return 0;
    }
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

/* The layout the launcher gave this rank must be the plan's ("auto" is
 * whatever the launcher chose); this runtime trains it on one rank so far. */
static int check_layout(const struct plan *p, const struct env_rank *where, struct plait_error *err)
{
    const struct {
        const char *name;
        int plan, env;
    } d[] = {{"tp", p->parallel.tp, where->tp},
             {"pp", p->parallel.pp, where->pp},
             {"dp", p->parallel.dp, where->dp}};
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

/* The collectives' backend for tensors where ops keeps them: nccl on GPUs
 * (device memory; "auto" resolves to it), socket on the CPU. nccl on the CPU
 * is refused naming parallel.backend, and socket on GPUs where there are
 * collectives (more than one rank). */
static int comm_backend_of(const struct plan *p, const struct env_rank *w, const struct ops *ops,
                           enum comm_backend_kind *kind, struct plait_error *err)
{
    bool gpu = strcmp(ops->name, "cpu") != 0;
    enum plan_backend b = p->parallel.backend;
    *kind = gpu ? COMM_BACKEND_NCCL : COMM_BACKEND_SOCKET;
    if (!gpu && b == PLAN_BACKEND_NCCL)
        return error_set(err,
                         "%s: parallel.backend: \"nccl\" moves GPU memory, but rank %d trains "
                         "on the CPU (parallel.device \"%s\"): use \"socket\" or \"auto\", or "
                         "parallel.device \"cuda\" where every rank has a GPU",
                         p->source, w->rank, plan_device_name(p->parallel.device));
    if (gpu && b == PLAN_BACKEND_SOCKET && w->world > 1)
        return error_set(err,
                         "%s: parallel.backend: \"socket\" moves host memory, but rank %d trains "
                         "on CUDA device %d, whose tensors are GPU memory: use \"nccl\" or "
                         "\"auto\" (or parallel.device \"cpu\" to train on the CPU)",
                         p->source, w->rank, w->device >= 0 ? w->device : 0);
    return 0;
}

/* Every rank learns whether any failed: one with its own reason keeps it,
 * the others say who failed (rank 0, owner of the run directory, for setup). */
static int agree(struct trainer *t, int failed, const struct plait_error *why, const char *others,
                 struct plait_error *err)
{
    int any = failed;
    if (parallel_max_int(&t->par, &any, err)) return -1;
    if (!any) return 0;
    if (failed) {
        *err = *why;
        return -1;
    }
    return error_set(err, "%s", others);
}

#define START_FRESH                                                                                \
    "to start this plan from scratch there, run plait train with --fresh (removes that "           \
    "run's checkpoints and metrics), or train into another directory (--out)"

/* Whether the run directory holds something a different plan would lose:
 * metrics records or checkpoints (own: only those under the run directory,
 * not a checkpoint.dir elsewhere, whose checkpoints say their own plan). */
static bool run_has_history(struct trainer *t, bool own)
{
    char path[4096];
    struct stat st;
    struct plait_error err;
    if (!fs_join(path, sizeof path, t->run_dir, RUNDIR_METRICS, &err) && stat(path, &st) == 0 &&
        st.st_size > 0)
        return true;
    size_t len = strlen(t->run_dir);
    if (own && (strncmp(t->ckpt_dir, t->run_dir, len) != 0 || t->ckpt_dir[len] != '/'))
        return false;
    struct ckpt_entry *list;
    int n = 0;
    if (ckptdir_list(&t->ckpts, &list, &n, &err) == 0) free(list);
    return n > 0;
}

/* The run directory belongs to the plan that started it (its plan.json): a
 * different plan may not take it over while it holds history, nor any plan
 * when its plan.json is gone (nothing says which plan made the history). */
static int check_run_plan(struct trainer *t, struct plait_error *err)
{
    char path[4096];
    struct stat st;
    if (fs_join(path, sizeof path, t->run_dir, RUNDIR_PLAN, err)) return -1;
    if (stat(path, &st) != 0 && run_has_history(t, true))
        return error_set(err,
                         "%s holds a run's history (metrics or checkpoints) but no %s, so "
                         "nothing says which plan made it; put its plan back (every checkpoint "
                         "keeps a copy: %s/<checkpoint>/%s), or " START_FRESH,
                         t->run_dir, RUNDIR_PLAN, t->ckpt_dir, RUNDIR_PLAN);
    if (stat(path, &st) != 0 || !run_has_history(t, false)) return 0;
    struct plan *before = rundir_plan_load(t->run_dir, err);
    char notes[1024];
    struct plait_error why;
    int rc = before ? plan_resumable(before, t->plan, notes, sizeof notes, &why) : -1;
    if (rc)
        error_set(err, "%s holds a run of a different plan (%s: %s); " START_FRESH, t->run_dir,
                  before ? "fields that may not change" : "its plan.json does not load",
                  before ? why.text : err->text);
    plan_free(before);
    return rc;
}

/* plait train --fresh: the run directory's history goes. */
static int start_fresh(struct trainer *t, struct plait_error *err)
{
    int n = ckptdir_remove_all(&t->ckpts, err);
    if (n < 0) return error_prefix(err, "--fresh: ");
    static const char *const files[] = {RUNDIR_METRICS, RUNDIR_PLAN, RUNDIR_RUN, RUNDIR_LOG};
    char path[4096];
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        if (fs_join(path, sizeof path, t->run_dir, files[i], err)) return -1;
        if (unlink(path) != 0 && errno != ENOENT)
            return error_errno(err, "--fresh: removing %s", path);
    }
    log_info("--fresh: removed %d checkpoint%s and the metrics of the previous run in %s", n,
             n == 1 ? "" : "s", t->run_dir);
    return 0;
}

/* The checkpoint directory, locked like the run directory: another run
 * directory's plan could name the same one. */
static int checkpoint_path(struct trainer *t, struct plait_error *err)
{
    return rundir_checkpoint_dir(t->plan, t->run_dir, t->ckpt_dir, sizeof t->ckpt_dir, err);
}

static int open_checkpoints(struct trainer *t, struct plait_error *err)
{
    if (fs_mkdir_p_made(t->ckpt_dir, &t->made_ckpt_dir, err))
        return error_prefix(err, "checkpoint.dir: ");
    /* locked even inside the run directory: another run may name it as its own */
    if (ckptdir_open_locked(&t->ckpts, &t->ckpt_lock, t->ckpt_dir, t->run_dir, err)) return -1;
    t->ckpts_open = true;
    return 0;
}

/* Rank 0 owns the run directory: its lock, its checkpoints' directory, a
 * fresh start, and the check that it belongs to this plan. */
static int open_run(struct trainer *t, struct plait_error *err)
{
    if (fs_mkdir_p_made(t->run_dir, &t->made_run_dir, err) ||
        runlock_acquire(&t->run_lock, t->run_dir, "run directory", err))
        return -1;
    const char *fresh = getenv(PLAIT_ENV_FRESH);
    if (open_checkpoints(t, err) || (fresh && !strcmp(fresh, "1") && start_fresh(t, err)) ||
        check_run_plan(t, err))
        return -1;
    /* the run is this process's now (a refused start leaves it as it was): no
     * end yet, and the console kept in train.log */
    train_run_held = true;
    runend_clear(t->run_dir);
    struct plait_error why;
    if (console_start(t->run_dir, &why))
        log_warn("the console is not kept in the run directory: %s", why.text);
    return 0;
}

/* Rank 0's files of the run as it starts: plan.json, metrics.jsonl (cut back
 * to the state's step) and run.json; resumed_from: the checkpoint, "" none. */
static int start_run_files(struct trainer *t, const char *resumed_from, struct plait_error *err)
{
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

static int setup(struct trainer *t, struct plait_error *err)
{
    const struct plan *p = t->plan;
    const struct env_rank *w = t->where;
    bool rank0 = w->rank == 0;
    t->multi = w->world > 1;
    if (check_layout(p, w, err)) return -1;
    if (!(t->ops = choose_backend(p, w, &t->ctx, err))) return -1;
    struct parallel_device dev = {.ops = t->ops, .ctx = t->ctx};
    if (comm_backend_of(p, w, t->ops, &dev.backend, err)) return -1;
    struct gpt2_config cfg = gpt2_config_of_plan(&p->model);
    int B = p->batch.micro_batch, T = p->model.seq_len;
    if (parallel_init(&t->par, w, p->parallel.timeout_s, &dev, err)) return -1;
    t->par_ready = true;
    struct plait_error why = {.text = ""};
    int failed = checkpoint_path(t, &why) || (rank0 && open_run(t, &why));
    if (agree(t, failed, &why, "rank 0 could not open the run (see its message)", err)) return -1;
    if (schedule_make_for_plan(&t->sched, p, w->pp, err)) return -1;
    t->sched_ready = true;
    struct sched_sim sim;
    if (schedule_simulate_textbook(&t->sched, &sim, err)) return -1;
    t->bubble_sim = w->pp > 1 ? sim.bubble : -1;
    struct gpt2_part part = cost_stage_part(p, w->tp, w->tp_rank, w->pp, w->pp_rank);
    struct model_shape shape = {.B = B,
                                .T = T,
                                .precision = p->precision,
                                .fp8_scaling = p->fp8_scaling,
                                .recompute = p->recompute,
                                .slots = schedule_max_in_flight(&t->sched, w->pp_rank),
                                .dp = w->dp,
                                .dp_rank = w->dp_rank,
                                .zero = p->parallel.zero,
                                .split_backward = t->sched.split_backward,
                                .sequence_parallel = p->parallel.sequence_parallel};
    t->rss_before_model = proc_status_bytes("VmRSS");
    if (model_init(&t->m, &cfg, &part, &t->par.g_tp, t->ops, t->ctx, &shape, err)) return -1;
    t->model_ready = true;
    if (t->m.attention_bf16 && rank0) log_info("attention on the bf16 tensor cores");
    if (w->dp > 1 && t->par.g_dp.iallreduce &&
        (p->parallel.zero == 0 || t->par.g_dp.ireduce_scatter_v)) {
        if (buckets_init(&t->buckets, &t->m, &t->par.g_dp, p->parallel.bucket_mb, err)) return -1;
        t->bucketed = true;
    }
    if (p->checkpoint.async && ckpt_async_reserve(&t->async, &t->m, err)) return -1;
    t->flops_per_token = gpu_flops_per_token(&cfg, T);
    t->inputs = malloc((size_t)B * T * sizeof *t->inputs);
    t->targets = malloc((size_t)B * T * sizeof *t->targets);
    if (!t->inputs || !t->targets) return error_set(err, "out of memory");

    char name[64] = "", notes[1024] = "";
    double load_t0 = now_s();
    int loaded = t->multi ? ckpt_parts_load(rank0 ? &t->ckpts : NULL, t->ckpt_dir, p, &t->m, &t->st,
                                            name, sizeof name, notes, sizeof notes, &t->par, err)
                          : ckpt_load_latest(&t->ckpts, p, &t->m, &t->st, name, sizeof name, notes,
                                             sizeof notes, err);
    if (loaded == CKPT_NOT_THIS_RUN) {
        struct plait_error reason = *err;
        return error_set(err, "%s; " START_FRESH, reason.text);
    }
    if (loaded < 0) return -1;
    if (loaded) {
        log_info("resuming from %s/%s (step %d%s), read in %.2f s", t->ckpt_dir, name, t->st.step,
                 t->st.micro ? ", mid-step" : "", now_s() - load_t0);
        if (*notes) log_info("the plan changed since that checkpoint: %s", notes);
        if (t->st.micro >= p->batch.grad_accum)
            return error_set(err,
                             "checkpoint %s stopped after micro-batch %d of a step, but the "
                             "plan has batch.grad_accum %d",
                             name, t->st.micro, p->batch.grad_accum);
        memcpy(t->sample_rng.s, t->st.sample_rng, sizeof t->sample_rng.s);
        /* a mid-step loss so far is the job's: one rank carries it into the step's sum */
        bool carrier = t->m.last && w->tp_rank == 0 && w->dp_rank == 0;
        if (t->multi && !carrier) t->st.loss_sum = 0;
    } else {
        if (init_weights(t, err)) return -1;
        ckpt_state_fresh(&t->st, p);
        memcpy(t->sample_rng.s, t->st.sample_rng, sizeof t->sample_rng.s);
    }

    /* the data: read by the pipeline's ends (tokens first, targets last) */
    t->reads_data = t->m.first || t->m.last;
    if (t->reads_data) {
        if (data_open(&t->train, p->data.train, B, T, cfg.vocab, p->data.shuffle, p->model.seed,
                      err))
            return error_prefix(err, "data.train: ");
        if (data_seek(&t->train, &t->st.data, err)) return error_prefix(err, "data.train: ");
    }
    if (p->data.val && t->reads_data) {
        if (data_open(&t->val, p->data.val, B, T, cfg.vocab, false, 0, err))
            return error_prefix(err, "data.val: ");
    }
    t->has_val = p->data.val != NULL;
    if (p->data.tokenizer && !t->multi) {
        if (tokenizer_load(&t->tok, p->data.tokenizer, err))
            return error_prefix(err, "data.tokenizer: ");
        t->has_tok = true;
        if (t->tok.eot >= cfg.vocab)
            return error_set(err,
                             "data.tokenizer: %s: its end-of-text token %d is not below "
                             "model.vocab %d (a tokenizer of another model?)",
                             p->data.tokenizer, t->tok.eot, cfg.vocab);
    }
    t->dump_dir = getenv(PLAIT_ENV_DUMP_STEP1);
    t->dump_step = t->st.step; /* 0 in a new run; a resumed one dumps its first step */
    if (t->dump_dir && !(t->dump_tokens = calloc((size_t)B * T, sizeof *t->dump_tokens)))
        return error_set(err, "out of memory");
    const char *inject = getenv(PLAIT_ENV_DEBUG_SIGNAL_AFTER_MICRO);
    int signal_rank;
    long after;
    if (inject && sscanf(inject, "%d:%ld", &signal_rank, &after) == 2) /* RANK:N, one rank */
        t->signal_after_micro = signal_rank == w->rank ? after : 0;
    else
        t->signal_after_micro = inject ? atol(inject) : 0;
    int slow_rank;
    double slow_ms;
    inject = getenv(PLAIT_ENV_DEBUG_SLOW_RANK);
    if (inject && sscanf(inject, "%d:%lf", &slow_rank, &slow_ms) == 2 && slow_rank == w->rank)
        t->slow_read_s = slow_ms / 1e3;
    t->peak_gflops = measure_peak_gflops(&t->m);
    t->gpu_peak_tflops = gpu_peak_of_rank(&t->m, w->device, p->precision);
    return rank0 ? start_run_files(t, loaded ? name : "", err) : 0;
}

static void teardown(struct trainer *t)
{
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
    free(t->dump_tokens);
}

/* ---- pieces of the loop -------------------------------------------------------- */

static struct ckpt_target ckpt_target(struct trainer *t)
{
    return (struct ckpt_target){
        .d = !t->multi || t->where->rank == 0 ? &t->ckpts : NULL,
        .dir = t->ckpt_dir,
        .par = t->multi ? &t->par : NULL,
        .keep = t->plan->checkpoint.keep,
    };
}

/* Writes a checkpoint of the state now; in the background (checkpoint.async)
 * when `background` (a step boundary the run goes on from), otherwise at
 * once, after committing one still being written. */
static int save(struct trainer *t, bool background, struct plait_error *err)
{
    struct ckpt_target to = ckpt_target(t);
    background = background && t->plan->checkpoint.async && t->st.micro == 0;
    if (!background && ckpt_async_wait(&t->async, &to, err)) return -1;
    if (t->reads_data) t->st.data = t->train.pos;
    /* mid-step, the loss so far is every data-parallel rank's: the state holds the sum */
    double mine = t->st.loss_sum;
    if (t->multi && t->st.micro > 0) {
        double v = t->m.last && t->where->tp_rank == 0 ? mine : 0;
        if (t->par.g_world.allreduce_f64(t->par.g_world.ctx, &v, 1, err)) return -1;
        t->st.loss_sum = v;
    }
    memcpy(t->st.sample_rng, t->sample_rng.s, sizeof t->st.sample_rng);
    double t0 = now_s();
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
    t->ckpt_stall_s = now_s() - t0;
    if (!background) {
        t->ckpt_write_s = t->ckpt_stall_s;
        log_info("checkpoint step %d%s written in %.1f s", t->st.step,
                 t->st.micro ? " (mid-step)" : "", t->ckpt_write_s);
    }
    t->saved_at_s = now_s();
    return 0;
}

/* checkpoint.every_minutes, when checkpoint.every is 0: due once that long
 * has passed since the last checkpoint by rank 0's clock, and every rank
 * learns rank 0's decision (a step boundary: all ranks call it). 1 due, 0
 * not, -1 with err. */
static int minutes_due(struct trainer *t, struct plait_error *err)
{
    const struct plan_checkpoint *c = &t->plan->checkpoint;
    if (c->every > 0 || c->every_minutes <= 0) return 0;
    int due = t->where->rank == 0 && now_s() - t->saved_at_s >= 60.0 * c->every_minutes;
    if (t->multi && parallel_max_int(&t->par, &due, err)) return -1;
    return due;
}

/* Data that fails mid-run (a shard changed under us) must not cost the work
 * since the last checkpoint: the state after the last complete micro-batch is
 * written, then the error is returned with where to resume. */
static int fail_keeping_progress(struct trainer *t, struct plait_error *err)
{
    if (t->multi) return -1; /* a checkpoint takes every rank, and the others are elsewhere */
    struct plait_error why = *err, save_err;
    if (save(t, false, &save_err))
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

/* One micro-batch forward only, through the pipeline's stages in turn (with
 * chunks, stage 0..pp-1 through chunk 0, then chunk 1, ...), in slot 0 under
 * its own tag (tag + c·2^24 into chunk c): the first stage embeds tokens,
 * the last keeps the logits and, with targets, puts the mean loss in *loss. */
static int forward_through_stages(struct trainer *t, uint32_t tag, const int32_t *tokens,
                                  const int32_t *targets, double *loss, struct plait_error *err)
{
    const struct plan *p = t->plan;
    int B = p->batch.micro_batch, T = p->model.seq_len, pp = t->where->pp, s = t->where->pp_rank;
    size_t NC = model_stage_floats(&t->m, B, T); /* this rank's rows, sequence parallel */
    struct pipe_link link = parallel_pipe_link(&t->par);
    for (int c = 0; c < t->m.chunks; c++) {
        bool embeds = t->m.first && c == 0, heads = t->m.last && c == t->m.chunks - 1;
        t->m.slots[0].chunk = c;
        if (!embeds && link.recv(link.ctx, s == 0 ? pp - 1 : s - 1, tag + ((uint32_t)c << 24),
                                 model_stage_input(&t->m, 0), NC, err))
            return -1;
        if (model_stage_forward(&t->m, 0, tokens, targets, B, T, 0.0f, loss, err)) return -1;
        if (!heads && link.send(link.ctx, s == pp - 1 ? 0 : s + 1,
                                tag + ((uint32_t)(s == pp - 1 ? c + 1 : c) << 24),
                                model_stage_output(&t->m, 0), NC, false, err))
            return -1;
    }
    t->m.slots[0].chunk = 0;
    return link.flush ? link.flush(link.ctx, err) : 0;
}

/* Mean loss over val_batches micro-batches from the start of the validation
 * data. Returns 1 when interrupted by a stop request, 0 when done. */
static int evaluate_batches(struct trainer *t, struct plait_error *err);

/* Evaluation's forward passes are not training time: kept out of the profile. */
static int evaluate(struct trainer *t, struct plait_error *err)
{
    t->m.prof.paused++;
    int rc = evaluate_batches(t, err);
    t->m.prof.paused--;
    return rc;
}

static int evaluate_batches(struct trainer *t, struct plait_error *err)
{
    const struct plan *p = t->plan;
    int B = p->batch.micro_batch, T = p->model.seq_len;
    double sum = 0;
    if (t->reads_data) data_rewind(&t->val);
    for (int i = 0; i < p->data.val_batches; i++) {
        /* one rank stops the evaluation alone; a job evaluates to the end */
        if (train_stop_signal && !t->multi) return 1;
        double loss = 0;
        if (t->reads_data && data_next(&t->val, t->inputs, t->targets, err)) {
            t->data_failed = true;
            return error_prefix(err, "data.val: ");
        }
        if (forward_through_stages(t, 0x40000000u + (uint32_t)i, t->inputs, t->targets, &loss, err))
            return -1;
        sum += loss;
    }
    if (t->multi) { /* the last stage's, to everyone (tp ranks agree; one counts) */
        double v = t->m.last && t->where->tp_rank == 0 && t->where->dp_rank == 0 ? sum : 0;
        if (t->par.g_world.allreduce_f64(t->par.g_world.ctx, &v, 1, err)) return -1;
        sum = v;
    }
    double val = sum / p->data.val_batches;
    if (t->where->rank != 0) return 0;
    t->last_val = val;
    if (console_mode == CONSOLE_PROGRESS) {
        printf("eval  step %d | val loss %.4f\n", t->st.step, val);
        fflush(stdout);
    }
    struct eval_metrics e = {t->st.step, val, (int64_t)p->data.val_batches * B * T, 0};
    return metrics_eval(&t->metrics, &e, err);
}

/* PLAIT_DUMP_STEP1, once step 1's micro-batches are done and before its
 * optimizer step (the parameters are still the initial ones): the logits of
 * its first micro-batch (dp replica 0's), from a forward of it again, and the
 * step's gradients. */
static int dump_step1(struct trainer *t, struct plait_error *err)
{
    const struct plan *p = t->plan;
    int B = p->batch.micro_batch, T = p->model.seq_len;
    t->m.prof.paused++;
    int rc = forward_through_stages(t, 0x50000000u, t->dump_tokens, NULL, NULL, err) ||
                     dump_logits(&t->m, t->dump_dir, B, T, err) ||
                     dump_grads(&t->m, &t->par.g_world, t->dump_dir, err)
                 ? -1
                 : 0;
    t->m.prof.paused--;
    return rc;
}

static void progress_line(struct trainer *t, const struct step_metrics *s, double avg_step_s)
{
    t->last_loss = s->loss;
    if (console_mode != CONSOLE_PROGRESS) return; /* --json: metrics echo it; --quiet */
    char eta[32];
    log_format_duration(eta, sizeof eta, avg_step_s * (t->plan->steps - s->step));
    char ranks[160] = "", sim[32] = ""; /* several: where the time went, and the straggler */
    if (s->bubble_sim_pct >= 0) snprintf(sim, sizeof sim, " (%.0f%% simulated)", s->bubble_sim_pct);
    if (s->ranks > 1)
        snprintf(ranks, sizeof ranks, " | comm %.0f%% bubble %.0f%%%s | straggler rank %d +%.0f%%",
                 s->comm_pct, s->idle_pct, sim, s->straggler,
                 s->median_busy_ms > 0 ? 100 * (s->busy_ms / s->median_busy_ms - 1) : 0.0);
    char mfu[32] = ""; /* a GPU whose datasheet peak plait knows */
    if (s->mfu > 0) snprintf(mfu, sizeof mfu, " | MFU %.1f%%", 100 * s->mfu);
    printf("step %*d/%d | loss %.4f | lr %.2e | norm %.3f | %.0f tok/s | %.0f ms | %.1f%% of "
           "peak%s%s | ETA %s\n",
           (int)snprintf(NULL, 0, "%d", t->plan->steps), s->step, t->plan->steps, s->loss, s->lr,
           s->grad_norm, s->tokens_per_s, s->ms, s->peak_pct, mfu, ranks, eta);
    fflush(stdout);
}

/* ---- the loop ---------------------------------------------------------------------- */

/* The feed of the step's micro-batches: this rank's share of the data (the
 * developer's dump of step 1 keeps its first micro-batch's tokens). */
struct step_feed {
    struct trainer *t;
    int step;
};

static int feed_next(void *ctx, int micro, int32_t *tokens, int32_t *targets,
                     struct plait_error *err)
{
    struct step_feed *f = ctx;
    struct trainer *t = f->t;
    const struct plan *p = t->plan;
    int rc;
    PROF(&t->m.prof, PROF_DATA,
         rc = data_next_of(&t->train, t->where->dp_rank, t->where->dp, tokens, targets, err));
    if (rc) {
        t->data_failed = true;
        return error_prefix(err, "data.train: ");
    }
    if (t->slow_read_s > 0) {
        struct timespec ts = {(time_t)t->slow_read_s,
                              (long)(1e9 * (t->slow_read_s - (time_t)t->slow_read_s))};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
    }
    if (t->dump_dir && f->step == t->dump_step && micro == 0 && t->st.micro == 0)
        memcpy(t->dump_tokens, tokens,
               (size_t)p->batch.micro_batch * p->model.seq_len * sizeof *tokens);
    return 0;
}

/* The tied wte's gradient, summed between the pipeline's first and last stage. */
static int tied_sum(struct trainer *t, struct plait_error *err)
{
    if (t->where->pp == 1 || !(t->m.first || t->m.last)) return 0;
    return parallel_sum_ends(&t->par, t->m.grads + gpt2_shard_offset(&t->m.shard, GPT2_WTE, 0),
                             t->m.shard.elems[GPT2_WTE], err);
}

/* The gradients that more than one rank computed a term of: the tied wte's
 * between the pipeline's ends, and with sequence parallelism the LayerNorms'
 * over tp. */
static int shared_sums(struct trainer *t, struct plait_error *err)
{
    return model_sum_layernorm_grads(&t->m, err) || tied_sum(t, err) ? -1 : 0;
}

/* After each micro-batch: ZeRO 2's reduction, its count, the fault
 * injection. */
static int after_micro(void *ctx, int micro, struct plait_error *err)
{
    struct step_feed *f = ctx;
    struct trainer *t = f->t;
    const struct plan *p = t->plan;
    (void)micro;
    /* ZeRO 2: this micro-batch's gradients into the slice. In buckets started
     * during its backward: the tied wte's sum before the embeddings' bucket,
     * the LayerNorms' over tp in the slice; else both before the reduction. */
    int B = p->batch.micro_batch, T = p->model.seq_len;
    if (t->m.zero == 2 && t->bucketed) {
        if ((t->hooked ? tied_sum(t, err) : shared_sums(t, err)) ||
            buckets_finish(&t->buckets, B, T, t->hooked, err))
            return -1;
        t->buckets.accumulate = true; /* the next micro-batch's adds */
    } else if (t->m.zero == 2) {
        struct optim_groups g = {.dp = &t->par.g_dp, .mp = &t->par.g_mp};
        if (shared_sums(t, err) || optim_reduce_micro(&t->m, &g, t->st.micro > 0, err)) return -1;
    }
    t->st.micro++;
    t->st.tokens += (int64_t)p->batch.micro_batch * p->model.seq_len * t->where->dp;
    if (++t->micro_done == t->signal_after_micro) raise(SIGTERM);
    return 0;
}

/* A stop between micro-batches (the executor's agreement, pipeline.c): this
 * rank's wish, and, on the first stage, every first-stage rank's (with pp = 1,
 * every rank's). */
static bool wants_stop(void *ctx)
{
    (void)ctx;
    return train_stop_signal != 0;
}

static int agree_stop(void *ctx, int *stop, struct plait_error *err)
{
    struct step_feed *f = ctx;
    *stop = *stop || train_stop_signal;
    return f->t->multi ? parallel_max_stage(&f->t->par, stop, err) : 0;
}

/* The micro-batches of step s (from st.micro on, when resumed mid-step)
 * through the schedule executor. Returns 1 when a stop ended it between
 * micro-batches, 0 when the step's gradients are complete, -1 on error (a
 * data error after a checkpoint of the work so far). */
static int train_micro_batches(struct trainer *t, int s, float grad_scale, struct plait_error *err)
{
    const struct plan *p = t->plan;
    int A = p->batch.grad_accum, left = A - t->st.micro, done = 0;
    struct schedule resumed, *sched = &t->sched;
    if (left < A) { /* resumed mid-step: the rest of it, through the same kind of schedule */
        if (schedule_make(&resumed, t->sched.kind, t->sched.pp, left, t->sched.v, err)) return -1;
        sched = &resumed;
    }
    struct step_feed f = {t, s};
    struct pipe_feed feed = {feed_next, &f};
    struct pipe_link link = parallel_pipe_link(&t->par);
    struct pipe_step how = {.B = p->batch.micro_batch,
                            .T = p->model.seq_len,
                            .grad_scale = grad_scale,
                            .accumulate = t->st.micro > 0 && t->m.zero < 2,
                            .overwrite_each = t->m.zero == 2,
                            .after_backward = after_micro,
                            .agree_stop = agree_stop,
                            .wants_stop = wants_stop,
                            .ctx = &f};
    /* the gradient sum starts during the last backward; not in a step whose
     * gradients are dumped (the dump shows this rank's own) */
    t->hooked = t->bucketed && !(t->dump_dir && t->st.step == t->dump_step && t->st.micro == 0);
    if (t->hooked) {
        how.grads_final = buckets_ready;
        how.grads_ctx = &t->buckets;
    }
    if (t->bucketed) t->buckets.accumulate = t->m.zero == 2 && t->st.micro > 0;
    double loss_sum = 0;
    t->data_failed = false;
    int rc = pipeline_step(&t->m, sched, t->where->pp_rank, &link, &feed, &how, &loss_sum, &done,
                           &t->times, err);
    if (sched == &resumed) schedule_free(&resumed);
    if (rc && t->bucketed) buckets_drop(&t->buckets);
    t->st.loss_sum += loss_sum;
    if (rc && t->data_failed) return fail_keeping_progress(t, err);
    if (rc) return error_prefix(err, "step %d, micro-batch %d: ", s + 1, t->st.micro + 1);
    if (t->st.micro < A && !train_stop_signal) train_stop_signal = SIGTERM; /* another rank's */
    return t->st.micro < A ? 1 : 0;
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
    enum { K = 11 };
    double bytes[PAR_NCOMM], wait[PAR_NCOMM], d[PAR_NCOMM];
    parallel_comm_totals(&t->par, bytes, wait);
    for (int i = 0; i < PAR_NCOMM; i++) d[i] = bytes[i] - bytes0[i];
    const struct pipe_times *pt = &t->times;
    double tp_wait = wait[PAR_TP] - wait0[PAR_TP];
    double coll = tp_wait + (wait[PAR_DP] - wait0[PAR_DP]) + (wait[PAR_ENDS] - wait0[PAR_ENDS]) +
                  (wait[PAR_WORLD] - wait0[PAR_WORLD]) + pt->send_s;
    double mine[K] = {dt, pt->compute_s - tp_wait, coll, pt->idle_s, d[PAR_TP],
                      d[PAR_PP] + d[PAR_ENDS], d[PAR_DP],
                      /* this rank's own work: computing and reading its data */
                      pt->compute_s - tp_wait + pt->data_s,
                      /* blocked in each communicator (the pipeline's: its receives, the
                         bubble among them, and its ends' sum) */
                      tp_wait, wait[PAR_PP] - wait0[PAR_PP] + wait[PAR_ENDS] - wait0[PAR_ENDS],
                      wait[PAR_DP] - wait0[PAR_DP]};
    int n = t->where->world;
    double *all = malloc((size_t)n * K * sizeof *all), *times = malloc((size_t)n * sizeof *times);
    int rc = all && times ? parallel_gather(&t->par, mine, K, all, err)
                          : error_set(err, "out of memory");
    if (rc == 0) {
        double slowest = 0, share[3] = {0}, sent[3] = {0}, blocked[3] = {0};
        int has[3] = {t->par.tp != NULL, t->par.pp != NULL, t->par.dp != NULL};
        for (int r = 0; r < n; r++) slowest = fmax(slowest, all[(size_t)r * K]);
        for (int r = 0; r < n; r++) {
            const double *v = all + (size_t)r * K;
            times[r] = v[7];
            if (v[7] > times[sm->straggler]) sm->straggler = r;
            for (int k = 0; k < 3; k++) {
                share[k] += v[1 + k] / slowest / n;
                sent[k] += v[4 + k] / n;
                blocked[k] += v[8 + k] / n;
            }
        }
        sm->step_ms = 1e3 * slowest;
        sm->busy_ms = 1e3 * times[sm->straggler];
        for (int i = 1; i < n; i++) /* the median: insertion sort of a few ranks */
            for (int j = i; j > 0 && times[j - 1] > times[j]; j--) {
                double x = times[j];
                times[j] = times[j - 1];
                times[j - 1] = x;
            }
        sm->median_busy_ms = 1e3 * (n % 2 ? times[n / 2] : (times[n / 2 - 1] + times[n / 2]) / 2);
        sm->compute_pct = 100 * share[0];
        sm->comm_pct = 100 * share[1];
        sm->idle_pct = 100 * share[2];
        sm->bytes_tp = has[0] ? sent[0] : 0;
        sm->bytes_pp = has[1] ? sent[1] : 0;
        sm->bytes_dp = has[2] ? sent[2] : 0;
        sm->wait_tp_ms = has[0] ? 1e3 * blocked[0] : 0;
        sm->wait_pp_ms = has[1] ? 1e3 * blocked[1] : 0;
        sm->wait_dp_ms = has[2] ? 1e3 * blocked[2] : 0;
    }
    free(all);
    free(times);
    return rc;
}

static int run_steps(struct trainer *t, struct plait_error *err)
{
    const struct plan *p = t->plan;
    int B = p->batch.micro_batch, T = p->model.seq_len, A = p->batch.grad_accum;
    /* the mean over the global batch: A micro-batches on each of the dp ranks */
    float grad_scale = 1.0f / ((float)B * T * A * t->where->dp);
    int first_step = t->st.step;
    if (t->st.eval_pending && t->has_val) {
        int r = evaluate(t, err);
        if (r < 0) return -1;
        if (r == 1) return save(t, false, err) ? -1 : PLAIT_EXIT_PREEMPTED;
        t->st.eval_pending = 0;
    }
    while (t->st.step < p->steps) {
        int s = t->st.step; /* 0-based index of the step being taken */
        double t0 = now_s(), bytes0[PAR_NCOMM], wait0[PAR_NCOMM];
        parallel_comm_totals(&t->par, bytes0, wait0);
        double lr = plan_lr(&p->optimizer, p->steps, s);
        bool dump = t->dump_dir && s == t->dump_step && t->st.micro == 0; /* not resumed mid-way */
        int stopped = train_micro_batches(t, s, grad_scale, err);
        if (stopped < 0) return -1;
        if (stopped) {
            log_info("signal %d: stopping after micro-batch %d of step %d (of %d%s)",
                     (int)train_stop_signal, t->st.micro, s + 1, A,
                     t->where->pp > 1 ? "; the pipeline drained" : "");
            return save(t, false, err) ? -1 : PLAIT_EXIT_PREEMPTED;
        }
        double norm;
        struct optim_groups groups = {
            .dp = &t->par.g_dp, .mp = &t->par.g_mp, .summed = t->bucketed};
        /* The sums over dp (ZeRO 0) or reduce-scatters (1) started during
         * backward (not in a dump's step: the dump shows every rank's own
         * gradients) are waited for, then the LayerNorms' sum over tp is taken
         * in what they reduced; the embeddings' bucket starts only after the
         * tied wte's sum. ZeRO 2 did its reductions after each micro-batch. */
        bool in_flight = t->bucketed && !dump && t->m.zero < 2;
        bool after = t->bucketed && dump && t->m.zero < 2;
        if ((t->m.zero < 2 && tied_sum(t, err)) ||
            (in_flight && buckets_finish(&t->buckets, B, T, true, err)) ||
            (t->m.zero < 2 && !in_flight && model_sum_layernorm_grads(&t->m, err)) ||
            (dump && dump_step1(t, err)) ||
            (after && buckets_finish(&t->buckets, B, T, false, err)) ||
            optim_step(&t->m, &p->optimizer, lr, s + 1, &groups, &norm, err))
            return -1;
        /* the step's loss: the last stage's, over the dp ranks' micro-batches */
        double loss = t->st.loss_sum / A;
        if (t->multi) {
            double v = t->m.last && t->where->tp_rank == 0 ? t->st.loss_sum : 0;
            if (t->par.g_world.allreduce_f64(t->par.g_world.ctx, &v, 1, err)) return -1;
            loss = v / ((double)A * t->where->dp);
        }
        if (!isfinite(loss) || !isfinite(norm))
            return error_set(err,
                             "step %d: loss %g, gradient norm %g: training diverged (lower "
                             "optimizer.lr or set optimizer.grad_clip)",
                             s + 1, loss, norm);
        t->st.step = s + 1;
        t->st.micro = 0;
        t->st.loss_sum = 0;
        /* the step took as long as its slowest rank */
        double dt = now_s() - t0;
        struct step_metrics sm = {.ranks = t->where->world, .bubble_sim_pct = 100 * t->bubble_sim};
        if (t->multi && step_report(t, dt, bytes0, wait0, &sm, err)) return -1;
        if (t->multi) dt = sm.step_ms / 1e3;
        double tokens = (double)B * T * A * t->where->dp;
        sm.step = s + 1;
        sm.loss = loss;
        sm.lr = lr;
        sm.grad_norm = norm;
        sm.tokens = (int64_t)tokens;
        sm.tokens_total = t->st.tokens;
        sm.ms = 1e3 * dt;
        sm.tokens_per_s = tokens / dt;
        sm.peak_pct = t->peak_gflops > 0 ? 100.0 * t->flops_per_token * tokens / dt /
                                               (t->peak_gflops * 1e9 * t->where->world)
                                         : 0.0;
        sm.mfu = gpu_mfu(t->flops_per_token, sm.tokens_per_s, t->gpu_peak_tflops, t->where->world);
        if (t->where->rank == 0 && metrics_step(&t->metrics, &sm, err)) return -1;
        if (s == first_step) { /* a process's first step warms up: not in the averages */
            struct profile kept = t->m.prof;
            memset(&t->m.prof, 0, sizeof t->m.prof);
            t->m.prof.sync = kept.sync, t->m.prof.sync_ctx = kept.sync_ctx;
            const char *fp8_fallback =
                t->m.ops->fp8_fallback ? t->m.ops->fp8_fallback(t->m.ctx) : NULL;
            if (fp8_fallback && t->where->rank == 0) log_warn("%s", fp8_fallback);
            if (memory_report(t, s + 1, err)) return -1;
        } else {
            t->timed_s += dt;
            t->m.prof.steps++;
        }
        if (t->where->rank == 0)
            progress_line(t, &sm, t->m.prof.steps ? t->timed_s / t->m.prof.steps : dt);
        bool last = t->st.step == p->steps;
        bool eval_due =
            t->has_val && (last || (p->data.val_every > 0 && t->st.step % p->data.val_every == 0));
        if (eval_due) {
            int r = evaluate(t, err);
            if (r < 0 && t->data_failed) {
                t->st.eval_pending = 1;
                return fail_keeping_progress(t, err);
            }
            if (r < 0) return -1;
            if (r == 1) {
                t->st.eval_pending = 1;
                log_info("signal %d: stopping during the evaluation after step %d",
                         (int)train_stop_signal, t->st.step);
                return save(t, false, err) ? -1 : PLAIT_EXIT_PREEMPTED;
            }
        }
        int stop = train_stop_signal != 0; /* any rank's stop is every rank's */
        if (t->multi && parallel_max_int(&t->par, &stop, err)) return -1;
        if (stop && !train_stop_signal) train_stop_signal = SIGTERM;
        int by_time = minutes_due(t, err);
        if (by_time < 0) return -1;
        bool ckpt_due = last || stop || by_time ||
                        (p->checkpoint.every > 0 && t->st.step % p->checkpoint.every == 0);
        /* periodic checkpoints may be written in the background; the last one and
         * a stop's are written at once */
        if (ckpt_due && save(t, !last && !stop, err)) return -1;
        if (!ckpt_due) { /* one written in the background is committed once every rank's is */
            struct ckpt_target to = ckpt_target(t);
            int committed = ckpt_async_poll(&t->async, &to, err);
            if (committed < 0) return -1;
            if (committed) t->ckpt_write_s = t->async.written_s;
        }
        if (stop && !last) {
            log_info("signal %d: stopped after step %d", (int)train_stop_signal, t->st.step);
            return PLAIT_EXIT_PREEMPTED;
        }
    }
    return PLAIT_EXIT_OK;
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

/* A first start that failed leaves nothing behind: what it wrote in the
 * directories it created, and they, go (only when they hold no history, and
 * by rmdir: anything else there keeps them). After teardown (the locks). */
static void undo_failed_start(struct trainer *t, bool history)
{
    static const char *const files[] = {RUNDIR_LOCK, RUNDIR_PLAN, RUNDIR_RUN, RUNDIR_METRICS,
                                        RUNDIR_LOG};
    char path[4096];
    struct plait_error ignored;
    if (!history && t->made_ckpt_dir &&
        !fs_join(path, sizeof path, t->ckpt_dir, RUNDIR_LOCK, &ignored)) {
        unlink(path);
        fs_rmdir_up(t->ckpt_dir, t->made_ckpt_dir);
    }
    for (size_t k = 0; !history && t->made_run_dir && k < sizeof files / sizeof *files; k++)
        if (!fs_join(path, sizeof path, t->run_dir, files[k], &ignored)) unlink(path);
    if (!history) fs_rmdir_up(t->run_dir, t->made_run_dir);
    free(t->made_run_dir);
    free(t->made_ckpt_dir);
}

int train_run(const struct plan *plan, const char *plan_json, const char *run_dir,
              const struct env_rank *where, struct plait_error *err)
{
    struct trainer t = {.plan = plan,
                        .last_loss = NAN,
                        .last_val = NAN,
                        .where = where,
                        .plan_json = plan_json,
                        .run_dir = run_dir,
                        .run_lock = {-1},
                        .ckpt_lock = {-1}};
    int rc = -1;
    if (setup(&t, err)) goto out;
    if (t.st.step >= plan->steps) {
        log_info("the run in %s already finished its %d step%s", run_dir, plan->steps,
                 plan->steps == 1 ? "" : "s");
        rc = PLAIT_EXIT_OK;
        goto out;
    }
    log_info("%zu parameters, %d layers, hidden %d, %s, micro-batch %d×%d, %d step%s of %d "
             "micro-batch%s, %d thread%s, %.0f GFLOP/s peak, activations %.1f MB (recompute %s)",
             t.m.shard.total, plan->model.layers, plan->model.hidden,
             plan_precision_name(plan->precision), plan->batch.micro_batch, plan->model.seq_len,
             plan->steps, plan->steps == 1 ? "" : "s", plan->batch.grad_accum,
             plan->batch.grad_accum == 1 ? "" : "es", omp_get_max_threads(),
             omp_get_max_threads() == 1 ? "" : "s", t.peak_gflops, t.m.allocated.activations / 1e6,
             plan_recompute_name(plan->recompute));
    if (t.multi)
        log_info("tp %d × pp %d × dp %d = %d ranks (%s schedule%s%s): a global batch of %d "
                 "micro-batch%s × %d sequence%s × %d tokens per step",
                 where->tp, where->pp, where->dp, where->world,
                 plan_pipeline_name(plan->parallel.schedule), plan->parallel.zero ? ", ZeRO" : "",
                 plan->parallel.sequence_parallel ? ", sequence parallel" : "",
                 plan->batch.grad_accum * where->dp,
                 plan->batch.grad_accum * where->dp == 1 ? "" : "es", plan->batch.micro_batch,
                 plan->batch.micro_batch == 1 ? "" : "s", plan->model.seq_len);
    if (bf16_emulation(&t) && where->rank == 0) log_warn("%s", bf16_emulation(&t));
    if (plan->precision == PLAN_PRECISION_FP8 && strcmp(t.m.ops->name, "cpu") == 0 &&
        where->rank == 0)
        log_info("fp8 matrix products emulated on the CPU: operands quantised to fp8 "
                 "(kernels/fp8.h, %s scaling) and multiplied in fp32: fp8's numerics, below "
                 "fp32's speed",
                 plan_fp8_scaling_name(plan->fp8_scaling));
    /* samples need the whole model on one rank */
    bool samples = !t.multi;
    if (samples && t.st.step == 0 && t.st.micro == 0 && print_sample(&t, "before training", err))
        goto out;
    t.saved_at_s = now_s();
    /* a printed profile on an asynchronous backend waits for the device around each phase */
    if (getenv(PLAIT_ENV_PROFILE) && t.m.ops->synchronize)
        t.m.prof.sync = t.m.ops->synchronize, t.m.prof.sync_ctx = t.m.ctx;
    rc = run_steps(&t, err);
    if (getenv(PLAIT_ENV_PROFILE) && t.m.prof.steps > 0 && where->rank == 0)
        profile_print(&t.m.prof, t.timed_s / t.m.prof.steps, stdout);
    if (samples && rc == PLAIT_EXIT_OK && !train_stop_signal &&
        print_sample(&t, "after training", err))
        rc = -1;
    if (rc >= 0 && where->rank == 0) {
        final_summary(&t, rc);
        struct plait_error why; /* the measured speed beside the modelled: a report */
        if (write_run_json(&t, &why)) log_warn("run.json: %s", why.text);
    }
out:
    if (rc < 0 && t.par_ready) parallel_abort(&t.par, err->text);
    bool history = rc >= 0 || (t.ckpts_open && run_has_history(&t, false));
    teardown(&t);
    undo_failed_start(&t, history);
    return rc;
}
