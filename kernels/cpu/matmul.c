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
/* Q8_0's few-token chunks: twice as many rows, since its rows are half as many bytes (its spaced
 * tiles' four streams, kernels/cpu/matmul_q8_x86.h, then run as long as f16's). pp_bench_matmul
 * --beside, two threads, passes alternating 96 and 192 (Zen 4 host): one token, slow level
 * -1.3 to +3.9 points in 10 runs, 9 of them up (median +2.2); 2 tokens -2.0, +1.7, +1.1; 4
 * tokens +2.8, +2.4, and +1.7 in the fast level (docs/benchmarks.md). */
#define ROW_GRAIN_Q8 192
#define ROW_GRAIN_PACKED 48
/* The few-token chunks shrink towards the end of a matmul, to no fewer rows than this (two of the
 * 12-row one-token tiles), so that the threads finish it together: one job's tail had left a
 * thread idle for half a 96-row chunk on average (pp_threadpool_run_dynamic). */
#define ROW_GRAIN_MIN 24
_Static_assert(ROW_GRAIN % PP_ROW_GROUP == 0 && ROW_GRAIN_PACKED % PP_ROW_GROUP == 0 &&
                   ROW_GRAIN_MIN % 12 == 0 && ROW_GRAIN % ROW_GRAIN_MIN == 0 &&
                   ROW_GRAIN_Q8 % ROW_GRAIN_MIN == 0,
               "a thread's rows start at a row group and a whole tile");

/* The weights of one job side by side in one space of rows, each starting at a multiple of
 * ROW_SPACE_ALIGN (so every chunk starts a whole tile and row group of the weight it falls in);
 * rows between one weight's end and the next one's start are empty. */
#define ROW_SPACE_ALIGN 48
_Static_assert(ROW_SPACE_ALIGN % ROW_GRAIN_MIN == 0 && ROW_SPACE_ALIGN % ROW_GRAIN_PACKED == 0,
               "a weight starts where a chunk may");

struct matmul_job {
    struct pp_cpu *cpu;
    int count;
    struct pp_mm_args args[PP_MATMUL_MANY_MAX]; /* weight i's matmul; x, n, xq, xd shared */
    int64_t start[PP_MATMUL_MANY_MAX + 1];      /* weight i's rows in the job's space */
    const float *src;                           /* rows cols apart, copied to padded, ldx apart */
    float *padded;
};

static void matmul_rows(void *ctx, int64_t r0, int64_t r1, int thread)
{
    struct matmul_job *j = ctx;
    struct pp_mm_scratch s = {pp__cpu_scratch(j->cpu, PP_CPU_SCRATCH_ROW, thread),
                              pp__cpu_scratch(j->cpu, PP_CPU_SCRATCH_PANEL, thread),
                              pp__cpu_scratch(j->cpu, PP_CPU_SCRATCH_ACC, thread),
                              (char *)pp__cpu_scratch(j->cpu, PP_CPU_SCRATCH_Q8_SPLIT, thread)};
    const struct pp_simd *simd = j->cpu->simd;
    for (int i = 0; i < j->count; i++) {
        const struct pp_mm_args *a = &j->args[i];
        int64_t b = r0 > j->start[i] ? r0 - j->start[i] : 0;
        int64_t e = r1 - j->start[i] < a->rows ? r1 - j->start[i] : a->rows;
        if (b < e)
            (a->dtype == PP_DTYPE_Q8_0 ? simd->matmul_q8 : simd->matmul_rows)(a, b, e, &s);
    }
}

/* Tokens [t0, t1) in int8, and their pairs where the matmul reads them (t0 is even: the pool
 * hands out whole grains of 4). */
static void quantize_tokens(void *ctx, int64_t t0, int64_t t1, int thread)
{
    struct matmul_job *j = ctx;
    (void)thread;
    pp__q8_act_fill(&j->args[0], j->cpu->simd->q8_act, t0, t1);
    if (j->args[0].xpair)
        pp__q8_pairs_fill(&j->args[0], j->cpu->q8_pairs, t0, t1);
}

