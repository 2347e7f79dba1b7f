// Embedding gather: out[n, cols] = rows ids[n] (host) of a loaded weight, as f32.
#ifndef PP_CUDA_EMBED_CUH
#define PP_CUDA_EMBED_CUH

#include "kernels/backend.h"

void pp__cuda_embed(struct pp_backend *be, float *out, const struct pp_weight *w,
                    const int32_t *ids, int64_t n);

#endif
