/* Matmul y = x·wᵀ over weights in any stored dtype. Threads split the weight rows, never the
 * reduction; the inner loops (kernels/cpu/simd.h) compute every output element in the canonical
 * order of pp__dot whatever the batch, so a token's outputs do not depend on the thread count or
 * on which tokens share its batch. */
#include <assert.h>

#include "kernels/cpu/cpu-impl.h"
#include "kernels/cpu/row_groups.h"

/* Rows per chunk handed to a thread (multiples of the 3- and 4-row register tiles). Chunks are
 * taken dynamically, so a preempted thread on a shared machine holds nobody up; the many-token
 * nest wants bigger chunks, as each re-reads the activations once, but not so big that the last
 * one leaves a thread idle (48: the nest's row super-block at 128 tokens; wk/wv of tinyllama
 * are 256 rows). The few-token nest streams a chunk's rows as one run of memory: on two threads,
 * 96-row chunks decoded f16 tinyllama at 92-97% of the read bandwidth against 86-88% with 24-row
 * ones, whose runs (96 KiB) the two threads took in turns (pp_bench, Xeon with AVX-512; 48: 90-92%,
 * 144 and 192 as 96). */
#ifndef ROW_GRAIN
#define ROW_GRAIN 96
#endif
#define ROW_GRAIN_PACKED 48
_Static_assert(ROW_GRAIN % PP_ROW_GROUP == 0 && ROW_GRAIN_PACKED % PP_ROW_GROUP == 0,
               "a thread's rows start at a row group");

struct matmul_job {
    struct pp_cpu *cpu;
    struct pp_mm_args args;
};

static void matmul_rows(void *ctx, int64_t r0, int64_t r1, int thread)
{
    struct matmul_job *j = ctx;
    struct pp_mm_scratch s = {pp__cpu_scratch(j->cpu, PP_CPU_SCRATCH_ROW, thread),
                              pp__cpu_scratch(j->cpu, PP_CPU_SCRATCH_PANEL, thread),
                              pp__cpu_scratch(j->cpu, PP_CPU_SCRATCH_ACC, thread)};
    j->cpu->simd->matmul_rows(&j->args, r0, r1, &s);
}

void pp__cpu_matmul(struct pp_backend *be, float *y, const float *x, const struct pp_weight *w,
                    int64_t n)
{
    struct pp_cpu *c = pp__cpu(be);
    assert(w->cols <= c->cap[PP_CPU_SCRATCH_ROW] && "backend reserve() not called for these shapes");
    struct matmul_job j = {c, {y, x, w->data, w->dtype, w->rows, w->cols, n,
                               pp_dtype_row_bytes(w->dtype, w->cols),
                               w->layout == PP_WEIGHT_ROW_GROUPS}};
    pp_threadpool_run_dynamic(c->pool, matmul_rows, &j, w->rows,
                              n > PP_MM_DIRECT_MAX_TOKENS ? ROW_GRAIN_PACKED : ROW_GRAIN);
}
