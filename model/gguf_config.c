/* Model hyper-parameters from GGUF metadata. The key prefix is the architecture name; the RoPE
 * layout follows from the architecture: the converter permuted q/k rows for `llama` (Mixtral is
 * `llama` with `llama.expert_count`), not for `qwen2` and `qwen2moe`. */
#include <stdio.h>
#include <string.h>

#include "model/gguf.h"
#include "model/source.h"

static pp_status arch_key_i32(const struct pp_gguf *g, const char *arch, const char *suffix,
                              int required, int32_t *out)
{
    char key[128];
    snprintf(key, sizeof(key), "%s.%s", arch, suffix);
    int64_t v;
    pp_status st = pp_gguf_get_i64(g, key, &v);
    if (st == PP_ERR_NOT_FOUND)
        return required ? pp_error(PP_ERR_FORMAT, "%s: missing metadata key %s", g->path, key)
                        : PP_OK;
    if (st != PP_OK)
        return st;
    if (v < 0 || v > INT32_MAX)
        return pp_error(PP_ERR_FORMAT, "%s: %s = %lld is out of range", g->path, key, (long long)v);
    *out = (int32_t)v;
    return PP_OK;
}

static pp_status arch_key_f32(const struct pp_gguf *g, const char *arch, const char *suffix,
                              float *out)
{
    char key[128];
    snprintf(key, sizeof(key), "%s.%s", arch, suffix);
    pp_status st = pp_gguf_get_f32(g, key, out);
    return st == PP_ERR_NOT_FOUND ? PP_OK : st;
}

/* The MoE keys. `llama` with expert_count > 0 is Mixtral. qwen2moe's renormalisation of the top-k
 * weights is `qwen2moe.expert_weights_norm` when present; llama.cpp's converter does not write it
 * for qwen2moe, so it defaults to HF Qwen2MoeConfig's norm_topk_prob default, false. */
static pp_status read_moe(const struct pp_gguf *g, const char *arch, struct pp_model_config *c)
{
    pp_status st;
    int qwen = c->arch == PP_ARCH_QWEN2MOE;
    if ((st = arch_key_i32(g, arch, "expert_count", qwen, &c->n_experts)) != PP_OK)
        return st;
    if (c->n_experts == 0)
        return PP_OK;
    if ((st = arch_key_i32(g, arch, "expert_used_count", 1, &c->n_experts_used)) != PP_OK)
        return st;
    if (!qwen) {
        c->arch = PP_ARCH_MIXTRAL;
        c->moe_gating = PP_MOE_TOPK_SOFTMAX;
        c->expert_ffn_dim = c->ffn_dim;
        return PP_OK;
    }
    c->moe_gating = PP_MOE_SOFTMAX_TOPK;
    if ((st = arch_key_i32(g, arch, "expert_feed_forward_length", 1, &c->expert_ffn_dim)) ||
        (st = arch_key_i32(g, arch, "expert_shared_feed_forward_length", 0, &c->shared_ffn_dim)))
        return st;
    char key[128];
    snprintf(key, sizeof(key), "%s.expert_weights_norm", arch);
    st = pp_gguf_get_bool(g, key, &c->norm_topk_prob);
    return st == PP_ERR_NOT_FOUND ? PP_OK : st;
}

