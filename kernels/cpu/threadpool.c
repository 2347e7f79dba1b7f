/* Generation-counted pool: run() publishes a job and bumps the generation; workers pick it up, do
 * their range, and the last one to finish releases the caller.
 *
 * Decode runs a few hundred small jobs per token, each well under a millisecond, so a futex sleep
 * and wake per job would cost a visible share of the token. Workers therefore spin on the
 * generation for a short while after each job before they sleep on the condition variable, and the
 * caller spins on the pending count before it sleeps. The pool never starts more threads than asked
 * (the caller is worker 0), so spinning never competes with our own work. */
#include "kernels/cpu/threadpool.h"

#include <pthread.h>
#include <stdatomic.h>

#include "common/alloc.h"
#include "common/spin.h"


struct pp_threadpool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t wake;
    pthread_cond_t done;
    _Atomic uint64_t generation; /* bumped per job (release); workers acquire it */
    _Atomic int pending;         /* workers still running the current job */
    _Atomic int stop;
    /* the current job: written by run() before the generation is bumped */
    pp_task_fn fn;
    void *ctx;
    int64_t n_items;
    int64_t grain;
    int64_t min_grain;    /* dynamic: the smallest chunk, which every chunk is a multiple of */
    int dynamic;          /* chunks handed out in order from `next` instead of fixed ranges */
    _Atomic int64_t next; /* dynamic: the first item not yet handed out */
};

struct worker_arg {
    struct pp_threadpool *pool;
    int index;
};

/* The next chunk of a dynamic job: grain items while plenty are left, then a share of what is
 * left (1 / (2 · threads) of it, in multiples of min_grain), so that the threads run out of work
 * about together instead of one finishing a whole grain while the others wait. */
static int64_t dynamic_chunk(const struct pp_threadpool *p, int64_t left)
{
    int64_t share = (left + 2 * p->n_threads - 1) / (2 * p->n_threads);
    share = (share + p->min_grain - 1) / p->min_grain * p->min_grain;
    return share < p->grain ? share : p->grain;
}

static void run_share(struct pp_threadpool *p, int index)
{
    if (p->dynamic) {
        int64_t begin = atomic_load_explicit(&p->next, memory_order_relaxed);
        for (;;) {
            if (begin >= p->n_items)
                return;
            int64_t end = begin + dynamic_chunk(p, p->n_items - begin);
            if (end > p->n_items)
                end = p->n_items;
            /* on failure begin is reloaded with the current value */
            if (!atomic_compare_exchange_weak_explicit(&p->next, &begin, end,
                                                       memory_order_relaxed,
                                                       memory_order_relaxed))
                continue;
            p->fn(p->ctx, begin, end, index);
            begin = atomic_load_explicit(&p->next, memory_order_relaxed);
        }
    }
    int64_t chunks = (p->n_items + p->grain - 1) / p->grain;
    int64_t per = chunks / p->n_threads, extra = chunks % p->n_threads;
    int64_t c0 = index * per + (index < extra ? index : extra);
    int64_t c1 = c0 + per + (index < extra ? 1 : 0);
    int64_t begin = c0 * p->grain, end = c1 * p->grain;
    if (end > p->n_items)
        end = p->n_items;
    if (begin < end)
        p->fn(p->ctx, begin, end, index);
}

/* Spins until *v != old (returns 1) or PP_SPIN_NS pass (returns 0). */
static int spin_until_changed_u64(_Atomic uint64_t *v, uint64_t old, _Atomic int *stop)
{
    struct pp_spin spin = {0};
    for (;;) {
        if (atomic_load_explicit(v, memory_order_acquire) != old ||
            atomic_load_explicit(stop, memory_order_relaxed))
            return 1;
        if (pp_spin_expired(&spin))
            return 0;
    }
}

