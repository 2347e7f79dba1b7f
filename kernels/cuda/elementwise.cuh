// Element-wise ops: SwiGLU, the residual add, bias and gated adds, and the row gather/scatter of
// the MoE FFN (kernels/backend.h has their contracts).
#ifndef PP_CUDA_ELEMENTWISE_CUH
#define PP_CUDA_ELEMENTWISE_CUH

#include "kernels/backend.h"

void pp__cuda_swiglu(struct pp_backend *be, float *out, const float *gate, const float *up,
                     int64_t n);
void pp__cuda_add(struct pp_backend *be, float *y, const float *x, int64_t n);
void pp__cuda_add_bias(struct pp_backend *be, float *y, const float *b, int64_t n, int64_t cols);
void pp__cuda_add_gated(struct pp_backend *be, float *y, const float *x, const float *g, int64_t n,
                        int64_t cols);

#endif
