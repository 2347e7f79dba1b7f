/* Unit test of the synthetic model writer (model/synth*.c): writes tiny models in both formats into
 * a temporary folder and reads the bytes back with its own small parsers: headers, tensor counts,
 * the same values in both formats once the GGUF q/k permutation is undone, the tokenizer, sharding,
 * rope_freqs, determinism, validation messages and clean failure on every allocation. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h> /* after the four headers it relies on */

#include <dirent.h>
#include <ftw.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "kernels/dtype.h"
#include "model/synth-impl.h"
#include "model/synth.h"

/* ---- files ---- */

static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = '\0';
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

struct fixture {
    char dir[64];
    char gguf[128];
    char hf[128];
};

static int setup(void **state)
{
    struct fixture *fx = calloc(1, sizeof(*fx));
    strcpy(fx->dir, "/tmp/test_synth_XXXXXX");
    if (!mkdtemp(fx->dir))
        return -1;
    snprintf(fx->gguf, sizeof(fx->gguf), "%s/m.gguf", fx->dir);
    snprintf(fx->hf, sizeof(fx->hf), "%s/hf", fx->dir);
    *state = fx;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *fx = *state;
    nftw(fx->dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    free(fx);
    return 0;
}

/* Entries of a folder whose name contains `part` ("" for all); -1 when it does not exist. */
static int count_named(const char *dir, const char *part)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.' && strstr(e->d_name, part) != NULL;
    closedir(d);
    return n;
}

static int count_entries(const char *dir)
{
    return count_named(dir, "");
}

/* ---- a minimal GGUF reader ---- */

struct gg_tensor {
    char name[96];
    uint32_t n_dims, type;
    uint64_t dims[4], offset;
};

struct gg_file {
    char *buf;
    size_t len, pos;
    uint32_t version;
    uint64_t n_tensors, n_kv;
    struct gg_tensor tensors[64];
    uint64_t data_start;
    char arch[32];
    uint64_t n_tokens;
    size_t tokens_pos; /* where the token strings start */
    uint64_t alignment;
};

static uint64_t rd(struct gg_file *g, size_t n)
{
    assert_true(g->pos + n <= g->len);
    uint64_t v = 0;
    memcpy(&v, g->buf + g->pos, n);
    g->pos += n;
    return v;
}

static void rd_str(struct gg_file *g, char *out, size_t cap)
{
    uint64_t n = rd(g, 8);
    assert_true(g->pos + n <= g->len);
    if (out) {
        size_t k = n < cap - 1 ? (size_t)n : cap - 1;
        memcpy(out, g->buf + g->pos, k);
        out[k] = '\0';
    }
    g->pos += (size_t)n;
}

static void skip_value(struct gg_file *g, uint32_t type)
{
    static const size_t sizes[13] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    assert_true(type <= 12);
    if (type == 8) {
        rd_str(g, NULL, 0);
    } else if (type == 9) {
        uint32_t et = (uint32_t)rd(g, 4);
        uint64_t n = rd(g, 8);
        for (uint64_t i = 0; i < n; i++)
            skip_value(g, et);
    } else {
        g->pos += sizes[type];
    }
}

static void gg_open(struct gg_file *g, const char *path)
{
    memset(g, 0, sizeof(*g));
    g->buf = read_all(path, &g->len);
    assert_non_null(g->buf);
    assert_memory_equal(g->buf, "GGUF", 4);
    g->pos = 4;
    g->version = (uint32_t)rd(g, 4);
    g->n_tensors = rd(g, 8);
    g->n_kv = rd(g, 8);
    g->alignment = 32;
    for (uint64_t i = 0; i < g->n_kv; i++) {
        char key[128];
        rd_str(g, key, sizeof(key));
        uint32_t type = (uint32_t)rd(g, 4);
        if (strcmp(key, "general.architecture") == 0) {
            rd_str(g, g->arch, sizeof(g->arch));
        } else if (strcmp(key, "general.alignment") == 0) {
            assert_int_equal(type, 4);
            g->alignment = rd(g, 4);
        } else if (strcmp(key, "tokenizer.ggml.tokens") == 0) {
            assert_int_equal(type, 9);
            assert_int_equal(rd(g, 4), 8);
            g->n_tokens = rd(g, 8);
            g->tokens_pos = g->pos;
            for (uint64_t k = 0; k < g->n_tokens; k++)
                rd_str(g, NULL, 0);
        } else {
            skip_value(g, type);
        }
    }
    assert_true(g->n_tensors <= 64);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        struct gg_tensor *t = &g->tensors[i];
        rd_str(g, t->name, sizeof(t->name));
        t->n_dims = (uint32_t)rd(g, 4);
        assert_true(t->n_dims >= 1 && t->n_dims <= 4);
        for (uint32_t d = 0; d < t->n_dims; d++)
            t->dims[d] = rd(g, 8);
        t->type = (uint32_t)rd(g, 4);
        t->offset = rd(g, 8);
        assert_int_equal(t->offset % g->alignment, 0);
    }
    g->data_start = (g->pos + g->alignment - 1) / g->alignment * g->alignment;
}

