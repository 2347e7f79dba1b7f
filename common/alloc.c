/* Counting allocator. Each block carries a 64-byte header with its size, so pp_free can account
 * without a lookup and aligned blocks stay 64-byte aligned. Huge-page blocks are mappings of their
 * own, whose size the caller gives back on release. */
#include "common/alloc.h"

#include <malloc.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define HEADER 64

static _Atomic int64_t live[PP_MEM_CATEGORY_COUNT];
static _Atomic int64_t fail_countdown;

static const char *const category_names[PP_MEM_CATEGORY_COUNT] = {
    "misc", "weights", "kv", "activations", "rpc",
};

static int should_fail(void)
{
    int64_t n = atomic_load(&fail_countdown);
    while (n > 0) {
        if (atomic_compare_exchange_weak(&fail_countdown, &n, n - 1))
            return n == 1;
    }
    return 0;
}

void *pp_alloc_aligned(enum pp_mem_category cat, size_t size)
{
    if (should_fail() || size > SIZE_MAX - HEADER)
        return NULL;
    void *raw = NULL;
    if (posix_memalign(&raw, HEADER, size + HEADER) != 0)
        return NULL;
    *(size_t *)raw = size;
    atomic_fetch_add(&live[cat], (int64_t)size);
    return (char *)raw + HEADER;
}

void *pp_alloc(enum pp_mem_category cat, size_t size)
{
    return pp_alloc_aligned(cat, size);
}

void *pp_calloc(enum pp_mem_category cat, size_t n, size_t size)
{
    if (size != 0 && n > SIZE_MAX / size)
        return NULL;
    void *p = pp_alloc_aligned(cat, n * size);
    if (p)
        memset(p, 0, n * size);
    return p;
}

void pp_free(enum pp_mem_category cat, void *p)
{
    if (!p)
        return;
    char *raw = (char *)p - HEADER;
    atomic_fetch_sub(&live[cat], (int64_t) * (size_t *)raw);
    free(raw);
}

int64_t pp_mem_live(enum pp_mem_category cat)
{
    return atomic_load(&live[cat]);
}

const char *pp_mem_category_name(enum pp_mem_category cat)
{
    return (unsigned)cat < PP_MEM_CATEGORY_COUNT ? category_names[cat] : "unknown";
}

#define HUGE_PAGE ((size_t)2 << 20)

/* The mapping's length: size rounded up to whole small pages. */
static size_t huge_len(size_t size)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    return ((size ? size : 1) + page - 1) / page * page;
}

int pp_alloc_keep_large_buffers(void)
{
#ifdef M_MMAP_THRESHOLD
    return mallopt(M_MMAP_THRESHOLD, 64 << 20) == 1 && mallopt(M_TRIM_THRESHOLD, 128 << 20) == 1;
#else
    return 0;
#endif
}

void *pp_alloc_huge(enum pp_mem_category cat, size_t size)
{
    if (should_fail() || size > SIZE_MAX / 2)
        return NULL;
    size_t len = huge_len(size);
    /* from 2 MiB up, map 2 MiB more and trim both ends so that the block starts on a 2 MiB
     * boundary: otherwise its first and last huge pages would be small ones */
    size_t slack = len >= HUGE_PAGE ? HUGE_PAGE : 0;
    char *raw = mmap(NULL, len + slack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED)
        return NULL;
    char *p = raw;
    if (slack) {
        p = (char *)(((uintptr_t)raw + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
        if (p > raw)
            munmap(raw, (size_t)(p - raw));
        if (raw + len + slack > p + len)
            munmap(p + len, (size_t)(raw + len + slack - (p + len)));
    }
#ifdef MADV_HUGEPAGE
    (void)madvise(p, len, MADV_HUGEPAGE); /* EINVAL without THP: plain pages, still correct */
#endif
    atomic_fetch_add(&live[cat], (int64_t)size);
    return p;
}

void pp_free_huge(enum pp_mem_category cat, void *p, size_t size)
{
    if (!p)
        return;
    munmap(p, huge_len(size));
    atomic_fetch_sub(&live[cat], (int64_t)size);
}

void pp_alloc_fail_at(int64_t nth)
{
    atomic_store(&fail_countdown, nth);
}

char *pp_strndup(enum pp_mem_category cat, const char *s, size_t n)
{
    char *d = n < SIZE_MAX ? pp_alloc(cat, n + 1) : NULL;
    if (d) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

char *pp_strdup(enum pp_mem_category cat, const char *s)
{
    return pp_strndup(cat, s, strlen(s));
}
