/* A worker's weights in its backend's memory. Each loaded tensor starts as a copy of its source
 * (the shard's or the model's) and is replaced by what the backend's weight_load / vec_load hands
 * back; so on release, a tensor whose pointer still equals its source's was never the backend's
 * (a slice the shard repacked, or the mapped file when the CPU backend maps weights), and any
 * other is freed exactly once. A slice the shard repacked is already this process's memory, so a
 * host-memory backend gets it as resident (computed from in place, not copied twice). */
#include <string.h>

#include "common/alloc.h"
#include "model/executor-impl.h"
#include "model/mapped_file.h"

/* One worker's load: its backend, whether the model's tensors are already that backend's memory,
 * and its shard (whose repacked slices are, for a host-memory backend). */
struct loader {
    struct pp_backend *be;
    int resident;
    const struct pp_shard *shard;
};

static pp_status load_weight(const struct loader *ld, const struct pp_weight *src,
                             struct pp_weight *dst)
{
    *dst = *src;
    if (!src->data)
        return PP_OK; /* absent (a MoE layer's dense FFN, no shared expert) */
    int resident = ld->resident || (ld->be->host_memory && pp_shard_owns(ld->shard, src->data));
    pp_status st = ld->be->ops->weight_load(ld->be, src, resident, dst);
    /* copied out of the model file: its pages need not stay in this process's resident set */
    if (st == PP_OK && dst->data != src->data)
        pp_mapped_file_drop_pages(src->data, pp_weight_bytes(src));
    return st;
}

static void free_weight(struct pp_backend *be, const struct pp_weight *src, struct pp_weight *dst)
{
    if (dst->data && dst->data != src->data)
        be->ops->weight_free(be, dst);
    *dst = *src;
}

static pp_status load_vec(const struct loader *ld, const float *src, int64_t n, float **dst)
{
    const float *out = src;
    pp_status st = src ? ld->be->ops->vec_load(ld->be, src, n, ld->resident, &out) : PP_OK;
    *dst = (float *)out; /* the layer struct's fields are not const; the kernels only read them */
    return st;
}

static void free_vec(struct pp_backend *be, const float *src, float **dst)
{
    if (*dst && *dst != src)
        be->ops->vec_free(be, *dst);
    *dst = (float *)src;
}

struct weight_pair {
    const struct pp_weight *src;
    struct pp_weight *dst;
};

/* The 2-D weights of a dense layer, as (source, destination) pairs. */
#define LAYER_WEIGHTS(src, dst)                                                                    \
    {{&(src)->wq, &(dst)->wq}, {&(src)->wk, &(dst)->wk}, {&(src)->wv, &(dst)->wv},                 \
     {&(src)->wo, &(dst)->wo}, {&(src)->w_gate, &(dst)->w_gate}, {&(src)->w_up, &(dst)->w_up},     \
     {&(src)->w_down, &(dst)->w_down}}

static pp_status load_moe(const struct loader *ld, const struct pp_model_config *c,
                          const struct pp_moe_weights *src, struct pp_moe_weights *dst)
{
    *dst = *src;
    dst->gate = dst->up = dst->down = NULL;
    size_t n = (size_t)src->n_experts;
    if (!(dst->gate = pp_alloc(PP_MEM_MISC, n * sizeof(*dst->gate))) ||
        !(dst->up = pp_alloc(PP_MEM_MISC, n * sizeof(*dst->up))) ||
        !(dst->down = pp_alloc(PP_MEM_MISC, n * sizeof(*dst->down))))
        return pp_error(PP_ERR_NOMEM, "executor: no memory for %zu experts' weights", n);
    memcpy(dst->gate, src->gate, n * sizeof(*dst->gate));
    memcpy(dst->up, src->up, n * sizeof(*dst->up));
    memcpy(dst->down, src->down, n * sizeof(*dst->down));
    struct weight_pair ws[] = {{&src->router, &dst->router},
                               {&src->shared_gate, &dst->shared_gate},
                               {&src->shared_up, &dst->shared_up},
                               {&src->shared_down, &dst->shared_down}};
    pp_status st = PP_OK;
    for (size_t i = 0; i < sizeof(ws) / sizeof(ws[0]) && st == PP_OK; i++)
        st = load_weight(ld, ws[i].src, ws[i].dst);
    for (size_t e = 0; e < n && st == PP_OK; e++) {
        struct weight_pair ex[] = {{&src->gate[e], &dst->gate[e]},
                                   {&src->up[e], &dst->up[e]},
                                   {&src->down[e], &dst->down[e]}};
        for (size_t i = 0; i < sizeof(ex) / sizeof(ex[0]) && st == PP_OK; i++)
            st = load_weight(ld, ex[i].src, ex[i].dst);
    }
    if (st == PP_OK)
        st = load_vec(ld, src->shared_gate_inp, c->dim, &dst->shared_gate_inp);
    return st;
}

