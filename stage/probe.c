/* The speed probe a stage reports when it registers: how many bytes of f16 weights per second a
 * one-token matmul streams through the stage's compute as it will run, i.e. split across its tp
 * workers (each a CPU backend with its share of the threads, computing its slice of the weight's
 * rows on its own thread, as the executor's workers do). Decoding is bound by exactly this, so the
 * coordinator's planner can compare hosts, and TP degrees, without loading a model. Takes a few
 * tens of milliseconds. */
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"
#include "kernels/backend.h"
#include "kernels/cpu/threadpool.h"
#include "kernels/dtype.h"
#include "model/shard.h"
#include "stage/stage.h"

#define PROBE_ROWS 4096
#define PROBE_COLS 8192 /* [4096, 8192] f16: 64 MiB, beyond a 32 MiB L3 (a cached probe is noisy) */
#define PROBE_RUNS 5

struct probe {
    struct pp_backend **bes;  /* [workers] */
    struct pp_weight *slices; /* [workers] worker r's rows of the weight */
    int64_t *row0;            /* [workers] the first row of worker r's slice */
    const float *x;           /* [1, COLS] */
    float *y;                 /* [1, ROWS] */
};

/* Pool thread r runs worker r's matmul: the workers compute at the same time, as in a forward. */
static void worker_task(void *ctx, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    struct probe *p = ctx;
    for (int64_t r = begin; r < end; r++)
        p->bes[r]->ops->matmul(p->bes[r], p->y + p->row0[r], p->x, &p->slices[r], 1);
}

static double time_once(struct probe *p, struct pp_threadpool *pool, int workers)
{
    double t0 = pp_clock_mono();
    if (workers == 1)
        worker_task(p, 0, 1, 0);
    else
        pp_threadpool_run(pool, worker_task, p, workers, 1);
    return pp_clock_mono() - t0;
}

pp_status pp_stage_probe(int threads, int workers, double *bytes_per_second)
{
    if (workers < 1 || workers > PP_STAGE_MAX_WORKERS)
        return pp_error(PP_ERR_INVALID_ARG, "probe: expected 1..%d workers, got %d",
                        PP_STAGE_MAX_WORKERS, workers);
    struct pp_backend *bes[PP_STAGE_MAX_WORKERS] = {0};
    struct pp_weight slices[PP_STAGE_MAX_WORKERS];
    int64_t row0[PP_STAGE_MAX_WORKERS];
    struct pp_threadpool *pool = NULL;
    size_t n_w = (size_t)PROBE_ROWS * PROBE_COLS;
    uint16_t *w = pp_alloc_aligned(PP_MEM_MISC, n_w * sizeof(uint16_t)); /* [ROWS, COLS] f16 */
    float *x = pp_alloc_aligned(PP_MEM_MISC, PROBE_COLS * sizeof(float)); /* [1, COLS] */
    float *y = pp_alloc_aligned(PP_MEM_MISC, PROBE_ROWS * sizeof(float)); /* [1, ROWS] */
    pp_status st = PP_OK;
    if (!w || !x || !y) {
        st = pp_error(PP_ERR_NOMEM, "probe: no memory for a %zu-byte weight", n_w * 2);
        goto done;
    }
    if ((st = pp_backend_cpu_new_workers(threads, workers, bes)) != PP_OK ||
        (workers > 1 && (st = pp_threadpool_new(workers, &pool)) != PP_OK))
        goto done;
    for (int r = 0; r < workers && st == PP_OK; r++)
        st = bes[r]->ops->reserve(bes[r], PROBE_COLS, 1);
    if (st != PP_OK)
        goto done;
    uint32_t rnd = 0x9e3779b9u; /* xorshift: values in [-1, 1), the data does not matter */
    for (size_t i = 0; i < n_w; i++) {
        rnd ^= rnd << 13, rnd ^= rnd >> 17, rnd ^= rnd << 5;
        w[i] = pp_f32_to_f16((float)(rnd >> 8) / 8388608.0f - 1.0f);
    }
    for (int i = 0; i < PROBE_COLS; i++)
        x[i] = (float)(i % 7) * 0.125f - 0.375f;
    /* rows split as the executor splits a layer's output rows (whole 128-row units when they go
     * round, as whole heads do) */
    for (int r = 0; r < workers; r++) {
        int64_t b, e;
        pp_shard_split(PROBE_ROWS, workers, r, 128, &b, &e);
        row0[r] = b;
        slices[r] = (struct pp_weight){w + (size_t)b * PROBE_COLS, PP_DTYPE_F16, e - b, PROBE_COLS};
    }
    struct probe p = {bes, slices, row0, x, y};
    time_once(&p, pool, workers); /* warm-up: threads started, pages touched */
    double best = 1e30;
    for (int run = 0; run < PROBE_RUNS; run++) {
        double dt = time_once(&p, pool, workers);
        if (dt < best)
            best = dt;
    }
    *bytes_per_second = (double)(n_w * sizeof(uint16_t)) / (best > 1e-9 ? best : 1e-9);
    PP_INFO("probe: threads=%d workers=%d weight_bytes=%zu best_s=%.6f "
            "weight_bytes_per_second=%.3e", threads, workers, n_w * sizeof(uint16_t), best,
            *bytes_per_second);
done:
    pp_threadpool_free(pool);
    pp_backend_free_all(bes, workers);
    pp_free(PP_MEM_MISC, w);
    pp_free(PP_MEM_MISC, x);
    pp_free(PP_MEM_MISC, y);
    return st;
}
