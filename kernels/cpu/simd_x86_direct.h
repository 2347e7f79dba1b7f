/* The few-token matmul nest (decode, small microbatches) and the weight loaders, compiled once per
 * x86 table of inner loops: kernels/cpu/simd_avx2.c builds it for AVX2's 16 ymm registers,
 * kernels/cpu/simd_avx512.c for AVX-512's 32, where a tile reads two row groups (two streams of
 * weights) for up to four tokens. The instructions and their order are the same in both, those of
 * pp__dot (kernels/cpu/cpu-impl.h); only the registers they fit in differ. Include it once, after
 * the file's target pragma and simd_x86.h; each file then defines its tiles with DTILE and its
 * table of them, and calls pp__mm_direct. */
#ifndef PP_CPU_SIMD_X86_DIRECT_H
#define PP_CPU_SIMD_X86_DIRECT_H

#include <immintrin.h>
#include <string.h>

#include "kernels/cpu/cpu-impl.h"
#include "kernels/cpu/row_groups.h"
#include "kernels/cpu/simd_x86.h"

#define AI static inline __attribute__((always_inline))

/* Software prefetch in the few-token nest: the first token tile of a row group prefetches the same
 * lines of the row group PF_GROUPS ahead. Compile-time knobs for experiments (pp_bench_matmul);
 * on Zen 3 one group ahead into L1 was best, and without it the nest loses a third of its rate
 * (the hardware stream prefetch restarts on every row piece). */
#ifndef PP_MM_DIRECT_PREFETCH
#define PP_MM_DIRECT_PREFETCH 1
#endif
#ifndef PP_MM_DIRECT_PF_GROUPS
#define PP_MM_DIRECT_PF_GROUPS 1
#endif
/* Weights in row groups are one stream per thread: prefetch this many bytes ahead in it, for one
 * or two tokens and for more (pp_bench_matmul --layout both, 1 thread, f16: at one token 2048
 * kept level with row-major rows where 4096 lost 8-11% and 8192 13%; at 4 tokens 4096 gained
 * 10-11% over row-major, 2048 4-10%; 512 lost at both). */
#ifndef PP_MM_GROUPED_PF_FEW
#define PP_MM_GROUPED_PF_FEW 2048
#endif
#ifndef PP_MM_GROUPED_PF_MORE
#define PP_MM_GROUPED_PF_MORE 4096
#endif
/* Prefetching into L2 instead (pp_mm_args.prefetch_l2, Zen 4), one or two tokens go 4096 bytes
 * ahead: on the Zen 4 host, two threads, one token, Q8_0 (then in these tiles) streamed
 * 33.4-33.8 GB/s against 27.9-32.0 with 2048 (f16 level), four rounds alternated. */
#ifndef PP_MM_GROUPED_PF_FEW_L2
#define PP_MM_GROUPED_PF_FEW_L2 4096
#endif
/* Beside the L2 prefetch, weights in row groups also prefetch the same rows' lines this many bytes
 * ahead into L1 (0: not). pp_bench_matmul --beside 300, f16 and bf16 at one token on two threads,
 * passes alternating with and without it in one run (Zen 4 host, four runs): passes whose bound
 * was above 45 GB/s (the host's fast level) 79.0 → 83.6%, 76.5 → 80.4%, 78.2 → 80.5%, 79.6 →
 * 84.8% of it, those in the slow level (about 33 GB/s) -1.8 to +0.6 points; one thread 81.5 →
 * 85.8% and 84.5 → 92.1% in fast moments; 512 bytes ahead was level with 1024, 2048 lost 2-4
 * points (docs/benchmarks.md). */
#ifndef PP_MM_GROUPED_PF_NEAR_L1
#define PP_MM_GROUPED_PF_NEAR_L1 1024
#endif


/* Spaced quads (where the backend prefetches into L2, the Zen 4 tuning): a chunk's whole
 * four-group tiles take groups q, q + nq, q + 2 nq and q + 3 nq of its 4 nq groups instead of four
 * adjacent ones, so each of the tile's four streams runs on through the next tile's group, a
 * quarter of the chunk long, where adjacent groups broke every stream after 3 rows' bytes (12 KiB
 * at 2048 columns). A model in C of the read patterns, two threads, the host's fast level
 * (medians of 18 rounds): the adjacent groups 48.0 GB/s with the software prefetch, 39.8
 * without; four streams each a quarter of a 96-row chunk 52.2 without it, 43.8 with; one
 * stream 55.5. pp_bench_matmul --beside 300, one token, two threads, passes in
 * alternation within one run: f16 and bf16, fast level 82.5 → 92.5%, 82.6 → 91.9%, 78.0 → 88.0%
 * of the bound, slow level 91.8 → 97.5%, 91.7 → 96.8%. At one token their streams are left to
 * the hardware prefetch (with the software prefetch → without: fast level 84.0 → 89.9% and
 * 86.4 → 85.7%, slow 94.2 → 99.2%); at 2 tokens that lost 9 points in the fast level, so 2 to 4
 * tokens keep the software prefetch, spaced 0.5-2.1 points above adjacent (docs/benchmarks.md). */
