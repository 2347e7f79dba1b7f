/* Unit tests of the CPU backend (kernels/backend.h, pp_backend_cpu_new), the reference every other
 * backend is compared with. Each op is checked against a plain double-precision version written
 * here, on random shapes that include sizes not a multiple of the 8-lane dot product; then the
 * determinism contract is checked bit for bit: the same output whatever the thread count (1..4) and
 * whichever other rows share the batch. */
#include "testutil.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/alloc.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu-impl.h"
#include "kernels/cpu/matmul_q8.h"
#include "kernels/cpu/row_groups.h"
#include "kernels/cpu/simd.h"

#define N_BE 4 /* backends with 1, 2, 3 and 4 threads */
#define MAX_COLS 2048
#define MAX_CONTEXT 640 /* beyond two 256-position attention chunks */

/* --- helpers ------------------------------------------------------------------------------------
 */

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [lo, hi). */
static float rng_float(uint64_t *s, float lo, float hi)
{
    return lo + (hi - lo) * (float)((rng_next(s) >> 40) * (1.0 / 16777216.0));
}

/* Uniform integer in [lo, hi]. */
static int64_t rng_int(uint64_t *s, int64_t lo, int64_t hi)
{
    return lo + (int64_t)(rng_next(s) % (uint64_t)(hi - lo + 1));
}

static float *rand_floats(uint64_t *s, int64_t n, float lo, float hi)
{
    float *v = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    assert_non_null(v);
    for (int64_t i = 0; i < n; i++)
        v[i] = rng_float(s, lo, hi);
    return v;
}

static void backends_new(struct pp_backend *be[N_BE])
{
    for (int i = 0; i < N_BE; i++) {
        assert_int_equal(pp_backend_cpu_new(i + 1, &be[i]), PP_OK);
        assert_int_equal(be[i]->n_threads, i + 1);
        assert_string_equal(be[i]->name, "cpu");
        assert_int_equal(be[i]->ops->reserve(be[i], MAX_COLS, MAX_CONTEXT), PP_OK);
    }
}

static void backends_free(struct pp_backend *be[N_BE])
{
    for (int i = 0; i < N_BE; i++)
        be[i]->ops->free(be[i]);
}

/* A random [rows, cols] weight stored as dtype, and its exact f32 values (deq[rows*cols]), which
 * the reference uses: the backend promises the product with the dequantized weights. */
struct test_weight {
    struct pp_weight w;
    void *data;
    float *deq;
};

static void weight_make(struct test_weight *tw, enum pp_dtype dt, int64_t rows, int64_t cols,
                        uint64_t *seed)
{
    float *src = rand_floats(seed, rows * cols, -1.0f, 1.0f);
    int64_t rb = pp_dtype_row_bytes(dt, cols);
    assert_true(rb >= 0);
    tw->data = malloc((size_t)(rows * rb));
    tw->deq = malloc((size_t)(rows * cols) * sizeof(float));
    assert_non_null(tw->data);
    assert_non_null(tw->deq);
    for (int64_t i = 0; i < rows * cols; i++) {
        if (dt == PP_DTYPE_F32)
            ((float *)tw->data)[i] = src[i];
        else if (dt == PP_DTYPE_F16)
            ((uint16_t *)tw->data)[i] = pp_f32_to_f16(src[i]);
        else if (dt == PP_DTYPE_BF16)
            ((uint16_t *)tw->data)[i] = pp_f32_to_bf16(src[i]);
    }
    if (dt == PP_DTYPE_Q8_0)
        for (int64_t r = 0; r < rows; r++)
            pp_quantize_q8_0((char *)tw->data + r * rb, src + r * cols, cols);
    for (int64_t r = 0; r < rows; r++)
        pp_row_to_f32(tw->deq + r * cols, (const char *)tw->data + r * rb, dt, cols);
    tw->w = (struct pp_weight){tw->data, dt, rows, cols};
    free(src);
}

static void weight_free(struct test_weight *tw)
{
    free(tw->data);
    free(tw->deq);
}

/* y[n, rows] = x · wᵀ with w as be's weight_load lays it out (row groups), freed after. */
static void matmul_loaded(struct pp_backend *be, float *y, const float *x,
                          const struct test_weight *tw, int64_t n)
{
    struct pp_weight lw;
    assert_int_equal(be->ops->weight_load(be, &tw->w, 0, &lw), PP_OK);
    assert_int_equal(lw.layout, PP_WEIGHT_ROW_GROUPS);
    be->ops->matmul(be, y, x, &lw, n);
    be->ops->weight_free(be, &lw);
}

/* The same product from the row-major weight and from its row groups: the layout moves bytes,
 * never the arithmetic. */
static void check_layouts_agree(struct pp_backend *be, const float *y, const float *x,
                                const struct test_weight *tw, int64_t n, const char *what)
{
    size_t bytes = (size_t)(n * tw->w.rows) * sizeof(float);
    float *yg = malloc(bytes);
    assert_non_null(yg);
    matmul_loaded(be, yg, x, tw, n);
    if (memcmp(y, yg, bytes) != 0)
        fail_msg("matmul %s [%lld,%lld] n=%lld (%s): row groups differ from row-major",
                 pp_dtype_name(tw->w.dtype), (long long)tw->w.rows, (long long)tw->w.cols,
                 (long long)n, what);
    free(yg);
}

/* --- matmul
 * --------------------------------------------------------------------------------------- */

/* y = x·wᵀ in double; also the sum of |x·w| terms, the scale of the float rounding error. */
static void matmul_ref(double *y, double *mag, const float *x, const float *w, int64_t n,
                       int64_t rows, int64_t cols)
{
    for (int64_t t = 0; t < n; t++)
        for (int64_t r = 0; r < rows; r++) {
            double s = 0.0, m = 0.0;
            for (int64_t k = 0; k < cols; k++) {
                double p = (double)x[t * cols + k] * (double)w[r * cols + k];
                s += p;
                m += fabs(p);
            }
            y[t * rows + r] = s;
            mag[t * rows + r] = m;
        }
}

/* The activations as the matmul of dt sees them: for Q8_0 in int8 (kernels/cpu/matmul_q8.h), each
 * value q · d back in f32; for the other dtypes a copy. */
static float *q8_act_values(const float *x, enum pp_dtype dt, int64_t n, int64_t cols)
{
    float *v = malloc((size_t)(n * cols) * sizeof(float));
    assert_non_null(v);
    memcpy(v, x, (size_t)(n * cols) * sizeof(float));
    if (dt != PP_DTYPE_Q8_0)
        return v;
    int8_t q[PP_Q8_0_BLOCK];
    for (int64_t i = 0; i < n * cols; i += PP_Q8_0_BLOCK) {
        float d = pp__q8_act_block(q, x + i);
        for (int e = 0; e < PP_Q8_0_BLOCK; e++)
            v[i + e] = (float)q[e] * d;
    }
    return v;
}

/* One shape on every backend: close to the reference, and the same bits on all thread counts and
 * from the weight in row groups. */
static void check_matmul(struct pp_backend *be[N_BE], enum pp_dtype dt, int64_t rows, int64_t cols,
                         int64_t n, uint64_t *seed)
{
    struct test_weight tw;
    weight_make(&tw, dt, rows, cols, seed);
    float *x = rand_floats(seed, n * cols, -1.0f, 1.0f);
    double *ref = malloc((size_t)(n * rows) * sizeof(double));
    double *mag = malloc((size_t)(n * rows) * sizeof(double));
    float *y[N_BE];
    float *xr = q8_act_values(x, dt, n, cols);
    matmul_ref(ref, mag, xr, tw.deq, n, rows, cols);
    free(xr);
    for (int b = 0; b < N_BE; b++) {
        y[b] = malloc((size_t)(n * rows) * sizeof(float));
        be[b]->ops->matmul(be[b], y[b], x, &tw.w, n);
    }
    for (int64_t i = 0; i < n * rows; i++)
        if (fabs(y[0][i] - ref[i]) > 1e-5 * mag[i] + 1e-30)
            fail_msg("matmul %s [%lld,%lld] n=%lld: y[%lld]=%.9g, reference %.9g",
                     pp_dtype_name(dt), (long long)rows, (long long)cols, (long long)n,
                     (long long)i, (double)y[0][i], ref[i]);
    for (int b = 1; b < N_BE; b++)
        if (memcmp(y[0], y[b], (size_t)(n * rows) * sizeof(float)) != 0)
            fail_msg("matmul %s [%lld,%lld] n=%lld: %d threads differ from 1 thread",
                     pp_dtype_name(dt), (long long)rows, (long long)cols, (long long)n, b + 1);
    for (int b = 0; b < N_BE; b++)
        check_layouts_agree(be[b], y[0], x, &tw, n, "threads 1-4");
    for (int b = 0; b < N_BE; b++)
        free(y[b]);
    free(x);
    free(ref);
    free(mag);
    weight_free(&tw);
}

