/* entry.cu — the one symbol libplait_cuda.so exports: the table of the
 * backend's entry points that kernels/cuda/cuda_load.c looks up after loading
 * it. Everything else in the object is hidden (-fvisibility=hidden and a
 * version script), so its own calls bind inside it. */
#include "kernels/cuda/cuda_ops.h"

extern "C" __attribute__((visibility("default"))) const struct ops_cuda_entry plait_cuda_entry = {
    OPS_CUDA_ENTRY_VERSION,
    sizeof(struct ops),
    ops_cuda_device_count,
    ops_cuda,
    ops_cuda_attention_fused_forward,
    ops_cuda_attention_fused_backward,
};
