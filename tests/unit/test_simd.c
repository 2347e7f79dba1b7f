/* The vector inner loops give exactly the portable loops' bits (the canonical pp__dot order), on
 * ragged sizes, on both matmul loop nests (few tokens read weights directly, many tokens go through
 * packed panels and chunked partial sums), and for every weight dtype; once for each vector table
 * the CPU can run (AVX2, AVX-512). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu-impl.h"
#include "kernels/cpu/matmul_q8.h"
#include "kernels/cpu/row_groups.h"
#include "kernels/cpu/simd.h"
#include "testutil.h"

static float frand(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

static void test_dot_matches(void **state)
{
    (void)state;
    const struct pp_simd *fast = pp_simd_get(), *port = pp_simd_portable();
    unsigned seed = 7;
    for (int64_t n = 1; n <= 300; n += 3) {
        float *a = malloc(sizeof(float) * (size_t)n), *b = malloc(sizeof(float) * (size_t)n);
        for (int64_t i = 0; i < n; i++) {
            a[i] = frand(&seed);
            b[i] = frand(&seed) * 100.0f;
        }
        float d1 = fast->dot(a, b, n), d2 = port->dot(a, b, n), d3 = pp__dot(a, b, n);
        assert_memory_equal(&d1, &d2, sizeof(float));
        assert_memory_equal(&d1, &d3, sizeof(float));
        free(a);
        free(b);
    }
}

/* dots and wsum of g queries over rows scattered in memory give pp__dot's and fmaf's bits in both
 * tables, for query counts around the pair and four-query tiles and past the attention block of
 * eight, row counts around the four- and eight-row tiles and up to a whole chunk (the zmm tiles
 * take the rows in passes), and lengths around the 8-, 16- and 64-element blocks and past the 256
 * of the zmm tiles. */
static void test_dots_wsum_match(void **state)
{
    (void)state;
    const struct pp_simd *fast = pp_simd_get(), *port = pp_simd_portable();
    unsigned seed = 21;
    const int64_t lens[] = {1, 7, 8, 13, 16, 24, 64, 72, 128, 131, 264};
    const int64_t groups[] = {1, 2, 3, 4, 5, 8, 9};
    const int64_t row_counts[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 19, 23, 65, 130, 256};
    enum { MAX_M = 256, MAX_G = 9, LDO = 263 };
    for (size_t gi = 0; gi < sizeof(groups) / sizeof(groups[0]); gi++)
        for (size_t mi = 0; mi < sizeof(row_counts) / sizeof(row_counts[0]); mi++)
            for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
                int64_t g = groups[gi], m = row_counts[mi], n = lens[li];
                float *a = malloc(sizeof(float) * (size_t)(g * n));
                /* rows 3n apart, odd offset */
                float *pool = malloc(sizeof(float) * (size_t)(n * m * 3));
                const float *rows[MAX_M];
                float w[MAX_G * LDO], d1[MAX_G * LDO], d2[MAX_G * LDO];
                for (int64_t k = 0; k < g * n; k++)
                    a[k] = frand(&seed);
                for (int64_t k = 0; k < n * m * 3; k++)
                    pool[k] = frand(&seed) * 10.0f;
                for (int64_t i = 0; i < m; i++)
                    rows[i] = pool + (m - 1 - i) * 3 * n + 1;
                for (int64_t k = 0; k < MAX_G * LDO; k++)
                    w[k] = frand(&seed);
                fast->dots(d1, LDO, a, g, rows, m, n);
                port->dots(d2, LDO, a, g, rows, m, n);
                for (int64_t q = 0; q < g; q++)
                    for (int64_t i = 0; i < m; i++) {
                        float ref = pp__dot(a + q * n, rows[i], n);
                        if (memcmp(&d1[q * LDO + i], &ref, sizeof(float)) != 0 ||
                            memcmp(&d2[q * LDO + i], &ref, sizeof(float)) != 0)
                            fail_msg("dots g=%lld m=%lld n=%lld: query %lld row %lld: %a, %a, "
                                     "pp__dot %a", (long long)g, (long long)m, (long long)n,
                                     (long long)q, (long long)i, (double)d1[q * LDO + i],
                                     (double)d2[q * LDO + i], (double)ref);
                    }
                size_t ybytes = sizeof(float) * (size_t)(g * n);
                float *y1 = malloc(ybytes), *y2 = malloc(ybytes), *yr = malloc(ybytes);
                for (int64_t k = 0; k < g * n; k++)
                    y1[k] = y2[k] = yr[k] = frand(&seed);
                fast->wsum(y1, w, LDO, g, rows, m, n);
                port->wsum(y2, w, LDO, g, rows, m, n);
                for (int64_t q = 0; q < g; q++)
                    for (int64_t i = 0; i < m; i++)
                        for (int64_t k = 0; k < n; k++)
                            yr[q * n + k] = fmaf(w[q * LDO + i], rows[i][k], yr[q * n + k]);
                if (memcmp(y1, yr, ybytes) != 0 || memcmp(y2, yr, ybytes) != 0)
                    fail_msg("wsum g=%lld m=%lld n=%lld: not fmaf's bits", (long long)g,
                             (long long)m, (long long)n);
                free(a);
                free(pool);
                free(y1);
                free(y2);
                free(yr);
            }
}