static void matmul_dtype(enum pp_dtype dt, uint64_t seed)
{
    struct pp_backend *be[N_BE];
    backends_new(be);
    int64_t step = dt == PP_DTYPE_Q8_0 ? PP_Q8_0_BLOCK : 1;
    /* edge shapes first: one column, one row, a tail shorter than 8, more tokens than the
     * few-token nest takes (20); more rows than 4 threads × the row chunk of either nest (96 rows
     * up to 20 tokens, 48 beyond: kernels/cpu/matmul.c), ragged, so that every thread count cuts
     * the rows differently; cols a multiple of 256 with many tokens, which go through the padded
     * copy of the activations, in two slices, the second one few-token */
    const int64_t fixed[][3] = {{1, 1, 1},     {1, 7, 1},      {3, 8, 2},    {5, 9, 3},
                                {70, 33, 1},   {17, 100, 33},  {65, 67, 40}, {2, MAX_COLS, 2},
                                {7, 700, 9},   {31, 1000, 5},  {50, 257, 4}, {389, 40, 1},
                                {401, 70, 6},  {203, 45, 27}, {45, 512, PP_MM_X_PADDED_TOKENS + 12},
                                {20, 768, 30}};
    for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++) {
        int64_t cols = (fixed[i][1] + step - 1) / step * step;
        if (cols > MAX_COLS)
            cols = MAX_COLS;
        check_matmul(be, dt, fixed[i][0], cols, fixed[i][2], &seed);
    }
    for (int i = 0; i < 20; i++) {
        int64_t cols = rng_int(&seed, 1, 300 / step) * step;
        check_matmul(be, dt, rng_int(&seed, 1, 80), cols, rng_int(&seed, 1, 40), &seed);
    }
    backends_free(be);
}

static void test_matmul_f32(void **state)
{
    (void)state;
    matmul_dtype(PP_DTYPE_F32, 1);
}

static void test_matmul_f16(void **state)
{
    (void)state;
    matmul_dtype(PP_DTYPE_F16, 2);
}

static void test_matmul_bf16(void **state)
{
    (void)state;
    matmul_dtype(PP_DTYPE_BF16, 3);
}

static void test_matmul_q8_0(void **state)
{
    (void)state;
    matmul_dtype(PP_DTYPE_Q8_0, 4);
}

/* A token's output row has the same bits alone (the direct, decode loop nest) as inside a batch of
 * 5, of 40 (the packed loop nest, ragged token tiles), of more than one packed pass of tokens
 * (PP_MM_NC_MAX) or of more than one slice of the padded activations (PP_MM_X_PADDED_TOKENS, with
 * cols a multiple of 256), with the reduction inside one chunk and across three (cols > 2 *
 * PP_MM_KC), for every dtype: batching must never change what a request sees. */
static void test_matmul_batch_invariant(void **state)
{
    (void)state;
    struct pp_backend *be[N_BE];
    backends_new(be);
    uint64_t seed = 11;
    const enum pp_dtype dts[] = {PP_DTYPE_F32, PP_DTYPE_F16, PP_DTYPE_BF16, PP_DTYPE_Q8_0};
    const int64_t batches[] = {5, 40, PP_MM_NC_MAX + 7, PP_MM_X_PADDED_TOKENS + 12};
    for (int d = 0; d < 12; d++) {
        int64_t rows = 37, cols = dts[d % 4] == PP_DTYPE_Q8_0 ? 96 : 83;
        if (d >= 4)
            cols = 2 * PP_MM_KC + (dts[d % 4] == PP_DTYPE_Q8_0 ? 96 : 89);
        if (d >= 8)
            cols = 3 * 256;
        struct test_weight tw;
        weight_make(&tw, dts[d % 4], rows, cols, &seed);
        for (int bi = 0; bi < 4; bi++) {
            int64_t n = batches[bi];
            float *x = rand_floats(&seed, n * cols, -2.0f, 2.0f);
            float *yb = malloc((size_t)(n * rows) * sizeof(float));
            float one[37];
            be[3]->ops->matmul(be[3], yb, x, &tw.w, n);
            for (int64_t t = 0; t < n; t++) {
                struct pp_backend *b1 = be[t % N_BE]; /* alone, on any thread count */
                b1->ops->matmul(b1, one, x + t * cols, &tw.w, 1);
                if (memcmp(one, yb + t * rows, sizeof(one)) != 0)
                    fail_msg("matmul %s: token %lld alone differs from inside a batch of %lld",
                             pp_dtype_name(dts[d % 4]), (long long)t, (long long)n);
            }
            free(x);
            free(yb);
        }
        weight_free(&tw);
    }
    backends_free(be);
}

/* Decode-sized batches (1..24 tokens: the few-token nest and just past it) with rows long enough to
 * be cut into several reduction blocks (up to 2960 elements, ragged): each token's row of outputs
 * has the same bits alone on any thread count as inside the batch on 1..4 threads, for every
 * dtype. */
static void test_matmul_small_batches(void **state)
{
    (void)state;
    struct pp_backend *be[N_BE];
    for (int i = 0; i < N_BE; i++) {
        assert_int_equal(pp_backend_cpu_new(i + 1, &be[i]), PP_OK);
        assert_int_equal(be[i]->ops->reserve(be[i], 4096, 16), PP_OK);
    }
    uint64_t seed = 13;
    const enum pp_dtype dts[] = {PP_DTYPE_F32, PP_DTYPE_F16, PP_DTYPE_BF16, PP_DTYPE_Q8_0};
    enum { ROWS = 53 };
    for (int d = 0; d < 4; d++) {
        int64_t cols = dts[d] == PP_DTYPE_Q8_0 ? 2944 : 2957;
        struct test_weight tw;
        weight_make(&tw, dts[d], ROWS, cols, &seed);
        for (int64_t n = 1; n <= 24; n++) {
            float *x = rand_floats(&seed, n * cols, -2.0f, 2.0f);
            size_t bytes = (size_t)(n * ROWS) * sizeof(float);
            float *yb[N_BE], one[ROWS];
            for (int b = 0; b < N_BE; b++) {
                yb[b] = malloc(bytes);
                be[b]->ops->matmul(be[b], yb[b], x, &tw.w, n);
                if (b > 0 && memcmp(yb[0], yb[b], bytes) != 0)
                    fail_msg("matmul %s n=%lld: %d threads differ from 1 thread",
                             pp_dtype_name(dts[d]), (long long)n, b + 1);
                check_layouts_agree(be[b], yb[0], x, &tw, n, "several reduction blocks");
            }
            for (int64_t t = 0; t < n; t++) {
                struct pp_backend *b1 = be[(t + n) % N_BE];
                b1->ops->matmul(b1, one, x + t * cols, &tw.w, 1);
                if (memcmp(one, yb[0] + t * ROWS, sizeof(one)) != 0)
                    fail_msg("matmul %s: token %lld alone differs from inside a batch of %lld",
                             pp_dtype_name(dts[d]), (long long)t, (long long)n);
            }
            for (int b = 0; b < N_BE; b++)
                free(yb[b]);
            free(x);
        }
        weight_free(&tw);
    }
    backends_free(be);
}

/* Each vector table this CPU can run (AVX2, AVX-512; PP_SIMD picks one when a backend is created)
 * gives the portable loops' bits, on ragged shapes and batches that are not a multiple of the 4-
 * or 8-token vector steps, with the weights in row groups and row-major, so a result never depends
 * on which machine computed it. */
static void compare_with_portable(struct pp_backend *fast, struct pp_backend *port,
                                  const char *name)
{
    uint64_t seed = 12;
    const enum pp_dtype dts[] = {PP_DTYPE_F32, PP_DTYPE_F16, PP_DTYPE_BF16, PP_DTYPE_Q8_0};
    for (int it = 0; it < 24; it++) {
        enum pp_dtype dt = dts[it % 4];
        int64_t step = dt == PP_DTYPE_Q8_0 ? PP_Q8_0_BLOCK : 1;
        int64_t rows = rng_int(&seed, 1, 40), cols = rng_int(&seed, 1, 700 / step) * step;
        int64_t n = rng_int(&seed, 1, 37);
        struct test_weight tw;
        weight_make(&tw, dt, rows, cols, &seed);
        float *x = rand_floats(&seed, n * cols, -3.0f, 3.0f);
        size_t bytes = (size_t)(n * rows) * sizeof(float);
        float *a = malloc(bytes), *b = malloc(bytes);
        fast->ops->matmul(fast, a, x, &tw.w, n);
        port->ops->matmul(port, b, x, &tw.w, n);
        if (memcmp(a, b, bytes) != 0)
            fail_msg("matmul %s [%lld,%lld] n=%lld: %s and portable loops differ",
                     pp_dtype_name(dt), (long long)rows, (long long)cols, (long long)n, name);
        check_layouts_agree(fast, a, x, &tw, n, name);
        check_layouts_agree(port, a, x, &tw, n, "portable loops");
        free(a);
        free(b);
        free(x);
        weight_free(&tw);
    }
}

static void test_matmul_simd_matches_portable(void **state)
{
    (void)state;
    struct pp_backend *port;
    setenv("PP_SIMD", "portable", 1);
    assert_int_equal(pp_backend_cpu_new(2, &port), PP_OK);
    assert_int_equal(port->ops->reserve(port, MAX_COLS, MAX_CONTEXT), PP_OK);
    static const char *const names[] = {"avx2", "avx512"};
    for (int i = 0; i < 2; i++) {
        if (!pp_simd_named(names[i]))
            continue;
        struct pp_backend *fast;
        setenv("PP_SIMD", names[i], 1);
        assert_int_equal(pp_backend_cpu_new(2, &fast), PP_OK);
        assert_int_equal(fast->ops->reserve(fast, MAX_COLS, MAX_CONTEXT), PP_OK);
        compare_with_portable(fast, port, names[i]);
        fast->ops->free(fast);
    }
    unsetenv("PP_SIMD");
    port->ops->free(port);
}

