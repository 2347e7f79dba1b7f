/* The speed probe a stage reports when it registers: how many bytes of f16 weights per second a
 * one-token matmul streams through the CPU backend with the configured threads. Decoding is bound
 * by exactly this, so the coordinator's planner can compare hosts without loading a model. Takes a
 * few tens of milliseconds. */
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"
#include "kernels/backend.h"
#include "kernels/dtype.h"
#include "stage/stage.h"

#define PROBE_ROWS 4096
#define PROBE_COLS 8192 /* [4096, 8192] f16: 64 MiB, beyond a 32 MiB L3 (a cached probe is noisy) */
#define PROBE_RUNS 5

pp_status pp_stage_probe(int threads, double *bytes_per_second)
{
    struct pp_backend *be = NULL;
    pp_status st = pp_backend_cpu_new(threads, &be);
    if (st != PP_OK)
        return st;
    size_t n_w = (size_t)PROBE_ROWS * PROBE_COLS;
    uint16_t *w = pp_alloc_aligned(PP_MEM_MISC, n_w * sizeof(uint16_t)); /* [ROWS, COLS] f16 */
    float *x = pp_alloc_aligned(PP_MEM_MISC, PROBE_COLS * sizeof(float)); /* [1, COLS] */
    float *y = pp_alloc_aligned(PP_MEM_MISC, PROBE_ROWS * sizeof(float)); /* [1, ROWS] */
    if (!w || !x || !y) {
        st = pp_error(PP_ERR_NOMEM, "probe: no memory for a %zu-byte weight", n_w * 2);
        goto done;
    }
    if ((st = be->ops->reserve(be, PROBE_COLS, 1)) != PP_OK)
        goto done;
    uint32_t r = 0x9e3779b9u; /* xorshift: values in [-1, 1), the data does not matter */
    for (size_t i = 0; i < n_w; i++) {
        r ^= r << 13, r ^= r >> 17, r ^= r << 5;
        w[i] = pp_f32_to_f16((float)(r >> 8) / 8388608.0f - 1.0f);
    }
    for (int i = 0; i < PROBE_COLS; i++)
        x[i] = (float)(i % 7) * 0.125f - 0.375f;
    struct pp_weight wt = {w, PP_DTYPE_F16, PROBE_ROWS, PROBE_COLS};
    be->ops->matmul(be, y, x, &wt, 1); /* warm-up: threads started, pages touched */
    double best = 1e30;
    for (int run = 0; run < PROBE_RUNS; run++) {
        double t0 = pp_clock_mono();
        be->ops->matmul(be, y, x, &wt, 1);
        double dt = pp_clock_mono() - t0;
        if (dt < best)
            best = dt;
    }
    *bytes_per_second = (double)(n_w * sizeof(uint16_t)) / (best > 1e-9 ? best : 1e-9);
    PP_INFO("probe: threads=%d weight_bytes=%zu best_s=%.6f weight_bytes_per_second=%.3e", threads,
            n_w * sizeof(uint16_t), best, *bytes_per_second);
done:
    pp_free(PP_MEM_MISC, w);
    pp_free(PP_MEM_MISC, x);
    pp_free(PP_MEM_MISC, y);
    be->ops->free(be);
    return st;
}
