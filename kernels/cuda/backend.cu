/* backend.cu — the CUDA backend's context and table: the sticky error and the
 * check helpers, open/close of a context (device, stream, cuBLASLt handle and
 * workspace, scratch buffers, encoder.cu's host buffers), memory ops (alloc
 * zeroed, copies on the context's stream; download_after's on a copy stream of its
 * own), and ops_cuda(). The kernels live
 * in the other .cu files, one per group. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/fp8_cuda.cuh"
#include "kernels/ops_error.h"

/* ---- sticky error ------------------------------------------------------------- */

void cu_set_error(struct ops_ctx *ctx, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ops_error_vset(&ctx->error, fmt, ap);
    va_end(ap);
}

bool cu_fail_cuda(struct ops_ctx *ctx, cudaError_t e, const char *what, const char *file, int line)
{
    if (e == cudaSuccess) return false;
    cu_set_error(ctx, "%s:%d: %s: CUDA error %s: %s", file, line, what, cudaGetErrorName(e),
                 cudaGetErrorString(e));
    return true;
}

bool cu_fail_lt(struct ops_ctx *ctx, cublasStatus_t s, const char *what, const char *file, int line)
{
    if (s == CUBLAS_STATUS_SUCCESS) return false;
    cu_set_error(ctx, "%s:%d: %s: cuBLASLt error %s", file, line, what, cublasLtGetStatusString(s));
    return true;
}

/* Waits for the stream (faults of earlier kernels surface here), then hands
 * over the first error since the last call. */
static int cuda_take_error(struct ops_ctx *ctx, char *buf, size_t bytes)
{
    if (ctx->stream) (void)CUDA_OK(ctx, cudaStreamSynchronize(ctx->stream));
    (void)CUDA_OK(ctx, cudaGetLastError());
    return ops_error_take(&ctx->error, buf, bytes);
}

/* ---- scratch ------------------------------------------------------------------------ */

/* A slot asked for more than its reservation: said once (cuda_scratch_grown), or
 * refused where PLAIT_DEBUG_SCRATCH_STRICT=1, but for the fp8 fallback's operands, which
 * the device decides (block scaling off sm_90, alignment, no cuBLASLt algorithm: what
 * gpt2_scratch.c cannot foresee; matmul_fp8.cu says the fallback too). false: refused,
 * the error recorded. */
static bool scratch_beyond_reservation(struct ops_ctx *ctx, int slot, size_t bytes)
{
    size_t reserved = ctx->scratch_reserved_bytes[slot];
    const char *fmt = "CUDA scratch slot %s grew past its reservation: %zu bytes asked, %zu "
                      "reserved (common/gpt2/gpt2_scratch.c counts it short: device memory "
                      "beyond plait check's prediction)";
    bool fallback = slot == CU_FP8_F32A || slot == CU_FP8_F32B;
    if (ctx->scratch_strict && !fallback) {
        cu_set_error(ctx, fmt, gpt2_scratch_slot_name(slot), bytes, reserved);
        return false;
    }
    if (!ctx->scratch_grown) {
        ctx->scratch_grown = true;
        snprintf(ctx->scratch_grown_line, sizeof ctx->scratch_grown_line, fmt,
                 gpt2_scratch_slot_name(slot), bytes, reserved);
    }
    return true;
}

void *cu_scratch(struct ops_ctx *ctx, int slot, size_t bytes)
{
    void **p = &ctx->scratch[slot];
    if (ctx->scratch_bytes[slot] >= bytes && *p) return *p;
    if (ctx->scratch_reserved && !scratch_beyond_reservation(ctx, slot, bytes)) return NULL;
    if (*p) {
        /* earlier kernels may still read it */
        (void)CUDA_OK(ctx, cudaStreamSynchronize(ctx->stream));
        (void)CUDA_OK(ctx, cudaFree(*p));
    }
    *p = NULL;
    ctx->scratch_bytes[slot] = 0;
    /* a table kept in the slot (optimizer.cu) is gone with it: sent again at its next use */
    if (slot == CU_SCRATCH_ADAMW) ctx->adamw_table.bytes = 0;
    if (slot == CU_SCRATCH_SUMSQ) ctx->sumsq_table.bytes = 0;
    size_t grown = bytes < 1024 ? 1024 : bytes;
    if (!CUDA_OK(ctx, cudaMalloc(p, grown))) {
        *p = NULL;
        return NULL;
    }
    ctx->scratch_bytes[slot] = grown;
    return *p;
}

