/* Unit tests of model/kv_cache: the block pool sized from a byte budget, per-sequence block tables,
 * and the failure modes the scheduler relies on (a refused reserve leaves the sequence as it was).
 */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "model/kv_cache.h"

#define LAYERS 3
#define KV_DIM 16
#define BS 4

static int64_t block_bytes(void)
{
    return pp_kv_block_bytes(LAYERS, KV_DIM, BS);
}

/* A cache of n_blocks blocks (the budget has a little slack that must not make an extra block). */
static struct pp_kv_cache *cache_new(int32_t n_blocks, int32_t max_seqs, int32_t max_context)
{
    struct pp_kv_cache *c = NULL;
    assert_int_equal(pp_kv_cache_new(LAYERS, KV_DIM, BS,
                                     n_blocks * block_bytes() + block_bytes() - 1, max_seqs,
                                     max_context, &c),
                     PP_OK);
    return c;
}

/* No block may be held twice or be both held and free; together they are the whole pool. */
static void check_invariants(const struct pp_kv_cache *c)
{
    int *owner = calloc((size_t)c->n_blocks, sizeof(int));
    assert_non_null(owner);
    for (int32_t i = 0; i < c->n_free; i++) {
        assert_in_range(c->free_list[i], 0, c->n_blocks - 1);
        assert_int_equal(owner[c->free_list[i]]++, 0);
    }
    int32_t held = 0;
    for (int32_t s = 0; s < c->max_seqs; s++) {
        if (!c->seqs[s].in_use) {
            assert_int_equal(c->seqs[s].n_blocks, 0);
            continue;
        }
        assert_in_range(c->seqs[s].n_blocks, 0, c->max_blocks_per_seq);
        for (int32_t b = 0; b < c->seqs[s].n_blocks; b++) {
            assert_in_range(c->seqs[s].blocks[b], 0, c->n_blocks - 1);
            assert_int_equal(owner[c->seqs[s].blocks[b]]++, 0);
        }
        held += c->seqs[s].n_blocks;
    }
    assert_int_equal(held + c->n_free, c->n_blocks);
    free(owner);
}

static void test_capacity_from_budget(void **state)
{
    (void)state;
    assert_int_equal(pp_kv_block_bytes(LAYERS, KV_DIM, BS), (int64_t)LAYERS * 2 * BS * KV_DIM * 4);
    /* 64-bit: a big block does not wrap */
    assert_true(pp_kv_block_bytes(80, 8192, 256) == (int64_t)80 * 2 * 256 * 8192 * 4);

    int64_t kv_before = pp_mem_live(PP_MEM_KV);
    struct pp_kv_cache *c = cache_new(10, 4, 64);
    assert_int_equal(c->n_blocks, 10);
    assert_int_equal(pp_kv_cache_free_blocks(c), 10);
    assert_int_equal(pp_kv_cache_active_seqs(c), 0);
    assert_int_equal(c->max_blocks_per_seq, 16);
    /* the view the kernels get describes this pool */
    assert_int_equal(c->view.n_layers, LAYERS);
    assert_int_equal(c->view.block_size, BS);
    assert_int_equal(c->view.kv_dim, KV_DIM);
    assert_int_equal(c->view.block_elems, BS * KV_DIM);
    assert_non_null(c->view.pool);
    assert_int_equal((uintptr_t)c->view.pool % 64, 0);
    /* the pool is counted as KV memory, and only while it lives */
    assert_int_equal(pp_mem_live(PP_MEM_KV) - kv_before, 10 * block_bytes());
    pp_kv_cache_free(c);
    assert_int_equal(pp_mem_live(PP_MEM_KV), kv_before);
    pp_kv_cache_free(NULL);
}

