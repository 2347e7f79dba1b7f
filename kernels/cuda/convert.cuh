// Device-side reads of weight elements as f32, for every dtype a loaded weight can have (f32, f16,
// bf16), and the dispatch from enum pp_dtype to a kernel template instantiated for each.
#ifndef PP_CUDA_CONVERT_CUH
#define PP_CUDA_CONVERT_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/dtype.h"

__device__ __forceinline__ float pp_to_f32(float v)
{
    return v;
}
__device__ __forceinline__ float pp_to_f32(__half v)
{
    return __half2float(v);
}
__device__ __forceinline__ float pp_to_f32(__nv_bfloat16 v)
{
    return __bfloat162float(v);
}

// Calls f(T()) with T the element type of dtype t; returns 0 for dtypes a device weight never has
// (Q8_0 is converted when loaded).
template <typename F> static int pp_cuda_dispatch(enum pp_dtype t, F f)
{
    switch (t) {
    case PP_DTYPE_F32:
        f(float());
        return 1;
    case PP_DTYPE_F16:
        f(__half());
        return 1;
    case PP_DTYPE_BF16:
        f(__nv_bfloat16());
        return 1;
    default:
        return 0;
    }
}

#endif
