// Row gather and weighted scatter-add (the MoE FFN's dispatch and combine); row lists and weights
// are host memory.
#ifndef PP_CUDA_ROWS_CUH
#define PP_CUDA_ROWS_CUH

#include "kernels/backend.h"

void pp__cuda_gather_rows(struct pp_backend *be, float *dst, const float *src,
                          const int32_t *rows, int64_t n, int64_t cols);
void pp__cuda_scatter_add_rows(struct pp_backend *be, float *dst, const float *src,
                               const int32_t *rows, const float *w, int64_t n, int64_t cols);

#endif
