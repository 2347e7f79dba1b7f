/* One worker's pass over a window of rows. With one worker this is the whole forward pass; with W
 * workers each computes its heads and FFN rows, and an all-reduce after the attention output and
 * after the FFN down projection completes the sums that every worker then adds to its copy of the
 * residual stream. The LM head is split by vocabulary rows: each worker writes its columns of the
 * logits. */
#include <math.h>
#include <string.h>

#include "model/executor-impl.h"

static void all_reduce(struct pp_executor *ex, struct pp_exec_worker *w, float *buf, int64_t n)
{
    if (ex->n_workers == 1)
        return;
    pp_status st = ex->comm->ops->all_reduce_sum(ex->comm, w->rank, buf, n);
    if (st != PP_OK && w->status == PP_OK)
        w->status = st;
}

static void run_layer(struct pp_executor *ex, struct pp_exec_worker *w,
                      const struct pp_layer_weights *lw, int32_t layer)
{
    const struct pp_model_config *c = &ex->m->cfg;
    const struct pp_shard *s = w->shard;
    struct pp_backend *be = w->be;
    const struct pp_backend_ops *op = be->ops;
    int64_t T = ex->rows;
    int64_t q_dim = (int64_t)s->n_heads * c->head_dim;
    int64_t kv_dim = (int64_t)s->n_kv_heads * c->head_dim;

    op->rmsnorm(be, w->xb, w->x, lw->attn_norm, T, c->dim, c->norm_eps);
    op->matmul(be, w->q, w->xb, &lw->wq, T);
    op->matmul(be, w->k, w->xb, &lw->wk, T);
    op->matmul(be, w->v, w->xb, &lw->wv, T);
    if (lw->bq)
        op->add_bias(be, w->q, lw->bq, T, q_dim);
    if (lw->bk)
        op->add_bias(be, w->k, lw->bk, T, kv_dim);
    if (lw->bv)
        op->add_bias(be, w->v, lw->bv, T, kv_dim);
    op->rope(be, w->q, ex->pos, T, s->n_heads, c->head_dim, ex->m->inv_freq, c->rope_layout);
    op->rope(be, w->k, ex->pos, T, s->n_kv_heads, c->head_dim, ex->m->inv_freq, c->rope_layout);
    op->kv_store(be, &w->kv, layer, ex->aseqs, ex->n_parts, w->k, w->v);
    struct pp_attn_shape shape = {s->n_heads, s->n_kv_heads, c->head_dim, c->sliding_window,
                                  1.0f / sqrtf((float)c->head_dim)};
    op->attention(be, w->att, w->q, &w->kv, layer, ex->aseqs, ex->n_parts, &shape);
    op->matmul(be, w->xb, w->att, &lw->wo, T);
    all_reduce(ex, w, w->xb, T * c->dim);
    op->add(be, w->x, w->xb, T * c->dim);

    op->rmsnorm(be, w->xb, w->x, lw->ffn_norm, T, c->dim, c->norm_eps);
    if (lw->moe) {
        int64_t *counts = w->rank == 0 ? ex->expert_tokens + (int64_t)layer * c->n_experts : NULL;
        pp_moe_ffn(be, c, lw->moe, w->xb, T, w->moe_out, w->moe, counts);
        all_reduce(ex, w, w->moe_out, T * c->dim);
        op->add(be, w->x, w->moe_out, T * c->dim);
        return;
    }
    op->matmul(be, w->gate, w->xb, &lw->w_gate, T);
    op->matmul(be, w->up, w->xb, &lw->w_up, T);
    op->swiglu(be, w->gate, w->gate, w->up, T * s->ffn_dim);
    op->matmul(be, w->xb, w->gate, &lw->w_down, T);
    all_reduce(ex, w, w->xb, T * c->dim);
    op->add(be, w->x, w->xb, T * c->dim);
}

/* The rows that want logits, normalised and projected onto this worker's vocabulary rows. */
static void run_head(struct pp_executor *ex, struct pp_exec_worker *w, float *logits_out)
{
    const struct pp_model *m = ex->m;
    const struct pp_model_config *c = &m->cfg;
    const struct pp_shard *s = w->shard;
    struct pp_backend *be = w->be;
    int32_t step = ex->n_workers == 1 ? ex->n_want : PP_EXEC_HEAD_ROWS;
    for (int32_t i0 = 0; i0 < ex->n_want; i0 += step) {
        int32_t n = ex->n_want - i0 < step ? ex->n_want - i0 : step;
        for (int32_t i = 0; i < n; i++)
            memcpy(w->xb + (int64_t)i * c->dim, w->x + (int64_t)ex->want_rows[i0 + i] * c->dim,
                   (size_t)c->dim * sizeof(float));
        be->ops->rmsnorm(be, w->xb, w->xb, m->final_norm, n, c->dim, c->norm_eps);
        float *out = logits_out + (int64_t)i0 * c->vocab_size;
        if (ex->n_workers == 1) {
            be->ops->matmul(be, out, w->xb, &s->lm_head, n);
            continue;
        }
        be->ops->matmul(be, w->logits, w->xb, &s->lm_head, n);
        for (int32_t i = 0; i < n; i++)
            memcpy(out + (int64_t)i * c->vocab_size + s->vocab0,
                   w->logits + (int64_t)i * s->n_vocab, (size_t)s->n_vocab * sizeof(float));
    }
}

void pp__exec_worker_run(struct pp_executor *ex, struct pp_exec_worker *w)
{
    const struct pp_model *m = ex->m;
    const struct pp_model_config *c = &m->cfg;
    const struct pp_exec_batch *b = ex->batch;
    int64_t T = ex->rows, r0 = ex->r0;
    if (m->has_embedding)
        w->be->ops->embed(w->be, w->x, &m->embedding, b->tokens + r0, T);
    else
        memcpy(w->x, b->hidden + r0 * c->dim, (size_t)(T * c->dim) * sizeof(float));

    for (int32_t l = 0; l < m->last_layer - m->first_layer; l++)
        run_layer(ex, w, &w->shard->layers[l], l);

    if (!m->has_head) {
        if (w->rank == 0)
            memcpy(ex->hidden_out + r0 * c->dim, w->x, (size_t)(T * c->dim) * sizeof(float));
        return;
    }
    if (ex->n_want > 0)
        run_head(ex, w, ex->logits_out);
}
