/* AVX-512 inner loops of the CPU backend, for CPUs that have AVX-512F, DQ and VL besides AVX2, FMA
 * and F16C. A zmm register holds two output elements' eight lanes side by side, two rows of one
 * token, so each lane keeps the canonical chain of pp__dot (kernels/cpu/cpu-impl.h): the
 * arithmetic and its order are those of the AVX2 loops, only twice as many chains advance per
 * instruction. The many-token micro-kernel is 6 rows × 8 tokens (24 zmm accumulators) over the
 * packed f32 panels of the AVX2 nest. The few-token nest is the AVX2 one
 * (kernels/cpu/simd_x86_direct.h) built here, with a 6-row tile of zmm row pairs that reads two row
 * groups at once for 1-32 tokens, and the same tile over four groups (12 rows) for 1-4 tokens of
 * f32, f16 and bf16; the other loops (and weights not in row groups) are the AVX2 ones, but for
 * the many-token nest's packer (pack_avx512) and attention's dots and wsum, which take a KV head's
 * queries four at a time in zmm. Q8_0 runs in integers, with VNNI where the CPU has it
 * (kernels/cpu/matmul_q8.h). */
#include "kernels/cpu/simd.h"

#if defined(__x86_64__) && defined(__GNUC__)

#if defined(__clang__)
#pragma clang attribute push(                                                                     \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512dq,avx512vl"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512dq,avx512vl")
#endif

#include <assert.h>
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "kernels/cpu/matmul_q8.h"
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

static void pack_avx512(float *panel, const struct pp_mm_args *a, int64_t r, int64_t mc,
                        int64_t k0, int64_t kl, int mr);

/* Without the nest's prefetch of the next tile's partial sums: pp_bench_matmul at 128 tokens on
 * the Xeon host, 2 threads, four rounds, f16 293.8-326.3 GFLOP/s against 286.4-306.2 with it. */
static const struct pp_mm_micro micro_avx512 = {
    MR, NR, PP_MM_MC_AVX512, PP_MM_NC_AVX512,
    {NULL, micro1, micro2, micro3, micro4, micro5, micro6, micro7, micro8}, 0, pack_avx512};

/* --- few tokens: two row groups in zmm pairs ------------------------------------------------- */

/* Sixteen f16 or bf16 weights as f32. */
AI __m512 cvt16(__m256i h, enum pp_dtype dt)
{
    if (dt == PP_DTYPE_F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* Eight weights of each of two rows as one zmm, the unit at lo in the low half and the unit at hi
 * in the high half. */
AI __m512 ld_pair(const char *lo, const char *hi, enum pp_dtype dt)
{
    if (dt == PP_DTYPE_F32)
        return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps((const float *)lo)),
                                  _mm256_loadu_ps((const float *)hi), 1);
    __m128i l = _mm_loadu_si128((const __m128i *)lo);
    return cvt16(_mm256_inserti128_si256(_mm256_castsi128_si256(l),
                                         _mm_loadu_si128((const __m128i *)hi), 1),
                 dt);
}

/* The same for two rows whose units are adjacent (row lo's unit then row hi's, at p). */
AI __m512 ld_pair_run(const char *p, enum pp_dtype dt)
{
    if (dt == PP_DTYPE_F32)
        return _mm512_loadu_ps((const float *)p);
    return cvt16(_mm256_loadu_si256((const __m256i *)p), dt);
}

/* Two 8-lane vectors as the halves of one zmm, and back. */
AI __m512 join8(const float *lo, const float *hi)
{
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(lo)), _mm256_loadu_ps(hi), 1);
}

AI void split8(float *lo, float *hi, __m512 v)
{
    _mm256_storeu_ps(lo, _mm512_castps512_ps256(v));
    _mm256_storeu_ps(hi, _mm512_extractf32x8_ps(v, 1));
}

/* A zmm tile's start: its tokens' activations, and the lane sums of its NP row pairs from zero
 * (the first block) or from scratch. */
AI void ztile_start(const struct dtile *m, const float **xp, __m512 (*acc)[DTILE_NT_MAX], int NT,
                    int NP)
{
    _Pragma("GCC unroll 8")
    for (int j = 0; j < NT; j++)
        xp[j] = m->x + j * m->ldx;
    _Pragma("GCC unroll 6")
    for (int q = 0; q < NP; q++)
        _Pragma("GCC unroll 8")
        for (int j = 0; j < NT; j++)
            acc[q][j] = m->first ? _mm512_setzero_ps()
                                 : join8(m->acc + dtile_row(m, 2 * q) * m->lda + j * 8,
                                         m->acc + dtile_row(m, 2 * q + 1) * m->lda + j * 8);
}

