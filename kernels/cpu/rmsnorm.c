/* RMS normalisation, one row per work item. */
#include <math.h>

#include "kernels/cpu/cpu-impl.h"

struct rmsnorm_job {
    const struct pp_simd *simd;
    float *y;
    const float *x;
    const float *g;
    int64_t dim;
    float eps;
};

static void rmsnorm_rows(void *ctx, int64_t r0, int64_t r1, int thread)
{
    (void)thread;
    struct rmsnorm_job *j = ctx;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = j->x + r * j->dim;
        float *y = j->y + r * j->dim;
        float ss = j->simd->dot(x, x, j->dim);
        float scale = 1.0f / sqrtf(ss / (float)j->dim + j->eps);
        for (int64_t i = 0; i < j->dim; i++)
            y[i] = j->g[i] * (x[i] * scale);
    }
}

void pp__cpu_rmsnorm(struct pp_backend *be, float *y, const float *x, const float *g, int64_t n,
                     int64_t dim, float eps)
{
    struct rmsnorm_job j = {pp__cpu(be)->simd, y, x, g, dim, eps};
    pp_threadpool_run(pp__cpu(be)->pool, rmsnorm_rows, &j, n, 4);
}
