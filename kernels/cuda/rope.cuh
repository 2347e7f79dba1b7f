// Rotary position embedding in place on x[n, n_heads, head_dim] at positions pos[n] (host), either
// pair layout (kernels/backend.h).
#ifndef PP_CUDA_ROPE_CUH
#define PP_CUDA_ROPE_CUH

#include "kernels/backend.h"

void pp__cuda_rope(struct pp_backend *be, float *x, const int32_t *pos, int64_t n, int32_t n_heads,
                   int32_t head_dim, const float *inv_freq, enum pp_rope_layout layout);

#endif
