// Uniform fill from a counter-based hash, for weights generated on the device (benchmarks).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/cuda-impl.cuh"

__device__ __forceinline__ float uniform(uint64_t seed, int64_t i, float scale)
{
    uint64_t z = seed + 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return scale * ((float)(z >> 40) * (2.0f / 16777216.0f) - 1.0f);
}

__device__ __forceinline__ void store(float *p, float v)
{
    *p = v;
}
__device__ __forceinline__ void store(__half *p, float v)
{
    *p = __float2half_rn(v);
}
__device__ __forceinline__ void store(__nv_bfloat16 *p, float v)
{
    *p = __float2bfloat16_rn(v);
}

template <typename T>
__global__ void fill_kernel(T *dst, int64_t n, uint64_t seed, float scale)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        store(dst + i, uniform(seed, i, scale));
}

extern "C" void pp_cuda_fill_uniform(struct pp_backend *be, void *dst, enum pp_dtype t, int64_t n,
                                     uint64_t seed, float scale)
{
    struct pp_cuda *c = pp__cuda(be);
    if (n <= 0 || !pp__cuda_enter(c))
        return;
    unsigned blocks = pp__cuda_blocks(n, PP_CUDA_THREADS);
    if (blocks > 65536)
        blocks = 65536; /* grid-stride beyond */
    switch (t) {
    case PP_DTYPE_F32:
        fill_kernel<<<blocks, PP_CUDA_THREADS, 0, c->stream>>>((float *)dst, n, seed, scale);
        break;
    case PP_DTYPE_F16:
        fill_kernel<<<blocks, PP_CUDA_THREADS, 0, c->stream>>>((__half *)dst, n, seed, scale);
        break;
    case PP_DTYPE_BF16:
        fill_kernel<<<blocks, PP_CUDA_THREADS, 0, c->stream>>>((__nv_bfloat16 *)dst, n, seed,
                                                               scale);
        break;
    default:
        pp__cuda_fail(c, "fill: expected f32, f16 or bf16, got %s", pp_dtype_name(t));
        return;
    }
    LAUNCH_OK(c, "fill_kernel");
}

__global__ void delay_kernel(uint64_t ns)
{
    uint64_t t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    while (t - t0 < ns);
}

extern "C" void pp_cuda_delay(struct pp_backend *be, int64_t microseconds)
{
    struct pp_cuda *c = pp__cuda(be);
    if (microseconds <= 0 || !pp__cuda_enter(c))
        return;
    delay_kernel<<<1, 1, 0, c->stream>>>((uint64_t)microseconds * 1000u);
    LAUNCH_OK(c, "delay_kernel");
}