/* pp__expf against exp in double over its whole range: within 2 ulp where the result is normal,
 * inf above the overflow point, 0 or a denormal far below, NaN for NaN, exactly 1 at 0. */
static void test_expf_accuracy(void **state)
{
    (void)state;
    double worst = 0.0;
    for (float x = -87.0f; x <= 88.7f; x += 0.000731f) {
        double ref = exp((double)x), got = pp__expf(x);
        double ulp = ldexp(1.0, ilogb(ref) - 23);
        double e = fabs(got - ref) / ulp;
        if (e > worst)
            worst = e;
    }
    if (worst > 2.0)
        fail_msg("pp__expf: %.2f ulp from exp", worst);
    assert_true(isinf(pp__expf(88.73f)) && pp__expf(88.73f) > 0);
    assert_true(isinf(pp__expf(1000.0f)));
    assert_true(pp__expf(-1000.0f) == 0.0f);
    assert_true(pp__expf(-95.0f) > 0.0f && pp__expf(-95.0f) < 1e-38f);
    assert_true(isnan(pp__expf(NAN)));
    assert_true(pp__expf(0.0f) == 1.0f);
    assert_true(pp__expf(-INFINITY) == 0.0f && isinf(pp__expf(INFINITY)));
}

/* swiglu in both tables: the same bits for ordinary and extreme gates (saturated, overflowing
 * exp, denormal results, ±0, ±inf, NaN) and every length around the 8-lane step. */
static void test_swiglu_match(void **state)
{
    (void)state;
    const struct pp_simd *fast = pp_simd_get(), *port = pp_simd_portable();
    unsigned seed = 33;
    const float special[] = {0.0f,   -0.0f,  1e-30f, -1e-30f, 88.0f,   -88.0f,  88.8f,
                             -88.8f, 103.5f, -104.5f, 200.0f, -200.0f, INFINITY, -INFINITY,
                             NAN,    87.3f,  -87.3f,  20.0f,  -20.0f,  1.0f,   -1.0f};
    enum { N = 77 };
    float g[N], u[N], o1[N], o2[N];
    for (int rep = 0; rep < 200; rep++) {
        for (int i = 0; i < N; i++) {
            g[i] = frand(&seed) * (rep % 4 == 0 ? 120.0f : 9.0f);
            u[i] = frand(&seed) * 3.0f;
        }
        for (size_t i = 0; i < sizeof(special) / sizeof(special[0]); i++)
            g[(rep + i * 5) % N] = special[i];
        int64_t n = rep % N + 1;
        fast->swiglu(o1, g, u, n);
        port->swiglu(o2, g, u, n);
        assert_memory_equal(o1, o2, sizeof(float) * (size_t)n);
    }
}

/* exp_shift (attention's softmax numerators) in both tables: pp__expf's bits lane by lane, for
 * every length around the 8-lane step and arguments from 0 down past the underflow. */
static void test_exp_shift_match(void **state)
{
    (void)state;
    const struct pp_simd *fast = pp_simd_get(), *port = pp_simd_portable();
    unsigned seed = 35;
    enum { N = 45 };
    float x[N], a[N], b[N];
    for (int rep = 0; rep < 300; rep++) {
        float shift = frand(&seed) * 20.0f;
        for (int i = 0; i < N; i++)
            x[i] = shift - (frand(&seed) + 1.0f) * (rep % 3 == 0 ? 80.0f : 6.0f);
        x[rep % N] = shift; /* the maximum itself: exp(0) = 1 */
        x[(rep + 7) % N] = -INFINITY;
        if (rep % 5 == 0)
            x[(rep + 13) % N] = NAN;
        int64_t n = rep % N + 1;
        memcpy(a, x, sizeof(x));
        memcpy(b, x, sizeof(x));
        fast->exp_shift(a, shift, n);
        port->exp_shift(b, shift, n);
        assert_memory_equal(a, b, sizeof(float) * (size_t)n);
        for (int64_t i = 0; i < n; i++) {
            float ref = pp__expf(x[i] - shift);
            assert_memory_equal(&a[i], &ref, sizeof(float));
        }
        assert_true(a[rep % N] == 1.0f || rep % N >= n);
    }
}

/* scale_max (attention's scaled scores and their max) in both tables: x[i] * scale's bits and the
 * same max, NaNs passed over (-inf when all are NaN) and a zero max as +0 whichever zeros came
 * first, for every length around the 8- and 16-lane steps. */
