/* The MoE FFN: routing in plain f32 C (softmax with expf, top-k by repeated maximum), the experts
 * through backend matmuls over gathered token rows, and a scatter-add in a fixed per-token
 * order. */
#include "model/moe_ffn.h"

#include <assert.h>
#include <math.h>
#include <string.h>

#include "common/alloc.h"

struct pp_moe_scratch {
    int64_t max_rows;
    int32_t max_ffn_rows;
    int32_t n_experts; /* total */
    int32_t k;
    float *logits;     /* [max_rows, n_experts] router output, then probabilities */
    int32_t *pick;     /* [max_rows, k] chosen expert ids, increasing per token */
    float *weight;     /* [max_rows, k] their routing weights */
    int32_t *count;    /* [n_experts] tokens routed to each expert in this call */
    int32_t *start;    /* [n_experts + 1] offsets of each expert's list in rows */
    int32_t *rows;     /* [max_rows * k] token indices, grouped by expert, increasing in each */
    float *rows_w;     /* [max_rows * k] the routing weight of each entry of rows */
    float *xg;         /* [max_rows, dim] gathered inputs of one expert */
    float *g;          /* [max_rows, max_ffn_rows] gate, then swiglu */
    float *u;          /* [max_rows, max_ffn_rows] up */
    float *y;          /* [max_rows, dim] one expert's (or the shared expert's) outputs */
    float *shared_w;   /* [max_rows] the shared expert's gate logits */
};

pp_status pp_moe_scratch_new(const struct pp_model_config *c, int64_t max_rows,
                             int32_t max_ffn_rows, struct pp_moe_scratch **out)
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
    s->max_rows = T;
    s->max_ffn_rows = max_ffn_rows;
    s->n_experts = c->n_experts;
    s->k = c->n_experts_used;
    s->logits = pp_alloc_aligned(PP_MEM_ACTIVATIONS, (size_t)(T * n) * sizeof(float));
    s->pick = pp_alloc_aligned(PP_MEM_ACTIVATIONS, (size_t)(T * k) * sizeof(int32_t));
    s->weight = pp_alloc_aligned(PP_MEM_ACTIVATIONS, (size_t)(T * k) * sizeof(float));
    s->count = pp_alloc_aligned(PP_MEM_ACTIVATIONS, (size_t)n * sizeof(int32_t));
    s->start = pp_alloc_aligned(PP_MEM_ACTIVATIONS, (size_t)(n + 1) * sizeof(int32_t));
    s->rows = pp_alloc_aligned(PP_MEM_ACTIVATIONS, (size_t)(T * k) * sizeof(int32_t));
    s->rows_w = pp_alloc_aligned(PP_MEM_ACTIVATIONS, (size_t)(T * k) * sizeof(float));
    s->xg = pp_alloc_aligned(PP_MEM_ACTIVATIONS, (size_t)(T * c->dim) * sizeof(float));
    s->g = pp_alloc_aligned(PP_MEM_ACTIVATIONS, (size_t)(T * max_ffn_rows) * sizeof(float));
    s->u = pp_alloc_aligned(PP_MEM_ACTIVATIONS, (size_t)(T * max_ffn_rows) * sizeof(float));
    s->y = pp_alloc_aligned(PP_MEM_ACTIVATIONS, (size_t)(T * c->dim) * sizeof(float));
    s->shared_w = pp_alloc_aligned(PP_MEM_ACTIVATIONS, (size_t)T * sizeof(float));
    if (!s->logits || !s->pick || !s->weight || !s->count || !s->start || !s->rows ||
        !s->rows_w || !s->xg || !s->g || !s->u || !s->y || !s->shared_w) {
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
    void *bufs[] = {s->logits, s->pick, s->weight, s->count, s->start, s->rows,
                    s->rows_w, s->xg,   s->g,      s->u,     s->y,     s->shared_w};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        pp_free(PP_MEM_ACTIVATIONS, bufs[i]);
    pp_free(PP_MEM_MISC, s);
}

/* In place: p[n] = softmax(p), in index order. */
static void softmax(float *p, int32_t n)
{
    float max = p[0];
    for (int32_t i = 1; i < n; i++)
        max = p[i] > max ? p[i] : max;
    float sum = 0.0f;
    for (int32_t i = 0; i < n; i++) {
        p[i] = expf(p[i] - max);
        sum += p[i];
    }
    for (int32_t i = 0; i < n; i++)
        p[i] /= sum;
}

