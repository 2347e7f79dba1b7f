/* Our f32 matmul against OpenBLAS cblas_sgemm on the same shape, operands and thread count. */
#include <stdlib.h>

#include "bench/bench.h"

#ifdef PP_HAVE_OPENBLAS
#include <cblas.h>
void openblas_set_num_threads(int num_threads);
#endif

#define REPS 5

static float *rand_buf(int64_t n, uint64_t seed)
{
    float *p = aligned_alloc(64, (size_t)((n * 4 + 63) / 64 * 64));
    if (!p)
        return NULL;
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = (float)((seed >> 40) & 0xffff) / 32768.0f - 1.0f;
    }
    return p;
}

double pp_bench_matmul_time(struct pp_backend *be, int n_threads, const struct pp_bench_shape *s,
                            int64_t n)
{
    double best = 0.0;
    float *w = rand_buf(s->rows * s->cols, 1), *x = rand_buf(n * s->cols, 2);
    float *y = rand_buf(n * s->rows, 3);
    if (!w || !x || !y)
        goto out;
    if (be) {
        struct pp_weight pw = {w, PP_DTYPE_F32, s->rows, s->cols};
        best = 1e30;
        for (int r = 0; r < REPS; r++) {
            double t0 = pp_bench_now();
            be->ops->matmul(be, y, x, &pw, n);
            double t = pp_bench_now() - t0;
            if (t < best)
                best = t;
        }
        goto out;
    }
#ifdef PP_HAVE_OPENBLAS
    openblas_set_num_threads(n_threads);
    best = 1e30;
    for (int r = 0; r < REPS; r++) {
        double t0 = pp_bench_now();
        /* y[n, rows] = x[n, cols] · w[rows, cols]ᵀ */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)s->rows, (int)s->cols,
                    1.0f, x, (int)s->cols, w, (int)s->cols, 0.0f, y, (int)s->rows);
        double t = pp_bench_now() - t0;
        if (t < best)
            best = t;
    }
#else
    (void)n_threads;
#endif
out:
    free(w);
    free(x);
    free(y);
    return best;
}

int pp_bench_have_openblas(void)
{
#ifdef PP_HAVE_OPENBLAS
    return 1;
#else
    return 0;
#endif
}