static void test_scale_max_match(void **state)
{
    (void)state;
    const struct pp_simd *tabs[2] = {pp_simd_get(), pp_simd_portable()};
    unsigned seed = 37;
    enum { N = 53 };
    float x[N], y[N];
    for (int rep = 0; rep < 400; rep++) {
        int64_t n = rep % N + 1;
        float scale = 0.125f + fabsf(frand(&seed));
        for (int i = 0; i < N; i++)
            x[i] = rep % 4 == 0 ? frand(&seed) * 10.0f : -0.5f - fabsf(frand(&seed)) * 10.0f;
        if (rep % 4 == 1) { /* a zero max: -0 before +0, or +0 only */
            x[(rep / 4) % n] = rep % 8 == 1 ? -0.0f : 0.0f;
            x[(rep / 4 + 3) % n] = 0.0f;
        }
        if (rep % 4 == 2) {
            x[(rep / 4) % n] = NAN;
            x[(rep / 4 + 5) % n] = -INFINITY;
        }
        if (rep % 4 == 3)
            for (int i = 0; i < N; i++)
                x[i] = NAN;
        float want = -INFINITY;
        for (int64_t i = 0; i < n; i++)
            if (x[i] * scale > want)
                want = x[i] * scale;
        for (int t = 0; t < 2; t++) {
            memcpy(y, x, sizeof(x));
            float got = tabs[t]->scale_max(y, scale, n);
            for (int64_t i = 0; i < n; i++) {
                float ref = x[i] * scale;
                assert_memory_equal(&y[i], &ref, sizeof(float));
            }
            if (want == 0.0f)
                assert_true(got == 0.0f && !signbit(got));
            else
                assert_memory_equal(&got, &want, sizeof(float));
        }
    }
}

/* scale_add (attention's merge of a chunk's weighted sums) in both tables: y·a + x·b with each
 * product and the sum rounded, never fused, for every length around the 8- and 16-lane steps, with
 * weights of 0 and 1, infinities, NaNs and subnormals among the operands. */
static void test_scale_add_match(void **state)
{
    (void)state;
    const struct pp_simd *tabs[2] = {pp_simd_get(), pp_simd_portable()};
    unsigned seed = 41;
    enum { N = 53 };
    float x[N], y0[N], y[N];
    for (int rep = 0; rep < 400; rep++) {
        int64_t n = rep % N;
        float a = rep % 5 == 0 ? 1.0f : fabsf(frand(&seed));
        float b = rep % 7 == 0 ? 0.0f : fabsf(frand(&seed));
        for (int i = 0; i < N; i++) {
            x[i] = frand(&seed) * 100.0f;
            y0[i] = frand(&seed) * 100.0f;
        }
        if (rep % 3 == 1 && n > 2) {
            x[rep % n] = rep % 2 ? INFINITY : NAN;
            y0[(rep + 1) % n] = 1e-40f; /* subnormal */
        }
        for (int t = 0; t < 2; t++) {
            memcpy(y, y0, sizeof(y));
            tabs[t]->scale_add(y, a, x, b, n);
            for (int64_t i = 0; i < N; i++) {
                volatile float p = y0[i] * a, q = x[i] * b; /* two roundings, then the sum's */
                float want = i < n ? p + q : y0[i];
                if (want != want)
                    assert_true(y[i] != y[i]);
                else
                    assert_memory_equal(&y[i], &want, sizeof(float));
            }
        }
    }
}

/* Token t's output for one row-major Q8_0 row, as kernels/cpu/matmul_q8.h defines it: per block
 * and lane, the exact int32 sum of four products, then one fmaf with the two scales' product. */
static float q8_reference(const char *wrow, const struct pp_mm_args *a, int64_t t)
{
    int64_t blocks = a->cols / PP_Q8_0_BLOCK;
    const int8_t *xq = a->xq + t * a->cols;
    const float *xd = a->xd + t * blocks;
    float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t b = 0; b < blocks; b++) {
        const char *blk = wrow + b * PP_Q8_0_BYTES;
        uint16_t h;
        memcpy(&h, blk, 2);
        float scale = pp_f16_to_f32(h) * xd[b];
        for (int j = 0; j < 8; j++) {
            int32_t sum = 0;
            for (int e = 0; e < 4; e++)
                sum += (int8_t)blk[2 + 4 * j + e] * xq[b * PP_Q8_0_BLOCK + 4 * j + e];
            lane[j] = fmaf((float)sum, scale, lane[j]);
        }
    }
    return pp__merge8(lane);
}

/* One matmul of the weights w (rows × cols stored as dt) and random activations through both
 * tables: the same bits, and each element equal to pp__dot of the exactly converted weight row
 * (Q8_0: to q8_reference over the activations in int8, which both tables quantize alike); the
 * fast table also from the weights in row groups, as the backend stores them, in chunks of whole
 * groups. */
