/* Collectives among threads over shared memory. Each rank publishes a pointer to its buffer; after
 * a barrier, rank r computes slice r of the result by reading every rank's slice r and writes it
 * back into every rank's buffer. Slices are disjoint, so no rank reads what another writes, and a
 * second barrier makes every result visible. The per-element sum always runs over ranks 0..W-1 in
 * that order, whichever rank computes it.
 *
 * The barrier spins for a short while (collectives inside a layer are microseconds apart when every
 * rank has its own core) and then sleeps on a condition variable, so oversubscribed ranks do not
 * burn the core another rank needs. */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "common/alloc.h"
#include "common/spin.h"
#include "kernels/comm/comm.h"

#define MAX_RANKS 64
#define SUM_BLOCK 1024 /* floats summed per pass: one block of partial sums stays in L1 */

struct cpu_comm {
    int n;
    _Atomic int arrived;
    _Atomic uint64_t generation;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* the buffers of the collective in progress, one per rank; written before the first barrier */
    float *buf[MAX_RANKS];
    const float *send[MAX_RANKS];
};

static pp_status cpu_barrier(struct pp_comm *pc, int rank)
{
    struct cpu_comm *c = pc->impl;
    if (c->n == 1)
        return PP_OK;
    uint64_t gen = atomic_load_explicit(&c->generation, memory_order_acquire);
    if (atomic_fetch_add_explicit(&c->arrived, 1, memory_order_acq_rel) == c->n - 1) {
        atomic_store_explicit(&c->arrived, 0, memory_order_relaxed);
        pthread_mutex_lock(&c->mu);
        atomic_fetch_add_explicit(&c->generation, 1, memory_order_release);
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        return PP_OK;
    }
    struct pp_spin spin = {0};
    while (atomic_load_explicit(&c->generation, memory_order_acquire) == gen) {
        if (pp_spin_expired(&spin)) {
            pthread_mutex_lock(&c->mu);
            while (atomic_load_explicit(&c->generation, memory_order_acquire) == gen)
                pthread_cond_wait(&c->cv, &c->mu);
            pthread_mutex_unlock(&c->mu);
            break;
        }
    }
    return PP_OK;
}

/* Rank r's slice of n elements, in whole 16-float (64-byte) units so no two ranks write one cache
 * line. */
static void slice(int64_t n, int n_ranks, int rank, int64_t *begin, int64_t *end)
{
    int64_t units = (n + 15) / 16;
    int64_t b = units * rank / n_ranks * 16, e = units * (rank + 1) / n_ranks * 16;
    *begin = b < n ? b : n;
    *end = e < n ? e : n;
}

static pp_status cpu_all_reduce_sum(struct pp_comm *pc, int rank, float *buf, int64_t n)
{
    struct cpu_comm *c = pc->impl;
    if (rank == 0)
        __atomic_fetch_add(&pc->bytes_reduced, n * (int64_t)sizeof(float), __ATOMIC_RELAXED);
    if (c->n == 1)
        return PP_OK;
    c->buf[rank] = buf;
    cpu_barrier(pc, rank);
    int64_t b, e;
    slice(n, c->n, rank, &b, &e);
    float acc[SUM_BLOCK];
    for (int64_t i0 = b; i0 < e; i0 += SUM_BLOCK) {
        int64_t m = e - i0 < SUM_BLOCK ? e - i0 : SUM_BLOCK;
        memcpy(acc, c->buf[0] + i0, (size_t)m * sizeof(float));
        for (int r = 1; r < c->n; r++) {
            const float *src = c->buf[r] + i0;
            for (int64_t i = 0; i < m; i++)
                acc[i] += src[i];
        }
        for (int r = 0; r < c->n; r++)
            memcpy(c->buf[r] + i0, acc, (size_t)m * sizeof(float));
    }
    cpu_barrier(pc, rank);
    return PP_OK;
}

static pp_status cpu_all_gather(struct pp_comm *pc, int rank, const float *send, float *recv,
                                int64_t n)
{
    struct cpu_comm *c = pc->impl;
    if (rank == 0)
        __atomic_fetch_add(&pc->bytes_gathered, n * (int64_t)sizeof(float), __ATOMIC_RELAXED);
    c->send[rank] = send;
    cpu_barrier(pc, rank);
    for (int r = 0; r < c->n; r++)
        memcpy(recv + (int64_t)r * n, c->send[r], (size_t)n * sizeof(float));
    /* the senders' buffers must stay untouched until every rank has copied them */
    cpu_barrier(pc, rank);
    return PP_OK;
}

static pp_status cpu_broadcast(struct pp_comm *pc, int rank, float *buf, int64_t n, int root)
{
    struct cpu_comm *c = pc->impl;
    if (c->n == 1)
        return PP_OK;
    if (rank == root)
        c->send[root] = buf;
    cpu_barrier(pc, rank);
    if (rank != root)
        memcpy(buf, c->send[root], (size_t)n * sizeof(float));
    cpu_barrier(pc, rank);
    return PP_OK;
}

static void cpu_free(struct pp_comm *pc)
{
    struct cpu_comm *c = pc->impl;
    if (c) {
        pthread_mutex_destroy(&c->mu);
        pthread_cond_destroy(&c->cv);
        pp_free(PP_MEM_MISC, c);
    }
    pp_free(PP_MEM_MISC, pc);
}

static const struct pp_comm_ops cpu_ops = {
    .all_reduce_sum = cpu_all_reduce_sum,
    .all_gather = cpu_all_gather,
    .broadcast = cpu_broadcast,
    .barrier = cpu_barrier,
    .free = cpu_free,
};

pp_status pp_comm_cpu_new(int n_ranks, struct pp_comm **out)
{
    if (n_ranks < 1 || n_ranks > MAX_RANKS)
        return pp_error(PP_ERR_INVALID_ARG, "comm: expected 1..%d ranks, got %d", MAX_RANKS,
                        n_ranks);
    struct pp_comm *pc = pp_calloc(PP_MEM_MISC, 1, sizeof(*pc));
    struct cpu_comm *c = pp_calloc(PP_MEM_MISC, 1, sizeof(*c));
    if (!pc || !c) {
        pp_free(PP_MEM_MISC, pc);
        pp_free(PP_MEM_MISC, c);
        return PP_ERR_NOMEM;
    }
    c->n = n_ranks;
    atomic_init(&c->arrived, 0);
    atomic_init(&c->generation, 0);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    pc->ops = &cpu_ops;
    pc->name = "cpu";
    pc->n_ranks = n_ranks;
    pc->impl = c;
    *out = pc;
    return PP_OK;
}

void pp_comm_free(struct pp_comm *c)
{
    if (c)
        c->ops->free(c);
}
