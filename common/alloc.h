/* The project allocator: malloc/calloc/free that count live bytes per category (for metrics) and
 * can be told to fail the Nth allocation (for tests of error paths). Thread-safe. Memory from
 * pp_alloc/pp_calloc must be released with pp_free and the same category. */
#ifndef PP_ALLOC_H
#define PP_ALLOC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum pp_mem_category {
    PP_MEM_MISC = 0,
    PP_MEM_WEIGHTS, /* weights repacked or converted at load (mmapped weights are not counted) */
    PP_MEM_KV,      /* the KV cache pool */
    PP_MEM_ACTIVATIONS, /* executor scratch buffers */
    PP_MEM_RPC,         /* messages in flight */
    PP_MEM_CATEGORY_COUNT
};

/* size bytes, uninitialised; NULL on failure (size 0 returns a unique non-NULL pointer). */
void *pp_alloc(enum pp_mem_category cat, size_t size);
/* n*size zeroed bytes; NULL on failure or overflow. */
void *pp_calloc(enum pp_mem_category cat, size_t n, size_t size);
/* 64-byte aligned, uninitialised; release with pp_free. */
void *pp_alloc_aligned(enum pp_mem_category cat, size_t size);
/* NULL-safe. */
void pp_free(enum pp_mem_category cat, void *p);
/* size bytes of anonymous memory (zeroed, page aligned; 2 MiB aligned from 2 MiB up) that the
 * kernel is asked to back with 2 MiB pages (madvise MADV_HUGEPAGE; where it cannot, plain pages):
 * for large, long-lived buffers read end to end, such as weights copied in at load, which with
 * 4 KiB pages pay a TLB miss and a hardware-prefetch restart at every page edge. NULL on failure.
 * Release with pp_free_huge and the same category and size. */
void *pp_alloc_huge(enum pp_mem_category cat, size_t size);
/* NULL-safe. */
void pp_free_huge(enum pp_mem_category cat, void *p, size_t size);
/* For a daemon that moves buffers of megabytes every few milliseconds (a stage's activations):
 * asks the C library to serve allocations below 64 MiB from its heap and to keep up to 128 MiB
 * of freed heap instead of handing it back. By default glibc maps a buffer above its adaptive
 * threshold afresh and unmaps it on free: packing a 4 MiB microbatch took 2.4–2.7 ms in a stage
 * that way, 0.5–1.1 ms with this (the 2-vCPU VM). Returns 0 when the library refused (as the
 * sanitizers' allocators do): only speed depends on it. */
int pp_alloc_keep_large_buffers(void);
/* A NUL-terminated copy of n bytes of s (which need not be terminated); NULL on failure. */
char *pp_strndup(enum pp_mem_category cat, const char *s, size_t n);
char *pp_strdup(enum pp_mem_category cat, const char *s);

/* Live bytes in a category. */
int64_t pp_mem_live(enum pp_mem_category cat);
const char *pp_mem_category_name(enum pp_mem_category cat);

/* Makes the nth allocation from now fail (1 = the next one); 0 disables. For tests. */
void pp_alloc_fail_at(int64_t nth);

#ifdef __cplusplus
}
#endif

#endif
