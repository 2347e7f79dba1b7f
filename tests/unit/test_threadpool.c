/* Unit tests of kernels/cpu/threadpool: every item is handed out exactly once, in contiguous
 * grain-aligned ranges, one range per thread, with the caller as worker 0. The kernels'
 * bit-identity across thread counts rests on this. */
#include "testutil.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "common/spin.h"
#include "kernels/cpu/threadpool.h"

#define MAX_ITEMS 2048
#define MAX_THREADS 8

struct visit {
    _Atomic int hits[MAX_ITEMS];
    _Atomic int calls_per_thread[MAX_THREADS];
    _Atomic int bad; /* a violated rule, recorded here because cmocka asserts are not thread-safe */
    int64_t grain;
    int n_threads;
    pthread_t caller;
};

static void visit_fn(void *ctx, int64_t begin, int64_t end, int thread)
{
    struct visit *v = ctx;
    if (thread < 0 || thread >= v->n_threads || begin >= end || begin < 0)
        atomic_store(&v->bad, 1);
    else if (begin % v->grain != 0)
        atomic_store(&v->bad, 2); /* a range starts on a grain boundary */
    else if (thread == 0 && !pthread_equal(pthread_self(), v->caller))
        atomic_store(&v->bad, 3); /* worker 0 is the calling thread */
    else
        atomic_fetch_add(&v->calls_per_thread[thread], 1);
    for (int64_t i = begin; i < end && i < MAX_ITEMS; i++)
        atomic_fetch_add(&v->hits[i], 1);
}

static void run_and_check(struct pp_threadpool *p, int n_threads, int64_t n_items, int64_t grain)
{
    static struct visit v;
    memset(&v, 0, sizeof(v));
    v.grain = grain < 1 ? 1 : grain;
    v.n_threads = n_threads;
    v.caller = pthread_self();
    pp_threadpool_run(p, visit_fn, &v, n_items, grain);
    if (atomic_load(&v.bad))
        fail_msg("threads=%d items=%lld grain=%lld: rule %d broken", n_threads,
                 (long long)n_items, (long long)grain, atomic_load(&v.bad));
    for (int64_t i = 0; i < MAX_ITEMS; i++) {
        int want = i < n_items ? 1 : 0;
        if (atomic_load(&v.hits[i]) != want)
            fail_msg("threads=%d items=%lld grain=%lld: item %lld visited %d times", n_threads,
                     (long long)n_items, (long long)grain, (long long)i, atomic_load(&v.hits[i]));
    }
    /* one contiguous range per thread at most */
    for (int t = 0; t < n_threads; t++)
        assert_in_range(atomic_load(&v.calls_per_thread[t]), 0, 1);
}

static void test_every_item_once(void **state)
{
    (void)state;
    const int64_t items[] = {0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 100, 999, 1000, 1001, 2048};
    const int64_t grains[] = {0, 1, 2, 3, 4, 8, 16, 64, 5000};
    for (int n_threads = 1; n_threads <= 5; n_threads++) {
        struct pp_threadpool *p = NULL;
        assert_int_equal(pp_threadpool_new(n_threads, &p), PP_OK);
        assert_int_equal(pp_threadpool_size(p), n_threads);
        for (size_t i = 0; i < sizeof(items) / sizeof(items[0]); i++)
            for (size_t g = 0; g < sizeof(grains) / sizeof(grains[0]); g++)
                run_and_check(p, n_threads, items[i], grains[g]);
        pp_threadpool_free(p);
    }
}

/* The chunks of one dynamic job, recorded as threads take them. */
struct chunks {
    _Atomic int n;
    int64_t begin[MAX_ITEMS], end[MAX_ITEMS];
};

static void chunk_fn(void *ctx, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    struct chunks *c = ctx;
    int i = atomic_fetch_add(&c->n, 1);
    if (i < MAX_ITEMS) {
        c->begin[i] = begin;
        c->end[i] = end;
    }
}

static int by_begin(const void *a, const void *b)
{
    const int64_t *x = a, *y = b;
    return (x[0] > y[0]) - (x[0] < y[0]);
}