static void check_weights(enum pp_dtype dt, const char *w, int64_t rows, int64_t cols, int64_t n,
                          int64_t chunk, unsigned *seed)
{
    const struct pp_simd *fast = pp_simd_get(), *port = pp_simd_portable();
    int64_t rb = pp_dtype_row_bytes(dt, cols);
    float *x = malloc(sizeof(float) * (size_t)(n * cols));
    float *y1 = malloc(sizeof(float) * (size_t)(n * rows));
    float *y2 = malloc(sizeof(float) * (size_t)(n * rows));
    float *row = malloc(sizeof(float) * (size_t)cols);
    float *panel = malloc(sizeof(float) * PP_MM_PANEL_ROWS * PP_MM_KC);
    float *acc = malloc(sizeof(float) * PP_MM_ACC_CAP);
    for (int64_t i = 0; i < n * cols; i++)
        x[i] = frand(seed) * 3.0f;
    struct pp_mm_args a = {y1, x, cols, w, dt, rows, cols, n, rb};
    char *split = aligned_alloc(64, (size_t)(pp__q8_split_bytes(cols) + 63) / 64 * 64);
    struct pp_mm_scratch s = {row, panel, acc, split};
    /* Q8_0: the activations in int8, the same bytes from both tables' quantization */
    size_t qbytes = (size_t)pp__q8_act_bytes(n, cols);
    void *qbuf = malloc(qbytes), *qfast = malloc(qbytes);
    if (dt == PP_DTYPE_Q8_0) {
        struct pp_mm_args f = a;
        pp__q8_act_bind(&a, qbuf);
        pp__q8_act_fill(&a, port->q8_act, 0, n);
        pp__q8_act_bind(&f, qfast);
        pp__q8_act_fill(&f, fast->q8_act, 0, n);
        assert_memory_equal(qbuf, qfast, qbytes);
    }
    /* each table's loops for this dtype */
    pp_mm_rows_fn port_rows = dt == PP_DTYPE_Q8_0 ? port->matmul_q8 : port->matmul_rows;
    pp_mm_rows_fn fast_rows = dt == PP_DTYPE_Q8_0 ? fast->matmul_q8 : fast->matmul_rows;
    a.y = y2;
    port_rows(&a, 0, rows, &s);
    a.y = y1;
    char *wg = malloc((size_t)(rows * rb));
    pp__row_groups_pack(wg, w, dt, rows, cols);
    struct pp_mm_args g = {y1, x, cols, wg, dt, rows, cols, n, rb, 1};
    g.xq = a.xq;
    g.xd = a.xd;
    int64_t gchunk = (chunk + PP_ROW_GROUP - 1) / PP_ROW_GROUP * PP_ROW_GROUP;
    /* Q8_0's pair tiles, where the table has them (whatever this CPU's pp_simd_q8_pairs_here
     * says), read the tokens in pairs built once */
    void *pbuf = NULL;
    if (dt == PP_DTYPE_Q8_0 && pp__q8_pairs_wanted(fast->q8_pairs, n)) {
        pbuf = aligned_alloc(64, (size_t)pp__q8_pairs_bytes(n, cols));
        assert_non_null(pbuf);
    }
    /* prefetching into L1 or L2 changes no bit either, with pairs or without */
    for (int cfg = 0; cfg < (pbuf ? 4 : 2); cfg++) {
        int l2 = cfg & 1;
        a.prefetch_l2 = g.prefetch_l2 = l2;
        pp__q8_pairs_bind(&a, cfg < 2 ? pbuf : NULL);
        if (a.xpair)
            pp__q8_pairs_fill(&a, fast->q8_pairs, 0, n);
        g.xpair = a.xpair;
        g.xneg = a.xneg;
        /* row-major and in row groups, in chunks of rows as threads take them (which rows share
         * a call changes no bit), with the AVX2 table's AMD tiles and without (whatever this
         * CPU's pp_simd_amd_tiles says) */
        for (int grouped = 0; grouped < 2; grouped++)
            for (int sq = 0; sq < 2; sq++) {
                struct pp_mm_args *m = grouped ? &g : &a;
                int64_t step = grouped ? gchunk : chunk;
                m->amd_tiles = sq;
                memset(y1, 0, sizeof(float) * (size_t)(n * rows));
                for (int64_t r = 0; r < rows; r += step)
                    fast_rows(m, r, r + step < rows ? r + step : rows, &s);
                if (memcmp(y1, y2, sizeof(float) * (size_t)(n * rows)) != 0)
                    fail_msg("matmul_rows %s [%lld,%lld] n=%lld%s, prefetch L%d%s%s: %s and "
                             "portable differ",
                             pp_dtype_name(dt), (long long)rows, (long long)cols, (long long)n,
                             grouped ? ", row groups" : "", l2 + 1, a.xpair ? ", pairs" : "",
                             sq ? ", AMD tiles" : "", fast->name);
            }
    }
    /* the portable loop reads row groups back row by row (pp__row_groups_row_to_f32) */
    float *y3 = malloc(sizeof(float) * (size_t)(n * rows));
    g.y = y3;
    port_rows(&g, 0, rows, &s);
    if (memcmp(y3, y2, sizeof(float) * (size_t)(n * rows)) != 0)
        fail_msg("matmul_rows %s [%lld,%lld] n=%lld: portable on row groups and on rows differ",
                 pp_dtype_name(dt), (long long)rows, (long long)cols, (long long)n);
    free(y3);
    free(wg);
    for (int64_t r = 0; r < rows; r++) {
        pp_row_to_f32(row, w + r * rb, dt, cols);
        for (int64_t t = 0; t < n; t++) {
            float d = dt == PP_DTYPE_Q8_0 ? q8_reference(w + r * rb, &a, t)
                                          : pp__dot(row, x + t * cols, cols);
            assert_memory_equal(&d, &y1[t * rows + r], sizeof(float));
        }
    }
    free(qbuf);
    free(qfast);
    free(pbuf);
    free(x);
    free(y1);
    free(y2);
    free(row);
    free(panel);
    free(acc);
    free(split);
}

