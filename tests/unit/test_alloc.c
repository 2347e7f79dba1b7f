/* Unit tests of common/alloc: per-category byte counting (the memory metrics read it) and the
 * Nth-allocation failure that every other module's error-path tests rely on. */
#include "testutil.h"

#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

#include "common/alloc.h"

static void test_counts_per_category(void **state)
{
    (void)state;
    int64_t before[PP_MEM_CATEGORY_COUNT];
    for (int c = 0; c < PP_MEM_CATEGORY_COUNT; c++)
        before[c] = pp_mem_live((enum pp_mem_category)c);

    void *kv = pp_alloc(PP_MEM_KV, 1000);
    void *act = pp_calloc(PP_MEM_ACTIVATIONS, 10, 30);
    void *w = pp_alloc_aligned(PP_MEM_WEIGHTS, 77);
    assert_non_null(kv);
    assert_non_null(act);
    assert_non_null(w);
    assert_int_equal(pp_mem_live(PP_MEM_KV) - before[PP_MEM_KV], 1000);
    assert_int_equal(pp_mem_live(PP_MEM_ACTIVATIONS) - before[PP_MEM_ACTIVATIONS], 300);
    assert_int_equal(pp_mem_live(PP_MEM_WEIGHTS) - before[PP_MEM_WEIGHTS], 77);
    /* a category nobody touched stays put */
    assert_int_equal(pp_mem_live(PP_MEM_RPC), before[PP_MEM_RPC]);
    assert_int_equal(pp_mem_live(PP_MEM_MISC), before[PP_MEM_MISC]);

    pp_free(PP_MEM_KV, kv);
    pp_free(PP_MEM_ACTIVATIONS, act);
    pp_free(PP_MEM_WEIGHTS, w);
    for (int c = 0; c < PP_MEM_CATEGORY_COUNT; c++)
        assert_int_equal(pp_mem_live((enum pp_mem_category)c), before[c]);
}

static void test_calloc_zeroes_and_checks_overflow(void **state)
{
    (void)state;
    unsigned char *p = pp_calloc(PP_MEM_MISC, 333, 3);
    assert_non_null(p);
    for (int i = 0; i < 999; i++)
        assert_int_equal(p[i], 0);
    pp_free(PP_MEM_MISC, p);

    int64_t before = pp_mem_live(PP_MEM_MISC);
    /* n*size wraps around: must fail instead of handing out a tiny block */
    assert_null(pp_calloc(PP_MEM_MISC, SIZE_MAX / 2, 3));
    assert_null(pp_alloc(PP_MEM_MISC, SIZE_MAX - 10));
    assert_int_equal(pp_mem_live(PP_MEM_MISC), before);
}

static void test_alignment_and_zero_size(void **state)
{
    (void)state;
    void *blocks[16];
    for (int i = 0; i < 16; i++) {
        blocks[i] = i % 2 ? pp_alloc_aligned(PP_MEM_MISC, (size_t)i * 7 + 1)
                          : pp_alloc(PP_MEM_MISC, (size_t)i * 13 + 3);
        assert_non_null(blocks[i]);
        assert_int_equal((uintptr_t)blocks[i] % 64, 0);
    }
    for (int i = 0; i < 16; i++)
        pp_free(PP_MEM_MISC, blocks[i]);

    /* size 0 gives distinct non-NULL pointers, so callers need not special-case empty tensors */
    void *a = pp_alloc(PP_MEM_MISC, 0), *b = pp_alloc(PP_MEM_MISC, 0);
    assert_non_null(a);
    assert_non_null(b);
    assert_ptr_not_equal(a, b);
    pp_free(PP_MEM_MISC, a);
    pp_free(PP_MEM_MISC, b);
    pp_free(PP_MEM_MISC, NULL); /* NULL-safe */
}

static void test_fail_at_nth(void **state)
{
    (void)state;
    int64_t before = pp_mem_live(PP_MEM_MISC);

    pp_alloc_fail_at(1);
    assert_null(pp_alloc(PP_MEM_MISC, 8));
    /* it fails once, then allocation works again */
    void *p = pp_alloc(PP_MEM_MISC, 8);
    assert_non_null(p);
    pp_free(PP_MEM_MISC, p);

    /* the 3rd from now fails, through every entry point */
    pp_alloc_fail_at(3);
    void *a = pp_alloc(PP_MEM_MISC, 8);
    void *b = pp_calloc(PP_MEM_MISC, 2, 8);
    void *c = pp_alloc_aligned(PP_MEM_MISC, 8);
    void *d = pp_calloc(PP_MEM_MISC, 1, 8);
    assert_non_null(a);
    assert_non_null(b);
    assert_null(c);
    assert_non_null(d);
    pp_free(PP_MEM_MISC, a);
    pp_free(PP_MEM_MISC, b);
    pp_free(PP_MEM_MISC, d);

    pp_alloc_fail_at(2);
    void *e = pp_alloc(PP_MEM_MISC, 8);
    assert_non_null(e);
    pp_alloc_fail_at(0); /* disarms the pending failure: the would-be 2nd succeeds */
    void *f = pp_alloc(PP_MEM_MISC, 8);
    assert_non_null(f);
    pp_free(PP_MEM_MISC, e);
    pp_free(PP_MEM_MISC, f);
    assert_int_equal(pp_mem_live(PP_MEM_MISC), before);
}

/* A failed allocation is not counted, so the metrics stay right after an error path. */
static void test_failed_alloc_not_counted(void **state)
{
    (void)state;
    int64_t before = pp_mem_live(PP_MEM_RPC);
    pp_alloc_fail_at(1);
    assert_null(pp_alloc(PP_MEM_RPC, 4096));
    assert_int_equal(pp_mem_live(PP_MEM_RPC), before);
}

