/* Rotary position embedding in either pair layout. Angles are computed in double and rounded once,
 * so a position's rotation is the same whichever batch it arrives in. */
#include <math.h>

#include "kernels/cpu/cpu-impl.h"

struct rope_job {
    float *x;
    const int32_t *pos;
    int32_t n_heads;
    int32_t head_dim;
    const float *inv_freq;
    enum pp_rope_layout layout;
};

static void rope_rows(void *ctx, int64_t r0, int64_t r1, int thread)
{
    (void)thread;
    struct rope_job *j = ctx;
    int32_t half = j->head_dim / 2;
    for (int64_t r = r0; r < r1; r++) {
        float *row = j->x + r * j->n_heads * (int64_t)j->head_dim;
        for (int32_t i = 0; i < half; i++) {
            double angle = (double)j->pos[r] * (double)j->inv_freq[i];
            float c = (float)cos(angle), s = (float)sin(angle);
            int32_t a = j->layout == PP_ROPE_NEOX ? i : 2 * i;
            int32_t b = j->layout == PP_ROPE_NEOX ? i + half : 2 * i + 1;
            for (int32_t h = 0; h < j->n_heads; h++) {
                float *v = row + (int64_t)h * j->head_dim;
                float x0 = v[a], x1 = v[b];
                v[a] = x0 * c - x1 * s;
                v[b] = x1 * c + x0 * s;
            }
        }
    }
}

void pp__cpu_rope(struct pp_backend *be, float *x, const int32_t *pos, int64_t n, int32_t n_heads,
                  int32_t head_dim, const float *inv_freq, enum pp_rope_layout layout)
{
    struct rope_job j = {x, pos, n_heads, head_dim, inv_freq, layout};
    pp_threadpool_run(pp__cpu(be)->pool, rope_rows, &j, n, 4);
}
