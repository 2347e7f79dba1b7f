/* Element-wise ops and the embedding gather. They involve no reduction, so any split is exact;
 * they run on the calling thread because they cost little next to the matmuls. */
#include <math.h>

#include "kernels/cpu/cpu-impl.h"

void pp__cpu_swiglu(struct pp_backend *be, float *out, const float *gate, const float *up,
                    int64_t n)
{
    (void)be;
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
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
    for (int64_t t = 0; t < n; t++)
        pp_row_to_f32(out + t * w->cols, (const char *)w->data + ids[t] * row_bytes, w->dtype,
                      w->cols);
}
