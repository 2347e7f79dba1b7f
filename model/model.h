/* A model opened for one contiguous layer range [first, last): the weights of those layers, plus
 * the embedding when first == 0 and the final norm and LM head when last == n_layers. Large weights
 * are used in place from the mapped file(s); 1-D tensors (norms, biases) are converted to f32 at
 * load. */
#ifndef PP_MODEL_H
#define PP_MODEL_H

#include <stdint.h>

#include "common/status.h"
#include "kernels/backend.h"
#include "model/model_config.h"

/* A layer's Mixture-of-Experts FFN, or this worker's share of it. Expert matrices point in place
 * into the file's 3-D tensors (or its per-expert tensors); nothing here is copied unless the file
 * misaligns it. */
struct pp_moe_weights {
    int32_t n_experts;           /* experts held here: ids [expert_base, expert_base + n_experts) */
    int32_t expert_base;         /* 0 in an unsharded model */
    struct pp_weight router;     /* [n_experts_total, dim]: always every expert's row */
    struct pp_weight *gate, *up; /* [n_experts] each [ffn_rows, dim] (ffn_rows = expert_ffn_dim
                                    unsharded) */
    struct pp_weight *down;      /* [n_experts] each [dim, ffn_rows] */
    struct pp_weight shared_gate, shared_up; /* [shared_ffn_dim, dim]; data NULL when there is no
                                                shared expert */
    struct pp_weight shared_down;            /* [dim, shared_ffn_dim] */
    float *shared_gate_inp;                  /* [dim] f32, or NULL */
};

struct pp_layer_weights {
    struct pp_weight wq;     /* [n_heads*head_dim, dim] */
    struct pp_weight wk;     /* [n_kv_heads*head_dim, dim] */
    struct pp_weight wv;     /* [n_kv_heads*head_dim, dim] */
    struct pp_weight wo;     /* [dim, n_heads*head_dim] */
    struct pp_weight w_gate; /* [ffn_dim, dim]; data NULL on MoE layers */
    struct pp_weight w_up;   /* [ffn_dim, dim]; data NULL on MoE layers */
    struct pp_weight w_down; /* [dim, ffn_dim]; data NULL on MoE layers */
    struct pp_moe_weights *moe; /* NULL on dense layers; owned by the model */
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
    void **owned_copies; /* weights realigned out of a misaligned file; freed with the model */
    int32_t n_owned;
    int32_t cap_owned;          /* entries allocated in owned_copies */
    int resident;               /* 1: every weight and vector pointer above is already in the memory
                                   of the backend that will run it (a benchmark's model generated
                                   on the device, never one from pp_model_open): loads use them in
                                   place */
};

/* Opens path (a .gguf file or an HF checkpoint directory) for layers [first, last); last < 0 means
 * n_layers. Errors name the file and tensor: missing or truncated file, unknown architecture,
 * missing tensor, wrong shape or dtype. *out is freed with pp_model_free. */
pp_status pp_model_open(const char *path, int32_t first, int32_t last, struct pp_model **out);
void pp_model_free(struct pp_model *m);

/* Reads only the hyper-parameters of a model. */
pp_status pp_model_read_config(const char *path, struct pp_model_config *out);

/* Bytes of weights the range uses (as stored), experts, routers and shared experts included. */
int64_t pp_model_weight_bytes(const struct pp_model *m);
/* Bytes of one layer's matrices (first_layer <= layer < last_layer), and of one weight (0 when
 * absent), as stored. */
int64_t pp_model_layer_bytes(const struct pp_model *m, int32_t layer);
int64_t pp_weight_bytes(const struct pp_weight *w);

#endif
