/* The portable inner loops (the definition the vector ones must match bit for bit) and the run-time
 * choice between them and the AVX2/FMA/F16C loops. */
#include "kernels/cpu/simd.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu-impl.h"
#include "kernels/cpu/matmul_q8.h"
#include "kernels/cpu/row_groups.h"

/* Each weight row converted to f32 (exact), then one pp__dot per token. */
static void matmul_rows_portable(const struct pp_mm_args *a, int64_t r0, int64_t r1,
                                 const struct pp_mm_scratch *s)
{
    const char *base = a->w;
    for (int64_t r = r0; r < r1; r++) {
        const float *wr = s->row;
        const void *src = base + r * a->row_bytes;
        if (a->grouped)
            pp__row_groups_row_to_f32(s->row, base, a->dtype, a->rows, a->cols, r);
        else if (a->dtype == PP_DTYPE_F32)
            wr = src;
        else
            pp_row_to_f32(s->row, src, a->dtype, a->cols);
        for (int64_t t = 0; t < a->n; t++)
            a->y[t * a->rows + r] = pp__dot(wr, a->x + t * a->ldx, a->cols);
    }
}

static float dot_portable(const float *a, const float *b, int64_t n)
{
    return pp__dot(a, b, n);
}

static void dots_portable(float *out, int64_t ldo, const float *a, int64_t g,
                          const float *const *b, int64_t m, int64_t n)
{
    for (int64_t q = 0; q < g; q++)
        for (int64_t i = 0; i < m; i++)
            out[q * ldo + i] = pp__dot(a + q * n, b[i], n);
}

static void wsum_portable(float *y, const float *w, int64_t ldw, int64_t g,
                          const float *const *x, int64_t m, int64_t n)
{
    for (int64_t q = 0; q < g; q++)
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++)
                y[q * n + j] = fmaf(w[q * ldw + i], x[i][j], y[q * n + j]);
}

static void exp_shift_portable(float *x, float shift, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = pp__expf(x[i] - shift);
}

static float scale_max_portable(float *x, float scale, int64_t n)
{
    return pp__scale_max_finish(NULL, 0, x, scale, 0, n);
}

static void scale_add_portable(float *y, float a, const float *x, float b, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] = y[i] * a + x[i] * b;
}

static void swiglu_portable(float *out, const float *gate, const float *up, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        out[i] = pp__swiglu1(gate[i], up[i]);
}

static void f16_portable(float *dst, const void *src, int64_t n)
{
    pp_row_to_f32(dst, src, PP_DTYPE_F16, n);
}

static void bf16_portable(float *dst, const void *src, int64_t n)
{
    pp_row_to_f32(dst, src, PP_DTYPE_BF16, n);
}

static const struct pp_simd portable = {
    "portable",         matmul_rows_portable, dot_portable,       dots_portable,
    wsum_portable,      exp_shift_portable,   scale_max_portable, scale_add_portable,
    swiglu_portable,    f16_portable,         bf16_portable,      pp__q8_act_portable,
    pp__mm_q8_portable, NULL,                 PP_MM_DIRECT_ROWS_MAX_TOKENS,
    PP_MM_DIRECT_ROWS_MAX_TOKENS};

const struct pp_simd *pp_simd_portable(void)
{
    return &portable;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>

/* F16C from CPUID leaf 1 (ECX bit 29): not every compiler's __builtin_cpu_supports knows it. The
 * AVX2 check below already covers the OS saving the ymm registers. */
static int has_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c >> 29 & 1);
}
#endif

/* The tables by level, narrowest first. */
static const char *const table_names[] = {"portable", "avx2", "avx512"};

/* The table of one level if this CPU and build can run it, else NULL. */
static const struct pp_simd *table_if_supported(int level)
{
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
    if (level == 2)
        return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                           __builtin_cpu_supports("avx512vl")
                   ? pp__simd_avx512()
                   : NULL;
    if (level == 1)
        return avx2 ? pp__simd_avx2() : NULL;
#endif
    return level == 0 ? &portable : NULL;
}

/* The level named name, or -1. */
static int level_named(const char *name)
{
    for (int level = 0; level < 3; level++)
        if (strcmp(name, table_names[level]) == 0)
            return level;
    return -1;
}

const struct pp_simd *pp_simd_named(const char *name)
{
    int level = level_named(name);
    return level < 0 ? NULL : table_if_supported(level);
}

pp_status pp_simd_check_env(void)
{
    const char *force = getenv("PP_SIMD");
    if (force && *force && level_named(force) < 0)
        return pp_error(PP_ERR_INVALID_ARG,
                        "PP_SIMD: expected portable, avx2 or avx512, got \"%s\"", force);
    const char *pf = getenv("PP_PREFETCH");
    if (pf && *pf && strcmp(pf, "l1") != 0 && strcmp(pf, "l2") != 0)
        return pp_error(PP_ERR_INVALID_ARG, "PP_PREFETCH: expected l1 or l2, got \"%s\"", pf);
    return PP_OK;
}

int pp_simd_prefetch_l2(void)
{
    const char *pf = getenv("PP_PREFETCH");
    if (pf && *pf)
        return strcmp(pf, "l2") == 0;
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    return __builtin_cpu_is("amd") && __builtin_cpu_supports("avx512f");
#else
    return 0;
#endif
}

int pp_simd_amd_tiles(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    return __builtin_cpu_is("amd");
#else
    return 0;
#endif
}

int pp_simd_q8_pairs_here(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    return !__builtin_cpu_is("amd");
#else
    return 1;
#endif
}

pp_q8_pairs_fn pp_simd_q8_pairs(const struct pp_simd *s)
{
    return pp_simd_q8_pairs_here() ? s->q8_pairs : NULL;
}

const struct pp_simd *pp_simd_get(void)
{
    const char *force = getenv("PP_SIMD");
    int top = force && *force ? level_named(force) : -1;
    for (int level = top < 0 ? 2 : top; level > 0; level--) {
        const struct pp_simd *t = table_if_supported(level);
        if (t)
            return t;
    }
    return &portable;
}
