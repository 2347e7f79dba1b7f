// Causal attention over the paged KV cache (kernels/backend.h): sequence parts of a few tokens
// (decode) by flash-decoding, longer parts (prefill) by tiles of queries.
#ifndef PP_CUDA_ATTENTION_CUH
#define PP_CUDA_ATTENTION_CUH

#include "kernels/backend.h"

void pp__cuda_attention(struct pp_backend *be, float *out, const float *q,
                        const struct pp_kv_view *kv, int32_t layer, const struct pp_attn_seq *seqs,
                        int32_t n_seqs, const struct pp_attn_shape *shape);

// Shared-memory opt-in of the prefill kernels; called once when the backend is made. Returns 0
// after recording an error.
int pp__cuda_attention_setup(struct pp_cuda *c);

#endif
