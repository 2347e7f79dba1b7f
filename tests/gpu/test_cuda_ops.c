/* Every op of the CUDA backend against the CPU backend's op (the reference), on random shapes that
 * include ragged sizes (columns that are not a multiple of 8, odd head dims, partial tiles and
 * blocks), with a tolerance per op and weight dtype. Prints one line per case group with the
 * worst absolute and relative error (relative to the largest reference value of a case) and
 * PASS/FAIL, and writes the same as JSON (--json FILE).
 *
 * Usage: test_cuda_ops [--json FILE] [--device N] [--seed N] [OP...]: OP names the op families
 * to run (embed rmsnorm rope elementwise rows topk moe_route attention matmul; all by default), so
 * that a family that breaks the CUDA context can be run alone.
 *
 * Exit status: 0 all pass, 1 a case failed, 3 a CUDA call failed (the op named on stderr), 77 no
 * usable GPU here (nothing run), 2 bad usage.
 *
 * Tolerances, and why: ops without a reduction are exact or within expf's few ulps (1e-6);
 * reductions in another order (rmsnorm, attention, the GEMV on f32 inputs) 2e-5 to 1e-4; cuBLAS
 * rounds its inputs to the weight's 16-bit type: 1e-2 for bf16 (8-bit mantissa), 2e-3 for f16;
 * f32 and Q8_0 weights are bf16 on the device: 1e-2 against the CPU's exact weights. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/cuda/backend_cuda.h"
#include "kernels/dtype.h"

/* --- bookkeeping ------------------------------------------------------------------------------ */

struct result {
    char name[96];
    int cases;
    double max_abs;
    double max_rel;
    double tol; /* on max_rel */
    int failed;
};

#define MAX_RESULTS 128
static struct result results[MAX_RESULTS];
static int n_results;
static struct pp_backend *cpu, *gpu;

static struct result *result_get(const char *name, double tol)
{
    for (int i = 0; i < n_results; i++)
        if (strcmp(results[i].name, name) == 0)
            return &results[i];
    if (n_results == MAX_RESULTS) {
        fprintf(stderr, "test_cuda_ops: too many result groups\n");
        exit(1);
    }
    struct result *r = &results[n_results++];
    memset(r, 0, sizeof(*r));
    snprintf(r->name, sizeof(r->name), "%s", name);
    r->tol = tol;
    return r;
}

/* Records one case: got against ref over n values. Relative error is max|got - ref| divided by
 * max|ref|, or by floor when that is larger (the typical magnitude of an output, so that a case
 * whose few outputs all happen to be small is not judged against them alone). */
static void check_floor(const char *name, double tol, const float *got, const float *ref,
                        int64_t n, double floor, const char *what)
{
    struct result *r = result_get(name, tol);
    double ma = 0, mr = 0;
    int bad_value = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(got[i]) != isnan(ref[i]) || (!isfinite(got[i]) && got[i] != ref[i]))
            bad_value = 1;
        double d = fabs((double)got[i] - (double)ref[i]);
        if (d > ma)
            ma = d;
        if (fabs((double)ref[i]) > mr)
            mr = fabs((double)ref[i]);
    }
    if (floor > mr)
        mr = floor;
    double rel = mr > 0 ? ma / mr : ma;
    r->cases++;
    if (ma > r->max_abs)
        r->max_abs = ma;
    if (rel > r->max_rel)
        r->max_rel = rel;
    if (rel > tol || bad_value) {
        if (!r->failed)
            fprintf(stderr, "FAIL %s (%s): max abs %.3g, rel %.3g > %.3g%s\n", name, what, ma, rel,
                    tol, bad_value ? ", NaN/inf where the CPU has none" : "");
        r->failed = 1;
    }
}

static void check(const char *name, double tol, const float *got, const float *ref, int64_t n,
                  const char *what)
{
    check_floor(name, tol, got, ref, n, 0, what);
}

/* Records an exact comparison of n int32 values. */
static void check_ids(const char *name, const int32_t *got, const int32_t *ref, int64_t n,
                      const char *what)
{
    struct result *r = result_get(name, 0);
    r->cases++;
    for (int64_t i = 0; i < n; i++)
        if (got[i] != ref[i]) {
            if (!r->failed)
                fprintf(stderr, "FAIL %s (%s): element %lld is %d, the CPU has %d\n", name, what,
                        (long long)i, got[i], ref[i]);
            r->failed = 1;
            r->max_abs = 1;
            r->max_rel = 1;
            return;
        }
}

