/* Binding a layer's Mixture-of-Experts FFN: the router, each expert as a 2-D weight pointing in
 * place into the file's 3-D `_exps` tensor (or into a per-expert tensor: HF checkpoints and split
 * GGUF files), and the Qwen2-MoE shared expert with its gate vector. */
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "model/model-impl.h"
#include "model/source.h"

/* The [n_experts] matrices of one role (gate, up or down) of a layer, each [rows, cols]. */
static pp_status bind_experts(struct pp__binder *b, int32_t layer, const char *role, int64_t rows,
                              int64_t cols, struct pp_weight *w)
{
    int32_t n = b->m->cfg.n_experts;
    char name[128];
    const struct pp_tensor *t;
    snprintf(name, sizeof(name), "blk.%d.%s_exps.weight", layer, role);
    pp_status st = pp__source_tensor(b->src, name, &t);
    if (st == PP_OK) {
        int64_t want[3] = {n, rows, cols};
        if ((st = pp__bind_find(b, name, 3, want, 0, &t)) != PP_OK)
            return st;
        for (int32_t e = 0; e < n; e++)
            if ((st = pp__bind_matrix(b, name, t, e, rows, cols, &w[e])) != PP_OK)
                return st;
        return PP_OK;
    }
    if (st != PP_ERR_NOT_FOUND)
        return st;
    /* per-expert tensors: all of them, or a clear error naming the first one missing */
    for (int32_t e = 0; e < n; e++) {
        snprintf(name, sizeof(name), "blk.%d.%s.%d.weight", layer, role, e);
        st = pp__source_tensor(b->src, name, &t);
        if (st == PP_ERR_NOT_FOUND && e == 0)
            return pp_error(PP_ERR_NOT_FOUND, "%s: missing tensor blk.%d.%s_exps.weight (or "
                            "per-expert %s, ...): layer %d has no %s experts", b->src->path, layer,
                            role, name, layer, role);
        if (st == PP_ERR_NOT_FOUND)
            return pp_error(PP_ERR_NOT_FOUND, "%s: missing tensor %s: expected %d experts of %s, "
                            "found %d", b->src->path, name, n, role, e);
        if (st != PP_OK || (st = pp__bind_weight(b, name, rows, cols, &w[e])) != PP_OK)
            return st;
    }
    return PP_OK;
}

/* The shared expert's gate vector: [dim] in GGUF, [1, dim] in HF. */
static pp_status bind_shared_gate_inp(struct pp__binder *b, int32_t layer, float **out)
{
    int64_t dim = b->m->cfg.dim;
    char name[96];
    snprintf(name, sizeof(name), "blk.%d.ffn_gate_inp_shexp.weight", layer);
    const struct pp_tensor *t;
    pp_status st = pp__source_tensor(b->src, name, &t);
    if (st == PP_ERR_NOT_FOUND)
        return pp_error(PP_ERR_NOT_FOUND, "%s: missing tensor %s (the shared expert's gate)",
                        b->src->path, name);
    if (st != PP_OK)
        return st;
    int ok = (t->n_dims == 1 && t->shape[0] == dim) ||
             (t->n_dims == 2 && t->shape[0] == 1 && t->shape[1] == dim);
    if (!ok)
        return pp_error(PP_ERR_FORMAT, "%s: tensor %s: expected shape [%lld] or [1, %lld], got %d "
                        "dims [%lld, ...]", b->src->path, name, (long long)dim, (long long)dim,
                        t->n_dims, (long long)(t->n_dims ? t->shape[0] : 0));
    return pp__bind_vector_from(b, name, t, dim, out);
}

static pp_status bind_shared(struct pp__binder *b, int32_t layer, struct pp_moe_weights *mw)
{
    const struct pp_model_config *c = &b->m->cfg;
    char name[96];
    pp_status st;
#define NAME(suffix) (snprintf(name, sizeof(name), "blk.%d." suffix, layer), name)
    if ((st = pp__bind_weight(b, NAME("ffn_gate_shexp.weight"), c->shared_ffn_dim, c->dim,
                              &mw->shared_gate)) != PP_OK ||
        (st = pp__bind_weight(b, NAME("ffn_up_shexp.weight"), c->shared_ffn_dim, c->dim,
                              &mw->shared_up)) != PP_OK ||
        (st = pp__bind_weight(b, NAME("ffn_down_shexp.weight"), c->dim, c->shared_ffn_dim,
                              &mw->shared_down)) != PP_OK)
        return st;
#undef NAME
    return bind_shared_gate_inp(b, layer, &mw->shared_gate_inp);
}

pp_status pp__bind_moe(struct pp__binder *b, int32_t layer, struct pp_moe_weights **out)
{
    const struct pp_model_config *c = &b->m->cfg;
    struct pp_moe_weights *mw = pp_calloc(PP_MEM_MISC, 1, sizeof(*mw));
    *out = mw;
    if (!mw)
        return PP_ERR_NOMEM;
    mw->n_experts = c->n_experts;
    mw->expert_base = 0;
    mw->gate = pp_calloc(PP_MEM_MISC, (size_t)c->n_experts, sizeof(*mw->gate));
    mw->up = pp_calloc(PP_MEM_MISC, (size_t)c->n_experts, sizeof(*mw->up));
    mw->down = pp_calloc(PP_MEM_MISC, (size_t)c->n_experts, sizeof(*mw->down));
    if (!mw->gate || !mw->up || !mw->down)
        return PP_ERR_NOMEM;
    char name[96];
    snprintf(name, sizeof(name), "blk.%d.ffn_gate_inp.weight", layer);
    pp_status st;
    if ((st = pp__bind_weight(b, name, c->n_experts, c->dim, &mw->router)) != PP_OK ||
        (st = bind_experts(b, layer, "ffn_gate", c->expert_ffn_dim, c->dim, mw->gate)) != PP_OK ||
        (st = bind_experts(b, layer, "ffn_up", c->expert_ffn_dim, c->dim, mw->up)) != PP_OK ||
        (st = bind_experts(b, layer, "ffn_down", c->dim, c->expert_ffn_dim, mw->down)) != PP_OK)
        return st;
    return c->shared_ffn_dim > 0 ? bind_shared(b, layer, mw) : PP_OK;
}

void pp__moe_weights_free(struct pp_moe_weights *mw)
{
    if (!mw)
        return;
    pp_free(PP_MEM_MISC, mw->gate);
    pp_free(PP_MEM_MISC, mw->up);
    pp_free(PP_MEM_MISC, mw->down);
    pp_free(PP_MEM_WEIGHTS, mw->shared_gate_inp);
    pp_free(PP_MEM_MISC, mw);
}

int64_t pp__moe_weights_bytes(const struct pp_moe_weights *mw)
{
    if (!mw)
        return 0;
    int64_t total = pp_weight_bytes(&mw->router) + pp_weight_bytes(&mw->shared_gate) +
                    pp_weight_bytes(&mw->shared_up) + pp_weight_bytes(&mw->shared_down);
    for (int32_t e = 0; e < mw->n_experts; e++)
        total += pp_weight_bytes(&mw->gate[e]) + pp_weight_bytes(&mw->up[e]) +
                 pp_weight_bytes(&mw->down[e]);
    return total;
}
