/* backend.cu — the CUDA backend's state and table: the sticky error and the
 * check helpers, the device binding (stream, cuBLASLt handle and workspace),
 * memory ops (alloc zeroed, copies on the backend's stream), scratch buffers,
 * and ops_cuda(). The kernels live in the other .cu files, one per group. */
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

static struct ops_error cuda_error = OPS_ERROR_INIT;

void cu_set_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ops_error_vset(&cuda_error, fmt, ap);
    va_end(ap);
}

bool cu_fail_cuda(cudaError_t e, const char *what, const char *file, int line)
{
    if (e == cudaSuccess) return false;
    cu_set_error("%s:%d: %s: CUDA error %s: %s", file, line, what, cudaGetErrorName(e),
                 cudaGetErrorString(e));
    return true;
}

bool cu_fail_lt(cublasStatus_t s, const char *what, const char *file, int line)
{
    if (s == CUBLAS_STATUS_SUCCESS) return false;
    cu_set_error("%s:%d: %s: cuBLASLt error %s", file, line, what, cublasLtGetStatusString(s));
    return true;
}

/* Waits for the stream (faults of earlier kernels surface here), then hands
 * over the first error since the last call. */
static int cuda_take_error(char *buf, size_t bytes)
{
    if (cu_stream) (void)CUDA_OK(cudaStreamSynchronize(cu_stream));
    (void)CUDA_OK(cudaGetLastError());
    return ops_error_take(&cuda_error, buf, bytes);
}

/* ---- state ------------------------------------------------------------------------ */

cudaStream_t cu_stream;
cublasLtHandle_t cu_lt;
void *cu_lt_workspace;
size_t cu_lt_workspace_bytes;
static int bound_device = -1;

static void *scratch[CU_SLOTS];
static size_t scratch_bytes[CU_SLOTS];

void *cu_scratch(int slot, size_t bytes)
{
    if (scratch_bytes[slot] >= bytes && scratch[slot]) return scratch[slot];
    if (scratch[slot]) {
        (void)CUDA_OK(cudaStreamSynchronize(cu_stream)); /* earlier kernels may still read it */
        (void)CUDA_OK(cudaFree(scratch[slot]));
    }
    scratch[slot] = NULL;
    scratch_bytes[slot] = 0;
    size_t grown = bytes < 1024 ? 1024 : bytes;
    if (!CUDA_OK(cudaMalloc(&scratch[slot], grown))) {
        scratch[slot] = NULL;
        return NULL;
    }
    scratch_bytes[slot] = grown;
    return scratch[slot];
}

/* ---- memory ---------------------------------------------------------------------- */

static void *cuda_alloc(size_t bytes)
{
    void *p = NULL;
    size_t rounded = bytes ? (bytes + 255) / 256 * 256 : 256;
    cudaError_t e = cudaMalloc(&p, rounded);
    if (e != cudaSuccess) {
        cu_set_error("out of GPU memory allocating %zu bytes on device %d: %s", bytes, bound_device,
                     cudaGetErrorString(e));
        (void)cudaGetLastError(); /* an allocation failure is not sticky */
        return NULL;
    }
    /* zeroed, and ready before the caller's next op on any stream */
    if (!CUDA_OK(cudaMemsetAsync(p, 0, rounded, cu_stream)) ||
        !CUDA_OK(cudaStreamSynchronize(cu_stream))) {
        cudaFree(p);
        return NULL;
    }
    return p;
}

static void cuda_free(void *p)
{
    if (p) (void)CUDA_OK(cudaFree(p));
}

/* From host memory the caller may reuse at once: done when this returns. */
static void cuda_upload(void *dst, const void *host_src, size_t bytes)
{
    if (!bytes) return;
    CUDA_TRY(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, cu_stream));
    CUDA_TRY(cudaStreamSynchronize(cu_stream));
}

static void cuda_download(void *host_dst, const void *src, size_t bytes)
{
    if (!bytes) return;
    CUDA_TRY(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, cu_stream));
    CUDA_TRY(cudaStreamSynchronize(cu_stream));
}

static void cuda_copy(void *dst, const void *src, size_t bytes)
{
    if (!bytes || dst == src) return;
    CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cu_stream));
}

static void cuda_zero(void *p, size_t bytes)
{
    if (bytes) CUDA_TRY(cudaMemsetAsync(p, 0, bytes, cu_stream));
}

/* bf16 products run on the tensor cores of sm_80 and later: never emulated */
static const char *cuda_bf16_emulation(void)
{
    return NULL;
}

