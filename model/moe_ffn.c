/* The MoE FFN: the router as one backend matmul, routing by the backend's moe_route (plain f32 C on
 * the CPU), the per-expert token lists built on the host, the experts through backend matmuls over
 * gathered token rows, and a scatter-add in a fixed per-token order. Every tensor is backend
 * memory; only the routing results and the lists live on the host. */
#include "model/moe_ffn.h"

#include <assert.h>
#include <math.h>
#include <string.h>

#include "common/alloc.h"

struct pp_moe_scratch {
    struct pp_backend *be; /* whose memory the tensors below are in */
    int64_t max_rows;
    int32_t max_ffn_rows;
    int32_t n_experts; /* total */
    int32_t k;
    /* backend memory */
    float *logits;     /* [max_rows, n_experts] router output (routing may overwrite it) */
    int32_t *pick_be;  /* [max_rows, k] chosen expert ids, increasing per token */
    float *weight_be;  /* [max_rows, k] their routing weights */
    float *xg;         /* [max_rows, dim] gathered inputs of one expert */
    float *g;          /* [max_rows, max_ffn_rows] gate, then swiglu */
    float *u;          /* [max_rows, max_ffn_rows] up */
    float *y;          /* [max_rows, dim] one expert's (or the shared expert's) outputs */
    float *shared_w;   /* [max_rows] the shared expert's gate logits */
    /* host memory (the same buffers as pick_be / weight_be when the backend's memory is host) */
    int32_t *pick;     /* [max_rows, k] */
    float *weight;     /* [max_rows, k] */
    int32_t *count;    /* [n_experts] tokens routed to each expert in this call */
    int32_t *start;    /* [n_experts + 1] offsets of each expert's list in rows */
    int32_t *rows;     /* [max_rows * k] token indices, grouped by expert, increasing in each */
    float *rows_w;     /* [max_rows * k] the routing weight of each entry of rows */
};

/* The backend buffers of s, in one table for allocation and release. */
#define BE_BUFS(s)                                                                                 \
    {                                                                                              \
        (void **)&(s)->logits, (void **)&(s)->pick_be, (void **)&(s)->weight_be,                   \
            (void **)&(s)->xg, (void **)&(s)->g, (void **)&(s)->u, (void **)&(s)->y,               \
            (void **)&(s)->shared_w                                                                \
    }

pp_status pp_moe_scratch_new(struct pp_backend *be, const struct pp_model_config *c,
                             int64_t max_rows, int32_t max_ffn_rows, struct pp_moe_scratch **out)
{
    if (c->n_experts < 1 || c->n_experts_used < 1 || c->n_experts_used > c->n_experts ||
        max_rows < 1)
        return pp_error(PP_ERR_INVALID_ARG, "moe scratch: expected n_experts >= 1, 1 <= k <= "
                        "n_experts and max_rows >= 1, got %d, %d, %lld", c->n_experts,
                        c->n_experts_used, (long long)max_rows);
    if (max_ffn_rows <= 0)
        max_ffn_rows = c->expert_ffn_dim > c->shared_ffn_dim ? c->expert_ffn_dim
                                                             : c->shared_ffn_dim;
    struct pp_moe_scratch *s = pp_calloc(PP_MEM_MISC, 1, sizeof(*s));
    if (!s)
        return PP_ERR_NOMEM;
    int64_t n = c->n_experts, k = c->n_experts_used, T = max_rows;
    s->be = be;
    s->max_rows = T;
    s->max_ffn_rows = max_ffn_rows;
    s->n_experts = c->n_experts;
    s->k = c->n_experts_used;
    void **bufs[] = BE_BUFS(s);
    int64_t bytes[] = {T * n * 4, T * k * 4, T * k * 4, T * c->dim * 4, T * max_ffn_rows * 4,
                       T * max_ffn_rows * 4, T * c->dim * 4, T * 4};
    pp_status st = PP_OK;
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]) && st == PP_OK; i++)
        st = be->ops->buf_alloc(be, PP_MEM_ACTIVATIONS, bytes[i], bufs[i]);
    if (st != PP_OK) {
        pp_moe_scratch_free(s);
        return st;
    }
    s->pick = be->host_memory ? s->pick_be
                              : pp_alloc_aligned(PP_MEM_ACTIVATIONS, (size_t)(T * k) * 4);
    s->weight = be->host_memory ? s->weight_be
                                : pp_alloc_aligned(PP_MEM_ACTIVATIONS, (size_t)(T * k) * 4);
    s->count = pp_alloc_aligned(PP_MEM_ACTIVATIONS, (size_t)n * sizeof(int32_t));
    s->start = pp_alloc_aligned(PP_MEM_ACTIVATIONS, (size_t)(n + 1) * sizeof(int32_t));
    s->rows = pp_alloc_aligned(PP_MEM_ACTIVATIONS, (size_t)(T * k) * sizeof(int32_t));
    s->rows_w = pp_alloc_aligned(PP_MEM_ACTIVATIONS, (size_t)(T * k) * sizeof(float));
    if (!s->pick || !s->weight || !s->count || !s->start || !s->rows || !s->rows_w) {
        pp_moe_scratch_free(s);
        return pp_error(PP_ERR_NOMEM, "moe scratch: no memory for %lld rows of %d experts",
                        (long long)T, c->n_experts);
    }
    *out = s;
    return PP_OK;
}