/* A zmm tile's end: merged into y (the last block) or its lane sums back to scratch. */
AI void ztile_finish(const struct dtile *m, __m512 (*acc)[DTILE_NT_MAX], int NT, int NP)
{
    _Pragma("GCC unroll 6")
    for (int q = 0; q < NP; q++)
        _Pragma("GCC unroll 8")
        for (int j = 0; j < NT; j++) {
            if (m->last) {
                __m128 v = merge8x2(acc[q][j]);
                m->y[j * m->ldy + dtile_row(m, 2 * q)] = _mm_cvtss_f32(v);
                m->y[j * m->ldy + dtile_row(m, 2 * q + 1)] = _mm_cvtss_f32(_mm_movehl_ps(v, v));
            } else
                split8(m->acc + dtile_row(m, 2 * q) * m->lda + j * 8,
                       m->acc + dtile_row(m, 2 * q + 1) * m->lda + j * 8, acc[q][j]);
        }
}

/* One 8-element step of ztile_run at wk (the first group's units of the step). */
AI void ztile_step(__m512 (*acc)[DTILE_NT_MAX], const char *wk, int64_t go, int64_t ub,
                   const float *const *xp, int64_t k, enum pp_dtype dt, int NT, int NP)
{
    __m512 w[6];
    _Pragma("GCC unroll 2")
    for (int h = 0; h < NP / 3; h++) {
        const char *a = wk + 2 * h * go, *b = a + go;
        w[3 * h] = ld_pair_run(a, dt);
        w[3 * h + 1] = ld_pair(a + 2 * ub, b, dt);
        w[3 * h + 2] = ld_pair_run(b + ub, dt);
    }
    _Pragma("GCC unroll 8")
    for (int j = 0; j < NT; j++) {
        __m512 xv = dup8(xp[j] + k);
        _Pragma("GCC unroll 6")
        for (int q = 0; q < NP; q++)
            acc[q][j] = _mm512_fmadd_ps(w[q], xv, acc[q][j]);
    }
}

/* The few-token tile of NP row pairs × NT tokens over f32, f16 or bf16 weights in row groups:
 * NP = 3 for two whole groups (A, and B = A + grp_off), NP = 6 for four (A to D, each grp_off
 * after the one before). Each pair is one zmm whose halves are the eight lanes of its two rows,
 * so that one conversion and one FMA serve two rows; of two groups X, Y, pairs (0,1) and (4,5)
 * are adjacent units of one group and (2,3) is X's row 2 with Y's row 0. Four groups read four
 * streams of weights, and each activation vector loaded serves six pairs instead of three: on two
 * threads at 2-4 tokens they streamed 0-5% faster than two, 3-4% in most rounds (Xeon host), and
 * at one token on the Zen 4 host, one thread, f16 23% and bf16 13-18% faster than the AVX2 nest
 * (docs/benchmarks.md). Every lane runs the same chain as in dtile_run
 * (kernels/cpu/simd_x86_direct.h). */
AI void ztile_run(const struct dtile *m, enum pp_dtype dt, int NT, int NP)
{
    const float *xp[DTILE_NT_MAX];
    __m512 acc[6][DTILE_NT_MAX];
    int64_t us = m->g.unit_stride, ub = m->g.row_off, go = m->grp_off;
    ztile_start(m, xp, acc, NT, NP);
    int64_t k = m->k0, kend = m->k0 + m->full;
    const char *wk = m->w + k / 8 * us;
    for (; k + 32 <= kend; k += 32, wk += 4 * us) {
        if (m->pf)
            dtile_prefetch(m, wk, dt, 2 * NP);
        _Pragma("GCC unroll 4")
        for (int s = 0; s < 4; s++)
            ztile_step(acc, wk + s * us, go, ub, xp, k + s * 8, dt, NT, NP);
    }
    for (; k < kend; k += 8, wk += us)
        ztile_step(acc, wk, go, ub, xp, k, dt, NT, NP);
    if (m->rem) {
        __m256 t[12];
        _Pragma("GCC unroll 12")
        for (int i = 0; i < 2 * NP; i++)
            t[i] = ld_w_tail(m->w + kend / 8 * us + i / 3 * go + i % 3 * m->g.tail_off, dt,
                             m->rem);
        __m512 w[6];
        _Pragma("GCC unroll 6")
        for (int q = 0; q < NP; q++)
            w[q] = _mm512_insertf32x8(_mm512_castps256_ps512(t[2 * q]), t[2 * q + 1], 1);
        __m256i mk = pp__tail_mask_avx(m->rem);
        _Pragma("GCC unroll 8")
        for (int j = 0; j < NT; j++) {
            __m512 xv = _mm512_broadcast_f32x8(_mm256_maskload_ps(xp[j] + kend, mk));
            _Pragma("GCC unroll 6")
            for (int q = 0; q < NP; q++)
                acc[q][j] = _mm512_fmadd_ps(w[q], xv, acc[q][j]);
        }
    }
    ztile_finish(m, acc, NT, NP);
}

