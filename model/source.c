/* Opening a model path and looking tensors up by their GGUF names in either format. */
#include "model/source.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "common/alloc.h"
#include "model/gguf.h"
#ifdef PP_HAVE_JANSSON
#include "model/hf_checkpoint.h"
#endif

/* GGUF per-layer suffix → HF per-layer suffix. */
static const char *const layer_names[][2] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_q.bias", "self_attn.q_proj.bias"},
    {"attn_k.bias", "self_attn.k_proj.bias"},
    {"attn_v.bias", "self_attn.v_proj.bias"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
};

/* MoE per-layer names: GGUF suffix → Mixtral, Qwen2-MoE suffix. */
static const char *const moe_names[][3] = {
    {"ffn_gate_inp.weight", "block_sparse_moe.gate.weight", "mlp.gate.weight"},
    {"ffn_gate_shexp.weight", NULL, "mlp.shared_expert.gate_proj.weight"},
    {"ffn_up_shexp.weight", NULL, "mlp.shared_expert.up_proj.weight"},
    {"ffn_down_shexp.weight", NULL, "mlp.shared_expert.down_proj.weight"},
    {"ffn_gate_inp_shexp.weight", NULL, "mlp.shared_expert_gate.weight"},
};

/* One expert's matrices, named as split GGUF files name them (blk.N.ffn_gate.E.weight). */
static const char *const expert_names[][3] = {
    {"ffn_gate", "w1", "gate_proj"},
    {"ffn_up", "w3", "up_proj"},
    {"ffn_down", "w2", "down_proj"},
};

static const char *const global_names[][2] = {
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
};

/* The HF name of a GGUF MoE tensor of layer `layer` (suffix after "blk.N."); 0 when none. */
static int hf_moe_name(enum pp_arch arch, int layer, const char *suffix, char *out, size_t cap)
{
    int col = arch == PP_ARCH_MIXTRAL ? 1 : arch == PP_ARCH_QWEN2MOE ? 2 : 0;
    if (!col)
        return 0;
    for (size_t i = 0; i < sizeof(moe_names) / sizeof(moe_names[0]); i++)
        if (strcmp(suffix, moe_names[i][0]) == 0 && moe_names[i][col]) {
            snprintf(out, cap, "model.layers.%d.%s", layer, moe_names[i][col]);
            return 1;
        }
    for (size_t i = 0; i < sizeof(expert_names) / sizeof(expert_names[0]); i++) {
        size_t n = strlen(expert_names[i][0]);
        int expert, end = 0;
        if (strncmp(suffix, expert_names[i][0], n) != 0 ||
            sscanf(suffix + n, ".%d.weight%n", &expert, &end) != 1 || suffix[n + end] != '\0' ||
            expert < 0)
            continue;
        snprintf(out, cap, "model.layers.%d.%s.experts.%d.%s.weight", layer,
                 col == 1 ? "block_sparse_moe" : "mlp", expert, expert_names[i][col]);
        return 1;
    }
    return 0;
}

/* Writes the HF name of a GGUF tensor name into out; 0 when it has none. */
static int hf_name(enum pp_arch arch, const char *gguf, char *out, size_t cap)
{
    for (size_t i = 0; i < sizeof(global_names) / sizeof(global_names[0]); i++)
        if (strcmp(gguf, global_names[i][0]) == 0) {
            snprintf(out, cap, "%s", global_names[i][1]);
            return 1;
        }
    int layer, n = 0;
    if (sscanf(gguf, "blk.%d.%n", &layer, &n) != 1 || n == 0)
        return 0;
    for (size_t i = 0; i < sizeof(layer_names) / sizeof(layer_names[0]); i++)
        if (strcmp(gguf + n, layer_names[i][0]) == 0) {
            snprintf(out, cap, "model.layers.%d.%s", layer, layer_names[i][1]);
            return 1;
        }
    return hf_moe_name(arch, layer, gguf + n, out, cap);
}