/* check_weights on random weights. */
static void check_rows_split(enum pp_dtype dt, int64_t rows, int64_t cols, int64_t n,
                             int64_t chunk, unsigned *seed)
{
    int64_t rb = pp_dtype_row_bytes(dt, cols);
    float *src = malloc(sizeof(float) * (size_t)(rows * cols));
    char *w = malloc((size_t)(rows * rb));
    for (int64_t i = 0; i < rows * cols; i++)
        src[i] = frand(seed);
    for (int64_t r = 0; r < rows; r++) {
        char *dst = w + r * rb;
        for (int64_t i = 0; i < cols; i++) {
            float v = src[r * cols + i];
            if (dt == PP_DTYPE_F32)
                memcpy(dst + i * 4, &v, 4);
            else if (dt == PP_DTYPE_F16 || dt == PP_DTYPE_BF16) {
                uint16_t h = dt == PP_DTYPE_F16 ? pp_f32_to_f16(v) : pp_f32_to_bf16(v);
                memcpy(dst + i * 2, &h, 2);
            }
        }
        if (dt == PP_DTYPE_Q8_0)
            pp_quantize_q8_0(dst, src + r * cols, cols);
    }
    check_weights(dt, w, rows, cols, n, chunk, seed);
    free(src);
    free(w);
}

static void check_rows(enum pp_dtype dt, int64_t rows, int64_t cols, int64_t n, unsigned *seed)
{
    check_rows_split(dt, rows, cols, n, rows, seed);
}

static void test_matmul_rows_match(void **state)
{
    (void)state;
    unsigned seed = 9;
    const enum pp_dtype dts[] = {PP_DTYPE_F32, PP_DTYPE_F16, PP_DTYPE_BF16, PP_DTYPE_Q8_0};
    /* cols around the chunk size (PP_MM_KC) and ragged, up to three chunks and a ragged fourth;
     * n on both sides of the direct/packed switches (direct_max_rows row-major, 11, 13 and 21
     * here; PP_MM_DIRECT_MAX_TOKENS in row groups) and of Q8_0's spaced pair tiles (40,
     * Q8Z_SPACED_MAX_TOKENS in kernels/cpu/matmul_q8_x86.h), beyond one pass of the packed nest
     * (PP_MM_NC_MAX, PP_MM_NC_AVX512) and not a multiple of the 3-, 4- or 8-token tiles; rows not
     * a multiple of the 3-, 4- or 6-row tiles or the panels (PP_MM_MC_MAX, PP_MM_MC_AVX512) */
    const int64_t shapes[][3] = {{1, 1, 1}, {5, 7, 2}, {9, 33, 3}, {13, 257, 4}, {70, 300, 5},
                                 {3, 520, 7}, {67, 256, 11}, {4, 64, 40}, {130, 96, 1},
                                 {13, 257, 13}, {70, 300, 17}, {17, 530, 14}, {40, 1000, 30},
                                 {19, 300, 21}, {9, 530, 20}, {22, PP_MM_KC, 25},
                                 {22, 2 * PP_MM_KC + 45, 26}, {11, 3 * PP_MM_KC + 7, 23},
                                 {10, 2 * PP_MM_KC + 45, PP_MM_NC_MAX + 13},
                                 {14, PP_MM_KC + 45, PP_MM_NC_AVX512 + 11}, {25, 128, 40},
                                 {25, 128, 41}, {19, 3 * PP_MM_KC + 7, PP_MM_DIRECT_MAX_TOKENS + 1},
                                 {22, 2 * PP_MM_KC + 45, PP_MM_DIRECT_MAX_TOKENS + 3}};
    for (int d = 0; d < 4; d++)
        for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
            int64_t cols = shapes[i][1];
            if (dts[d] == PP_DTYPE_Q8_0)
                cols = (cols + PP_Q8_0_BLOCK - 1) / PP_Q8_0_BLOCK * PP_Q8_0_BLOCK;
            check_rows(dts[d], shapes[i][0], cols, shapes[i][2], &seed);
        }
}