/* A dynamic job hands out every item once, in chunks that start on a multiple of min_grain, hold
 * grain items while plenty are left and shrink towards the end: the chunks in order never grow,
 * and the last whole one has min_grain items (with fixed chunks of 96, the tail of 1000 items
 * would be one chunk of 40 and a thread could wait for a whole 96). */
static void test_dynamic_chunks_shrink(void **state)
{
    (void)state;
    static struct chunks c;
    static int64_t pairs[MAX_ITEMS][2];
    const int64_t items[] = {1, 23, 24, 25, 200, 1000, 2048};
    for (int n_threads = 1; n_threads <= 4; n_threads++) {
        struct pp_threadpool *p = NULL;
        assert_int_equal(pp_threadpool_new(n_threads, &p), PP_OK);
        for (size_t k = 0; k < sizeof(items) / sizeof(items[0]); k++) {
            int64_t n = items[k];
            memset(&c, 0, sizeof(c));
            pp_threadpool_run_dynamic(p, chunk_fn, &c, n, 96, 24);
            int m = atomic_load(&c.n);
            assert_in_range(m, 1, MAX_ITEMS - 1);
            for (int i = 0; i < m; i++) {
                pairs[i][0] = c.begin[i];
                pairs[i][1] = c.end[i];
            }
            qsort(pairs, (size_t)m, sizeof(pairs[0]), by_begin);
            int64_t at = 0, last_size = 96;
            for (int i = 0; i < m; i++) {
                int64_t size = pairs[i][1] - pairs[i][0];
                if (n <= 96 || n_threads == 1) { /* run inline in one call */
                    assert_int_equal(m, 1);
                    assert_int_equal(size, n);
                    break;
                }
                assert_int_equal(pairs[i][0], at); /* contiguous: every item once */
                assert_int_equal(pairs[i][0] % 24, 0);
                assert_true(size <= last_size);
                if (pairs[i][1] < n) {
                    assert_int_equal(size % 24, 0);
                    last_size = size;
                }
                at = pairs[i][1];
            }
            if (n > 96 && n_threads > 1) {
                assert_int_equal(at, n);
                assert_int_equal(last_size, 24);
            }
        }
        pp_threadpool_free(p);
    }
}

struct inline_rec {
    int calls;
    int64_t begin, end;
    int thread;
    pthread_t who;
};

static void record_fn(void *ctx, int64_t begin, int64_t end, int thread)
{
    struct inline_rec *r = ctx;
    r->calls++;
    r->begin = begin;
    r->end = end;
    r->thread = thread;
    r->who = pthread_self();
}

/* A pool of one runs the whole range inline on the caller, in one call. */
static void test_pool_of_one(void **state)
{
    (void)state;
    struct pp_threadpool *p = NULL;
    assert_int_equal(pp_threadpool_new(1, &p), PP_OK);
    struct inline_rec r = {0};
    pp_threadpool_run(p, record_fn, &r, 12345, 7);
    assert_int_equal(r.calls, 1);
    assert_int_equal(r.begin, 0);
    assert_int_equal(r.end, 12345);
    assert_int_equal(r.thread, 0);
    assert_true(pthread_equal(r.who, pthread_self()));
    /* nothing to do: fn is not called */
    memset(&r, 0, sizeof(r));
    pp_threadpool_run(p, record_fn, &r, 0, 1);
    pp_threadpool_run(p, record_fn, &r, -5, 1);
    assert_int_equal(r.calls, 0);
    pp_threadpool_free(p);
}

static void sum_fn(void *ctx, int64_t begin, int64_t end, int thread)
{
    /* per-thread slot without atomics: each thread index is used by one thread at a time */
    int64_t *partial = ctx;
    for (int64_t i = begin; i < end; i++)
        partial[thread] += i;
}

/* Thousands of back-to-back jobs: a worker that missed a wake-up or ran a job twice would show in
 * the sums (and hang or race under the sanitizers). */
static void test_many_runs(void **state)
{
    (void)state;
    struct pp_threadpool *p = NULL;
    assert_int_equal(pp_threadpool_new(4, &p), PP_OK);
    for (int run = 0; run < 3000; run++) {
        int64_t partial[4] = {0};
        int64_t n = 1 + run % 97;
        pp_threadpool_run(p, sum_fn, partial, n, 1 + run % 5);
        assert_int_equal(partial[0] + partial[1] + partial[2] + partial[3], n * (n - 1) / 2);
    }
    pp_threadpool_free(p);
}

