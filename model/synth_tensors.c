/* The canonical tensor table of a synthetic model: HF and GGUF names, shapes, value kinds and the
 * GGUF `llama` q/k row permutation, plus the llama3 rope_freqs divisors. Both writers walk this one
 * table, so the two files always describe the same model. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "model/synth-impl.h"

/* Per layer: attn_norm, q, [q bias], k, [k bias], v, [v bias], o, ffn_norm, then the FFN. */
static int64_t attn_slots(const struct pp__synth_model *m)
{
    return m->s.qkv_bias ? 9 : 6;
}

/* Dense FFN: gate, up, down. MoE: router, every expert's gate, then up, then down, then the shared
 * expert's gate, up, down and gate vector when there is one. */
static int64_t ffn_slots(const struct pp__synth_model *m)
{
    if (!m->moe)
        return 3;
    return 1 + 3 * (int64_t)m->s.n_experts + (m->s.shared_ffn_dim ? 4 : 0);
}

static int64_t per_layer(const struct pp__synth_model *m)
{
    return attn_slots(m) + ffn_slots(m);
}

int64_t pp__synth_tensor_count(const struct pp__synth_model *m)
{
    return 1 + (int64_t)m->s.n_layers * per_layer(m) + 1 + (m->s.tied ? 0 : 1);
}

int64_t pp__synth_tensor_numel(const struct pp__synth_tensor *t)
{
    return t->n_dims == 1 ? t->shape[0] : t->shape[0] * t->shape[1];
}

static void set(struct pp__synth_tensor *t, enum pp__synth_kind kind, int64_t rows, int64_t cols)
{
    t->kind = kind;
    t->n_dims = cols ? 2 : 1;
    t->shape[0] = rows;
    t->shape[1] = cols;
    t->perm_heads = 0;
    t->expert = -1;
    t->n_experts = 0;
    t->hf_row = 0;
}

/* MoE FFN slot j (0 = router) of a layer. */
static void moe_tensor(const struct pp__synth_model *m, int64_t layer, int64_t j,
                       struct pp__synth_tensor *t)
{
    static const char *const roles[3][3] = {
        /* GGUF, mixtral, qwen2moe */
        {"ffn_gate", "w1", "gate_proj"},
        {"ffn_up", "w3", "up_proj"},
        {"ffn_down", "w2", "down_proj"},
    };
    static const char *const shared[4][2] = {
        {"ffn_gate_shexp.weight", "mlp.shared_expert.gate_proj.weight"},
        {"ffn_up_shexp.weight", "mlp.shared_expert.up_proj.weight"},
        {"ffn_down_shexp.weight", "mlp.shared_expert.down_proj.weight"},
        {"ffn_gate_inp_shexp.weight", "mlp.shared_expert_gate.weight"},
    };
    const struct pp_synth_spec *s = &m->s;
    int mixtral = m->arch == PP__SYNTH_MIXTRAL;
    int64_t n = s->n_experts, L = layer;
    if (j == 0) {
        set(t, PP__SYNTH_LINEAR, n, s->dim);
        snprintf(t->hf_name, sizeof(t->hf_name), "model.layers.%lld.%s", (long long)L,
                 mixtral ? "block_sparse_moe.gate.weight" : "mlp.gate.weight");
        snprintf(t->gguf_name, sizeof(t->gguf_name), "blk.%lld.ffn_gate_inp.weight", (long long)L);
        return;
    }
    if (j <= 3 * n) {
        int64_t role = (j - 1) / n, e = (j - 1) % n;
        if (role < 2)
            set(t, PP__SYNTH_LINEAR, s->expert_ffn_dim, s->dim);
        else
            set(t, PP__SYNTH_LINEAR, s->dim, s->expert_ffn_dim);
        t->expert = (int32_t)e;
        t->n_experts = (int32_t)n;
        snprintf(t->hf_name, sizeof(t->hf_name), "model.layers.%lld.%s.experts.%lld.%s.weight",
                 (long long)L, mixtral ? "block_sparse_moe" : "mlp", (long long)e,
                 roles[role][mixtral ? 1 : 2]);
        snprintf(t->gguf_name, sizeof(t->gguf_name), "blk.%lld.%s_exps.weight", (long long)L,
                 roles[role][0]);
        return;
    }
    int64_t k = j - 1 - 3 * n;
    if (k < 2)
        set(t, PP__SYNTH_LINEAR, s->shared_ffn_dim, s->dim);
    else if (k == 2)
        set(t, PP__SYNTH_LINEAR, s->dim, s->shared_ffn_dim);
    else {
        set(t, PP__SYNTH_GATE, s->dim, 0);
        t->hf_row = 1;
    }
    snprintf(t->hf_name, sizeof(t->hf_name), "model.layers.%lld.%s", (long long)L, shared[k][1]);
    snprintf(t->gguf_name, sizeof(t->gguf_name), "blk.%lld.%s", (long long)L, shared[k][0]);
}

