/* Block pool and block tables. A LIFO free list reuses the most recently freed (cache-warm) block.
 */
#include "model/kv_cache.h"

#include "common/alloc.h"

int64_t pp_kv_block_bytes(int32_t n_layers, int32_t kv_dim, int32_t block_size)
{
    return (int64_t)n_layers * 2 * block_size * kv_dim * (int64_t)sizeof(float);
}

static pp_status cache_new(int32_t n_layers, int32_t kv_dim, int32_t block_size,
                           int64_t budget_bytes, int32_t max_seqs, int32_t max_context,
                           int with_pool, struct pp_kv_cache **out)
{
    if (n_layers < 1 || kv_dim < 1 || block_size < 1 || max_seqs < 1 || max_context < 1)
        return pp_error(PP_ERR_INVALID_ARG, "kv cache: layers, kv dim, block size, sequences and "
                        "context must be positive");
    int64_t block_bytes = pp_kv_block_bytes(n_layers, kv_dim, block_size);
    int64_t n_blocks = budget_bytes / block_bytes;
    if (n_blocks < 1)
        return pp_error(
            PP_ERR_INVALID_ARG,
            "kv cache: a budget of %lld bytes holds no block (one block takes %lld bytes)",
            (long long)budget_bytes, (long long)block_bytes);
    if (n_blocks > INT32_MAX / 2)
        n_blocks = INT32_MAX / 2;
    struct pp_kv_cache *c = pp_calloc(PP_MEM_MISC, 1, sizeof(*c));
    if (!c)
        return PP_ERR_NOMEM;
    c->n_blocks = (int32_t)n_blocks;
    c->max_seqs = max_seqs;
    c->max_context = max_context;
    c->max_blocks_per_seq = (max_context + block_size - 1) / block_size;
    c->view.n_layers = n_layers;
    c->view.block_size = block_size;
    c->view.kv_dim = kv_dim;
    c->view.block_elems = (int64_t)block_size * kv_dim;
    if (with_pool)
        c->view.pool = pp_alloc_aligned(PP_MEM_KV, (size_t)(n_blocks * block_bytes));
    c->free_list = pp_alloc(PP_MEM_MISC, (size_t)n_blocks * sizeof(int32_t));
    c->seqs = pp_calloc(PP_MEM_MISC, (size_t)max_seqs, sizeof(*c->seqs));
    if ((with_pool && !c->view.pool) || !c->free_list || !c->seqs) {
        pp_kv_cache_free(c);
        return pp_error(PP_ERR_NOMEM, "kv cache: cannot allocate %lld blocks of %lld bytes",
                        (long long)n_blocks, (long long)block_bytes);
    }
    for (int32_t i = 0; i < max_seqs; i++) {
        c->seqs[i].blocks = pp_alloc(PP_MEM_MISC, (size_t)c->max_blocks_per_seq * sizeof(int32_t));
        if (!c->seqs[i].blocks) {
            pp_kv_cache_free(c);
            return PP_ERR_NOMEM;
        }
    }
    /* hand out low block ids first */
    for (int32_t i = 0; i < c->n_blocks; i++)
        c->free_list[i] = c->n_blocks - 1 - i;
    c->n_free = c->n_blocks;
    *out = c;
    return PP_OK;
}

pp_status pp_kv_cache_new(int32_t n_layers, int32_t kv_dim, int32_t block_size,
                          int64_t budget_bytes, int32_t max_seqs, int32_t max_context,
                          struct pp_kv_cache **out)
{
    return cache_new(n_layers, kv_dim, block_size, budget_bytes, max_seqs, max_context, 1, out);
}

pp_status pp_kv_cache_new_tables(int32_t n_layers, int32_t kv_dim, int32_t block_size,
                                 int64_t budget_bytes, int32_t max_seqs, int32_t max_context,
                                 struct pp_kv_cache **out)
{
    return cache_new(n_layers, kv_dim, block_size, budget_bytes, max_seqs, max_context, 0, out);
}

void pp_kv_cache_free(struct pp_kv_cache *c)
{
    if (!c)
        return;
    if (c->seqs)
        for (int32_t i = 0; i < c->max_seqs; i++)
            pp_free(PP_MEM_MISC, c->seqs[i].blocks);
    pp_free(PP_MEM_MISC, c->seqs);
    pp_free(PP_MEM_MISC, c->free_list);
    pp_free(PP_MEM_KV, c->view.pool);
    pp_free(PP_MEM_MISC, c);
}

struct pp_kv_seq *pp_kv_cache_find(struct pp_kv_cache *c, uint64_t id)
{
    for (int32_t i = 0; i < c->max_seqs; i++)
        if (c->seqs[i].in_use && c->seqs[i].id == id)
            return &c->seqs[i];
    return NULL;
}

pp_status pp_kv_cache_create(struct pp_kv_cache *c, uint64_t id, struct pp_kv_seq **out)
{
    if (pp_kv_cache_find(c, id))
        return pp_error(PP_ERR_INVALID_ARG, "sequence %llu already exists", (unsigned long long)id);
    for (int32_t i = 0; i < c->max_seqs; i++) {
        struct pp_kv_seq *s = &c->seqs[i];
        if (!s->in_use) {
            s->in_use = 1;
            s->id = id;
            s->len = 0;
            s->n_blocks = 0;
            *out = s;
            return PP_OK;
        }
    }
    return pp_error(PP_ERR_EXHAUSTED, "all %d sequence slots are in use", c->max_seqs);
}

int32_t pp_kv_cache_blocks_needed(const struct pp_kv_cache *c, const struct pp_kv_seq *s,
                                  int32_t n_tokens)
{
    int32_t want = (n_tokens + c->view.block_size - 1) / c->view.block_size;
    return want > s->n_blocks ? want - s->n_blocks : 0;
}

pp_status pp_kv_cache_reserve(struct pp_kv_cache *c, struct pp_kv_seq *s, int32_t n_tokens)
{
    if (n_tokens > c->max_context)
        return pp_error(PP_ERR_OUT_OF_RANGE, "sequence %llu: %d tokens exceed the context of %d",
                        (unsigned long long)s->id, n_tokens, c->max_context);
    int32_t need = pp_kv_cache_blocks_needed(c, s, n_tokens);
    if (need > c->n_free)
        return pp_error(PP_ERR_EXHAUSTED, "kv cache: sequence %llu needs %d more blocks, %d free",
                        (unsigned long long)s->id, need, c->n_free);
    for (int32_t i = 0; i < need; i++)
        s->blocks[s->n_blocks++] = c->free_list[--c->n_free];
    return PP_OK;
}

int pp_kv_cache_release(struct pp_kv_cache *c, uint64_t id)
{
    struct pp_kv_seq *s = pp_kv_cache_find(c, id);
    if (!s)
        return 0;
    for (int32_t i = s->n_blocks - 1; i >= 0; i--)
        c->free_list[c->n_free++] = s->blocks[i];
    s->in_use = 0;
    s->n_blocks = 0;
    s->len = 0;
    return 1;
}

int32_t pp_kv_cache_free_blocks(const struct pp_kv_cache *c)
{
    return c->n_free;
}

int32_t pp_kv_cache_active_seqs(const struct pp_kv_cache *c)
{
    int32_t n = 0;
    for (int32_t i = 0; i < c->max_seqs; i++)
        n += c->seqs[i].in_use;
    return n;
}