/* The grouped layout (kernels/cpu/row_groups.h) gives every row back as it was, for groups of 1-3
 * rows and a short last unit, in every dtype. */
static void test_row_groups_layout(void **state)
{
    (void)state;
    unsigned seed = 5;
    const enum pp_dtype dts[] = {PP_DTYPE_F32, PP_DTYPE_F16, PP_DTYPE_BF16, PP_DTYPE_Q8_0};
    const int64_t cols_list[] = {8, 13, 16, 37, 64, 96};
    for (int d = 0; d < 4; d++)
        for (int64_t rows = 1; rows <= 7; rows++)
            for (int c = 0; c < 6; c++) {
                int64_t cols = cols_list[c];
                if (dts[d] == PP_DTYPE_Q8_0 && cols % PP_Q8_0_BLOCK)
                    continue;
                int64_t rb = pp_dtype_row_bytes(dts[d], cols);
                char *w = malloc((size_t)(rows * rb)), *wg = malloc((size_t)(rows * rb));
                for (int64_t i = 0; i < rows * rb; i++)
                    w[i] = (char)(rand_r(&seed) & 0x3f); /* finite in every dtype */
                pp__row_groups_pack(wg, w, dts[d], rows, cols);
                float *a = malloc(sizeof(float) * (size_t)cols);
                float *b = malloc(sizeof(float) * (size_t)cols);
                for (int64_t r = 0; r < rows; r++) {
                    pp_row_to_f32(a, w + r * rb, dts[d], cols);
                    pp__row_groups_row_to_f32(b, wg, dts[d], rows, cols, r);
                    assert_memory_equal(a, b, sizeof(float) * (size_t)cols);
                }
                free(a);
                free(b);
                free(w);
                free(wg);
            }
}

/* The few-token nest for every n it serves and a little beyond (1..24): n picks the row tile (4, 3
 * or 6 rows: one or two row groups) and the token tiles, and the reduction block
 * (PP_MM_DIRECT_KB_FLOATS / n elements), so cols are taken below, at and above one block and two,
 * ragged (not a multiple of 8 or 32) where the dtype allows; rows not a multiple of any tile, in
 * chunks of rows as threads take them. */
static void test_direct_all_token_counts(void **state)
{
    (void)state;
    unsigned seed = 21;
    const enum pp_dtype dts[] = {PP_DTYPE_F32, PP_DTYPE_F16, PP_DTYPE_BF16, PP_DTYPE_Q8_0};
    for (int d = 0; d < 4; d++)
        for (int64_t n = 1; n <= PP_MM_DIRECT_MAX_TOKENS + 4; n++) {
            int64_t kb = PP_MM_DIRECT_KB_FLOATS / n / PP_MM_DIRECT_KB_ALIGN * PP_MM_DIRECT_KB_ALIGN;
            const int64_t cols_list[] = {37, 261, kb, kb + 13, 2 * kb + 45};
            for (int c = 0; c < 5; c++) {
                int64_t cols = cols_list[c];
                if (dts[d] == PP_DTYPE_Q8_0)
                    cols = (cols + PP_Q8_0_BLOCK - 1) / PP_Q8_0_BLOCK * PP_Q8_0_BLOCK;
                int64_t rows = 7 + (n + c) % 9; /* 7..15 */
                check_rows_split(dts[d], rows, cols, n, 1 + (n + c) % 6, &seed);
            }
        }
}

/* check_rows_split for dts[0..n_dts) × 1..n_max tokens × rows_list[0..n_rows), in one reduction
 * block (37 cols) and in several (2 kb + 45, every long_every-th row count only, as the long rows
 * are slow): the last row count in chunks of last_chunk rows if not 0, the others whole. */
