/* Slicing a model's weights into one worker's share (see shard.h for the layout). */
#include "model/shard.h"

#include <stdio.h>
#include <string.h>

#include "common/alloc.h"

void pp_shard_split(int64_t n, int32_t n_ranks, int32_t rank, int64_t unit, int64_t *begin,
                    int64_t *end)
{
    if (unit < 1 || n % unit != 0 || n / unit < n_ranks)
        unit = 1;
    int64_t units = n / unit;
    *begin = units * rank / n_ranks * unit;
    *end = units * (rank + 1) / n_ranks * unit;
}

/* The degrees a count allows: its divisors up to 64, for messages. */
static void divisors(char *buf, size_t cap, int64_t n)
{
    size_t k = 0;
    buf[0] = '\0';
    for (int64_t d = 1; d <= n && d <= 64 && k < cap; d++)
        if (n % d == 0)
            k += (size_t)snprintf(buf + k, cap - k, "%s%lld", k ? ", " : "", (long long)d);
}

pp_status pp_shard_check(const struct pp_model_config *c, int32_t tp, int32_t ep,
                         const char *source)
{
    char ok[160];
    if (tp < 1 || tp > 64)
        return pp_error(PP_ERR_INVALID_ARG, "tp: expected 1..64 workers, got %d", tp);
    if (ep < 1 || ep > tp || tp % ep != 0)
        return pp_error(PP_ERR_INVALID_ARG, "ep: expected a divisor of tp (%d), got %d", tp, ep);
    if (c->n_heads % tp != 0) {
        divisors(ok, sizeof(ok), c->n_heads);
        return pp_error(PP_ERR_INVALID_ARG, "%s: tp %d does not divide the %d attention heads "
                        "(valid tp: %s)", source, tp, c->n_heads, ok);
    }
    if (c->n_kv_heads % tp != 0 && tp % c->n_kv_heads != 0)
        return pp_error(PP_ERR_INVALID_ARG,
                        "%s: tp %d must divide the %d KV heads or be a "
                        "multiple of them (so each worker's query heads read whole KV heads)",
                        source, tp, c->n_kv_heads);
    if (c->ffn_dim > 0 && c->ffn_dim < tp)
        return pp_error(PP_ERR_INVALID_ARG, "%s: tp %d exceeds the FFN size %d", source, tp,
                        c->ffn_dim);
    if (c->vocab_size < tp)
        return pp_error(PP_ERR_INVALID_ARG, "%s: tp %d exceeds the vocabulary size %d", source, tp,
                        c->vocab_size);
    if (ep > 1 && c->n_experts == 0)
        return pp_error(PP_ERR_INVALID_ARG, "%s: ep %d needs a mixture-of-experts model; this "
                        "model is dense", source, ep);
    if (c->n_experts == 0)
        return PP_OK;
    if (c->n_experts % ep != 0) {
        divisors(ok, sizeof(ok), c->n_experts);
        return pp_error(PP_ERR_INVALID_ARG, "%s: ep %d does not divide the %d experts into equal "
                        "groups (valid ep: %s, and dividing tp %d)", source, ep, c->n_experts, ok,
                        tp);
    }
    if (c->expert_ffn_dim < tp / ep)
        return pp_error(PP_ERR_INVALID_ARG, "%s: tp %d / ep %d splits each expert %d ways, "
                        "more than its %d FFN rows", source, tp, ep, tp / ep, c->expert_ffn_dim);
    if (c->shared_ffn_dim > 0 && c->shared_ffn_dim < tp)
        return pp_error(PP_ERR_INVALID_ARG, "%s: tp %d exceeds the shared expert's %d FFN rows",
                        source, tp, c->shared_ffn_dim);
    return PP_OK;
}

/* p (PP_MEM_WEIGHTS: huge_bytes of pp_alloc_huge, or pp_alloc_aligned when 0) is freed with the
 * shard. */
