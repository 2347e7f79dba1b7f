// Matmul on a loaded weight. Few tokens (decode, n <= PP_CUDA_GEMV_MAX_ROWS) or f32 weights: our
// GEMV, one warp per weight row streaming it once with 16-byte loads, the f32 activations read
// from L1/L2, f32 accumulation, a warp-shuffle sum; it is bound by the weight's bytes. More tokens
// on f16/bf16 weights: the activations are rounded to the weight's type in the workspace and
// cuBLAS multiplies (tensor cores, f32 accumulation and f32 output), in chunks of rows that fit
// the workspace.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/convert.cuh"
#include "kernels/cuda/cuda-impl.cuh"
#include "kernels/cuda/matmul.cuh"
#include "kernels/cuda/reduce.cuh"

#define GEMV_THREADS 256 /* 8 warps: 8 weight rows per block */
#define GEMV_NT 4        /* tokens per pass over a row */
#define GEMV_UNROLL 4    /* 16-byte loads in flight per lane (8 measured slower) */

/* The V = 16 / sizeof(W) weight elements of one 16-byte word, as f32. */
__device__ __forceinline__ void unpack(uint4 r, float *out, float)
{
    out[0] = __uint_as_float(r.x);
    out[1] = __uint_as_float(r.y);
    out[2] = __uint_as_float(r.z);
    out[3] = __uint_as_float(r.w);
}
__device__ __forceinline__ void unpack(uint4 r, float *out, __nv_bfloat16)
{
    unsigned u[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        out[2 * i] = __uint_as_float(u[i] << 16);
        out[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
    }
}
__device__ __forceinline__ void unpack(uint4 r, float *out, __half)
{
    unsigned u[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        __half2 h = *reinterpret_cast<__half2 *>(&u[i]);
        float2 f = __half22float2(h);
        out[2 * i] = f.x;
        out[2 * i + 1] = f.y;
    }
}

/* acc[t] += the dot of one 16-byte word of weights (elements [e, e + V)) with token t's x. */
template <typename W, int NT>
__device__ __forceinline__ void word_dot(float *acc, uint4 raw, const float *x, int64_t cols,
                                         int64_t e)
{
    constexpr int V = 16 / sizeof(W);
    float wf[V];
    unpack(raw, wf, W());
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const float4 *xv = reinterpret_cast<const float4 *>(x + t * cols + e);
#pragma unroll
        for (int k = 0; k < V / 4; k++) {
            float4 xx = xv[k];
            acc[t] += wf[4 * k] * xx.x + wf[4 * k + 1] * xx.y + wf[4 * k + 2] * xx.z +
                      wf[4 * k + 3] * xx.w;
        }
    }
}

/* grid (row blocks, token groups): tokens [blockIdx.y * NT, +NT) of x. VEC: 16-byte words (needs
 * cols % V == 0 and 16-byte aligned w and x); otherwise one element per lane step. */
template <typename W, int NT, bool VEC>
__global__ void __launch_bounds__(GEMV_THREADS)
    gemv_kernel(float *y, const float *x, const W *w, int64_t rows, int64_t cols)
{
    int64_t row = (int64_t)blockIdx.x * (GEMV_THREADS / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= rows)
        return;
    x += (int64_t)blockIdx.y * NT * cols;
    y += (int64_t)blockIdx.y * NT * rows;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++)
        acc[t] = 0.0f;
    if constexpr (VEC) {
        constexpr int V = 16 / sizeof(W);
        const uint4 *wr = reinterpret_cast<const uint4 *>(w + row * cols);
        int64_t nv = cols / V, v = lane;
        for (; v + 32 * (GEMV_UNROLL - 1) < nv; v += 32 * GEMV_UNROLL) {
            uint4 raw[GEMV_UNROLL];
#pragma unroll
            for (int u = 0; u < GEMV_UNROLL; u++)
                raw[u] = __ldcs(wr + v + 32 * u); /* streamed: a weight is read once per pass */
#pragma unroll
            for (int u = 0; u < GEMV_UNROLL; u++)
                word_dot<W, NT>(acc, raw[u], x, cols, (v + 32 * u) * V);
        }
        for (; v < nv; v += 32)
            word_dot<W, NT>(acc, __ldcs(wr + v), x, cols, v * V);
    } else {
        const W *wr = w + row * cols;
        for (int64_t e = lane; e < cols; e += 32) {
            float wv = pp_to_f32(wr[e]);
#pragma unroll
            for (int t = 0; t < NT; t++)
                acc[t] += wv * x[t * cols + e];
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        float s = pp_warp_sum(acc[t]);
        if (lane == 0)
            y[t * rows + row] = s;
    }
}

