// Matmul y[n, w.rows] = x[n, w.cols] · wᵀ on a loaded weight (f32, f16 or bf16), f32 accumulation.
#ifndef PP_CUDA_MATMUL_CUH
#define PP_CUDA_MATMUL_CUH

#include "kernels/backend.h"

void pp__cuda_matmul(struct pp_backend *be, float *y, const float *x, const struct pp_weight *w,
                     int64_t n);
void pp__cuda_matmul_many(struct pp_backend *be, int count, float *const y[], const float *x,
                          const struct pp_weight *const w[], int64_t n);

#endif
