/* The hyper-parameters of a model, whichever file format they came from. */
#ifndef PP_MODEL_CONFIG_H
#define PP_MODEL_CONFIG_H

#include <stdint.h>

#include "common/status.h"
#include "kernels/backend.h"

enum pp_arch {
    PP_ARCH_LLAMA = 0, /* Llama 2/3/3.1/3.2, TinyLlama */
    PP_ARCH_MISTRAL,
    PP_ARCH_QWEN2,
    PP_ARCH_MIXTRAL,  /* GGUF: llama with expert_count; HF: mixtral */
    PP_ARCH_QWEN2MOE, /* GGUF: qwen2moe; HF: qwen2_moe */
    PP_ARCH_COUNT
};

enum pp_model_format { PP_FORMAT_GGUF = 0, PP_FORMAT_HF };

struct pp_rope_scaling {
    int llama3;       /* 0: none */
    float factor;
    float low_freq_factor;
    float high_freq_factor;
    int32_t original_context;
};

#define PP_MAX_EOS 8

/* How router logits become expert weights. */
enum pp_moe_gating {
    PP_MOE_TOPK_SOFTMAX = 0, /* mixtral: top-k of the logits, softmax over those k */
    PP_MOE_SOFTMAX_TOPK,     /* qwen2moe: softmax over all experts, top-k, renormalise only if
                                norm_topk_prob */
};

struct pp_model_config {
    enum pp_arch arch;
    enum pp_model_format format;
    int32_t dim;         /* hidden size */
    int32_t n_layers;
    int32_t n_heads;
    int32_t n_kv_heads;
    int32_t head_dim;
    int32_t ffn_dim;
    int32_t vocab_size;
    int32_t max_context;
    int32_t sliding_window; /* 0: full attention */
    float norm_eps;
    float rope_theta;
    struct pp_rope_scaling rope_scaling;
    enum pp_rope_layout rope_layout; /* decided by (format, architecture) */
    int tied_embeddings;
    int32_t bos_id; /* -1 when unknown */
    int32_t eos_id; /* the primary end-of-sequence token, -1 when unknown */
    int32_t n_eos;  /* every token that ends generation (Llama 3 has several) */
    int32_t eos_ids[PP_MAX_EOS];
    /* Mixture of experts: every layer's FFN is the MoE block when n_experts > 0. */
    int32_t n_experts;      /* 0 = dense */
    int32_t n_experts_used; /* experts per token (top-k) */
    int32_t expert_ffn_dim; /* rows of each expert's gate/up */
    int32_t shared_ffn_dim; /* rows of the shared expert's gate/up; 0 = none */
    int norm_topk_prob;     /* PP_MOE_SOFTMAX_TOPK: renormalise the k weights to sum 1 */
    enum pp_moe_gating moe_gating;
};

/* Adds id to the configuration's end-of-sequence set (ignored when negative, known or full). */
void pp_model_config_add_eos(struct pp_model_config *c, int64_t id);
/* 1 when id ends generation. */
int pp_model_config_is_eos(const struct pp_model_config *c, int32_t id);

const char *pp_arch_name(enum pp_arch a);

/* Checks the values are usable together (positive sizes, heads divide, even head_dim, MoE counts
 * and sizes when n_experts > 0, ...). The
 * message names the source (a path) and the field. */
pp_status pp_model_config_validate(const struct pp_model_config *c, const char *source);

/* inv_freq[head_dim/2] for RoPE: theta^(-2i/head_dim), then the llama3 rule when configured, then
 * divided by freq_divisors[i] when given (GGUF's rope_freqs tensor). */
void pp_rope_inv_freq(const struct pp_model_config *c, const float *freq_divisors, float *inv_freq);

#endif