template <typename W, int NT>
static void launch_gemv(struct pp_cuda *c, float *y, const float *x, const W *w, int64_t rows,
                        int64_t cols, int64_t groups, int vec)
{
    dim3 grid(pp__cuda_blocks(rows, GEMV_THREADS / 32), (unsigned)groups);
    if (vec)
        gemv_kernel<W, NT, true><<<grid, GEMV_THREADS, 0, c->stream>>>(y, x, w, rows, cols);
    else
        gemv_kernel<W, NT, false><<<grid, GEMV_THREADS, 0, c->stream>>>(y, x, w, rows, cols);
    LAUNCH_OK(c, "gemv_kernel");
}

template <typename W>
static void gemv(struct pp_cuda *c, float *y, const float *x, const struct pp_weight *w, int64_t n)
{
    const W *wd = (const W *)w->data;
    int64_t rows = w->rows, cols = w->cols;
    int vec = cols % (16 / (int64_t)sizeof(W)) == 0 && (uintptr_t)wd % 16 == 0 &&
              (uintptr_t)x % 16 == 0;
    /* whole groups of GEMV_NT tokens in one launch (grid.y), the rest in one more */
    for (int64_t t0 = 0; t0 < n && c->err == PP_OK;) {
        int64_t full = (n - t0) / GEMV_NT;
        if (full > 65535)
            full = 65535;
        if (full > 0) {
            launch_gemv<W, GEMV_NT>(c, y + t0 * rows, x + t0 * cols, wd, rows, cols, full, vec);
            t0 += full * GEMV_NT;
            continue;
        }
        switch (n - t0) {
        case 1: launch_gemv<W, 1>(c, y + t0 * rows, x + t0 * cols, wd, rows, cols, 1, vec); break;
        case 2: launch_gemv<W, 2>(c, y + t0 * rows, x + t0 * cols, wd, rows, cols, 1, vec); break;
        default: launch_gemv<W, 3>(c, y + t0 * rows, x + t0 * cols, wd, rows, cols, 1, vec); break;
        }
        t0 = n;
    }
}

/* Two f32 rounded to nearest even as two 16-bit values, the first in the low half. */
__device__ __forceinline__ uint32_t round2(float a, float b, __nv_bfloat16)
{
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t *>(&h);
}
__device__ __forceinline__ uint32_t round2(float a, float b, __half)
{
    __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<uint32_t *>(&h);
}

/* Four f32 to four 16-bit W (n4 words of 16 bytes in, 8 out). */
template <typename W> __global__ void round4_kernel(uint2 *out, const float4 *x, int64_t n4)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n4)
        return;
    float4 v = x[i];
    out[i] = make_uint2(round2(v.x, v.y, W()), round2(v.z, v.w, W()));
}

template <typename W>
__global__ void round_kernel(W *out, const float *x, int64_t n);
template <>
__global__ void round_kernel<__nv_bfloat16>(__nv_bfloat16 *out, const float *x, int64_t n)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        out[i] = __float2bfloat16_rn(x[i]);
}
template <>
__global__ void round_kernel<__half>(__half *out, const float *x, int64_t n)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        out[i] = __float2half_rn(x[i]);
}