static pp_status own(struct pp_shard *s, void *p, size_t huge_bytes)
{
    if (s->n_owned == s->cap_owned) {
        int32_t cap = s->cap_owned ? s->cap_owned * 2 : 16;
        struct pp_shard_block *o = pp_alloc(PP_MEM_MISC, (size_t)cap * sizeof(*o));
        if (!o)
            return PP_ERR_NOMEM;
        if (s->n_owned)
            memcpy(o, s->owned, (size_t)s->n_owned * sizeof(*o));
        pp_free(PP_MEM_MISC, s->owned);
        s->owned = o;
        s->cap_owned = cap;
    }
    s->owned[s->n_owned++] = (struct pp_shard_block){p, huge_bytes};
    return PP_OK;
}

int pp_shard_owns(const struct pp_shard *s, const void *p)
{
    const char *c = p;
    for (int32_t i = 0; s && c && i < s->n_owned; i++) {
        const char *b = s->owned[i].p;
        if (s->owned[i].huge_bytes && c >= b && c < b + s->owned[i].huge_bytes)
            return 1;
    }
    return 0;
}

/* Rows [r0, r1) of w, in place. */
static struct pp_weight rows_of(const struct pp_weight *w, int64_t r0, int64_t r1)
{
    struct pp_weight out = *w;
    out.data = (const char *)w->data + r0 * pp_dtype_row_bytes(w->dtype, w->cols);
    out.rows = r1 - r0;
    return out;
}

/* Columns [c0, c1) of w, repacked into owned memory of the same dtype. */
static pp_status cols_of(struct pp_shard *s, const struct pp_weight *w, int64_t c0, int64_t c1,
                         const char *what, int32_t layer, struct pp_weight *out)
{
    if (w->dtype == PP_DTYPE_Q8_0 && (c0 % PP_Q8_0_BLOCK != 0 || c1 % PP_Q8_0_BLOCK != 0))
        return pp_error(PP_ERR_UNSUPPORTED, "tp %d: layer %d %s is Q8_0 and its columns "
                        "[%lld, %lld) for worker %d are not whole %d-value blocks", s->n_ranks,
                        layer, what, (long long)c0, (long long)c1, s->rank, PP_Q8_0_BLOCK);
    if (c0 == 0 && c1 == w->cols) {
        *out = *w; /* the whole matrix: nothing to repack */
        return PP_OK;
    }
    int64_t src_row = pp_dtype_row_bytes(w->dtype, w->cols);
    int64_t off = pp_dtype_row_bytes(w->dtype, c0), n = pp_dtype_row_bytes(w->dtype, c1 - c0);
    size_t bytes = (size_t)(w->rows * n);
    char *p = pp_alloc_huge(PP_MEM_WEIGHTS, bytes);
    if (!p)
        return pp_error(PP_ERR_NOMEM, "tp: no memory to repack layer %d %s (%zu bytes)", layer,
                        what, bytes);
    pp_status st = own(s, p, bytes);
    if (st != PP_OK) {
        pp_free_huge(PP_MEM_WEIGHTS, p, bytes);
        return st;
    }
    const char *src = w->data;
    for (int64_t r = 0; r < w->rows; r++)
        memcpy(p + r * n, src + r * src_row + off, (size_t)n);
    *out = *w;
    out->data = p;
    out->cols = c1 - c0;
    return PP_OK;
}

/* Owned zeroed PP_MEM_WEIGHTS memory (slice tables), or NULL. */
static void *own_zeroed(struct pp_shard *s, size_t bytes)
{
    void *p = pp_alloc_aligned(PP_MEM_WEIGHTS, bytes ? bytes : 1);
    if (!p)
        return NULL;
    memset(p, 0, bytes);
    if (own(s, p, 0) != PP_OK) {
        pp_free(PP_MEM_WEIGHTS, p);
        return NULL;
    }
    return p;
}

/* The gate/up rows [r0, r1) and down columns of one expert (or the shared expert). */
static pp_status slice_expert(struct pp_shard *s, const struct pp_weight *gate,
                              const struct pp_weight *up, const struct pp_weight *down,
                              int64_t r0, int64_t r1, const char *what, int32_t layer,
                              struct pp_weight *g, struct pp_weight *u, struct pp_weight *d)
{
    *g = rows_of(gate, r0, r1);
    *u = rows_of(up, r0, r1);
    if (r1 - r0 > s->moe_ffn_rows)
        s->moe_ffn_rows = (int32_t)(r1 - r0);
    return cols_of(s, down, r0, r1, what, layer, d);
}