static void die(const char *what)
{
    fprintf(stderr, "test_cuda_ops: %s: %s\n", what, pp_error_detail());
    exit(3);
}

/* --- random data ------------------------------------------------------------------------------ */

static uint64_t rng_state = 0x853c49e6748fea9bull;

static uint64_t rng_next(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float rnd(float lo, float hi)
{
    return lo + (hi - lo) * (float)((rng_next() >> 40) * (1.0 / 16777216.0));
}

static int64_t rnd_int(int64_t lo, int64_t hi)
{
    return lo + (int64_t)(rng_next() % (uint64_t)(hi - lo + 1));
}

static void *xmalloc(size_t n)
{
    void *p = calloc(n > 0 ? n : 1, 1);
    if (!p) {
        fprintf(stderr, "test_cuda_ops: out of host memory\n");
        exit(1);
    }
    return p;
}

static float *rand_floats(int64_t n, float lo, float hi)
{
    float *v = xmalloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        v[i] = rnd(lo, hi);
    return v;
}

/* --- device buffers --------------------------------------------------------------------------- */

static void *dev_alloc(int64_t bytes)
{
    void *p = NULL;
    if (gpu->ops->buf_alloc(gpu, PP_MEM_ACTIVATIONS, bytes, &p) != PP_OK)
        die("buf_alloc");
    return p;
}

static void *dev_from(const void *host, int64_t bytes)
{
    void *p = dev_alloc(bytes);
    gpu->ops->copy_in(gpu, p, host, bytes);
    return p;
}

static void dev_to(void *host, const void *dev, int64_t bytes)
{
    if (gpu->ops->copy_out(gpu, host, dev, bytes) != PP_OK)
        die("copy_out (a queued op failed)");
}

static void dev_free(void *p)
{
    gpu->ops->buf_free(gpu, PP_MEM_ACTIVATIONS, p);
}

/* A [rows, cols] weight of dtype t with values in [-1, 1): host bytes (caller frees w->data). */
static struct pp_weight make_weight(enum pp_dtype t, int64_t rows, int64_t cols)
{
    struct pp_weight w = {NULL, t, rows, cols};
    int64_t rb = pp_dtype_row_bytes(t, cols);
    char *data = xmalloc((size_t)(rb * rows));
    float *row = xmalloc((size_t)cols * sizeof(float));
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t c = 0; c < cols; c++)
            row[c] = rnd(-1.0f, 1.0f);
        char *dst = data + r * rb;
        switch (t) {
        case PP_DTYPE_F32: memcpy(dst, row, (size_t)cols * 4); break;
        case PP_DTYPE_F16:
            for (int64_t c = 0; c < cols; c++)
                ((uint16_t *)dst)[c] = pp_f32_to_f16(row[c]);
            break;
        case PP_DTYPE_BF16:
            for (int64_t c = 0; c < cols; c++)
                ((uint16_t *)dst)[c] = pp_f32_to_bf16(row[c]);
            break;
        case PP_DTYPE_Q8_0: pp_quantize_q8_0(dst, row, cols); break;
        default: break;
        }
    }
    free(row);
    w.data = data;
    return w;
}

/* Tolerance of a cuBLAS-path matmul or a weight read on the device, by the stored dtype. */
static double weight_tol(enum pp_dtype t, int gemv)
{
    if (t == PP_DTYPE_F16)
        return gemv ? 2e-5 : 2e-3;
    if (t == PP_DTYPE_BF16)
        return gemv ? 2e-5 : 1e-2;
    return 1.2e-2; /* f32 and Q8_0 are bf16 on the device */
}

/* --- ops -------------------------------------------------------------------------------------- */

