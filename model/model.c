/* Binding a layer range of a model file to pp_model: every tensor looked up, its dtype and shape
 * checked against the configuration, 1-D tensors converted to f32. */
#include "model/model.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "model/model-impl.h"
#include "model/source.h"

static void fmt_shape(char *buf, size_t cap, const int64_t *shape, int32_t n)
{
    size_t k = (size_t)snprintf(buf, cap, "[");
    for (int32_t i = 0; i < n && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < cap)
        snprintf(buf + k, cap - k, "]");
}

pp_status pp__bind_find(struct pp__binder *b, const char *name, int32_t n_dims,
                        const int64_t *want, int optional, const struct pp_tensor **out)
{
    *out = NULL;
    pp_status st = pp__source_tensor(b->src, name, out);
    if (st == PP_ERR_NOT_FOUND) {
        if (optional)
            return PP_OK;
        return pp_error(PP_ERR_NOT_FOUND, "%s: missing tensor %s", b->src->path, name);
    }
    if (st != PP_OK)
        return st;
    const struct pp_tensor *t = *out;
    int ok = t->n_dims == n_dims;
    for (int32_t i = 0; ok && i < n_dims; i++)
        ok = t->shape[i] == want[i];
    if (!ok) {
        char ws[96], gs[96];
        fmt_shape(ws, sizeof(ws), want, n_dims);
        fmt_shape(gs, sizeof(gs), t->shape, t->n_dims);
        return pp_error(PP_ERR_FORMAT, "%s: tensor %s: expected shape %s, got %s", b->src->path,
                        name, ws, gs);
    }
    return PP_OK;
}

/* Room for more realigned copies; the list grows as misaligned weights turn up (none in the files
 * we write), so a file that declares many experts costs nothing before its tensors are seen. */
static pp_status grow_owned(struct pp_model *m)
{
    int32_t cap = m->cap_owned ? 2 * m->cap_owned : 16;
    void **list = pp_calloc(PP_MEM_MISC, (size_t)cap, sizeof(void *));
    if (!list)
        return PP_ERR_NOMEM;
    if (m->n_owned)
        memcpy(list, m->owned_copies, (size_t)m->n_owned * sizeof(void *));
    pp_free(PP_MEM_MISC, m->owned_copies);
    m->owned_copies = list;
    m->cap_owned = cap;
    return PP_OK;
}

pp_status pp__bind_matrix(struct pp__binder *b, const char *name, const struct pp_tensor *t,
                          int64_t index, int64_t rows, int64_t cols, struct pp_weight *w)
{
    if (t->dtype == PP_DTYPE_Q8_0 && cols % PP_Q8_0_BLOCK != 0)
        return pp_error(PP_ERR_FORMAT, "%s: tensor %s: Q8_0 rows of %lld values are not whole "
                        "32-value blocks", b->src->path, name, (long long)cols);
    int64_t bytes = rows * pp_dtype_row_bytes(t->dtype, cols);
    w->data = (const uint8_t *)t->data + index * bytes;
    /* a Q8_0 scale of inf or NaN makes its whole block inf or NaN: a corrupt file, refused here
     * rather than found in the logits */
    int64_t bad = t->dtype == PP_DTYPE_Q8_0
                      ? pp_q8_0_first_nonfinite(w->data, rows * cols / PP_Q8_0_BLOCK)
                      : -1;
    if (bad >= 0) {
        int64_t per_row = cols / PP_Q8_0_BLOCK;
        return pp_error(PP_ERR_FORMAT, "%s: tensor %s: row %lld, columns %lld-%lld: the Q8_0 "
                        "block's scale is infinite or NaN; expected a finite f16 scale (a "
                        "corrupt file?)", b->src->path, name,
                        (long long)(index * rows + bad / per_row),
                        (long long)(bad % per_row * PP_Q8_0_BLOCK),
                        (long long)(bad % per_row * PP_Q8_0_BLOCK + PP_Q8_0_BLOCK - 1));
    }
    w->dtype = t->dtype;
    w->rows = rows;
    w->cols = cols;
    size_t align = t->dtype == PP_DTYPE_F32 ? 4 : t->dtype == PP_DTYPE_Q8_0 ? 1 : 2;
    if ((uintptr_t)w->data % align != 0) {
        if (b->m->n_owned == b->m->cap_owned && grow_owned(b->m) != PP_OK)
            return PP_ERR_NOMEM;
        void *copy = pp_alloc_aligned(PP_MEM_WEIGHTS, (size_t)bytes);
        if (!copy)
            return PP_ERR_NOMEM;
        memcpy(copy, w->data, (size_t)bytes);
        w->data = copy;
        b->m->owned_copies[b->m->n_owned++] = copy;
    }
    return PP_OK;
}

