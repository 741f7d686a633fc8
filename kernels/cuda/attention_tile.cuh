/* attention_tile.cuh — what the tiled attention kernels share (attention_fused.cu,
 * attention_block.cu): the tile's edge, a tile's load into shared memory and
 * the dynamic shared memory a kernel asks for. */
#ifndef PLAIT_KERNELS_CUDA_ATTENTION_TILE_CUH
#define PLAIT_KERNELS_CUDA_ATTENTION_TILE_CUH

#include "kernels/cuda/cuda_common.cuh"

enum { TILE = 32 }; /* query rows per block = key rows per tile = threads per block */

/* rows [r0, r0+TILE) of a (T, ·) tensor with row stride `stride`, columns
 * [0, hs), into dst (TILE, hs+1); rows past T are zeros */
static __device__ void load_tile(float *dst, const float *src, size_t stride, int r0, int T, int hs)
{
    for (int i = threadIdx.x; i < TILE * hs; i += blockDim.x) {
        int r = i / hs, d = i % hs;
        dst[r * (hs + 1) + d] = r0 + r < T ? src[(size_t)(r0 + r) * stride + d] : 0.0f;
    }
}

/* dynamic shared memory of `tiles` (TILE, hs+1) tiles and `extra` floats,
 * opting in above 48 KiB */
static bool smem_for(struct ops_ctx *ctx, const void *kernel, int tiles, int hs, size_t extra,
                     size_t *bytes)
{
    *bytes = ((size_t)tiles * TILE * (hs + 1) + extra) * sizeof(float);
    if (*bytes <= 48u << 10) return true;
    return CUDA_OK(ctx, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)*bytes));
}

#endif
