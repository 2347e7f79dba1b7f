/* The forward pass of a layer range. Scratch buffers are sized once for max_batch_tokens rows;
 * larger batches run in windows of rows, which changes nothing in any token's arithmetic. */
#include "model/executor.h"

#include <math.h>
#include <string.h>

#include "common/alloc.h"
#include "model/kv_cache.h"
#include "model/moe_ffn.h"

struct pp_executor {
    const struct pp_model *m;
    struct pp_backend *be;
    struct pp_kv_cache *kv;
    int32_t max_rows;
    int32_t max_context;
    /* scratch, T = max_rows */
    float *x;     /* [T, dim] residual stream */
    float *xb;    /* [T, dim] normalised input / projection output */
    float *q;     /* [T, n_heads*head_dim] */
    float *k;     /* [T, n_kv_heads*head_dim] */
    float *v;     /* [T, n_kv_heads*head_dim] */
    float *att;   /* [T, n_heads*head_dim] */
    float *gate;  /* [T, ffn_dim] */
    float *up;    /* [T, ffn_dim] */
    int32_t *pos; /* [T] */
    struct pp_attn_seq *aseqs; /* [T] parts of the current window */
    int32_t *want_rows;        /* [T] */
    /* MoE models only (NULL otherwise) */
    struct pp_moe_scratch *moe;
    float *moe_out;            /* [T, dim] */
    int64_t *expert_tokens;    /* [n_layers of the range, n_experts] tokens routed, all forwards */
};

static void *scratch(int64_t n, size_t elem)
{
    return pp_alloc_aligned(PP_MEM_ACTIVATIONS, (size_t)n * elem);
}

pp_status pp_executor_new(const struct pp_model *m, struct pp_backend *be,
                          const struct pp_executor_opts *opts, struct pp_executor **out)
{
    const struct pp_model_config *c = &m->cfg;
    struct pp_executor_opts o = *opts;
    if (o.max_batch_tokens <= 0)
        o.max_batch_tokens = 256;
    if (o.kv_block_size <= 0)
        o.kv_block_size = 16;
    if (o.max_seqs <= 0)
        o.max_seqs = 64;
    if (o.max_context <= 0 || o.max_context > c->max_context)
        o.max_context = c->max_context;
    int32_t n_layers = m->last_layer - m->first_layer;
    int32_t kv_dim = c->n_kv_heads * c->head_dim;
    if (o.kv_budget_bytes <= 0) {
        int64_t blocks = (int64_t)o.max_seqs * ((o.max_context + o.kv_block_size - 1) / o.kv_block_size);
        o.kv_budget_bytes = blocks * pp_kv_block_bytes(n_layers, kv_dim, o.kv_block_size);
        if (o.kv_budget_bytes > ((int64_t)1 << 30))
            o.kv_budget_bytes = (int64_t)1 << 30;
    }
    struct pp_executor *ex = pp_calloc(PP_MEM_MISC, 1, sizeof(*ex));
    if (!ex)
        return PP_ERR_NOMEM;
    ex->m = m;
    ex->be = be;
    ex->max_rows = o.max_batch_tokens;
    ex->max_context = o.max_context;
    pp_status st = pp_kv_cache_new(n_layers, kv_dim, o.kv_block_size, o.kv_budget_bytes,
                                   o.max_seqs, o.max_context, &ex->kv);
    if (st != PP_OK) {
        pp_executor_free(ex);
        return st;
    }
    int64_t T = ex->max_rows, q_dim = (int64_t)c->n_heads * c->head_dim;
    ex->x = scratch(T * c->dim, sizeof(float));
    ex->xb = scratch(T * c->dim, sizeof(float));
    ex->q = scratch(T * q_dim, sizeof(float));
    ex->k = scratch(T * kv_dim, sizeof(float));
    ex->v = scratch(T * kv_dim, sizeof(float));
    ex->att = scratch(T * q_dim, sizeof(float));
    ex->gate = scratch(T * c->ffn_dim, sizeof(float));
    ex->up = scratch(T * c->ffn_dim, sizeof(float));
    ex->pos = scratch(T, sizeof(int32_t));
    ex->aseqs = scratch(T, sizeof(struct pp_attn_seq));
    ex->want_rows = scratch(T, sizeof(int32_t));
    if (!ex->x || !ex->xb || !ex->q || !ex->k || !ex->v || !ex->att || !ex->gate || !ex->up ||
        !ex->pos || !ex->aseqs || !ex->want_rows) {
        pp_executor_free(ex);
        return pp_error(PP_ERR_NOMEM, "executor: no memory for %lld-row scratch", (long long)T);
    }
    int64_t max_cols = c->dim;
    if (q_dim > max_cols)
        max_cols = q_dim;
    if (c->ffn_dim > max_cols)
        max_cols = c->ffn_dim;
    if (c->n_experts > 0) {
        max_cols = c->expert_ffn_dim > max_cols ? c->expert_ffn_dim : max_cols;
        max_cols = c->shared_ffn_dim > max_cols ? c->shared_ffn_dim : max_cols;
        ex->moe_out = scratch(T * c->dim, sizeof(float));
        ex->expert_tokens = pp_calloc(PP_MEM_MISC, (size_t)n_layers * (size_t)c->n_experts,
                                      sizeof(int64_t));
        if (!ex->moe_out || !ex->expert_tokens)
            st = pp_error(PP_ERR_NOMEM, "executor: no memory for the MoE buffers");
        else
            st = pp_moe_scratch_new(c, T, 0, &ex->moe);
        if (st != PP_OK) {
            pp_executor_free(ex);
            return st;
        }
    }
    if ((st = be->ops->reserve(be, max_cols, o.max_context)) != PP_OK) {
        pp_executor_free(ex);
        return st;
    }
    *out = ex;
    return PP_OK;
}