/* pick[k] = the k largest of v[n] in decreasing order, ties to the lower index. */
static void top_k(const float *v, int32_t n, int32_t k, int32_t *pick)
{
    for (int32_t j = 0; j < k; j++) {
        int32_t best = -1;
        for (int32_t i = 0; i < n; i++) {
            int taken = 0;
            for (int32_t q = 0; q < j && !taken; q++)
                taken = pick[q] == i;
            if (!taken && (best < 0 || v[i] > v[best]))
                best = i;
        }
        pick[j] = best;
    }
}

/* One token's experts and weights from its router logits (overwritten). */
static void route(const struct pp_model_config *c, float *logits, int32_t *pick, float *weight)
{
    int32_t n = c->n_experts, k = c->n_experts_used;
    if (c->moe_gating == PP_MOE_TOPK_SOFTMAX) {
        top_k(logits, n, k, pick);
        for (int32_t j = 0; j < k; j++)
            weight[j] = logits[pick[j]];
        softmax(weight, k);
    } else {
        softmax(logits, n);
        top_k(logits, n, k, pick);
        float sum = 0.0f;
        for (int32_t j = 0; j < k; j++) {
            weight[j] = logits[pick[j]];
            sum += weight[j];
        }
        if (c->norm_topk_prob)
            for (int32_t j = 0; j < k; j++)
                weight[j] /= sum;
    }
    /* increasing expert id: the order of the token's sum */
    for (int32_t a = 1; a < k; a++)
        for (int32_t b = a; b > 0 && pick[b - 1] > pick[b]; b--) {
            int32_t ti = pick[b];
            pick[b] = pick[b - 1];
            pick[b - 1] = ti;
            float tw = weight[b];
            weight[b] = weight[b - 1];
            weight[b - 1] = tw;
        }
}

/* Router, top-k, and the per-expert token lists (tokens in increasing order within each). */
static void dispatch(struct pp_backend *be, const struct pp_model_config *c,
                     const struct pp_moe_weights *mw, const float *x, int64_t T,
                     struct pp_moe_scratch *s)
{
    int32_t n = c->n_experts, k = c->n_experts_used;
    be->ops->matmul(be, s->logits, x, &mw->router, T);
    memset(s->count, 0, (size_t)n * sizeof(int32_t));
    for (int64_t t = 0; t < T; t++) {
        route(c, s->logits + t * n, s->pick + t * k, s->weight + t * k);
        for (int32_t j = 0; j < k; j++)
            s->count[s->pick[t * k + j]]++;
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

void pp_moe_ffn(struct pp_backend *be, const struct pp_model_config *c,
                const struct pp_moe_weights *mw, const float *x, int64_t T, float *out,
                struct pp_moe_scratch *s, int64_t *expert_tokens)
{
    assert(T <= s->max_rows && c->n_experts == s->n_experts && out != x);
    int64_t dim = c->dim;
    dispatch(be, c, mw, x, T, s);
    if (expert_tokens)
        for (int32_t e = 0; e < c->n_experts; e++)
            expert_tokens[e] += s->count[e];
    memset(out, 0, (size_t)(T * dim) * sizeof(float));
    /* experts in increasing id: each token's sum gets its experts in that order */
    for (int32_t h = 0; h < mw->n_experts; h++) {
        int32_t e = mw->expert_base + h, n = s->count[e];
        if (n == 0)
            continue;
        const int32_t *rows = s->rows + s->start[e];
        const float *w = s->rows_w + s->start[e];
        for (int32_t r = 0; r < n; r++)
            memcpy(s->xg + r * dim, x + rows[r] * dim, (size_t)dim * sizeof(float));
        expert(be, s, &mw->gate[h], &mw->up[h], &mw->down[h], s->xg, n);
        for (int32_t r = 0; r < n; r++) {
            float *o = out + rows[r] * dim;
            const float *y = s->y + r * dim;
            for (int64_t i = 0; i < dim; i++)
                o[i] += w[r] * y[i];
        }
    }
    if (!mw->shared_gate.data)
        return;
    struct pp_weight gate_inp = {mw->shared_gate_inp, PP_DTYPE_F32, 1, dim};
    be->ops->matmul(be, s->shared_w, x, &gate_inp, T);
    expert(be, s, &mw->shared_gate, &mw->shared_up, &mw->shared_down, x, T);
    for (int64_t t = 0; t < T; t++) {
        float sig = 1.0f / (1.0f + expf(-s->shared_w[t]));
        float *o = out + t * dim;
        const float *y = s->y + t * dim;
        for (int64_t i = 0; i < dim; i++)
            o[i] += sig * y[i];
    }
}