static const struct gg_tensor *gg_find(const struct gg_file *g, const char *name)
{
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (strcmp(g->tensors[i].name, name) == 0)
            return &g->tensors[i];
    return NULL;
}

static const uint8_t *gg_data(const struct gg_file *g, const struct gg_tensor *t)
{
    return (const uint8_t *)g->buf + g->data_start + t->offset;
}

/* ---- a minimal safetensors reader: one tensor of one file ---- */

struct st_tensor {
    char dtype[8];
    int64_t shape[2];
    int n_dims;
    const uint8_t *data;
    uint64_t nbytes;
};

static int st_find(const char *buf, size_t len, const char *name, struct st_tensor *t)
{
    uint64_t hlen;
    memcpy(&hlen, buf, 8);
    assert_true(8 + hlen <= len);
    assert_int_equal(hlen % 8, 0);
    char key[128];
    snprintf(key, sizeof(key), "\"%s\":{", name);
    const char *p = strstr(buf + 8, key);
    if (!p || p > buf + 8 + hlen)
        return 0;
    memset(t, 0, sizeof(*t));
    assert_int_equal(sscanf(strstr(p, "\"dtype\":"), "\"dtype\":\"%7[A-Z0-9]\"", t->dtype), 1);
    const char *s = strstr(p, "\"shape\":[") + 9;
    t->n_dims = sscanf(s, "%" SCNd64 ",%" SCNd64, &t->shape[0], &t->shape[1]);
    uint64_t b, e;
    assert_int_equal(sscanf(strstr(p, "\"data_offsets\":["),
                            "\"data_offsets\":[%" SCNu64 ",%" SCNu64 "]", &b, &e),
                     2);
    t->data = (const uint8_t *)buf + 8 + hlen + b;
    t->nbytes = e - b;
    assert_true(8 + hlen + e <= len);
    return 1;
}

/* ---- helpers ---- */

static void tiny(struct pp_synth_spec *s)
{
    assert_int_equal(pp_synth_shape("tiny", s), PP_OK);
}

static void write_both(const struct fixture *fx, const struct pp_synth_spec *s)
{
    pp_status st = pp_synth_write_gguf(s, fx->gguf);
    assert_int_equal(st, PP_OK);
    st = pp_synth_write_hf(s, fx->hf);
    if (st)
        fail_msg("write_hf: %s", pp_error_detail());
}

static char *read_hf(const struct fixture *fx, const char *file, size_t *len)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/%s", fx->hf, file);
    return read_all(path, len);
}

/* Row r of GGUF q/k holds HF row h*d + (j%2)*(d/2) + j/2 (j = r % d). */
static int64_t hf_row(int64_t r, int64_t d)
{
    int64_t j = r % d;
    return r / d * d + (j % 2) * (d / 2) + j / 2;
}

/* f32 of element i of a GGUF tensor row stored as type. */
static float gg_value(const uint8_t *row, uint32_t type, int64_t i)
{
    float out[32];
    uint16_t h;
    switch (type) {
    case 0:
        memcpy(out, row + 4 * i, 4);
        return out[0];
    case 1:
        memcpy(&h, row + 2 * i, 2);
        return pp_f16_to_f32(h);
    case 30:
        memcpy(&h, row + 2 * i, 2);
        return pp_bf16_to_f32(h);
    default:
        pp_row_to_f32(out, row + i / 32 * 34, PP_DTYPE_Q8_0, 32);
        return out[i % 32];
    }
}

static float st_value(const struct st_tensor *t, int64_t i)
{
    uint16_t h;
    float f;
    if (strcmp(t->dtype, "F32") == 0) {
        memcpy(&f, t->data + 4 * i, 4);
        return f;
    }
    memcpy(&h, t->data + 2 * i, 2);
    return strcmp(t->dtype, "F16") == 0 ? pp_f16_to_f32(h) : pp_bf16_to_f32(h);
}

static uint64_t gg_row_bytes(uint32_t type, uint64_t cols)
{
    return type == 0 ? 4 * cols : type == 8 ? cols / 32 * 34 : 2 * cols;
}

/* Every value of a tensor equal in both formats (permuted in `heads` heads when heads > 0). */
static void check_same(const struct gg_file *g, const char *st_buf, size_t st_len,
                       const char *gname, const char *hname, int64_t heads)
{
    const struct gg_tensor *gt = gg_find(g, gname);
    struct st_tensor ht;
    assert_non_null(gt);
    assert_true(st_find(st_buf, st_len, hname, &ht));
    int64_t rows = ht.n_dims == 2 ? ht.shape[0] : 1,
            cols = ht.n_dims == 2 ? ht.shape[1] : ht.shape[0];
    assert_int_equal(gt->n_dims, (uint32_t)ht.n_dims);
    assert_int_equal(gt->dims[0], (uint64_t)cols); /* GGUF dims are the numpy shape reversed */
    if (ht.n_dims == 2)
        assert_int_equal(gt->dims[1], (uint64_t)rows);
    for (int64_t r = 0; r < rows; r++) {
        int64_t hr = heads > 0 && ht.n_dims == 2 ? hf_row(r, rows / heads) : r;
        const uint8_t *grow = gg_data(g, gt) + (uint64_t)r * gg_row_bytes(gt->type, (uint64_t)cols);
        for (int64_t c = 0; c < cols; c++) {
            int64_t hc = heads > 0 && ht.n_dims == 1 ? hf_row(c, cols / heads) : c;
            float a = gg_value(grow, gt->type, c), b = st_value(&ht, hr * cols + hc);
            if (memcmp(&a, &b, 4) != 0)
                fail_msg("%s[%lld][%lld]: gguf %.9g, hf %.9g", gname, (long long)r, (long long)c,
                         (double)a, (double)b);
        }
    }
}

