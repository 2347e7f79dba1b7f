// RMS normalisation, one block per row (a vector kernel for rows of whole 16-byte words): the sum
// of squares in f32 (a tree, not the CPU's eight lanes), then the CPU's formula
// y = g * (x * (1 / sqrt(ss / dim + eps))).
#include "kernels/cuda/cuda-impl.cuh"
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/rmsnorm.cuh"

__global__ void rmsnorm_kernel(float *y, const float *x, const float *g, int64_t dim, float eps)
{
    __shared__ float shared[32];
    const float *xr = x + (int64_t)blockIdx.x * dim;
    float *yr = y + (int64_t)blockIdx.x * dim;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
        ss += xr[i] * xr[i];
    ss = pp_block_sum(ss, shared);
    float scale = 1.0f / sqrtf(ss / (float)dim + eps);
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
        yr[i] = g[i] * (xr[i] * scale);
}

/* Rows of a multiple of 4 floats, 16-byte aligned: each thread keeps its first RMS_KEEP words of
 * the row in registers from the first pass, every load of a pass issued before the first is used
 * (a load behind another's use pays the memory latency once per word). */
#define RMS_KEEP 8

/* The CPU's g * (x * scale) on four elements. */
__device__ __forceinline__ float4 norm4(float4 v, float4 w, float scale)
{
    return make_float4(w.x * (v.x * scale), w.y * (v.y * scale), w.z * (v.z * scale),
                       w.w * (v.w * scale));
}

__global__ void rmsnorm_vec_kernel(float *y, const float *x, const float *g, int64_t dim,
                                   float eps)
{
    __shared__ float shared[32];
    const float4 *xr = (const float4 *)(x + (int64_t)blockIdx.x * dim);
    float4 *yr = (float4 *)(y + (int64_t)blockIdx.x * dim);
    const float4 *g4 = (const float4 *)g;
    int64_t n4 = dim / 4;
    int tid = threadIdx.x, nt = blockDim.x;
    float4 keep[RMS_KEEP];
#pragma unroll
    for (int k = 0; k < RMS_KEEP; k++) {
        int64_t i = tid + (int64_t)k * nt;
        keep[k] = xr[i < n4 ? i : 0];
    }
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < RMS_KEEP; k++) {
        float4 v = keep[k];
        if (tid + (int64_t)k * nt < n4)
            ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    for (int64_t i = tid + (int64_t)RMS_KEEP * nt; i < n4; i += nt) {
        float4 v = xr[i];
        ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    ss = pp_block_sum(ss, shared);
    float scale = 1.0f / sqrtf(ss / (float)dim + eps);
    float4 gk[RMS_KEEP];
#pragma unroll
    for (int k = 0; k < RMS_KEEP; k++) {
        int64_t i = tid + (int64_t)k * nt;
        gk[k] = g4[i < n4 ? i : 0];
    }
#pragma unroll
    for (int k = 0; k < RMS_KEEP; k++) {
        int64_t i = tid + (int64_t)k * nt;
        if (i < n4)
            yr[i] = norm4(keep[k], gk[k], scale);
    }
    for (int64_t i = tid + (int64_t)RMS_KEEP * nt; i < n4; i += nt)
        yr[i] = norm4(xr[i], g4[i], scale);
}

void pp__cuda_rmsnorm(struct pp_backend *be, float *y, const float *x, const float *g, int64_t n,
                      int64_t dim, float eps)
{
    struct pp_cuda *c = pp__cuda(be);
    if (n <= 0 || !pp__cuda_enter(c))
        return;
    if (n > 2147483647)
        return (void)pp__cuda_fail(c, "rmsnorm: %lld rows exceed the grid", (long long)n);
    if (dim % 4 == 0 && ((uintptr_t)x | (uintptr_t)y | (uintptr_t)g) % 16 == 0)
        rmsnorm_vec_kernel<<<(unsigned)n, PP_CUDA_THREADS, 0, c->stream>>>(y, x, g, dim, eps);
    else
        rmsnorm_kernel<<<(unsigned)n, PP_CUDA_THREADS, 0, c->stream>>>(y, x, g, dim, eps);
    LAUNCH_OK(c, "rmsnorm_kernel");
}
