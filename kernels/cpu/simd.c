/* Run-time selection between the AVX2/F16C inner loops and portable C. */
#include "kernels/cpu/simd.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu-impl.h"

static void dot_rows_portable(float *y, const float *w, const float *x, int64_t ld, int64_t n,
                              int64_t nt)
{
    for (int64_t t = 0; t < nt; t++)
        y[t] = pp__dot(w, x + t * ld, n);
}

static void f16_portable(float *dst, const void *src, int64_t n)
{
    pp_row_to_f32(dst, src, PP_DTYPE_F16, n);
}

static void bf16_portable(float *dst, const void *src, int64_t n)
{
    pp_row_to_f32(dst, src, PP_DTYPE_BF16, n);
}

static const struct pp_simd portable = {"portable", dot_rows_portable, f16_portable, bf16_portable};

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,f16c")))

/* The fixed merge of pp__dot over the eight lanes of acc plus the tail elements. */
AVX2 static inline float finish(__m256 acc, const float *a, const float *b, int64_t i, int64_t n)
{
    float l[8];
    _mm256_storeu_ps(l, acc);
    for (int j = 0; i + j < n; j++)
        l[j] += a[i + j] * b[i + j];
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

/* Four tokens at a time share each load of w; each token keeps its own accumulator chain. */
AVX2 static void dot_rows_avx2(float *y, const float *w, const float *x, int64_t ld, int64_t n,
                               int64_t nt)
{
    int64_t t = 0;
    for (; t + 4 <= nt; t += 4) {
        const float *x0 = x + t * ld, *x1 = x0 + ld, *x2 = x1 + ld, *x3 = x2 + ld;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        int64_t i = 0;
        for (; i + 8 <= n; i += 8) {
            __m256 wv = _mm256_loadu_ps(w + i);
            a0 = _mm256_add_ps(a0, _mm256_mul_ps(wv, _mm256_loadu_ps(x0 + i)));
            a1 = _mm256_add_ps(a1, _mm256_mul_ps(wv, _mm256_loadu_ps(x1 + i)));
            a2 = _mm256_add_ps(a2, _mm256_mul_ps(wv, _mm256_loadu_ps(x2 + i)));
            a3 = _mm256_add_ps(a3, _mm256_mul_ps(wv, _mm256_loadu_ps(x3 + i)));
        }
        y[t] = finish(a0, w, x0, i, n);
        y[t + 1] = finish(a1, w, x1, i, n);
        y[t + 2] = finish(a2, w, x2, i, n);
        y[t + 3] = finish(a3, w, x3, i, n);
    }
    for (; t < nt; t++) {
        const float *x0 = x + t * ld;
        __m256 a0 = _mm256_setzero_ps();
        int64_t i = 0;
        for (; i + 8 <= n; i += 8)
            a0 = _mm256_add_ps(a0, _mm256_mul_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x0 + i)));
        y[t] = finish(a0, w, x0, i, n);
    }
}

AVX2 static void f16_avx2(float *dst, const void *src, int64_t n)
{
    const uint16_t *s = src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
    for (; i < n; i++)
        dst[i] = pp_f16_to_f32(s[i]);
}

AVX2 static void bf16_avx2(float *dst, const void *src, int64_t n)
{
    const uint16_t *s = src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(s + i)));
        _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
    }
    for (; i < n; i++)
        dst[i] = pp_bf16_to_f32(s[i]);
}

static const struct pp_simd avx2 = {"avx2", dot_rows_avx2, f16_avx2, bf16_avx2};
#endif

const struct pp_simd *pp_simd_portable(void)
{
    return &portable;
}

const struct pp_simd *pp_simd_get(void)
{
    const char *force = getenv("PP_SIMD");
    if (force && strcmp(force, "portable") == 0)
        return &portable;
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c"))
        return &avx2;
#endif
    return &portable;
}