static void test_matmul(void)
{
    const enum pp_dtype types[] = {PP_DTYPE_BF16, PP_DTYPE_F16, PP_DTYPE_F32, PP_DTYPE_Q8_0};
    const int64_t rows_set[] = {1, 7, 64, 301, 1031};
    const int64_t cols_set[] = {32, 37, 96, 200, 1000, 4096};
    const int64_t n_set[] = {1, 2, 3, 4, 5, 8, 17, 64};
    for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++)
        for (size_t ri = 0; ri < sizeof(rows_set) / sizeof(rows_set[0]); ri++)
            for (size_t ci = 0; ci < sizeof(cols_set) / sizeof(cols_set[0]); ci++) {
                enum pp_dtype t = types[ti];
                int64_t rows = rows_set[ri], cols = cols_set[ci];
                if (t == PP_DTYPE_Q8_0 && cols % 32 != 0)
                    continue;
                struct pp_weight w = make_weight(t, rows, cols), wd;
                if (gpu->ops->weight_load(gpu, &w, 0, &wd) != PP_OK)
                    die("weight_load");
                for (size_t ni = 0; ni < sizeof(n_set) / sizeof(n_set[0]); ni++) {
                    int64_t n = n_set[ni];
                    if (rows * cols * n > ((int64_t)1 << 26))
                        continue; /* keeps the CPU reference quick */
                    float *x = rand_floats(n * cols, -1.0f, 1.0f);
                    float *ref = xmalloc((size_t)(n * rows) * 4),
                          *got = xmalloc((size_t)(n * rows) * 4);
                    cpu->ops->matmul(cpu, ref, x, &w, n);
                    float *dx = dev_from(x, n * cols * 4), *dy = dev_alloc(n * rows * 4);
                    gpu->ops->matmul(gpu, dy, dx, &wd, n);
                    dev_to(got, dy, n * rows * 4);
                    int gemv = PP_CUDA_USES_GEMV(n, rows);
                    char name[96], what[96];
                    snprintf(name, sizeof(name), "matmul %s %s", pp_dtype_name(t),
                             gemv ? "gemv" : "cublas");
                    snprintf(what, sizeof(what), "[%lld, %lld] x %lld tokens", (long long)rows,
                             (long long)cols, (long long)n);
                    /* inputs and weights uniform in [-1, 1): an output's spread is sqrt(cols / 9)
                     */
                    check_floor(name, weight_tol(t, gemv), got, ref, n * rows,
                                sqrt((double)cols / 9.0), what);
                    dev_free(dx);
                    dev_free(dy);
                    free(x);
                    free(ref);
                    free(got);
                }
                gpu->ops->weight_free(gpu, &wd);
                free((void *)w.data);
            }
    /* an f32 vector used as a one-row weight stays f32 on the device (the shared expert's gate) */
    for (int64_t cols = 40; cols <= 4100; cols += 1353) {
        float *v = rand_floats(cols, -1, 1);
        const float *dv = NULL;
        if (gpu->ops->vec_load(gpu, v, cols, 0, &dv) != PP_OK)
            die("vec_load");
        struct pp_weight w = {v, PP_DTYPE_F32, 1, cols}, wd = {dv, PP_DTYPE_F32, 1, cols};
        int64_t n = 37;
        float *x = rand_floats(n * cols, -1, 1), ref[37], got[37];
        cpu->ops->matmul(cpu, ref, x, &w, n);
        float *dx = dev_from(x, n * cols * 4), *dy = dev_alloc(n * 4);
        gpu->ops->matmul(gpu, dy, dx, &wd, n);
        dev_to(got, dy, n * 4);
        check("matmul f32 vector gemv", 2e-5, got, ref, n, "one f32 row");
        dev_free(dx);
        dev_free(dy);
        gpu->ops->vec_free(gpu, dv);
        free(v);
        free(x);
    }
}

static void test_embed(void)
{
    const enum pp_dtype types[] = {PP_DTYPE_BF16, PP_DTYPE_F16, PP_DTYPE_F32, PP_DTYPE_Q8_0};
    for (size_t ti = 0; ti < 4; ti++) {
        int64_t vocab = 1000, cols = types[ti] == PP_DTYPE_Q8_0 ? 96 : 72, n = 33;
        struct pp_weight w = make_weight(types[ti], vocab, cols), wd;
        if (gpu->ops->weight_load(gpu, &w, 0, &wd) != PP_OK)
            die("weight_load");
        int32_t ids[33];
        for (int i = 0; i < n; i++)
            ids[i] = (int32_t)rnd_int(0, vocab - 1);
        ids[0] = 0;
        ids[1] = (int32_t)vocab - 1;
        float *ref = xmalloc((size_t)(n * cols) * 4), *got = xmalloc((size_t)(n * cols) * 4);
        cpu->ops->embed(cpu, ref, &w, ids, n);
        float *d = dev_alloc(n * cols * 4);
        gpu->ops->embed(gpu, d, &wd, ids, n);
        dev_to(got, d, n * cols * 4);
        char name[64];
        snprintf(name, sizeof(name), "embed %s", pp_dtype_name(types[ti]));
        /* 16-bit weights are kept exactly; f32 and Q8_0 become bf16 (relative rounding 2^-9) */
        check(name, types[ti] == PP_DTYPE_F16 || types[ti] == PP_DTYPE_BF16 ? 0 : 4e-3, got, ref,
              n * cols, "33 ids");
        dev_free(d);
        gpu->ops->weight_free(gpu, &wd);
        free((void *)w.data);
        free(ref);
        free(got);
    }
}

