/* Validation of model hyper-parameters and the RoPE frequency table. */
#include "model/model_config.h"

#include <math.h>
#include <stdint.h>

static const char *const arch_names[PP_ARCH_COUNT] = {"llama", "mistral", "qwen2", "mixtral",
                                                        "qwen2moe"};

const char *pp_arch_name(enum pp_arch a)
{
    return (unsigned)a < PP_ARCH_COUNT ? arch_names[a] : "unknown";
}

static pp_status validate_moe(const struct pp_model_config *c, const char *src)
{
    int moe_arch = c->arch == PP_ARCH_MIXTRAL || c->arch == PP_ARCH_QWEN2MOE;
    if (c->n_experts == 0) {
        if (moe_arch)
            return pp_error(PP_ERR_FORMAT, "%s: architecture %s needs an expert count >= 1, got 0",
                            src, pp_arch_name(c->arch));
        return PP_OK;
    }
    if (!moe_arch)
        return pp_error(PP_ERR_FORMAT, "%s: %d experts given for architecture %s, which has none",
                        src, c->n_experts, pp_arch_name(c->arch));
    if (c->n_experts < 1 || c->n_experts > 4096)
        return pp_error(PP_ERR_FORMAT, "%s: expert count is %d (expected 1..4096)", src,
                        c->n_experts);
    if (c->n_experts_used < 1 || c->n_experts_used > c->n_experts)
        return pp_error(PP_ERR_FORMAT, "%s: experts used per token is %d (expected 1..%d, the "
                        "expert count)", src, c->n_experts_used, c->n_experts);
    if (c->expert_ffn_dim < 1 || c->expert_ffn_dim > (1 << 20))
        return pp_error(PP_ERR_FORMAT, "%s: expert FFN size is %d (expected 1..%d)", src,
                        c->expert_ffn_dim, 1 << 20);
    if (c->shared_ffn_dim < 0 || c->shared_ffn_dim > (1 << 20))
        return pp_error(PP_ERR_FORMAT, "%s: shared expert FFN size is %d (expected 0..%d)", src,
                        c->shared_ffn_dim, 1 << 20);
    if (c->arch == PP_ARCH_MIXTRAL && c->shared_ffn_dim != 0)
        return pp_error(PP_ERR_FORMAT, "%s: mixtral has no shared expert, got shared FFN size %d",
                        src, c->shared_ffn_dim);
    enum pp_moe_gating want = c->arch == PP_ARCH_MIXTRAL ? PP_MOE_TOPK_SOFTMAX
                                                         : PP_MOE_SOFTMAX_TOPK;
    if (c->moe_gating != want)
        return pp_error(PP_ERR_FORMAT, "%s: gating %d does not match architecture %s", src,
                        (int)c->moe_gating, pp_arch_name(c->arch));
    return PP_OK;
}

pp_status pp_model_config_validate(const struct pp_model_config *c, const char *src)
{
    struct {
        const char *name;
        int64_t v;
        int64_t max;
    } sizes[] = {
        {"hidden size", c->dim, 1 << 17},        {"layer count", c->n_layers, 4096},
        {"attention heads", c->n_heads, 4096},   {"KV heads", c->n_kv_heads, 4096},
        {"head dim", c->head_dim, 4096},         {"FFN size", c->ffn_dim, 1 << 20},
        {"vocabulary size", c->vocab_size, 1 << 24}, {"context length", c->max_context, 1 << 24},
    };
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
        if (sizes[i].v < 1 || sizes[i].v > sizes[i].max)
            return pp_error(PP_ERR_FORMAT, "%s: %s is %lld (expected 1..%lld)", src, sizes[i].name,
                            (long long)sizes[i].v, (long long)sizes[i].max);
    if (c->n_heads % c->n_kv_heads != 0)
        return pp_error(PP_ERR_FORMAT, "%s: %d attention heads is not a multiple of %d KV heads",
                        src, c->n_heads, c->n_kv_heads);
    if (c->head_dim % 2 != 0)
        return pp_error(PP_ERR_FORMAT, "%s: head dim %d is odd (RoPE rotates pairs)", src,
                        c->head_dim);
    if (!(c->norm_eps > 0.0f) || !(c->norm_eps < 1.0f))
        return pp_error(PP_ERR_FORMAT, "%s: rms_norm_eps %g is outside (0, 1)", src, c->norm_eps);
    if (!(c->rope_theta > 1.0f) || !isfinite(c->rope_theta))
        return pp_error(PP_ERR_FORMAT, "%s: rope theta %g must be > 1", src, c->rope_theta);
    if (c->sliding_window < 0)
        return pp_error(PP_ERR_FORMAT, "%s: sliding window %d is negative", src, c->sliding_window);
    const struct pp_rope_scaling *r = &c->rope_scaling;
    if (r->llama3 && (!(r->factor >= 1.0f) || !(r->high_freq_factor > r->low_freq_factor) ||
                      !(r->low_freq_factor > 0.0f) || r->original_context < 1))
        return pp_error(PP_ERR_FORMAT,
                        "%s: llama3 rope scaling needs factor >= 1, 0 < low_freq_factor < "
                        "high_freq_factor and original_max_position_embeddings >= 1 (got %g, %g, "
                        "%g, %d)",
                        src, r->factor, r->low_freq_factor, r->high_freq_factor,
                        r->original_context);
    return validate_moe(c, src);
}

void pp_rope_inv_freq(const struct pp_model_config *c, const float *freq_divisors, float *inv_freq)
{
    int32_t half = c->head_dim / 2;
    const struct pp_rope_scaling *r = &c->rope_scaling;
    for (int32_t i = 0; i < half; i++) {
        double f = pow((double)c->rope_theta, -2.0 * i / (double)c->head_dim);
        if (r->llama3) {
            double wavelen = 2.0 * M_PI / f;
            double low_wavelen = r->original_context / (double)r->low_freq_factor;
            double high_wavelen = r->original_context / (double)r->high_freq_factor;
            if (wavelen > low_wavelen) {
                f = f / r->factor;
            } else if (wavelen >= high_wavelen) {
                double s = (r->original_context / wavelen - r->low_freq_factor) /
                           (r->high_freq_factor - r->low_freq_factor);
                f = (1.0 - s) * f / r->factor + s * f;
            }
        }
        if (freq_divisors)
            f = f / (double)freq_divisors[i];
        inv_freq[i] = (float)f;
    }
}

void pp_model_config_add_eos(struct pp_model_config *c, int64_t id)
{
    if (id < 0 || id > INT32_MAX || c->n_eos >= PP_MAX_EOS ||
        pp_model_config_is_eos(c, (int32_t)id))
        return;
    if (c->n_eos == 0)
        c->eos_id = (int32_t)id;
    c->eos_ids[c->n_eos++] = (int32_t)id;
}

int pp_model_config_is_eos(const struct pp_model_config *c, int32_t id)
{
    for (int32_t i = 0; i < c->n_eos; i++)
        if (c->eos_ids[i] == id)
            return 1;
    return 0;
}
