// CUDA device discovery; every runtime call is checked and turned into a pp_status with the CUDA
// error text.
#include <cuda_runtime.h>
#include <stdio.h>

#include "kernels/cuda/device.h"

extern "C" pp_status pp_cuda_device_count(int *count)
{
    *count = 0;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky error so later calls start clean */
        return pp_error(PP_ERR_UNSUPPORTED, "no usable CUDA device: %s (%s)", cudaGetErrorString(e),
                        cudaGetErrorName(e));
    }
    *count = n;
    if (n == 0)
        return pp_error(PP_ERR_UNSUPPORTED, "no usable CUDA device: the driver reports none");
    return PP_OK;
}

extern "C" pp_status pp_cuda_device_query(int device, struct pp_cuda_device_info *out)
{
    cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, device);
    if (e != cudaSuccess)
        return pp_error(PP_ERR_UNSUPPORTED, "cuda:%d: %s", device, cudaGetErrorString(e));
    snprintf(out->name, sizeof(out->name), "%.*s", (int)sizeof(out->name) - 1, p.name);
    out->major = p.major;
    out->minor = p.minor;
    out->memory_bytes = (int64_t)p.totalGlobalMem;
    out->multiprocessors = p.multiProcessorCount;
    return PP_OK;
}