pp_status pp__gguf_read_config(const struct pp_gguf *g, const char *path,
                               struct pp_model_config *c)
{
    struct pp_gguf_str a;
    pp_status st = pp_gguf_get_str(g, "general.architecture", &a);
    if (st == PP_ERR_NOT_FOUND)
        return pp_error(PP_ERR_FORMAT, "%s: missing metadata key general.architecture", path);
    if (st != PP_OK)
        return st;
    char arch[64];
    snprintf(arch, sizeof(arch), "%.*s", (int)(a.len < 63 ? a.len : 63), a.ptr);
    memset(c, 0, sizeof(*c));
    c->format = PP_FORMAT_GGUF;
    if (strcmp(arch, "llama") == 0) {
        c->arch = PP_ARCH_LLAMA;
        c->rope_layout = PP_ROPE_INTERLEAVED;
    } else if (strcmp(arch, "qwen2") == 0) {
        c->arch = PP_ARCH_QWEN2;
        c->rope_layout = PP_ROPE_NEOX;
    } else if (strcmp(arch, "qwen2moe") == 0) {
        c->arch = PP_ARCH_QWEN2MOE;
        c->rope_layout = PP_ROPE_NEOX;
    } else {
        return pp_error(PP_ERR_UNSUPPORTED,
                        "%s: unknown architecture \"%s\" (supported: llama, qwen2, qwen2moe)",
                        path, arch);
    }
    c->norm_eps = 1e-5f;
    c->rope_theta = 10000.0f;
    c->max_context = 2048;
    c->bos_id = -1;
    c->eos_id = -1;
    if ((st = arch_key_i32(g, arch, "embedding_length", 1, &c->dim)) != PP_OK ||
        (st = arch_key_i32(g, arch, "block_count", 1, &c->n_layers)) != PP_OK ||
        (st = arch_key_i32(g, arch, "feed_forward_length", 1, &c->ffn_dim)) != PP_OK ||
        (st = arch_key_i32(g, arch, "attention.head_count", 1, &c->n_heads)) != PP_OK ||
        (st = arch_key_i32(g, arch, "attention.head_count_kv", 0, &c->n_kv_heads)) != PP_OK ||
        (st = arch_key_i32(g, arch, "attention.key_length", 0, &c->head_dim)) != PP_OK ||
        (st = arch_key_i32(g, arch, "context_length", 0, &c->max_context)) != PP_OK ||
        (st = arch_key_i32(g, arch, "vocab_size", 0, &c->vocab_size)) != PP_OK ||
        (st = arch_key_f32(g, arch, "attention.layer_norm_rms_epsilon", &c->norm_eps)) != PP_OK ||
        (st = arch_key_f32(g, arch, "rope.freq_base", &c->rope_theta)) != PP_OK)
        return st;
    if ((st = read_moe(g, arch, c)) != PP_OK)
        return st;
    char key[128];
    snprintf(key, sizeof(key), "%s.rope.scaling.type", arch);
    struct pp_gguf_str scaling;
    if (pp_gguf_get_str(g, key, &scaling) == PP_OK &&
        !(scaling.len == 4 && memcmp(scaling.ptr, "none", 4) == 0))
        return pp_error(PP_ERR_UNSUPPORTED, "%s: %s = \"%.*s\" is not supported", path, key,
                        (int)scaling.len, scaling.ptr);
    if (c->n_kv_heads == 0)
        c->n_kv_heads = c->n_heads;
    if (c->head_dim == 0 && c->n_heads > 0)
        c->head_dim = c->dim / c->n_heads;
    if (c->vocab_size == 0) {
        const struct pp_tensor *emb = pp_gguf_tensor(g, "token_embd.weight");
        if (emb && emb->n_dims == 2)
            c->vocab_size = (int32_t)emb->shape[0];
    }
    c->tied_embeddings = pp_gguf_tensor(g, "output.weight") == NULL;
    int64_t id;
    if (pp_gguf_get_i64(g, "tokenizer.ggml.bos_token_id", &id) == PP_OK && id >= 0 &&
        id < INT32_MAX)
        c->bos_id = (int32_t)id;
    if (pp_gguf_get_i64(g, "tokenizer.ggml.eos_token_id", &id) == PP_OK)
        pp_model_config_add_eos(c, id);
    if (pp_gguf_get_i64(g, "tokenizer.ggml.eot_token_id", &id) == PP_OK)
        pp_model_config_add_eos(c, id);
    return pp_model_config_validate(c, path);
}
