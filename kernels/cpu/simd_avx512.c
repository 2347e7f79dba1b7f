/* AVX-512 inner loops of the CPU backend, for CPUs that have AVX-512F, DQ and VL besides AVX2, FMA
 * and F16C. A zmm register holds two output elements' eight lanes side by side, two rows of one
 * token, so each lane keeps the canonical chain of pp__dot (kernels/cpu/cpu-impl.h): the
 * arithmetic and its order are those of the AVX2 loops, only twice as many chains advance per
 * instruction. The many-token micro-kernel is 6 rows × 8 tokens (24 zmm accumulators) over the
 * packed f32 panels of the AVX2 nest. The few-token nest is the AVX2 one
 * (kernels/cpu/simd_x86_direct.h), built here with 32 ymm registers so that its tiles over 2-20
 * tokens read two row groups at once; the other loops are the AVX2 ones. */
#include "kernels/cpu/simd.h"

#if defined(__x86_64__) && defined(__GNUC__)

#if defined(__clang__)
#pragma clang attribute push(                                                                     \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512dq,avx512vl"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512dq,avx512vl")
#endif

#include <immintrin.h>
#include <pthread.h>

#include "kernels/cpu/row_groups.h"
#include "kernels/cpu/simd_x86.h"
#include "kernels/cpu/simd_x86_direct.h"

/* Rows (in pairs, one zmm each) and tokens of the micro-tile: 3 × 8 accumulators + 3 weight
 * registers + one activation register of the 32. Each step loads 3 weight vectors and broadcasts
 * 8 activation vectors for 24 FMAs. */
#define MP 3
#define MR (2 * MP)
#define NR PP_MM_NR_MAX
_Static_assert(MR % PP_ROW_GROUP == 0, "a micro-panel is whole row groups");
_Static_assert(PP_MM_MC_AVX512 % MR == 0 && PP_MM_MC_AVX512 <= PP_MM_PANEL_ROWS,
               "a panel is whole micro-panels and fits the panel scratch");
_Static_assert(PP_MM_ACC_CAP / (PP_MM_NC_AVX512 * 8) >= MR, "a super-block holds a micro-panel");

/* Eight floats at p, in both halves of a zmm. */
AI __m512 dup8(const float *p)
{
    return _mm512_broadcast_f32x8(_mm256_loadu_ps(p));
}

/* pp__merge8 of both halves at once, in the same order, ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)):
 * the low half's result in lane 0, the high half's in lane 2. */
AI __m128 merge8x2(__m512 v)
{
    __m512 s = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(2, 3, 0, 1)));
    __m512 t = _mm512_add_ps(s, _mm512_shuffle_ps(s, s, _MM_SHUFFLE(3, 2, 3, 2)));
    __m512 u = _mm512_add_ps(t, _mm512_shuffle_ps(t, t, _MM_SHUFFLE(1, 1, 1, 1)));
    /* lane 0 and lane 8 into lanes 0 and 2 */
    const __m512i idx = _mm512_setr_epi32(0, 1, 8, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_castps512_ps128(_mm512_permutexvar_ps(idx, u));
}

/* MR rows × NT tokens over one chunk; accumulator (pair q, token j) holds rows 2q (low half) and
 * 2q + 1 (high half), whose lane sums sit side by side in the acc scratch. */
AI void micro(const struct pp_mm_tile *m, int NT)
{
    __m512 acc[MP][NR];
    _Pragma("GCC unroll 3")
    for (int q = 0; q < MP; q++)
        _Pragma("GCC unroll 8")
        for (int j = 0; j < NT; j++)
            acc[q][j] = m->first ? _mm512_setzero_ps()
                                 : _mm512_loadu_ps(m->acc + j * m->lda + q * 16);
    const float *pp = m->pp;
    const float *xs[NR];
    _Pragma("GCC unroll 8")
    for (int j = 0; j < NR; j++)
        xs[j] = m->x + (j < NT ? j : 0) * m->ldx;
    for (int64_t k = 0; k < m->full; k += 8, pp += MR * 8) {
        __m512 w[MP];
        _Pragma("GCC unroll 3")
        for (int q = 0; q < MP; q++)
            w[q] = _mm512_loadu_ps(pp + q * 16);
        _Pragma("GCC unroll 8")
        for (int j = 0; j < NT; j++) {
            __m512 xv = dup8(xs[j] + k);
            _Pragma("GCC unroll 3")
            for (int q = 0; q < MP; q++)
                acc[q][j] = _mm512_fmadd_ps(w[q], xv, acc[q][j]);
        }
    }
    if (m->rem) {
        __m256i mk = pp__tail_mask_avx(m->rem);
        _Pragma("GCC unroll 8")
        for (int j = 0; j < NT; j++) {
            __m512 xv = _mm512_broadcast_f32x8(_mm256_maskload_ps(xs[j] + m->full, mk));
            _Pragma("GCC unroll 3")
            for (int q = 0; q < MP; q++)
                acc[q][j] = _mm512_fmadd_ps(_mm512_loadu_ps(pp + q * 16), xv, acc[q][j]);
        }
    }
    if (m->last) {
        /* constant indices only: a variable one would put the accumulators in memory */
        _Pragma("GCC unroll 3")
        for (int q = 0; q < MP; q++)
            _Pragma("GCC unroll 8")
            for (int j = 0; j < NT; j++) {
                __m128 v = merge8x2(acc[q][j]);
                if (2 * q < m->rows)
                    m->y[j * m->ldy + 2 * q] = _mm_cvtss_f32(v);
                if (2 * q + 1 < m->rows)
                    m->y[j * m->ldy + 2 * q + 1] = _mm_cvtss_f32(_mm_movehl_ps(v, v));
            }
    } else {
        _Pragma("GCC unroll 3")
        for (int q = 0; q < MP; q++)
            _Pragma("GCC unroll 8")
            for (int j = 0; j < NT; j++)
                _mm512_storeu_ps(m->acc + j * m->lda + q * 16, acc[q][j]);
    }
}