static void test_invalid_arguments(void **state)
{
    (void)state;
    struct pp_kv_cache *c = NULL;
    pp_error_clear();
    /* a budget below one block: the message says what one block takes */
    assert_int_equal(pp_kv_cache_new(LAYERS, KV_DIM, BS, block_bytes() - 1, 4, 64, &c),
                     PP_ERR_INVALID_ARG);
    assert_non_null(strstr(pp_error_detail(), "budget"));
    assert_int_equal(pp_kv_cache_new(LAYERS, KV_DIM, BS, -1, 4, 64, &c), PP_ERR_INVALID_ARG);
    assert_int_equal(pp_kv_cache_new(0, KV_DIM, BS, 1 << 20, 4, 64, &c), PP_ERR_INVALID_ARG);
    assert_int_equal(pp_kv_cache_new(LAYERS, 0, BS, 1 << 20, 4, 64, &c), PP_ERR_INVALID_ARG);
    assert_int_equal(pp_kv_cache_new(LAYERS, KV_DIM, 0, 1 << 20, 4, 64, &c), PP_ERR_INVALID_ARG);
    assert_int_equal(pp_kv_cache_new(LAYERS, KV_DIM, BS, 1 << 20, 0, 64, &c), PP_ERR_INVALID_ARG);
    assert_int_equal(pp_kv_cache_new(LAYERS, KV_DIM, BS, 1 << 20, 4, 0, &c), PP_ERR_INVALID_ARG);
}

static void test_create_find_duplicates_and_slots(void **state)
{
    (void)state;
    struct pp_kv_cache *c = cache_new(8, 3, 32);
    struct pp_kv_seq *a, *b, *d, *x;
    assert_int_equal(pp_kv_cache_create(c, 100, &a), PP_OK);
    assert_int_equal(pp_kv_cache_create(c, UINT64_MAX, &b), PP_OK); /* ids are full 64-bit */
    assert_ptr_equal(pp_kv_cache_find(c, 100), a);
    assert_ptr_equal(pp_kv_cache_find(c, UINT64_MAX), b);
    assert_null(pp_kv_cache_find(c, 101));
    assert_int_equal(a->len, 0);
    assert_int_equal(a->n_blocks, 0);

    pp_error_clear();
    assert_int_equal(pp_kv_cache_create(c, 100, &x), PP_ERR_INVALID_ARG);
    assert_non_null(strstr(pp_error_detail(), "100"));
    assert_non_null(strstr(pp_error_detail(), "exists"));

    assert_int_equal(pp_kv_cache_create(c, 0, &d), PP_OK);
    assert_int_equal(pp_kv_cache_active_seqs(c), 3);
    /* all slots taken */
    pp_error_clear();
    assert_int_equal(pp_kv_cache_create(c, 7, &x), PP_ERR_EXHAUSTED);
    assert_non_null(strstr(pp_error_detail(), "slots"));
    /* a released slot is free again, and the id can be used anew */
    assert_int_equal(pp_kv_cache_release(c, 100), 1);
    assert_int_equal(pp_kv_cache_active_seqs(c), 2);
    assert_null(pp_kv_cache_find(c, 100));
    assert_int_equal(pp_kv_cache_create(c, 7, &x), PP_OK);
    assert_int_equal(pp_kv_cache_create(c, 100, &x), PP_ERR_EXHAUSTED);
    assert_int_equal(pp_kv_cache_release(c, 7), 1);
    assert_int_equal(pp_kv_cache_create(c, 100, &x), PP_OK);
    check_invariants(c);
    pp_kv_cache_free(c);
}

static void test_reserve_grows_block_table(void **state)
{
    (void)state;
    struct pp_kv_cache *c = cache_new(10, 2, 40);
    struct pp_kv_seq *s;
    assert_int_equal(pp_kv_cache_create(c, 1, &s), PP_OK);
    assert_int_equal(pp_kv_cache_blocks_needed(c, s, 0), 0);
    assert_int_equal(pp_kv_cache_blocks_needed(c, s, 1), 1);
    assert_int_equal(pp_kv_cache_blocks_needed(c, s, BS), 1);
    assert_int_equal(pp_kv_cache_blocks_needed(c, s, BS + 1), 2);

    assert_int_equal(pp_kv_cache_reserve(c, s, 5), PP_OK);
    assert_int_equal(s->n_blocks, 2);
    assert_int_equal(pp_kv_cache_free_blocks(c), 8);
    /* room already there: nothing changes */
    assert_int_equal(pp_kv_cache_reserve(c, s, 8), PP_OK);
    assert_int_equal(pp_kv_cache_reserve(c, s, 3), PP_OK);
    assert_int_equal(s->n_blocks, 2);
    assert_int_equal(pp_kv_cache_blocks_needed(c, s, 8), 0);
    assert_int_equal(pp_kv_cache_blocks_needed(c, s, 9), 1);
    /* growing keeps the blocks already held, in order */
    int32_t first[2] = {s->blocks[0], s->blocks[1]};
    assert_int_equal(pp_kv_cache_reserve(c, s, 13), PP_OK);
    assert_int_equal(s->n_blocks, 4);
    assert_int_equal(s->blocks[0], first[0]);
    assert_int_equal(s->blocks[1], first[1]);
    /* the cache never touches len: the executor sets it once K/V are stored */
    assert_int_equal(s->len, 0);
    check_invariants(c);
    pp_kv_cache_free(c);
}