static void test_rmsnorm(void)
{
    const int64_t dims[] = {1, 7, 64, 333, 4096, 5120};
    for (size_t i = 0; i < sizeof(dims) / sizeof(dims[0]); i++) {
        int64_t dim = dims[i], n = 1 + rnd_int(0, 40);
        float *x = rand_floats(n * dim, -3, 3), *g = rand_floats(dim, 0.5f, 1.5f);
        float *ref = xmalloc((size_t)(n * dim) * 4), *got = xmalloc((size_t)(n * dim) * 4);
        cpu->ops->rmsnorm(cpu, ref, x, g, n, dim, 1e-5f);
        float *dx = dev_from(x, n * dim * 4), *dg = dev_from(g, dim * 4);
        gpu->ops->rmsnorm(gpu, dx, dx, dg, n, dim, 1e-5f); /* in place, as the head does */
        dev_to(got, dx, n * dim * 4);
        check("rmsnorm", 2e-5, got, ref, n * dim, "in place");
        dev_free(dx);
        dev_free(dg);
        free(x);
        free(g);
        free(ref);
        free(got);
    }
}

static void test_rope(void)
{
    const int32_t hds[] = {2, 16, 64, 80, 128};
    for (size_t i = 0; i < sizeof(hds) / sizeof(hds[0]); i++)
        for (int layout = 0; layout < 2; layout++) {
            int32_t hd = hds[i], heads = (int32_t)rnd_int(1, 9);
            int64_t n = rnd_int(1, 50), elems = n * heads * hd;
            float *x = rand_floats(elems, -2, 2), *inv = xmalloc((size_t)(hd / 2) * 4);
            int32_t *pos = xmalloc((size_t)n * 4);
            for (int32_t k = 0; k < hd / 2; k++)
                inv[k] = powf(500000.0f, -2.0f * (float)k / (float)hd);
            for (int64_t r = 0; r < n; r++)
                pos[r] = (int32_t)(r == 0 ? 131071 : rnd_int(0, 40000));
            float *dx = dev_from(x, elems * 4), *dinv = dev_from(inv, hd / 2 * 4);
            float *got = xmalloc((size_t)elems * 4);
            cpu->ops->rope(cpu, x, pos, n, heads, hd, inv, (enum pp_rope_layout)layout);
            gpu->ops->rope(gpu, dx, pos, n, heads, hd, dinv, (enum pp_rope_layout)layout);
            dev_to(got, dx, elems * 4);
            check(layout == PP_ROPE_NEOX ? "rope neox" : "rope interleaved", 1e-6, got, x, elems,
                  "angles in double");
            dev_free(dx);
            dev_free(dinv);
            free(x);
            free(inv);
            free(pos);
            free(got);
        }
}