/* ---- tests ---- */

static void test_shapes(void **state)
{
    (void)state;
    struct pp_synth_spec s;
    tiny(&s);
    assert_int_equal(s.dim, 64);
    assert_int_equal(s.n_layers, 2);
    assert_int_equal(s.n_kv_heads, 2);
    assert_int_equal(s.vocab_size, 300);
    assert_int_equal(s.dtype, PP_DTYPE_F32);
    assert_int_equal(pp_synth_validate(&s), PP_OK);
    assert_int_equal(pp_synth_shape("tinyllama", &s), PP_OK);
    assert_int_equal(s.dtype, PP_DTYPE_F16);
    assert_int_equal(s.ffn_dim, 5632);
    assert_int_equal(pp_synth_validate(&s), PP_OK);
    assert_int_equal(pp_synth_shape("llama3-8b", &s), PP_OK);
    assert_int_equal(s.rope_llama3, 1);
    assert_int_equal(s.vocab_size, 128256);
    assert_int_equal(pp_synth_validate(&s), PP_OK);
    assert_int_equal(pp_synth_shape("demo", &s), PP_OK);
    assert_int_equal(pp_synth_validate(&s), PP_OK);
    assert_int_equal(pp_synth_shape("gpt5", &s), PP_ERR_INVALID_ARG);
    assert_non_null(strstr(pp_error_detail(), "gpt5"));
    assert_non_null(strstr(pp_error_detail(), "tinyllama"));
    assert_non_null(strstr(pp_error_detail(), "llama3-8b"));
}

struct bad_case {
    const char *field; /* expected in the message */
    void (*mutate)(struct pp_synth_spec *s);
};

static void m_heads(struct pp_synth_spec *s)
{
    s->n_heads = 3;
    s->n_kv_heads = 1;
}
static void m_kv(struct pp_synth_spec *s)
{
    s->n_kv_heads = 3;
}
static void m_odd_hd(struct pp_synth_spec *s)
{
    s->head_dim = 15;
}
static void m_q8_dim(struct pp_synth_spec *s)
{
    s->dtype = PP_DTYPE_Q8_0;
    s->dim = 48;
}
static void m_q8_ffn(struct pp_synth_spec *s)
{
    s->dtype = PP_DTYPE_Q8_0;
    s->ffn_dim = 100;
}
static void m_q8_o(struct pp_synth_spec *s)
{
    s->dtype = PP_DTYPE_Q8_0;
    s->head_dim = 12;
}
static void m_vocab(struct pp_synth_spec *s)
{
    s->vocab_size = 299;
}
static void m_arch(struct pp_synth_spec *s)
{
    strcpy(s->arch, "gpt2");
}
static void m_sw(struct pp_synth_spec *s)
{
    s->sliding_window = 128;
}
static void m_shards0(struct pp_synth_spec *s)
{
    s->shards = 0;
}
static void m_shards_many(struct pp_synth_spec *s)
{
    s->shards = 22;
}
static void m_dim0(struct pp_synth_spec *s)
{
    s->dim = 0;
}
static void m_ctx(struct pp_synth_spec *s)
{
    s->max_context = -1;
}
static void m_eps(struct pp_synth_spec *s)
{
    s->norm_eps = -1.0f;
}
static void m_dtype(struct pp_synth_spec *s)
{
    s->dtype = (enum pp_dtype)9;
}

static void moe(struct pp_synth_spec *s, const char *arch)
{
    strcpy(s->arch, arch);
    s->n_experts = 4;
    s->n_experts_used = 2;
}
static void m_moe_k(struct pp_synth_spec *s)
{
    moe(s, "mixtral");
    s->n_experts_used = 5;
}
static void m_moe_k0(struct pp_synth_spec *s)
{
    moe(s, "qwen2moe");
    s->n_experts_used = 0;
}
static void m_moe_n0(struct pp_synth_spec *s)
{
    moe(s, "qwen2moe");
    s->n_experts = 0;
}
static void m_moe_dense(struct pp_synth_spec *s)
{
    s->n_experts = 4;
}
static void m_moe_mixtral_shared(struct pp_synth_spec *s)
{
    moe(s, "mixtral");
    s->shared_ffn_dim = 64;
}
static void m_moe_mixtral_ffn(struct pp_synth_spec *s)
{
    moe(s, "mixtral");
    s->expert_ffn_dim = 32;
}
static void m_moe_mixtral_norm(struct pp_synth_spec *s)
{
    moe(s, "mixtral");
    s->norm_topk_prob = 1;
}
static void m_moe_q8(struct pp_synth_spec *s)
{
    moe(s, "qwen2moe");
    s->dtype = PP_DTYPE_Q8_0;
    s->ffn_dim = 64;
    s->expert_ffn_dim = 48;
}
static void m_moe_q8_shared(struct pp_synth_spec *s)
{
    moe(s, "qwen2moe");
    s->dtype = PP_DTYPE_Q8_0;
    s->ffn_dim = 64;
    s->shared_ffn_dim = 40;
}