/* A pool whose threads share one CPU (the scheduler may put a worker beside its caller): a waiter
 * that only spun would hold the CPU for its whole spin budget (PP_SPIN_NS) while the thread it
 * waits for cannot run, so each job would cost at least that much CPU time. Spinners yield, so
 * 200 jobs cost far less than 200 budgets. CPU time, not wall time: other processes on that CPU
 * (ctest runs tests side by side) lengthen the wall time but not this process's CPU time. */
static void test_one_cpu_no_stall(void **state)
{
    (void)state;
    cpu_set_t old, one;
    assert_int_equal(sched_getaffinity(0, sizeof(old), &old), 0);
    int cpu = 0;
    while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &old))
        cpu++;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    /* the calling thread, and so the workers created after it, run on that CPU only */
    assert_int_equal(sched_setaffinity(0, sizeof(one), &one), 0);
    struct pp_threadpool *p = NULL;
    assert_int_equal(pp_threadpool_new(2, &p), PP_OK);
    const int jobs = 200;
    struct timespec t0, t1;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t0);
    for (int run = 0; run < jobs; run++) {
        int64_t partial[2] = {0};
        pp_threadpool_run_dynamic(p, sum_fn, partial, 64, 8, 8);
        assert_int_equal(partial[0] + partial[1], 64 * 63 / 2);
    }
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t1);
    pp_threadpool_free(p);
    assert_int_equal(sched_setaffinity(0, sizeof(old), &old), 0);
    double ns = (double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec);
    /* a quarter of the budget per job on average, at most (without the yield: the whole budget
     * or more for each) */
    if (ns > jobs * (PP_SPIN_NS / 4.0))
        fail_msg("%d jobs on one CPU took %.1f ms of CPU time: waiters held the CPU (spin "
                 "budget %.1f ms)",
                 jobs, ns / 1e6, PP_SPIN_NS / 1e6);
}

static void test_invalid_sizes(void **state)
{
    (void)state;
    struct pp_threadpool *p = NULL;
    const int bad[] = {0, -1, 1025};
    for (int i = 0; i < 3; i++) {
        pp_error_clear();
        assert_int_equal(pp_threadpool_new(bad[i], &p), PP_ERR_INVALID_ARG);
        assert_non_null(strstr(pp_error_detail(), "threads"));
    }
    pp_threadpool_free(NULL); /* NULL-safe */
}

/* Every allocation of pp_threadpool_new may fail: it reports NOMEM, starts no stray thread and
 * leaks nothing (worker arguments are freed by the workers, which free() joins). */
static void test_alloc_failures(void **state)
{
    (void)state;
    int64_t before = pp_mem_live(PP_MEM_MISC);
    int failures = 0;
    for (int nth = 1; nth < 50; nth++) {
        struct pp_threadpool *p = NULL;
        pp_alloc_fail_at(nth);
        pp_status st = pp_threadpool_new(4, &p);
        pp_alloc_fail_at(0);
        if (st == PP_OK) {
            int64_t partial[4] = {0};
            pp_threadpool_run(p, sum_fn, partial, 100, 1);
            assert_int_equal(partial[0] + partial[1] + partial[2] + partial[3], 4950);
            pp_threadpool_free(p);
            break;
        }
        assert_int_equal(st, PP_ERR_NOMEM);
        assert_int_equal(pp_mem_live(PP_MEM_MISC), before);
        failures++;
    }
    /* past the pool and its thread array: a worker's argument failed after other workers started */
    assert_true(failures >= 3);
    assert_int_equal(pp_mem_live(PP_MEM_MISC), before);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_item_once),
        cmocka_unit_test(test_dynamic_chunks_shrink),
        cmocka_unit_test(test_pool_of_one),
        cmocka_unit_test(test_many_runs),
        cmocka_unit_test(test_one_cpu_no_stall),
        cmocka_unit_test(test_invalid_sizes),
        cmocka_unit_test(test_alloc_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