static void direct_sweep(const enum pp_dtype *dts, int n_dts, int64_t n_max,
                         const int64_t *rows_list, int n_rows, int long_every, int64_t last_chunk,
                         unsigned seed)
{
    for (int d = 0; d < n_dts; d++)
        for (int64_t n = 1; n <= n_max; n++) {
            int64_t kb = PP_MM_DIRECT_KB_FLOATS / n / PP_MM_DIRECT_KB_ALIGN * PP_MM_DIRECT_KB_ALIGN;
            const int64_t cols_list[] = {37, 2 * kb + 45};
            for (int c = 0; c < 2; c++)
                for (int i = 0; i < n_rows; i++) {
                    int64_t cols = cols_list[c], rows = rows_list[i];
                    if (dts[d] == PP_DTYPE_Q8_0)
                        cols = (cols + PP_Q8_0_BLOCK - 1) / PP_Q8_0_BLOCK * PP_Q8_0_BLOCK;
                    if (c == 1 && i % long_every != 0)
                        continue;
                    int64_t chunk = last_chunk && i == n_rows - 1 ? last_chunk : rows;
                    check_rows_split(dts[d], rows, cols, n, chunk, &seed);
                }
        }
}

/* The few-token tiles of four row groups (12 rows, PP_MM_FOUR_GROUPS_MAX_TOKENS) and what a call
 * leaves after them (two groups, one, a short one), in one reduction block and in several; one
 * token and one past the limit take the other tiles over the same rows. */
static void test_direct_four_groups(void **state)
{
    (void)state;
    const enum pp_dtype dts[] = {PP_DTYPE_F32, PP_DTYPE_F16, PP_DTYPE_BF16, PP_DTYPE_Q8_0};
    const int64_t rows_list[] = {12, 13, 17, 23, 24, 29, 36};
    direct_sweep(dts, 4, PP_MM_FOUR_GROUPS_MAX_TOKENS + 1, rows_list, 7, 3, 0, 33);
}

/* Row-major rows in spaced tiles (the AVX2 table's AMD tiles, dtile_spaced_rows in
 * kernels/cpu/simd_x86_direct.h) for every n the few-token nest takes them at and one beyond: rows
 * where two tiles or more fit and some are left over for the adjacent tiles, in one reduction block
 * and in several, whole calls and chunks as threads take them. */
static void test_direct_spaced_rows(void **state)
{
    (void)state;
    const enum pp_dtype dts[] = {PP_DTYPE_F32, PP_DTYPE_F16, PP_DTYPE_BF16};
    const int64_t rows_list[] = {8, 11, 26, 51};
    direct_sweep(dts, 3, PP_MM_DIRECT_ROWS_MAX_TOKENS_AMD + 1, rows_list, 4, 2, 24, 45);
}

/* Q8_0 blocks at the format's edges: every int8 value, -128 included (|w| = 128 in the AVX2 sign
 * trick, 0 once biased), under scales from the smallest f16 subnormal to the largest finite f16,
 * negative and zero ones too. The integer tables must give the portable bits for each, in the
 * one-, two- and many-token tiles (kernels/cpu/matmul_q8.h). */
static void test_q8_0_edges(void **state)
{
    (void)state;
    static const uint16_t scales[] = {0x0001, 0x03ff, 0x0400, 0x3c00, 0x7bff, 0x8001, 0xfbff,
                                      0x0000, 0x8000, 0x1234, 0xb800, 0x5a5a, 0xc3ff};
    const int64_t rows = 14, cols = 8 * PP_Q8_0_BLOCK, per_row = cols / PP_Q8_0_BLOCK;
    int64_t rb = pp_dtype_row_bytes(PP_DTYPE_Q8_0, cols);
    uint8_t *w = malloc((size_t)(rows * rb));
    for (int64_t b = 0; b < rows * per_row; b++) {
        uint8_t *blk = w + b / per_row * rb + b % per_row * PP_Q8_0_BYTES;
        memcpy(blk, &scales[b % (int64_t)(sizeof(scales) / sizeof(scales[0]))], 2);
        for (int j = 0; j < PP_Q8_0_BLOCK; j++)
            blk[2 + j] = (uint8_t)(b * PP_Q8_0_BLOCK + j); /* all 256 values, every 8 blocks */
    }
    unsigned seed = 33;
    const int64_t ns[] = {1, 2, 3, 4, 8, 13, PP_MM_DIRECT_MAX_TOKENS + 5};
    for (size_t i = 0; i < sizeof(ns) / sizeof(ns[0]); i++)
        check_weights(PP_DTYPE_Q8_0, (const char *)w, rows, cols, ns[i], 1 + (int64_t)i % 4,
                      &seed);
    free(w);
}

static void test_conversions_match(void **state)
{
    (void)state;
    const struct pp_simd *fast = pp_simd_get(), *port = pp_simd_portable();
    /* every 16-bit pattern, in a ragged length so the tail path runs too */
    int64_t n = 65536 + 5;
    uint16_t *src = malloc(sizeof(uint16_t) * (size_t)n);
    float *a = malloc(sizeof(float) * (size_t)n), *b = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        src[i] = (uint16_t)i;
    fast->f16_to_f32(a, src, n);
    port->f16_to_f32(b, src, n);
    for (int64_t i = 0; i < n; i++) {
        if (a[i] != a[i]) { /* NaN: both must be NaN; payload bits may differ */
            assert_true(b[i] != b[i]);
            continue;
        }
        assert_memory_equal(&a[i], &b[i], sizeof(float));
    }
    fast->bf16_to_f32(a, src, n);
    port->bf16_to_f32(b, src, n);
    assert_memory_equal(a, b, sizeof(float) * (size_t)n);
    free(src);
    free(a);
    free(b);
}