static void free_moe(struct pp_backend *be, const struct pp_moe_weights *src,
                     struct pp_moe_weights *dst)
{
    free_weight(be, &src->router, &dst->router);
    for (int32_t e = 0; e < src->n_experts; e++) {
        if (dst->gate)
            free_weight(be, &src->gate[e], &dst->gate[e]);
        if (dst->up)
            free_weight(be, &src->up[e], &dst->up[e]);
        if (dst->down)
            free_weight(be, &src->down[e], &dst->down[e]);
    }
    pp_free(PP_MEM_MISC, dst->gate);
    pp_free(PP_MEM_MISC, dst->up);
    pp_free(PP_MEM_MISC, dst->down);
    dst->gate = dst->up = dst->down = NULL;
    free_weight(be, &src->shared_gate, &dst->shared_gate);
    free_weight(be, &src->shared_up, &dst->shared_up);
    free_weight(be, &src->shared_down, &dst->shared_down);
    free_vec(be, src->shared_gate_inp, &dst->shared_gate_inp);
}

static pp_status load_layer(const struct loader *ld, const struct pp_model_config *c,
                            const struct pp_shard *s, const struct pp_layer_weights *src,
                            struct pp_layer_weights *dst, struct pp_moe_weights *moe)
{
    struct weight_pair ws[] = LAYER_WEIGHTS(src, dst);
    pp_status st = PP_OK;
    for (size_t i = 0; i < sizeof(ws) / sizeof(ws[0]) && st == PP_OK; i++)
        st = load_weight(ld, ws[i].src, ws[i].dst);
    int64_t q_dim = (int64_t)s->n_heads * c->head_dim,
            kv_dim = (int64_t)s->n_kv_heads * c->head_dim;
    if (st == PP_OK && (st = load_vec(ld, src->attn_norm, c->dim, &dst->attn_norm)) ==
                           PP_OK &&
        (st = load_vec(ld, src->ffn_norm, c->dim, &dst->ffn_norm)) == PP_OK &&
        (st = load_vec(ld, src->bq, q_dim, &dst->bq)) == PP_OK &&
        (st = load_vec(ld, src->bk, kv_dim, &dst->bk)) == PP_OK)
        st = load_vec(ld, src->bv, kv_dim, &dst->bv);
    if (st == PP_OK && src->moe) {
        dst->moe = moe;
        st = load_moe(ld, c, src->moe, moe);
    }
    return st;
}

static void free_layer(struct pp_backend *be, const struct pp_layer_weights *src,
                       struct pp_layer_weights *dst)
{
    struct weight_pair ws[] = LAYER_WEIGHTS(src, dst);
    for (size_t i = 0; i < sizeof(ws) / sizeof(ws[0]); i++)
        free_weight(be, ws[i].src, ws[i].dst);
    free_vec(be, src->attn_norm, &dst->attn_norm);
    free_vec(be, src->ffn_norm, &dst->ffn_norm);
    free_vec(be, src->bq, &dst->bq);
    free_vec(be, src->bk, &dst->bk);
    free_vec(be, src->bv, &dst->bv);
    if (src->moe && dst->moe && dst->moe != src->moe)
        free_moe(be, src->moe, dst->moe);
    dst->moe = src->moe;
}