/* This worker's experts of one MoE layer: its group's experts, each split W / E ways, and its
 * W-way part of the shared expert. */
static pp_status shard_moe(struct pp_shard *s, const struct pp_model_config *c, int32_t ep,
                           int32_t layer, const struct pp_moe_weights *full,
                           struct pp_moe_weights **out)
{
    int32_t per_group = s->n_ranks / ep, q = s->rank % per_group;
    struct pp_moe_weights *mw = own_zeroed(s, sizeof(*mw));
    struct pp_weight *tab = own_zeroed(s, 3 * (size_t)s->n_experts * sizeof(struct pp_weight));
    if (!mw || !tab)
        return PP_ERR_NOMEM;
    *mw = *full;
    mw->expert_base = s->expert0;
    mw->n_experts = s->n_experts;
    mw->gate = tab;
    mw->up = tab + s->n_experts;
    mw->down = tab + 2 * s->n_experts;
    int64_t r0, r1;
    pp_shard_split(c->expert_ffn_dim, per_group, q, PP_Q8_0_BLOCK, &r0, &r1);
    pp_status st = PP_OK;
    for (int32_t h = 0; h < s->n_experts && st == PP_OK; h++) {
        int32_t e = s->expert0 + h - full->expert_base;
        st = slice_expert(s, &full->gate[e], &full->up[e], &full->down[e], r0, r1, "expert down",
                          layer, &mw->gate[h], &mw->up[h], &mw->down[h]);
    }
    if (st == PP_OK && full->shared_gate.data) {
        pp_shard_split(c->shared_ffn_dim, s->n_ranks, s->rank, PP_Q8_0_BLOCK, &r0, &r1);
        st = slice_expert(s, &full->shared_gate, &full->shared_up, &full->shared_down, r0, r1,
                          "shared expert down", layer, &mw->shared_gate, &mw->shared_up,
                          &mw->shared_down);
    }
    *out = mw;
    return st;
}

static pp_status shard_layer(struct pp_shard *s, const struct pp_model *m, int32_t ep,
                             int32_t layer, const struct pp_layer_weights *full,
                             struct pp_layer_weights *lw)
{
    const struct pp_model_config *c = &m->cfg;
    int64_t hd = c->head_dim;
    *lw = *full;
    lw->wq = rows_of(&full->wq, s->head0 * hd, (s->head0 + s->n_heads) * hd);
    lw->wk = rows_of(&full->wk, s->kv_head0 * hd, (s->kv_head0 + s->n_kv_heads) * hd);
    lw->wv = rows_of(&full->wv, s->kv_head0 * hd, (s->kv_head0 + s->n_kv_heads) * hd);
    lw->bq = full->bq ? full->bq + s->head0 * hd : NULL;
    lw->bk = full->bk ? full->bk + s->kv_head0 * hd : NULL;
    lw->bv = full->bv ? full->bv + s->kv_head0 * hd : NULL;
    pp_status st = cols_of(s, &full->wo, s->head0 * hd, (s->head0 + s->n_heads) * hd,
                           "attention output", layer, &lw->wo);
    if (st != PP_OK)
        return st;
    if (full->w_gate.data) {
        lw->w_gate = rows_of(&full->w_gate, s->ffn0, s->ffn0 + s->ffn_dim);
        lw->w_up = rows_of(&full->w_up, s->ffn0, s->ffn0 + s->ffn_dim);
        st = cols_of(s, &full->w_down, s->ffn0, s->ffn0 + s->ffn_dim, "ffn down", layer,
                     &lw->w_down);
    }
    if (st == PP_OK && full->moe)
        st = shard_moe(s, c, ep, layer, full->moe, &lw->moe);
    return st;
}