#define MICRO(nt)                                                                                  \
    __attribute__((noinline)) static void micro##nt(const struct pp_mm_tile *m)                    \
    {                                                                                              \
        micro(m, nt);                                                                              \
    }
MICRO(1)
MICRO(2)
MICRO(3)
MICRO(4)
MICRO(5)
MICRO(6)
MICRO(7)
MICRO(8)

static const struct pp_mm_micro micro_avx512 = {
    MR, NR, PP_MM_MC_AVX512, PP_MM_NC_AVX512,
    {NULL, micro1, micro2, micro3, micro4, micro5, micro6, micro7, micro8}};

/* Few-token tiles over weights in row groups: 6 rows (two groups, so two streams of weights) for 2
 * to 20 tokens in tiles of up to 4, which AVX-512VL's 32 ymm registers hold (24 accumulators, 6
 * weights, 1 activation); the 1-3 row tiles take the rows left over. One thread, f16, from memory
 * (pp_bench_matmul --tokens 1,2,3,4,6,8,12,16,20, PP_SIMD=avx2 and avx512 in alternation, two
 * rounds), GB/s with the AVX2 tiles (one group, one stream) against these: 2 tokens 12.7-12.8 →
 * 15.1-15.5, 3: 12.5-12.7 → 14.4-14.5, 4: 12.2 → 14.4, 6: 8.1 → 9.1, 8: 7.1-7.2 → 8.3-8.5, 20:
 * 3.5 → 3.8. One token takes the AVX2 nest (its 6-row tile built here ran 15.5-15.7 against
 * 16.5-17.1: GCC keeps integer values in vector registers in its loop), and so does Q8_0, whose
 * conversion is the bound (6-row tiles: 7.6 against 9.3 GB/s at 2 tokens, 6.6 against 7.1 at 4). */
#define DTILE_DT(name, dt)                                                                         \
    DTILE_MR(name, dt, 1) DTILE_MR(name, dt, 2) DTILE_MR(name, dt, 3) DTILE_MR(name, dt, 6)
DTILE_DT(f32, PP_DTYPE_F32)
DTILE_DT(f16, PP_DTYPE_F16)
DTILE_DT(bf16, PP_DTYPE_BF16)
#define DTILE_TABLE(name)                                                                          \
    {{NULL, NULL, NULL, NULL, NULL}, DTILE_ROW(name, 1), DTILE_ROW(name, 2), DTILE_ROW(name, 3),  \
     {NULL, NULL, NULL, NULL, NULL}, {NULL, NULL, NULL, NULL, NULL}, DTILE_ROW(name, 6)}
static const dtile_fn dtiles[4][7][5] = {DTILE_TABLE(f32), DTILE_TABLE(f16), DTILE_TABLE(bf16)};

static void matmul_rows_avx512(const struct pp_mm_args *a, int64_t r0, int64_t r1,
                               const struct pp_mm_scratch *s)
{
    if (a->grouped && a->n >= 2 && a->n <= PP_MM_DIRECT_MAX_TOKENS && a->dtype != PP_DTYPE_Q8_0)
        pp__mm_direct(a, r0, r1, s, dtiles, PP_MM_DIRECT_MAX_TOKENS);
    else if (a->n <= PP_MM_DIRECT_MAX_TOKENS)
        pp__mm_direct_avx2(a, r0, r1, s);
    else
        pp__mm_packed_avx2(a, r0, r1, s, &micro_avx512);
}

static struct pp_simd avx512;
static pthread_once_t avx512_once = PTHREAD_ONCE_INIT;

/* The AVX2 table with this file's matmul. */
static void avx512_init(void)
{
    avx512 = *pp__simd_avx2();
    avx512.name = "avx512";
    avx512.matmul_rows = matmul_rows_avx512;
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

const struct pp_simd *pp__simd_avx512(void)
{
    if (!pp__simd_avx2())
        return 0;
    pthread_once(&avx512_once, avx512_init);
    return &avx512;
}

#else

const struct pp_simd *pp__simd_avx512(void)
{
    return 0;
}

#endif
