// The k largest logits of each row (ties to the lower id), on the device; results to the host.
#ifndef PP_CUDA_TOPK_CUH
#define PP_CUDA_TOPK_CUH

#include "kernels/backend.h"

pp_status pp__cuda_topk(struct pp_backend *be, int32_t *ids, float *vals, const float *logits,
                        int64_t n, int64_t vocab, int32_t k);

#endif
