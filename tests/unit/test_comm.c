/* The CPU communicator (kernels/comm): all-reduce adds the ranks' values in rank order for every
 * element (bit-identical to a sequential sum, run after run), all-gather and broadcast move exactly
 * the ranks' bytes, the barrier holds every rank, for 1..5 ranks and sizes that are not multiples
 * of the 16-float slice unit. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/comm/comm.h"
#include "testutil.h"

#define MAX_RANKS 5
#define ROUNDS 20

static const int64_t sizes[] = {1, 15, 17, 1000, 4099};

struct rank_ctx {
    struct pp_comm *comm;
    int rank;
    int fails;
    _Atomic int *counter;
};

/* A value whose sums in different orders round differently. */
static float value(int rank, int64_t i, int round)
{
    uint32_t h = (uint32_t)(rank * 2654435761u) ^ (uint32_t)(i * 40503u) ^ (uint32_t)(round * 97u);
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    return ((float)(h & 0xffffff) / 16777216.0f - 0.5f) * (rank % 2 ? 1e4f : 1e-3f);
}

static void *rank_main(void *arg)
{
    struct rank_ctx *c = arg;
    int n = c->comm->n_ranks;
    float *buf = malloc(sizeof(float) * 4099), *send = malloc(sizeof(float) * 4099);
    float *recv = malloc(sizeof(float) * 4099 * MAX_RANKS);
    for (int round = 0; round < ROUNDS; round++) {
        for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
            int64_t m = sizes[k];
            for (int64_t i = 0; i < m; i++)
                buf[i] = value(c->rank, i, round);
            if (c->comm->ops->all_reduce_sum(c->comm, c->rank, buf, m) != PP_OK)
                c->fails++;
            for (int64_t i = 0; i < m; i++) {
                float want = value(0, i, round);
                for (int r = 1; r < n; r++)
                    want += value(r, i, round);
                if (memcmp(&want, &buf[i], sizeof(float)) != 0)
                    c->fails++;
            }
            for (int64_t i = 0; i < m; i++)
                send[i] = value(c->rank + 7, i, round);
            if (c->comm->ops->all_gather(c->comm, c->rank, send, recv, m) != PP_OK)
                c->fails++;
            for (int r = 0; r < n; r++)
                for (int64_t i = 0; i < m; i++)
                    if (recv[r * m + i] != value(r + 7, i, round))
                        c->fails++;
            int root = round % n;
            for (int64_t i = 0; i < m; i++)
                buf[i] = value(c->rank + 100, i, round);
            if (c->comm->ops->broadcast(c->comm, c->rank, buf, m, root) != PP_OK)
                c->fails++;
            for (int64_t i = 0; i < m; i++)
                if (buf[i] != value(root + 100, i, round))
                    c->fails++;
        }
        /* every rank counts before the barrier; after it every rank must see all the counts */
        atomic_fetch_add(c->counter, 1);
        c->comm->ops->barrier(c->comm, c->rank);
        if (atomic_load(c->counter) < (round + 1) * n)
            c->fails++;
        c->comm->ops->barrier(c->comm, c->rank);
    }
    free(buf);
    free(send);
    free(recv);
    return NULL;
}

static void run_ranks(int n)
{
    struct pp_comm *comm;
    assert_int_equal(pp_comm_cpu_new(n, &comm), PP_OK);
    assert_string_equal(comm->name, "cpu");
    _Atomic int counter = 0;
    pthread_t t[MAX_RANKS];
    struct rank_ctx ctx[MAX_RANKS];
    for (int r = 0; r < n; r++) {
        ctx[r] = (struct rank_ctx){comm, r, 0, &counter};
        assert_int_equal(pthread_create(&t[r], NULL, rank_main, &ctx[r]), 0);
    }
    for (int r = 0; r < n; r++) {
        pthread_join(t[r], NULL);
        assert_int_equal(ctx[r].fails, 0);
    }
    int64_t per_round = 0;
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++)
        per_round += sizes[k] * 4;
    assert_int_equal(comm->bytes_reduced, per_round * ROUNDS);
    assert_int_equal(comm->bytes_gathered, per_round * ROUNDS);
    pp_comm_free(comm);
}

static void test_collectives_1_to_5_ranks(void **state)
{
    (void)state;
    for (int n = 1; n <= MAX_RANKS; n++)
        run_ranks(n);
}

static void test_bad_rank_counts(void **state)
{
    (void)state;
    struct pp_comm *comm = NULL;
    assert_int_equal(pp_comm_cpu_new(0, &comm), PP_ERR_INVALID_ARG);
    assert_non_null(strstr(pp_error_detail(), "got 0"));
    assert_int_equal(pp_comm_cpu_new(65, &comm), PP_ERR_INVALID_ARG);
    pp_comm_free(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_collectives_1_to_5_ranks),
        cmocka_unit_test(test_bad_rank_counts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
