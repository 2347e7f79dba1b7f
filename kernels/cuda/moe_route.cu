// MoE routing, one thread per token, running the CPU's own code (kernels/route_impl.h): softmax as
// expf(v - max) summed and divided in index order, top-k by repeated maximum with ties to the lower
// expert id, then the picks sorted by id. A token's expert count is small (8 to a few hundred), so
// a thread per token is enough; only expf may differ from the CPU's by an ulp, which can swap two
// experts whose probabilities tie to within that.
#include <math.h>

#include "kernels/cuda/cuda-impl.cuh"
#include "kernels/cuda/moe_route.cuh"
#include "kernels/route_impl.h"

__global__ void moe_route_kernel(int32_t *pick, float *weight, float *logits, int64_t n,
                                 int32_t n_experts, int32_t k, enum pp_route_mode mode,
                                 int renormalise)
{
    int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t < n)
        pp__route_token(logits + t * n_experts, n_experts, k, mode, renormalise, pick + t * k,
                        weight + t * k);
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
        pick, weight, logits, n, n_experts, k, mode, renormalise);
    LAUNCH_OK(c, "moe_route_kernel");
}