static void test_elementwise(void)
{
    for (int rep = 0; rep < 4; rep++) {
        int64_t n = rnd_int(1, 20), cols = rnd_int(1, 3000), e = n * cols;
        float *a = rand_floats(e, -8, 8), *b = rand_floats(e, -2, 2),
              *bias = rand_floats(cols, -1, 1);
        float *g = rand_floats(n, -6, 6), *ref = xmalloc((size_t)e * 4),
              *got = xmalloc((size_t)e * 4);
        float *da = dev_from(a, e * 4), *db = dev_from(b, e * 4), *dout = dev_alloc(e * 4);
        float *dbias = dev_from(bias, cols * 4), *dg = dev_from(g, n * 4);

        cpu->ops->swiglu(cpu, ref, a, b, e);
        gpu->ops->swiglu(gpu, dout, da, db, e);
        dev_to(got, dout, e * 4);
        check("swiglu", 1e-6, got, ref, e, "expf");

        memcpy(ref, a, (size_t)e * 4);
        cpu->ops->add(cpu, ref, b, e);
        gpu->ops->copy(gpu, dout, da, e * 4);
        gpu->ops->add(gpu, dout, db, e);
        dev_to(got, dout, e * 4);
        check("add", 0, got, ref, e, "exact");

        memcpy(ref, a, (size_t)e * 4);
        cpu->ops->add_bias(cpu, ref, bias, n, cols);
        gpu->ops->copy(gpu, dout, da, e * 4);
        gpu->ops->add_bias(gpu, dout, dbias, n, cols);
        dev_to(got, dout, e * 4);
        check("add_bias", 0, got, ref, e, "exact");

        memcpy(ref, a, (size_t)e * 4);
        cpu->ops->add_gated(cpu, ref, b, g, n, cols);
        gpu->ops->copy(gpu, dout, da, e * 4);
        gpu->ops->add_gated(gpu, dout, db, dg, n, cols);
        dev_to(got, dout, e * 4);
        check("add_gated", 1e-6, got, ref, e, "expf");

        /* zero, copy_in and copy_out round trip */
        gpu->ops->zero(gpu, dout, e * 4);
        dev_to(got, dout, e * 4);
        memset(ref, 0, (size_t)e * 4);
        check("zero", 0, got, ref, e, "memset");

        dev_free(da);
        dev_free(db);
        dev_free(dout);
        dev_free(dbias);
        dev_free(dg);
        free(a);
        free(b);
        free(bias);
        free(g);
        free(ref);
        free(got);
    }
}

static void test_rows(void)
{
    for (int rep = 0; rep < 4; rep++) {
        int64_t src_rows = rnd_int(1, 200), cols = rnd_int(1, 2000), n = rnd_int(1, 300);
        int32_t *rows = xmalloc((size_t)n * 4);
        float *w = rand_floats(n, -1, 1);
        for (int64_t i = 0; i < n; i++)
            rows[i] = (int32_t)rnd_int(0, src_rows - 1); /* repeats included */
        float *src = rand_floats(src_rows * cols, -1, 1), *y = rand_floats(n * cols, -1, 1);
        float *ref = xmalloc((size_t)(n * cols) * 4), *got = xmalloc((size_t)(n * cols) * 4);
        float *dsrc = dev_from(src, src_rows * cols * 4), *dy = dev_from(y, n * cols * 4);
        float *dg = dev_alloc(n * cols * 4);
        cpu->ops->gather_rows(cpu, ref, src, rows, n, cols);
        gpu->ops->gather_rows(gpu, dg, dsrc, rows, n, cols);
        dev_to(got, dg, n * cols * 4);
        check("gather_rows", 0, got, ref, n * cols, "exact");

        float *acc = xmalloc((size_t)(src_rows * cols) * 4);
        float *gacc = xmalloc((size_t)(src_rows * cols) * 4);
        memcpy(acc, src, (size_t)(src_rows * cols) * 4);
        cpu->ops->scatter_add_rows(cpu, acc, y, rows, w, n, cols);
        gpu->ops->scatter_add_rows(gpu, dsrc, dy, rows, w, n, cols);
        dev_to(gacc, dsrc, src_rows * cols * 4);
        check("scatter_add_rows", 0, gacc, acc, src_rows * cols, "list order, repeats");
        dev_free(dsrc);
        dev_free(dy);
        dev_free(dg);
        free(rows);
        free(w);
        free(src);
        free(y);
        free(ref);
        free(got);
        free(acc);
        free(gacc);
    }
}

static void test_topk(void)
{
    const int32_t ks[] = {1, 5, 40};
    for (size_t i = 0; i < 3; i++) {
        int64_t n = rnd_int(1, 6), vocab = i == 2 ? 128256 : rnd_int(50, 5000);
        int32_t k = ks[i];
        float *x = xmalloc((size_t)(n * vocab) * 4);
        for (int64_t j = 0; j < n * vocab; j++)
            x[j] = floorf(rnd(-4, 4) * 4) / 4; /* coarse values: many ties */
        x[vocab / 2] = NAN;                    /* ranks below every number */
        int32_t *ids = xmalloc((size_t)(n * k) * 4), *gids = xmalloc((size_t)(n * k) * 4);
        float *vals = xmalloc((size_t)(n * k) * 4), *gvals = xmalloc((size_t)(n * k) * 4);
        float *dx = dev_from(x, n * vocab * 4);
        if (cpu->ops->topk(cpu, ids, vals, x, n, vocab, k) != PP_OK ||
            gpu->ops->topk(gpu, gids, gvals, dx, n, vocab, k) != PP_OK)
            die("topk");
        check_ids("topk ids", gids, ids, n * k, "ties to the lower id");
        check("topk values", 0, gvals, vals, n * k, "exact");
        dev_free(dx);
        free(x);
        free(ids);
        free(gids);
        free(vals);
        free(gvals);
    }
}

