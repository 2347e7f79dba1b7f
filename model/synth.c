/* The synth spec: defaults, the named shapes, and validation (which also applies the arch defaults
 * the writers work from). Writing lives in synth_gguf.c and synth_hf.c. */
#include "model/synth.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "model/synth-impl.h"

#define MAX_DIM (1 << 16)
#define MAX_LAYERS 1024
#define MAX_HEADS 1024
#define MAX_HEAD_DIM 1024
#define MAX_FFN (1 << 20)
#define MAX_VOCAB (1 << 21)
#define MAX_CONTEXT (1 << 24)
#define MIN_VOCAB 300 /* specials + bytes + the corpus characters, with room to spare */
#define MAX_EXPERTS 1024

struct shape {
    const char *name;
    int32_t dim, n_layers, n_heads, n_kv_heads, ffn_dim, vocab_size, max_context;
    enum pp_dtype dtype;
    int rope_llama3;
    const char *arch;
    int32_t n_experts, n_experts_used;
};

static const struct shape shapes[] = {
    {"tinyllama", 2048, 22, 32, 4, 5632, 32000, 2048, PP_DTYPE_F16, 0, "llama", 0, 0},
    {"demo", 256, 4, 8, 2, 688, 1024, 1024, PP_DTYPE_F32, 0, "llama", 0, 0},
    {"tiny", 64, 2, 4, 2, 160, 300, 256, PP_DTYPE_F32, 0, "llama", 0, 0},
    {"llama3-8b", 4096, 32, 32, 8, 14336, 128256, 8192, PP_DTYPE_BF16, 1, "llama", 0, 0},
    {"tiny-moe", 64, 2, 4, 2, 64, 300, 256, PP_DTYPE_F32, 0, "mixtral", 4, 2},
};

#define N_SHAPES (sizeof(shapes) / sizeof(shapes[0]))

void pp_synth_spec_defaults(struct pp_synth_spec *s)
{
    memset(s, 0, sizeof(*s));
    strcpy(s->arch, "llama");
    s->dtype = PP_DTYPE_F32;
    s->seed = 1;
    s->qkv_bias = -1;
    s->shards = 1;
}

pp_status pp_synth_shape(const char *name, struct pp_synth_spec *out)
{
    pp_synth_spec_defaults(out);
    for (size_t i = 0; i < N_SHAPES; i++) {
        const struct shape *sh = &shapes[i];
        if (name && strcmp(name, sh->name) == 0) {
            out->dim = sh->dim;
            out->n_layers = sh->n_layers;
            out->n_heads = sh->n_heads;
            out->n_kv_heads = sh->n_kv_heads;
            out->ffn_dim = sh->ffn_dim;
            out->vocab_size = sh->vocab_size;
            out->max_context = sh->max_context;
            out->dtype = sh->dtype;
            out->rope_llama3 = sh->rope_llama3;
            snprintf(out->arch, sizeof(out->arch), "%s", sh->arch);
            out->n_experts = sh->n_experts;
            out->n_experts_used = sh->n_experts_used;
            return PP_OK;
        }
    }
    char known[128] = "";
    for (size_t i = 0; i < N_SHAPES; i++) {
        strcat(known, i ? ", " : "");
        strcat(known, shapes[i].name);
    }
    return pp_error(PP_ERR_INVALID_ARG, "synth: unknown shape \"%s\"; known shapes: %s",
                    name ? name : "(null)", known);
}

static pp_status bad(const char *field, const char *expected, int64_t got)
{
    return pp_error(PP_ERR_INVALID_ARG, "synth spec: %s: expected %s, got %lld", field, expected,
                    (long long)got);
}

static pp_status check_range(const char *field, int64_t v, int64_t lo, int64_t hi)
{
    if (v >= lo && v <= hi)
        return PP_OK;
    char expected[96];
    snprintf(expected, sizeof(expected), "a value in [%lld, %lld]", (long long)lo, (long long)hi);
    return bad(field, expected, v);
}

static pp_status parse_arch(const struct pp_synth_spec *s, enum pp__synth_arch *arch)
{
    static const char *const names[] = {"llama", "mistral", "qwen2", "mixtral", "qwen2moe"};
    if (memchr(s->arch, '\0', sizeof(s->arch)) == NULL)
        return pp_error(PP_ERR_INVALID_ARG,
                        "synth spec: arch: expected a NUL-terminated name, "
                        "got %d bytes without one",
                        (int)sizeof(s->arch));
    for (int i = 0; i < 5; i++) {
        if (strcmp(s->arch, names[i]) == 0) {
            *arch = (enum pp__synth_arch)i;
            return PP_OK;
        }
    }
    return pp_error(PP_ERR_INVALID_ARG,
                    "synth spec: arch: expected one of llama, mistral, qwen2, mixtral, "
                    "qwen2moe, got \"%s\"", s->arch);
}

