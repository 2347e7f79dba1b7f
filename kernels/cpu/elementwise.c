/* Element-wise ops, the embedding gather and the row gather/scatter of the MoE FFN. They involve no
 * reduction, so any split is exact.
 * swiglu (an exp per FFN element, pp__expf) is spread over the pool when a batch is large enough to
 * pay for it (prefill); the rest run on the calling thread. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu-impl.h"
#include "kernels/cpu/row_groups.h"

#define SWIGLU_GRAIN 16384 /* elements per work item; smaller calls run inline */

struct swiglu_job {
    const struct pp_simd *simd;
    float *out;
    const float *gate;
    const float *up;
};

static void swiglu_range(void *ctx, int64_t i0, int64_t i1, int thread)
{
    (void)thread;
    struct swiglu_job *j = ctx;
    j->simd->swiglu(j->out + i0, j->gate + i0, j->up + i0, i1 - i0);
}

void pp__cpu_swiglu(struct pp_backend *be, float *out, const float *gate, const float *up,
                    int64_t n)
{
    struct swiglu_job j = {pp__cpu(be)->simd, out, gate, up};
    pp_threadpool_run(pp__cpu(be)->pool, swiglu_range, &j, n, SWIGLU_GRAIN);
}

void pp__cpu_add(struct pp_backend *be, float *y, const float *x, int64_t n)
{
    (void)be;
    for (int64_t i = 0; i < n; i++)
        y[i] += x[i];
}

void pp__cpu_add_bias(struct pp_backend *be, float *y, const float *b, int64_t n, int64_t cols)
{
    (void)be;
    for (int64_t r = 0; r < n; r++)
        for (int64_t i = 0; i < cols; i++)
            y[r * cols + i] += b[i];
}

void pp__cpu_embed(struct pp_backend *be, float *out, const struct pp_weight *w, const int32_t *ids,
                   int64_t n)
{
    (void)be;
    int64_t row_bytes = pp_dtype_row_bytes(w->dtype, w->cols);
    for (int64_t t = 0; t < n; t++) {
        if (w->layout == PP_WEIGHT_ROW_GROUPS)
            pp__row_groups_row_to_f32(out + t * w->cols, w->data, w->dtype, w->rows, w->cols,
                                      ids[t]);
        else
            pp_row_to_f32(out + t * w->cols, (const char *)w->data + ids[t] * row_bytes, w->dtype,
                          w->cols);
    }
}

void pp__cpu_add_gated(struct pp_backend *be, float *y, const float *x, const float *g, int64_t n,
                       int64_t cols)
{
    (void)be;
    for (int64_t r = 0; r < n; r++) {
        float sig = 1.0f / (1.0f + expf(-g[r]));
        float *o = y + r * cols;
        const float *v = x + r * cols;
        for (int64_t i = 0; i < cols; i++)
            o[i] += sig * v[i];
    }
}

void pp__cpu_gather_rows(struct pp_backend *be, float *dst, const float *src, const int32_t *rows,
                         int64_t n, int64_t cols)
{
    (void)be;
    for (int64_t r = 0; r < n; r++)
        memcpy(dst + r * cols, src + (int64_t)rows[r] * cols, (size_t)cols * sizeof(float));
}

void pp__cpu_scatter_add_rows(struct pp_backend *be, float *dst, const float *src,
                              const int32_t *rows, const float *w, int64_t n, int64_t cols)
{
    (void)be;
    for (int64_t r = 0; r < n; r++) {
        float *o = dst + (int64_t)rows[r] * cols;
        const float *v = src + r * cols;
        for (int64_t i = 0; i < cols; i++)
            o[i] += w[r] * v[i];
    }
}
