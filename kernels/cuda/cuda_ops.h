/* cuda_ops.h — the CUDA backend of kernels/ops.h, for the runtime and the
 * self-test. Built from the .cu files of kernels/cuda where nvcc is found, into a shared
 * object that cuda_load.c loads on first use; otherwise (make CUDA=0, the sanitized builds)
 * cuda_none.c answers that there is none. The table's open() makes a context on a device
 * (its own stream, cuBLASLt handle, scratch and error); the contexts of one process share
 * one device. */
#ifndef PLAIT_KERNELS_CUDA_CUDA_OPS_H
#define PLAIT_KERNELS_CUDA_CUDA_OPS_H

#include <stddef.h>

#include "kernels/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The number of CUDA devices this process can use: 0 when the build has no
 * CUDA backend, there is no driver or no GPU, with the reason in why. */
int ops_cuda_device_count(char *why, size_t why_bytes);

/* The CUDA backend's table, or NULL with the reason in errbuf when this
 * build has none or no device is usable. open(device) then makes a context
 * on a CUDA index; a context on another device than an open one fails. */
const struct ops *ops_cuda(char *errbuf, size_t errbuf_bytes);

/* Whether this build carries the CUDA backend (false: cuda_none.c). */
int ops_cuda_built(void);

/* Causal attention without the (B,NH,T,T) buffer (flash-attention style,
 * kernels/cuda/attention_fused.cu), in a context of the CUDA table: the
 * table's attention_*_fused, which the runtime prefers (PLAIT_CUDA_ATTENTION=
 * simple at the first ops_cuda() call leaves them out). qkv (B,T,3C), out (B,T,C); lse
 * (B,NH,T) keeps each row's log-sum-exp of the scaled scores for the backward,
 * which overwrites dqkv (B,T,3C). Errors are the backend's sticky ones. */
void ops_cuda_attention_fused_forward(struct ops_ctx *ctx, float *out, float *lse, const float *qkv,
                                      int B, int T, int C, int NH);
void ops_cuda_attention_fused_backward(struct ops_ctx *ctx, float *dqkv, const float *dout,
                                       const float *qkv, const float *out, const float *lse, int B,
                                       int T, int C, int NH);

/* Attention one key/value block at a time (context parallelism's ring;
 * kernels/cuda/attention_block.cu): the table's attention_block_*, as
 * kernels/ops.h says (scratch unused). */
void ops_cuda_attention_block_forward(struct ops_ctx *ctx, float *out, float *lse, float *scratch,
                                      const float *q, int ldq, const float *kv,
                                      const int32_t *qpos, const int32_t *kpos, int B, int Tq,
                                      int Tk, int C, int NH, bool first);
void ops_cuda_attention_block_backward(struct ops_ctx *ctx, float *dq, float *dkv, float *scratch,
                                       const float *dout, const float *q, int ldq, const float *kv,
                                       const float *out, const float *lse, const int32_t *qpos,
                                       const int32_t *kpos, int B, int Tq, int Tk, int C, int NH);

/* The CUDA backend is a shared object of its own (lib/plait/libplait_cuda.so
 * beside bin/, in the build tree and where plait is installed), loaded only
 * when a rank asks for a GPU: cuBLASLt alone adds ~150 MB to the resident set
 * of every process that loads it, which a CPU rank should not pay.
 * kernels/cuda/cuda_load.c implements the functions above by loading it; the
 * object exports one symbol, this table of its own implementations. */
#define OPS_CUDA_ENTRY_SYMBOL "plait_cuda_entry"
#define OPS_CUDA_ENTRY_VERSION 4
struct ops_cuda_entry {
    int version;      /* OPS_CUDA_ENTRY_VERSION: the loader refuses another */
    size_t ops_bytes; /* sizeof(struct ops) it was built with: a table of another size (an
                         older or newer kernels/ops.h) is refused, never read past its end */
    int (*device_count)(char *why, size_t why_bytes);
    const struct ops *(*table)(char *errbuf, size_t errbuf_bytes);
    void (*attention_fused_forward)(struct ops_ctx *ctx, float *out, float *lse, const float *qkv,
                                    int B, int T, int C, int NH);
    void (*attention_fused_backward)(struct ops_ctx *ctx, float *dqkv, const float *dout,
                                     const float *qkv, const float *out, const float *lse, int B,
                                     int T, int C, int NH);
};

#ifdef __cplusplus
}
#endif

#endif