/* --- element-wise ops
 * ------------------------------------------------------------------------------ */

/* matmul_many gives every weight the bits of its own matmul call, on any thread count, for one
 * token up to more than one padded slice, in both layouts, with weights whose rows are not
 * multiples of the chunks (their outputs must not spill into the next weight's), and with
 * weights that cannot share one job (Q8_0 beside f16: run one by one). */
static void test_matmul_many(void **state)
{
    (void)state;
    struct pp_backend *be[N_BE];
    backends_new(be);
    uint64_t seed = 77;
    const int64_t cols = 256, rows[3] = {100, 7, 131};
    const enum pp_dtype sets[][3] = {{PP_DTYPE_F16, PP_DTYPE_F16, PP_DTYPE_F16},
                                     {PP_DTYPE_Q8_0, PP_DTYPE_Q8_0, PP_DTYPE_Q8_0},
                                     {PP_DTYPE_BF16, PP_DTYPE_F32, PP_DTYPE_F16},
                                     {PP_DTYPE_Q8_0, PP_DTYPE_F16, PP_DTYPE_Q8_0}};
    const int64_t ns[] = {1, 2, 5, 20, 130};
    for (size_t k = 0; k < sizeof(sets) / sizeof(sets[0]); k++) {
        struct test_weight tw[3];
        for (int i = 0; i < 3; i++)
            weight_make(&tw[i], sets[k][i], rows[i], cols, &seed);
        for (size_t ni = 0; ni < sizeof(ns) / sizeof(ns[0]); ni++) {
            int64_t n = ns[ni];
            float *x = rand_floats(&seed, n * cols, -2.0f, 2.0f);
            for (int b = 0; b < N_BE; b++) {
                for (int loaded = 0; loaded < 2; loaded++) {
                    struct pp_weight lw[3];
                    const struct pp_weight *wp[3];
                    float *want[3], *got[3];
                    for (int i = 0; i < 3; i++) {
                        if (loaded)
                            assert_int_equal(be[b]->ops->weight_load(be[b], &tw[i].w, 0, &lw[i]),
                                             PP_OK);
                        else
                            lw[i] = tw[i].w;
                        wp[i] = &lw[i];
                        want[i] = malloc((size_t)(n * rows[i]) * sizeof(float));
                        /* a sentinel past the end catches a write beyond the weight's rows */
                        got[i] = malloc((size_t)(n * rows[i] + 1) * sizeof(float));
                        got[i][n * rows[i]] = 12345.0f;
                        be[b]->ops->matmul(be[b], want[i], x, wp[i], n);
                    }
                    for (int count = 1; count <= 3; count++) {
                        be[b]->ops->matmul_many(be[b], count, got, x, wp, n);
                        for (int i = 0; i < count; i++) {
                            if (memcmp(want[i], got[i], (size_t)(n * rows[i]) * sizeof(float)))
                                fail_msg("matmul_many set %zu, %d weights, n=%lld, %d threads, "
                                         "%s: weight %d differs from its own matmul",
                                         k, count, (long long)n, b + 1,
                                         loaded ? "row groups" : "row-major", i);
                            assert_true(got[i][n * rows[i]] == 12345.0f);
                        }
                    }
                    for (int i = 0; i < 3; i++) {
                        free(want[i]);
                        free(got[i]);
                        if (loaded)
                            be[b]->ops->weight_free(be[b], &lw[i]);
                    }
                }
            }
            free(x);
        }
        for (int i = 0; i < 3; i++)
            weight_free(&tw[i]);
    }
    backends_free(be);
}

static void test_rmsnorm(void **state)
{
    (void)state;
    struct pp_backend *be[N_BE];
    backends_new(be);
    uint64_t seed = 21;
    for (int it = 0; it < 20; it++) {
        int64_t n = rng_int(&seed, 1, 13), dim = rng_int(&seed, 1, 300);
        float eps = it % 2 ? 1e-5f : 1e-6f;
        float *x = rand_floats(&seed, n * dim, -3.0f, 3.0f);
        float *g = rand_floats(&seed, dim, 0.5f, 1.5f);
        float *y[N_BE];
        for (int b = 0; b < N_BE; b++) {
            y[b] = malloc((size_t)(n * dim) * sizeof(float));
            be[b]->ops->rmsnorm(be[b], y[b], x, g, n, dim, eps);
        }
        for (int64_t r = 0; r < n; r++) {
            double ss = 0.0;
            for (int64_t i = 0; i < dim; i++)
                ss += (double)x[r * dim + i] * x[r * dim + i];
            double scale = 1.0 / sqrt(ss / (double)dim + (double)eps);
            for (int64_t i = 0; i < dim; i++) {
                double ref = (double)g[i] * x[r * dim + i] * scale;
                if (fabs(y[0][r * dim + i] - ref) > 1e-5 * fabs(ref) + 1e-7)
                    fail_msg("rmsnorm n=%lld dim=%lld: [%lld,%lld] %.9g vs %.9g", (long long)n,
                             (long long)dim, (long long)r, (long long)i,
                             (double)y[0][r * dim + i], ref);
            }
        }
        for (int b = 1; b < N_BE; b++)
            assert_memory_equal(y[0], y[b], (size_t)(n * dim) * sizeof(float));
        /* y may alias x: in place gives the same bits */
        be[1]->ops->rmsnorm(be[1], x, x, g, n, dim, eps);
        assert_memory_equal(x, y[0], (size_t)(n * dim) * sizeof(float));
        for (int b = 0; b < N_BE; b++)
            free(y[b]);
        free(x);
        free(g);
    }
    backends_free(be);
}

/* The pair a rotation mixes: NEOX (i, i + d/2), INTERLEAVED (2i, 2i + 1). */
static void rope_pair(enum pp_rope_layout layout, int32_t hd, int32_t i, int32_t *a, int32_t *b)
{
    *a = layout == PP_ROPE_NEOX ? i : 2 * i;
    *b = layout == PP_ROPE_NEOX ? i + hd / 2 : 2 * i + 1;
}

static void test_rope_layouts(void **state)
{
    (void)state;
    struct pp_backend *be[N_BE];
    backends_new(be);
    uint64_t seed = 31;
    const int32_t head_dims[] = {2, 6, 10, 18, 64};
    for (int it = 0; it < 20; it++) {
        enum pp_rope_layout layout = it % 2 ? PP_ROPE_INTERLEAVED : PP_ROPE_NEOX;
        int32_t hd = head_dims[it % 5], n_heads = (int32_t)rng_int(&seed, 1, 5);
        int64_t n = rng_int(&seed, 1, 9), width = (int64_t)n_heads * hd;
        float *x0 = rand_floats(&seed, n * width, -2.0f, 2.0f);
        float inv_freq[32];
        for (int32_t i = 0; i < hd / 2; i++)
            inv_freq[i] = powf(10000.0f, -2.0f * (float)i / (float)hd);
        int32_t pos[9];
        for (int64_t t = 0; t < n; t++)
            pos[t] = t == 0 ? 0 : (int32_t)rng_int(&seed, 1, 5000);
        float *y[N_BE];
        for (int b = 0; b < N_BE; b++) {
            y[b] = malloc((size_t)(n * width) * sizeof(float));
            memcpy(y[b], x0, (size_t)(n * width) * sizeof(float));
            be[b]->ops->rope(be[b], y[b], pos, n, n_heads, hd, inv_freq, layout);
        }
        for (int64_t t = 0; t < n; t++)
            for (int32_t h = 0; h < n_heads; h++)
                for (int32_t i = 0; i < hd / 2; i++) {
                    int32_t a, b;
                    rope_pair(layout, hd, i, &a, &b);
                    const float *xv = x0 + t * width + (int64_t)h * hd;
                    const float *yv = y[0] + t * width + (int64_t)h * hd;
                    double ang = (double)pos[t] * (double)inv_freq[i];
                    double ra = xv[a] * cos(ang) - xv[b] * sin(ang);
                    double rb = xv[b] * cos(ang) + xv[a] * sin(ang);
                    double tol = 2e-6 * (fabs(xv[a]) + fabs(xv[b])) + 1e-7;
                    if (fabs(yv[a] - ra) > tol || fabs(yv[b] - rb) > tol)
                        fail_msg("rope layout %d hd=%d pos=%d pair %d: (%g,%g) vs (%g,%g)", layout,
                                 hd, pos[t], i, (double)yv[a], (double)yv[b], ra, rb);
                }
        /* position 0 is the identity, bit for bit */
        assert_memory_equal(y[0], x0, (size_t)width * sizeof(float));
        for (int b = 1; b < N_BE; b++)
            assert_memory_equal(y[0], y[b], (size_t)(n * width) * sizeof(float));
        for (int b = 0; b < N_BE; b++)
            free(y[b]);
        free(x0);
    }
    backends_free(be);
}

/* The two layouts really are different rotations: feeding a NEOX-ordered head to the interleaved
 * kernel (or back) gives a different answer, so a swapped layout in a loader cannot pass unseen. */
