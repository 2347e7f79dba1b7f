// Block-wide sums and maxima of floats (warp shuffles, then one value per warp through shared
// memory). Every thread of the block must call them; every thread gets the result.
#ifndef PP_CUDA_REDUCE_CUH
#define PP_CUDA_REDUCE_CUH

#include <math.h>

struct pp_op_add {
    __device__ float operator()(float a, float b) const { return a + b; }
};
struct pp_op_max {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

template <typename Op> __device__ __forceinline__ float pp_warp_reduce(float v, Op op)
{
    for (int o = 16; o > 0; o >>= 1)
        v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float pp_warp_sum(float v)
{
    return pp_warp_reduce(v, pp_op_add());
}

__device__ __forceinline__ float pp_warp_max(float v)
{
    return pp_warp_reduce(v, pp_op_max());
}

// blockDim.x a multiple of 32, at most 1024. shared: 32 floats. identity: op's neutral value.
template <typename Op>
__device__ __forceinline__ float pp_block_reduce(float v, float *shared, Op op, float identity)
{
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
    v = pp_warp_reduce(v, op);
    __syncthreads(); /* shared may still be read by a previous call */
    if (lane == 0)
        shared[warp] = v;
    __syncthreads();
    v = lane < n_warps ? shared[lane] : identity;
    return pp_warp_reduce(v, op);
}

__device__ __forceinline__ float pp_block_sum(float v, float *shared)
{
    return pp_block_reduce(v, shared, pp_op_add(), 0.0f);
}

__device__ __forceinline__ float pp_block_max(float v, float *shared)
{
    return pp_block_reduce(v, shared, pp_op_max(), -INFINITY);
}

#endif