void pp_executor_free(struct pp_executor *ex)
{
    if (!ex)
        return;
    pp_kv_cache_free(ex->kv);
    float *bufs[] = {ex->x, ex->xb, ex->q, ex->k, ex->v, ex->att, ex->gate, ex->up};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        pp_free(PP_MEM_ACTIVATIONS, bufs[i]);
    pp_free(PP_MEM_ACTIVATIONS, ex->pos);
    pp_free(PP_MEM_ACTIVATIONS, ex->aseqs);
    pp_free(PP_MEM_ACTIVATIONS, ex->want_rows);
    pp_moe_scratch_free(ex->moe);
    pp_free(PP_MEM_ACTIVATIONS, ex->moe_out);
    pp_free(PP_MEM_MISC, ex->expert_tokens);
    pp_free(PP_MEM_MISC, ex);
}

/* Checks the whole batch before anything changes. */
static pp_status validate(struct pp_executor *ex, const struct pp_exec_batch *b, int64_t *n_tokens)
{
    const struct pp_model *m = ex->m;
    if (b->n_seqs < 1 || !b->seqs)
        return pp_error(PP_ERR_INVALID_ARG, "batch: expected at least one sequence");
    if (m->has_embedding ? !b->tokens : !b->hidden)
        return pp_error(PP_ERR_INVALID_ARG, "batch: layer range [%d, %d) needs %s",
                        m->first_layer, m->last_layer,
                        m->has_embedding ? "token ids" : "hidden states");
    int64_t total = 0, blocks = 0, new_seqs = 0;
    for (int32_t i = 0; i < b->n_seqs; i++) {
        const struct pp_exec_seq *s = &b->seqs[i];
        for (int32_t j = 0; j < i; j++)
            if (b->seqs[j].id == s->id)
                return pp_error(PP_ERR_INVALID_ARG, "batch: sequence %llu appears twice",
                                (unsigned long long)s->id);
        if (s->n_tokens < 1 || s->pos < 0)
            return pp_error(PP_ERR_INVALID_ARG,
                            "sequence %llu: expected pos >= 0 and n_tokens >= 1, got pos %d, "
                            "n_tokens %d", (unsigned long long)s->id, s->pos, s->n_tokens);
        if ((int64_t)s->pos + s->n_tokens > ex->max_context)
            return pp_error(PP_ERR_OUT_OF_RANGE,
                            "sequence %llu: positions up to %lld exceed the context length %d",
                            (unsigned long long)s->id, (long long)s->pos + s->n_tokens,
                            ex->max_context);
        struct pp_kv_seq *kv = pp_kv_cache_find(ex->kv, s->id);
        int32_t have = kv ? kv->len : 0;
        if (!kv && s->pos != 0)
            return pp_error(PP_ERR_NOT_FOUND, "sequence %llu is unknown here (pos %d given; a new "
                            "sequence starts at pos 0)", (unsigned long long)s->id, s->pos);
        if (kv && s->pos != have)
            return pp_error(PP_ERR_INVALID_ARG,
                            "sequence %llu: expected pos %d (tokens held), got %d",
                            (unsigned long long)s->id, have, s->pos);
        if (!kv) {
            new_seqs++;
            blocks += (s->n_tokens + ex->kv->view.block_size - 1) / ex->kv->view.block_size;
        } else {
            blocks += pp_kv_cache_blocks_needed(ex->kv, kv, s->pos + s->n_tokens);
        }
        total += s->n_tokens;
    }
    if (m->has_embedding)
        for (int64_t t = 0; t < total; t++)
            if (b->tokens[t] < 0 || b->tokens[t] >= m->cfg.vocab_size)
                return pp_error(PP_ERR_INVALID_ARG, "token id %d at batch row %lld is outside the "
                                "vocabulary [0, %d)", b->tokens[t], (long long)t,
                                m->cfg.vocab_size);
    if (new_seqs > ex->kv->max_seqs - pp_kv_cache_active_seqs(ex->kv))
        return pp_error(PP_ERR_EXHAUSTED, "batch starts %lld sequences, %d slots are free",
                        (long long)new_seqs, ex->kv->max_seqs - pp_kv_cache_active_seqs(ex->kv));
    if (blocks > pp_kv_cache_free_blocks(ex->kv))
        return pp_error(PP_ERR_EXHAUSTED, "batch needs %lld KV blocks, %d are free",
                        (long long)blocks, pp_kv_cache_free_blocks(ex->kv));
    *n_tokens = total;
    return PP_OK;
}

