/* The MoE expert load a stage reports: after each microbatch the compute side copies its
 * executor's per-layer expert token counts (under stats_mu), and the heartbeat thread turns the
 * copy into ExpertLoad messages with each worker's share (the sum over the experts it holds). */
#include <string.h>

#include "common/alloc.h"
#include "stage/stage.h"

void pp_stage_expert_load_free(struct pp_stage_expert_load *l)
{
    if (!l)
        return;
    pp_free(PP_MEM_MISC, l->layer);
    pp_free(PP_MEM_MISC, l->tokens);
    pp_free(PP_MEM_MISC, l->worker_first);
    pp_free(PP_MEM_MISC, l->worker_n);
    pp_free(PP_MEM_MISC, l);
}

/* An empty copy shaped for a's executor, or NULL (dense model, or no memory: nothing reported). */
static struct pp_stage_expert_load *shape_for(struct pp_stage_assignment *a)
{
    const struct pp_model *m = pp_executor_model(a->ex);
    int32_t n_range = m->last_layer - m->first_layer, n_moe = 0;
    for (int32_t l = 0; l < n_range; l++)
        n_moe += pp_executor_expert_tokens(a->ex, l) != NULL;
    if (n_moe == 0)
        return NULL;
    struct pp_stage_expert_load *e = pp_calloc(PP_MEM_MISC, 1, sizeof(*e));
    if (!e)
        return NULL;
    e->first = m->first_layer;
    e->last = m->last_layer;
    e->n_layers = n_moe;
    e->n_experts = m->cfg.n_experts;
    e->n_workers = pp_executor_workers(a->ex);
    e->layer = pp_alloc(PP_MEM_MISC, (size_t)n_moe * sizeof(int32_t));
    e->tokens = pp_calloc(PP_MEM_MISC, (size_t)n_moe * (size_t)e->n_experts, sizeof(int64_t));
    e->worker_first = pp_alloc(PP_MEM_MISC, (size_t)e->n_workers * sizeof(int32_t));
    e->worker_n = pp_alloc(PP_MEM_MISC, (size_t)e->n_workers * sizeof(int32_t));
    if (!e->layer || !e->tokens || !e->worker_first || !e->worker_n) {
        pp_stage_expert_load_free(e);
        return NULL;
    }
    for (int32_t l = 0, i = 0; l < n_range; l++)
        if (pp_executor_expert_tokens(a->ex, l))
            e->layer[i++] = m->first_layer + l;
    for (int32_t w = 0; w < e->n_workers; w++)
        pp_executor_worker_experts(a->ex, w, &e->worker_first[w], &e->worker_n[w]);
    return e;
}

void pp_stage_expert_load_update(struct pp_stage *s)
{
    struct pp_stage_assignment *a = s->asg;
    const struct pp_model *m = a ? pp_executor_model(a->ex) : NULL;
    /* dense (or no) assignment and nothing reported: the common case costs no lock. s->experts
     * is written only here, under mu, which the caller holds */
    if (!s->experts && (!m || m->cfg.n_experts == 0))
        return;
    pthread_mutex_lock(&s->stats_mu);
    struct pp_stage_expert_load *e = s->experts;
    int same = e && m && e->first == m->first_layer && e->last == m->last_layer &&
               e->n_experts == m->cfg.n_experts && e->n_workers == pp_executor_workers(a->ex);
    pthread_mutex_unlock(&s->stats_mu);
    struct pp_stage_expert_load *fresh = NULL;
    if (!same && a && m->cfg.n_experts > 0)
        fresh = shape_for(a);
    pthread_mutex_lock(&s->stats_mu);
    if (!same) {
        pp_stage_expert_load_free(s->experts);
        s->experts = fresh;
    }
    e = s->experts;
    for (int32_t i = 0; e && i < e->n_layers; i++) {
        const int64_t *c = pp_executor_expert_tokens(a->ex, e->layer[i] - m->first_layer);
        if (c)
            memcpy(e->tokens + (int64_t)i * e->n_experts, c, (size_t)e->n_experts * sizeof(*c));
    }
    pthread_mutex_unlock(&s->stats_mu);
}

void pp_stage_expert_load_fill(struct pp_stage *s, Ppserve__V1__StageStats *st,
                               struct pp_stage_expert_msgs *m)
{
    memset(m, 0, sizeof(*m));
    const struct pp_stage_expert_load *e = s->experts;
    if (!e)
        return;
    size_t per = (size_t)e->n_experts + (size_t)e->n_workers;
    m->items = pp_calloc(PP_MEM_MISC, (size_t)e->n_layers, sizeof(*m->items));
    m->ptrs = pp_calloc(PP_MEM_MISC, (size_t)e->n_layers, sizeof(*m->ptrs));
    m->values = pp_calloc(PP_MEM_MISC, (size_t)e->n_layers * per, sizeof(uint64_t));
    if (!m->items || !m->ptrs || !m->values) {
        pp_stage_expert_msgs_free(m);
        return;
    }
    for (int32_t i = 0; i < e->n_layers; i++) {
        Ppserve__V1__ExpertLoad *x = &m->items[i];
        ppserve__v1__expert_load__init(x);
        uint64_t *experts = m->values + (size_t)i * per, *workers = experts + e->n_experts;
        const int64_t *c = e->tokens + (int64_t)i * e->n_experts;
        for (int32_t k = 0; k < e->n_experts; k++)
            experts[k] = (uint64_t)c[k];
        for (int32_t w = 0; w < e->n_workers; w++)
            for (int32_t k = e->worker_first[w]; k < e->worker_first[w] + e->worker_n[w]; k++)
                workers[w] += (uint64_t)c[k];
        x->layer = e->layer[i];
        x->n_tokens_per_expert = (size_t)e->n_experts;
        x->tokens_per_expert = experts;
        x->n_tokens_per_worker = (size_t)e->n_workers;
        x->tokens_per_worker = workers;
        m->ptrs[i] = x;
    }
    m->n = (size_t)e->n_layers;
    st->n_expert_load = m->n;
    st->expert_load = m->ptrs;
}

void pp_stage_expert_msgs_free(struct pp_stage_expert_msgs *m)
{
    pp_free(PP_MEM_MISC, m->items);
    pp_free(PP_MEM_MISC, m->ptrs);
    pp_free(PP_MEM_MISC, m->values);
    memset(m, 0, sizeof(*m));
}
