// Block-wide sums and maxima of floats (warp shuffles, then one value per warp through shared
// memory). Every thread of the block must call them; every thread gets the result.
#ifndef PP_CUDA_REDUCE_CUH
#define PP_CUDA_REDUCE_CUH

#include <math.h>

__device__ __forceinline__ float pp_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float pp_warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// blockDim.x a multiple of 32, at most 1024. shared: 32 floats.
__device__ __forceinline__ float pp_block_sum(float v, float *shared)
{
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
    v = pp_warp_sum(v);
    __syncthreads(); /* shared may still be read by a previous call */
    if (lane == 0)
        shared[warp] = v;
    __syncthreads();
    v = lane < n_warps ? shared[lane] : 0.0f;
    return pp_warp_sum(v);
}

// blockDim.x a multiple of 32, at most 1024. shared: 32 floats.
__device__ __forceinline__ float pp_block_max(float v, float *shared)
{
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
    v = pp_warp_max(v);
    __syncthreads(); /* shared may still be read by a previous call */
    if (lane == 0)
        shared[warp] = v;
    __syncthreads();
    v = lane < n_warps ? shared[lane] : -INFINITY;
    return pp_warp_max(v);
}

#endif