static void *worker_main(void *arg)
{
    struct worker_arg wa = *(struct worker_arg *)arg;
    pp_free(PP_MEM_MISC, arg);
    struct pp_threadpool *p = wa.pool;
    uint64_t seen = 0;
    for (;;) {
        if (!spin_until_changed_u64(&p->generation, seen, &p->stop)) {
            pthread_mutex_lock(&p->mu);
            while (!atomic_load(&p->stop) && atomic_load(&p->generation) == seen)
                pthread_cond_wait(&p->wake, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop))
            break;
        seen = atomic_load_explicit(&p->generation, memory_order_acquire);
        run_share(p, wa.index);
        if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1) {
            /* the caller may be asleep: take the lock so the signal cannot slip between its check
             * and its wait */
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
    }
    return NULL;
}

pp_status pp_threadpool_new(int n_threads, struct pp_threadpool **out)
{
    if (n_threads < 1 || n_threads > 1024)
        return pp_error(PP_ERR_INVALID_ARG, "threads: expected 1..1024, got %d", n_threads);
    struct pp_threadpool *p = pp_calloc(PP_MEM_MISC, 1, sizeof(*p));
    if (!p)
        return PP_ERR_NOMEM;
    p->n_threads = n_threads;
    atomic_init(&p->generation, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->stop, 0);
    atomic_init(&p->next, 0);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    p->threads = pp_calloc(PP_MEM_MISC, (size_t)n_threads, sizeof(pthread_t));
    if (!p->threads) {
        pp_threadpool_free(p);
        return PP_ERR_NOMEM;
    }
    for (int i = 1; i < n_threads; i++) {
        struct worker_arg *wa = pp_alloc(PP_MEM_MISC, sizeof(*wa));
        if (wa) {
            wa->pool = p;
            wa->index = i;
        }
        if (!wa || pthread_create(&p->threads[i], NULL, worker_main, wa) != 0) {
            pp_free(PP_MEM_MISC, wa);
            p->n_threads = i; /* join only those started */
            pp_threadpool_free(p);
            return pp_error(PP_ERR_NOMEM, "could not start worker thread %d", i);
        }
    }
    *out = p;
    return PP_OK;
}

void pp_threadpool_free(struct pp_threadpool *p)
{
    if (!p)
        return;
    if (p->threads) {
        pthread_mutex_lock(&p->mu);
        atomic_store(&p->stop, 1);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->mu);
        for (int i = 1; i < p->n_threads; i++)
            pthread_join(p->threads[i], NULL);
        pp_free(PP_MEM_MISC, p->threads);
    }
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    pp_free(PP_MEM_MISC, p);
}

int pp_threadpool_size(const struct pp_threadpool *p)
{
    return p->n_threads;
}

static void run_job(struct pp_threadpool *p, pp_task_fn fn, void *ctx, int64_t n_items,
                    int64_t grain, int64_t min_grain, int dynamic)
{
    if (n_items <= 0)
        return;
    if (grain < 1)
        grain = 1;
    if (min_grain < 1 || min_grain > grain)
        min_grain = grain;
    grain = grain / min_grain * min_grain;
    if (p->n_threads == 1 || n_items <= grain) {
        fn(ctx, 0, n_items, 0);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->n_items = n_items;
    p->grain = grain;
    p->min_grain = min_grain;
    p->dynamic = dynamic;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    atomic_store_explicit(&p->pending, p->n_threads - 1, memory_order_relaxed);
    /* publish the job; sleeping workers re-check the generation under the lock, so taking it here
     * orders this bump before their check or after their wait began */
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);

    run_share(p, 0);

    struct pp_spin spin = {0};
    while (atomic_load_explicit(&p->pending, memory_order_acquire) > 0) {
        if (pp_spin_expired(&spin)) {
            pthread_mutex_lock(&p->mu);
            while (atomic_load(&p->pending) > 0)
                pthread_cond_wait(&p->done, &p->mu);
            pthread_mutex_unlock(&p->mu);
            break;
        }
    }
}

void pp_threadpool_run(struct pp_threadpool *p, pp_task_fn fn, void *ctx, int64_t n_items,
                       int64_t grain)
{
    run_job(p, fn, ctx, n_items, grain, grain, 0);
}

void pp_threadpool_run_dynamic(struct pp_threadpool *p, pp_task_fn fn, void *ctx, int64_t n_items,
                               int64_t grain, int64_t min_grain)
{
    run_job(p, fn, ctx, n_items, grain, min_grain, 1);
}
