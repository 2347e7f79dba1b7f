/* A model opened for one contiguous layer range [first, last): the weights of those layers, plus the
 * embedding when first == 0 and the final norm and LM head when last == n_layers. Large weights are
 * used in place from the mapped file(s); 1-D tensors (norms, biases) are converted to f32 at load. */
#ifndef PP_MODEL_H
#define PP_MODEL_H

#include <stdint.h>

#include "common/status.h"
#include "kernels/backend.h"
#include "model/model_config.h"

struct pp_layer_weights {
    struct pp_weight wq;     /* [n_heads*head_dim, dim] */
    struct pp_weight wk;     /* [n_kv_heads*head_dim, dim] */
    struct pp_weight wv;     /* [n_kv_heads*head_dim, dim] */
    struct pp_weight wo;     /* [dim, n_heads*head_dim] */
    struct pp_weight w_gate; /* [ffn_dim, dim] */
    struct pp_weight w_up;   /* [ffn_dim, dim] */
    struct pp_weight w_down; /* [dim, ffn_dim] */
    float *attn_norm;        /* [dim] */
    float *ffn_norm;         /* [dim] */
    float *bq;               /* [n_heads*head_dim] or NULL */
    float *bk;               /* [n_kv_heads*head_dim] or NULL */
    float *bv;               /* [n_kv_heads*head_dim] or NULL */
};

struct pp_source;

struct pp_model {
    struct pp_model_config cfg;
    int32_t first_layer; /* range [first_layer, last_layer) */
    int32_t last_layer;
    int has_embedding;          /* first_layer == 0 */
    int has_head;               /* last_layer == n_layers */
    struct pp_weight embedding; /* [vocab, dim]; when has_embedding */
    struct pp_weight lm_head;   /* [vocab, dim]; when has_head (the embedding when tied) */
    float *final_norm;          /* [dim]; when has_head */
    struct pp_layer_weights *layers; /* [last_layer - first_layer] */
    float *inv_freq;            /* [head_dim/2] RoPE inverse frequencies */
    struct pp_source *source;   /* the open file(s); internal */
    void **owned_copies;        /* weights realigned out of a misaligned file; freed with the model */
    int32_t n_owned;
};

/* Opens path (a .gguf file or an HF checkpoint directory) for layers [first, last); last < 0 means
 * n_layers. Errors name the file and tensor: missing or truncated file, unknown architecture,
 * missing tensor, wrong shape or dtype. *out is freed with pp_model_free. */
pp_status pp_model_open(const char *path, int32_t first, int32_t last, struct pp_model **out);
void pp_model_free(struct pp_model *m);

/* Reads only the hyper-parameters of a model. */
pp_status pp_model_read_config(const char *path, struct pp_model_config *out);

/* Bytes of weights the range uses (as stored). */
int64_t pp_model_weight_bytes(const struct pp_model *m);
/* Bytes of one layer's matrices (first_layer <= layer < last_layer), and of one weight (0 when
 * absent), as stored. */
int64_t pp_model_layer_bytes(const struct pp_model *m, int32_t layer);
int64_t pp_weight_bytes(const struct pp_weight *w);

#endif