pp_status pp_shard_new(const struct pp_model *m, int32_t tp, int32_t ep, int32_t rank,
                       struct pp_shard **out)
{
    const struct pp_model_config *c = &m->cfg;
    pp_status st = pp_shard_check(c, tp, ep, "model");
    if (st != PP_OK)
        return st;
    if (rank < 0 || rank >= tp)
        return pp_error(PP_ERR_INVALID_ARG, "shard: rank %d outside [0, %d)", rank, tp);
    struct pp_shard *s = pp_calloc(PP_MEM_MISC, 1, sizeof(*s));
    int32_t n = m->last_layer - m->first_layer;
    if (!s || !(s->layers = pp_calloc(PP_MEM_MISC, (size_t)(n ? n : 1), sizeof(*s->layers)))) {
        pp_free(PP_MEM_MISC, s);
        return PP_ERR_NOMEM;
    }
    s->rank = rank;
    s->n_ranks = tp;
    s->n_heads = c->n_heads / tp;
    s->head0 = rank * s->n_heads;
    if (tp <= c->n_kv_heads) {
        s->n_kv_heads = c->n_kv_heads / tp;
        s->kv_head0 = rank * s->n_kv_heads;
    } else {
        s->n_kv_heads = 1;
        s->kv_head0 = s->head0 / (c->n_heads / c->n_kv_heads);
    }
    int64_t b, e;
    if (c->n_experts == 0) {
        pp_shard_split(c->ffn_dim, tp, rank, PP_Q8_0_BLOCK, &b, &e);
        s->ffn0 = (int32_t)b;
        s->ffn_dim = (int32_t)(e - b);
    } else {
        pp_shard_split(c->n_experts, ep, rank / (tp / ep), 1, &b, &e);
        s->expert0 = (int32_t)b;
        s->n_experts = (int32_t)(e - b);
        if (tp == 1)
            s->moe_ffn_rows = c->expert_ffn_dim > c->shared_ffn_dim ? c->expert_ffn_dim
                                                                    : c->shared_ffn_dim;
    }
    pp_shard_split(c->vocab_size, tp, rank, 1, &b, &e);
    s->vocab0 = (int32_t)b;
    s->n_vocab = (int32_t)(e - b);
    if (m->has_head)
        s->lm_head = tp == 1 ? m->lm_head : rows_of(&m->lm_head, b, e);
    for (int32_t l = 0; l < n; l++) {
        if (tp == 1) {
            s->layers[l] = m->layers[l];
            continue;
        }
        if ((st = shard_layer(s, m, ep, m->first_layer + l, &m->layers[l], &s->layers[l])) !=
            PP_OK) {
            pp_shard_free(s);
            return st;
        }
    }
    *out = s;
    return PP_OK;
}

void pp_shard_free(struct pp_shard *s)
{
    if (!s)
        return;
    for (int32_t i = 0; i < s->n_owned; i++) {
        if (s->owned[i].huge_bytes)
            pp_free_huge(PP_MEM_WEIGHTS, s->owned[i].p, s->owned[i].huge_bytes);
        else
            pp_free(PP_MEM_WEIGHTS, s->owned[i].p);
    }
    pp_free(PP_MEM_MISC, s->owned);
    pp_free(PP_MEM_MISC, s->layers);
    pp_free(PP_MEM_MISC, s);
}

int64_t pp_shard_weight_bytes(const struct pp_shard *s, const struct pp_model *m)
{
    int64_t total = 0;
    for (int32_t l = 0; l < m->last_layer - m->first_layer; l++) {
        const struct pp_layer_weights *lw = &s->layers[l];
        total += pp_weight_bytes(&lw->wq) + pp_weight_bytes(&lw->wk) + pp_weight_bytes(&lw->wv) +
                 pp_weight_bytes(&lw->wo) + pp_weight_bytes(&lw->w_gate) +
                 pp_weight_bytes(&lw->w_up) + pp_weight_bytes(&lw->w_down);
        const struct pp_moe_weights *mw = lw->moe;
        if (!mw)
            continue;
        total += pp_weight_bytes(&mw->router) + pp_weight_bytes(&mw->shared_gate) +
                 pp_weight_bytes(&mw->shared_up) + pp_weight_bytes(&mw->shared_down);
        for (int32_t h = 0; h < mw->n_experts; h++)
            total += pp_weight_bytes(&mw->gate[h]) + pp_weight_bytes(&mw->up[h]) +
                     pp_weight_bytes(&mw->down[h]);
    }
    if (m->has_head)
        total += pp_weight_bytes(&s->lm_head);
    return total;
}