/* Slot j of a layer: its HF suffix, GGUF suffix and shape. */
static void layer_tensor(const struct pp__synth_model *m, int64_t layer, int64_t j,
                         struct pp__synth_tensor *t)
{
    const struct pp_synth_spec *s = &m->s;
    int64_t q_dim = (int64_t)s->n_heads * s->head_dim;
    int64_t kv_dim = (int64_t)s->n_kv_heads * s->head_dim;
    int llama = m->gguf_llama; /* GGUF arch llama: q/k permuted */
    static const int8_t no_bias_slot[9] = {0, 1, 3, 5, 7, 8, 9, 10, 11}; /* skips 2, 4, 6 */
    const char *hf, *gg;
    if (m->moe && j >= attn_slots(m)) {
        moe_tensor(m, layer, j - attn_slots(m), t);
        return;
    }
    if (!s->qkv_bias)
        j = no_bias_slot[j];
    switch (j) {
    case 0:
        hf = "input_layernorm.weight";
        gg = "attn_norm.weight";
        set(t, PP__SYNTH_NORM, s->dim, 0);
        break;
    case 1:
        hf = "self_attn.q_proj.weight";
        gg = "attn_q.weight";
        set(t, PP__SYNTH_LINEAR, q_dim, s->dim);
        t->perm_heads = llama ? s->n_heads : 0;
        break;
    case 2:
        hf = "self_attn.q_proj.bias";
        gg = "attn_q.bias";
        set(t, PP__SYNTH_BIAS, q_dim, 0);
        t->perm_heads = llama ? s->n_heads : 0;
        break;
    case 3:
        hf = "self_attn.k_proj.weight";
        gg = "attn_k.weight";
        set(t, PP__SYNTH_LINEAR, kv_dim, s->dim);
        t->perm_heads = llama ? s->n_kv_heads : 0;
        break;
    case 4:
        hf = "self_attn.k_proj.bias";
        gg = "attn_k.bias";
        set(t, PP__SYNTH_BIAS, kv_dim, 0);
        t->perm_heads = llama ? s->n_kv_heads : 0;
        break;
    case 5:
        hf = "self_attn.v_proj.weight";
        gg = "attn_v.weight";
        set(t, PP__SYNTH_LINEAR, kv_dim, s->dim);
        break;
    case 6:
        hf = "self_attn.v_proj.bias";
        gg = "attn_v.bias";
        set(t, PP__SYNTH_BIAS, kv_dim, 0);
        break;
    case 7:
        hf = "self_attn.o_proj.weight";
        gg = "attn_output.weight";
        set(t, PP__SYNTH_LINEAR, s->dim, q_dim);
        break;
    case 8:
        hf = "post_attention_layernorm.weight";
        gg = "ffn_norm.weight";
        set(t, PP__SYNTH_NORM, s->dim, 0);
        break;
    case 9:
        hf = "mlp.gate_proj.weight";
        gg = "ffn_gate.weight";
        set(t, PP__SYNTH_LINEAR, s->ffn_dim, s->dim);
        break;
    case 10:
        hf = "mlp.up_proj.weight";
        gg = "ffn_up.weight";
        set(t, PP__SYNTH_LINEAR, s->ffn_dim, s->dim);
        break;
    default:
        hf = "mlp.down_proj.weight";
        gg = "ffn_down.weight";
        set(t, PP__SYNTH_LINEAR, s->dim, s->ffn_dim);
        break;
    }
    snprintf(t->hf_name, sizeof(t->hf_name), "model.layers.%lld.%s", (long long)layer, hf);
    snprintf(t->gguf_name, sizeof(t->gguf_name), "blk.%lld.%s", (long long)layer, gg);
}

void pp__synth_tensor_get(const struct pp__synth_model *m, int64_t i, struct pp__synth_tensor *t)
{
    const struct pp_synth_spec *s = &m->s;
    int64_t n_layer_tensors = (int64_t)s->n_layers * per_layer(m);
    memset(t, 0, sizeof(*t));
    if (i == 0) {
        strcpy(t->hf_name, "model.embed_tokens.weight");
        strcpy(t->gguf_name, "token_embd.weight");
        set(t, PP__SYNTH_EMBED, s->vocab_size, s->dim);
    } else if (i <= n_layer_tensors) {
        layer_tensor(m, (i - 1) / per_layer(m), (i - 1) % per_layer(m), t);
    } else if (i == n_layer_tensors + 1) {
        strcpy(t->hf_name, "model.norm.weight");
        strcpy(t->gguf_name, "output_norm.weight");
        set(t, PP__SYNTH_NORM, s->dim, 0);
    } else {
        strcpy(t->hf_name, "lm_head.weight");
        strcpy(t->gguf_name, "output.weight");
        set(t, PP__SYNTH_LINEAR, s->vocab_size, s->dim);
    }
}

int64_t pp__synth_gguf_row_to_hf(int64_t r, int32_t n_heads, int64_t rows)
{
    /* GGUF row h*d + 2i + t holds HF row h*d + t*(d/2) + i. */
    int64_t d = rows / n_heads;
    int64_t h = r / d, j = r % d;
    return h * d + (j % 2) * (d / 2) + j / 2;
}

void pp__synth_rope_freqs(const struct pp__synth_model *m, float *out)
{
    const double factor = 8.0, low = 1.0, high = 4.0, orig_ctx = 8192.0;
    const double pi = 3.14159265358979323846;
    int32_t d = m->s.head_dim;
    for (int32_t i = 0; i < d / 2; i++) {
        double freq = pow((double)m->s.rope_theta, -2.0 * i / d);
        double wavelen = 2.0 * pi / freq;
        double divisor;
        if (wavelen < orig_ctx / high) {
            divisor = 1.0;
        } else if (wavelen > orig_ctx / low) {
            divisor = factor;
        } else {
            double smooth = (orig_ctx / wavelen - low) / (high - low);
            divisor = 1.0 / ((1.0 - smooth) / factor + smooth);
        }
        out[i] = (float)divisor;
    }
}