static void test_moe_route(void)
{
    const int32_t experts[] = {8, 60, 64};
    const int32_t kk[] = {2, 4, 6};
    for (size_t i = 0; i < 3; i++)
        for (int mode = 0; mode < 2; mode++)
            for (int renorm = 0; renorm < 2; renorm++) {
                int32_t ne = experts[i], k = kk[i];
                int64_t n = rnd_int(1, 300);
                float *lg = rand_floats(n * ne, -4, 4);
                float *dlg = dev_from(lg, n * ne * 4);
                int32_t *pick = xmalloc((size_t)(n * k) * 4), *gpick = xmalloc((size_t)(n * k) * 4);
                float *w = xmalloc((size_t)(n * k) * 4), *gw = xmalloc((size_t)(n * k) * 4);
                int32_t *dpick = dev_alloc(n * k * 4);
                float *dw = dev_alloc(n * k * 4);
                cpu->ops->moe_route(cpu, pick, w, lg, n, ne, k, (enum pp_route_mode)mode, renorm);
                gpu->ops->moe_route(gpu, dpick, dw, dlg, n, ne, k, (enum pp_route_mode)mode,
                                    renorm);
                dev_to(gpick, dpick, n * k * 4);
                dev_to(gw, dw, n * k * 4);
                check_ids(mode == PP_ROUTE_TOPK_SOFTMAX ? "moe_route picks (topk-softmax)"
                                                        : "moe_route picks (softmax-topk)",
                          gpick, pick, n * k, "random logits");
                check("moe_route weights", 1e-6, gw, w, n * k, "expf");
                dev_free(dlg);
                dev_free(dpick);
                dev_free(dw);
                free(lg);
                free(pick);
                free(gpick);
                free(w);
                free(gw);
            }
}

/* --- KV store and attention ------------------------------------------------------------------- */

#define BLOCK 16
#define LAYERS 2
#define LAYER 1

struct attn_case {
    const char *name;
    int32_t n_heads, n_kv_heads, head_dim, window;
    int32_t n_seqs;
    int32_t prefix[6]; /* tokens already cached */
    int32_t fresh[6];  /* this batch's tokens */
};

