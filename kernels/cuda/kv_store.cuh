// KV store: k, v [n, kv_dim] rows of each sequence into the paged cache at its positions.
#ifndef PP_CUDA_KV_STORE_CUH
#define PP_CUDA_KV_STORE_CUH

#include "kernels/backend.h"

void pp__cuda_kv_store(struct pp_backend *be, const struct pp_kv_view *kv, int32_t layer,
                       const struct pp_attn_seq *seqs, int32_t n_seqs, const float *k,
                       const float *v);

#endif
