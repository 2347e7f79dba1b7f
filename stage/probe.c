/* The speed probe a stage reports when it registers: how many bytes of f16 weights per second a
 * one-token matmul streams through the stage's compute as it will run, i.e. split across its tp
 * workers on the stage's devices (CPU backends with their share of the threads, or one GPU each),
 * each computing its slice of the weight's rows on its own thread, as the executor's workers do.
 * Decoding is bound by exactly this, so the coordinator's planner can compare hosts, and TP
 * degrees, without loading a model. Takes a few tens of milliseconds. */
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
#define PROBE_ROW_UNIT 128
/* The weight and its loaded copy take at most this share of the memory the stage may use: a
 * stage held to 160 MiB by its cgroup was killed by the kernel in its 2 × 64 MiB probe. */
#define PROBE_MEMORY_SHARE 4
#define PROBE_RUNS 5

/* Worker r's part: its slice of the weight as its backend loaded it, and its buffers (backend
 * memory). */
struct probe_worker {
    struct pp_backend *be;
    struct pp_weight slice;  /* rows of the host weight */
    struct pp_weight loaded; /* as weight_load made it */
    float *x;                /* [1, COLS] */
    float *y;                /* [1, slice rows] */
    pp_status status;
};

/* Pool thread r runs worker r's matmul: the workers compute at the same time, as in a forward. A
 * device backend's work is waited for, so the time covers it. */
static void worker_task(void *ctx, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    struct probe_worker *p = ctx;
    for (int64_t r = begin; r < end; r++) {
        struct pp_backend *be = p[r].be;
        be->ops->matmul(be, p[r].y, p[r].x, &p[r].loaded, 1);
        pp_status st = be->ops->sync(be);
        if (st != PP_OK && p[r].status == PP_OK)
            p[r].status = st;
    }
}

static double time_once(struct probe_worker *p, struct pp_threadpool *pool, int workers)
{
    double t0 = pp_clock_mono();
    if (workers == 1)
        worker_task(p, 0, 1, 0);
    else
        pp_threadpool_run(pool, worker_task, p, workers, 1);
    return pp_clock_mono() - t0;
}

static void workers_free(struct probe_worker *p, int workers)
{
    for (int r = 0; r < workers; r++) {
        struct pp_backend *be = p[r].be;
        if (!be)
            continue;
        if (p[r].loaded.data && p[r].loaded.data != p[r].slice.data)
            be->ops->weight_free(be, &p[r].loaded);
        be->ops->buf_free(be, PP_MEM_ACTIVATIONS, p[r].x);
        be->ops->buf_free(be, PP_MEM_ACTIVATIONS, p[r].y);
    }
}

pp_status pp_stage_probe(const struct pp_device_spec *devices, int threads, int workers,
                         uint64_t memory, double *bytes_per_second)
{
    if (workers < 1 || workers > PP_STAGE_MAX_WORKERS)
        return pp_error(PP_ERR_INVALID_ARG, "probe: expected 1..%d workers, got %d",
                        PP_STAGE_MAX_WORKERS, workers);
    struct pp_backend *bes[PP_STAGE_MAX_WORKERS] = {0};
    struct probe_worker p[PP_STAGE_MAX_WORKERS];
    memset(p, 0, sizeof(p));
    struct pp_threadpool *pool = NULL;
    /* fewer rows where the memory the stage may use is small */
    int64_t rows = PROBE_ROWS;
    while (rows / 2 >= PROBE_ROW_UNIT * workers && memory > 0 && /* a unit per worker */
           (uint64_t)rows * PROBE_COLS * 2 * 2 > memory / PROBE_MEMORY_SHARE)
        rows /= 2;
    if (rows < PROBE_ROWS)
        PP_INFO("probe: %lld of %d rows, for the %.1f MiB this process may use",
                (long long)rows, PROBE_ROWS, (double)memory / (1024.0 * 1024.0));
    size_t n_w = (size_t)rows * PROBE_COLS;
    uint16_t *w = pp_alloc_aligned(PP_MEM_MISC, n_w * sizeof(uint16_t)); /* [ROWS, COLS] f16 */
    float *x = pp_alloc_aligned(PP_MEM_MISC, PROBE_COLS * sizeof(float)); /* [1, COLS] */
    pp_status st = PP_OK;
    if (!w || !x) {
        st = pp_error(PP_ERR_NOMEM, "probe: no memory for a %zu-byte weight", n_w * 2);
        goto done;
    }
    if ((st = pp_backends_new(devices, threads, workers, bes)) != PP_OK ||
        (workers > 1 && (st = pp_threadpool_new(workers, &pool)) != PP_OK))
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
    for (int r = 0; r < workers && st == PP_OK; r++) {
        struct pp_backend *be = p[r].be = bes[r];
        int64_t b, e;
        pp_shard_split(rows, workers, r, PROBE_ROW_UNIT, &b, &e);
        p[r].slice =
            (struct pp_weight){w + (size_t)b * PROBE_COLS, PP_DTYPE_F16, e - b, PROBE_COLS};
        if ((st = be->ops->reserve(be, PROBE_COLS, 1)) == PP_OK &&
            (st = be->ops->weight_load(be, &p[r].slice, 0, &p[r].loaded)) == PP_OK &&
            (st = be->ops->buf_alloc(be, PP_MEM_ACTIVATIONS, PROBE_COLS * sizeof(float),
                                     (void **)&p[r].x)) == PP_OK &&
            (st = be->ops->buf_alloc(be, PP_MEM_ACTIVATIONS, (e - b) * (int64_t)sizeof(float),
                                     (void **)&p[r].y)) == PP_OK)
            be->ops->copy_in(be, p[r].x, x, PROBE_COLS * sizeof(float));
    }
    if (st != PP_OK)
        goto done;
    time_once(p, pool, workers); /* warm-up: threads started, pages touched */
    double best = 1e30;
    for (int run = 0; run < PROBE_RUNS; run++) {
        double dt = time_once(p, pool, workers);
        if (dt < best)
            best = dt;
    }
    for (int r = 0; r < workers && st == PP_OK; r++)
        st = p[r].status;
    if (st != PP_OK)
        goto done;
    *bytes_per_second = (double)(n_w * sizeof(uint16_t)) / (best > 1e-9 ? best : 1e-9);
    PP_INFO("probe: device=%s threads=%d workers=%d weight_bytes=%zu best_s=%.6f "
            "weight_bytes_per_second=%.3e", bes[0]->name, threads, workers,
            n_w * sizeof(uint16_t), best, *bytes_per_second);
done:
    workers_free(p, workers);
    pp_threadpool_free(pool);
    pp_backend_free_all(bes, workers);
    pp_free(PP_MEM_MISC, w);
    pp_free(PP_MEM_MISC, x);
    return st;
}