pp_status pp__bind_weight(struct pp__binder *b, const char *name, int64_t rows, int64_t cols,
                          struct pp_weight *w)
{
    const struct pp_tensor *t;
    int64_t want[2] = {rows, cols};
    pp_status st = pp__bind_find(b, name, 2, want, 0, &t);
    if (st != PP_OK)
        return st;
    return pp__bind_matrix(b, name, t, 0, rows, cols, w);
}

pp_status pp__bind_vector(struct pp__binder *b, const char *name, int64_t n, int optional,
                          float **out)
{
    const struct pp_tensor *t;
    *out = NULL;
    int64_t want[1] = {n};
    pp_status st = pp__bind_find(b, name, 1, want, optional, &t);
    if (st != PP_OK || !t)
        return st;
    return pp__bind_vector_from(b, name, t, n, out);
}

pp_status pp__bind_vector_from(struct pp__binder *b, const char *name, const struct pp_tensor *t,
                               int64_t n, float **out)
{
    if (t->dtype == PP_DTYPE_Q8_0)
        return pp_error(PP_ERR_FORMAT, "%s: tensor %s: 1-D tensors must be f32, f16 or bf16, got "
                        "q8_0", b->src->path, name);
    float *v = pp_alloc_aligned(PP_MEM_WEIGHTS, (size_t)n * sizeof(float));
    if (!v)
        return PP_ERR_NOMEM;
    /* the source may be unaligned: convert through a byte copy */
    int64_t bytes = pp_dtype_row_bytes(t->dtype, n);
    memcpy(v, t->data, (size_t)(t->dtype == PP_DTYPE_F32 ? bytes : 0));
    if (t->dtype != PP_DTYPE_F32) {
        uint16_t tmp[256];
        for (int64_t i = 0; i < n; i += 256) {
            int64_t k = n - i < 256 ? n - i : 256;
            memcpy(tmp, (const uint16_t *)t->data + i, (size_t)k * 2);
            pp_row_to_f32(v + i, tmp, t->dtype, k);
        }
    }
    *out = v;
    return PP_OK;
}

static pp_status bind_dense_ffn(struct pp__binder *b, int32_t layer, struct pp_layer_weights *lw)
{
    const struct pp_model_config *c = &b->m->cfg;
    char name[96];
    pp_status st;
#define NAME(suffix) (snprintf(name, sizeof(name), "blk.%d." suffix, layer), name)
    if ((st = pp__bind_weight(b, NAME("ffn_gate.weight"), c->ffn_dim, c->dim, &lw->w_gate)) ||
        (st = pp__bind_weight(b, NAME("ffn_up.weight"), c->ffn_dim, c->dim, &lw->w_up)))
        return st;
    return pp__bind_weight(b, NAME("ffn_down.weight"), c->dim, c->ffn_dim, &lw->w_down);
#undef NAME
}

