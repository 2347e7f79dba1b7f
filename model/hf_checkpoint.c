/* HF checkpoint directories: config.json → pp_model_config, the shard map, lazy shard mapping. */
#include "model/hf_checkpoint.h"

#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "common/alloc.h"
#include "model/safetensors.h"

struct shard {
    char *file; /* name inside the directory */
    struct pp_safetensors *st;
};

struct pp_hf_checkpoint {
    char dir[PATH_MAX];
    struct pp_model_config cfg;
    json_t *weight_map; /* name -> file; NULL for a single model.safetensors */
    int n_shards;
    struct shard *shards;
};

static pp_status load_json(const char *path, json_t **out)
{
    json_error_t e;
    *out = json_load_file(path, JSON_REJECT_DUPLICATES, &e);
    if (!*out) {
        struct stat st;
        if (stat(path, &st) != 0)
            return pp_error(PP_ERR_IO, "%s: missing", path);
        return pp_error(PP_ERR_FORMAT, "%s:%d: invalid JSON: %s", path, e.line, e.text);
    }
    if (!json_is_object(*out)) {
        json_decref(*out);
        *out = NULL;
        return pp_error(PP_ERR_FORMAT, "%s: expected a JSON object at the top level", path);
    }
    return PP_OK;
}

/* Reads an integer key; `required` decides whether absence is an error. */
static pp_status get_int(json_t *o, const char *path, const char *key, int required, int32_t *out)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        if (required)
            return pp_error(PP_ERR_FORMAT, "%s: missing required key \"%s\"", path, key);
        return PP_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < INT32_MIN ||
        json_integer_value(v) > INT32_MAX)
        return pp_error(PP_ERR_FORMAT, "%s: \"%s\" must be a 32-bit integer", path, key);
    *out = (int32_t)json_integer_value(v);
    return PP_OK;
}

static pp_status get_num(json_t *o, const char *path, const char *key, float *out)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v))
        return PP_OK;
    if (!json_is_number(v))
        return pp_error(PP_ERR_FORMAT, "%s: \"%s\" must be a number", path, key);
    *out = (float)json_number_value(v);
    return PP_OK;
}

/* eos_token_id: an integer or a list of them (Llama 3.1 lists several). */
static pp_status get_eos(json_t *o, const char *path, struct pp_model_config *c)
{
    json_t *v = json_object_get(o, "eos_token_id");
    if (!v || json_is_null(v))
        return PP_OK;
    if (json_is_integer(v)) {
        pp_model_config_add_eos(c, json_integer_value(v));
        return PP_OK;
    }
    size_t i;
    json_t *e;
    if (json_is_array(v)) {
        json_array_foreach(v, i, e)
        {
            if (!json_is_integer(e))
                return pp_error(PP_ERR_FORMAT,
                                "%s: \"eos_token_id\" must be an integer or a list "
                                "of integers",
                                path);
            pp_model_config_add_eos(c, json_integer_value(e));
        }
        return PP_OK;
    }
    return pp_error(PP_ERR_FORMAT, "%s: \"eos_token_id\" must be an integer or a list of integers",
                    path);
}

static pp_status parse_arch(json_t *root, const char *path, enum pp_arch *arch)
{
    json_t *mt = json_object_get(root, "model_type");
    const char *name = json_is_string(mt) ? json_string_value(mt) : NULL;
    if (!name) {
        json_t *archs = json_object_get(root, "architectures");
        if (json_is_array(archs) && json_is_string(json_array_get(archs, 0)))
            name = json_string_value(json_array_get(archs, 0));
    }
    if (!name)
        return pp_error(PP_ERR_FORMAT, "%s: no \"model_type\" or \"architectures\"", path);
    if (strcmp(name, "llama") == 0 || strcmp(name, "LlamaForCausalLM") == 0)
        *arch = PP_ARCH_LLAMA;
    else if (strcmp(name, "mistral") == 0 || strcmp(name, "MistralForCausalLM") == 0)
        *arch = PP_ARCH_MISTRAL;
    else if (strcmp(name, "qwen2") == 0 || strcmp(name, "Qwen2ForCausalLM") == 0)
        *arch = PP_ARCH_QWEN2;
    else if (strcmp(name, "mixtral") == 0 || strcmp(name, "MixtralForCausalLM") == 0)
        *arch = PP_ARCH_MIXTRAL;
    else if (strcmp(name, "qwen2_moe") == 0 || strcmp(name, "Qwen2MoeForCausalLM") == 0)
        *arch = PP_ARCH_QWEN2MOE;
    else
        return pp_error(PP_ERR_UNSUPPORTED,
                        "%s: unknown architecture \"%s\" (supported: llama, mistral, qwen2, "
                        "mixtral, qwen2_moe)", path, name);
    return PP_OK;
}

