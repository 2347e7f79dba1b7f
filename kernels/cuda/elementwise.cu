// Element-wise ops, one thread per element (four, as 16-byte words, where sizes and pointers
// allow). Written with _rn intrinsics where the CPU's expression has a multiply feeding an add, so
// the compiler cannot fuse it: these ops then give the CPU's bits except where expf differs by an
// ulp.
#include "kernels/cuda/cuda-impl.cuh"
#include "kernels/cuda/elementwise.cuh"

__device__ __forceinline__ float silu_mul(float g, float u)
{
    return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

__global__ void swiglu_kernel(float *out, const float *gate, const float *up, int64_t n)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    out[i] = silu_mul(gate[i], up[i]);
}

/* The same arithmetic four elements per thread (16-byte words: n % 4 == 0, aligned pointers). */
__global__ void swiglu4_kernel(float4 *out, const float4 *gate, const float4 *up, int64_t n4)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n4)
        return;
    float4 g = gate[i], u = up[i];
    out[i] = make_float4(silu_mul(g.x, u.x), silu_mul(g.y, u.y), silu_mul(g.z, u.z),
                         silu_mul(g.w, u.w));
}

__global__ void add4_kernel(float4 *y, const float4 *x, int64_t n4)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n4)
        return;
    float4 a = y[i], b = x[i];
    y[i] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

__global__ void add_kernel(float *y, const float *x, int64_t n)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] += x[i];
}

__global__ void add_bias_kernel(float *y, const float *b, int64_t n, int64_t cols)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n * cols)
        y[i] += b[i % cols];
}

__global__ void add_gated_kernel(float *y, const float *x, const float *g, int64_t n, int64_t cols)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * cols)
        return;
    float sig = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-g[i / cols])));
    y[i] = __fadd_rn(y[i], __fmul_rn(sig, x[i]));
}

/* Launches kernel over items elements on the backend's stream. */
#define LAUNCH_1D(c, kernel, items, ...)                                                           \
    do {                                                                                           \
        kernel<<<pp__cuda_blocks((items), PP_CUDA_THREADS), PP_CUDA_THREADS, 0, (c)->stream>>>(    \
            __VA_ARGS__);                                                                          \
        LAUNCH_OK((c), #kernel);                                                                   \
    } while (0)

void pp__cuda_swiglu(struct pp_backend *be, float *out, const float *gate, const float *up,
                     int64_t n)
{
    struct pp_cuda *c = pp__cuda(be);
    if (n <= 0 || !pp__cuda_enter(c))
        return;
    if (n % 4 == 0 && ((uintptr_t)out | (uintptr_t)gate | (uintptr_t)up) % 16 == 0)
        LAUNCH_1D(c, swiglu4_kernel, n / 4, (float4 *)out, (const float4 *)gate,
                  (const float4 *)up, n / 4);
    else
        LAUNCH_1D(c, swiglu_kernel, n, out, gate, up, n);
}

void pp__cuda_add(struct pp_backend *be, float *y, const float *x, int64_t n)
{
    struct pp_cuda *c = pp__cuda(be);
    if (n <= 0 || !pp__cuda_enter(c))
        return;
    if (n % 4 == 0 && ((uintptr_t)y | (uintptr_t)x) % 16 == 0)
        LAUNCH_1D(c, add4_kernel, n / 4, (float4 *)y, (const float4 *)x, n / 4);
    else
        LAUNCH_1D(c, add_kernel, n, y, x, n);
}

void pp__cuda_add_bias(struct pp_backend *be, float *y, const float *b, int64_t n, int64_t cols)
{
    struct pp_cuda *c = pp__cuda(be);
    if (n > 0 && cols > 0 && pp__cuda_enter(c))
        LAUNCH_1D(c, add_bias_kernel, n * cols, y, b, n, cols);
}

void pp__cuda_add_gated(struct pp_backend *be, float *y, const float *x, const float *g, int64_t n,
                        int64_t cols)
{
    struct pp_cuda *c = pp__cuda(be);
    if (n > 0 && cols > 0 && pp__cuda_enter(c))
        LAUNCH_1D(c, add_gated_kernel, n * cols, y, x, g, n, cols);
}