static void test_validate_errors(void **state)
{
    (void)state;
    static const struct bad_case cases[] = {
        {"n_heads", m_heads},    {"n_kv_heads", m_kv},      {"head_dim", m_odd_hd},
        {"dim", m_q8_dim},       {"ffn_dim", m_q8_ffn},     {"n_heads * head_dim", m_q8_o},
        {"vocab_size", m_vocab}, {"arch", m_arch},          {"sliding_window", m_sw},
        {"shards", m_shards0},   {"shards", m_shards_many}, {"dim", m_dim0},
        {"max_context", m_ctx},  {"norm_eps", m_eps},       {"dtype", m_dtype},
        {"n_experts_used", m_moe_k}, {"n_experts_used", m_moe_k0}, {"n_experts", m_moe_n0},
        {"n_experts", m_moe_dense}, {"shared_ffn_dim", m_moe_mixtral_shared},
        {"expert_ffn_dim", m_moe_mixtral_ffn}, {"norm_topk_prob", m_moe_mixtral_norm},
        {"expert_ffn_dim", m_moe_q8}, {"shared_ffn_dim", m_moe_q8_shared},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct pp_synth_spec s;
        tiny(&s);
        cases[i].mutate(&s);
        assert_int_equal(pp_synth_validate(&s), PP_ERR_INVALID_ARG);
        const char *msg = pp_error_detail();
        if (!strstr(msg, cases[i].field) || !strstr(msg, "expected") || !strstr(msg, "got"))
            fail_msg("case %zu: message \"%s\" should name %s, the expectation and the value", i,
                     msg, cases[i].field);
    }
    /* mistral accepts a sliding window; 21 tensors allow 21 shards */
    struct pp_synth_spec s;
    tiny(&s);
    strcpy(s.arch, "mistral");
    s.sliding_window = 128;
    s.shards = 21;
    assert_int_equal(pp_synth_validate(&s), PP_OK);
    /* both MoE archs with their defaults; the tiny-moe shape */
    tiny(&s);
    moe(&s, "qwen2moe");
    s.norm_topk_prob = 1;
    assert_int_equal(pp_synth_validate(&s), PP_OK);
    tiny(&s);
    moe(&s, "mixtral");
    assert_int_equal(pp_synth_validate(&s), PP_OK);
    assert_int_equal(pp_synth_shape("tiny-moe", &s), PP_OK);
    assert_int_equal(pp_synth_validate(&s), PP_OK);
}

static void test_llama_f32(void **state)
{
    struct fixture *fx = *state;
    struct pp_synth_spec s;
    tiny(&s);
    write_both(fx, &s);
    struct gg_file g;
    gg_open(&g, fx->gguf);
    assert_int_equal(g.version, 3);
    assert_int_equal(g.n_tensors, 1 + 2 * 9 + 2);
    assert_string_equal(g.arch, "llama");
    assert_int_equal(g.n_tokens, 300);
    size_t len;
    char *st = read_hf(fx, "model.safetensors", &len);
    assert_non_null(st);
    assert_int_equal(st[8], '{');
    check_same(&g, st, len, "token_embd.weight", "model.embed_tokens.weight", 0);
    check_same(&g, st, len, "output.weight", "lm_head.weight", 0);
    check_same(&g, st, len, "output_norm.weight", "model.norm.weight", 0);
    for (int l = 0; l < 2; l++) {
        char gn[64], hn[96];
        static const char *const pairs[][2] = {
            {"attn_norm.weight", "input_layernorm.weight"},
            {"attn_v.weight", "self_attn.v_proj.weight"},
            {"attn_output.weight", "self_attn.o_proj.weight"},
            {"ffn_norm.weight", "post_attention_layernorm.weight"},
            {"ffn_gate.weight", "mlp.gate_proj.weight"},
            {"ffn_up.weight", "mlp.up_proj.weight"},
            {"ffn_down.weight", "mlp.down_proj.weight"},
        };
        for (size_t k = 0; k < sizeof(pairs) / sizeof(pairs[0]); k++) {
            snprintf(gn, sizeof(gn), "blk.%d.%s", l, pairs[k][0]);
            snprintf(hn, sizeof(hn), "model.layers.%d.%s", l, pairs[k][1]);
            check_same(&g, st, len, gn, hn, 0);
        }
        snprintf(gn, sizeof(gn), "blk.%d.attn_q.weight", l);
        snprintf(hn, sizeof(hn), "model.layers.%d.self_attn.q_proj.weight", l);
        check_same(&g, st, len, gn, hn, 4);
        snprintf(gn, sizeof(gn), "blk.%d.attn_k.weight", l);
        snprintf(hn, sizeof(hn), "model.layers.%d.self_attn.k_proj.weight", l);
        check_same(&g, st, len, gn, hn, 2);
    }
    /* the permutation is real: GGUF row 1 of q is HF row 8 (head_dim 16) */
    const struct gg_tensor *q = gg_find(&g, "blk.0.attn_q.weight");
    struct st_tensor hq;
    assert_true(st_find(st, len, "model.layers.0.self_attn.q_proj.weight", &hq));
    assert_memory_not_equal(gg_data(&g, q) + 64 * 4, hq.data + 64 * 4, 64 * 4);
    assert_memory_equal(gg_data(&g, q) + 64 * 4, hq.data + 8 * 64 * 4, 64 * 4);
    assert_null(gg_find(&g, "rope_freqs.weight"));
    free(st);
    free(g.buf);

    char *cfg = read_hf(fx, "config.json", &len);
    assert_non_null(cfg);
    assert_non_null(strstr(cfg, "\"LlamaForCausalLM\""));
    assert_non_null(strstr(cfg, "\"rope_scaling\": null"));
    assert_non_null(strstr(cfg, "\"torch_dtype\": \"float32\""));
    free(cfg);
    assert_int_equal(count_entries(fx->hf), 4);
}