pp_status pp__exec_weights_load(struct pp_executor *ex, struct pp_exec_worker *w)
{
    const struct pp_model *m = ex->m;
    const struct pp_model_config *c = &m->cfg;
    const struct pp_shard *s = w->shard;
    struct pp_backend *be = w->be;
    struct pp_exec_weights *wt = &w->wt;
    const struct loader ld0 = {be, m->resident, s}, *ld = &ld0;
    int32_t n_layers = m->last_layer - m->first_layer;
    /* every tensor starts as its source, so a partial load is released correctly */
    wt->embedding = m->embedding;
    wt->lm_head = s->lm_head;
    wt->final_norm = m->final_norm;
    wt->inv_freq = m->inv_freq;
    if (!(wt->layers = pp_alloc(PP_MEM_MISC, (size_t)n_layers * sizeof(*wt->layers))) ||
        (c->n_experts > 0 &&
         !(wt->moe = pp_calloc(PP_MEM_MISC, (size_t)n_layers, sizeof(*wt->moe)))))
        return pp_error(PP_ERR_NOMEM, "executor: no memory for worker %d's weight table", w->rank);
    memcpy(wt->layers, s->layers, (size_t)n_layers * sizeof(*wt->layers));
    pp_status st = PP_OK;
    for (int32_t l = 0; l < n_layers && st == PP_OK; l++)
        st = load_layer(ld, c, s, &s->layers[l], &wt->layers[l],
                        wt->moe ? &wt->moe[l] : NULL);
    /* a tied head is the embedding itself: loaded once */
    int tied = m->has_head && m->has_embedding && s->lm_head.data == m->embedding.data &&
               s->lm_head.rows == m->embedding.rows && s->lm_head.dtype == m->embedding.dtype;
    if (st == PP_OK && m->has_embedding) {
        /* a gather reads only the looked-up rows of an embedding that is not also the head: a
         * host-memory backend leaves it where the model keeps it (no copy of unread rows) */
        struct loader emb = *ld;
        emb.resident |= be->host_memory && !tied;
        st = load_weight(&emb, &m->embedding, &wt->embedding);
    }
    if (st == PP_OK && m->has_head) {
        if (tied)
            wt->lm_head = wt->embedding;
        else
            st = load_weight(ld, &s->lm_head, &wt->lm_head);
        float *fn = NULL;
        if (st == PP_OK && (st = load_vec(ld, m->final_norm, c->dim, &fn)) == PP_OK)
            wt->final_norm = fn;
    }
    float *inv = NULL;
    if (st == PP_OK && (st = load_vec(ld, m->inv_freq, c->head_dim / 2, &inv)) == PP_OK)
        wt->inv_freq = inv;
    return st;
}

void pp__exec_weights_free(struct pp_executor *ex, struct pp_exec_worker *w)
{
    const struct pp_model *m = ex->m;
    struct pp_exec_weights *wt = &w->wt;
    struct pp_backend *be = w->be;
    if (!w->shard || !be)
        return;
    if (wt->layers)
        for (int32_t l = 0; l < m->last_layer - m->first_layer; l++)
            free_layer(be, &w->shard->layers[l], &wt->layers[l]);
    pp_free(PP_MEM_MISC, wt->layers);
    pp_free(PP_MEM_MISC, wt->moe);
    wt->layers = NULL;
    wt->moe = NULL;
    if (wt->lm_head.data == wt->embedding.data)
        wt->lm_head = w->shard->lm_head; /* shared with the embedding: freed with it */
    free_weight(be, &w->shard->lm_head, &wt->lm_head);
    free_weight(be, &m->embedding, &wt->embedding);
    float *fn = (float *)wt->final_norm, *inv = (float *)wt->inv_freq;
    free_vec(be, m->final_norm, &fn);
    free_vec(be, m->inv_freq, &inv);
    wt->final_norm = m->final_norm;
    wt->inv_freq = m->inv_freq;
}