static pp_status bind_layer(struct pp__binder *b, int32_t layer, struct pp_layer_weights *lw)
{
    const struct pp_model_config *c = &b->m->cfg;
    int64_t q_dim = (int64_t)c->n_heads * c->head_dim,
            kv_dim = (int64_t)c->n_kv_heads * c->head_dim;
    char name[96];
    pp_status st;
#define NAME(suffix) (snprintf(name, sizeof(name), "blk.%d." suffix, layer), name)
    if ((st = pp__bind_vector(b, NAME("attn_norm.weight"), c->dim, 0, &lw->attn_norm)) != PP_OK ||
        (st = pp__bind_weight(b, NAME("attn_q.weight"), q_dim, c->dim, &lw->wq)) != PP_OK ||
        (st = pp__bind_weight(b, NAME("attn_k.weight"), kv_dim, c->dim, &lw->wk)) != PP_OK ||
        (st = pp__bind_weight(b, NAME("attn_v.weight"), kv_dim, c->dim, &lw->wv)) != PP_OK ||
        (st = pp__bind_vector(b, NAME("attn_q.bias"), q_dim, 1, &lw->bq)) != PP_OK ||
        (st = pp__bind_vector(b, NAME("attn_k.bias"), kv_dim, 1, &lw->bk)) != PP_OK ||
        (st = pp__bind_vector(b, NAME("attn_v.bias"), kv_dim, 1, &lw->bv)) != PP_OK ||
        (st = pp__bind_weight(b, NAME("attn_output.weight"), c->dim, q_dim, &lw->wo)) != PP_OK ||
        (st = pp__bind_vector(b, NAME("ffn_norm.weight"), c->dim, 0, &lw->ffn_norm)) != PP_OK)
        return st;
#undef NAME
    st = c->n_experts > 0 ? pp__bind_moe(b, layer, &lw->moe) : bind_dense_ffn(b, layer, lw);
    if (st != PP_OK)
        return st;
    int qwen = c->arch == PP_ARCH_QWEN2 || c->arch == PP_ARCH_QWEN2MOE;
    if (qwen && c->format == PP_FORMAT_HF && (!lw->bq || !lw->bk || !lw->bv))
        return pp_error(PP_ERR_NOT_FOUND, "%s: %s layer %d lacks its q/k/v biases",
                        b->src->path, pp_arch_name(c->arch), layer);
    return PP_OK;
}

pp_status pp_model_read_config(const char *path, struct pp_model_config *out)
{
    struct pp_source *s;
    pp_status st = pp__source_open(path, &s);
    if (st != PP_OK)
        return st;
    *out = s->cfg;
    pp__source_free(s);
    return PP_OK;
}

static pp_status bind_all(struct pp__binder *b)
{
    struct pp_model *m = b->m;
    const struct pp_model_config *c = &m->cfg;
    pp_status st;
    int32_t n = m->last_layer - m->first_layer;
    m->layers = pp_calloc(PP_MEM_MISC, (size_t)(n ? n : 1), sizeof(*m->layers));
    m->inv_freq = pp_alloc_aligned(PP_MEM_WEIGHTS, (size_t)c->head_dim / 2 * sizeof(float));
    if (!m->layers || !m->inv_freq)
        return PP_ERR_NOMEM;
    pp_rope_inv_freq(c, b->src->rope_divisors, m->inv_freq);
    if (m->has_embedding &&
        (st = pp__bind_weight(b, "token_embd.weight", c->vocab_size, c->dim, &m->embedding)))
        return st;
    for (int32_t l = 0; l < n; l++)
        if ((st = bind_layer(b, m->first_layer + l, &m->layers[l])) != PP_OK)
            return st;
    if (m->has_head) {
        if ((st = pp__bind_vector(b, "output_norm.weight", c->dim, 0, &m->final_norm)) != PP_OK)
            return st;
        const struct pp_tensor *head;
        int64_t want[2] = {c->vocab_size, c->dim};
        if ((st = pp__bind_find(b, "output.weight", 2, want, 1, &head)) != PP_OK)
            return st;
        const char *head_name = head ? "output.weight" : "token_embd.weight";
        if (!head && !c->tied_embeddings)
            return pp_error(PP_ERR_NOT_FOUND, "%s: missing tensor lm_head (output.weight) and "
                            "the embeddings are not tied", b->src->path);
        if ((st = pp__bind_weight(b, head_name, c->vocab_size, c->dim, &m->lm_head)) != PP_OK)
            return st;
    }
    return PP_OK;
}

