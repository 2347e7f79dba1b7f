// Loading weights and vectors into device memory: from the caller's host memory (the mapped
// file) through the backend's two pinned staging buffers, chunk by chunk, converting f32 and Q8_0
// to bf16 on the way. The host never holds a whole copy of a tensor.
#ifndef PP_CUDA_WEIGHTS_CUH
#define PP_CUDA_WEIGHTS_CUH

#include "kernels/backend.h"

pp_status pp__cuda_weight_load(struct pp_backend *be, const struct pp_weight *w, int resident,
                               struct pp_weight *out);
void pp__cuda_weight_free(struct pp_backend *be, struct pp_weight *w);
pp_status pp__cuda_vec_load(struct pp_backend *be, const float *v, int64_t n, int resident,
                            const float **out);
void pp__cuda_vec_free(struct pp_backend *be, const float *v);

#endif