/* ---- the table ----------------------------------------------------------------------- */

/* the fused attention (attention_fused.cu) unless PLAIT_CUDA_ATTENTION=simple
 * at bind time (then attention.cu's, which keeps the probabilities) */
static struct ops cuda_ops = {
    .name = "cuda",
    .alloc = cuda_alloc,
    .free = cuda_free,
    .upload = cuda_upload,
    .download = cuda_download,
    .copy = cuda_copy,
    .zero = cuda_zero,
    .take_error = cuda_take_error,
    .encoder_forward = cu_encoder_forward,
    .encoder_backward = cu_encoder_backward,
    .add_bias = cu_add_bias,
    .layernorm_forward = cu_layernorm_forward,
    .layernorm_backward = cu_layernorm_backward,
    .matmul_forward = cu_matmul_forward,
    .matmul_backward = cu_matmul_backward,
    .matmul_forward_fp8 = cu_matmul_forward_fp8, /* NULL below sm_89 (bind) */
    .matmul_backward_fp8 = cu_matmul_backward_fp8,
    .quantize_fp8 = cu_quantize_fp8,
    .attention_forward = cu_attention_forward,
    .attention_backward = cu_attention_backward,
    .attention_forward_fused = ops_cuda_attention_fused_forward,
    .attention_backward_fused = ops_cuda_attention_fused_backward,
    .gelu_forward = cu_gelu_forward,
    .gelu_backward = cu_gelu_backward,
    .residual_forward = cu_residual_forward,
    .classifier = cu_classifier,
    .classifier_max = cu_classifier_max,
    .classifier_sumexp = cu_classifier_sumexp,
    .classifier_finish = cu_classifier_finish,
    .sum_squares = cu_sum_squares,
    .adamw = cu_adamw,
    .to_bf16 = cu_to_bf16,
    .bf16_emulation = cuda_bf16_emulation,
    .fp8_fallback = cu_fp8_fallback,
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

extern "C" const struct ops *ops_cuda(int device, char *errbuf, size_t errbuf_bytes)
{
    static pthread_mutex_t bind_lock = PTHREAD_MUTEX_INITIALIZER;
    const struct ops *ops = NULL;
    char why[512] = "";
    pthread_mutex_lock(&bind_lock);
    if (bound_device >= 0) {
        if (device == bound_device)
            ops = &cuda_ops;
        else
            snprintf(why, sizeof why, "device %d asked for, but this process already uses %d",
                     device, bound_device);
        goto out;
    }
    {
        int n = ops_cuda_device_count(why, sizeof why);
        if (n == 0) goto out;
        if (device < 0 || device >= n) {
            snprintf(why, sizeof why, "CUDA device %d does not exist (%d visible)", device, n);
            goto out;
        }
        cudaDeviceProp prop;
        if (!CUDA_OK(cudaSetDevice(device)) || !CUDA_OK(cudaGetDeviceProperties(&prop, device)))
            goto fail;
        if (prop.major < 8) {
            snprintf(why, sizeof why,
                     "CUDA device %d (%s) is sm_%d%d; this build runs on sm_80 and later", device,
                     prop.name, prop.major, prop.minor);
            goto out;
        }
        cu_lt_workspace_bytes = 32u << 20;
        if (!CUDA_OK(cudaStreamCreateWithFlags(&cu_stream, cudaStreamNonBlocking)) ||
            !LT_OK(cublasLtCreate(&cu_lt)) ||
            !CUDA_OK(cudaMalloc(&cu_lt_workspace, cu_lt_workspace_bytes)))
            goto fail;
        cu_fp8_bind(prop.major * 10 + prop.minor);
        if (prop.major * 10 + prop.minor <
            CU_FP8_MIN_CC) { /* no fp8 tensor cores: train.c says so */
            cuda_ops.matmul_forward_fp8 = NULL;
            cuda_ops.matmul_backward_fp8 = NULL;
            cuda_ops.quantize_fp8 = NULL;
        }
        const char *attention = getenv("PLAIT_CUDA_ATTENTION");
        if (attention && !strcmp(attention, "simple")) {
            cuda_ops.attention_forward_fused = NULL;
            cuda_ops.attention_backward_fused = NULL;
        }
        bound_device = device;
        ops = &cuda_ops;
        goto out;
    }
fail:
    cuda_take_error(why, sizeof why);
out:
    pthread_mutex_unlock(&bind_lock);
    if (!ops && errbuf && errbuf_bytes) snprintf(errbuf, errbuf_bytes, "%s", why);
    return ops;
}
