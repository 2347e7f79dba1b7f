/* What the AVX-512 inner loops (kernels/cpu/simd_avx512.c) share with the AVX2 ones
 * (kernels/cpu/simd_avx2.c): the few-token nest, and the many-token nest's packing and loop
 * driver, which take their micro-kernel as a parameter. x86-64 GCC/Clang only; include it after
 * the file's target pragma, so that the inline helpers below get that file's instruction set. */
#ifndef PP_CPU_SIMD_X86_H
#define PP_CPU_SIMD_X86_H

#include <immintrin.h>
#include <stdint.h>

#include "kernels/cpu/simd.h"

/* ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)), as pp__merge8. */
static inline __attribute__((always_inline)) float pp__merge8_avx(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

/* pp__merge8 of eight vectors at once, each in its order: lane r of the result is
 * pp__merge8_avx(v[r]). Halves first (l_i + l_i+4, two vectors per instruction), then the pairs
 * within each half, as pp__merge8 adds them: 7 additions and 14 shuffles for eight sums, where
 * one at a time takes 24 instructions. */
static inline __attribute__((always_inline)) __m256 pp__merge8x8_avx(const __m256 v[8])
{
    /* the order (v0, v4, v1, v5, ...) puts the sums in lane order at the end */
    const __m256 u[8] = {v[0], v[4], v[1], v[5], v[2], v[6], v[3], v[7]};
    __m256 c[4];
    for (int i = 0; i < 4; i++)
        c[i] = _mm256_add_ps(_mm256_permute2f128_ps(u[2 * i], u[2 * i + 1], 0x20),
                             _mm256_permute2f128_ps(u[2 * i], u[2 * i + 1], 0x31));
    __m256 e0 = _mm256_add_ps(_mm256_shuffle_ps(c[0], c[1], _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm256_shuffle_ps(c[0], c[1], _MM_SHUFFLE(3, 2, 3, 2)));
    __m256 e1 = _mm256_add_ps(_mm256_shuffle_ps(c[2], c[3], _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm256_shuffle_ps(c[2], c[3], _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm256_add_ps(_mm256_shuffle_ps(e0, e1, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm256_shuffle_ps(e0, e1, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* Lanes [0, rem) all ones: a masked load reads only those and zeroes the rest. */
static inline __attribute__((always_inline)) __m256i pp__tail_mask_avx(int64_t rem)
{
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)rem), idx);
}

/* Where one micro-tile of the many-token nest finds its operands and puts its results. */
struct pp_mm_tile {
    const float *pp;  /* micro-panel [steps][mr][8]: row i of step s at pp + (s * mr + i) * 8 */
    const float *x;   /* first token's activations at the chunk start; tokens are ldx apart */
    int64_t ldx;
    int64_t full;     /* whole steps in the chunk, in elements */
    int64_t rem;      /* elements of the zero-padded last step, 0 if none */
    float *acc;       /* lane sums of (row i, token j) at acc + j * lda + i * 8 */
    int64_t lda;
    int first, last;  /* first chunk: start from zero; last: merge into y */
    float *y;         /* y of (row 0, token 0); token j, row i at y + j * ldy + i */
    int64_t ldy;
    int rows;         /* valid rows of the mr */
};

typedef void (*pp_mm_micro_fn)(const struct pp_mm_tile *m);

/* Tokens of the widest micro-tile (the AVX-512 one). */
#define PP_MM_NR_MAX 8

/* Packs rows [r, r + mc) × elements [k0, k0 + kl) of a's weights into f32 micro-panels of mr
 * rows (the layout of pp_mm_tile.pp). */
typedef void (*pp_mm_pack_fn)(float *panel, const struct pp_mm_args *a, int64_t r, int64_t mc,
                              int64_t k0, int64_t kl, int mr);

/* A micro-kernel family: mr rows (a multiple of PP_ROW_GROUP) × up to nr tokens (at most
 * PP_MM_NR_MAX), fn[t] for t tokens; panels of mc rows (a multiple of mr, at most
 * PP_MM_PANEL_ROWS); passes of up to nc tokens. acc_prefetch: the nest asks for the next tile's
 * partial sums before it runs this one. pack: the family's own packer, NULL for the AVX2 one
 * (pp__mm_pack_avx2). */
struct pp_mm_micro {
    int mr, nr, mc, nc;
    pp_mm_micro_fn fn[PP_MM_NR_MAX + 1];
    int acc_prefetch;
    pp_mm_pack_fn pack;
};

/* The AVX2 packer, for any dtype but Q8_0, layout and mr. */
void pp__mm_pack_avx2(float *panel, const struct pp_mm_args *a, int64_t r, int64_t mc, int64_t k0,
                      int64_t kl, int mr);

/* The few-token nest (n <= PP_MM_DIRECT_MAX_TOKENS) on AVX2. */
void pp__mm_direct_avx2(const struct pp_mm_args *a, int64_t r0, int64_t r1,
                        const struct pp_mm_scratch *s);

/* The many-token nest: panels packed to f32 on AVX2, swept by the micro-kernel family k. */
void pp__mm_packed_avx2(const struct pp_mm_args *a, int64_t r0, int64_t r1,
                        const struct pp_mm_scratch *s, const struct pp_mm_micro *k);

#endif