static void test_rope_layouts_differ(void **state)
{
    (void)state;
    struct pp_backend *be[N_BE];
    backends_new(be);
    float a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, b[8];
    memcpy(b, a, sizeof(a));
    float inv_freq[4] = {1.0f, 0.1f, 0.01f, 0.001f};
    int32_t pos = 3;
    be[0]->ops->rope(be[0], a, &pos, 1, 1, 8, inv_freq, PP_ROPE_NEOX);
    be[0]->ops->rope(be[0], b, &pos, 1, 1, 8, inv_freq, PP_ROPE_INTERLEAVED);
    assert_true(memcmp(a, b, sizeof(a)) != 0);
    /* NEOX pair 0 is (0, 4): element 1 moves by the second frequency */
    float c1 = cosf(0.3f), s1 = sinf(0.3f);
    assert_true(fabsf(a[1] - (2 * c1 - 6 * s1)) < 1e-5f);
    /* INTERLEAVED pair 0 is (0, 1) */
    float c0 = cosf(3.0f), s0 = sinf(3.0f);
    assert_true(fabsf(b[1] - (2 * c0 + 1 * s0)) < 1e-5f);
    backends_free(be);
}

static void test_swiglu_add_bias(void **state)
{
    (void)state;
    struct pp_backend *be[N_BE];
    backends_new(be);
    uint64_t seed = 41;
    enum { N = 203 };
    float *gate = rand_floats(&seed, N, -8.0f, 8.0f), *up = rand_floats(&seed, N, -2.0f, 2.0f);
    /* saturated gates: silu(-100) underflows, silu(100) = 100 */
    gate[0] = -100.0f;
    gate[1] = 100.0f;
    gate[2] = 0.0f;
    gate[3] = -1000.0f;
    float out[N];
    be[2]->ops->swiglu(be[2], out, gate, up, N);
    for (int i = 0; i < N; i++) {
        double g = gate[i], ref = g / (1.0 + exp(-g)) * up[i];
        if (!isfinite(out[i]) || fabs(out[i] - ref) > 2e-6 * fabs(ref) + 1e-30)
            fail_msg("swiglu gate=%g up=%g: %.9g vs %.9g", g, (double)up[i], (double)out[i], ref);
    }

    /* add and add_bias: one rounding each, so they equal the double sum rounded to float */
    float *y = rand_floats(&seed, N, -5.0f, 5.0f), *x = rand_floats(&seed, N, -5.0f, 5.0f);
    float y0[N];
    memcpy(y0, y, sizeof(y0));
    be[1]->ops->add(be[1], y, x, N);
    for (int i = 0; i < N; i++)
        assert_true(y[i] == (float)((double)y0[i] + (double)x[i]));

    const int64_t n = 7, cols = 29; /* 203 = 7 × 29 */
    float *bias = rand_floats(&seed, cols, -1.0f, 1.0f);
    memcpy(y0, y, sizeof(y0));
    be[3]->ops->add_bias(be[3], y, bias, n, cols);
    for (int64_t r = 0; r < n; r++)
        for (int64_t i = 0; i < cols; i++)
            assert_true(y[r * cols + i] == (float)((double)y0[r * cols + i] + (double)bias[i]));
    free(gate);
    free(up);
    free(y);
    free(x);
    free(bias);
    backends_free(be);
}

static void test_embed(void **state)
{
    (void)state;
    struct pp_backend *be[N_BE];
    backends_new(be);
    uint64_t seed = 51;
    const enum pp_dtype dts[] = {PP_DTYPE_F32, PP_DTYPE_F16, PP_DTYPE_BF16, PP_DTYPE_Q8_0};
    for (int d = 0; d < 4; d++) {
        int64_t vocab = 53, cols = dts[d] == PP_DTYPE_Q8_0 ? 64 : 45;
        struct test_weight tw;
        weight_make(&tw, dts[d], vocab, cols, &seed);
        const int32_t ids[] = {0, 52, 7, 7, 31, 0, 1};
        const int64_t n = 7;
        float *out = malloc((size_t)(n * cols) * sizeof(float));
        /* row-major, and loaded in row groups (a head tied to its embedding is loaded so) */
        struct pp_weight lw;
        assert_int_equal(be[0]->ops->weight_load(be[0], &tw.w, 0, &lw), PP_OK);
        assert_int_equal(lw.layout, PP_WEIGHT_ROW_GROUPS);
        for (int layout = 0; layout < 2; layout++) {
            memset(out, 0, (size_t)(n * cols) * sizeof(float));
            be[0]->ops->embed(be[0], out, layout ? &lw : &tw.w, ids, n);
            for (int64_t t = 0; t < n; t++)
                if (memcmp(out + t * cols, tw.deq + ids[t] * cols,
                           (size_t)cols * sizeof(float)) != 0)
                    fail_msg("embed %s%s: token %lld (id %d) is not row %d",
                             pp_dtype_name(dts[d]), layout ? " in row groups" : "", (long long)t,
                             ids[t], ids[t]);
        }
        be[0]->ops->weight_free(be[0], &lw);
        free(out);
        weight_free(&tw);
    }
    backends_free(be);
}

/* --- KV store and attention over a paged cache
 * ------------------------------------------------------ */

#define KV_LAYERS 2
#define KV_LAYER 1 /* the layer under test; layer 0 stays poisoned */
#define KV_BLOCK 4
#define KV_BLOCKS 320
#define MAX_SEQS 4

struct attn_case {
    int32_t n_heads, n_kv_heads, head_dim, window;
    int32_t n_seqs;
    int32_t prefix[MAX_SEQS]; /* tokens already in the cache */
    int32_t fresh[MAX_SEQS];  /* tokens of this batch */
};

/* A cache and a batch built by hand: sequences own scattered, non-contiguous blocks, and the whole
 * pool starts as NaN so that a read of any slot nobody wrote poisons the output. */
struct attn_setup {
    struct attn_case c;
    int32_t kv_dim, q_dim, n_rows;
    float *pool;
    struct pp_kv_view view;
    int32_t tables[MAX_SEQS][MAX_CONTEXT / KV_BLOCK];
    float *k[MAX_SEQS], *v[MAX_SEQS]; /* [prefix + fresh, kv_dim] every key/value of the sequence */
    struct pp_attn_seq seqs[MAX_SEQS];
    float *q; /* [n_rows, q_dim] */
    struct pp_attn_shape shape;
};

static float *kv_slot(const struct attn_setup *s, int32_t seq, int32_t pos, int kv_sel)
{
    int64_t b = s->tables[seq][pos / KV_BLOCK];
    return s->pool + ((b * KV_LAYERS + KV_LAYER) * 2 + kv_sel) * s->view.block_elems +
           (int64_t)(pos % KV_BLOCK) * s->kv_dim;
}