static void check_dtype(const struct fixture *fx, enum pp_dtype dtype, uint32_t ggml_type,
                        const char *st_dtype)
{
    struct pp_synth_spec s;
    tiny(&s);
    s.dtype = dtype;
    s.tied = 1;
    write_both(fx, &s);
    struct gg_file g;
    gg_open(&g, fx->gguf);
    assert_int_equal(g.n_tensors, 1 + 2 * 9 + 1);
    assert_null(gg_find(&g, "output.weight"));
    assert_int_equal(gg_find(&g, "blk.1.ffn_up.weight")->type, ggml_type);
    assert_int_equal(gg_find(&g, "token_embd.weight")->type, ggml_type);
    assert_int_equal(gg_find(&g, "blk.1.ffn_norm.weight")->type, 0);
    size_t len;
    char *st = read_hf(fx, "model.safetensors", &len);
    struct st_tensor t;
    assert_false(st_find(st, len, "lm_head.weight", &t));
    assert_true(st_find(st, len, "model.layers.1.post_attention_layernorm.weight", &t));
    assert_string_equal(t.dtype, st_dtype);
    check_same(&g, st, len, "token_embd.weight", "model.embed_tokens.weight", 0);
    check_same(&g, st, len, "blk.1.attn_q.weight", "model.layers.1.self_attn.q_proj.weight", 4);
    check_same(&g, st, len, "blk.1.attn_k.weight", "model.layers.1.self_attn.k_proj.weight", 2);
    check_same(&g, st, len, "blk.1.ffn_down.weight", "model.layers.1.mlp.down_proj.weight", 0);
    check_same(&g, st, len, "blk.1.ffn_norm.weight",
               "model.layers.1.post_attention_layernorm.weight", 0);
    free(st);
    free(g.buf);
}

static void test_dtypes(void **state)
{
    struct fixture *fx = *state;
    check_dtype(fx, PP_DTYPE_F16, 1, "F16");
    check_dtype(fx, PP_DTYPE_BF16, 30, "BF16");
    check_dtype(fx, PP_DTYPE_Q8_0, 8, "F32");
}

static void test_qwen2_bias(void **state)
{
    struct fixture *fx = *state;
    struct pp_synth_spec s;
    tiny(&s);
    strcpy(s.arch, "qwen2");
    write_both(fx, &s);
    struct gg_file g;
    gg_open(&g, fx->gguf);
    assert_string_equal(g.arch, "qwen2");
    assert_int_equal(g.n_tensors, 1 + 2 * 12 + 2);
    size_t len;
    char *st = read_hf(fx, "model.safetensors", &len);
    /* qwen2 keeps the HF layout: no permutation */
    check_same(&g, st, len, "blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight", 0);
    check_same(&g, st, len, "blk.0.attn_q.bias", "model.layers.0.self_attn.q_proj.bias", 0);
    check_same(&g, st, len, "blk.0.attn_k.bias", "model.layers.0.self_attn.k_proj.bias", 0);
    check_same(&g, st, len, "blk.0.attn_v.bias", "model.layers.0.self_attn.v_proj.bias", 0);
    free(st);
    free(g.buf);

    /* llama with biases: the q/k biases are permuted like the rows */
    tiny(&s);
    s.qkv_bias = 1;
    write_both(fx, &s);
    gg_open(&g, fx->gguf);
    st = read_hf(fx, "model.safetensors", &len);
    check_same(&g, st, len, "blk.1.attn_q.bias", "model.layers.1.self_attn.q_proj.bias", 4);
    check_same(&g, st, len, "blk.1.attn_k.bias", "model.layers.1.self_attn.k_proj.bias", 2);
    check_same(&g, st, len, "blk.1.attn_v.bias", "model.layers.1.self_attn.v_proj.bias", 0);
    free(st);
    free(g.buf);
}