static void test_attention_case(const struct attn_case *c)
{
    int32_t kv_dim = c->n_kv_heads * c->head_dim, q_dim = c->n_heads * c->head_dim;
    int64_t block_elems = (int64_t)BLOCK * kv_dim, n_blocks = 0;
    for (int32_t s = 0; s < c->n_seqs; s++)
        n_blocks += (c->prefix[s] + c->fresh[s] + BLOCK - 1) / BLOCK;
    int64_t pool_elems = n_blocks * LAYERS * 2 * block_elems;
    /* every slot holds a random value (the cached prefix); this batch's rows are stored below */
    float *pool = rand_floats(pool_elems, -1, 1);
    float *dpool = dev_from(pool, pool_elems * 4);
    int32_t *perm = xmalloc((size_t)n_blocks * 4);
    for (int64_t i = 0; i < n_blocks; i++)
        perm[i] = (int32_t)i;
    for (int64_t i = n_blocks - 1; i > 0; i--) {
        int64_t j = rnd_int(0, i);
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    struct pp_attn_seq seqs[6];
    int32_t row = 0, next = 0, max_ctx = 1;
    for (int32_t s = 0; s < c->n_seqs; s++) {
        int32_t total = c->prefix[s] + c->fresh[s];
        seqs[s] = (struct pp_attn_seq){row, c->fresh[s], c->prefix[s], perm + next};
        next += (total + BLOCK - 1) / BLOCK;
        row += c->fresh[s];
        if (total > max_ctx)
            max_ctx = total;
    }
    int32_t T = row;
    struct pp_kv_view cv = {pool, LAYERS, BLOCK, kv_dim, block_elems};
    struct pp_kv_view gv = {dpool, LAYERS, BLOCK, kv_dim, block_elems};
    float *k = rand_floats((int64_t)T * kv_dim, -1, 1),
          *v = rand_floats((int64_t)T * kv_dim, -1, 1);
    float *dk = dev_from(k, (int64_t)T * kv_dim * 4), *dv = dev_from(v, (int64_t)T * kv_dim * 4);
    if (cpu->ops->reserve(cpu, q_dim > kv_dim ? q_dim : kv_dim, max_ctx) != PP_OK ||
        gpu->ops->reserve(gpu, q_dim, max_ctx) != PP_OK)
        die("reserve");
    cpu->ops->kv_store(cpu, &cv, LAYER, seqs, c->n_seqs, k, v);
    gpu->ops->kv_store(gpu, &gv, LAYER, seqs, c->n_seqs, dk, dv);
    float *gpool = xmalloc((size_t)pool_elems * 4);
    dev_to(gpool, dpool, pool_elems * 4);
    char what[128];
    snprintf(what, sizeof(what), "%s", c->name);
    check("kv_store", 0, gpool, pool, pool_elems, what);

    float *q = rand_floats((int64_t)T * q_dim, -1, 1);
    float *dq = dev_from(q, (int64_t)T * q_dim * 4), *dout = dev_alloc((int64_t)T * q_dim * 4);
    float *ref = xmalloc((size_t)T * q_dim * 4), *got = xmalloc((size_t)T * q_dim * 4);
    struct pp_attn_shape shape = {c->n_heads, c->n_kv_heads, c->head_dim, c->window,
                                  1.0f / sqrtf((float)c->head_dim)};
    cpu->ops->attention(cpu, ref, q, &cv, LAYER, seqs, c->n_seqs, &shape);
    gpu->ops->attention(gpu, dout, dq, &gv, LAYER, seqs, c->n_seqs, &shape);
    dev_to(got, dout, (int64_t)T * q_dim * 4);
    /* each part by the kernel that ran it: f32 decode and f32 tiles hold 1e-4; the tensor cores
     * round queries, keys, values and probabilities to f16 (11-bit significands): 5e-3 */
    for (int32_t s = 0; s < c->n_seqs; s++) {
        int32_t G = c->n_heads / c->n_kv_heads;
        int decode = c->fresh[s] <= PP_CUDA_ATTN_DECODE_TOKENS && G <= PP_CUDA_ATTN_DECODE_MAX_G;
        int tc = !decode && PP_CUDA_ATTN_TENSOR_CORES(c->head_dim);
        int64_t off = (int64_t)seqs[s].row * q_dim, n = (int64_t)c->fresh[s] * q_dim;
        check(decode ? "attention decode" : tc ? "attention prefill f16 tensor cores"
                                               : "attention prefill f32",
              tc ? 5e-3 : 1e-4, got + off, ref + off, n, what);
    }
    dev_free(dpool);
    dev_free(dk);
    dev_free(dv);
    dev_free(dq);
    dev_free(dout);
    free(pool);
    free(gpool);
    free(perm);
    free(k);
    free(v);
    free(q);
    free(ref);
    free(got);
}

static void test_attention(void)
{
    static const struct attn_case cases[] = {
        /* name, heads, kv heads, head_dim, window, seqs, prefix[], fresh[] */
        {"decode batch, 8B shape (long contexts split)", 32, 8, 128, 0, 5,
         {0, 17, 300, 1023, 4000}, {1, 1, 1, 1, 1}},
        {"prefill from 0 and chunked, with a decode part", 32, 8, 128, 0, 3, {0, 100, 40},
         {50, 20, 1}},
        {"sliding window 64", 8, 2, 64, 64, 3, {30, 0, 500}, {100, 9, 1}},
        {"MHA head_dim 64", 4, 4, 64, 0, 2, {0, 77}, {70, 3}},
        {"head_dim 256, G 2", 8, 4, 256, 0, 2, {10, 0}, {1, 40}},
        {"head_dim 80, G 7 (ragged tiles)", 14, 2, 80, 0, 3, {0, 33, 600}, {61, 8, 2}},
        {"head_dim 16, G 8 (small models)", 8, 1, 16, 0, 2, {0, 5}, {200, 1}},
        {"G 32 > the decode kernel's 16: tiles only", 32, 1, 64, 0, 2, {0, 1000}, {5, 1}},
        {"window 1", 4, 2, 32, 1, 2, {0, 10}, {20, 1}},
        {"odd head_dim 24, window 100, long prefill", 6, 3, 24, 100, 2, {0, 250}, {300, 3}},
        {"8B shape, 700-token prefill beside a chunk past a 200 window", 32, 8, 128, 200, 2,
         {0, 150}, {700, 90}},
        {"head_dim 64, G 16, partial key tiles", 16, 1, 64, 0, 3, {0, 3, 63}, {9, 130, 65}},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        test_attention_case(&cases[i]);
}

/* --- main ------------------------------------------------------------------------------------- */

static int write_json(const char *path, const char *device)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "test_cuda_ops: cannot write %s\n", path);
        return -1;
    }
    fprintf(f, "{\"device\": \"%s\", \"ops\": [\n", device);
    for (int i = 0; i < n_results; i++)
        fprintf(f, "  {\"name\": \"%s\", \"cases\": %d, \"max_abs\": %.6g, \"max_rel\": %.6g, "
                "\"tolerance\": %.6g, \"pass\": %s}%s\n", results[i].name, results[i].cases,
                results[i].max_abs, results[i].max_rel, results[i].tol,
                results[i].failed ? "false" : "true", i + 1 < n_results ? "," : "");
    fprintf(f, "]}\n");
    return fclose(f) == 0 ? 0 : -1;
}