static void attn_setup_init(struct attn_setup *s, const struct attn_case *c, struct pp_backend *be,
                            uint64_t *seed)
{
    memset(s, 0, sizeof(*s));
    s->c = *c;
    s->kv_dim = c->n_kv_heads * c->head_dim;
    s->q_dim = c->n_heads * c->head_dim;
    s->view = (struct pp_kv_view){NULL, KV_LAYERS, KV_BLOCK, s->kv_dim,
                                  (int64_t)KV_BLOCK * s->kv_dim};
    int64_t pool_elems = (int64_t)KV_BLOCKS * KV_LAYERS * 2 * s->view.block_elems;
    s->pool = malloc((size_t)pool_elems * sizeof(float));
    assert_non_null(s->pool);
    for (int64_t i = 0; i < pool_elems; i++)
        s->pool[i] = NAN;
    s->view.pool = s->pool;

    /* hand the blocks out in a shuffled order */
    int32_t perm[KV_BLOCKS];
    for (int32_t i = 0; i < KV_BLOCKS; i++)
        perm[i] = i;
    for (int32_t i = KV_BLOCKS - 1; i > 0; i--) {
        int32_t j = (int32_t)rng_int(seed, 0, i), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int32_t next = 0, row = 0;
    struct pp_attn_seq pre[MAX_SEQS];
    float *kpre = NULL, *vpre = NULL, *knew = NULL, *vnew = NULL;
    int32_t pre_rows = 0;
    for (int32_t i = 0; i < c->n_seqs; i++) {
        int32_t total = c->prefix[i] + c->fresh[i];
        assert_true(total <= MAX_CONTEXT);
        for (int32_t b = 0; b < (total + KV_BLOCK - 1) / KV_BLOCK; b++)
            s->tables[i][b] = perm[next++];
        assert_true(next <= KV_BLOCKS);
        s->k[i] = rand_floats(seed, (int64_t)total * s->kv_dim, -1.0f, 1.0f);
        s->v[i] = rand_floats(seed, (int64_t)total * s->kv_dim, -1.0f, 1.0f);
        pre[i] = (struct pp_attn_seq){pre_rows, c->prefix[i], 0, s->tables[i]};
        s->seqs[i] = (struct pp_attn_seq){row, c->fresh[i], c->prefix[i], s->tables[i]};
        pre_rows += c->prefix[i];
        row += c->fresh[i];
    }
    s->n_rows = row;

    /* the prefix goes in as one batch, then this batch's keys, as the executor does */
    size_t rb = (size_t)s->kv_dim * sizeof(float);
    kpre = malloc(rb * (size_t)(pre_rows + 1));
    vpre = malloc(rb * (size_t)(pre_rows + 1));
    knew = malloc(rb * (size_t)(row + 1));
    vnew = malloc(rb * (size_t)(row + 1));
    for (int32_t i = 0; i < c->n_seqs; i++) {
        memcpy(kpre + (size_t)pre[i].row * s->kv_dim, s->k[i], rb * (size_t)c->prefix[i]);
        memcpy(vpre + (size_t)pre[i].row * s->kv_dim, s->v[i], rb * (size_t)c->prefix[i]);
        memcpy(knew + (size_t)s->seqs[i].row * s->kv_dim,
               s->k[i] + (size_t)c->prefix[i] * s->kv_dim, rb * (size_t)c->fresh[i]);
        memcpy(vnew + (size_t)s->seqs[i].row * s->kv_dim,
               s->v[i] + (size_t)c->prefix[i] * s->kv_dim, rb * (size_t)c->fresh[i]);
    }
    be->ops->kv_store(be, &s->view, KV_LAYER, pre, c->n_seqs, kpre, vpre);
    be->ops->kv_store(be, &s->view, KV_LAYER, s->seqs, c->n_seqs, knew, vnew);
    free(kpre);
    free(vpre);
    free(knew);
    free(vnew);

    s->q = rand_floats(seed, (int64_t)s->n_rows * s->q_dim, -1.0f, 1.0f);
    s->shape = (struct pp_attn_shape){c->n_heads, c->n_kv_heads, c->head_dim, c->window,
                                      1.0f / sqrtf((float)c->head_dim)};
}

static void attn_setup_free(struct attn_setup *s)
{
    for (int32_t i = 0; i < s->c.n_seqs; i++) {
        free(s->k[i]);
        free(s->v[i]);
    }
    free(s->q);
    free(s->pool);
}

/* Every stored key and value sits where the view's formula says, and nothing else was written. */
static void check_kv_placement(const struct attn_setup *s)
{
    int64_t written = 0;
    for (int32_t i = 0; i < s->c.n_seqs; i++)
        for (int32_t p = 0; p < s->c.prefix[i] + s->c.fresh[i]; p++) {
            assert_memory_equal(kv_slot(s, i, p, 0), s->k[i] + (int64_t)p * s->kv_dim,
                                (size_t)s->kv_dim * sizeof(float));
            assert_memory_equal(kv_slot(s, i, p, 1), s->v[i] + (int64_t)p * s->kv_dim,
                                (size_t)s->kv_dim * sizeof(float));
            written += 2 * s->kv_dim;
        }
    int64_t finite = 0;
    for (int64_t i = 0; i < (int64_t)KV_BLOCKS * KV_LAYERS * 2 * s->view.block_elems; i++)
        finite += !isnan(s->pool[i]);
    assert_int_equal(finite, written);
}

/* Causal (optionally windowed) attention of one query row, in double, from the plain K/V arrays. */
static void attention_ref(const struct attn_setup *s, int32_t seq, int32_t t, double *out)
{
    const struct attn_case *c = &s->c;
    int32_t p = c->prefix[seq] + t, hd = c->head_dim;
    int32_t first = c->window > 0 && p - c->window + 1 > 0 ? p - c->window + 1 : 0;
    const float *q = s->q + (int64_t)(s->seqs[seq].row + t) * s->q_dim;
    double sc[MAX_CONTEXT];
    for (int32_t h = 0; h < c->n_heads; h++) {
        int32_t kvh = h / (c->n_heads / c->n_kv_heads);
        double max = -INFINITY, sum = 0.0;
        for (int32_t i = first; i <= p; i++) {
            const float *k = s->k[seq] + (int64_t)i * s->kv_dim + (int64_t)kvh * hd;
            double d = 0.0;
            for (int32_t e = 0; e < hd; e++)
                d += (double)q[h * hd + e] * k[e];
            sc[i] = d / sqrt((double)hd);
            if (sc[i] > max)
                max = sc[i];
        }
        for (int32_t i = first; i <= p; i++) {
            sc[i] = exp(sc[i] - max);
            sum += sc[i];
        }
        for (int32_t e = 0; e < hd; e++) {
            double o = 0.0;
            for (int32_t i = first; i <= p; i++)
                o += sc[i] * s->v[seq][(int64_t)i * s->kv_dim + (int64_t)kvh * hd + e];
            out[h * hd + e] = o / sum;
        }
    }
}

/* The positions of one attention chunk: chunks start every 256 positions
 * (kernels/cpu/attention.c). */
#define ATTN_REF_CHUNK 256

/* One query row in float, in the order kernels/cpu/attention.c documents for each query alone:
 * per chunk, scores by pp__dot, scaled, their max, pp__expf of the shifted scores, their sum in
 * position order and the values' weighted sum by fmaf in position order; the chunks merged in
 * order. Its bits are the backend's, however many query heads share a pass over the keys. */
static void attention_canonical(const struct attn_setup *s, int32_t seq, int32_t t, float *out)
{
    const struct attn_case *c = &s->c;
    int32_t p = c->prefix[seq] + t, hd = c->head_dim;
    int32_t first = c->window > 0 && p - c->window + 1 > 0 ? p - c->window + 1 : 0;
    const float *q = s->q + (int64_t)(s->seqs[seq].row + t) * s->q_dim;
    float sc[ATTN_REF_CHUNK], o[64];
    assert_true(hd <= 64);
    for (int32_t h = 0; h < c->n_heads; h++) {
        int32_t kvh = h / (c->n_heads / c->n_kv_heads);
        float M = 0.0f, L = 0.0f, *O = out + h * hd;
        for (int32_t ch = first / ATTN_REF_CHUNK; ch <= p / ATTN_REF_CHUNK; ch++) {
            int32_t c0 = ch * ATTN_REF_CHUNK > first ? ch * ATTN_REF_CHUNK : first;
            int32_t c1 = (ch + 1) * ATTN_REF_CHUNK - 1 < p ? (ch + 1) * ATTN_REF_CHUNK - 1 : p;
            float max = -INFINITY, sum = 0.0f;
            for (int32_t i = c0; i <= c1; i++) {
                const float *k = s->k[seq] + (int64_t)i * s->kv_dim + (int64_t)kvh * hd;
                float x = pp__dot(q + h * hd, k, hd) * s->shape.scale;
                sc[i - c0] = x;
                if (x > max)
                    max = x;
            }
            for (int32_t i = c0; i <= c1; i++) {
                sc[i - c0] = pp__expf(sc[i - c0] - max);
                sum += sc[i - c0];
            }
            float *acc = ch == first / ATTN_REF_CHUNK ? O : o;
            memset(acc, 0, (size_t)hd * sizeof(float));
            for (int32_t i = c0; i <= c1; i++)
                for (int32_t e = 0; e < hd; e++)
                    acc[e] = fmaf(sc[i - c0],
                                  s->v[seq][(int64_t)i * s->kv_dim + (int64_t)kvh * hd + e],
                                  acc[e]);
            if (acc == O) {
                M = max;
                L = sum;
                continue;
            }
            float nm = fmaxf(M, max);
            float a = pp__expf(M - nm), b = pp__expf(max - nm);
            L = L * a + sum * b;
            for (int32_t e = 0; e < hd; e++)
                O[e] = O[e] * a + o[e] * b;
            M = nm;
        }
        float inv = 1.0f / L;
        for (int32_t e = 0; e < hd; e++)
            O[e] = O[e] * inv;
    }
}

static void check_attention_case(const struct attn_case *c, uint64_t seed)
{
    struct pp_backend *be[N_BE];
    backends_new(be);
    struct attn_setup s;
    attn_setup_init(&s, c, be[0], &seed);
    check_kv_placement(&s);

    size_t out_bytes = (size_t)s.n_rows * (size_t)s.q_dim * sizeof(float);
    float *out[N_BE];
    for (int b = 0; b < N_BE; b++) {
        out[b] = malloc(out_bytes);
        be[b]->ops->attention(be[b], out[b], s.q, &s.view, KV_LAYER, s.seqs, c->n_seqs, &s.shape);
    }
    double ref[512];
    assert_true(s.q_dim <= 512);
    for (int32_t i = 0; i < c->n_seqs; i++)
        for (int32_t t = 0; t < c->fresh[i]; t++) {
            attention_ref(&s, i, t, ref);
            const float *o = out[0] + (int64_t)(s.seqs[i].row + t) * s.q_dim;
            for (int32_t e = 0; e < s.q_dim; e++)
                if (!(fabs(o[e] - ref[e]) <= 1e-5))
                    fail_msg("attention heads=%d/%d hd=%d window=%d: seq %d token %d elem %d: "
                             "%.9g vs %.9g", c->n_heads, c->n_kv_heads, c->head_dim, c->window, i,
                             t, e, (double)o[e], ref[e]);
        }
    /* the bits of each query alone, in its canonical order */
    float canon[512];
    for (int32_t i = 0; i < c->n_seqs; i++)
        for (int32_t t = 0; t < c->fresh[i]; t++) {
            attention_canonical(&s, i, t, canon);
            const float *o = out[0] + (int64_t)(s.seqs[i].row + t) * s.q_dim;
            for (int32_t e = 0; e < s.q_dim; e++)
                if (memcmp(&o[e], &canon[e], sizeof(float)) != 0)
                    fail_msg("attention heads=%d/%d hd=%d window=%d: seq %d token %d elem %d: "
                             "%a, each query alone %a", c->n_heads, c->n_kv_heads, c->head_dim,
                             c->window, i, t, e, (double)o[e], (double)canon[e]);
        }
    /* the same bits on every thread count */
    for (int b = 1; b < N_BE; b++)
        if (memcmp(out[0], out[b], out_bytes) != 0)
            fail_msg("attention: %d threads differ from 1 thread", b + 1);

    /* each sequence computed alone, as the first rows of its own batch, gives the same bits as
     * inside the mixed batch */
    for (int32_t i = 0; i < c->n_seqs; i++) {
        if (c->fresh[i] == 0)
            continue;
        struct pp_attn_seq alone = s.seqs[i];
        alone.row = 0;
        size_t bytes = (size_t)c->fresh[i] * (size_t)s.q_dim * sizeof(float);
        float *q1 = malloc(bytes), *o1 = malloc(bytes);
        memcpy(q1, s.q + (int64_t)s.seqs[i].row * s.q_dim, bytes);
        struct pp_backend *b1 = be[i % N_BE];
        b1->ops->attention(b1, o1, q1, &s.view, KV_LAYER, &alone, 1, &s.shape);
        if (memcmp(o1, out[0] + (int64_t)s.seqs[i].row * s.q_dim, bytes) != 0)
            fail_msg("attention: sequence %d alone differs from inside the batch", i);
        free(q1);
        free(o1);
    }
    for (int b = 0; b < N_BE; b++)
        free(out[b]);
    attn_setup_free(&s);
    backends_free(be);
}

/* Prefill, decode and chunked prefill mixed in one batch, with multi-head attention. */
static void test_attention_mixed_batch(void **state)
{
    (void)state;
    const struct attn_case c = {4, 4, 12, 0, 4, {0, 9, 6, 21}, {5, 1, 3, 1}};
    check_attention_case(&c, 61);
}

/* Grouped-query attention: 3, 8 and 12 query heads share a KV head; and multi-query (one KV
 * head). */
static void test_attention_gqa(void **state)
{
    (void)state;
    const struct attn_case gqa = {6, 2, 20, 0, 3, {13, 0, 30}, {1, 7, 2}};
    check_attention_case(&gqa, 62);
    const struct attn_case mqa = {4, 1, 8, 0, 2, {5, 17}, {3, 1}};
    check_attention_case(&mqa, 63);
    /* eight query heads per KV head, one pass of keys for all (tinyllama's ratio), and twelve,
     * passed as eight and four; past a chunk boundary */
    const struct attn_case g8 = {16, 2, 16, 0, 3, {250, 0, 3}, {9, 5, 1}};
    check_attention_case(&g8, 66);
    const struct attn_case g12 = {12, 1, 24, 0, 2, {260, 7}, {2, 3}};
    check_attention_case(&g12, 67);
    /* prompts in tiles of eight rows (kernels/cpu/attention.c): a tile across a chunk boundary,
     * whose first rows stop before the next chunk, and a tile shared by two sequences */
    const struct attn_case tiles = {8, 2, 16, 0, 2, {250, 0}, {12, 17}};
    check_attention_case(&tiles, 68);
    const struct attn_case tiles12 = {12, 1, 24, 0, 3, {505, 0, 3}, {19, 3, 10}};
    check_attention_case(&tiles12, 69);
}

/* A sliding window: a query at p sees only keys at positions > p - window, including across a
 * batch whose own tokens start inside and outside the window. */
static void test_attention_sliding_window(void **state)
{
    (void)state;
    const struct attn_case w3 = {4, 2, 10, 3, 3, {0, 12, 2}, {6, 1, 4}};
    check_attention_case(&w3, 64);
    const struct attn_case w5 = {2, 1, 16, 5, 2, {25, 0}, {2, 9}};
    check_attention_case(&w5, 65);
}

/* Long contexts: a query's positions are cut into 256-position chunks whose partial softmaxes merge
 * in order; with few queries the chunks are spread over the threads (split mode, 2+ threads) and
 * the result must keep the bits of one thread doing them all. With and without a sliding window
 * that straddles a chunk boundary; multi-head decode and a small prefill batch. */
static void test_attention_long_context(void **state)
{
    (void)state;
    const struct attn_case decode = {2, 1, 16, 0, 1, {600}, {1}};
    check_attention_case(&decode, 67);
    const struct attn_case window = {2, 1, 8, 300, 1, {550}, {1}};
    check_attention_case(&window, 68);
    const struct attn_case batch = {4, 2, 12, 0, 2, {500, 255}, {3, 2}};
    check_attention_case(&batch, 69);
    /* 19 tiles, enough for every thread count to take tiles (4 per thread) rather than chunks:
     * prompts across a chunk boundary, a decode row, tiles of several sequences in one batch; each
     * sequence alone then runs in split mode */
    const struct attn_case many = {8, 2, 16, 0, 4, {250, 0, 300, 3}, {40, 33, 1, 57}};
    check_attention_case(&many, 70);
}

/* A window wider than the context changes nothing, bit for bit. */
static void test_attention_wide_window_is_full(void **state)
{
    (void)state;
    struct pp_backend *be[N_BE];
    backends_new(be);
    uint64_t seed = 66;
    const struct attn_case c = {4, 2, 12, 100, 2, {7, 3}, {2, 4}};
    struct attn_setup s;
    attn_setup_init(&s, &c, be[0], &seed);
    size_t bytes = (size_t)s.n_rows * (size_t)s.q_dim * sizeof(float);
    float *a = malloc(bytes), *b = malloc(bytes);
    be[1]->ops->attention(be[1], a, s.q, &s.view, KV_LAYER, s.seqs, c.n_seqs, &s.shape);
    s.shape.sliding_window = 0;
    be[1]->ops->attention(be[1], b, s.q, &s.view, KV_LAYER, s.seqs, c.n_seqs, &s.shape);
    assert_memory_equal(a, b, bytes);
    free(a);
    free(b);
    attn_setup_free(&s);
    backends_free(be);
}

/* --- rows, gated add, routing, top-k, memory
 * ---------------------------------------------------------- */

static void test_rows_and_gated_add(void **state)
{
    (void)state;
    struct pp_backend *be[N_BE];
    backends_new(be);
    uint64_t seed = 61;
    enum { SRC = 9, COLS = 13, N = 11 };
    float *src = rand_floats(&seed, SRC * COLS, -1, 1), *y = rand_floats(&seed, N * COLS, -1, 1);
    float *w = rand_floats(&seed, N, -2, 2), *g = rand_floats(&seed, N, -6, 6);
    int32_t rows[N] = {3, 0, 8, 3, 3, 1, 7, 2, 8, 5, 0}; /* repeats: added in list order */
    float got[N * COLS], acc[SRC * COLS], ref[SRC * COLS];
    be[0]->ops->gather_rows(be[0], got, src, rows, N, COLS);
    for (int r = 0; r < N; r++)
        assert_memory_equal(got + r * COLS, src + rows[r] * COLS, COLS * sizeof(float));
    memcpy(acc, src, sizeof(acc));
    memcpy(ref, src, sizeof(ref));
    be[1]->ops->scatter_add_rows(be[1], acc, y, rows, w, N, COLS);
    for (int r = 0; r < N; r++)
        for (int c = 0; c < COLS; c++)
            ref[rows[r] * COLS + c] += w[r] * y[r * COLS + c];
    assert_memory_equal(acc, ref, sizeof(acc));
    /* y[r] += sigmoid(g[r]) * x[r], one rounding for the product and one for the sum */
    float *x = rand_floats(&seed, N * COLS, -1, 1);
    memcpy(got, y, sizeof(got));
    be[2]->ops->add_gated(be[2], got, x, g, N, COLS);
    for (int r = 0; r < N; r++) {
        float sig = 1.0f / (1.0f + expf(-g[r]));
        for (int c = 0; c < COLS; c++)
            assert_true(got[r * COLS + c] == y[r * COLS + c] + sig * x[r * COLS + c]);
    }
    free(x);
    free(src);
    free(y);
    free(w);
    free(g);
    backends_free(be);
}

/* Reference routing: probabilities in double, then the k best by (value desc, id asc). */
static void route_ref(const float *lg, int n, int k, enum pp_route_mode mode, int renorm,
                      int32_t *pick, double *weight)
{
    int32_t order[64];
    double p[64];
    for (int i = 0; i < n; i++) {
        order[i] = i;
        p[i] = lg[i];
    }
    if (mode == PP_ROUTE_SOFTMAX_TOPK) {
        double m = p[0], sum = 0;
        for (int i = 1; i < n; i++)
            m = p[i] > m ? p[i] : m;
        for (int i = 0; i < n; i++)
            sum += (p[i] = exp(p[i] - m));
        for (int i = 0; i < n; i++)
            p[i] /= sum;
    }
    for (int a = 1; a < n; a++) /* stable insertion sort: ties keep the lower id first */
        for (int b = a; b > 0 && p[order[b]] > p[order[b - 1]]; b--) {
            int32_t t = order[b];
            order[b] = order[b - 1];
            order[b - 1] = t;
        }
    double sum = 0, m = p[order[0]], w[64];
    for (int j = 0; j < k; j++)
        sum += mode == PP_ROUTE_TOPK_SOFTMAX ? exp(p[order[j]] - m) : p[order[j]];
    for (int i = 0; i < n; i++)
        w[i] = -1; /* not picked */
    for (int j = 0; j < k; j++) {
        double v = mode == PP_ROUTE_TOPK_SOFTMAX ? exp(p[order[j]] - m) / sum : p[order[j]];
        w[order[j]] = mode == PP_ROUTE_SOFTMAX_TOPK && renorm ? v / sum : v;
    }
    int j = 0; /* the picked experts by increasing id */
    for (int i = 0; i < n; i++)
        if (w[i] >= 0) {
            pick[j] = i;
            weight[j++] = w[i];
        }
}

static void test_moe_route(void **state)
{
    (void)state;
    struct pp_backend *be[N_BE];
    backends_new(be);
    uint64_t seed = 71;
    enum { T = 40, NE = 60, K = 4 };
    for (int mode = 0; mode < 2; mode++)
        for (int renorm = 0; renorm < 2; renorm++) {
            float *lg = rand_floats(&seed, T * NE, -4, 4), *orig = malloc(sizeof(float) * T * NE);
            memcpy(orig, lg, sizeof(float) * T * NE);
            lg[5] = lg[6]; /* a tie: the lower id wins */
            orig[5] = orig[6];
            int32_t pick[T * K];
            float w[T * K];
            be[mode + renorm]->ops->moe_route(be[mode + renorm], pick, w, lg, T, NE, K,
                                               (enum pp_route_mode)mode, renorm);
            for (int t = 0; t < T; t++) {
                int32_t rp[K];
                double rw[K];
                route_ref(orig + t * NE, NE, K, (enum pp_route_mode)mode, renorm, rp, rw);
                assert_memory_equal(pick + t * K, rp, sizeof(rp));
                for (int j = 0; j < K; j++)
                    if (fabs(w[t * K + j] - rw[j]) > 1e-6 * fabs(rw[j]) + 1e-7)
                        fail_msg("route mode %d renorm %d token %d: weight %d is %.9g, want %.9g",
                                 mode, renorm, t, j, (double)w[t * K + j], rw[j]);
            }
            free(lg);
            free(orig);
        }
    backends_free(be);
}

static void test_topk(void **state)
{
    (void)state;
    struct pp_backend *be[N_BE];
    backends_new(be);
    uint64_t seed = 81;
    enum { N = 3, V = 500 };
    float *x = rand_floats(&seed, N * V, -3, 3);
    for (int i = 0; i < N * V; i++)
        x[i] = floorf(x[i] * 2) / 2; /* coarse values: many ties */
    x[7] = NAN;
    x[V + 3] = INFINITY;
    const int32_t ks[] = {1, 7, V};
    for (int ki = 0; ki < 3; ki++) {
        int32_t k = ks[ki], *ids = malloc(sizeof(int32_t) * N * k);
        float *vals = malloc(sizeof(float) * N * k);
        assert_int_equal(be[0]->ops->topk(be[0], ids, vals, x, N, V, k), PP_OK);
        for (int r = 0; r < N; r++) {
            const float *row = x + r * V;
            for (int j = 0; j < k; j++) {
                int32_t id = ids[r * k + j];
                assert_true(id >= 0 && id < V);
                assert_memory_equal(&vals[r * k + j], &row[id], sizeof(float));
                /* exactly j elements rank before it: (value desc, id asc), NaN last */
                int before = 0;
                float kv = isnan(row[id]) ? -INFINITY : row[id];
                for (int i = 0; i < V; i++) {
                    float ki2 = isnan(row[i]) ? -INFINITY : row[i];
                    before += ki2 > kv || (ki2 == kv && i < id);
                }
                assert_int_equal(before, j);
            }
        }
        free(ids);
        free(vals);
    }
    int32_t id;
    float v;
    assert_int_equal(be[0]->ops->topk(be[0], &id, &v, x, 1, V, 0), PP_ERR_INVALID_ARG);
    assert_int_equal(be[0]->ops->topk(be[0], &id, &v, x, 1, V, V + 1), PP_ERR_INVALID_ARG);
    assert_non_null(strstr(pp_error_detail(), "expected 1 <= k <= vocab (500), got 501"));
    free(x);
    backends_free(be);
}

/* Backend memory of the CPU is host memory: buffers and copies are the plain thing; weights are
 * copied into huge-page memory unless resident or mapped. */
static void test_memory_ops(void **state)
{
    (void)state;
    struct pp_backend *be;
    assert_int_equal(pp_backend_cpu_new(1, &be), PP_OK);
    assert_true(be->host_memory);
    assert_int_equal(be->device, -1);
    int64_t kv0 = pp_mem_live(PP_MEM_KV);
    float *p = NULL;
    assert_int_equal(be->ops->buf_alloc(be, PP_MEM_KV, 100 * sizeof(float), (void **)&p), PP_OK);
    assert_int_equal((uintptr_t)p % 64, 0);
    assert_true(pp_mem_live(PP_MEM_KV) >= kv0 + 400);
    float src[100], back[100];
    for (int i = 0; i < 100; i++)
        src[i] = (float)i;
    be->ops->copy_in(be, p, src, sizeof(src));
    be->ops->copy(be, p + 50, p, 50 * sizeof(float));
    be->ops->zero(be, p, 10 * sizeof(float));
    assert_int_equal(be->ops->copy_out(be, back, p, sizeof(back)), PP_OK);
    for (int i = 0; i < 100; i++)
        assert_true(back[i] == (i < 10 ? 0.0f : i < 50 ? (float)i : (float)(i - 50)));
    assert_int_equal(be->ops->sync(be), PP_OK);
    be->ops->buf_free(be, PP_MEM_KV, p);
    assert_int_equal(pp_mem_live(PP_MEM_KV), kv0);
    /* weights are copied into huge-page memory counted as weights, in row groups of 3 (rows 0-2
     * side by side 8 values at a time, then their 2-value tails; row 9 alone), and freed */
    struct pp_weight w = {src, PP_DTYPE_F32, 10, 10}, out;
    int64_t w0 = pp_mem_live(PP_MEM_WEIGHTS);
    assert_int_equal(be->ops->weight_load(be, &w, 0, &out), PP_OK);
    assert_true(out.data != src);
    assert_int_equal(out.dtype, PP_DTYPE_F32);
    assert_int_equal(out.rows, 10);
    assert_int_equal(out.cols, 10);
    assert_int_equal(out.layout, PP_WEIGHT_ROW_GROUPS);
    const float *lf = out.data;
    for (int i = 0; i < 8; i++) {
        assert_true(lf[i] == src[i] && lf[8 + i] == src[10 + i] && lf[16 + i] == src[20 + i]);
        assert_true(lf[90 + i] == src[90 + i]);
    }
    assert_true(lf[24] == src[8] && lf[25] == src[9] && lf[26] == src[18] && lf[29] == src[29]);
    assert_true(lf[30] == src[30] && lf[38] == src[40]); /* the next group */
    assert_int_equal(pp_mem_live(PP_MEM_WEIGHTS), w0 + (int64_t)sizeof(src));
    /* a weight already in row groups is refused, with what was expected */
    struct pp_weight again;
    assert_int_equal(be->ops->weight_load(be, &out, 0, &again), PP_ERR_INVALID_ARG);
    assert_non_null(strstr(pp_error_detail(), "expected a row-major weight"));
    be->ops->weight_free(be, &out);
    assert_int_equal(pp_mem_live(PP_MEM_WEIGHTS), w0);
    /* resident weights, and every weight once the backend maps them, are used in place, rows as
     * they are */
    assert_int_equal(be->ops->weight_load(be, &w, 1, &out), PP_OK);
    assert_ptr_equal(out.data, src);
    assert_int_equal(out.layout, PP_WEIGHT_ROWS);
    pp_backend_cpu_map_weights(be, 1);
    assert_int_equal(be->ops->weight_load(be, &w, 0, &out), PP_OK);
    assert_ptr_equal(out.data, src);
    assert_int_equal(out.layout, PP_WEIGHT_ROWS);
    assert_int_equal(pp_mem_live(PP_MEM_WEIGHTS), w0);
    pp_backend_cpu_map_weights(be, 0);
    /* no memory for the copy: an error that names the weight and the way out */
    pp_alloc_fail_at(1);
    assert_int_equal(be->ops->weight_load(be, &w, 0, &out), PP_ERR_NOMEM);
    pp_alloc_fail_at(0);
    assert_non_null(
        strstr(pp_error_detail(), "no memory to copy a [10, 10] f32 weight (400 bytes)"));
    assert_non_null(strstr(pp_error_detail(), "cpu_weights = \"map\""));
    assert_int_equal(pp_mem_live(PP_MEM_WEIGHTS), w0);
    const float *v = NULL;
    assert_int_equal(be->ops->vec_load(be, src, 100, 0, &v), PP_OK);
    assert_ptr_equal(v, src);
    pp_alloc_fail_at(1);
    assert_int_equal(be->ops->buf_alloc(be, PP_MEM_ACTIVATIONS, 64, (void **)&p), PP_ERR_NOMEM);
    pp_alloc_fail_at(0);
    assert_null(p);
    assert_non_null(strstr(pp_error_detail(), "no memory for 64 bytes"));
    be->ops->free(be);
}

/* Kilobytes of this process's memory resident in the mapping that starts at p (its Rss line in
 * /proc/self/smaps), or -1 when there is none. */
static long mapping_rss_kb(const void *p)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f)
        return -1;
    char line[512];
    int in = 0;
    long kb = -1;
    while (kb < 0 && fgets(line, sizeof(line), f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2) /* a mapping's first line */
            in = lo == (uintptr_t)p;
        else if (in && strncmp(line, "Rss:", 4) == 0)
            kb = strtol(line + 4, NULL, 10);
    }
    fclose(f);
    return kb;
}

