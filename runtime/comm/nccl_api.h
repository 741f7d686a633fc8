/* nccl_api.h — the NCCL and CUDA runtime functions the nccl backend calls,
 * reached through a table loaded on the backend's first use (dlopen of
 * libnccl.so.<NCCL_MAJOR> and libcudart.so.<CUDA major>, the versions this
 * build was compiled against), so that plait-train itself needs neither
 * library: a CPU-only host runs it without NCCL or CUDA installed, and only a
 * rank that asks for the nccl backend loads them. Included by comm_nccl.c
 * only (it needs nccl.h and cuda_runtime.h). */
#ifndef PLAIT_RUNTIME_COMM_NCCL_API_H
#define PLAIT_RUNTIME_COMM_NCCL_API_H

#include <cuda_runtime.h>
#include <nccl.h>

#include "common/error.h"

/* X(name) for every function of the table */
#define NCCL_API_FUNCTIONS(X)                                                                      \
    X(ncclAllGather)                                                                               \
    X(ncclAllReduce)                                                                               \
    X(ncclBroadcast)                                                                               \
    X(ncclCommAbort)                                                                               \
    X(ncclCommDestroy)                                                                             \
    X(ncclCommFinalize)                                                                            \
    X(ncclCommGetAsyncError)                                                                       \
    X(ncclCommInitRankConfig)                                                                      \
    X(ncclCommSplit)                                                                               \
    X(ncclGetErrorString)                                                                          \
    X(ncclGetLastError)                                                                            \
    X(ncclGetUniqueId)                                                                             \
    X(ncclGroupEnd)                                                                                \
    X(ncclGroupStart)                                                                              \
    X(ncclRecv)                                                                                    \
    X(ncclReduce)                                                                                  \
    X(ncclReduceScatter)                                                                           \
    X(ncclSend)
#define CUDA_API_FUNCTIONS(X)                                                                      \
    X(cudaEventCreateWithFlags)                                                                    \
    X(cudaEventDestroy)                                                                            \
    X(cudaEventQuery)                                                                              \
    X(cudaEventRecord)                                                                             \
    X(cudaFreeAsync)                                                                               \
    X(cudaFreeHost)                                                                                \
    X(cudaGetDevice)                                                                               \
    X(cudaGetDeviceCount)                                                                          \
    X(cudaGetErrorName)                                                                            \
    X(cudaGetErrorString)                                                                          \
    X(cudaMallocAsync)                                                                             \
    X(cudaMallocHost)                                                                              \
    X(cudaMemcpyAsync)                                                                             \
    X(cudaMemsetAsync)                                                                             \
    X(cudaPointerGetAttributes)                                                                    \
    X(cudaSetDevice)                                                                               \
    X(cudaStreamCreateWithFlags)                                                                   \
    X(cudaStreamDestroy)                                                                           \
    X(cudaStreamWaitEvent)

#define NCCL_API_MEMBER(f) __typeof__(f) *f;
struct nccl_api {
    NCCL_API_FUNCTIONS(NCCL_API_MEMBER)
    CUDA_API_FUNCTIONS(NCCL_API_MEMBER)
};
#undef NCCL_API_MEMBER

/* The table, loading both libraries on the first call (thread-safe; a
 * failure is remembered). NULL with err naming the library and why. */
const struct nccl_api *nccl_api(struct plait_error *err);

#endif
