/* Generation-counted pool: run() publishes a job and bumps the generation; workers wake, do their
 * range, and the last one to finish signals the caller. */
#include "kernels/cpu/threadpool.h"

#include <pthread.h>

#include "common/alloc.h"

struct pp_threadpool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t wake;
    pthread_cond_t done;
    uint64_t generation; /* bumped per job; guarded by mu */
    int pending;         /* workers still running the current job */
    int stop;
    pp_task_fn fn;
    void *ctx;
    int64_t n_items;
    int64_t grain;
};

struct worker_arg {
    struct pp_threadpool *pool;
    int index;
};

static void run_share(struct pp_threadpool *p, int index)
{
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

static void *worker_main(void *arg)
{
    struct worker_arg wa = *(struct worker_arg *)arg;
    pp_free(PP_MEM_MISC, arg);
    struct pp_threadpool *p = wa.pool;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->generation == seen)
            pthread_cond_wait(&p->wake, &p->mu);
        if (p->stop)
            break;
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);
        run_share(p, wa.index);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0)
            pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
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
        p->stop = 1;
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

void pp_threadpool_run(struct pp_threadpool *p, pp_task_fn fn, void *ctx, int64_t n_items,
                       int64_t grain)
{
    if (n_items <= 0)
        return;
    if (grain < 1)
        grain = 1;
    if (p->n_threads == 1 || n_items <= grain) {
        fn(ctx, 0, n_items, 0);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->n_items = n_items;
    p->grain = grain;
    p->pending = p->n_threads - 1;
    p->generation++;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);

    run_share(p, 0);

    pthread_mutex_lock(&p->mu);
    while (p->pending > 0)
        pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
