// RMS normalisation, one block per row: the sum of squares in f32 (a tree, not the CPU's eight
// lanes), then the CPU's formula y = g * (x * (1 / sqrt(ss / dim + eps))).
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

void pp__cuda_rmsnorm(struct pp_backend *be, float *y, const float *x, const float *g, int64_t n,
                      int64_t dim, float eps)
{
    struct pp_cuda *c = pp__cuda(be);
    if (n <= 0 || !pp__cuda_enter(c))
        return;
    if (n > 2147483647)
        return (void)pp__cuda_fail(c, "rmsnorm: %lld rows exceed the grid", (long long)n);
    rmsnorm_kernel<<<(unsigned)n, PP_CUDA_THREADS, 0, c->stream>>>(y, x, g, dim, eps);
    LAUNCH_OK(c, "rmsnorm_kernel");
}
