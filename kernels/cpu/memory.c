/* The CPU backend's memory ops: backend memory is host memory, so buffers come from the project
 * allocator, copies are memcpy, nothing is queued (sync has nothing to wait for and the CPU ops
 * cannot fail). Weights are copied into huge-page memory at load (a decode step streams every
 * weight once: from the model file's 4 KiB page-cache pages it ran 5-9% slower on this
 * project's machine, see docs/benchmarks.md), in row groups (kernels/cpu/row_groups.h), unless
 * the backend was told to map them, or they are already this process's memory (resident), which
 * stay row-major; vectors are small and used in place. */
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kernels/cpu/cpu-impl.h"
#include "kernels/cpu/row_groups.h"

pp_status pp__cpu_buf_alloc(struct pp_backend *be, enum pp_mem_category cat, int64_t bytes,
                            void **out)
{
    (void)be;
    *out = NULL;
    if (bytes < 0)
        return pp_error(PP_ERR_INVALID_ARG, "cpu buffer: expected a size >= 0, got %lld",
                        (long long)bytes);
    if (!(*out = pp_alloc_aligned(cat, (size_t)bytes)))
        return pp_error(PP_ERR_NOMEM, "cpu buffer: no memory for %lld bytes (%s)",
                        (long long)bytes, pp_mem_category_name(cat));
    return PP_OK;
}

void pp__cpu_buf_free(struct pp_backend *be, enum pp_mem_category cat, void *p)
{
    (void)be;
    pp_free(cat, p);
}

void pp__cpu_copy(struct pp_backend *be, void *dst, const void *src, int64_t bytes)
{
    (void)be;
    if (bytes > 0 && dst != src)
        memcpy(dst, src, (size_t)bytes);
}

void pp__cpu_zero(struct pp_backend *be, void *p, int64_t bytes)
{
    (void)be;
    if (bytes > 0)
        memset(p, 0, (size_t)bytes);
}

pp_status pp__cpu_copy_out(struct pp_backend *be, void *dst, const void *src, int64_t bytes)
{
    pp__cpu_copy(be, dst, src, bytes);
    return PP_OK;
}

pp_status pp__cpu_sync(struct pp_backend *be)
{
    (void)be;
    return PP_OK;
}

static size_t weight_bytes(const struct pp_weight *w)
{
    return (size_t)(w->rows * pp_dtype_row_bytes(w->dtype, w->cols));
}

/* Maps a weight's pages of the model file into this process now (MADV_POPULATE_READ, Linux 5.14;
 * older kernels refuse it and nothing changes), so that the first forward pass does not take a
 * page fault every few pages: `ppserve run --cpu-weights map` on the f16 tinyllama, a 128-token
 * prompt, two runs each alternating, prefill 117.9, 124.4 → 129.3, 136.2 tok/s (the copy's
 * 126.8-141.7 beside them). Errors are ignored: the pages then come in on first use. */
static void populate(const void *p, size_t bytes)
{
#ifdef MADV_POPULATE_READ
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = (uintptr_t)p & ~(page - 1), hi = ((uintptr_t)p + bytes + page - 1) & ~(page - 1);
    (void)madvise((void *)lo, hi - lo, MADV_POPULATE_READ);
#else
    (void)p;
    (void)bytes;
#endif
}

/* One weight's copy in row groups, split over the backend's threads in ranges of whole groups
 * of about 2 MiB (a huge page of the copy each): the copy's first touch of each page (the kernel
 * zeroes it, and a virtual machine's host may first back it) and the rewrite run on every thread
 * at once instead of on the loading one. */
struct pack_job {
    void *dst;
    const struct pp_weight *w;
};

/* Row groups [g0, g1) of the job's weight. */
static void pack_groups(void *ctx, int64_t g0, int64_t g1, int thread)
{
    const struct pack_job *j = ctx;
    (void)thread;
    int64_t r0 = g0 * PP_ROW_GROUP, r1 = g1 * PP_ROW_GROUP;
    pp__row_groups_pack_range(j->dst, j->w->data, j->w->dtype, j->w->rows, j->w->cols, r0,
                              r1 < j->w->rows ? r1 : j->w->rows);
}

static void pack(struct pp_cpu *c, void *dst, const struct pp_weight *w)
{
    struct pack_job j = {dst, w};
    int64_t groups = (w->rows + PP_ROW_GROUP - 1) / PP_ROW_GROUP;
    int64_t group_bytes = PP_ROW_GROUP * pp_dtype_row_bytes(w->dtype, w->cols);
    int64_t grain = ((int64_t)2 << 20) / group_bytes;
    pp_threadpool_run_dynamic(c->pool, pack_groups, &j, groups, grain > 0 ? grain : 1, 1);
}

pp_status pp__cpu_weight_load(struct pp_backend *be, const struct pp_weight *w, int resident,
                              struct pp_weight *out)
{
    *out = *w;
    if (w->layout != PP_WEIGHT_ROWS)
        return pp_error(PP_ERR_INVALID_ARG, "cpu backend: expected a row-major weight to load, got "
                        "one already in row groups (loaded twice?)");
    if (!resident && pp__cpu(be)->map_weights && w->data)
        populate(w->data, weight_bytes(w));
    if (resident || pp__cpu(be)->map_weights || !w->data)
        return PP_OK;
    size_t bytes = weight_bytes(w);
    void *p = pp_alloc_huge(PP_MEM_WEIGHTS, bytes);
    if (!p)
        return pp_error(PP_ERR_NOMEM, "cpu backend: no memory to copy a [%lld, %lld] %s weight "
                        "(%zu bytes) out of the model file (cpu_weights = \"map\" computes from "
                        "the file in place)", (long long)w->rows, (long long)w->cols,
                        pp_dtype_name(w->dtype), bytes);
    pack(pp__cpu(be), p, w);
    out->data = p;
    out->layout = PP_WEIGHT_ROW_GROUPS;
    return PP_OK;
}

void pp__cpu_weight_free(struct pp_backend *be, struct pp_weight *w)
{
    (void)be;
    pp_free_huge(PP_MEM_WEIGHTS, (void *)w->data, weight_bytes(w));
    w->data = NULL;
}

pp_status pp__cpu_vec_load(struct pp_backend *be, const float *v, int64_t n, int resident,
                           const float **out)
{
    (void)be;
    (void)n;
    (void)resident;
    *out = v;
    return PP_OK;
}

void pp__cpu_vec_free(struct pp_backend *be, const float *v)
{
    (void)be;
    (void)v;
}
