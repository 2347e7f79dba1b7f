/* Matmul y = x·wᵀ over weights in any stored dtype. Threads split the weight rows, never the
 * reduction; the inner loops (kernels/cpu/simd.h) compute every output element in the canonical
 * order of pp__dot whatever the batch, so a token's outputs do not depend on the thread count or
 * on which tokens share its batch. */
#include <assert.h>
#include <string.h>

#include "kernels/cpu/cpu-impl.h"
#include "kernels/cpu/matmul_q8.h"
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
/* The few-token chunks shrink towards the end of a matmul, to no fewer rows than this (two of the
 * 12-row one-token tiles), so that the threads finish it together: one job's tail had left a
 * thread idle for half a 96-row chunk on average (pp_threadpool_run_dynamic). */
#define ROW_GRAIN_MIN 24
_Static_assert(ROW_GRAIN % PP_ROW_GROUP == 0 && ROW_GRAIN_PACKED % PP_ROW_GROUP == 0 &&
                   ROW_GRAIN_MIN % 12 == 0 && ROW_GRAIN % ROW_GRAIN_MIN == 0,
               "a thread's rows start at a row group and a whole tile");

struct matmul_job {
    struct pp_cpu *cpu;
    struct pp_mm_args args;
    const float *src; /* rows cols apart, copied to padded, ldx apart */
    float *padded;
};

static void matmul_rows(void *ctx, int64_t r0, int64_t r1, int thread)
{
    struct matmul_job *j = ctx;
    struct pp_mm_scratch s = {pp__cpu_scratch(j->cpu, PP_CPU_SCRATCH_ROW, thread),
                              pp__cpu_scratch(j->cpu, PP_CPU_SCRATCH_PANEL, thread),
                              pp__cpu_scratch(j->cpu, PP_CPU_SCRATCH_ACC, thread)};
    const struct pp_simd *simd = j->cpu->simd;
    (j->args.dtype == PP_DTYPE_Q8_0 ? simd->matmul_q8 : simd->matmul_rows)(&j->args, r0, r1, &s);
}

static void quantize_tokens(void *ctx, int64_t t0, int64_t t1, int thread)
{
    struct matmul_job *j = ctx;
    (void)thread;
    pp__q8_act_fill(&j->args, j->cpu->simd->q8_act, t0, t1);
}

static void copy_padded(void *ctx, int64_t t0, int64_t t1, int thread)
{
    struct matmul_job *j = ctx;
    (void)thread;
    for (int64_t t = t0; t < t1; t++)
        memcpy(j->padded + t * j->args.ldx, j->src + t * j->args.cols,
               (size_t)j->args.cols * sizeof(float));
}

/* The many-token nest reads each of a token group's activation rows at the same offset k, so rows
 * a multiple of 1 KiB apart fall in the same few L1 sets, with the weight panel beside them. For
 * such cols the activations go through a copy whose rows are 64 bytes further apart, a slice of
 * PP_MM_X_PADDED_TOKENS tokens at a time (whole passes of the nest, 64 tokens with AVX2 and 128
 * with AVX-512, so the weights are not read more often). pp_bench_matmul --layers 1 on the Xeon
 * host, the copy included, one thread: f16 at 64 and 128 tokens 110-111 → 117 and 119-122 →
 * 127-130 GFLOP/s, f32 at 128 tokens 106-107 → 112-113 (docs/benchmarks.md). The stride changes
 * no bit. A Q8_0 matmul reads its activations in int8 instead (kernels/cpu/matmul_q8.h): each
 * slice of PP_MM_X_PADDED_TOKENS tokens is quantized into the same buffer first, by the caller
 * for a few tokens and over the pool for more. */
void pp__cpu_matmul(struct pp_backend *be, float *y, const float *x, const struct pp_weight *w,
                    int64_t n)
{
    struct pp_cpu *c = pp__cpu(be);
    assert(w->cols <= c->cap[PP_CPU_SCRATCH_ROW] &&
           "backend reserve() not called for these shapes");
    struct matmul_job j = {c,
                           {y, x, w->cols, w->data, w->dtype, w->rows, w->cols, n,
                            pp_dtype_row_bytes(w->dtype, w->cols),
                            w->layout == PP_WEIGHT_ROW_GROUPS, c->prefetch_l2},
                           NULL,
                           c->x_padded};
    int q8 = w->dtype == PP_DTYPE_Q8_0;
    int pad = !q8 && n > PP_MM_DIRECT_MAX_TOKENS && w->cols % 256 == 0;
    int64_t slice = pad || q8 ? PP_MM_X_PADDED_TOKENS : n;
    if (pad) {
        j.args.ldx = w->cols + PP_MM_X_PAD;
        j.args.x = j.padded;
        assert(PP_MM_X_PADDED_TOKENS * j.args.ldx <= c->x_padded_cap);
    }
    for (int64_t t0 = 0; t0 < n; t0 += slice) {
        int64_t nt = n - t0 < slice ? n - t0 : slice;
        j.args.y = y + t0 * w->rows;
        j.args.n = nt;
        if (pad) {
            j.src = x + t0 * w->cols;
            pp_threadpool_run(c->pool, copy_padded, &j, nt, 8);
        }
        if (q8) {
            j.args.x = x + t0 * w->cols;
            assert(pp__q8_act_bytes(nt, w->cols) <= c->x_padded_cap * (int64_t)sizeof(float));
            pp__q8_act_bind(&j.args, j.padded);
            if (nt < 8)
                pp__q8_act_fill(&j.args, c->simd->q8_act, 0, nt);
            else
                pp_threadpool_run(c->pool, quantize_tokens, &j, nt, 4);
        }
        if (nt > PP_MM_DIRECT_MAX_TOKENS)
            pp_threadpool_run_dynamic(c->pool, matmul_rows, &j, w->rows, ROW_GRAIN_PACKED,
                                      ROW_GRAIN_PACKED);
        else
            pp_threadpool_run_dynamic(c->pool, matmul_rows, &j, w->rows, ROW_GRAIN,
                                      ROW_GRAIN_MIN);
    }
}