static pp_status open_gguf(struct pp_source *s)
{
    pp_status st = pp_gguf_open(s->path, &s->gguf);
    if (st != PP_OK)
        return st;
    if ((st = pp__gguf_read_config(s->gguf, s->path, &s->cfg)) != PP_OK)
        return st;
    const struct pp_tensor *rf = pp_gguf_tensor(s->gguf, "rope_freqs.weight");
    if (rf) {
        if (rf->dtype != PP_DTYPE_F32 || pp_tensor_elems(rf) != s->cfg.head_dim / 2)
            return pp_error(PP_ERR_FORMAT,
                            "%s: rope_freqs.weight: expected %d f32 values, got %lld "
                            "%s values",
                            s->path, s->cfg.head_dim / 2, (long long)pp_tensor_elems(rf),
                            pp_dtype_name(rf->dtype));
        s->rope_divisors = rf->data;
    }
    return PP_OK;
}

pp_status pp__source_open(const char *path, struct pp_source **out)
{
    struct pp_source *s = pp_calloc(PP_MEM_MISC, 1, sizeof(*s));
    if (!s)
        return PP_ERR_NOMEM;
    pp_status st;
    struct stat sb;
    if (strlen(path) >= sizeof(s->path)) {
        st = pp_error(PP_ERR_INVALID_ARG, "model path is too long");
    } else if (stat(path, &sb) != 0) {
        st = pp_error(PP_ERR_IO, "model %s: no such file or directory", path);
    } else if (S_ISDIR(sb.st_mode)) {
        snprintf(s->path, sizeof(s->path), "%s", path);
        s->format = PP_FORMAT_HF;
#ifdef PP_HAVE_JANSSON
        st = pp_hf_open(path, &s->hf);
        if (st == PP_OK)
            s->cfg = *pp_hf_config(s->hf);
#else
        st = pp_error(PP_ERR_UNSUPPORTED, "%s: HF checkpoints need JSON support, and this build "
                      "has none (built without jansson); use a GGUF file", path);
#endif
    } else {
        snprintf(s->path, sizeof(s->path), "%s", path);
        s->format = PP_FORMAT_GGUF;
        st = open_gguf(s);
    }
    if (st != PP_OK) {
        pp__source_free(s);
        return st;
    }
    *out = s;
    return PP_OK;
}

void pp__source_free(struct pp_source *s)
{
    if (!s)
        return;
    pp_gguf_free(s->gguf);
#ifdef PP_HAVE_JANSSON
    pp_hf_free(s->hf);
#endif
    pp_free(PP_MEM_MISC, s);
}

pp_status pp__source_tensor(struct pp_source *s, const char *gguf_name,
                            const struct pp_tensor **out)
{
    if (s->format == PP_FORMAT_GGUF) {
        *out = pp_gguf_tensor(s->gguf, gguf_name);
        return *out ? PP_OK : PP_ERR_NOT_FOUND;
    }
#ifdef PP_HAVE_JANSSON
    char name[256];
    if (!hf_name(s->cfg.arch, gguf_name, name, sizeof(name)))
        return PP_ERR_NOT_FOUND;
    return pp_hf_tensor(s->hf, name, out);
#else
    (void)hf_name;
    return PP_ERR_NOT_FOUND;
#endif
}

pp_status pp__source_for_each_tensor(struct pp_source *s, pp__tensor_visit_fn fn, void *ud)
{
    if (s->format == PP_FORMAT_GGUF) {
        for (int64_t i = 0; i < s->gguf->n_tensors; i++)
            fn(ud, s->gguf->tensors[i].name.ptr, s->gguf->tensors[i].name.len,
               &s->gguf->tensors[i].t);
        return PP_OK;
    }
#ifdef PP_HAVE_JANSSON
    return pp_hf_for_each_tensor(s->hf, fn, ud);
#else
    return pp_error(PP_ERR_UNSUPPORTED, "HF checkpoints need jansson");
#endif
}