/* Expert e of a 3-D GGUF tensor [n, rows, cols] holds exactly HF expert e's values. */
static void check_expert(const struct gg_file *g, const char *st_buf, size_t st_len,
                         const char *gname, const char *hname, int64_t e, int64_t n)
{
    const struct gg_tensor *gt = gg_find(g, gname);
    struct st_tensor ht;
    assert_non_null(gt);
    assert_true(st_find(st_buf, st_len, hname, &ht));
    int64_t rows = ht.shape[0], cols = ht.shape[1];
    assert_int_equal(gt->n_dims, 3);
    assert_int_equal(gt->dims[0], (uint64_t)cols);
    assert_int_equal(gt->dims[1], (uint64_t)rows);
    assert_int_equal(gt->dims[2], (uint64_t)n);
    uint64_t rb = gg_row_bytes(gt->type, (uint64_t)cols);
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *grow = gg_data(g, gt) + ((uint64_t)e * (uint64_t)rows + (uint64_t)r) * rb;
        for (int64_t c = 0; c < cols; c++) {
            float a = gg_value(grow, gt->type, c), b = st_value(&ht, r * cols + c);
            if (memcmp(&a, &b, 4) != 0)
                fail_msg("%s[%lld][%lld][%lld]: gguf %.9g, hf %s %.9g", gname, (long long)e,
                         (long long)r, (long long)c, (double)a, hname, (double)b);
        }
    }
}

static void test_moe_experts(void **state)
{
    struct fixture *fx = *state;
    static const enum pp_dtype dtypes[] = {PP_DTYPE_F32, PP_DTYPE_BF16, PP_DTYPE_Q8_0};
    for (size_t d = 0; d < sizeof(dtypes) / sizeof(dtypes[0]); d++) {
        struct pp_synth_spec s;
        tiny(&s);
        strcpy(s.arch, "qwen2moe");
        s.ffn_dim = 64;
        s.n_experts = 3;
        s.n_experts_used = 2;
        s.expert_ffn_dim = 32;
        s.shared_ffn_dim = 96;
        s.dtype = dtypes[d];
        write_both(fx, &s);
        struct gg_file g;
        gg_open(&g, fx->gguf);
        assert_string_equal(g.arch, "qwen2moe");
        /* embedding, per layer 9 attention + router + 3 stacks + 4 shared, norm, head */
        assert_int_equal(g.n_tensors, 1 + 2 * 17 + 2);
        size_t len;
        char *st = read_hf(fx, "model.safetensors", &len);
        static const char *const roles[3][2] = {{"ffn_gate_exps", "gate_proj"},
                                                {"ffn_up_exps", "up_proj"},
                                                {"ffn_down_exps", "down_proj"}};
        char gname[96], hname[128];
        for (int r = 0; r < 3; r++)
            for (int64_t e = 0; e < 3; e++) {
                snprintf(gname, sizeof(gname), "blk.1.%s.weight", roles[r][0]);
                snprintf(hname, sizeof(hname), "model.layers.1.mlp.experts.%lld.%s.weight",
                         (long long)e, roles[r][1]);
                check_expert(&g, st, len, gname, hname, e, 3);
            }
        check_same(&g, st, len, "blk.0.ffn_gate_inp.weight", "model.layers.0.mlp.gate.weight", 0);
        check_same(&g, st, len, "blk.0.ffn_down_shexp.weight",
                   "model.layers.0.mlp.shared_expert.down_proj.weight", 0);
        /* the shared gate: [dim] f32 in GGUF, [1, dim] in HF, the same values */
        const struct gg_tensor *gv = gg_find(&g, "blk.0.ffn_gate_inp_shexp.weight");
        struct st_tensor hv;
        assert_non_null(gv);
        assert_true(st_find(st, len, "model.layers.0.mlp.shared_expert_gate.weight", &hv));
        assert_int_equal(gv->n_dims, 1);
        assert_int_equal(hv.n_dims, 2);
        assert_int_equal(hv.shape[0], 1);
        assert_int_equal(hv.shape[1], 64);
        for (int64_t i = 0; i < 64; i++) {
            float a = gg_value(gg_data(&g, gv), 0, i), b = st_value(&hv, i);
            assert_memory_equal(&a, &b, 4);
        }
        free(st);
        free(g.buf);
    }
    /* mixtral: GGUF arch llama, q permuted, experts named w1/w3/w2 in HF */
    struct pp_synth_spec s;
    assert_int_equal(pp_synth_shape("tiny-moe", &s), PP_OK);
    write_both(fx, &s);
    struct gg_file g;
    gg_open(&g, fx->gguf);
    assert_string_equal(g.arch, "llama");
    size_t len;
    char *st = read_hf(fx, "model.safetensors", &len);
    check_same(&g, st, len, "blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight", 4);
    check_expert(&g, st, len, "blk.0.ffn_up_exps.weight",
                 "model.layers.0.block_sparse_moe.experts.3.w3.weight", 3, 4);
    check_expert(&g, st, len, "blk.1.ffn_down_exps.weight",
                 "model.layers.1.block_sparse_moe.experts.0.w2.weight", 0, 4);
    check_same(&g, st, len, "blk.1.ffn_gate_inp.weight",
               "model.layers.1.block_sparse_moe.gate.weight", 0);
    free(st);
    free(g.buf);
}