static pp_status parse_rope_scaling(json_t *root, const char *path, struct pp_rope_scaling *r)
{
    json_t *rs = json_object_get(root, "rope_scaling");
    if (!rs || json_is_null(rs))
        return PP_OK;
    if (!json_is_object(rs))
        return pp_error(PP_ERR_FORMAT, "%s: \"rope_scaling\" must be an object or null", path);
    json_t *t = json_object_get(rs, "rope_type");
    if (!t)
        t = json_object_get(rs, "type");
    const char *type = json_is_string(t) ? json_string_value(t) : "";
    if (strcmp(type, "default") == 0)
        return PP_OK;
    if (strcmp(type, "llama3") != 0)
        return pp_error(PP_ERR_UNSUPPORTED,
                        "%s: rope_scaling type \"%s\" is not supported (supported: llama3)", path,
                        type);
    r->llama3 = 1;
    r->factor = 8.0f;
    r->low_freq_factor = 1.0f;
    r->high_freq_factor = 4.0f;
    r->original_context = 8192;
    pp_status st;
    if ((st = get_num(rs, path, "factor", &r->factor)) != PP_OK ||
        (st = get_num(rs, path, "low_freq_factor", &r->low_freq_factor)) != PP_OK ||
        (st = get_num(rs, path, "high_freq_factor", &r->high_freq_factor)) != PP_OK ||
        (st = get_int(rs, path, "original_max_position_embeddings", 0, &r->original_context)) !=
            PP_OK)
        return st;
    return PP_OK;
}

/* Mixtral: num_local_experts, num_experts_per_tok, experts of intermediate_size. Qwen2-MoE:
 * num_experts, num_experts_per_tok, moe_intermediate_size, shared_expert_intermediate_size,
 * norm_topk_prob (HF default false); only models whose every layer is sparse are supported. */
static pp_status parse_moe(json_t *root, const char *path, struct pp_model_config *c)
{
    pp_status st;
    if (c->arch == PP_ARCH_MIXTRAL) {
        c->moe_gating = PP_MOE_TOPK_SOFTMAX;
        c->expert_ffn_dim = c->ffn_dim;
        if ((st = get_int(root, path, "num_local_experts", 1, &c->n_experts)) != PP_OK ||
            (st = get_int(root, path, "num_experts_per_tok", 1, &c->n_experts_used)) != PP_OK)
            return st;
        return PP_OK;
    }
    if (c->arch != PP_ARCH_QWEN2MOE)
        return PP_OK;
    c->moe_gating = PP_MOE_SOFTMAX_TOPK;
    int32_t sparse_step = 1;
    if ((st = get_int(root, path, "num_experts", 1, &c->n_experts)) != PP_OK ||
        (st = get_int(root, path, "num_experts_per_tok", 1, &c->n_experts_used)) != PP_OK ||
        (st = get_int(root, path, "moe_intermediate_size", 1, &c->expert_ffn_dim)) != PP_OK ||
        (st = get_int(root, path, "shared_expert_intermediate_size", 1, &c->shared_ffn_dim)) !=
            PP_OK ||
        (st = get_int(root, path, "decoder_sparse_step", 0, &sparse_step)) != PP_OK)
        return st;
    if (sparse_step != 1)
        return pp_error(PP_ERR_UNSUPPORTED, "%s: \"decoder_sparse_step\" is %d; only 1 (every "
                        "layer sparse) is supported", path, sparse_step);
    json_t *dense = json_object_get(root, "mlp_only_layers");
    if (dense && !json_is_null(dense) && !(json_is_array(dense) && json_array_size(dense) == 0))
        return pp_error(PP_ERR_UNSUPPORTED, "%s: \"mlp_only_layers\" must be empty (dense layers "
                        "in a qwen2_moe model are not supported), got %s", path,
                        json_is_array(dense) ? "a non-empty list" : "a non-list");
    json_t *norm = json_object_get(root, "norm_topk_prob");
    if (norm && !json_is_null(norm) && !json_is_boolean(norm))
        return pp_error(PP_ERR_FORMAT, "%s: \"norm_topk_prob\" must be true or false", path);
    c->norm_topk_prob = json_is_true(norm);
    return PP_OK;
}

