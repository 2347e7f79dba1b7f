/* The paged KV cache of one executor: a pool of fixed-size blocks (block_size tokens × the
 * executor's layers × K and V, f32), sized from a byte budget, handed to sequences through block
 * tables. Sequences are named by 64-bit ids chosen by the caller. Not thread-safe: the executor's
 * thread owns it. */
#ifndef PP_KV_CACHE_H
#define PP_KV_CACHE_H

#include <stdint.h>

#include "common/status.h"
#include "kernels/backend.h"

struct pp_kv_seq {
    uint64_t id;
    int in_use;
    int32_t len;      /* tokens whose K/V are stored */
    int32_t n_blocks; /* blocks held */
    int32_t *blocks;  /* [max_blocks_per_seq] block table */
};

struct pp_kv_cache {
    struct pp_kv_view view;
    int32_t n_blocks;
    int32_t n_free;
    int32_t *free_list;  /* [n_blocks]; the top n_free entries are free */
    int32_t max_seqs;
    int32_t max_blocks_per_seq;
    int32_t max_context;
    struct pp_kv_seq *seqs; /* [max_seqs] */
};

/* Bytes one block takes. */
int64_t pp_kv_block_bytes(int32_t n_layers, int32_t kv_dim, int32_t block_size);

/* A cache holding as many blocks as budget_bytes allows (at least one is required). */
pp_status pp_kv_cache_new(int32_t n_layers, int32_t kv_dim, int32_t block_size,
                          int64_t budget_bytes, int32_t max_seqs, int32_t max_context,
                          struct pp_kv_cache **out);
/* The same bookkeeping without a pool (view.pool NULL): the caller allocates n_blocks blocks of
 * pp_kv_block_bytes where its kernels can reach them (the executor: in each worker's backend
 * memory) and points its views at them. */
pp_status pp_kv_cache_new_tables(int32_t n_layers, int32_t kv_dim, int32_t block_size,
                                 int64_t budget_bytes, int32_t max_seqs, int32_t max_context,
                                 struct pp_kv_cache **out);
void pp_kv_cache_free(struct pp_kv_cache *c);

/* The sequence with this id, or NULL. */
struct pp_kv_seq *pp_kv_cache_find(struct pp_kv_cache *c, uint64_t id);
/* Creates an empty sequence; PP_ERR_EXHAUSTED when all slots are taken, PP_ERR_INVALID_ARG when the
 * id exists. */
pp_status pp_kv_cache_create(struct pp_kv_cache *c, uint64_t id, struct pp_kv_seq **out);
/* Blocks needed to grow s to n_tokens (0 if it already has room). */
int32_t pp_kv_cache_blocks_needed(const struct pp_kv_cache *c, const struct pp_kv_seq *s,
                                  int32_t n_tokens);
/* Grows s's block table to hold n_tokens; PP_ERR_EXHAUSTED when the pool lacks blocks (s is left
 * unchanged), PP_ERR_OUT_OF_RANGE beyond max_context. */
pp_status pp_kv_cache_reserve(struct pp_kv_cache *c, struct pp_kv_seq *s, int32_t n_tokens);
/* Returns the sequence's blocks to the pool; unknown ids are ignored. Returns 1 if it existed. */
int pp_kv_cache_release(struct pp_kv_cache *c, uint64_t id);

int32_t pp_kv_cache_free_blocks(const struct pp_kv_cache *c);
int32_t pp_kv_cache_active_seqs(const struct pp_kv_cache *c);

#endif
