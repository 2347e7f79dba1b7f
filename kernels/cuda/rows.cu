// Row gather (one thread per element) and weighted scatter-add: one thread per column walks the
// rows in list order, so a row listed twice gets its additions in the CPU's order and no two
// threads ever write one element.
#include <string.h>

#include "kernels/cuda/cuda-impl.cuh"
#include "kernels/cuda/rows.cuh"

__global__ void gather_rows_kernel(float *dst, const float *src, const int32_t *rows, int64_t n,
                                   int64_t cols)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * cols)
        return;
    int64_t r = i / cols, col = i % cols;
    dst[i] = src[(int64_t)rows[r] * cols + col];
}

__global__ void scatter_add_rows_kernel(float *dst, const float *src, const int32_t *rows,
                                        const float *w, int64_t n, int64_t cols)
{
    int64_t col = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= cols)
        return;
    for (int64_t r = 0; r < n; r++) {
        float *o = dst + (int64_t)rows[r] * cols + col;
        *o = __fadd_rn(*o, __fmul_rn(w[r], src[r * cols + col]));
    }
}

void pp__cuda_gather_rows(struct pp_backend *be, float *dst, const float *src,
                          const int32_t *rows, int64_t n, int64_t cols)
{
    struct pp_cuda *c = pp__cuda(be);
    if (n <= 0 || cols <= 0 || !pp__cuda_enter(c))
        return;
    const int32_t *d_rows =
        (const int32_t *)pp__cuda_upload(c, PP_CUDA_SLOT_ROWS, rows, n * (int64_t)sizeof(int32_t));
    if (!d_rows)
        return;
    gather_rows_kernel<<<pp__cuda_blocks(n * cols, PP_CUDA_THREADS), PP_CUDA_THREADS, 0,
                         c->stream>>>(dst, src, d_rows, n, cols);
    LAUNCH_OK(c, "gather_rows_kernel");
}

void pp__cuda_scatter_add_rows(struct pp_backend *be, float *dst, const float *src,
                               const int32_t *rows, const float *w, int64_t n, int64_t cols)
{
    struct pp_cuda *c = pp__cuda(be);
    if (n <= 0 || cols <= 0 || !pp__cuda_enter(c))
        return;
    /* rows then weights, in one upload */
    int64_t bytes = n * (int64_t)(sizeof(int32_t) + sizeof(float));
    char *blob = (char *)pp__cuda_blob(c, bytes);
    if (!blob)
        return;
    memcpy(blob, rows, (size_t)n * sizeof(int32_t));
    memcpy(blob + n * sizeof(int32_t), w, (size_t)n * sizeof(float));
    const char *d = (const char *)pp__cuda_upload(c, PP_CUDA_SLOT_ROWS, blob, bytes);
    if (!d)
        return;
    scatter_add_rows_kernel<<<pp__cuda_blocks(cols, PP_CUDA_THREADS), PP_CUDA_THREADS, 0,
                              c->stream>>>(dst, src, (const int32_t *)d,
                                           (const float *)(d + n * sizeof(int32_t)), n, cols);
    LAUNCH_OK(c, "scatter_add_rows_kernel");
}
