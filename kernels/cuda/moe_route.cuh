// MoE routing on the device: each token's k experts and weights from its router logits.
#ifndef PP_CUDA_MOE_ROUTE_CUH
#define PP_CUDA_MOE_ROUTE_CUH

#include "kernels/backend.h"

void pp__cuda_moe_route(struct pp_backend *be, int32_t *pick, float *weight, float *logits,
                        int64_t n, int32_t n_experts, int32_t k, enum pp_route_mode mode,
                        int renormalise);

#endif