static void test_sharded(void **state)
{
    struct fixture *fx = *state;
    struct pp_synth_spec s;
    tiny(&s);
    s.shards = 3;
    assert_int_equal(pp_synth_write_hf(&s, fx->hf), PP_OK);
    size_t len;
    char *index = read_hf(fx, "model.safetensors.index.json", &len);
    assert_non_null(index);
    assert_non_null(strstr(index, "\"weight_map\""));
    char *shard[3];
    size_t shard_len[3];
    for (int k = 0; k < 3; k++) {
        char name[64];
        snprintf(name, sizeof(name), "model-%05d-of-00003.safetensors", k + 1);
        shard[k] = read_hf(fx, name, &shard_len[k]);
        assert_non_null(shard[k]);
        assert_non_null(strstr(index, name));
    }
    struct pp__synth_model m;
    assert_int_equal(pp__synth_resolve(&s, &m), PP_OK);
    for (int64_t i = 0; i < pp__synth_tensor_count(&m); i++) {
        struct pp__synth_tensor t;
        struct st_tensor found;
        pp__synth_tensor_get(&m, i, &t);
        int holders = 0;
        for (int k = 0; k < 3; k++)
            holders += st_find(shard[k], shard_len[k], t.hf_name, &found);
        assert_int_equal(holders, 1);
        assert_non_null(strstr(index, t.hf_name));
    }
    for (int k = 0; k < 3; k++)
        free(shard[k]);
    free(index);
    assert_null(read_hf(fx, "model.safetensors", &len));
}

static void test_llama3_rope_freqs(void **state)
{
    struct fixture *fx = *state;
    struct pp_synth_spec s;
    tiny(&s);
    s.rope_llama3 = 1;
    assert_int_equal(pp_synth_write_gguf(&s, fx->gguf), PP_OK);
    struct gg_file g;
    gg_open(&g, fx->gguf);
    const struct gg_tensor *t = gg_find(&g, "rope_freqs.weight");
    assert_non_null(t);
    assert_int_equal(t->type, 0);
    assert_int_equal(t->n_dims, 1);
    assert_int_equal(t->dims[0], 8); /* head_dim 16 / 2 */
    float f[8];
    memcpy(f, gg_data(&g, t), sizeof(f));
    assert_true(f[0] == 1.0f);
    assert_true(f[7] == 8.0f);
    for (int i = 1; i < 8; i++)
        assert_true(f[i] >= f[i - 1]);
    free(g.buf);
    assert_int_equal(pp_synth_write_hf(&s, fx->hf), PP_OK);
    size_t len;
    char *cfg = read_hf(fx, "config.json", &len);
    assert_non_null(strstr(cfg, "\"rope_type\": \"llama3\""));
    assert_non_null(strstr(cfg, "\"rope_theta\": 500000.0"));
    free(cfg);
}

/* Each UTF-8 character of the normalized corpus, as a string. */
static int next_char(const char *s, char *out)
{
    int n = (unsigned char)s[0] < 0x80 ? 1 : (unsigned char)s[0] < 0xe0 ? 2 : 3;
    memcpy(out, s, (size_t)n);
    out[n] = '\0';
    return n;
}

static int32_t find(const struct pp__synth_vocab *v, const char *s)
{
    for (int32_t i = 0; i < v->n; i++)
        if (strcmp(v->tokens[i], s) == 0)
            return i;
    return -1;
}