#define ZTILE(name, dt, nt)                                                                        \
    __attribute__((noinline)) static void ztile_##name##_##nt(const struct dtile *m)              \
    {                                                                                              \
        ztile_run(m, dt, nt, 3);                                                                   \
    }
/* tiles of up to 8 tokens (24 accumulators), as even as possible */
#define ZTILE_DT(name, dt)                                                                         \
    ZTILE(name, dt, 1) ZTILE(name, dt, 2) ZTILE(name, dt, 3) ZTILE(name, dt, 4)                    \
    ZTILE(name, dt, 5) ZTILE(name, dt, 6) ZTILE(name, dt, 7) ZTILE(name, dt, 8)
/* the four-group tiles (12 rows) of f32, f16 and bf16 */
#define ZQUAD(name, dt, nt)                                                                        \
    __attribute__((noinline)) static void zquad_##name##_##nt(const struct dtile *m)              \
    {                                                                                              \
        ztile_run(m, dt, nt, 6);                                                                   \
    }
#define ZQUAD_DT(name, dt)                                                                         \
    ZQUAD(name, dt, 1) ZQUAD(name, dt, 2) ZQUAD(name, dt, 3) ZQUAD(name, dt, 4)
ZQUAD_DT(f32, PP_DTYPE_F32)
ZQUAD_DT(f16, PP_DTYPE_F16)
ZQUAD_DT(bf16, PP_DTYPE_BF16)
#define ZQUAD_ROW(name)                                                                            \
    {NULL, zquad_##name##_1, zquad_##name##_2, zquad_##name##_3, zquad_##name##_4}
/* [dtype][NT] */
static const dtile_fn zquads[4][5] = {ZQUAD_ROW(f32), ZQUAD_ROW(f16), ZQUAD_ROW(bf16),
                                      {NULL, NULL, NULL, NULL, NULL}};

/* Few-token tiles over weights in row groups: two whole groups (6 rows, two streams of weights) as
 * zmm pairs (ztile_run) for 1 to 32 tokens in tiles of up to 8 (24 accumulators: a weight
 * vector's load and conversion serve twice as many FMAs as in tiles of up to 4, and 5-8 tokens
 * read the weights in one pass; pp_bench_loops, one thread, old and new at once on the two CPUs
 * and swapped, two rounds, f16 GB/s at 5 tokens 17.8-17.9 → 22.2-22.5, 8: 14.0-14.1 → 15.6-15.7,
 * 20: 6.0-6.2 → 6.8-7.1; pp_bench_matmul, two threads, f16 GFLOP/s at 8 tokens 145.0-148.7 →
 * 174.8-181.1; pp_bench, decode of 8 sequences together 69.5-71.2 → 87.2-88.3 tok/s:
 * docs/benchmarks.md); the 1-3 row ymm tiles of the shared nest take the rows left over. With
 * tiles of up to 4 tokens, one thread from memory (pp_bench_matmul --dtypes
 * f16,bf16,f32 --tokens 1,2,3,4,6,8,12,20, PP_SIMD=avx2 and avx512 in alternation, two rounds),
 * GB/s with the AVX2 tiles (3 rows, one stream) against these, f16: 2 tokens 12.3-13.5 →
 * 15.6-15.9, 4: 12.2-12.3 → 15.7-15.8, 8: 7.2 → 9.9, 20: 3.5 → 4.8; bf16 at 4: 12.1-12.3 → 15.3;
 * f32 at 4: 12.6-13.0 → 15.4-15.6. With its weights in L2 (--row-div 64) f16 at 4 tokens runs
 * 26.0 GB/s against 21.1. The same nest with 6-row ymm tiles (24 ymm accumulators) gave 14.4 at 4
 * tokens. One token of f32, f16 or bf16 took the AVX2 nest (on the Xeon host the two-group zmm
 * tile streamed 15.6-16.0 GB/s against its 16.6-16.9 on one thread) until the four-group tile
 * (zquads) outran both on the Zen 4 host: one thread, one token, f16 22.9-23.8 GB/s (AVX2 nest),
 * 24.9-25.2 (two groups), 28.2-29.3 (four); bf16 22.1-23.4, 25.0-25.4, 25.1-27.7; alternated in
 * one sitting (docs/benchmarks.md); our reading is that four streams keep more weights in flight
 * per core (eight groups gained nothing more). Q8_0 took the zmm pairs too, with its int8
 * converted to f32 and scaled in registers, until it ran in integers (kernels/cpu/matmul_q8.h):
 * that conversion bounded a core at 18-19 GB/s with its weights in L2 (docs/benchmarks.md). */
#define DTILE_DT(name, dt)                                                                         \
    DTILE_MR(name, dt, 1) DTILE_MR(name, dt, 2) DTILE_MR(name, dt, 3) ZTILE_DT(name, dt)
DTILE_DT(f32, PP_DTYPE_F32)
DTILE_DT(f16, PP_DTYPE_F16)
DTILE_DT(bf16, PP_DTYPE_BF16)
#define DTILE_TABLE(name)                                                                          \
    {{NULL, NULL, NULL, NULL, NULL}, DTILE_ROW(name, 1), DTILE_ROW(name, 2), DTILE_ROW(name, 3),  \
     {NULL, NULL, NULL, NULL, NULL}, {NULL, NULL, NULL, NULL, NULL},                               \
     {NULL, ztile_##name##_1, ztile_##name##_2, ztile_##name##_3, ztile_##name##_4,              \
      ztile_##name##_5, ztile_##name##_6, ztile_##name##_7, ztile_##name##_8}}
/* [dtype][MR][NT]; Q8_0 runs in integers (kernels/cpu/matmul_q8.h) */
static const dtile_fn dtiles[4][7][DTILE_NT_MAX + 1] = {DTILE_TABLE(f32), DTILE_TABLE(f16),
                                                        DTILE_TABLE(bf16)};

static struct pp_simd avx512; /* this file's table, filled in by avx512_init below */

static void matmul_rows_avx512(const struct pp_mm_args *a, int64_t r0, int64_t r1,
                               const struct pp_mm_scratch *s)
{
    /* the table's own limits, as the backend reads them (pp_mm_direct_max_tokens) */
    if (a->n > pp_mm_direct_max_tokens(&avx512, a->grouped, a->amd_tiles))
        pp__mm_packed_avx2(a, r0, r1, s, &micro_avx512);
    else if (a->grouped)
        pp__mm_direct(a, r0, r1, s, dtiles, PP_MM_DIRECT_MAX_TOKENS, zquads,
                      PP_MM_FOUR_GROUPS_MAX_TOKENS, a->prefetch_l2, 0);
    else
        pp__mm_direct_avx2(a, r0, r1, s);
}

/* --- many tokens: the packer ------------------------------------------------------------------ */

/* One step (eight elements of six rows: two row groups) of a micro-panel as three zmm of two rows
 * each, from group A's three adjacent units at ua and group B's at ub. */
AI void pack_step(float *d, const char *ua, const char *ub, enum pp_dtype dt)
{
    if (dt == PP_DTYPE_F32) {
        _mm512_storeu_ps(d, _mm512_loadu_ps((const float *)ua));
        _mm512_storeu_ps(d + 16, join8((const float *)ua + 16, (const float *)ub));
        _mm512_storeu_ps(d + 32, _mm512_loadu_ps((const float *)ub + 8));
        return;
    }
    __m256i mid = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(ua + 32))),
        _mm_loadu_si128((const __m128i *)ub), 1);
    _mm512_storeu_ps(d, cvt16(_mm256_loadu_si256((const __m256i *)ua), dt));
    _mm512_storeu_ps(d + 16, cvt16(mid, dt));
    _mm512_storeu_ps(d + 32, cvt16(_mm256_loadu_si256((const __m256i *)(ub + 16)), dt));
}