/* A copy bigger than one of the load's 2 MiB ranges, packed by three threads, holds the bytes one
 * pass of pp__row_groups_pack writes, in every dtype, with rows not a multiple of the groups and
 * cols not of the units. */
static void test_weight_load_in_parallel(void **state)
{
    (void)state;
    struct pp_backend *be;
    assert_int_equal(pp_backend_cpu_new(3, &be), PP_OK);
    const enum pp_dtype dts[] = {PP_DTYPE_F32, PP_DTYPE_F16, PP_DTYPE_BF16, PP_DTYPE_Q8_0};
    unsigned seed = 31;
    for (int d = 0; d < 4; d++) {
        int64_t rows = 4001, cols = dts[d] == PP_DTYPE_Q8_0 ? 1024 : 1021;
        size_t bytes = (size_t)(rows * pp_dtype_row_bytes(dts[d], cols));
        assert_true(bytes > ((size_t)4 << 20));
        unsigned char *src = malloc(bytes), *want = malloc(bytes);
        for (size_t i = 0; i < bytes; i++)
            src[i] = (unsigned char)(rand_r(&seed) & 0x3f); /* finite in every dtype */
        pp__row_groups_pack(want, src, dts[d], rows, cols);
        struct pp_weight w = {src, dts[d], rows, cols}, out;
        assert_int_equal(be->ops->weight_load(be, &w, 0, &out), PP_OK);
        assert_int_equal(out.layout, PP_WEIGHT_ROW_GROUPS);
        assert_memory_equal(out.data, want, bytes);
        be->ops->weight_free(be, &out);
        free(src);
        free(want);
    }
    be->ops->free(be);
}

