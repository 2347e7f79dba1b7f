/* A fixed pool of worker threads for the CPU kernels. The calling thread takes part as worker 0, so
 * a pool of n threads starts n-1 pthreads; a pool of 1 runs everything inline. Not reentrant: one
 * pp_threadpool_run at a time per pool (the executor owns its pool). */
#ifndef PP_THREADPOOL_H
#define PP_THREADPOOL_H

#include <stdint.h>

#include "common/status.h"

struct pp_threadpool;

/* fn(ctx, begin, end, thread) handles items [begin, end) on worker `thread` (0..size-1), so a task
 * may use per-thread scratch. */
typedef void (*pp_task_fn)(void *ctx, int64_t begin, int64_t end, int thread);

pp_status pp_threadpool_new(int n_threads, struct pp_threadpool **out);
void pp_threadpool_free(struct pp_threadpool *pool);
int pp_threadpool_size(const struct pp_threadpool *pool);

/* Splits [0, n_items) into contiguous ranges, one per thread, each a multiple of `grain` items
 * (except the last), runs fn on each and returns when all are done. The split only decides which
 * thread computes an item, never how an item is computed. */
void pp_threadpool_run(struct pp_threadpool *pool, pp_task_fn fn, void *ctx, int64_t n_items,
                       int64_t grain);

/* As pp_threadpool_run, but threads take chunks in order from a shared counter until none are
 * left: a thread that was preempted simply takes fewer chunks instead of holding the others at the
 * end of the job. A chunk is `grain` items while more than 2 · threads · grain are left, then
 * 1 / (2 · threads) of what is left, rounded up to a multiple of min_grain (at least min_grain),
 * so the last chunks are small and the threads finish close together. Every chunk starts on a
 * multiple of min_grain and all but the last end on one (grain is rounded down to a multiple;
 * min_grain < 1 or > grain means grain). Which thread computes a chunk varies from run to run,
 * so fn must compute each item the same way on any thread (the kernels do; per-thread scratch is
 * fine). */
void pp_threadpool_run_dynamic(struct pp_threadpool *pool, pp_task_fn fn, void *ctx,
                               int64_t n_items, int64_t grain, int64_t min_grain);

#endif
