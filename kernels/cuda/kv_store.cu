// KV store into the layout of struct pp_kv_view: block b, layer l holds K then V, each
// [block_size, kv_dim], at pool + ((b * n_layers + l) * 2 + {0,1}) * block_elems. Each row's
// offset in layer 0 comes with the batch description (row_base), so a thread only adds its layer
// and column.
#include "kernels/cuda/cuda-impl.cuh"
#include "kernels/cuda/kv_store.cuh"

__global__ void kv_store_kernel(float *pool, const int64_t *row_base, const int32_t *row_seq,
                                int64_t layer_off, int64_t block_elems, const float *k,
                                const float *v, int64_t n_rows, int64_t kv_dim)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_rows * kv_dim)
        return;
    int64_t r = i / kv_dim, d = i % kv_dim;
    if (row_seq[r] < 0)
        return;
    float *dst = pool + row_base[r] + layer_off + d;
    dst[0] = k[i];
    dst[block_elems] = v[i];
}

void pp__cuda_kv_store(struct pp_backend *be, const struct pp_kv_view *kv, int32_t layer,
                       const struct pp_attn_seq *seqs, int32_t n_seqs, const float *k,
                       const float *v)
{
    struct pp_cuda *c = pp__cuda(be);
    struct pp_cuda_batch b;
    if (n_seqs <= 0 || !pp__cuda_enter(c) || !pp__cuda_batch(c, kv, seqs, n_seqs, &b))
        return;
    int64_t items = (int64_t)b.n_rows * kv->kv_dim;
    kv_store_kernel<<<pp__cuda_blocks(items, PP_CUDA_THREADS), PP_CUDA_THREADS, 0, c->stream>>>(
        kv->pool, b.row_base, b.row_seq, (int64_t)layer * 2 * kv->block_elems, kv->block_elems, k,
        v, b.n_rows, kv->kv_dim);
    LAUNCH_OK(c, "kv_store_kernel");
}
