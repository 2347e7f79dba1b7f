// RMS normalisation: y[n, dim] = x / sqrt(mean(x²) + eps) * g[dim]; y may alias x.
#ifndef PP_CUDA_RMSNORM_CUH
#define PP_CUDA_RMSNORM_CUH

#include "kernels/backend.h"

void pp__cuda_rmsnorm(struct pp_backend *be, float *y, const float *x, const float *g, int64_t n,
                      int64_t dim, float eps);

#endif