/* Rows [r, r + mc) (whole micro-panels of two row groups) × elements [k0, k0 + kl) into the
 * panel, step by step (pack_step), a short last step through ld_w_tail as the AVX2 packer. */
AI void pack_groups(float *panel, const struct pp_mm_args *a, int64_t r, int64_t mc, int64_t k0,
                    int64_t kl, enum pp_dtype dt)
{
    struct pp_row_group q = pp__row_group(dt, a->cols, 1, PP_ROW_GROUP);
    int64_t full = kl & ~(int64_t)7, steps = (kl + 7) / 8;
    for (int64_t p = 0; p < mc; p += MR) {
        const char *ga = (const char *)a->w + (r + p) * a->row_bytes;
        const char *gb = ga + PP_ROW_GROUP * a->row_bytes;
        const char *ua = ga + k0 / 8 * q.unit_stride, *ub = gb + k0 / 8 * q.unit_stride;
        float *d = panel + p / MR * steps * MR * 8;
        for (int64_t s = 0; s * 8 < full; s++, ua += q.unit_stride, ub += q.unit_stride, d += MR * 8)
            pack_step(d, ua, ub, dt);
        if (full < kl) {
            const char *t = (const char *)a->w + (k0 + full) / 8 * q.unit_stride;
            for (int i = 0; i < MR; i++)
                _mm256_storeu_ps(d + i * 8,
                                 ld_w_tail(t + (r + p + i / 3 * 3) * a->row_bytes +
                                               i % 3 * q.tail_off,
                                           dt, kl - full));
        }
    }
}