/* The sizes, each on its own; relations between them come after. */
static pp_status check_sizes(const struct pp_synth_spec *s)
{
    pp_status st;
    if ((st = check_range("dim", s->dim, 1, MAX_DIM)) ||
        (st = check_range("n_layers", s->n_layers, 1, MAX_LAYERS)) ||
        (st = check_range("n_heads", s->n_heads, 1, MAX_HEADS)) ||
        (st = check_range("n_kv_heads", s->n_kv_heads, 1, s->n_heads)) ||
        (st = check_range("head_dim", s->head_dim, 0, MAX_HEAD_DIM)) ||
        (st = check_range("ffn_dim", s->ffn_dim, 1, MAX_FFN)) ||
        (st = check_range("vocab_size", s->vocab_size, MIN_VOCAB, MAX_VOCAB)) ||
        (st = check_range("max_context", s->max_context, 1, MAX_CONTEXT)) ||
        (st = check_range("sliding_window", s->sliding_window, 0, MAX_CONTEXT)) ||
        (st = check_range("qkv_bias", s->qkv_bias, -1, 1)) ||
        (st = check_range("dtype", (int64_t)s->dtype, 0, PP_DTYPE_COUNT - 1)) ||
        (st = check_range("tokenizer", (int64_t)s->tokenizer, PP_SYNTH_TOKENIZER_SPM,
                          PP_SYNTH_TOKENIZER_BPE)))
        return st;
    return PP_OK;
}

static pp_status check_heads(const struct pp_synth_spec *s)
{
    char expected[96];
    if (s->n_heads % s->n_kv_heads != 0) {
        snprintf(expected, sizeof(expected), "a divisor of n_heads %d", s->n_heads);
        return bad("n_kv_heads", expected, s->n_kv_heads);
    }
    if (s->head_dim == 0 && s->dim % s->n_heads != 0) {
        snprintf(expected, sizeof(expected), "a divisor of dim %d (or set head_dim)", s->dim);
        return bad("n_heads", expected, s->n_heads);
    }
    int32_t hd = s->head_dim ? s->head_dim : s->dim / s->n_heads;
    if (hd % 2 != 0)
        return bad(s->head_dim ? "head_dim" : "head_dim (dim / n_heads)",
                   "an even value (RoPE rotates pairs)", hd);
    if ((int64_t)s->n_heads * hd > MAX_DIM * 4)
        return bad("n_heads * head_dim", "at most 262144", (int64_t)s->n_heads * hd);
    return PP_OK;
}

/* Q8_0 quantizes rows in blocks of 32 along the input dimension: dim (q/k/v/gate/up, embedding,
 * lm head), ffn_dim (down) and n_heads * head_dim (o). */
static pp_status check_q8_0(const struct pp_synth_spec *s, int32_t hd)
{
    if (s->dtype != PP_DTYPE_Q8_0)
        return PP_OK;
    if (s->dim % PP_Q8_0_BLOCK)
        return bad("dim", "a multiple of 32 for q8_0", s->dim);
    if (s->ffn_dim % PP_Q8_0_BLOCK)
        return bad("ffn_dim", "a multiple of 32 for q8_0", s->ffn_dim);
    if ((int64_t)s->n_heads * hd % PP_Q8_0_BLOCK)
        return bad("n_heads * head_dim", "a multiple of 32 for q8_0 (rows of attn_output)",
                   (int64_t)s->n_heads * hd);
    return PP_OK;
}

