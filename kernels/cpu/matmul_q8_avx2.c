/* The Q8_0 integer matmul (kernels/cpu/matmul_q8.h) with AVX2 dot products: vpmaddubsw sums the
 * products of byte pairs into int16 (exact, as |w| ≤ 128 and |x| ≤ 127), vpmaddwd the int16 pairs
 * into int32. Also the AVX2 quantization of the activations, which both x86 tables use. */
#include "kernels/cpu/matmul_q8.h"

#if defined(__x86_64__) && defined(__GNUC__)

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

#include <float.h>
#include <math.h>

#define Q8_BIAS 0
#define Q8_DOT(aw, xs) _mm256_madd_epi16(_mm256_maddubs_epi16(aw, xs), _mm256_set1_epi16(1))
/* One or two tokens take 4 rows (4 or 8 accumulators), three tokens 2 (6 of the 16 registers).
 * 4 rows for one and two tokens instead of 2: pp_bench_loops (one thread, in cache), two rounds,
 * GB/s, 1 token 33.6, 34.5 → 37.4, 37.1; 2 tokens 17.9, 18.3 → 19.6, 20.8; 3 tokens 12.8, 12.9
 * → 12.5, 12.3 (so three keep 2). pp_bench --dtypes q8_0 --decode 32, the builds in turn, six
 * rounds (the last three as committed), decode beside the bandwidth 90.5, 90.7, 78.1, 77.1, 89.9,
 * 79.3% → 94.4, 96.3, 92.0, 95.8, 95.8, 92.5% (Zen 3; docs/benchmarks.md). */
#define Q8_STREAMS_ONE 4
#define Q8_STREAMS_THREE 2
#define Q8_TOKENS 2
#define Q8_SPLIT_MIN_TOKENS PP_Q8_SPLIT_MIN_TOKENS_AVX2
#include "kernels/cpu/matmul_q8_x86.h"

/* pp__q8_act_block on eight lanes: the same comparisons, the same two divisions in scalar, the
 * product x · (1/d) and its rounding to nearest even (vcvtps2dq under the default MXCSR). */
void pp__q8_act_avx2(int8_t *q, float *d, const float *x, int64_t cols)
{
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 big = _mm256_set1_ps(FLT_MAX);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t b = 0; b < cols / PP_Q8_0_BLOCK; b++) {
        const float *xb = x + b * PP_Q8_0_BLOCK;
        int8_t *qb = q + b * PP_Q8_0_BLOCK;
        __m256 v[4], m = _mm256_setzero_ps(), fin = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
        for (int i = 0; i < 4; i++) {
            v[i] = _mm256_loadu_ps(xb + 8 * i);
            __m256 a = _mm256_and_ps(v[i], absmask);
            fin = _mm256_and_ps(fin, _mm256_cmp_ps(a, big, _CMP_LE_OQ));
            m = _mm256_max_ps(m, a);
        }
        if (_mm256_movemask_ps(fin) != 0xff) {
            memset(qb, 0, PP_Q8_0_BLOCK);
            d[b] = NAN;
            continue;
        }
        m = _mm256_max_ps(m, _mm256_permute2f128_ps(m, m, 1));
        m = _mm256_max_ps(m, _mm256_shuffle_ps(m, m, 0x4e));
        m = _mm256_max_ps(m, _mm256_shuffle_ps(m, m, 0xb1));
        float db = _mm256_cvtss_f32(m) / 127.0f;
        if (!(db >= FLT_MIN)) {
            memset(qb, 0, PP_Q8_0_BLOCK);
            d[b] = 0.0f;
            continue;
        }
        d[b] = db;
        __m256 id = _mm256_set1_ps(1.0f / db);
        __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v[0], id));
        __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v[1], id));
        __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v[2], id));
        __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v[3], id));
        /* two in-lane packs leave the four-byte groups as i0 i1 i2 i3 of each 128-bit half */
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
        _mm256_storeu_si256((__m256i *)qb, _mm256_permutevar8x32_epi32(p, order));
    }
}

void pp__mm_q8_avx2(const struct pp_mm_args *a, int64_t r0, int64_t r1,
                    const struct pp_mm_scratch *s)
{
    q8_rows(a, r0, r1, s);
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif
