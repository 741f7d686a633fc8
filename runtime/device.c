/* device.c — the device a rank trains on: the op backend from parallel.device
 * and PLAIT_DEVICE, the collective backend that fits it, and the device's
 * rates (its measured matrix product, its GPU's datasheet peak). The model and
 * the collectives are the model's (runtime/model_tp.c) and parallel.c's. */
#include "runtime/device.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/gpt2/gpt2_scratch_slots.h" // defines: GPT2_PEAK_PRODUCT_N, C, OC
#include "common/log.h"
#include "common/place/gpu.h"  // defines: gpu_peak_tflops
#include "common/place/topo.h" // defines: topo_load, topo_gpu_spec
#include "kernels/cuda/cuda_ops.h"
#include "kernels/fp8.h"
#include "runtime/profile.h" // defines: prof_now

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
 *   build has the CUDA backend (precision fp8 needs a GPU of sm_89 or later). A rank per
 * GPU, or PLAIT_RANKS_PER_GPU ranks on each, each its own CUDA context; the collectives'
 * backend is device_comm_backend's. */
static const struct ops *choose_device(const struct plan *p, const struct env_rank *w,
                                       struct ops_ctx **ctx, char *note, size_t note_bytes,
                                       struct plait_error *err)
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
    if (ops_cuda_built())
        snprintf(note, note_bytes, "parallel.device \"auto\": %s; training on the CPU", why);
    return ops_cpu();
}

const struct ops *device_open(const struct plan *p, const struct env_rank *w, struct ops_ctx **ctx,
                              char *note, size_t note_bytes, struct plait_error *err)
{
    char why[512] = "";
    *ctx = NULL;
    if (note_bytes) *note = '\0';
    const struct ops *o = choose_device(p, w, ctx, note, note_bytes, err);
    if (o && !*ctx && !(*ctx = o->open(0, why, sizeof why))) {
        error_set(err, "the %s backend: %s", o->name, why);
        return NULL;
    }
    return o;
}

int device_comm_backend(const struct plan *p, const struct env_rank *w, const struct ops *ops,
                        enum comm_backend_kind *kind, struct plait_error *err)
{
    bool gpu = strcmp(ops->name, "cpu") != 0;
    bool shared = gpu && w->ranks_per_gpu > 1; /* PLAIT_RANKS_PER_GPU: ranks sharing a GPU */
    enum plan_backend b = p->parallel.backend;
    *kind = gpu && !shared && b != PLAN_BACKEND_SOCKET ? COMM_BACKEND_NCCL : COMM_BACKEND_SOCKET;
    if (!gpu && b == PLAN_BACKEND_NCCL)
        return error_set(err,
                         "%s: parallel.backend: \"nccl\" moves GPU memory, but rank %d trains "
                         "on the CPU (parallel.device \"%s\"): use \"socket\" or \"auto\", or "
                         "parallel.device \"cuda\" where every rank has a GPU",
                         p->source, w->rank, plan_device_name(p->parallel.device));
    if (shared && b == PLAN_BACKEND_NCCL)
        return error_set(err,
                         "%s: parallel.backend: \"nccl\" takes one rank per GPU, but %s=%d puts "
                         "rank %d on CUDA device %d with %d other%s: use \"socket\" or \"auto\", "
                         "or %s=1",
                         p->source, PLAIT_ENV_RANKS_PER_GPU, w->ranks_per_gpu, w->rank,
                         w->device >= 0 ? w->device : 0, w->ranks_per_gpu - 1,
                         w->ranks_per_gpu == 2 ? "" : "s", PLAIT_ENV_RANKS_PER_GPU);
    /* the socket backend stages a GPU rank's device buffers through host memory
     * (parallel_init hands it the rank's ops); said once, by rank 0 */
    if (gpu && *kind == COMM_BACKEND_SOCKET && w->world > 1 && w->rank == 0)
        log_info("parallel.backend \"socket\" on GPU ranks%s: every collective is staged "
                 "through host memory (for tests and one-GPU machines; \"nccl\" is the fast "
                 "path, one rank per GPU)",
                 shared ? " sharing a GPU (" PLAIT_ENV_RANKS_PER_GPU ")" : "");
    return 0;
}

double device_peak_gflops(struct model *m)
{
    const struct ops *o = m->ops;
    /* (common/gpt2/gpt2_scratch.c counts the scratch this product takes) */
    int N = GPT2_PEAK_PRODUCT_N, C = GPT2_PEAK_PRODUCT_C, OC = GPT2_PEAK_PRODUCT_OC;
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
            double t0 = prof_now();
            if (fp8) /* the input's quantising included, as in training (the weight's copy is made
                        once a step) */
                o->matmul_forward_fp8(m->ctx, y, x, w8, s8, NULL, N, C, OC, m->fp8_scaling);
            else
                o->matmul_forward(m->ctx, y, x, w, w16, NULL, N, C, OC);
            float first; /* waits for the product (a GPU's runs asynchronously) */
            o->download(m->ctx, &first, y, sizeof first);
            double rate = 2.0 * N * C * OC / (prof_now() - t0) / 1e9;
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

double device_gpu_peak_tflops(const struct model *m, int device, enum plan_precision precision)
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