/* The MoE fields: only for mixtral and qwen2moe, and resolved there (defaults filled in). */
static pp_status check_moe(struct pp__synth_model *m)
{
    struct pp_synth_spec *r = &m->s;
    char expected[96];
    pp_status st;
    if (!m->moe) {
        const struct {
            const char *name;
            int64_t v;
        } fields[] = {{"n_experts", r->n_experts},           {"n_experts_used", r->n_experts_used},
                      {"expert_ffn_dim", r->expert_ffn_dim}, {"shared_ffn_dim", r->shared_ffn_dim},
                      {"norm_topk_prob", r->norm_topk_prob}};
        snprintf(expected, sizeof(expected), "0 for arch %s (only mixtral and qwen2moe have "
                 "experts)", r->arch);
        for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++)
            if (fields[i].v != 0)
                return bad(fields[i].name, expected, fields[i].v);
        return PP_OK;
    }
    int mixtral = m->arch == PP__SYNTH_MIXTRAL;
    if ((st = check_range("n_experts", r->n_experts, 1, MAX_EXPERTS)) ||
        (st = check_range("n_experts_used", r->n_experts_used, 1, r->n_experts)) ||
        (st = check_range("expert_ffn_dim", r->expert_ffn_dim, 0, MAX_FFN)) ||
        (st = check_range("shared_ffn_dim", r->shared_ffn_dim, 0, mixtral ? 0 : MAX_FFN)) ||
        (st = check_range("norm_topk_prob", r->norm_topk_prob, 0, mixtral ? 0 : 1)))
        return st;
    if (mixtral && r->expert_ffn_dim != 0 && r->expert_ffn_dim != r->ffn_dim) {
        snprintf(expected, sizeof(expected), "0 or ffn_dim %d for mixtral (its experts are "
                 "intermediate_size wide)", r->ffn_dim);
        return bad("expert_ffn_dim", expected, r->expert_ffn_dim);
    }
    if (!r->expert_ffn_dim)
        r->expert_ffn_dim = r->ffn_dim;
    if (!mixtral && !r->shared_ffn_dim)
        r->shared_ffn_dim = r->ffn_dim;
    if (r->dtype == PP_DTYPE_Q8_0 && r->expert_ffn_dim % PP_Q8_0_BLOCK)
        return bad("expert_ffn_dim", "a multiple of 32 for q8_0", r->expert_ffn_dim);
    if (r->dtype == PP_DTYPE_Q8_0 && r->shared_ffn_dim % PP_Q8_0_BLOCK)
        return bad("shared_ffn_dim", "a multiple of 32 for q8_0", r->shared_ffn_dim);
    return PP_OK;
}

static pp_status check_floats(const struct pp__synth_model *m)
{
    const struct pp_synth_spec *r = &m->s;
    if (!isfinite(r->rope_theta) || r->rope_theta <= 1.0f)
        return pp_error(PP_ERR_INVALID_ARG,
                        "synth spec: rope_theta: expected a finite value > 1 "
                        "(or 0 for the default), got %g",
                        (double)r->rope_theta);
    if (!isfinite(r->norm_eps) || r->norm_eps <= 0.0f || r->norm_eps >= 1.0f)
        return pp_error(PP_ERR_INVALID_ARG,
                        "synth spec: norm_eps: expected a value in (0, 1) "
                        "(or 0 for the default), got %g",
                        (double)r->norm_eps);
    return PP_OK;
}

pp_status pp__synth_resolve(const struct pp_synth_spec *s, struct pp__synth_model *m)
{
    if (!s || !m)
        return pp_error(PP_ERR_INVALID_ARG, "synth spec: NULL argument");
    pp_status st;
    memset(m, 0, sizeof(*m));
    if ((st = parse_arch(s, &m->arch)) || (st = check_sizes(s)) || (st = check_heads(s)))
        return st;
    struct pp_synth_spec *r = &m->s;
    *r = *s;
    r->head_dim = s->head_dim ? s->head_dim : s->dim / s->n_heads;
    if ((st = check_q8_0(s, r->head_dim)))
        return st;
    m->moe = m->arch == PP__SYNTH_MIXTRAL || m->arch == PP__SYNTH_QWEN2MOE;
    m->gguf_llama = m->arch != PP__SYNTH_QWEN2 && m->arch != PP__SYNTH_QWEN2MOE;
    int qwen = !m->gguf_llama;
    if ((st = check_moe(m)))
        return st;
    if (r->qkv_bias < 0)
        r->qkv_bias = qwen;
    r->tied = s->tied != 0;
    r->rope_llama3 = s->rope_llama3 != 0;
    if (r->rope_theta == 0.0f)
        r->rope_theta = r->rope_llama3 ? 500000.0f : 10000.0f;
    if (r->norm_eps == 0.0f)
        r->norm_eps = qwen ? 1e-6f : 1e-5f;
    if ((st = check_floats(m)))
        return st;
    if (s->sliding_window != 0 && m->arch != PP__SYNTH_MISTRAL)
        return pp_error(PP_ERR_INVALID_ARG,
                        "synth spec: sliding_window: expected 0 for arch %s "
                        "(only mistral has one), got %d",
                        s->arch, s->sliding_window);
    int64_t n_tensors = pp__synth_tensor_count(m);
    if ((st = check_range("shards", s->shards, 1, n_tensors < 99999 ? n_tensors : 99999)))
        return st;
    return PP_OK;
}

pp_status pp_synth_validate(const struct pp_synth_spec *s)
{
    struct pp__synth_model m;
    return pp__synth_resolve(s, &m);
}
