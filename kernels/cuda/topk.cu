// Top-k of logit rows by selection: one block per row runs k rounds; round j finds the best element
// strictly after round j-1's pick in the order (value descending, id ascending), NaN ranking below
// every number, as the CPU's topk orders them. k rounds over the row cost k passes, which is what
// sampling needs (k is small; k = 1 is argmax in one pass).
#include <math.h>

#include "kernels/cuda/cuda-impl.cuh"
#include "kernels/cuda/topk.cuh"

#define TOPK_THREADS 512

__device__ __forceinline__ float rank_key(float v)
{
    return isnan(v) ? -INFINITY : v;
}

/* a ranks before b */
__device__ __forceinline__ bool before(float ka, int32_t ia, float kb, int32_t ib)
{
    return ka > kb || (ka == kb && ia < ib);
}

__global__ void topk_kernel(int32_t *ids, float *vals, const float *logits, int64_t vocab,
                            int32_t k)
{
    __shared__ float s_key[TOPK_THREADS / 32];
    __shared__ int32_t s_id[TOPK_THREADS / 32];
    __shared__ float last_key;
    __shared__ int32_t last_id;
    const float *row = logits + (int64_t)blockIdx.x * vocab;
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (threadIdx.x == 0) {
        last_key = INFINITY;
        last_id = -1;
    }
    __syncthreads();
    for (int32_t j = 0; j < k; j++) {
        float lk = last_key;
        int32_t li = last_id;
        float bk = -INFINITY;
        int32_t bi = INT32_MAX;
        for (int64_t i = threadIdx.x; i < vocab; i += TOPK_THREADS) {
            float key = rank_key(row[i]);
            if (before(lk, li, key, (int32_t)i) && before(key, (int32_t)i, bk, bi)) {
                bk = key;
                bi = (int32_t)i;
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            float ok = __shfl_xor_sync(0xffffffffu, bk, o);
            int32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (before(ok, oi, bk, bi)) {
                bk = ok;
                bi = oi;
            }
        }
        if (lane == 0) {
            s_key[warp] = bk;
            s_id[warp] = bi;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int w = 1; w < TOPK_THREADS / 32; w++)
                if (before(s_key[w], s_id[w], bk, bi)) {
                    bk = s_key[w];
                    bi = s_id[w];
                }
            ids[(int64_t)blockIdx.x * k + j] = bi;
            vals[(int64_t)blockIdx.x * k + j] = row[bi];
            last_key = bk;
            last_id = bi;
        }
        __syncthreads();
    }
}

pp_status pp__cuda_topk(struct pp_backend *be, int32_t *ids, float *vals, const float *logits,
                        int64_t n, int64_t vocab, int32_t k)
{
    struct pp_cuda *c = pp__cuda(be);
    if (k < 1 || k > vocab || vocab > INT32_MAX)
        return pp_error(PP_ERR_INVALID_ARG, "topk: expected 1 <= k <= vocab (%lld), got %d",
                        (long long)vocab, k);
    if (n <= 0)
        return be->ops->sync(be);
    int64_t bytes = n * k * (int64_t)(sizeof(int32_t) + sizeof(float));
    if (bytes > c->scratch_bytes || n > 2147483647)
        return pp_error(PP_ERR_INVALID_ARG, "topk: %lld rows of k = %d need %lld bytes, the "
                        "workspace has %lld", (long long)n, k, (long long)bytes,
                        (long long)c->scratch_bytes);
    if (pp__cuda_enter(c)) {
        int32_t *d_ids = (int32_t *)c->scratch;
        float *d_vals = (float *)(d_ids + n * k);
        topk_kernel<<<(unsigned)n, TOPK_THREADS, 0, c->stream>>>(d_ids, d_vals, logits, vocab, k);
        if (LAUNCH_OK(c, "topk_kernel")) {
            pp_status st = be->ops->copy_out(be, ids, d_ids, n * k * (int64_t)sizeof(int32_t));
            if (st != PP_OK)
                return st;
            return be->ops->copy_out(be, vals, d_vals, n * k * (int64_t)sizeof(float));
        }
    }
    return be->ops->sync(be);
}