static void run_layer(struct pp_executor *ex, const struct pp_layer_weights *lw, int32_t layer,
                      int64_t T, int32_t n_parts)
{
    const struct pp_model_config *c = &ex->m->cfg;
    struct pp_backend *be = ex->be;
    const struct pp_backend_ops *op = be->ops;
    int64_t q_dim = (int64_t)c->n_heads * c->head_dim, kv_dim = (int64_t)c->n_kv_heads * c->head_dim;

    op->rmsnorm(be, ex->xb, ex->x, lw->attn_norm, T, c->dim, c->norm_eps);
    op->matmul(be, ex->q, ex->xb, &lw->wq, T);
    op->matmul(be, ex->k, ex->xb, &lw->wk, T);
    op->matmul(be, ex->v, ex->xb, &lw->wv, T);
    if (lw->bq)
        op->add_bias(be, ex->q, lw->bq, T, q_dim);
    if (lw->bk)
        op->add_bias(be, ex->k, lw->bk, T, kv_dim);
    if (lw->bv)
        op->add_bias(be, ex->v, lw->bv, T, kv_dim);
    op->rope(be, ex->q, ex->pos, T, c->n_heads, c->head_dim, ex->m->inv_freq, c->rope_layout);
    op->rope(be, ex->k, ex->pos, T, c->n_kv_heads, c->head_dim, ex->m->inv_freq, c->rope_layout);
    op->kv_store(be, &ex->kv->view, layer, ex->aseqs, n_parts, ex->k, ex->v);
    struct pp_attn_shape shape = {c->n_heads, c->n_kv_heads, c->head_dim, c->sliding_window,
                                  1.0f / sqrtf((float)c->head_dim)};
    op->attention(be, ex->att, ex->q, &ex->kv->view, layer, ex->aseqs, n_parts, &shape);
    op->matmul(be, ex->xb, ex->att, &lw->wo, T);
    op->add(be, ex->x, ex->xb, T * c->dim);

    op->rmsnorm(be, ex->xb, ex->x, lw->ffn_norm, T, c->dim, c->norm_eps);
    if (lw->moe) {
        pp_moe_ffn(be, c, lw->moe, ex->xb, T, ex->moe_out, ex->moe,
                   ex->expert_tokens + (int64_t)layer * c->n_experts);
        op->add(be, ex->x, ex->moe_out, T * c->dim);
        return;
    }
    op->matmul(be, ex->gate, ex->xb, &lw->w_gate, T);
    op->matmul(be, ex->up, ex->xb, &lw->w_up, T);
    op->swiglu(be, ex->gate, ex->gate, ex->up, T * c->ffn_dim);
    op->matmul(be, ex->xb, ex->gate, &lw->w_down, T);
    op->add(be, ex->x, ex->xb, T * c->dim);
}

/* Runs rows [r0, r0 + T) of the batch through every layer of the range. `parts` holds, for each
 * window part, the sequence's KV entry. logit_index counts the logit rows written so far. */