static void copy_padded(void *ctx, int64_t t0, int64_t t1, int thread)
{
    struct matmul_job *j = ctx;
    (void)thread;
    for (int64_t t = t0; t < t1; t++)
        memcpy(j->padded + t * j->args[0].ldx, j->src + t * j->args[0].cols,
               (size_t)j->args[0].cols * sizeof(float));
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
/* Weights that one job can run together: the same cols, and the same preparation of x (Q8_0
 * quantizes it, the others may pad it, into the same buffer). */
static int fusable(const struct pp_weight *const w[], int count)
{
    for (int i = 1; i < count; i++)
        if (w[i]->cols != w[0]->cols ||
            (w[i]->dtype == PP_DTYPE_Q8_0) != (w[0]->dtype == PP_DTYPE_Q8_0))
            return 0;
    return 1;
}

void pp__cpu_matmul_many(struct pp_backend *be, int count, float *const y[], const float *x,
                         const struct pp_weight *const w[], int64_t n)
{
    struct pp_cpu *c = pp__cpu(be);
    assert(count >= 1 && count <= PP_MATMUL_MANY_MAX);
    if (!fusable(w, count)) {
        for (int i = 0; i < count; i++)
            pp__cpu_matmul_many(be, 1, &y[i], x, &w[i], n);
        return;
    }
    int64_t cols = w[0]->cols;
    assert(cols <= c->cap[PP_CPU_SCRATCH_ROW] && "backend reserve() not called for these shapes");
    struct matmul_job j = {.cpu = c, .count = count, .padded = c->x_padded};
    for (int i = 0; i < count; i++) {
        j.args[i] = (struct pp_mm_args){y[i], x, cols, w[i]->data, w[i]->dtype, w[i]->rows, cols, n,
                                        pp_dtype_row_bytes(w[i]->dtype, cols),
                                        w[i]->layout == PP_WEIGHT_ROW_GROUPS, c->prefetch_l2};
        j.args[i].amd_tiles = c->amd_tiles;
        j.start[i + 1] = (j.start[i] + w[i]->rows + ROW_SPACE_ALIGN - 1) / ROW_SPACE_ALIGN *
                         ROW_SPACE_ALIGN;
    }
    int64_t space = j.start[count - 1] + w[count - 1]->rows;
    int q8 = w[0]->dtype == PP_DTYPE_Q8_0;
    /* the layout of the first weight decides for all (the nests take either x and either grain) */
    int64_t direct_max =
        pp_mm_direct_max_tokens(c->simd, w[0]->layout == PP_WEIGHT_ROW_GROUPS, c->amd_tiles);
    int pad = !q8 && n > direct_max && cols % 256 == 0;
    int64_t slice = pad || q8 ? PP_MM_X_PADDED_TOKENS : n;
    struct pp_mm_args *a0 = &j.args[0];
    if (pad) {
        a0->ldx = cols + PP_MM_X_PAD;
        a0->x = j.padded;
        assert(PP_MM_X_PADDED_TOKENS * a0->ldx <= c->x_padded_cap);
    }
    for (int64_t t0 = 0; t0 < n; t0 += slice) {
        int64_t nt = n - t0 < slice ? n - t0 : slice;
        a0->n = nt;
        if (pad) {
            j.src = x + t0 * cols;
            pp_threadpool_run(c->pool, copy_padded, &j, nt, 8);
        }
        if (q8) {
            a0->x = x + t0 * cols;
            int64_t pairs_at = pp__q8_pairs_offset(nt, cols);
            int pairs = pp__q8_pairs_wanted(c->q8_pairs, nt);
            assert(pairs_at + pp__q8_pairs_bytes(nt, cols) <=
                   c->x_padded_cap * (int64_t)sizeof(float));
            pp__q8_act_bind(a0, j.padded);
            pp__q8_pairs_bind(a0, pairs ? (char *)j.padded + pairs_at : NULL);
            if (nt < 8)
                quantize_tokens(&j, 0, nt, 0);
            else
                pp_threadpool_run(c->pool, quantize_tokens, &j, nt, 4);
        }
        for (int i = 0; i < count; i++) {
            struct pp_mm_args *a = &j.args[i];
            if (i > 0) { /* the same activations as weight 0's */
                a->x = a0->x;
                a->ldx = a0->ldx;
                a->n = nt;
                a->xq = a0->xq;
                a->xd = a0->xd;
                a->xpair = a0->xpair;
                a->xneg = a0->xneg;
            }
            a->y = y[i] + t0 * a->rows;
        }
        if (nt > direct_max)
            pp_threadpool_run_dynamic(c->pool, matmul_rows, &j, space, ROW_GRAIN_PACKED,
                                      ROW_GRAIN_PACKED);
        else
            pp_threadpool_run_dynamic(c->pool, matmul_rows, &j, space,
                                      w[0]->dtype == PP_DTYPE_Q8_0 ? ROW_GRAIN_Q8 : ROW_GRAIN,
                                      ROW_GRAIN_MIN);
    }
}

void pp__cpu_matmul(struct pp_backend *be, float *y, const float *x, const struct pp_weight *w,
                    int64_t n)
{
    pp__cpu_matmul_many(be, 1, &y, x, &w, n);
}