static const struct {
    const char *name;
    void (*run)(void);
} families[] = {
    {"embed", test_embed}, {"rmsnorm", test_rmsnorm}, {"rope", test_rope},
    {"elementwise", test_elementwise}, {"rows", test_rows}, {"topk", test_topk},
    {"moe_route", test_moe_route}, {"attention", test_attention}, {"matmul", test_matmul},
};
#define N_FAMILIES (int)(sizeof(families) / sizeof(families[0]))

int main(int argc, char **argv)
{
    const char *json = NULL;
    int device = 0;
    int chosen[N_FAMILIES] = {0}, any = 0;
    for (int i = 1; i < argc; i++) {
        int f = -1;
        for (int k = 0; k < N_FAMILIES; k++)
            if (strcmp(argv[i], families[k].name) == 0)
                f = k;
        if (f >= 0)
            chosen[f] = any = 1;
        else if (strcmp(argv[i], "--json") == 0 && i + 1 < argc)
            json = argv[++i];
        else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc)
            device = atoi(argv[++i]);
        else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc)
            rng_state = strtoull(argv[++i], NULL, 10);
        else {
            fprintf(stderr, "usage: test_cuda_ops [--json FILE] [--device N] [--seed N] [OP...]; "
                    "'%s' is neither an option nor one of the ops:", argv[i]);
            for (int k = 0; k < N_FAMILIES; k++)
                fprintf(stderr, " %s", families[k].name);
            fprintf(stderr, "\n");
            return 2;
        }
    }
    if (pp_backend_cuda_new(device, 0, &gpu) != PP_OK) {
        fprintf(stderr, "test_cuda_ops: no usable GPU, nothing run: %s\n", pp_error_detail());
        return 77;
    }
    if (pp_backend_cpu_new(4, &cpu) != PP_OK || cpu->ops->reserve(cpu, 8192, 8192) != PP_OK ||
        gpu->ops->reserve(gpu, 8192, 8192) != PP_OK)
        die("backends");
    for (int k = 0; k < N_FAMILIES; k++) {
        if (any && !chosen[k])
            continue;
        fprintf(stderr, "test_cuda_ops: %s\n", families[k].name);
        families[k].run();
        if (gpu->ops->sync(gpu) != PP_OK) {
            fprintf(stderr, "test_cuda_ops: %s: ", families[k].name);
            die("sync after the family");
        }
    }
    int failed = 0;
    printf("%-40s %6s %11s %11s %11s  %s\n", "op", "cases", "max_abs", "max_rel", "tolerance",
           "result");
    for (int i = 0; i < n_results; i++) {
        printf("%-40s %6d %11.3g %11.3g %11.3g  %s\n", results[i].name, results[i].cases,
               results[i].max_abs, results[i].max_rel, results[i].tol,
               results[i].failed ? "FAIL" : "PASS");
        failed |= results[i].failed;
    }
    char dev_name[32];
    snprintf(dev_name, sizeof(dev_name), "cuda:%d", device);
    if (json && write_json(json, dev_name) != 0)
        failed = 1;
    printf("%s\n", failed ? "SOME OPS FAILED" : "ALL OPS PASS");
    cpu->ops->free(cpu);
    gpu->ops->free(gpu);
    return failed ? 1 : 0;
}