static void test_vocab(void **state)
{
    struct fixture *fx = *state;
    struct pp__synth_vocab v;
    assert_int_equal(pp__synth_vocab_build(300, &v), PP_OK);
    assert_int_equal(v.n, 300);
    assert_string_equal(v.tokens[0], "<unk>");
    assert_string_equal(v.tokens[1], "<s>");
    assert_string_equal(v.tokens[2], "</s>");
    assert_string_equal(v.tokens[3], "<0x00>");
    assert_string_equal(v.tokens[258], "<0xFF>");
    assert_int_equal(v.types[0], 2);
    assert_int_equal(v.types[1], 3);
    assert_int_equal(v.types[100], 6);
    assert_true(v.n_merges > 0);
    assert_int_equal(PP__VOCAB_FIRST_CHAR + v.n_chars + v.n_merges, 300);
    /* every corpus character is a token: map the text to ids and back */
    const char *text = pp__synth_corpus();
    char rebuilt[8192] = "", c[5];
    for (const char *p = text; *p;) {
        p += next_char(p, c);
        int32_t id = find(&v, strcmp(c, " ") == 0 ? "\xe2\x96\x81" : c);
        assert_true(id >= PP__VOCAB_FIRST_CHAR && id < PP__VOCAB_FIRST_CHAR + v.n_chars);
        strcat(rebuilt, strcmp(v.tokens[id], "\xe2\x96\x81") == 0 ? " " : v.tokens[id]);
    }
    assert_string_equal(rebuilt, text);
    /* scores: earlier merges higher, characters below all merges */
    int32_t first_merge = PP__VOCAB_FIRST_CHAR + v.n_chars;
    for (int32_t i = first_merge + 1; i < 300; i++)
        assert_true(v.scores[i] < v.scores[i - 1]);
    assert_true(v.scores[first_merge - 1] < v.scores[299]);
    pp__synth_vocab_free(&v);

    /* a big vocabulary: training stops when no pair repeats, the rest are unused extras */
    assert_int_equal(pp__synth_vocab_build(5000, &v), PP_OK);
    assert_true(v.n_merges > 100);
    assert_int_equal(strncmp(v.tokens[4999], "<extra_", 7), 0);
    assert_int_equal(v.types[4999], 5);
    assert_int_equal(find(&v, "\xe2\x96\x81the") > 0, 1);
    pp__synth_vocab_free(&v);

    /* the HF tokenizer.json carries the same tokens */
    struct pp_synth_spec s;
    tiny(&s);
    assert_int_equal(pp_synth_write_hf(&s, fx->hf), PP_OK);
    size_t len;
    char *tok = read_hf(fx, "tokenizer.json", &len);
    assert_non_null(strstr(tok, "\"<0x0A>\": 13"));
    assert_non_null(strstr(tok, "\"byte_fallback\": true"));
    assert_non_null(strstr(tok, "\"merges\": ["));
    free(tok);
}

static int files_equal(const char *a, const char *b)
{
    size_t la, lb;
    char *x = read_all(a, &la), *y = read_all(b, &lb);
    int eq = x && y && la == lb && memcmp(x, y, la) == 0;
    free(x);
    free(y);
    return eq;
}

static void test_deterministic(void **state)
{
    struct fixture *fx = *state;
    struct pp_synth_spec s;
    char other[160];
    tiny(&s);
    snprintf(other, sizeof(other), "%s/again.gguf", fx->dir);
    assert_int_equal(pp_synth_write_gguf(&s, fx->gguf), PP_OK);
    assert_int_equal(pp_synth_write_gguf(&s, other), PP_OK);
    assert_true(files_equal(fx->gguf, other));
    s.seed = 2;
    assert_int_equal(pp_synth_write_gguf(&s, other), PP_OK);
    assert_false(files_equal(fx->gguf, other));
}

static void test_io_error(void **state)
{
    struct fixture *fx = *state;
    struct pp_synth_spec s;
    char path[160];
    tiny(&s);
    snprintf(path, sizeof(path), "%s/missing/m.gguf", fx->dir);
    assert_int_equal(pp_synth_write_gguf(&s, path), PP_ERR_IO);
    assert_non_null(strstr(pp_error_detail(), path));
    assert_non_null(strstr(pp_error_detail(), "No such file"));
    /* an HF "directory" that is a file */
    assert_int_equal(pp_synth_write_gguf(&s, fx->gguf), PP_OK);
    assert_int_equal(pp_synth_write_hf(&s, fx->gguf), PP_ERR_IO);
    assert_non_null(strstr(pp_error_detail(), fx->gguf));
}

/* Fails the 1st, 2nd, ... allocation of a write until it succeeds: every failure must be
 * PP_ERR_NOMEM, leave no file (nor temporary) behind and no memory allocated. */
static void test_alloc_failures(void **state)
{
    struct fixture *fx = *state;
    struct pp_synth_spec s;
    tiny(&s);
    s.shards = 2;
    int64_t base = pp_mem_live(PP_MEM_MISC);
    for (int which = 0; which < 2; which++) {
        int64_t nth;
        for (nth = 1; nth < 100000; nth++) {
            pp_alloc_fail_at(nth);
            pp_status st =
                which ? pp_synth_write_hf(&s, fx->hf) : pp_synth_write_gguf(&s, fx->gguf);
            pp_alloc_fail_at(0);
            assert_int_equal(pp_mem_live(PP_MEM_MISC), base);
            if (st == PP_OK)
                break;
            assert_int_equal(st, PP_ERR_NOMEM);
            if (which == 0)
                assert_int_equal(count_entries(fx->dir), 0);
            else
                assert_true(count_named(fx->hf, ".tmp.") <= 0);
        }
        assert_true(nth > 1 && nth < 100000);
    }
    /* the HF folder holds only complete files, no temporaries */
    assert_int_equal(count_entries(fx->hf), 6);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shapes),
        cmocka_unit_test(test_validate_errors),
        cmocka_unit_test_setup_teardown(test_llama_f32, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dtypes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_qwen2_bias, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sharded, setup, teardown),
        cmocka_unit_test_setup_teardown(test_moe_experts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_llama3_rope_freqs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_vocab, setup, teardown),
        cmocka_unit_test_setup_teardown(test_deterministic, setup, teardown),
        cmocka_unit_test_setup_teardown(test_io_error, setup, teardown),
        cmocka_unit_test_setup_teardown(test_alloc_failures, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