/* ops.h reserve_scratch: each slot made at its size now (the step then grows none);
 * from here on a slot asked for more is reported. */
static int cuda_reserve_scratch(struct ops_ctx *ctx, const uint64_t *bytes, int n_slots)
{
    if (n_slots != CU_SLOTS) {
        cu_set_error(ctx, "reserve_scratch: %d slots given, the backend has %d", n_slots,
                     CU_SLOTS);
        return -1;
    }
    ctx->scratch_reserved = false; /* (a second reservation replaces the first) */
    for (int i = 0; i < CU_SLOTS; i++)
        if (bytes[i] && !cu_scratch(ctx, i, (size_t)bytes[i])) return -1;
    for (int i = 0; i < CU_SLOTS; i++) ctx->scratch_reserved_bytes[i] = (size_t)bytes[i];
    const char *strict = getenv("PLAIT_DEBUG_SCRATCH_STRICT");
    ctx->scratch_strict = strict && !strcmp(strict, "1");
    ctx->scratch_reserved = true;
    return 0;
}

/* ops.h scratch_grown: the first slot that grew past its reservation, or NULL */
static const char *cuda_scratch_grown(struct ops_ctx *ctx)
{
    return ctx->scratch_grown ? ctx->scratch_grown_line : NULL;
}

/* ---- memory ---------------------------------------------------------------------- */

static void *cuda_alloc(struct ops_ctx *ctx, size_t bytes)
{
    void *p = NULL;
    size_t rounded = bytes ? (bytes + 255) / 256 * 256 : 256;
    cudaError_t e = cudaMalloc(&p, rounded);
    if (e != cudaSuccess) {
        cu_set_error(ctx, "out of GPU memory allocating %zu bytes on device %d: %s", bytes,
                     ctx->device, cudaGetErrorString(e));
        (void)cudaGetLastError(); /* an allocation failure is not sticky */
        return NULL;
    }
    /* zeroed, and ready before the caller's next op on any stream */
    if (!CUDA_OK(ctx, cudaMemsetAsync(p, 0, rounded, ctx->stream)) ||
        !CUDA_OK(ctx, cudaStreamSynchronize(ctx->stream))) {
        cudaFree(p);
        return NULL;
    }
    return p;
}

static void cuda_free(struct ops_ctx *ctx, void *p)
{
    if (p) (void)CUDA_OK(ctx, cudaFree(p));
}

/* From host memory the caller may reuse at once: done when this returns. */
static void cuda_upload(struct ops_ctx *ctx, void *dst, const void *host_src, size_t bytes)
{
    if (!bytes) return;
    CUDA_TRY(ctx, cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, ctx->stream));
    CUDA_TRY(ctx, cudaStreamSynchronize(ctx->stream));
}

/* Page-locked (portable: any context's copies take it at full speed), zeroed. */
static void *cuda_host_alloc(struct ops_ctx *ctx, size_t bytes)
{
    void *p = NULL;
    if (!CUDA_OK(ctx, cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocPortable))) return NULL;
    memset(p, 0, bytes);
    return p;
}

static void cuda_host_free(struct ops_ctx *ctx, void *p)
{
    if (p) (void)CUDA_OK(ctx, cudaFreeHost(p));
}

static void cuda_bind_thread(struct ops_ctx *ctx)
{
    (void)CUDA_OK(ctx, cudaSetDevice(ctx->device));
}

/* Device or managed memory; host memory, page-locked or not, is not (an unregistered
 * pointer's error is cleared: it is the host's). */
static bool cuda_is_device_memory(struct ops_ctx *ctx, const void *p)
{
    (void)ctx;
    cudaPointerAttributes a;
    if (!p || cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

static void cuda_memory_in_use(struct ops_ctx *ctx, uint64_t *used, uint64_t *total)
{
    size_t free_b = 0, total_b = 0;
    if (!CUDA_OK(ctx, cudaMemGetInfo(&free_b, &total_b))) free_b = total_b = 0;
    *used = total_b - free_b;
    *total = total_b;
}

static void cuda_download(struct ops_ctx *ctx, void *host_dst, const void *src, size_t bytes)
{
    if (!bytes) return;
    CUDA_TRY(ctx, cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, ctx->stream));
    CUDA_TRY(ctx, cudaStreamSynchronize(ctx->stream));
}

/* ops.h download_after: an event recorded on the context's stream, which the copy stream
 * (made with the event at the first call) waits for before the copy; the context's stream
 * runs on meanwhile. host_dst is page-locked (host_alloc's): the copy is asynchronous. */
static void cuda_download_after(struct ops_ctx *ctx, void *host_dst, const void *src, size_t bytes)
{
    if (!bytes) return;
    if (!ctx->copy_stream &&
        !CUDA_OK(ctx, cudaStreamCreateWithFlags(&ctx->copy_stream, cudaStreamNonBlocking))) {
        ctx->copy_stream = NULL;
        return;
    }
    if (!ctx->copy_after &&
        !CUDA_OK(ctx, cudaEventCreateWithFlags(&ctx->copy_after, cudaEventDisableTiming))) {
        ctx->copy_after = NULL;
        return;
    }
    CUDA_TRY(ctx, cudaEventRecord(ctx->copy_after, ctx->stream));
    CUDA_TRY(ctx, cudaStreamWaitEvent(ctx->copy_stream, ctx->copy_after, 0));
    CUDA_TRY(ctx, cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, ctx->copy_stream));
}

