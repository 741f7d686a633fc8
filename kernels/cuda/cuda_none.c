/* cuda_none.c — the stand-in for the CUDA backend in builds without it (make
 * CUDA=0, nvcc not found, the sanitized builds): no device, and a message
 * that says why. The real backend is the .cu files of kernels/cuda. */
#include <stdio.h>

#include "kernels/cuda/cuda_ops.h"

static const char none_why[] = "this build of plait has no CUDA backend (built with CUDA=0, "
                               "without nvcc, or sanitized)";

int ops_cuda_device_count(char *why, size_t why_bytes)
{
    if (why && why_bytes) snprintf(why, why_bytes, "%s", none_why);
    return 0;
}

const struct ops *ops_cuda(char *errbuf, size_t errbuf_bytes)
{
    if (errbuf && errbuf_bytes) snprintf(errbuf, errbuf_bytes, "%s", none_why);
    return NULL;
}

int ops_cuda_built(void)
{
    return 0;
}

/* never called: there is no context to run in */
void ops_cuda_attention_fused_forward(struct ops_ctx *ctx, float *out, float *lse, const float *qkv,
                                      int B, int T, int C, int NH)
{
    (void)ctx, (void)out, (void)lse, (void)qkv, (void)B, (void)T, (void)C, (void)NH;
}

void ops_cuda_attention_fused_backward(struct ops_ctx *ctx, float *dqkv, const float *dout,
                                       const float *qkv, const float *out, const float *lse, int B,
                                       int T, int C, int NH)
{
    (void)ctx, (void)dqkv, (void)dout, (void)qkv, (void)out, (void)lse, (void)B, (void)T, (void)C,
        (void)NH;
}