pp_status pp_model_open(const char *path, int32_t first, int32_t last, struct pp_model **out)
{
    struct pp_model *m = pp_calloc(PP_MEM_MISC, 1, sizeof(*m));
    if (!m)
        return PP_ERR_NOMEM;
    pp_status st = pp__source_open(path, &m->source);
    if (st != PP_OK) {
        pp_model_free(m);
        return st;
    }
    m->cfg = m->source->cfg;
    if (last < 0)
        last = m->cfg.n_layers;
    if (first < 0 || first >= last || last > m->cfg.n_layers) {
        pp_model_free(m);
        return pp_error(PP_ERR_INVALID_ARG,
                        "layer range [%d, %d) is not inside [0, %d) or is empty", first, last,
                        m->cfg.n_layers);
    }
    m->first_layer = first;
    m->last_layer = last;
    m->has_embedding = first == 0;
    m->has_head = last == m->cfg.n_layers;
    struct pp__binder b = {m, m->source};
    if ((st = bind_all(&b)) != PP_OK) {
        pp_model_free(m);
        return st;
    }
    *out = m;
    return PP_OK;
}

void pp_model_free(struct pp_model *m)
{
    if (!m)
        return;
    if (m->layers) {
        for (int32_t l = 0; l < m->last_layer - m->first_layer; l++) {
            struct pp_layer_weights *lw = &m->layers[l];
            pp_free(PP_MEM_WEIGHTS, lw->attn_norm);
            pp_free(PP_MEM_WEIGHTS, lw->ffn_norm);
            pp_free(PP_MEM_WEIGHTS, lw->bq);
            pp_free(PP_MEM_WEIGHTS, lw->bk);
            pp_free(PP_MEM_WEIGHTS, lw->bv);
            pp__moe_weights_free(lw->moe);
        }
        pp_free(PP_MEM_MISC, m->layers);
    }
    for (int32_t i = 0; i < m->n_owned; i++)
        pp_free(PP_MEM_WEIGHTS, m->owned_copies[i]);
    pp_free(PP_MEM_MISC, m->owned_copies);
    pp_free(PP_MEM_WEIGHTS, m->final_norm);
    pp_free(PP_MEM_WEIGHTS, m->inv_freq);
    pp__source_free(m->source);
    pp_free(PP_MEM_MISC, m);
}

int64_t pp_weight_bytes(const struct pp_weight *w)
{
    return w->data ? w->rows * pp_dtype_row_bytes(w->dtype, w->cols) : 0;
}

int64_t pp_model_layer_bytes(const struct pp_model *m, int32_t layer)
{
    const struct pp_layer_weights *lw = &m->layers[layer - m->first_layer];
    return pp_weight_bytes(&lw->wq) + pp_weight_bytes(&lw->wk) + pp_weight_bytes(&lw->wv) +
           pp_weight_bytes(&lw->wo) + pp_weight_bytes(&lw->w_gate) + pp_weight_bytes(&lw->w_up) +
           pp_weight_bytes(&lw->w_down) + pp__moe_weights_bytes(lw->moe);
}

int64_t pp_model_weight_bytes(const struct pp_model *m)
{
    int64_t total = 0;
    for (int32_t l = m->first_layer; l < m->last_layer; l++)
        total += pp_model_layer_bytes(m, l);
    if (m->has_embedding)
        total += pp_weight_bytes(&m->embedding);
    if (m->has_head && !(m->has_embedding && m->lm_head.data == m->embedding.data))
        total += pp_weight_bytes(&m->lm_head);
    return total;
}