/* The many-token nest's panels from weights in row groups, whole micro-panels of two groups: each
 * step's 48 weights converted as three zmm and stored as one run (against six ymm conversions and
 * stores in the AVX2 packer); other panels through the AVX2 packer. The same f32 either way. */
static void pack_avx512(float *panel, const struct pp_mm_args *a, int64_t r, int64_t mc,
                        int64_t k0, int64_t kl, int mr)
{
    /* this family's panels; in row groups they start on a group */
    assert(mr == MR && (!a->grouped || r % PP_ROW_GROUP == 0));
    if (!a->grouped || mc % MR != 0) {
        pp__mm_pack_avx2(panel, a, r, mc, k0, kl, mr);
        return;
    }
    if (a->dtype == PP_DTYPE_F32)
        pack_groups(panel, a, r, mc, k0, kl, PP_DTYPE_F32);
    else if (a->dtype == PP_DTYPE_F16)
        pack_groups(panel, a, r, mc, k0, kl, PP_DTYPE_F16);
    else
        pack_groups(panel, a, r, mc, k0, kl, PP_DTYPE_BF16);
}

/* --- attention: the queries of one KV head against a chunk's keys and values ------------------ */

/* Head dims up to this take the zmm tiles below (their queries are repacked on the stack). */
#define ZATTN_MAX_DIM 256

/* The AVX2 table's dots, for what the tiles leave over. */
static pp_dots_fn avx2_dots;

/* pp__merge8 of the 16 halves of eight zmm at once, each in its order. Quarter k of the result,
 * lane i, is the sum of half k % 2 of v[2i + k / 2]: the halves' l_i + l_i+4 first (two vectors
 * per step), then the pairs within each 128-bit quarter, as pp__merge8 adds them. */