/* A reserve the pool cannot satisfy fails whole: the sequence keeps its blocks, no block leaves
 * the free list. */
static void test_exhaustion_leaves_sequence_unchanged(void **state)
{
    (void)state;
    struct pp_kv_cache *c = cache_new(5, 2, 64);
    struct pp_kv_seq *a, *b;
    assert_int_equal(pp_kv_cache_create(c, 1, &a), PP_OK);
    assert_int_equal(pp_kv_cache_create(c, 2, &b), PP_OK);
    assert_int_equal(pp_kv_cache_reserve(c, a, 3 * BS), PP_OK);
    assert_int_equal(pp_kv_cache_reserve(c, b, BS), PP_OK);
    assert_int_equal(pp_kv_cache_free_blocks(c), 1);

    struct pp_kv_seq saved = *b;
    int32_t saved_blocks[1] = {b->blocks[0]};
    pp_error_clear();
    assert_int_equal(pp_kv_cache_reserve(c, b, 3 * BS), PP_ERR_EXHAUSTED); /* needs 2, 1 free */
    assert_non_null(strstr(pp_error_detail(), "blocks"));
    assert_int_equal(b->n_blocks, saved.n_blocks);
    assert_int_equal(b->len, saved.len);
    assert_int_equal(b->blocks[0], saved_blocks[0]);
    assert_int_equal(pp_kv_cache_free_blocks(c), 1);
    check_invariants(c);
    /* what does fit still goes through */
    assert_int_equal(pp_kv_cache_reserve(c, b, 2 * BS), PP_OK);
    assert_int_equal(pp_kv_cache_free_blocks(c), 0);
    assert_int_equal(pp_kv_cache_reserve(c, b, 2 * BS + 1), PP_ERR_EXHAUSTED);
    check_invariants(c);
    pp_kv_cache_free(c);
}

static void test_max_context(void **state)
{
    (void)state;
    /* max_context not a multiple of the block size: the table still covers it */
    struct pp_kv_cache *c = cache_new(20, 1, 4 * BS + 2);
    assert_int_equal(c->max_blocks_per_seq, 5);
    struct pp_kv_seq *s;
    assert_int_equal(pp_kv_cache_create(c, 9, &s), PP_OK);
    assert_int_equal(pp_kv_cache_reserve(c, s, 4 * BS + 2), PP_OK);
    assert_int_equal(s->n_blocks, 5);
    pp_error_clear();
    assert_int_equal(pp_kv_cache_reserve(c, s, 4 * BS + 3), PP_ERR_OUT_OF_RANGE);
    assert_non_null(strstr(pp_error_detail(), "context"));
    assert_int_equal(s->n_blocks, 5);
    assert_int_equal(pp_kv_cache_free_blocks(c), 15);
    check_invariants(c);
    pp_kv_cache_free(c);
}

