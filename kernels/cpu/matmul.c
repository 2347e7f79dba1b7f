/* Matmul y = x·wᵀ over weights in any stored dtype. Threads split the weight rows; each thread
 * converts a row to f32 once (exact) and dots it with a tile of tokens, so the weights are read once
 * per token tile and every output element is one pp__dot of the same operands whatever the batch. */
#include <assert.h>

#include "kernels/cpu/cpu-impl.h"

#define TOKEN_TILE 32 /* tokens per pass over the weights: their activations stay in L2 */
#define ROW_GRAIN 16

struct matmul_job {
    struct pp_cpu *cpu;
    float *y;
    const float *x;
    const struct pp_weight *w;
    int64_t n;
    int64_t row_bytes;
};

static void matmul_rows(void *ctx, int64_t r0, int64_t r1, int thread)
{
    struct matmul_job *j = ctx;
    const struct pp_weight *w = j->w;
    float *row = pp__cpu_scratch(j->cpu, PP_CPU_SCRATCH_ROW, thread);
    const char *base = w->data;
    const struct pp_simd *simd = j->cpu->simd;
    for (int64_t t0 = 0; t0 < j->n; t0 += TOKEN_TILE) {
        int64_t t1 = t0 + TOKEN_TILE < j->n ? t0 + TOKEN_TILE : j->n;
        for (int64_t r = r0; r < r1; r++) {
            const float *wr = row;
            const void *src = base + r * j->row_bytes;
            if (w->dtype == PP_DTYPE_F32)
                wr = src;
            else if (w->dtype == PP_DTYPE_F16)
                simd->f16_to_f32(row, src, w->cols);
            else if (w->dtype == PP_DTYPE_BF16)
                simd->bf16_to_f32(row, src, w->cols);
            else
                pp_row_to_f32(row, src, w->dtype, w->cols);
            float out[TOKEN_TILE];
            simd->dot_rows(out, wr, j->x + t0 * w->cols, w->cols, w->cols, t1 - t0);
            for (int64_t t = t0; t < t1; t++)
                j->y[t * w->rows + r] = out[t - t0];
        }
    }
}

void pp__cpu_matmul(struct pp_backend *be, float *y, const float *x, const struct pp_weight *w,
                    int64_t n)
{
    struct pp_cpu *c = pp__cpu(be);
    assert(w->cols <= c->cap[PP_CPU_SCRATCH_ROW] && "backend reserve() not called for these shapes");
    struct matmul_job j = {c, y, x, w, n, pp_dtype_row_bytes(w->dtype, w->cols)};
    pp_threadpool_run(c->pool, matmul_rows, &j, w->rows, ROW_GRAIN);
}