AI __m512 merge8x16(const __m512 v[8])
{
    __m512 c[4];
    _Pragma("GCC unroll 4")
    for (int i = 0; i < 4; i++)
        c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    __m512 e0 = _mm512_add_ps(_mm512_shuffle_ps(c[0], c[1], _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_ps(c[0], c[1], _MM_SHUFFLE(3, 2, 3, 2)));
    __m512 e1 = _mm512_add_ps(_mm512_shuffle_ps(c[2], c[3], _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_ps(c[2], c[3], _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm512_add_ps(_mm512_shuffle_ps(e0, e1, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_ps(e0, e1, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* Four queries × eight rows of b: qp holds the queries in pairs, step by step (pair p, step s at
 * qp + (p * steps + s) * 16: query 2p's eight elements, then query 2p + 1's, zero past n), and each
 * key row's eight elements go to both halves, so one FMA advances two queries' chains. Every
 * chain is pp__dot's; out[q * ldo + r] for query q and row r. */
AI void zdots_4x8(float *out, int64_t ldo, const float *qp, int64_t steps, const float *const *b,
                  int64_t n, __m256i mk, const float *const *pf)
{
    __m512 acc[2][8];
    _Pragma("GCC unroll 2")
    for (int p = 0; p < 2; p++)
        _Pragma("GCC unroll 8")
        for (int r = 0; r < 8; r++)
            acc[p][r] = _mm512_setzero_ps();
    const float *rows[8];
    _Pragma("GCC unroll 8")
    for (int r = 0; r < 8; r++)
        rows[r] = b[r];
    const float *q1 = qp + steps * 16;
    int64_t full = n & ~(int64_t)7, s = 0;
    for (int64_t k = 0; k < full; k += 8, s++) {
        __m512 p0 = _mm512_loadu_ps(qp + s * 16), p1 = _mm512_loadu_ps(q1 + s * 16);
        if (pf && (k & 15) == 0) { /* a line of each of the rows pf every other step */
            _Pragma("GCC unroll 8")
            for (int r = 0; r < 8; r++)
                _mm_prefetch((const char *)(pf[r] + k), _MM_HINT_T0);
        }
        _Pragma("GCC unroll 8")
        for (int r = 0; r < 8; r++) {
            __m512 kv = dup8(rows[r] + k);
            acc[0][r] = _mm512_fmadd_ps(p0, kv, acc[0][r]);
            acc[1][r] = _mm512_fmadd_ps(p1, kv, acc[1][r]);
        }
    }
    if (full < n) {
        __m512 p0 = _mm512_loadu_ps(qp + s * 16), p1 = _mm512_loadu_ps(q1 + s * 16);
        _Pragma("GCC unroll 8")
        for (int r = 0; r < 8; r++) {
            __m512 kv = _mm512_broadcast_f32x8(_mm256_maskload_ps(rows[r] + full, mk));
            acc[0][r] = _mm512_fmadd_ps(p0, kv, acc[0][r]);
            acc[1][r] = _mm512_fmadd_ps(p1, kv, acc[1][r]);
        }
    }
    /* rows 0-3, then rows 4-7: quarter k holds query k's four sums */
    _Pragma("GCC unroll 2")
    for (int h = 0; h < 2; h++) {
        const __m512 v[8] = {acc[0][4 * h],     acc[1][4 * h],     acc[0][4 * h + 1],
                             acc[1][4 * h + 1], acc[0][4 * h + 2], acc[1][4 * h + 2],
                             acc[0][4 * h + 3], acc[1][4 * h + 3]};
        __m512 sums = merge8x16(v);
        _mm_storeu_ps(out + 4 * h, _mm512_castps512_ps128(sums));
        _mm_storeu_ps(out + ldo + 4 * h, _mm512_extractf32x4_ps(sums, 1));
        _mm_storeu_ps(out + 2 * ldo + 4 * h, _mm512_extractf32x4_ps(sums, 2));
        _mm_storeu_ps(out + 3 * ldo + 4 * h, _mm512_extractf32x4_ps(sums, 3));
    }
}

/* Queries in fours against rows in eights (zdots_4x8), each key read once per four queries; the
 * rows and queries left over, and head dims past ZATTN_MAX_DIM, through the AVX2 loops. */
static void dots_avx512(float *out, int64_t ldo, const float *a, int64_t g, const float *const *b,
                        int64_t m, int64_t n)
{
    int64_t q = 0, steps = (n + 7) / 8;
    if (n <= ZATTN_MAX_DIM && m >= 8) {
        __m256i mk = pp__tail_mask_avx(n & 7);
        float qp[2 * (ZATTN_MAX_DIM / 8) * 16];
        for (; q + 4 <= g; q += 4) {
            const float *aq = a + q * n;
            for (int64_t p = 0; p < 2; p++)
                for (int64_t s = 0; s < steps; s++) {
                    __m256i ms = s * 8 + 8 <= n ? _mm256_set1_epi32(-1) : mk;
                    _mm512_storeu_ps(qp + (p * steps + s) * 16,
                                     _mm512_insertf32x8(
                                         _mm512_castps256_ps512(_mm256_maskload_ps(
                                             aq + 2 * p * n + s * 8, ms)),
                                         _mm256_maskload_ps(aq + (2 * p + 1) * n + s * 8, ms), 1));
                }
            int64_t i = 0;
            for (; i + 8 <= m; i += 8) {
                int ahead = q == 0 && i + PP_ATTN_KEYS_AHEAD + 8 <= m;
                zdots_4x8(out + q * ldo + i, ldo, qp, steps, b + i, n, mk,
                          ahead ? b + i + PP_ATTN_KEYS_AHEAD : NULL);
            }
            if (i < m)
                avx2_dots(out + q * ldo + i, ldo, aq, 4, b + i, m - i, n);
        }
    }
    if (q < g)
        avx2_dots(out + q * ldo, ldo, a + q * n, g - q, b, m, n);
}

/* NQ queries × NV zmm of y from j (the last one masked to mk), every row passing once: NQ · NV
 * chains in registers, each row's vectors loaded once for the NQ queries. */
AI void zwsum_tile(float *y, const float *w, int64_t ldw, const float *const *x, int64_t m,
                   int64_t n, int64_t j, __mmask16 mk, int64_t pf, int NQ, int NV)
{
    __m512 acc[4][4];
    _Pragma("GCC unroll 4")
    for (int q = 0; q < NQ; q++)
        _Pragma("GCC unroll 4")
        for (int v = 0; v < NV; v++)
            acc[q][v] = _mm512_maskz_loadu_ps(v == NV - 1 ? mk : (__mmask16)0xffff,
                                              y + q * n + j + 16 * v);
    for (int64_t i = 0; i < m; i++) {
        const float *xi = x[i] + j;
        if (pf && i + pf < m) { /* the vectors of row i + pf */
            _Pragma("GCC unroll 4")
            for (int v = 0; v < NV; v++)
                _mm_prefetch((const char *)(x[i + pf] + j + 16 * v), _MM_HINT_T0);
        }
        __m512 xv[4];
        _Pragma("GCC unroll 4")
        for (int v = 0; v < NV; v++)
            xv[v] = _mm512_maskz_loadu_ps(v == NV - 1 ? mk : (__mmask16)0xffff, xi + 16 * v);
        _Pragma("GCC unroll 4")
        for (int q = 0; q < NQ; q++) {
            __m512 wv = _mm512_set1_ps(w[q * ldw + i]);
            _Pragma("GCC unroll 4")
            for (int v = 0; v < NV; v++)
                acc[q][v] = _mm512_fmadd_ps(wv, xv[v], acc[q][v]);
        }
    }
    _Pragma("GCC unroll 4")
    for (int q = 0; q < NQ; q++)
        _Pragma("GCC unroll 4")
        for (int v = 0; v < NV; v++)
            _mm512_mask_storeu_ps(y + q * n + j + 16 * v, v == NV - 1 ? mk : (__mmask16)0xffff,
                                  acc[q][v]);
}

#define ZWSUM(nq, nv)                                                                              \
    __attribute__((noinline)) static void zwsum_##nq##_##nv(                                      \
        float *y, const float *w, int64_t ldw, const float *const *x, int64_t m, int64_t n,       \
        int64_t j, __mmask16 mk, int64_t pf)                                                       \
    {                                                                                              \
        zwsum_tile(y, w, ldw, x, m, n, j, mk, pf, nq, nv);                                         \
    }
ZWSUM(1, 1) ZWSUM(2, 1) ZWSUM(3, 1) ZWSUM(4, 1) ZWSUM(1, 4) ZWSUM(2, 4) ZWSUM(3, 4) ZWSUM(4, 4)
typedef void (*zwsum_fn)(float *, const float *, int64_t, const float *const *, int64_t, int64_t,
                         int64_t, __mmask16, int64_t);
/* [NV == 4][NQ] */
static const zwsum_fn zwsums[2][5] = {{NULL, zwsum_1_1, zwsum_2_1, zwsum_3_1, zwsum_4_1},
                                      {NULL, zwsum_1_4, zwsum_2_4, zwsum_3_4, zwsum_4_4}};

/* Queries in fours × 64 elements (16 chains, each row's four vectors read once per four queries),
 * then 16 at a time, the last masked; the first four queries' pass asks for the rows ahead. */
static void wsum_avx512(float *y, const float *w, int64_t ldw, int64_t g, const float *const *x,
                        int64_t m, int64_t n)
{
    for (int64_t q = 0; q < g; q += 4) {
        int nq = g - q < 4 ? (int)(g - q) : 4;
        int64_t j = 0, pf = q == 0 ? PP_ATTN_VALUES_AHEAD : 0;
        for (; j + 64 <= n; j += 64)
            zwsums[1][nq](y + q * n, w + q * ldw, ldw, x, m, n, j, 0xffff, pf);
        for (; j < n; j += 16) {
            __mmask16 mk = n - j >= 16 ? 0xffff : (__mmask16)((1u << (n - j)) - 1);
            zwsums[0][nq](y + q * n, w + q * ldw, ldw, x, m, n, j, mk, pf);
        }
    }
}

/* --- softmax and SwiGLU on sixteen lanes ---------------------------------------------------- */

/* pp__expf on sixteen lanes, operation for operation (kernels/cpu/cpu-impl.h; the AVX2 exp8). */
AI __m512 exp16(__m512 x)
{
    __m512 xc = _mm512_max_ps(_mm512_set1_ps(PP_EXP_LO), x); /* NaN: maxps returns x */
    xc = _mm512_min_ps(_mm512_set1_ps(PP_EXP_HI), xc);
    __m512 kf = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(PP_EXP_LOG2E)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fmadd_ps(kf, _mm512_set1_ps(-PP_EXP_LN2_HI), xc);
    r = _mm512_fmadd_ps(kf, _mm512_set1_ps(-PP_EXP_LN2_LO), r);
    __m512 p = _mm512_set1_ps(PP_EXP_P0);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(PP_EXP_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(PP_EXP_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(PP_EXP_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(PP_EXP_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(PP_EXP_P5));
    __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    __m512i k = _mm512_cvtps_epi32(kf); /* kf is integral: exact (a NaN lane is replaced below) */
    __m512i k1 = _mm512_srai_epi32(k, 1), k2 = _mm512_sub_epi32(k, k1);
    const __m512i bias = _mm512_set1_epi32(127);
    __m512 s1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(k1, bias), 23));
    __m512 s2 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(k2, bias), 23));
    y = _mm512_mul_ps(_mm512_mul_ps(y, s1), s2);
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), y, x);
}

static void exp_shift_avx512(float *x, float shift, int64_t n)
{
    const __m512 sv = _mm512_set1_ps(shift);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(x + i, exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), sv)));
    for (; i < n; i++)
        x[i] = pp__expf(x[i] - shift);
}

static void scale_add_avx512(float *y, float a, const float *x, float b, int64_t n)
{
    const __m512 av = _mm512_set1_ps(a), bv = _mm512_set1_ps(b);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 mk = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 v = _mm512_add_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(mk, y + i), av),
                                 _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, x + i), bv));
        _mm512_mask_storeu_ps(y + i, mk, v);
    }
}