/* The activations' int8 rule (kernels/cpu/matmul_q8.h) at its edges, the same bytes from both
 * tables: ties round to even, the largest magnitude becomes ±127, an inf or a NaN makes the
 * block's scale NaN and its values 0, an all-zero or all-denormal block has scale 0, and a random
 * block comes back within half a step. */
static void test_q8_act_rule(void **state)
{
    (void)state;
    enum { B = 6, C = B * PP_Q8_0_BLOCK };
    const struct pp_simd *fast = pp_simd_get(), *port = pp_simd_portable();
    float x[C];
    unsigned seed = 3;
    for (int i = 0; i < PP_Q8_0_BLOCK; i++)
        x[i] = (float)(i - 16) + 0.5f; /* block 0: scale 1 (amax 127 below), every value a tie */
    x[0] = -127.0f;
    for (int i = PP_Q8_0_BLOCK; i < C; i++)
        x[i] = i < 3 * PP_Q8_0_BLOCK ? (i < 2 * PP_Q8_0_BLOCK ? 0.0f : 1e-40f) : frand(&seed);
    x[3 * PP_Q8_0_BLOCK + 5] = INFINITY;
    x[4 * PP_Q8_0_BLOCK + 30] = NAN;
    int8_t qa[C], qb[C];
    float da[B], db[B];
    port->q8_act(qa, da, x, C);
    fast->q8_act(qb, db, x, C);
    assert_memory_equal(qa, qb, sizeof(qa));
    for (int b = 0; b < B; b++)
        assert_true(memcmp(&da[b], &db[b], sizeof(float)) == 0 ||
                    (da[b] != da[b] && db[b] != db[b]));
    assert_true(da[0] == 1.0f);
    assert_int_equal(qa[0], -127);
    const int ties[][2] = {{16, 0}, {17, 2}, {18, 2}, {15, 0}, {14, -2}, {13, -2}, {31, 16}};
    for (size_t i = 0; i < sizeof(ties) / sizeof(ties[0]); i++)
        assert_int_equal(qa[ties[i][0]], ties[i][1]);
    assert_true(da[1] == 0.0f && da[2] == 0.0f);
    assert_true(da[3] != da[3] && da[4] != da[4]);
    for (int i = PP_Q8_0_BLOCK; i < 5 * PP_Q8_0_BLOCK; i++)
        assert_int_equal(qa[i], 0);
    int top = 0;
    for (int i = 5 * PP_Q8_0_BLOCK; i < C; i++) {
        assert_true(fabsf((float)qa[i] * da[5] - x[i]) <= 0.5f * da[5] * (1.0f + 1e-6f));
        top |= qa[i] == 127 || qa[i] == -127;
    }
    assert_true(top);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dot_matches),
        cmocka_unit_test(test_dots_wsum_match),
        cmocka_unit_test(test_expf_accuracy),
        cmocka_unit_test(test_swiglu_match),
        cmocka_unit_test(test_exp_shift_match),
        cmocka_unit_test(test_scale_max_match),
        cmocka_unit_test(test_scale_add_match),
        cmocka_unit_test(test_row_groups_layout),
        cmocka_unit_test(test_matmul_rows_match),
        cmocka_unit_test(test_direct_all_token_counts),
        cmocka_unit_test(test_direct_four_groups),
        cmocka_unit_test(test_direct_spaced_rows),
        cmocka_unit_test(test_q8_0_edges),
        cmocka_unit_test(test_q8_act_rule),
        cmocka_unit_test(test_conversions_match),
    };
    /* every vector table this CPU can run, each against the portable one (PP_SIMD caps the table
     * pp_simd_get returns); a CPU with none runs the group once, portable against itself */
    static const char *const names[] = {"avx2", "avx512"};
    int failed = 0, ran = 0;
    for (int i = 0; i < 2; i++) {
        if (!pp_simd_named(names[i]))
            continue;
        setenv("PP_SIMD", names[i], 1);
        if (strcmp(pp_simd_get()->name, names[i]) != 0) {
            fprintf(stderr, "PP_SIMD=%s gave the %s table\n", names[i], pp_simd_get()->name);
            return 1;
        }
        fprintf(stderr, "vector table %s against portable\n", names[i]);
        failed += cmocka_run_group_tests_name(names[i], tests, NULL, NULL);
        ran++;
    }
    if (!ran)
        failed += cmocka_run_group_tests(tests, NULL, NULL);
    return failed;
}