/* Released blocks go back to the pool and are handed out again (most recently freed first). */
static void test_release_returns_and_reuses_blocks(void **state)
{
    (void)state;
    struct pp_kv_cache *c = cache_new(6, 3, 64);
    struct pp_kv_seq *a, *b;
    assert_int_equal(pp_kv_cache_create(c, 1, &a), PP_OK);
    assert_int_equal(pp_kv_cache_reserve(c, a, 3 * BS), PP_OK);
    int32_t held[3];
    memcpy(held, a->blocks, sizeof(held));
    assert_int_equal(pp_kv_cache_free_blocks(c), 3);

    assert_int_equal(pp_kv_cache_release(c, 1), 1);
    assert_int_equal(pp_kv_cache_free_blocks(c), 6);
    assert_int_equal(pp_kv_cache_release(c, 1), 0);   /* already gone */
    assert_int_equal(pp_kv_cache_release(c, 999), 0); /* never existed */
    assert_int_equal(pp_kv_cache_free_blocks(c), 6);

    assert_int_equal(pp_kv_cache_create(c, 2, &b), PP_OK);
    assert_int_equal(pp_kv_cache_reserve(c, b, 3 * BS), PP_OK);
    /* the very blocks just released, in the same order */
    assert_memory_equal(b->blocks, held, sizeof(held));
    check_invariants(c);

    /* the whole pool can be taken by one sequence after all others are gone */
    assert_int_equal(pp_kv_cache_release(c, 2), 1);
    struct pp_kv_seq *d;
    assert_int_equal(pp_kv_cache_create(c, 3, &d), PP_OK);
    assert_int_equal(pp_kv_cache_reserve(c, d, 6 * BS), PP_OK);
    assert_int_equal(pp_kv_cache_free_blocks(c), 0);
    check_invariants(c);
    pp_kv_cache_free(c);
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Random create / grow / release traffic, checking the pool's invariants after every step. */
static void test_random_traffic(void **state)
{
    (void)state;
    struct pp_kv_cache *c = cache_new(23, 5, 50);
    uint64_t seed = 5, next_id = 1;
    for (int step = 0; step < 3000; step++) {
        uint64_t r = rng_next(&seed);
        uint64_t id = 1 + (r >> 8) % next_id;
        struct pp_kv_seq *s = pp_kv_cache_find(c, id);
        switch (r % 4) {
        case 0:
            if (pp_kv_cache_create(c, next_id, &s) == PP_OK)
                next_id++;
            break;
        case 1:
        case 2:
            if (s) {
                int32_t want = (int32_t)((r >> 20) % 60);
                int32_t before_free = c->n_free, before_blocks = s->n_blocks;
                int32_t need = pp_kv_cache_blocks_needed(c, s, want);
                pp_status st = pp_kv_cache_reserve(c, s, want);
                if (st == PP_OK) {
                    assert_int_equal(c->n_free, before_free - need);
                    assert_true(s->n_blocks * BS >= want);
                } else {
                    assert_true(st == PP_ERR_EXHAUSTED || st == PP_ERR_OUT_OF_RANGE);
                    assert_int_equal(c->n_free, before_free);
                    assert_int_equal(s->n_blocks, before_blocks);
                }
            }
            break;
        default:
            assert_int_equal(pp_kv_cache_release(c, id), s != NULL);
            break;
        }
        check_invariants(c);
    }
    pp_kv_cache_free(c);
}

/* Each allocation of pp_kv_cache_new may fail: NOMEM and nothing leaked. */
static void test_alloc_failures(void **state)
{
    (void)state;
    int64_t misc = pp_mem_live(PP_MEM_MISC), kv = pp_mem_live(PP_MEM_KV);
    int nth;
    for (nth = 1; nth < 50; nth++) {
        struct pp_kv_cache *c = NULL;
        pp_alloc_fail_at(nth);
        pp_status st = pp_kv_cache_new(LAYERS, KV_DIM, BS, 8 * block_bytes(), 4, 64, &c);
        pp_alloc_fail_at(0);
        if (st == PP_OK) {
            pp_kv_cache_free(c);
            break;
        }
        assert_int_equal(st, PP_ERR_NOMEM);
        assert_int_equal(pp_mem_live(PP_MEM_MISC), misc);
        assert_int_equal(pp_mem_live(PP_MEM_KV), kv);
    }
    /* past the cache, the pool, the free list and the slots: a block table failed too */
    assert_true(nth > 5);
    assert_int_equal(pp_mem_live(PP_MEM_MISC), misc);
    assert_int_equal(pp_mem_live(PP_MEM_KV), kv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_capacity_from_budget),
        cmocka_unit_test(test_invalid_arguments),
        cmocka_unit_test(test_create_find_duplicates_and_slots),
        cmocka_unit_test(test_reserve_grows_block_table),
        cmocka_unit_test(test_exhaustion_leaves_sequence_unchanged),
        cmocka_unit_test(test_max_context),
        cmocka_unit_test(test_release_returns_and_reuses_blocks),
        cmocka_unit_test(test_random_traffic),
        cmocka_unit_test(test_alloc_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
