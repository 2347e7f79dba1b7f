// Embedding gather: one thread per output element; the ids travel through the metadata ring.
#include "kernels/cuda/convert.cuh"
#include "kernels/cuda/cuda-impl.cuh"
#include "kernels/cuda/embed.cuh"

template <typename T>
__global__ void embed_kernel(float *out, const T *w, const int32_t *ids, int64_t n, int64_t cols)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * cols)
        return;
    int64_t t = i / cols, c = i % cols;
    out[i] = pp_to_f32(w[(int64_t)ids[t] * cols + c]);
}

void pp__cuda_embed(struct pp_backend *be, float *out, const struct pp_weight *w,
                    const int32_t *ids, int64_t n)
{
    struct pp_cuda *c = pp__cuda(be);
    if (n <= 0 || !pp__cuda_enter(c))
        return;
    const int32_t *d_ids =
        (const int32_t *)pp__cuda_upload(c, PP_CUDA_SLOT_IDS, ids, n * (int64_t)sizeof(int32_t));
    if (!d_ids)
        return;
    int64_t total = n * w->cols;
    int ok = pp_cuda_dispatch(w->dtype, [&](auto zero) {
        using T = decltype(zero);
        embed_kernel<T><<<pp__cuda_blocks(total, PP_CUDA_THREADS), PP_CUDA_THREADS, 0, c->stream>>>(
            out, (const T *)w->data, d_ids, n, w->cols);
    });
    if (!ok) {
        pp__cuda_fail(c, "embed: weights of dtype %s are not loaded for the device",
                      pp_dtype_name(w->dtype));
        return;
    }
    LAUNCH_OK(c, "embed_kernel");
}