static void run_window(struct pp_executor *ex, const struct pp_exec_batch *b,
                       struct pp_kv_seq **kvs, int64_t r0, int64_t T, float *hidden_out,
                       float *logits_out, int64_t *logit_index)
{
    const struct pp_model *m = ex->m;
    const struct pp_model_config *c = &m->cfg;
    struct pp_backend *be = ex->be;

    /* the parts of the batch's sequences that fall inside this window */
    int32_t n_parts = 0, n_want = 0;
    int64_t row = 0;
    for (int32_t i = 0; i < b->n_seqs; i++) {
        const struct pp_exec_seq *s = &b->seqs[i];
        int64_t s0 = row, s1 = row + s->n_tokens;
        row = s1;
        int64_t a = s0 > r0 ? s0 : r0, z = s1 < r0 + T ? s1 : r0 + T;
        if (a >= z)
            continue;
        struct pp_attn_seq *p = &ex->aseqs[n_parts++];
        p->row = (int32_t)(a - r0);
        p->n_tokens = (int32_t)(z - a);
        p->pos = s->pos + (int32_t)(a - s0);
        p->block_table = kvs[i]->blocks;
        for (int32_t t = 0; t < p->n_tokens; t++)
            ex->pos[p->row + t] = p->pos + t;
        if (s->want_logits && z == s1)
            ex->want_rows[n_want++] = (int32_t)(z - 1 - r0);
    }

    if (m->has_embedding)
        be->ops->embed(be, ex->x, &m->embedding, b->tokens + r0, T);
    else
        memcpy(ex->x, b->hidden + r0 * c->dim, (size_t)(T * c->dim) * sizeof(float));

    for (int32_t l = 0; l < m->last_layer - m->first_layer; l++)
        run_layer(ex, &m->layers[l], l, T, n_parts);

    if (!m->has_head) {
        memcpy(hidden_out + r0 * c->dim, ex->x, (size_t)(T * c->dim) * sizeof(float));
        return;
    }
    if (n_want == 0)
        return;
    /* gather the rows that want logits, normalise them, project to the vocabulary */
    for (int32_t i = 0; i < n_want; i++)
        memcpy(ex->xb + (int64_t)i * c->dim, ex->x + (int64_t)ex->want_rows[i] * c->dim,
               (size_t)c->dim * sizeof(float));
    be->ops->rmsnorm(be, ex->xb, ex->xb, m->final_norm, n_want, c->dim, c->norm_eps);
    be->ops->matmul(be, logits_out + *logit_index * c->vocab_size, ex->xb, &m->lm_head, n_want);
    *logit_index += n_want;
}

pp_status pp_executor_forward(struct pp_executor *ex, const struct pp_exec_batch *b,
                              float *hidden_out, float *logits_out)
{
    int64_t n_tokens;
    pp_status st = validate(ex, b, &n_tokens);
    if (st != PP_OK)
        return st;
    if (ex->m->has_head ? !logits_out : !hidden_out)
        return pp_error(PP_ERR_INVALID_ARG, "executor: no output buffer for %s",
                        ex->m->has_head ? "logits" : "hidden states");
    struct pp_kv_seq *kvs_stack[64];
    struct pp_kv_seq **kvs = kvs_stack;
    if (b->n_seqs > 64 && !(kvs = pp_alloc(PP_MEM_MISC, (size_t)b->n_seqs * sizeof(*kvs))))
        return PP_ERR_NOMEM;
    /* validated above: creation and reservation cannot fail from here on */
    for (int32_t i = 0; i < b->n_seqs; i++) {
        const struct pp_exec_seq *s = &b->seqs[i];
        kvs[i] = pp_kv_cache_find(ex->kv, s->id);
        if (!kvs[i])
            pp_kv_cache_create(ex->kv, s->id, &kvs[i]);
        pp_kv_cache_reserve(ex->kv, kvs[i], s->pos + s->n_tokens);
    }
    int64_t logit_index = 0;
    for (int64_t r0 = 0; r0 < n_tokens; r0 += ex->max_rows) {
        int64_t T = n_tokens - r0 < ex->max_rows ? n_tokens - r0 : ex->max_rows;
        run_window(ex, b, kvs, r0, T, hidden_out, logits_out, &logit_index);
    }
    for (int32_t i = 0; i < b->n_seqs; i++)
        kvs[i]->len = b->seqs[i].pos + b->seqs[i].n_tokens;
    if (kvs != kvs_stack)
        pp_free(PP_MEM_MISC, kvs);
    return PP_OK;
}

int pp_executor_release(struct pp_executor *ex, uint64_t id)
{
    return pp_kv_cache_release(ex->kv, id);
}

int32_t pp_executor_seq_len(struct pp_executor *ex, uint64_t id)
{
    struct pp_kv_seq *s = pp_kv_cache_find(ex->kv, id);
    return s ? s->len : -1;
}

const struct pp_kv_cache *pp_executor_kv(const struct pp_executor *ex)
{
    return ex->kv;
}

int32_t pp_executor_max_context(const struct pp_executor *ex)
{
    return ex->max_context;
}

const struct pp_model *pp_executor_model(const struct pp_executor *ex)
{
    return ex->m;
}

const int64_t *pp_executor_expert_tokens(const struct pp_executor *ex, int32_t layer)
{
    const struct pp_model *m = ex->m;
    if (!ex->expert_tokens || layer < 0 || layer >= m->last_layer - m->first_layer ||
        !m->layers[layer].moe)
        return NULL;
    return ex->expert_tokens + (int64_t)layer * m->cfg.n_experts;
}