/* A mapped weight's pages of the file are in this process once the backend has loaded it (so a
 * first forward pass takes no page faults), and the weight is still used in place. */
static void test_mapped_weight_is_populated(void **state)
{
    (void)state;
    char path[] = "/tmp/pp_test_populate_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    unlink(path);
    enum { ROWS = 512, COLS = 1024 }; /* 2 MiB of f32 */
    float *row = malloc(sizeof(float) * COLS);
    for (int i = 0; i < COLS; i++)
        row[i] = (float)i;
    for (int r = 0; r < ROWS; r++)
        assert_int_equal(write(fd, row, sizeof(float) * COLS), (ssize_t)(sizeof(float) * COLS));
    free(row);
    size_t bytes = sizeof(float) * ROWS * COLS;
    void *map = mmap(NULL, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    assert_true(map != MAP_FAILED);
    close(fd);
    assert_int_equal(mapping_rss_kb(map), 0); /* nothing touched yet */
    struct pp_backend *be;
    assert_int_equal(pp_backend_cpu_new(1, &be), PP_OK);
    struct pp_weight w = {map, PP_DTYPE_F32, ROWS, COLS}, out;
    pp_backend_cpu_map_weights(be, 1);
    assert_int_equal(be->ops->weight_load(be, &w, 0, &out), PP_OK);
    assert_ptr_equal(out.data, map);
    long kb = mapping_rss_kb(map);
    be->ops->free(be);
#ifdef MADV_POPULATE_READ
    /* a kernel before 5.14 refuses MADV_POPULATE_READ (EINVAL): the pages come on first use */
    int refused = madvise(map, 4096, MADV_POPULATE_READ) != 0 && errno == EINVAL;
    munmap(map, bytes);
    if (refused)
        skip();
    assert_int_equal(kb, (long)(bytes >> 10));
#else
    munmap(map, bytes);
    (void)kb;
#endif
}

/* --- construction
 * --------------------------------------------------------------------------------- */

static void test_new_and_reserve_errors(void **state)
{
    (void)state;
    struct pp_backend *be = NULL;
    assert_int_equal(pp_backend_cpu_new(0, &be), PP_ERR_INVALID_ARG);
    /* an unknown PP_SIMD is refused by name, leaking nothing */
    int64_t misc0 = pp_mem_live(PP_MEM_MISC);
    setenv("PP_SIMD", "avx9", 1);
    pp_error_clear();
    assert_int_equal(pp_backend_cpu_new(2, &be), PP_ERR_INVALID_ARG);
    assert_non_null(strstr(pp_error_detail(), "expected portable, avx2 or avx512, got \"avx9\""));
    assert_int_equal(pp_mem_live(PP_MEM_MISC), misc0);
    unsetenv("PP_SIMD");
    /* and so is an unknown PP_PREFETCH; l1 and l2 pick the few-token nest's prefetch level */
    setenv("PP_PREFETCH", "l3", 1);
    pp_error_clear();
    assert_int_equal(pp_backend_cpu_new(2, &be), PP_ERR_INVALID_ARG);
    assert_non_null(strstr(pp_error_detail(), "PP_PREFETCH: expected l1 or l2, got \"l3\""));
    assert_int_equal(pp_mem_live(PP_MEM_MISC), misc0);
    /* ... and nothing else: whether Q8_0 may take the pair tiles is the CPU's alone */
    int pairs = pp_simd_q8_pairs_here();
    setenv("PP_PREFETCH", "l2", 1);
    assert_int_equal(pp_simd_prefetch_l2(), 1);
    assert_int_equal(pp_simd_q8_pairs_here(), pairs);
    setenv("PP_PREFETCH", "l1", 1);
    assert_int_equal(pp_simd_prefetch_l2(), 0);
    assert_int_equal(pp_simd_q8_pairs_here(), pairs);
    assert_int_equal(pp_backend_cpu_new(2, &be), PP_OK);
    be->ops->free(be);
    be = NULL;
    unsetenv("PP_PREFETCH");

    int64_t misc = pp_mem_live(PP_MEM_MISC), act = pp_mem_live(PP_MEM_ACTIVATIONS);
    /* each allocation of the constructor may fail, leaking nothing */
    int nth;
    for (nth = 1; nth < 50; nth++) {
        pp_alloc_fail_at(nth);
        pp_status st = pp_backend_cpu_new(3, &be);
        pp_alloc_fail_at(0);
        if (st == PP_OK)
            break;
        assert_int_equal(st, PP_ERR_NOMEM);
        assert_int_equal(pp_mem_live(PP_MEM_MISC), misc);
    }
    assert_true(nth > 1 && nth < 50);

    /* reserve reports a failed scratch allocation with its sizes */
    pp_alloc_fail_at(1);
    pp_error_clear();
    assert_int_equal(be->ops->reserve(be, 4096, 1024), PP_ERR_NOMEM);
    assert_non_null(strstr(pp_error_detail(), "scratch"));
    pp_alloc_fail_at(0);
    /* then succeeds, and growing it later keeps the ops working */
    assert_int_equal(be->ops->reserve(be, 16, 16), PP_OK);
    assert_int_equal(be->ops->reserve(be, 64, 16), PP_OK);
    float w[64 * 2], x[64], y[2];
    for (int i = 0; i < 128; i++)
        w[i] = (float)(i % 5) - 2.0f;
    for (int i = 0; i < 64; i++)
        x[i] = 1.0f;
    struct pp_weight pw = {w, PP_DTYPE_F32, 2, 64};
    be->ops->matmul(be, y, x, &pw, 1);
    double r0 = 0, r1 = 0;
    for (int i = 0; i < 64; i++) {
        r0 += w[i];
        r1 += w[64 + i];
    }
    assert_true(y[0] == (float)r0 && y[1] == (float)r1); /* small integers: exact */
    be->ops->free(be);
    assert_int_equal(pp_mem_live(PP_MEM_MISC), misc);
    assert_int_equal(pp_mem_live(PP_MEM_ACTIVATIONS), act);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul_f32),
        cmocka_unit_test(test_matmul_f16),
        cmocka_unit_test(test_matmul_bf16),
        cmocka_unit_test(test_matmul_q8_0),
        cmocka_unit_test(test_matmul_batch_invariant),
        cmocka_unit_test(test_matmul_small_batches),
        cmocka_unit_test(test_matmul_simd_matches_portable),
        cmocka_unit_test(test_matmul_many),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_rope_layouts),
        cmocka_unit_test(test_rope_layouts_differ),
        cmocka_unit_test(test_swiglu_add_bias),
        cmocka_unit_test(test_embed),
        cmocka_unit_test(test_attention_mixed_batch),
        cmocka_unit_test(test_attention_gqa),
        cmocka_unit_test(test_attention_sliding_window),
        cmocka_unit_test(test_attention_wide_window_is_full),
        cmocka_unit_test(test_attention_long_context),
        cmocka_unit_test(test_rows_and_gated_add),
        cmocka_unit_test(test_moe_route),
        cmocka_unit_test(test_topk),
        cmocka_unit_test(test_memory_ops),
        cmocka_unit_test(test_weight_load_in_parallel),
        cmocka_unit_test(test_mapped_weight_is_populated),
        cmocka_unit_test(test_new_and_reserve_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
