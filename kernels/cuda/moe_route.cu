// MoE routing, one thread per token, in the CPU's exact sequence of operations (kernels/cpu/
// route.c): softmax as expf(v - max) summed and divided in index order, top-k by repeated maximum
// with ties to the lower expert id, then the picks sorted by id. A token's expert count is small
// (8 to a few hundred), so a thread per token is enough; only expf may differ from the CPU's by an
// ulp, which can swap two experts whose probabilities tie to within that.
#include <math.h>

#include "kernels/cuda/cuda-impl.cuh"
#include "kernels/cuda/moe_route.cuh"

__device__ static void softmax(float *p, int32_t n)
{
    float max = p[0];
    for (int32_t i = 1; i < n; i++)
        max = p[i] > max ? p[i] : max;
    float sum = 0.0f;
    for (int32_t i = 0; i < n; i++) {
        p[i] = expf(__fsub_rn(p[i], max));
        sum = __fadd_rn(sum, p[i]);
    }
    for (int32_t i = 0; i < n; i++)
        p[i] = __fdiv_rn(p[i], sum);
}

__device__ static void top_k(const float *v, int32_t n, int32_t k, int32_t *pick)
{
    for (int32_t j = 0; j < k; j++) {
        int32_t best = -1;
        for (int32_t i = 0; i < n; i++) {
            bool taken = false;
            for (int32_t q = 0; q < j && !taken; q++)
                taken = pick[q] == i;
            if (!taken && (best < 0 || v[i] > v[best]))
                best = i;
        }
        pick[j] = best;
    }
}

__global__ void moe_route_kernel(int32_t *pick, float *weight, float *logits, int64_t n,
                                 int32_t n_experts, int32_t k, int softmax_first, int renormalise)
{
    int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n)
        return;
    float *lg = logits + t * n_experts;
    int32_t *pk = pick + t * k;
    float *wt = weight + t * k;
    if (!softmax_first) {
        top_k(lg, n_experts, k, pk);
        for (int32_t j = 0; j < k; j++)
            wt[j] = lg[pk[j]];
        softmax(wt, k);
    } else {
        softmax(lg, n_experts);
        top_k(lg, n_experts, k, pk);
        float sum = 0.0f;
        for (int32_t j = 0; j < k; j++) {
            wt[j] = lg[pk[j]];
            sum = __fadd_rn(sum, wt[j]);
        }
        if (renormalise)
            for (int32_t j = 0; j < k; j++)
                wt[j] = __fdiv_rn(wt[j], sum);
    }
    for (int32_t a = 1; a < k; a++)
        for (int32_t b = a; b > 0 && pk[b - 1] > pk[b]; b--) {
            int32_t ti = pk[b];
            pk[b] = pk[b - 1];
            pk[b - 1] = ti;
            float tw = wt[b];
            wt[b] = wt[b - 1];
            wt[b - 1] = tw;
        }
}

void pp__cuda_moe_route(struct pp_backend *be, int32_t *pick, float *weight, float *logits,
                        int64_t n, int32_t n_experts, int32_t k, enum pp_route_mode mode,
                        int renormalise)
{
    struct pp_cuda *c = pp__cuda(be);
    if (n <= 0 || !pp__cuda_enter(c))
        return;
    if (k < 1 || k > n_experts)
        return (void)pp__cuda_fail(c, "moe_route: expected 1 <= k <= %d experts, got %d",
                                   n_experts, k);
    moe_route_kernel<<<pp__cuda_blocks(n, 128), 128, 0, c->stream>>>(
        pick, weight, logits, n, n_experts, k, mode == PP_ROUTE_SOFTMAX_TOPK, renormalise);
    LAUNCH_OK(c, "moe_route_kernel");
}