#ifndef PP_MM_SPACED_QUADS
#define PP_MM_SPACED_QUADS 1
#endif

/* The eight weights of one f32, f16 or bf16 unit at p, as f32. */
AI __m256 ld_unit(const char *p, enum pp_dtype dt)
{
    switch (dt) {
    case PP_DTYPE_F32: return _mm256_loadu_ps((const float *)p);
    case PP_DTYPE_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    default: {
        __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
        return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    }
    }
}

/* Eight weights [k, k+8) of row i of the group at gb as f32 (k a multiple of 8, within the row's
 * whole units; q the group's geometry, kernels/cpu/row_groups.h). */
AI __m256 ld_w(const char *gb, const struct pp_row_group *q, int64_t i, enum pp_dtype dt, int64_t k)
{
    return ld_unit(gb + i * q->row_off + k / 8 * q->unit_stride, dt);
}

/* A row's short last unit of rem (< 8) weights stored at p, zero-padded to eight. */
static __m256 ld_w_tail(const char *p, enum pp_dtype dt, int64_t rem)
{
    float buf[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    pp_row_to_f32(buf, p, dt, rem);
    return _mm256_loadu_ps(buf);
}

/* --- few tokens: weights straight from memory ------------------------------------------------- */

/* Where one direct tile's operands are, for one block [k0, k0 + kl) of the reduction. */
struct dtile {
    const char *w;      /* the first byte of the tile's rows (a row group when grouped) */
    int64_t grp_off;    /* bytes from one group of 3 of the tile's rows to the next */
    int64_t grp_rows;   /* rows from one group to the next in y and the lane sums (3, or more
                         * in spaced tiles) */
    int64_t row_step;   /* rows from one of a group's rows to the next there (1, or more in
                         * spaced row-major tiles) */
    struct pp_row_group g; /* where a group's rows keep their units */
    int64_t pf_row;     /* bytes between the lines one pass prefetches for its rows */
    const float *x;     /* activations of token 0 of the tile; tokens ldx apart */
    int64_t ldx;
    int64_t k0;         /* first element of the block (a multiple of PP_MM_DIRECT_KB_ALIGN) */
    int64_t full;       /* whole 8-element steps of the block, in elements */
    int64_t rem;        /* elements of the zero-padded last step (last block only), 0 if none */
    float *acc;         /* lane sums of (row i, token j) at acc + i * lda + j * 8 */
    int64_t lda;
    int first, last;    /* first block: start from zero; last: merge into y */
    float *y;           /* y of (row 0, token 0); token j, row i at y + j * ldy + i */
    int64_t ldy;
    int64_t pf;         /* bytes from a weight to the one to prefetch alongside it; 0: none */
    int pf_l2;          /* prefetch into L2 (else L1) */
    int64_t pf_near;    /* with pf_end: also prefetch into L1 this many bytes ahead; 0: not */
    const char *pf_end; /* row groups: a prefetch at or past here goes pf_wrap further, into the
                         * piece of weights read next; NULL (row-major): pf is exact */
    int64_t pf_wrap;
};

/* Where the tile's row i (its group i / 3) is among y's rows and the lane sums, from row 0's. */
AI int64_t dtile_row(const struct dtile *m, int i)
{
    return i / 3 * m->grp_rows + i % 3 * m->row_step;
}

/* One line into L2 (L2 = 1) or L1; L2 is a constant where this is inlined. */
AI void dtile_prefetch_line(const char *p, int L2)
{
    if (L2)
        _mm_prefetch(p, _MM_HINT_T1);
    else
        _mm_prefetch(p, _MM_HINT_T0);
}

/* dtile_prefetch's lines from pl, unrolled whole (MR ≤ 12): left as a loop for the 12 rows of four
 * groups, each row's address took a division by 3, two multiplies and a branch on the level, and
 * the one-token tile ran at two thirds of its speed (pp_bench_loops; docs/benchmarks.md). */
AI void dtile_prefetch_rows(const struct dtile *m, const char *pl, enum pp_dtype dt, int MR, int L2)
{
    _Pragma("GCC unroll 12")
    for (int i = 0; i < MR; i++) {
        const char *pi = pl + i / 3 * m->grp_off + i % 3 * m->pf_row;
        dtile_prefetch_line(pi, L2);
        if (dt == PP_DTYPE_F32)
            dtile_prefetch_line(pi + 64, L2);
    }
}

/* Where to prefetch ahead bytes past wk: in row groups, past the end of this piece of weights
 * into the piece read next. */
AI const char *dtile_prefetch_at(const struct dtile *m, const char *wk, int64_t ahead)
{
    const char *p = wk + ahead;
    return m->pf_end && p >= m->pf_end ? p + m->pf_wrap : p;
}

/* Prefetches the lines of the MR rows that come next, for the 32 elements at wk (the tile's rows'
 * units of one step, where tile row 0's is), and with pf_near those pf_near bytes ahead into L1. */
AI void dtile_prefetch(const struct dtile *m, const char *wk, enum pp_dtype dt, int MR)
{
    const char *pl = dtile_prefetch_at(m, wk, m->pf);
    if (m->pf_l2)
        dtile_prefetch_rows(m, pl, dt, MR, 1);
    else
        dtile_prefetch_rows(m, pl, dt, MR, 0);
    if (m->pf_near)
        dtile_prefetch_rows(m, dtile_prefetch_at(m, wk, m->pf_near), dt, MR, 0);
}

/* One step of a tile: accumulator (i, j) += weights i × the eight activations of token j at k. */
AI void dtile_step(__m256 acc[6][4], const __m256 *wv, const float *const *xp, int64_t k, int MR,
                   int NT)
{
    _Pragma("GCC unroll 4")
    for (int j = 0; j < NT; j++) {
        __m256 xv = _mm256_loadu_ps(xp[j] + k);
        _Pragma("GCC unroll 6")
        for (int i = 0; i < MR; i++)
            acc[i][j] = _mm256_fmadd_ps(wv[i], xv, acc[i][j]);
    }
}

/* The same step, one row at a time: the NT activation vectors first, then each row's weights
 * converted and used at once, so that MR·NT accumulators + NT activations + one weight register
 * are live (6 rows × 2 tokens fit AVX2's 16). Every accumulator gets the same FMA as in
 * dtile_step. Row i's unit is at (i < 3 ? wa : wb) + i % 3 · ro. */
AI void dtile_step_rows(__m256 acc[6][4], const char *wa, const char *wb, int64_t ro,
                        enum pp_dtype dt, const float *const *xp, int64_t k, int MR, int NT)
{
    __m256 xv[4];
    _Pragma("GCC unroll 4")
    for (int j = 0; j < NT; j++)
        xv[j] = _mm256_loadu_ps(xp[j] + k);
    _Pragma("GCC unroll 6")
    for (int i = 0; i < MR; i++) {
        __m256 wv = ld_unit((i < 3 ? wa : wb) + i % 3 * ro, dt);
        _Pragma("GCC unroll 4")
        for (int j = 0; j < NT; j++)
            acc[i][j] = _mm256_fmadd_ps(wv, xv[j], acc[i][j]);
    }
}

/* dtile_span with the units of step k of rows 0-2 at wa + i · ro, of rows 3-5 at wb + (i - 3) · ro,
 * and us bytes from one step to the next. */
AI void dtile_span_at(__m256 acc[6][4], const struct dtile *m, const float *const *xp, int64_t k,
                      int64_t kend, enum pp_dtype dt, int MR, int NT, int64_t us, int64_t ro)
{
    const char *wa = m->w + k / 8 * us, *wb = wa + m->grp_off;
    /* two pointers that advance: left as wa + grp_off, GCC keeps an offset register per row and
     * step (24 for six rows), spilled to the stack and reloaded on every load */
    __asm__("" : "+r"(wb));
    for (; k + 32 <= kend; k += 32, wa += 4 * us, wb += 4 * us) {
        if (m->pf)
            dtile_prefetch(m, wa, dt, MR);
        _Pragma("GCC unroll 4")
        for (int s = 0; s < 4; s++) {
            if (MR * NT + MR + 1 > 16) {
                dtile_step_rows(acc, wa + s * us, wb + s * us, ro, dt, xp, k + 8 * s, MR, NT);
                continue;
            }
            __m256 wv[6];
            _Pragma("GCC unroll 6")
            for (int i = 0; i < MR; i++)
                wv[i] = ld_unit((i < 3 ? wa : wb) + s * us + i % 3 * ro, dt);
            dtile_step(acc, wv, xp, k + 8 * s, MR, NT);
        }
    }
    for (; k < kend; k += 8, wa += us, wb += us) {
        __m256 wv[6];
        _Pragma("GCC unroll 6")
        for (int i = 0; i < MR; i++)
            wv[i] = ld_unit((i < 3 ? wa : wb) + i % 3 * ro, dt);
        dtile_step(acc, wv, xp, k, MR, NT);
    }
}

/* Whole steps [k, kend) of a tile's rows over f32, f16 or bf16 weights (k a multiple of 8), 32
 * elements (one or two cache lines of each row) per pass, each pass prefetching the same lines of
 * the rows that come next. Whole row groups (the usual case) get their offsets as constants of the
 * dtype, so every load addresses from one of two pointers: one thread at one token, f16 104-105%
 * of the read bandwidth → 109-110%, and `pp_bench --threads 2` f16 decode 91.0-91.6% of the
 * bandwidth bound → 96.1-97.2% (docs/benchmarks.md). */
AI void dtile_span(__m256 acc[6][4], const struct dtile *m, const float *const *xp, int64_t k,
                   int64_t kend, enum pp_dtype dt, int MR, int NT)
{
    int64_t ub = pp__unit_bytes(dt);
    if (m->g.row_off == ub && m->g.unit_stride == PP_ROW_GROUP * ub)
        dtile_span_at(acc, m, xp, k, kend, dt, MR, NT, PP_ROW_GROUP * ub, ub);
    else
        dtile_span_at(acc, m, xp, k, kend, dt, MR, NT, m->g.unit_stride, m->g.row_off);
}

/* The zero-padded last step of m->rem elements at kend (f32, f16, bf16). */
AI void dtile_tail(__m256 acc[6][4], const struct dtile *m, const float *const *xp, int64_t kend,
                   enum pp_dtype dt, int MR, int NT)
{
    __m256i mk = pp__tail_mask_avx(m->rem);
    __m256 wv[6];
    _Pragma("GCC unroll 6")
    for (int i = 0; i < MR; i++)
        wv[i] = ld_w_tail(m->w + kend / 8 * m->g.unit_stride + i / 3 * m->grp_off +
                              i % 3 * m->g.tail_off,
                          dt, m->rem);
    _Pragma("GCC unroll 4")
    for (int j = 0; j < NT; j++) {
        __m256 xv = _mm256_maskload_ps(xp[j] + kend, mk);
        _Pragma("GCC unroll 6")
        for (int i = 0; i < MR; i++)
            acc[i][j] = _mm256_fmadd_ps(wv[i], xv, acc[i][j]);
    }
}

/* The end of a tile's block: the merged sums into y (last block), or the lane sums to scratch. */
AI void dtile_finish(__m256 acc[6][4], const struct dtile *m, int MR, int NT)
{
    if (m->last) {
        _Pragma("GCC unroll 6")
        for (int i = 0; i < MR; i++)
            _Pragma("GCC unroll 4")
            for (int j = 0; j < NT; j++)
                m->y[j * m->ldy + dtile_row(m, i)] = pp__merge8_avx(acc[i][j]);
    } else {
        _Pragma("GCC unroll 6")
        for (int i = 0; i < MR; i++)
            _Pragma("GCC unroll 4")
            for (int j = 0; j < NT; j++)
                _mm256_storeu_ps(m->acc + dtile_row(m, i) * m->lda + j * 8, acc[i][j]);
    }
}

/* The start of a tile's block: its tokens' activations, and its lane sums from zero (the first
 * block) or from scratch. */
AI void dtile_start(__m256 acc[6][4], const float **xp, const struct dtile *m, int MR, int NT)
{
    _Pragma("GCC unroll 4")
    for (int j = 0; j < NT; j++)
        xp[j] = m->x + j * m->ldx;
    _Pragma("GCC unroll 6")
    for (int i = 0; i < MR; i++)
        _Pragma("GCC unroll 4")
        for (int j = 0; j < NT; j++)
            acc[i][j] = m->first ? _mm256_setzero_ps()
                                 : _mm256_loadu_ps(m->acc + dtile_row(m, i) * m->lda + j * 8);
}

/* MR rows × NT tokens of accumulators over one block, weights converted in registers. */
AI void dtile_run(const struct dtile *m, enum pp_dtype dt, int MR, int NT)
{
    const float *xp[4];
    __m256 acc[6][4];
    dtile_start(acc, xp, m, MR, NT);
    int64_t k0 = m->k0, kend = m->k0 + m->full;
    dtile_span(acc, m, xp, k0, kend, dt, MR, NT);
    if (m->rem)
        dtile_tail(acc, m, xp, kend, dt, MR, NT);
    dtile_finish(acc, m, MR, NT);
}

/* One 8-element step of dquad_run at wk (group A's units of the step). */
AI void dquad_step(__m256 acc[12], const char *wk, int64_t go, int64_t ub, const float *xk,
                   enum pp_dtype dt)
{
    __m256 xv = _mm256_loadu_ps(xk);
    _Pragma("GCC unroll 12")
    for (int i = 0; i < 12; i++)
        acc[i] = _mm256_fmadd_ps(ld_unit(wk + i / 3 * go + i % 3 * ub, dt), xv, acc[i]);
}

/* The four-group tile on ymm for one token: 12 rows in four row groups (A to D, each grp_off after
 * the one before: four streams of weights) × one token, 12 accumulators beside the activation and
 * one weight register. Rows sit in y and the lane sums where dtile_row puts them, so the groups
 * may be spaced (dtile_spaced_groups). Every lane runs dtile_run's chain, so the bits are its. */
AI void dquad_run(const struct dtile *m, enum pp_dtype dt)
{
    __m256 acc[12];
    int64_t us = m->g.unit_stride, ub = m->g.row_off, go = m->grp_off;
    _Pragma("GCC unroll 12")
    for (int i = 0; i < 12; i++)
        acc[i] = m->first ? _mm256_setzero_ps()
                          : _mm256_loadu_ps(m->acc + dtile_row(m, i) * m->lda);
    int64_t k = m->k0, kend = m->k0 + m->full;
    const char *wk = m->w + k / 8 * us;
    for (; k + 32 <= kend; k += 32, wk += 4 * us) {
        if (m->pf)
            dtile_prefetch(m, wk, dt, 12);
        _Pragma("GCC unroll 4")
        for (int st = 0; st < 4; st++)
            dquad_step(acc, wk + st * us, go, ub, m->x + k + 8 * st, dt);
    }
    for (; k < kend; k += 8, wk += us)
        dquad_step(acc, wk, go, ub, m->x + k, dt);
    if (m->rem) {
        __m256 xv = _mm256_maskload_ps(m->x + kend, pp__tail_mask_avx(m->rem));
        _Pragma("GCC unroll 12")
        for (int i = 0; i < 12; i++)
            acc[i] = _mm256_fmadd_ps(ld_w_tail(m->w + kend / 8 * us + i / 3 * go +
                                                   i % 3 * m->g.tail_off,
                                               dt, m->rem),
                                     xv, acc[i]);
    }
    _Pragma("GCC unroll 12")
    for (int i = 0; i < 12; i++) {
        if (m->last)
            m->y[dtile_row(m, i)] = pp__merge8_avx(acc[i]);
        else
            _mm256_storeu_ps(m->acc + dtile_row(m, i) * m->lda, acc[i]);
    }
}

/* Bytes of each row a sub-block of dtile_run_alt reads (256: 64 f32 or 128 f16/bf16 elements, 768
 * bytes of a row group per visit). PP_SIMD=avx2 pp_bench_matmul --threads 1 on the Xeon host,
 * f16 at 3 / 4 tokens as a fraction of one thread's read bandwidth, two rounds: 64 elements per
 * sub-block 88.6-90.0% / 78.7-81.7%, 128 88.9-93.3% / 83.1-85.9%, 256 89.6-90.0% / 82.3-82.6%,
 * 512 77.1-79.0% / 72.4-73.6%; f32 at 4 tokens 64 elements 99.7-100.1%, 128 95.7-97.6%. */
#ifndef PP_MM_ALT_SUB_BYTES
#define PP_MM_ALT_SUB_BYTES 256
#endif

/* Two row groups × NT tokens where the registers hold one group's 3 × NT accumulators: the block
 * goes in sub-blocks, each read from group A, then group B, so that both groups' weights stream at
 * once (two streams); each group's lane sums wait in a local buffer between its sub-blocks. Each
 * lane's chain is that of dtile_run, cut at sub-block bounds, which never changes a bit. f32, f16
 * and bf16 (sub-blocks of whole 32-element passes). */
AI void dtile_run_alt(const struct dtile *m, enum pp_dtype dt, int NT)
{
    /* group g's tile: its rows, prefetch bound, lane sums and outputs */
    struct dtile mg[2] = {*m, *m};
    mg[1].w = m->w + m->grp_off;
    mg[1].pf_end = m->pf_end ? m->pf_end + m->grp_off : NULL;
    mg[1].acc = m->acc + PP_ROW_GROUP * m->lda;
    mg[1].y = m->y + PP_ROW_GROUP;
    const float *xp[4];
    __m256 lanes[2][6][4];
    for (int g = 0; g < 2; g++)
        dtile_start(lanes[g], xp, &mg[g], 3, NT);
    int64_t kend = m->k0 + m->full, sb = PP_MM_ALT_SUB_BYTES / (dt == PP_DTYPE_F32 ? 4 : 2);
    for (int64_t k = m->k0; k < kend; k += sb) {
        int64_t ke = kend - k < sb ? kend : k + sb;
        for (int g = 0; g < 2; g++) {
            /* a copy of the group's lane sums, so that the span keeps them in registers */
            __m256 acc[6][4];
            _Pragma("GCC unroll 3")
            for (int i = 0; i < 3; i++)
                _Pragma("GCC unroll 4")
                for (int j = 0; j < NT; j++)
                    acc[i][j] = lanes[g][i][j];
            dtile_span(acc, &mg[g], xp, k, ke, dt, 3, NT);
            _Pragma("GCC unroll 3")
            for (int i = 0; i < 3; i++)
                _Pragma("GCC unroll 4")
                for (int j = 0; j < NT; j++)
                    lanes[g][i][j] = acc[i][j];
        }
    }
    for (int g = 0; g < 2; g++) {
        if (m->rem)
            dtile_tail(lanes[g], &mg[g], xp, kend, dt, 3, NT);
        dtile_finish(lanes[g], &mg[g], 3, NT);
    }
}

typedef void (*dtile_fn)(const struct dtile *m);

/* The most tokens a tile of a table takes (NT; a table's rows have DTILE_NT_MAX + 1 entries). */
#define DTILE_NT_MAX 8

/* One function per dtype × MR × NT; a file defines those its registers hold (MR·NT accumulators,
 * MR weights and one activation) and puts them in a table [dtype][MR][DTILE_NT_MAX + 1] of
 * dtile_fn, NULL where it has none. */
#define DTILE(name, dt, mr, nt)                                                                    \
    __attribute__((noinline)) static void dtile_##name##_##mr##x##nt(const struct dtile *m)       \
    {                                                                                              \
        dtile_run(m, dt, mr, nt);                                                                  \
    }
#define DTILE_MR(name, dt, mr)                                                                     \
    DTILE(name, dt, mr, 1) DTILE(name, dt, mr, 2) DTILE(name, dt, mr, 3) DTILE(name, dt, mr, 4)
#define DTILE_ROW(name, mr)                                                                        \
    {NULL, dtile_##name##_##mr##x1, dtile_##name##_##mr##x2, dtile_##name##_##mr##x3,             \
     dtile_##name##_##mr##x4}

static int dtype_index(enum pp_dtype dt)
{
    switch (dt) {
    case PP_DTYPE_F32: return 0;
    case PP_DTYPE_F16: return 1;
    case PP_DTYPE_BF16: return 2;
    default: return 3;
    }
}

/* Where a grouped tile's prefetch goes past its piece of the block [k0, k0 + kl): into the piece
 * read next, that of the group at row nr, or after the super-block's last group (nr == rs1) the
 * first group's of the next block, if any. */
AI void dtile_wrap(struct dtile *m, const struct pp_mm_args *a, int64_t nr, int64_t rs,
                   int64_t rs1, int64_t k0, int64_t kl)
{
    int64_t ue = pp__unit_elems(a->dtype), full_us = PP_ROW_GROUP * pp__unit_bytes(a->dtype);
    const char *next = (const char *)a->w + (nr < rs1 ? nr * a->row_bytes + k0 / ue * full_us
                                                     : rs * a->row_bytes +
                                                           (k0 + kl) / ue * full_us);
    m->pf_end = m->w + (k0 + kl) / ue * m->g.unit_stride;
    m->pf_wrap = nr < rs1 || k0 + kl < a->cols ? next - m->pf_end : 0;
}

/* Tile m, whose row 0 is row r of the weight, over all a->n tokens in n_tiles tiles as even as
 * possible (the first n % n_tiles get one more token), with fns[NT] the tile of NT tokens; the
 * first prefetches pf bytes ahead. rs: the super-block's first row, where the lane sums start. */
AI void dtile_tokens(struct dtile *m, const struct pp_mm_args *a, const struct pp_mm_scratch *s,
                     const dtile_fn *fns, int64_t r, int64_t rs, int64_t n_tiles, int64_t pf)
{
    for (int64_t t = 0, ti = 0; t < a->n; ti++) {
        int nt = (int)(a->n / n_tiles + (ti < a->n % n_tiles));
        m->pf = ti == 0 && PP_MM_DIRECT_PREFETCH ? pf : 0;
        m->x = a->x + t * a->ldx;
        m->acc = s->acc + ((r - rs) * a->n + t) * 8;
        m->y = a->y + t * a->rows + r;
        fns[nt](m);
        t += nt;
    }
}

/* How far ahead a tile over row groups prefetches in its stream. */
AI int64_t dtile_grouped_pf(const struct pp_mm_args *a)
{
    return a->n > 2          ? PP_MM_GROUPED_PF_MORE
           : a->prefetch_l2 ? PP_MM_GROUPED_PF_FEW_L2
                            : PP_MM_GROUPED_PF_FEW;
}

/* The whole tiles of G row groups (G = 4: quads, G = 2: pairs) of rows [rs, rs1) over the block
 * [k0, k0 + kl), spaced: of the super-block's G·nq whole groups, tile q takes groups q, q + nq, ...,
 * q + (G - 1) nq, each group's stream continuing into the next tile's (in one block the prefetch
 * needs no wrap, dtile_wrap finds 0); fns[NT] is the tile of NT tokens, over all n in n_tiles
 * tiles; one token leaves the streams to the hardware prefetch. Returns the first row left for
 * the adjacent tiles: rs when fewer than two tiles fit. */
AI int64_t dtile_spaced_groups(struct dtile *m, const struct pp_mm_args *a,
                               const struct pp_mm_scratch *s, const dtile_fn *fns, int G,
                               int64_t rs, int64_t rs1, int64_t k0, int64_t kl, int64_t n_tiles)
{
    int64_t nq = (rs1 - rs) / (G * PP_ROW_GROUP), end = rs + nq * G * PP_ROW_GROUP;
    if (nq < 2)
        return rs;
    m->g = pp__row_group(a->dtype, a->cols, 1, PP_ROW_GROUP);
    m->grp_off = nq * PP_ROW_GROUP * a->row_bytes;
    m->grp_rows = nq * PP_ROW_GROUP;
    for (int64_t q = 0; q < nq; q++) {
        int64_t rq = rs + q * PP_ROW_GROUP;
        m->w = (const char *)a->w + rq * a->row_bytes;
        dtile_wrap(m, a, q + 1 < nq ? rq + PP_ROW_GROUP : end, rs, rs1, k0, kl);
        dtile_tokens(m, a, s, fns, rq, rs, n_tiles, a->n == 1 ? 0 : dtile_grouped_pf(a));
    }
    return end;
}

/* Row-major rows [rs, rs1) over the block in tiles of mr rows spaced evenly (spaced_more in
 * pp__mm_direct): of nq = (rs1 - rs) / mr tiles, tile q takes rows q, q + nq, ..., q + (mr - 1) nq
 * of the super-block, so each of its mr streams of weights runs on into the next tile's row (the
 * rows are one run of memory) and the hardware prefetch follows it; fns[NT] is the tile of NT
 * tokens, over all n in n_tiles tiles. Adjacent rows are mr streams that each end with the row
 * (4 KiB for an f16 row of 2048) while the backend's copy reads four long ones (four spaced row
 * groups). Zen 3, `pp_bench_matmul --threads 2 --layout both`, the copy's rate over the rows',
 * two rounds, 1-12 tokens: f16 1.02-1.23 → 0.79-1.00, bf16 1.01-1.16 → 0.93-1.02, f32 0.88-1.12
 * → 0.80-1.00; 20 tokens level (docs/benchmarks.md). Returns the first row left for the adjacent
 * tiles: rs when fewer than two tiles fit. */
AI int64_t dtile_spaced_rows(const struct dtile *m0, const struct pp_mm_args *a,
                             const struct pp_mm_scratch *s, const dtile_fn *fns, int mr,
                             int64_t rs, int64_t rs1, int64_t n_tiles)
{
    int64_t nq = (rs1 - rs) / mr;
    if (nq < 2)
        return rs;
    struct dtile m = *m0;
    m.g = pp__row_group(a->dtype, a->cols, 0, PP_ROW_GROUP);
    m.g.row_off = m.g.tail_off = nq * a->row_bytes;
    m.grp_off = PP_ROW_GROUP * nq * a->row_bytes;
    m.grp_rows = PP_ROW_GROUP * nq;
    m.row_step = nq;
    m.pf_end = NULL;
    for (int64_t q = 0; q < nq; q++) {
        m.w = (const char *)a->w + (rs + q) * a->row_bytes;
        dtile_tokens(&m, a, s, fns, rs + q, rs, n_tiles, 0);
    }
    return rs + nq * mr;
}

/* The few-token nest over a file's tiles tiles[dtype][MR][NT]. The reduction is cut into blocks of
 * kb elements whose activations (n × kb floats, at most PP_MM_DIRECT_KB_FLOATS) stay in cache while
 * every row of a super-block of rows (the thread's chunk) passes over them, each row group covering
 * all n tokens before the next; the lane sums of (row, token) wait in scratch between blocks, which
 * continues each lane's chain exactly. So each weight byte is read from memory once per call
 * whatever n, and the activations come from cache. Row-major rows go in groups of 4 with token
 * tiles of up to 3, or of 3 with tiles of up to 4, whichever needs fewer loads per FMA for this n
 * (counted for n <= 12). Weights in row groups go in their groups of 3, or two groups at a time (6
 * rows × tiles of up to 4 tokens, or of up to DTILE_NT_MAX where the table has them; two streams
 * of weights) when n <= two_groups and the table has 6-row tiles for the dtype, or four at a time
 * (12 rows, four streams; quads[dtype][NT]) when also n <= four_groups and quads has them, spaced
 * (dtile_spaced_groups) where spaced is set. Where spaced_more is set (the AVX2 table on AMD CPUs),
 * the two-group tiles are spaced too, and row-major rows go in spaced tiles (dtile_spaced_rows) of
 * 4 rows up to 3 tokens and of 3 beyond. */
AI void pp__mm_direct(const struct pp_mm_args *a, int64_t r0, int64_t r1,
                      const struct pp_mm_scratch *s, const dtile_fn (*tiles)[7][DTILE_NT_MAX + 1],
                      int two_groups, const dtile_fn (*quads)[5], int four_groups, int spaced,
                      int spaced_more)
{
    const dtile_fn *tab = &tiles[dtype_index(a->dtype)][0][0];
    const dtile_fn *quad = quads ? quads[dtype_index(a->dtype)] : NULL;
    int64_t n = a->n, cols = a->cols;
    if (n <= 0)
        return;
    int mr = !a->grouped && (n == 1 || n == 2 || n == 3 || n == 5 || n == 6 || n == 9) ? 4 : 3;
    if (!a->grouped && spaced_more)
        mr = n <= 3 ? 4 : 3;
    const int row = DTILE_NT_MAX + 1; /* a table row: MR's tiles of 0..DTILE_NT_MAX tokens */
    if (a->grouped && n <= two_groups && tab[2 * PP_ROW_GROUP * row + (n < 4 ? n : 4)])
        mr = 2 * PP_ROW_GROUP;
    if (mr == 2 * PP_ROW_GROUP && quad && n <= four_groups && quad[n < 4 ? n : 4])
        mr = 4 * PP_ROW_GROUP;
    /* token tiles of up to 4 tokens (3 on 4 row-major rows), and of up to DTILE_NT_MAX on two
     * row groups where the table has them (zmm) */
    int ntmax = mr == 4 ? 3 : 4;
    int64_t n_tiles = (n + ntmax - 1) / ntmax, n_tiles_two = n_tiles;
    if (tab[2 * PP_ROW_GROUP * row + DTILE_NT_MAX])
        n_tiles_two = (n + DTILE_NT_MAX - 1) / DTILE_NT_MAX;
    int64_t kb = PP_MM_DIRECT_KB_FLOATS / n / PP_MM_DIRECT_KB_ALIGN * PP_MM_DIRECT_KB_ALIGN;
    if (kb < PP_MM_DIRECT_KB_ALIGN)
        kb = PP_MM_DIRECT_KB_ALIGN;
    /* super-blocks in whole row groups of 3 and of 4 */
    int64_t sb = PP_MM_ACC_CAP / (n * 8) / 12 * 12;
    if (kb >= cols) /* one block: no lane sums in scratch, any number of rows */
        sb = r1 - r0;
    for (int64_t rs = r0; rs < r1; rs += sb) {
        int64_t rs1 = r1 - rs < sb ? r1 : rs + sb;
        struct dtile m;
        /* grouped: a pass covers 32 elements of each row, adjacent (lines 128 or 64 bytes
         * apart) */
        m.pf_row = !a->grouped ? a->row_bytes : a->dtype == PP_DTYPE_F32 ? 128 : 64;
        m.pf_l2 = a->prefetch_l2;
        m.pf_near = a->grouped && a->prefetch_l2 ? PP_MM_GROUPED_PF_NEAR_L1 : 0;
        m.ldx = a->ldx;
        m.lda = n * 8;
        m.ldy = a->rows;
        m.row_step = 1;
        for (int64_t k0 = 0; k0 < cols; k0 += kb) {
            int64_t kl = cols - k0 < kb ? cols - k0 : kb;
            m.k0 = k0;
            m.full = kl & ~(int64_t)7;
            m.rem = kl - m.full;
            m.first = k0 == 0;
            m.last = k0 + kl == cols;
            int64_t r = rs;
            if (mr == 4 * PP_ROW_GROUP && PP_MM_SPACED_QUADS && spaced)
                r = dtile_spaced_groups(&m, a, s, quad, 4, rs, rs1, k0, kl, n_tiles);
            else if (mr == 2 * PP_ROW_GROUP && spaced_more)
                r = dtile_spaced_groups(&m, a, s, tab + mr * row, 2, rs, rs1, k0, kl,
                                        n_tiles_two);
            else if (!a->grouped && spaced_more)
                r = dtile_spaced_rows(&m, a, s, tab + mr * row, mr, rs, rs1, n_tiles);
            m.grp_rows = PP_ROW_GROUP;
            for (int64_t rows; r < rs1; r += rows) {
                rows = rs1 - r < mr ? (int)(rs1 - r) : mr;
                /* a tile's groups are whole but maybe the last: what is left of four groups
                 * goes on in two, then one */
                if (a->grouped && rows > PP_ROW_GROUP && rows < mr)
                    rows = rows >= 2 * PP_ROW_GROUP ? 2 * PP_ROW_GROUP : PP_ROW_GROUP;
                m.g = pp__row_group(a->dtype, cols, a->grouped,
                                    rows > PP_ROW_GROUP ? PP_ROW_GROUP : rows);
                m.w = (const char *)a->w + r * a->row_bytes;
                m.grp_off = PP_ROW_GROUP * a->row_bytes;
                /* the first token tile prefetches the next row group's lines of this block, or
                 * after the last group the first group's lines of the next block, if any */
                int64_t pr = r + PP_MM_DIRECT_PF_GROUPS * rows, pf = (pr - r) * a->row_bytes;
                if (pr >= rs1) /* nothing to prefetch after the last block: the thread's next
                                  * rows are not known here */
                    pf = k0 + kl < cols ? (pr - (rs1 - rs) - r) * a->row_bytes +
                                              pp_dtype_row_bytes(a->dtype, kb)
                                        : 0;
                m.pf_end = NULL;
                if (a->grouped) { /* one stream: a fixed distance ahead */
                    pf = dtile_grouped_pf(a);
                    dtile_wrap(&m, a, r + rows, rs, rs1, k0, kl);
                }
                dtile_tokens(&m, a, s, rows == 4 * PP_ROW_GROUP ? quad : tab + rows * row, r, rs,
                             rows == 2 * PP_ROW_GROUP ? n_tiles_two : n_tiles, pf);
            }
        }
    }
}

#endif