/* ops.h copies_wait: every download_after done (a fault in one surfaces here) */
static void cuda_copies_wait(struct ops_ctx *ctx)
{
    if (ctx->copy_stream) (void)CUDA_OK(ctx, cudaStreamSynchronize(ctx->copy_stream));
}

static void cuda_copy(struct ops_ctx *ctx, void *dst, const void *src, size_t bytes)
{
    if (!bytes || dst == src) return;
    CUDA_TRY(ctx, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, ctx->stream));
}

static void cuda_copy_rows(struct ops_ctx *ctx, void *dst, size_t dst_pitch, const void *src,
                           size_t src_pitch, size_t row_bytes, size_t rows)
{
    if (!rows || !row_bytes) return;
    CUDA_TRY(ctx, cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, row_bytes, rows,
                                    cudaMemcpyDeviceToDevice, ctx->stream));
}

static void cuda_zero(struct ops_ctx *ctx, void *p, size_t bytes)
{
    if (bytes) CUDA_TRY(ctx, cudaMemsetAsync(p, 0, bytes, ctx->stream));
}

/* bf16 products run on the tensor cores of sm_80 and later: never emulated */
static const char *cuda_bf16_emulation(struct ops_ctx *ctx)
{
    (void)ctx;
    return NULL;
}

/* ---- the table ----------------------------------------------------------------------- */

static struct ops_ctx *cuda_open(int device, char *errbuf, size_t errbuf_bytes);
static void cuda_close(struct ops_ctx *ctx);

static void *cuda_stream(struct ops_ctx *ctx)
{
    return (void *)ctx->stream;
}

static void cuda_synchronize(struct ops_ctx *ctx)
{
    (void)CUDA_OK(ctx, cudaStreamSynchronize(ctx->stream));
}

/* Attention: on the bf16 tensor cores (attention_tc.cu) in bf16 and fp8 runs,
 * else fused in fp32 (attention_fused.cu). PLAIT_CUDA_ATTENTION at the first
 * ops_cuda(): "fp32" keeps the fused fp32 one in every precision, "simple"
 * runs attention.cu's, which keeps the probabilities. */