void pp_moe_scratch_free(struct pp_moe_scratch *s)
{
    if (!s)
        return;
    if (!s->be->host_memory) {
        pp_free(PP_MEM_ACTIVATIONS, s->pick);
        pp_free(PP_MEM_ACTIVATIONS, s->weight);
    }
    void *host[] = {s->count, s->start, s->rows, s->rows_w};
    for (size_t i = 0; i < sizeof(host) / sizeof(host[0]); i++)
        pp_free(PP_MEM_ACTIVATIONS, host[i]);
    void **bufs[] = BE_BUFS(s);
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        s->be->ops->buf_free(s->be, PP_MEM_ACTIVATIONS, *bufs[i]);
    pp_free(PP_MEM_MISC, s);
}

/* Router, top-k, and the per-expert token lists (tokens in increasing order within each). */
static pp_status dispatch(struct pp_backend *be, const struct pp_model_config *c,
                          const struct pp_moe_weights *mw, const float *x, int64_t T,
                          struct pp_moe_scratch *s)
{
    int32_t n = c->n_experts, k = c->n_experts_used;
    be->ops->matmul(be, s->logits, x, &mw->router, T);
    be->ops->moe_route(be, s->pick_be, s->weight_be, s->logits, T, n, k,
                       c->moe_gating == PP_MOE_TOPK_SOFTMAX ? PP_ROUTE_TOPK_SOFTMAX
                                                            : PP_ROUTE_SOFTMAX_TOPK,
                       c->norm_topk_prob);
    pp_status st;
    if (!be->host_memory &&
        ((st = be->ops->copy_out(be, s->pick, s->pick_be, T * k * 4)) != PP_OK ||
         (st = be->ops->copy_out(be, s->weight, s->weight_be, T * k * 4)) != PP_OK))
        return st;
    memset(s->count, 0, (size_t)n * sizeof(int32_t));
    for (int64_t t = 0; t < T; t++)
        for (int32_t j = 0; j < k; j++) {
            int32_t e = s->pick[t * k + j];
            if (e < 0 || e >= n)
                return pp_error(PP_ERR_INTERNAL, "moe routing: token %lld picked expert %d of %d",
                                (long long)t, e, n);
            s->count[e]++;
        }
    s->start[0] = 0;
    for (int32_t e = 0; e < n; e++)
        s->start[e + 1] = s->start[e] + s->count[e];
    memset(s->count, 0, (size_t)n * sizeof(int32_t));
    for (int64_t t = 0; t < T; t++)
        for (int32_t j = 0; j < k; j++) {
            int32_t e = s->pick[t * k + j], at = s->start[e] + s->count[e]++;
            s->rows[at] = (int32_t)t;
            s->rows_w[at] = s->weight[t * k + j];
        }
    return PP_OK;
}

/* y[n, dim] = down(swiglu(gate x, up x)) for gathered rows xg[n, dim]. */
static void expert(struct pp_backend *be, struct pp_moe_scratch *s, const struct pp_weight *gate,
                   const struct pp_weight *up, const struct pp_weight *down, const float *xg,
                   int64_t n)
{
    assert(gate->rows <= s->max_ffn_rows && up->rows == gate->rows && down->cols == gate->rows);
    be->ops->matmul(be, s->g, xg, gate, n);
    be->ops->matmul(be, s->u, xg, up, n);
    be->ops->swiglu(be, s->g, s->g, s->u, n * gate->rows);
    be->ops->matmul(be, s->y, s->g, down, n);
}

pp_status pp_moe_ffn(struct pp_backend *be, const struct pp_model_config *c,
                     const struct pp_moe_weights *mw, const float *x, int64_t T, float *out,
                     struct pp_moe_scratch *s, int64_t *expert_tokens)
{
    assert(T <= s->max_rows && c->n_experts == s->n_experts && out != x && be == s->be);
    int64_t dim = c->dim;
    pp_status st = dispatch(be, c, mw, x, T, s);
    if (st != PP_OK)
        return st;
    if (expert_tokens)
        for (int32_t e = 0; e < c->n_experts; e++)
            expert_tokens[e] += s->count[e];
    be->ops->zero(be, out, T * dim * (int64_t)sizeof(float));
    /* experts in increasing id: each token's sum gets its experts in that order */
    for (int32_t h = 0; h < mw->n_experts; h++) {
        int32_t e = mw->expert_base + h, n = s->count[e];
        if (n == 0)
            continue;
        const int32_t *rows = s->rows + s->start[e];
        be->ops->gather_rows(be, s->xg, x, rows, n, dim);
        expert(be, s, &mw->gate[h], &mw->up[h], &mw->down[h], s->xg, n);
        be->ops->scatter_add_rows(be, out, s->y, rows, s->rows_w + s->start[e], n, dim);
    }
    if (!mw->shared_gate.data)
        return PP_OK;
    struct pp_weight gate_inp = {mw->shared_gate_inp, PP_DTYPE_F32, 1, dim};
    be->ops->matmul(be, s->shared_w, x, &gate_inp, T);
    expert(be, s, &mw->shared_gate, &mw->shared_up, &mw->shared_down, x, T);
    be->ops->add_gated(be, out, s->y, s->shared_w, T, dim);
    return PP_OK;
}
