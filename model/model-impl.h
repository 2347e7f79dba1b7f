/* Internal to model/: the tensor binder shared by model.c (dense layers, embedding, head) and
 * moe_bind.c (expert layers). */
#ifndef PP_MODEL_IMPL_H
#define PP_MODEL_IMPL_H

#include <stdint.h>

#include "common/status.h"
#include "model/model.h"
#include "model/tensor.h"

struct pp_source;

struct pp__binder {
    struct pp_model *m;
    struct pp_source *src;
};

/* Finds tensor `name` and checks it has n_dims dims equal to want[n_dims]. An absent tensor is
 * PP_OK with *out NULL when optional, else PP_ERR_NOT_FOUND naming file and tensor. */
pp_status pp__bind_find(struct pp__binder *b, const char *name, int32_t n_dims,
                        const int64_t *want, int optional, const struct pp_tensor **out);
/* w = the index-th [rows, cols] matrix of t (0 for a 2-D tensor, an expert for a 3-D one), used in
 * place; realigned into memory the model owns only if the file misaligns it. */
pp_status pp__bind_matrix(struct pp__binder *b, const char *name, const struct pp_tensor *t,
                          int64_t index, int64_t rows, int64_t cols, struct pp_weight *w);
/* A required 2-D tensor [rows, cols] bound with pp__bind_matrix. */
pp_status pp__bind_weight(struct pp__binder *b, const char *name, int64_t rows, int64_t cols,
                          struct pp_weight *w);
/* A 1-D tensor [n] converted to owned f32 (*out NULL when optional and absent). */
pp_status pp__bind_vector(struct pp__binder *b, const char *name, int64_t n, int optional,
                          float **out);
/* t's first n values converted to owned f32 (f32, f16 or bf16). */
pp_status pp__bind_vector_from(struct pp__binder *b, const char *name, const struct pp_tensor *t,
                               int64_t n, float **out);

/* The MoE FFN of a layer (moe_bind.c): router, every expert, the shared expert when the config
 * has one. *out is freed with pp__moe_weights_free (NULL-safe, safe when half-built). */
pp_status pp__bind_moe(struct pp__binder *b, int32_t layer, struct pp_moe_weights **out);
void pp__moe_weights_free(struct pp_moe_weights *mw);
/* Bytes of the router, the experts held and the shared expert, as stored; 0 for NULL. */
int64_t pp__moe_weights_bytes(const struct pp_moe_weights *mw);

#endif