static struct ops cuda_ops = {
    .name = "cuda",
    .open = cuda_open,
    .close = cuda_close,
    .stream = cuda_stream,
    .synchronize = cuda_synchronize,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .upload = cuda_upload,
    .download = cuda_download,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .download_after = cuda_download_after,
    .copies_wait = cuda_copies_wait,
    .bind_thread = cuda_bind_thread,
    .is_device_memory = cuda_is_device_memory,
    .memory_in_use = cuda_memory_in_use,
    .copy = cuda_copy,
    .copy_rows = cuda_copy_rows,
    .zero = cuda_zero,
    .take_error = cuda_take_error,
    .encoder_forward = cu_encoder_forward,
    .encoder_backward = cu_encoder_backward,
    .add_bias = cu_add_bias,
    .layernorm_forward = cu_layernorm_forward,
    .layernorm_backward = cu_layernorm_backward,
    .matmul_forward = cu_matmul_forward,
    .matmul_forward_gelu = cu_matmul_forward_gelu,
    .matmul_backward = cu_matmul_backward,
    .matmul_forward_fp8 = cu_matmul_forward_fp8, /* NULL below sm_89 (open) */
    .matmul_backward_fp8 = cu_matmul_backward_fp8,
    .quantize_fp8 = cu_quantize_fp8,
    .attention_forward = cu_attention_forward,
    .attention_backward = cu_attention_backward,
    .attention_forward_fused = ops_cuda_attention_fused_forward,
    .attention_backward_fused = ops_cuda_attention_fused_backward,
    .attention_block_forward = ops_cuda_attention_block_forward,
    .attention_block_backward = ops_cuda_attention_block_backward,
    .attention_bf16_takes = cu_attention_bf16_takes,
    .attention_forward_bf16 = cu_attention_forward_bf16,
    .attention_backward_bf16 = cu_attention_backward_bf16,
    .gelu_forward = cu_gelu_forward,
    .gelu_backward = cu_gelu_backward,
    .rmsnorm_forward = cu_rmsnorm_forward, /* the Llama ops: llama.cu */
    .rmsnorm_backward = cu_rmsnorm_backward,
    .rope_forward = cu_rope_forward,
    .rope_backward = cu_rope_backward,
    .kv_expand = cu_kv_expand,
    .kv_expand_backward = cu_kv_expand_backward,
    .rope_kv_expand = cu_rope_kv_expand, /* rope_expand.cu */
    .rope_kv_expand_backward = cu_rope_kv_expand_backward,
    .swiglu_forward = cu_swiglu_forward,
    .swiglu_backward = cu_swiglu_backward,
    .moe_route = cu_moe_route, /* mixture-of-experts routing: moe.cu */
    .moe_dispatch = cu_moe_dispatch,
    .moe_gather = cu_moe_gather,
    .moe_gather_backward = cu_moe_gather_backward,
    .moe_combine = cu_moe_combine,
    .moe_combine_backward = cu_moe_combine_backward,
    .moe_route_backward = cu_moe_route_backward,
    .moe_losses = cu_moe_losses,
    .residual_forward = cu_residual_forward,
    .residual_layernorm_forward = cu_residual_layernorm_forward, /* norm_fused.cu */
    .residual_rmsnorm_forward = cu_residual_rmsnorm_forward,
    /* the activations stored in bf16: the namesakes' kernels with a bf16 output (one
     * kernel each), the products on the bf16 activation as it is */
    .layernorm_forward16 = cu_layernorm_forward16,
    .rmsnorm_forward16 = cu_rmsnorm_forward16,
    .gelu_forward16 = cu_gelu_forward16,
    .swiglu_forward16 = cu_swiglu_forward16,
    .matmul_forward16 = cu_matmul_forward16,
    .matmul_backward16 = cu_matmul_backward16,
    .matmul_forward_gelu16 = cu_matmul_forward_gelu16,
    .residual_layernorm_forward16 = cu_residual_layernorm_forward16,
    .residual_rmsnorm_forward16 = cu_residual_rmsnorm_forward16,
    .classifier16 = cu_classifier16,
    .classifier_finish16 = cu_classifier_finish16,
    .matmul_backward_dout16 = cu_matmul_backward_dout16,
    .classifier = cu_classifier,
    .classifier_max = cu_classifier_max,
    .classifier_sumexp = cu_classifier_sumexp,
    .classifier_finish = cu_classifier_finish,
    .sum_squares = cu_sum_squares,
    .adamw = cu_adamw,
    .adamw_multi = cu_adamw_multi,
    .to_bf16 = cu_to_bf16,
    .bf16_emulation = cuda_bf16_emulation,
    .fp8_fallback = cu_fp8_fallback,
    .reserve_scratch = cuda_reserve_scratch,
    .scratch_grown = cuda_scratch_grown,
};

extern "C" int ops_cuda_built(void)
{
    return 1;
}

extern "C" int ops_cuda_device_count(char *why, size_t why_bytes)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        if (why && why_bytes)
            snprintf(why, why_bytes, "no CUDA device here (%s)",
                     e != cudaSuccess ? cudaGetErrorString(e) : "the driver sees no GPU");
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

/* The device the open contexts share, and how many are open. */
static pthread_mutex_t bind_lock = PTHREAD_MUTEX_INITIALIZER;
static int bound_device = -1, open_contexts;

static void read_attention_choice(void)
{
    const char *attention = getenv("PLAIT_CUDA_ATTENTION");
    if (attention && (!strcmp(attention, "simple") || !strcmp(attention, "fp32"))) {
        cuda_ops.attention_bf16_takes = NULL;
        cuda_ops.attention_forward_bf16 = NULL;
        cuda_ops.attention_backward_bf16 = NULL;
    }
    if (attention && !strcmp(attention, "simple")) {
        cuda_ops.attention_forward_fused = NULL;
        cuda_ops.attention_backward_fused = NULL;
    }
}