/* cuBLAS on 16-bit weights: y (column-major [rows, n]) = wᵀ-as-stored (column-major [cols, rows],
 * transposed) · x16 (column-major [cols, n]). */
template <typename W>
static void gemm(struct pp_cuda *c, float *y, const float *x, const struct pp_weight *w, int64_t n,
                 cudaDataType type)
{
    int64_t rows = w->rows, cols = w->cols;
    int64_t chunk = c->scratch_bytes / (cols * (int64_t)sizeof(W));
    if (chunk > n)
        chunk = n;
    if (chunk < 1 || rows > INT32_MAX || cols > INT32_MAX) {
        pp__cuda_fail(c, "matmul: [%lld, %lld] weight: a row of inputs does not fit the %lld-byte "
                      "workspace or the sizes exceed cuBLAS's int", (long long)rows,
                      (long long)cols, (long long)c->scratch_bytes);
        return;
    }
    const float one = 1.0f, zero = 0.0f;
    W *x16 = (W *)c->scratch;
    for (int64_t r0 = 0; r0 < n; r0 += chunk) {
        int64_t nc = n - r0 < chunk ? n - r0 : chunk;
        const float *xs = x + r0 * cols;
        int64_t ne = nc * cols;
        if (ne % 4 == 0 && (uintptr_t)xs % 16 == 0 && (uintptr_t)x16 % 8 == 0) {
            round4_kernel<W><<<pp__cuda_blocks(ne / 4, PP_CUDA_THREADS), PP_CUDA_THREADS, 0,
                               c->stream>>>((uint2 *)x16, (const float4 *)xs, ne / 4);
        } else {
            round_kernel<W><<<pp__cuda_blocks(ne, PP_CUDA_THREADS), PP_CUDA_THREADS, 0,
                              c->stream>>>(x16, xs, ne);
        }
        if (!LAUNCH_OK(c, "round_kernel") ||
            !CUBLAS_OK(c, cublasGemmEx(c->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, (int)nc,
                                       (int)cols, &one, w->data, type, (int)cols, x16, type,
                                       (int)cols, &zero, y + r0 * rows, CUDA_R_32F, (int)rows,
                                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)))
            return;
    }
}

void pp__cuda_matmul(struct pp_backend *be, float *y, const float *x, const struct pp_weight *w,
                     int64_t n)
{
    struct pp_cuda *c = pp__cuda(be);
    if (n <= 0 || !pp__cuda_enter(c))
        return;
    switch (w->dtype) {
    case PP_DTYPE_F32:
        gemv<float>(c, y, x, w, n);
        return;
    case PP_DTYPE_BF16:
        if (PP_CUDA_USES_GEMV(n, w->rows))
            gemv<__nv_bfloat16>(c, y, x, w, n);
        else
            gemm<__nv_bfloat16>(c, y, x, w, n, CUDA_R_16BF);
        return;
    case PP_DTYPE_F16:
        if (PP_CUDA_USES_GEMV(n, w->rows))
            gemv<__half>(c, y, x, w, n);
        else
            gemm<__half>(c, y, x, w, n, CUDA_R_16F);
        return;
    default:
        pp__cuda_fail(c, "matmul: a %s weight is not loaded for the device (weight_load converts "
                      "it to bf16)", pp_dtype_name(w->dtype));
    }
}

/* One launch per weight, in order on the backend's stream. One GEMV launch over all of them
 * (wk and wv alone keep few SMs busy: docs/benchmarks.md) waits for a session with a GPU to
 * measure it. */
void pp__cuda_matmul_many(struct pp_backend *be, int count, float *const y[], const float *x,
                          const struct pp_weight *const w[], int64_t n)
{
    for (int i = 0; i < count; i++)
        pp__cuda_matmul(be, y[i], x, w[i], n);
}