/* x[i] *= scale, and the largest (kernels/cpu/simd.h, pp_scale_max_fn): maxps(s, m) is s > m ? s
 * : m, so a NaN lane keeps m, as the portable loop does. */
static float scale_max_avx512(float *x, float scale, int64_t n)
{
    const __m512 sv = _mm512_set1_ps(scale);
    __m512 mv = _mm512_set1_ps(-INFINITY);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + i), sv);
        _mm512_storeu_ps(x + i, v);
        mv = _mm512_max_ps(v, mv);
    }
    float lanes[16];
    _mm512_storeu_ps(lanes, mv);
    return pp__scale_max_finish(lanes, 16, x, scale, i, n);
}

static void swiglu_avx512(float *out, const float *gate, const float *up, int64_t n)
{
    const __m512 sign = _mm512_set1_ps(-0.0f), one = _mm512_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 g = _mm512_loadu_ps(gate + i);
        __m512 e = exp16(_mm512_xor_ps(g, sign));
        __m512 v = _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, e)), _mm512_loadu_ps(up + i));
        _mm512_storeu_ps(out + i, v);
    }
    for (; i < n; i++)
        out[i] = pp__swiglu1(gate[i], up[i]);
}

static pthread_once_t avx512_once = PTHREAD_ONCE_INIT;

/* The AVX2 table with this file's matmul. */
static void avx512_init(void)
{
    avx512 = *pp__simd_avx2();
    avx512.name = "avx512";
    avx512.matmul_rows = matmul_rows_avx512;
    avx2_dots = avx512.dots;
    avx512.dots = dots_avx512;
    avx512.wsum = wsum_avx512;
    avx512.exp_shift = exp_shift_avx512;
    avx512.scale_max = scale_max_avx512;
    avx512.scale_add = scale_add_avx512;
    avx512.swiglu = swiglu_avx512;
    __builtin_cpu_init();
    /* Q8_0 with VNNI where the CPU has it, and its pair tiles, else with the AVX2 dot products */
    int vnni = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw");
    avx512.matmul_q8 = vnni ? pp__mm_q8_vnni : pp__mm_q8_avx2;
    avx512.q8_pairs = vnni ? pp__q8_pairs_vnni : NULL;
    avx512.direct_max_rows = PP_MM_DIRECT_ROWS_MAX_TOKENS_AVX512;
    avx512.direct_max_rows_amd = PP_MM_DIRECT_ROWS_MAX_TOKENS_AVX512;
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