extern "C" const struct ops *ops_cuda(char *errbuf, size_t errbuf_bytes)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    char why[512] = "";
    if (ops_cuda_device_count(why, sizeof why) == 0) {
        if (errbuf && errbuf_bytes) snprintf(errbuf, errbuf_bytes, "%s", why);
        return NULL;
    }
    if (pthread_once(&once, read_attention_choice) != 0) {
        if (errbuf && errbuf_bytes)
            snprintf(errbuf, errbuf_bytes, "the CUDA backend could not be initialised");
        return NULL;
    }
    return &cuda_ops;
}

/* Frees what ctx holds (a context open() may have half made). */
static void release(struct ops_ctx *ctx)
{
    if (ctx->stream) (void)cudaStreamSynchronize(ctx->stream);
    if (ctx->copy_stream) (void)cudaStreamSynchronize(ctx->copy_stream);
    if (ctx->copy_after) (void)cudaEventDestroy(ctx->copy_after);
    if (ctx->copy_stream) (void)cudaStreamDestroy(ctx->copy_stream);
    for (int i = 0; i < CU_SLOTS; i++)
        if (ctx->scratch[i]) (void)cudaFree(ctx->scratch[i]);
    if (ctx->lt_workspace) (void)cudaFree(ctx->lt_workspace);
    if (ctx->lt) (void)cublasLtDestroy(ctx->lt);
    if (ctx->stream) (void)cudaStreamDestroy(ctx->stream);
    free(ctx->enc.tokens);
    free(ctx->enc.idx);
    free(ctx->enc.count);
    free(ctx->adamw_table.host);
    free(ctx->sumsq_table.host);
    ops_error_destroy(&ctx->error);
    free(ctx);
}

static struct ops_ctx *cuda_open(int device, char *errbuf, size_t errbuf_bytes)
{
    char why[512] = "";
    struct ops_ctx *ctx = (struct ops_ctx *)calloc(1, sizeof *ctx);
    if (!ctx || ops_error_init(&ctx->error)) {
        free(ctx);
        if (errbuf && errbuf_bytes)
            snprintf(errbuf, errbuf_bytes, "out of memory for a CUDA backend context");
        return NULL;
    }
    ctx->device = device;
    pthread_mutex_lock(&bind_lock);
    int n = ops_cuda_device_count(why, sizeof why);
    cudaDeviceProp prop;
    if (n == 0) goto fail;
    if (open_contexts > 0 && device != bound_device) {
        snprintf(why, sizeof why, "device %d asked for, but this process already uses %d", device,
                 bound_device);
        goto fail;
    }
    if (device < 0 || device >= n) {
        snprintf(why, sizeof why, "CUDA device %d does not exist (%d visible)", device, n);
        goto fail;
    }
    if (!CUDA_OK(ctx, cudaSetDevice(device)) ||
        !CUDA_OK(ctx, cudaGetDeviceProperties(&prop, device)))
        goto fail_cuda;
    if (prop.major < 8) {
        snprintf(why, sizeof why,
                 "CUDA device %d (%s) is sm_%d%d; this build runs on sm_80 and later", device,
                 prop.name, prop.major, prop.minor);
        goto fail;
    }
    ctx->cc = prop.major * 10 + prop.minor;
    if (ctx->cc < CU_FP8_MIN_CC) { /* no fp8 tensor cores: device.c says so, one device a process */
        cuda_ops.matmul_forward_fp8 = NULL;
        cuda_ops.matmul_backward_fp8 = NULL;
        cuda_ops.quantize_fp8 = NULL;
    }
    ctx->lt_workspace_bytes = GPT2_CUBLASLT_WORKSPACE_BYTES; /* plait check counts it */
    if (!CUDA_OK(ctx, cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking)) ||
        !LT_OK(ctx, cublasLtCreate(&ctx->lt)) ||
        !CUDA_OK(ctx, cudaMalloc(&ctx->lt_workspace, ctx->lt_workspace_bytes)))
        goto fail_cuda;
    bound_device = device;
    open_contexts++;
    pthread_mutex_unlock(&bind_lock);
    return ctx;
fail_cuda:
    ops_error_take(&ctx->error, why, sizeof why);
fail:
    pthread_mutex_unlock(&bind_lock);
    release(ctx);
    if (errbuf && errbuf_bytes) snprintf(errbuf, errbuf_bytes, "%s", why);
    return NULL;
}

static void cuda_close(struct ops_ctx *ctx)
{
    if (!ctx) return;
    release(ctx);
    pthread_mutex_lock(&bind_lock);
    open_contexts--;
    pthread_mutex_unlock(&bind_lock);
}