static pp_status parse_config(struct pp_hf_checkpoint *h)
{
    char path[PATH_MAX + 16];
    snprintf(path, sizeof(path), "%s/config.json", h->dir);
    json_t *root;
    pp_status st = load_json(path, &root);
    if (st != PP_OK)
        return st;
    struct pp_model_config *c = &h->cfg;
    memset(c, 0, sizeof(*c));
    c->format = PP_FORMAT_HF;
    c->rope_layout = PP_ROPE_NEOX; /* HF stores q/k for rotate-half in every architecture */
    c->norm_eps = 1e-6f;
    c->rope_theta = 10000.0f;
    c->max_context = 2048;
    c->bos_id = -1;
    c->eos_id = -1;
    c->n_kv_heads = 0;
    c->head_dim = 0;
    if ((st = parse_arch(root, path, &c->arch)) != PP_OK ||
        (st = get_int(root, path, "hidden_size", 1, &c->dim)) != PP_OK ||
        (st = get_int(root, path, "num_hidden_layers", 1, &c->n_layers)) != PP_OK ||
        (st = get_int(root, path, "num_attention_heads", 1, &c->n_heads)) != PP_OK ||
        (st = get_int(root, path, "num_key_value_heads", 0, &c->n_kv_heads)) != PP_OK ||
        (st = get_int(root, path, "head_dim", 0, &c->head_dim)) != PP_OK ||
        (st = get_int(root, path, "intermediate_size", 1, &c->ffn_dim)) != PP_OK ||
        (st = get_int(root, path, "vocab_size", 1, &c->vocab_size)) != PP_OK ||
        (st = get_int(root, path, "max_position_embeddings", 0, &c->max_context)) != PP_OK ||
        (st = get_int(root, path, "bos_token_id", 0, &c->bos_id)) != PP_OK ||
        (st = get_eos(root, path, c)) != PP_OK ||
        (st = get_num(root, path, "rms_norm_eps", &c->norm_eps)) != PP_OK ||
        (st = get_num(root, path, "rope_theta", &c->rope_theta)) != PP_OK ||
        (st = parse_rope_scaling(root, path, &c->rope_scaling)) != PP_OK ||
        (st = parse_moe(root, path, c)) != PP_OK)
        goto done;
    if ((c->arch == PP_ARCH_MISTRAL || c->arch == PP_ARCH_MIXTRAL) &&
        (st = get_int(root, path, "sliding_window", 0, &c->sliding_window)) != PP_OK)
        goto done;
    json_t *tie = json_object_get(root, "tie_word_embeddings");
    c->tied_embeddings = json_is_true(tie);
    if (c->n_kv_heads == 0)
        c->n_kv_heads = c->n_heads;
    if (c->head_dim == 0 && c->n_heads > 0)
        c->head_dim = c->dim / c->n_heads;
    st = pp_model_config_validate(c, path);
    if (st == PP_OK) {
        /* generation_config.json may list more end tokens (Llama 3: end of turn, end of message) */
        char gpath[PATH_MAX + 32];
        snprintf(gpath, sizeof(gpath), "%s/generation_config.json", h->dir);
        json_t *gen = json_load_file(gpath, 0, NULL);
        if (gen && json_is_object(gen))
            st = get_eos(gen, gpath, c);
        json_decref(gen);
    }
done:
    json_decref(root);
    return st;
}

static pp_status load_index(struct pp_hf_checkpoint *h)
{
    char path[PATH_MAX + 40];
    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", h->dir);
    struct stat sb;
    if (stat(path, &sb) != 0) {
        snprintf(path, sizeof(path), "%s/model.safetensors", h->dir);
        if (stat(path, &sb) != 0)
            return pp_error(PP_ERR_IO,
                            "%s: neither model.safetensors nor "
                            "model.safetensors.index.json is present",
                            h->dir);
        h->shards = pp_calloc(PP_MEM_MISC, 1, sizeof(*h->shards));
        if (!h->shards || !(h->shards[0].file = pp_strdup(PP_MEM_MISC, "model.safetensors")))
            return PP_ERR_NOMEM;
        h->n_shards = 1;
        return PP_OK;
    }
    json_t *root;
    pp_status st = load_json(path, &root);
    if (st != PP_OK)
        return st;
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(wm)) {
        json_decref(root);
        return pp_error(PP_ERR_FORMAT, "%s: missing \"weight_map\" object", path);
    }
    h->weight_map = json_incref(wm);
    json_decref(root);
    h->shards = pp_calloc(PP_MEM_MISC, json_object_size(wm) + 1, sizeof(*h->shards));
    if (!h->shards)
        return PP_ERR_NOMEM;
    const char *key;
    json_t *v;
    json_object_foreach(wm, key, v)
    {
        if (!json_is_string(v))
            return pp_error(PP_ERR_FORMAT, "%s: weight_map[\"%s\"] is not a file name", path, key);
        const char *f = json_string_value(v);
        if (strchr(f, '/') || strcmp(f, "..") == 0)
            return pp_error(PP_ERR_FORMAT, "%s: shard name \"%s\" must be a plain file name", path,
                            f);
        int seen = 0;
        for (int i = 0; i < h->n_shards && !seen; i++)
            seen = strcmp(h->shards[i].file, f) == 0;
        if (!seen && !(h->shards[h->n_shards++].file = pp_strdup(PP_MEM_MISC, f)))
            return PP_ERR_NOMEM;
    }
    return PP_OK;
}

