/* One worker's pass over a window of rows. With one worker this is the whole forward pass; with W
 * workers each computes its heads and FFN rows, and an all-reduce after the attention output and
 * after the FFN down projection completes the sums that every worker then adds to its copy of the
 * residual stream. The LM head is split by vocabulary rows: each worker writes its columns of the
 * logits. */
#include <math.h>
#include <string.h>

#include "model/executor-impl.h"

static void fail(struct pp_exec_worker *w, pp_status st)
{
    if (st != PP_OK && w->status == PP_OK)
        w->status = st;
}

static void all_reduce(struct pp_executor *ex, struct pp_exec_worker *w, float *buf, int64_t n)
{
    if (ex->n_workers == 1)
        return;
    /* a device backend's queued ops must have written buf before the communicator reads it (its
     * calls return complete, so nothing is needed after) */
    if (!w->be->host_memory)
        fail(w, w->be->ops->sync(w->be));
    fail(w, ex->comm->ops->all_reduce_sum(ex->comm, w->rank, buf, n));
}

static void run_layer(struct pp_executor *ex, struct pp_exec_worker *w,
                      const struct pp_layer_weights *lw, int32_t layer)
{
    const float *inv_freq = w->wt.inv_freq;
    const struct pp_model_config *c = &ex->m->cfg;
    const struct pp_shard *s = w->shard;
    struct pp_backend *be = w->be;
    const struct pp_backend_ops *op = be->ops;
    int64_t T = ex->rows;
    int64_t q_dim = (int64_t)s->n_heads * c->head_dim;
    int64_t kv_dim = (int64_t)s->n_kv_heads * c->head_dim;

    op->rmsnorm(be, w->xb, w->x, lw->attn_norm, T, c->dim, c->norm_eps);
    float *qkv[3] = {w->q, w->k, w->v};
    const struct pp_weight *wqkv[3] = {&lw->wq, &lw->wk, &lw->wv};
    op->matmul_many(be, 3, qkv, w->xb, wqkv, T);
    if (lw->bq)
        op->add_bias(be, w->q, lw->bq, T, q_dim);
    if (lw->bk)
        op->add_bias(be, w->k, lw->bk, T, kv_dim);
    if (lw->bv)
        op->add_bias(be, w->v, lw->bv, T, kv_dim);
    op->rope(be, w->q, ex->pos, T, s->n_heads, c->head_dim, inv_freq, c->rope_layout);
    op->rope(be, w->k, ex->pos, T, s->n_kv_heads, c->head_dim, inv_freq, c->rope_layout);
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
        fail(w, pp_moe_ffn(be, c, lw->moe, w->xb, T, w->moe_out, w->moe, counts));
        all_reduce(ex, w, w->moe_out, T * c->dim);
        op->add(be, w->x, w->moe_out, T * c->dim);
        return;
    }
    float *gate_up[2] = {w->gate, w->up};
    const struct pp_weight *wgu[2] = {&lw->w_gate, &lw->w_up};
    op->matmul_many(be, 2, gate_up, w->xb, wgu, T);
    op->swiglu(be, w->gate, w->gate, w->up, T * s->ffn_dim);
    op->matmul(be, w->xb, w->gate, &lw->w_down, T);
    all_reduce(ex, w, w->xb, T * c->dim);
    op->add(be, w->x, w->xb, T * c->dim);
}

/* The rows that want logits, normalised and projected onto this worker's vocabulary rows. On the
 * CPU with one worker the logits are written in place; otherwise they pass through the worker's
 * [PP_EXEC_HEAD_ROWS, n_vocab] scratch and are copied into the caller's rows. */
static void run_head(struct pp_executor *ex, struct pp_exec_worker *w, float *logits_out)
{
    const struct pp_model_config *c = &ex->m->cfg;
    const struct pp_shard *s = w->shard;
    struct pp_backend *be = w->be;
    int direct = ex->n_workers == 1 && be->host_memory;
    int32_t step = direct ? ex->n_want : PP_EXEC_HEAD_ROWS;
    for (int32_t i0 = 0; i0 < ex->n_want; i0 += step) {
        int32_t n = ex->n_want - i0 < step ? ex->n_want - i0 : step;
        be->ops->gather_rows(be, w->xb, w->x, ex->want_rows + i0, n, c->dim);
        be->ops->rmsnorm(be, w->xb, w->xb, w->wt.final_norm, n, c->dim, c->norm_eps);
        float *out = logits_out + (int64_t)i0 * c->vocab_size;
        if (direct) {
            be->ops->matmul(be, out, w->xb, &w->wt.lm_head, n);
            continue;
        }
        be->ops->matmul(be, w->logits, w->xb, &w->wt.lm_head, n);
        if (s->n_vocab == c->vocab_size) {
            fail(w, be->ops->copy_out(be, out, w->logits,
                                      (int64_t)n * s->n_vocab * (int64_t)sizeof(float)));
            continue;
        }
        for (int32_t i = 0; i < n; i++)
            fail(w, be->ops->copy_out(be, out + (int64_t)i * c->vocab_size + s->vocab0,
                                      w->logits + (int64_t)i * s->n_vocab,
                                      (int64_t)s->n_vocab * (int64_t)sizeof(float)));
    }
}

void pp__exec_worker_run(struct pp_executor *ex, struct pp_exec_worker *w)
{
    const struct pp_model *m = ex->m;
    const struct pp_model_config *c = &m->cfg;
    const struct pp_exec_batch *b = ex->batch;
    struct pp_backend *be = w->be;
    int64_t T = ex->rows, r0 = ex->r0;
    int64_t row_bytes = c->dim * (int64_t)sizeof(float);
    if (m->has_embedding)
        be->ops->embed(be, w->x, &w->wt.embedding, b->tokens + r0, T);
    else
        be->ops->copy_in(be, w->x, b->hidden + r0 * c->dim, T * row_bytes);

    for (int32_t l = 0; l < m->last_layer - m->first_layer; l++)
        run_layer(ex, w, &w->wt.layers[l], l);

    if (!m->has_head) {
        if (w->rank == 0)
            fail(w, be->ops->copy_out(be, ex->hidden_out + r0 * c->dim, w->x, T * row_bytes));
    } else if (ex->n_want > 0) {
        run_head(ex, w, ex->logits_out);
    }
    fail(w, be->ops->sync(be));
}