/* The VmFlags line of the mapping that holds p (from /proc/self/smaps), or "" when none. */
static void vm_flags(const void *p, char *out, size_t cap)
{
    out[0] = '\0';
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f)
        return;
    char line[512];
    int inside = 0;
    while (fgets(line, sizeof(line), f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' '))
            inside = (uintptr_t)p >= lo && (uintptr_t)p < hi;
        else if (inside && strncmp(line, "VmFlags:", 8) == 0) {
            snprintf(out, cap, "%s", line);
            break;
        }
    }
    fclose(f);
}

/* Huge-page blocks: zeroed, writable, counted, 2 MiB aligned from 2 MiB up, marked for huge
 * pages where the kernel has them, released exactly, and subject to the failure injection. */
static void test_huge_blocks(void **state)
{
    (void)state;
    const size_t sizes[] = {0, 100, (size_t)2 << 20, ((size_t)5 << 20) + 3};
    int64_t before = pp_mem_live(PP_MEM_WEIGHTS);
    unsigned char *p[4];
    int64_t total = 0;
    for (int i = 0; i < 4; i++) {
        p[i] = pp_alloc_huge(PP_MEM_WEIGHTS, sizes[i]);
        assert_non_null(p[i]);
        total += (int64_t)sizes[i];
        for (size_t k = 0; k < sizes[i]; k += 4093)
            assert_int_equal(p[i][k], 0);
        if (sizes[i]) {
            memset(p[i], 0xab, sizes[i]);
            assert_int_equal(p[i][sizes[i] - 1], 0xab);
        }
        if (sizes[i] >= ((size_t)2 << 20))
            assert_int_equal((uintptr_t)p[i] % ((uintptr_t)2 << 20), 0);
    }
    assert_int_equal(pp_mem_live(PP_MEM_WEIGHTS) - before, total);
    FILE *thp = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (thp) { /* MADV_HUGEPAGE shows as "hg" among the mapping's flags */
        fclose(thp);
        char flags[512];
        vm_flags(p[3], flags, sizeof(flags));
        assert_non_null(strstr(flags, " hg"));
    }
    for (int i = 0; i < 4; i++)
        pp_free_huge(PP_MEM_WEIGHTS, p[i], sizes[i]);
    pp_free_huge(PP_MEM_WEIGHTS, NULL, 10);
    assert_int_equal(pp_mem_live(PP_MEM_WEIGHTS), before);
    pp_alloc_fail_at(1);
    assert_null(pp_alloc_huge(PP_MEM_WEIGHTS, 4096));
    assert_int_equal(pp_mem_live(PP_MEM_WEIGHTS), before);
}

/* After pp_alloc_keep_large_buffers an 8 MiB buffer comes from the heap (not a mapping of its
 * own) and its memory stays there once freed. The sanitizers bring their own allocator, which
 * refuses the settings: there the call must say so. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZER_MALLOC 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SANITIZER_MALLOC 1
#endif
#endif

static void test_keep_large_buffers(void **state)
{
    (void)state;
#ifdef SANITIZER_MALLOC
    assert_int_equal(pp_alloc_keep_large_buffers(), 0);
#else
    assert_int_equal(pp_alloc_keep_large_buffers(), 1);
    size_t n = 8u << 20;
    struct mallinfo2 before = mallinfo2();
    char *p = malloc(n);
    assert_non_null(p);
    memset(p, 1, n);
    struct mallinfo2 during = mallinfo2();
    assert_true(during.hblkhd == before.hblkhd); /* no mapping of its own */
    free(p);
    struct mallinfo2 after = mallinfo2();
    assert_true(after.fordblks >= n); /* kept, not handed back */
#endif
}

static void test_category_names(void **state)
{
    (void)state;
    assert_string_equal(pp_mem_category_name(PP_MEM_MISC), "misc");
    assert_string_equal(pp_mem_category_name(PP_MEM_WEIGHTS), "weights");
    assert_string_equal(pp_mem_category_name(PP_MEM_KV), "kv");
    assert_string_equal(pp_mem_category_name(PP_MEM_ACTIVATIONS), "activations");
    assert_string_equal(pp_mem_category_name(PP_MEM_RPC), "rpc");
    assert_string_equal(pp_mem_category_name(PP_MEM_CATEGORY_COUNT), "unknown");
}

static void *churn(void *arg)
{
    (void)arg;
    for (int i = 0; i < 20000; i++) {
        void *p = pp_alloc(PP_MEM_RPC, (size_t)(i % 97) + 1);
        if (!p)
            return (void *)1;
        pp_free(PP_MEM_RPC, p);
    }
    return NULL;
}

/* The counters are shared by the executor, RPC and log threads: concurrent use must not lose
 * updates. */
static void test_counts_thread_safe(void **state)
{
    (void)state;
    int64_t before = pp_mem_live(PP_MEM_RPC);
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&t[i], NULL, churn, NULL), 0);
    for (int i = 0; i < 4; i++) {
        void *r;
        pthread_join(t[i], &r);
        assert_null(r);
    }
    assert_int_equal(pp_mem_live(PP_MEM_RPC), before);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counts_per_category),
        cmocka_unit_test(test_calloc_zeroes_and_checks_overflow),
        cmocka_unit_test(test_alignment_and_zero_size),
        cmocka_unit_test(test_fail_at_nth),
        cmocka_unit_test(test_failed_alloc_not_counted),
        cmocka_unit_test(test_huge_blocks),
        cmocka_unit_test(test_keep_large_buffers),
        cmocka_unit_test(test_category_names),
        cmocka_unit_test(test_counts_thread_safe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