pp_status pp_hf_open(const char *dir, struct pp_hf_checkpoint **out)
{
    struct pp_hf_checkpoint *h = pp_calloc(PP_MEM_MISC, 1, sizeof(*h));
    if (!h)
        return PP_ERR_NOMEM;
    if (strlen(dir) >= sizeof(h->dir)) {
        pp_hf_free(h);
        return pp_error(PP_ERR_INVALID_ARG, "model path is too long");
    }
    snprintf(h->dir, sizeof(h->dir), "%s", dir);
    pp_status st = parse_config(h);
    if (st == PP_OK)
        st = load_index(h);
    if (st != PP_OK) {
        pp_hf_free(h);
        return st;
    }
    *out = h;
    return PP_OK;
}

void pp_hf_free(struct pp_hf_checkpoint *h)
{
    if (!h)
        return;
    for (int i = 0; i < h->n_shards; i++) {
        pp_free(PP_MEM_MISC, h->shards[i].file);
        pp_safetensors_free(h->shards[i].st);
    }
    pp_free(PP_MEM_MISC, h->shards);
    json_decref(h->weight_map);
    pp_free(PP_MEM_MISC, h);
}

const struct pp_model_config *pp_hf_config(const struct pp_hf_checkpoint *h)
{
    return &h->cfg;
}

const char *pp_hf_dir(const struct pp_hf_checkpoint *h)
{
    return h->dir;
}

pp_status pp_hf_tensor(struct pp_hf_checkpoint *h, const char *name, const struct pp_tensor **out)
{
    const char *file = "model.safetensors";
    if (h->weight_map) {
        json_t *f = json_object_get(h->weight_map, name);
        if (!f)
            return PP_ERR_NOT_FOUND;
        file = json_string_value(f);
    }
    struct shard *sh = NULL;
    for (int i = 0; i < h->n_shards && !sh; i++)
        if (strcmp(h->shards[i].file, file) == 0)
            sh = &h->shards[i];
    if (!sh)
        return pp_error(PP_ERR_INTERNAL, "shard %s not registered", file);
    if (!sh->st) {
        char path[PATH_MAX * 2];
        snprintf(path, sizeof(path), "%s/%s", h->dir, sh->file);
        pp_status st = pp_safetensors_open(path, &sh->st);
        if (st != PP_OK)
            return st;
    }
    const struct pp_safetensors_entry *e = pp_safetensors_find(sh->st, name);
    if (!e) {
        if (h->weight_map)
            return pp_error(PP_ERR_FORMAT,
                            "%s/%s: the index lists tensor %s here but the file "
                            "does not hold it",
                            h->dir, sh->file, name);
        return PP_ERR_NOT_FOUND;
    }
    if (!e->supported)
        return pp_error(PP_ERR_UNSUPPORTED,
                        "%s/%s: tensor %s has dtype %s (supported: F32, F16, "
                        "BF16)",
                        h->dir, sh->file, name, e->dtype_name);
    *out = &e->t;
    return PP_OK;
}

pp_status pp_hf_for_each_tensor(struct pp_hf_checkpoint *h,
                                void (*fn)(void *ud, const char *name, size_t name_len,
                                           const struct pp_tensor *t),
                                void *ud)
{
    for (int i = 0; i < h->n_shards; i++) {
        struct shard *sh = &h->shards[i];
        if (!sh->st) {
            char path[PATH_MAX * 2];
            snprintf(path, sizeof(path), "%s/%s", h->dir, sh->file);
            pp_status st = pp_safetensors_open(path, &sh->st);
            if (st != PP_OK)
                return st;
        }
        for (int64_t k = 0; k < sh->st->n; k++) {
            const struct pp_safetensors_entry *e = &sh->st->entries[k];
            struct pp_tensor t = e->t;
            if (!e->supported) {
                t.dtype = PP_DTYPE_COUNT;
                t.data = NULL;
            }
            fn(ud, e->name, strlen(e->name), &t);
        }
    }
    return PP_OK;
}
