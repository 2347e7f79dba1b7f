/* The Q8_0 integer matmul nest on x86 (kernels/cpu/matmul_q8.h), built twice: with AVX2 dot
 * products (kernels/cpu/matmul_q8_avx2.c) and with AVX-512 VNNI ones
 * (kernels/cpu/matmul_q8_vnni.c). Include it after the file's target pragma, with defined:
 *  - Q8_BIAS 0: Q8_DOT(w, x) sums, per int32 lane, four products of signed bytes w and x by
 *    making |w| the unsigned operand and x negated where w < 0 the signed one (vpsignb), so each
 *    product is w · x and a pair of them stays within int16 (2 · 128 · 127 < 2^15), as vpmaddubsw
 *    needs (the copy's weights, stored w + 128, are XORed back first); Q8_BIAS 1:
 *    Q8_DPBUSD(acc, u, s) adds to acc the products of unsigned u and signed s (vpdpbusd): the
 *    copy's weights go in as stored (w + 128) with the activations x, and the token's block sum
 *    128 · Σ x, counted once per block, starts the sum negated; the file's weights go in as they
 *    are with x + 128, and the row block's 128 · Σ w starts it;
 *  - Q8_STREAMS_ONE: rows per tile for one or two tokens; Q8_STREAMS_THREE: for three (as many
 *    if not defined); Q8_TOKENS: tokens per tile beyond three;
 *  - Q8_SPLIT_MIN_TOKENS: from how many tokens row-major rows are rewritten per tile
 *    (kernels/cpu/matmul_q8.h).
 *
 * A ymm register holds one output element's eight lanes, as in the f32 kernels. Each row is one
 * stream: the file's 34-byte blocks, or in the backend's copy (kernels/cpu/row_groups.h) the
 * row's scales, then its int8 in 32-byte steps. One or two tokens take Q8_STREAMS_ONE rows
 * together (four streams), three tokens Q8_STREAMS_THREE, more tokens Q8_ROWS_MANY rows ×
 * Q8_TOKENS tokens, the rows' weights
 * read again from L1 for each token tile. */
#ifndef PP_CPU_MATMUL_Q8_X86_H
#define PP_CPU_MATMUL_Q8_X86_H

#include <immintrin.h>
#include <string.h>

#include "kernels/cpu/matmul_q8.h"
#include "kernels/cpu/row_groups.h"
#include "kernels/cpu/simd_x86.h"

#define Q8_AI static inline __attribute__((always_inline))

#ifndef Q8_STREAMS_THREE
#define Q8_STREAMS_THREE Q8_STREAMS_ONE
#endif

/* Tiles prefetch each row's int8 (and, in the copy, its scales) one tile ahead: the same block
 * of the row R rows on, during the rows' first token tile. One thread, one token, from memory
 * (pp_bench_matmul, the Zen 4 host): units of three rows' blocks, 16 KiB ahead, streamed
 * 20.2-22.9 GB/s; these tiles 26.6-28.7 (docs/benchmarks.md, "Q8_0 in integers"). The prefetch
 * mode is fixed at compile time in each tile (no flag tested per block) and, in the copy, a full
 * group of 8 blocks prefetches once per line instead of once per block: one thread, weights in
 * L2, one token 40.8-43.6 GB/s against 37.7-39.4 before (docs/benchmarks.md, "Q8_0 prefetch"). */
#define Q8_ROWS_MANY 3 /* rows per tile beyond two tokens */
/* Spaced tiles for one or two tokens on every host, as the f32/f16/bf16 quads of the Zen 4
 * tuning (PP_MM_SPACED_QUADS, kernels/cpu/simd_x86_direct.h): a chunk's whole tiles take rows q,
 * q + ns, q + 2 ns, q + 3 ns, so each of a tile's streams runs on through the next tile's row
 * instead of ending after one row (2176 bytes at 2048 columns), and one token leaves them to the
 * hardware prefetch. pp_bench_matmul --beside 300, two threads, passes in
 * alternation within one run: one token, spaced against adjacent rows, 124.4 → 132.1%, 122.9 →
 * 140.1%, 101.6 → 109.8% of the bound in the slow level (Q8_0's 374 MB stream outruns the 256 MiB
 * read passes beside it) and 67.4 → 79.5%, 73.6 → 76.4% in the fast one; with the software
 * prefetch → without it, both spaced, 100.6 → 102.9%, 95.9 → 99.3%; two tokens (prefetching)
 * -1.5 to +1.9 points (docs/benchmarks.md). First measured there, with the L2 prefetch; on the
 * Xeon host (L1 prefetch, where one token of f16 reads better with adjacent quads) it raised
 * pp_bench_matmul's one token from 91.0-93.1% to 96.7-99.7% of the read bandwidth and two tokens
 * from 89.1-91.6% to 107.5-110.5%, and pp_bench's Q8_0 decode from 87.7-89.8% to 96.9-97.1% of
 * the bound (runs in alternation, docs/benchmarks.md). */
#ifndef Q8_SPACED
#define Q8_SPACED 1
#endif

/* A tile: row r's int8 of block 0 at q[r] and its scale at d[r], each next block's 32 and 2
 * bytes on in the copy (WB), 34 and 34 in the file's blocks; its output goes to y column
 * row0 + r · row_step; a prefetch goes ahead bytes past the byte read beside it. */
struct q8_tile {
    const char *q[6];
    const char *d[6];
    int64_t row0, row_step, ahead;
    double *sc; /* the zmm tiles' scales (Q8_ZMM): Q8Z_ROWS · Q8Z_PAIRS · Q8Z_SPAN, in the
                 * thread's scratch */
};

Q8_AI void q8_prefetch(const char *p, int l2)
{
    if (l2)
        _mm_prefetch(p, _MM_HINT_T1);
    else
        _mm_prefetch(p, _MM_HINT_T0);
}

/* n ≤ 8 floats at p, the rest 0. */
Q8_AI __m256 q8_load8(const float *p, int n)
{
    if (n == 8)
        return _mm256_loadu_ps(p);
    float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    memcpy(v, p, (size_t)n * sizeof(float));
    return _mm256_loadu_ps(v);
}

/* Row r's scales d_w of blocks b8 to b8 + n - 1 (n ≤ 8) as f32, the rest 0. The file's eight
 * scales, 34 bytes apart, are gathered in registers (vpinsrw): written to the stack as eight
 * 2-byte stores and read back as one 16-byte load, they cannot be forwarded from the stores, and
 * that stall, once per row and 8 blocks, had made row-major rows the slower layout by far.
 * pp_bench_matmul --layout both --row-div 64, one thread, weights in cache, groups / rows: 1
 * token 1.83 → 1.14, 2 tokens 1.54 → 1.05, 4 tokens 1.64 → 1.09 (Zen 3, AVX2;
 * docs/benchmarks.md, "Zen 3: decode beside the bandwidth at 89-98%"). */
Q8_AI __m256 q8_row_scales8(const struct q8_tile *m, int r, int WB, int64_t b8, int n)
{
    __m128i h;
    if (WB && n == 8)
        h = _mm_loadu_si128((const __m128i *)(m->d[r] + 2 * b8));
    else if (n == 8) {
        const char *p = m->d[r] + b8 * PP_Q8_0_BYTES;
        uint16_t v[8];
        _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++)
            memcpy(&v[j], p + j * PP_Q8_0_BYTES, sizeof(v[j]));
        h = _mm_setr_epi16((short)v[0], (short)v[1], (short)v[2], (short)v[3], (short)v[4],
                           (short)v[5], (short)v[6], (short)v[7]);
    } else {
        uint16_t v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int j = 0; j < n; j++)
            memcpy(&v[j], m->d[r] + (b8 + j) * (WB ? 2 : PP_Q8_0_BYTES), sizeof(v[j]));
        h = _mm_loadu_si128((const __m128i *)v);
    }
    return _mm256_cvtph_ps(h);
}

/* sc[r][t][j] = d_w · d_x of row r, token t and block b8 + j for j < n (n ≤ 8); the rest 0. */
Q8_AI void q8_scales8(float sc[4][4][8], const struct q8_tile *m, const float *const *xd, int R,
                      int WB, int T, int64_t b8, int n)
{
    __m256 dx[4];
    _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) dx[t] = q8_load8(xd[t] + b8, n);
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
    {
        __m256 dw = q8_row_scales8(m, r, WB, b8, n);
        _Pragma("GCC unroll 4") for (int t = 0; t < T; t++)
            _mm256_storeu_ps(sc[r][t], _mm256_mul_ps(dw, dx[t]));
    }
}

/* -128 · (the four-byte sums of signed s), per int32 lane. */
Q8_AI __m256i q8_neg128sum(__m256i s)
{
#if Q8_BIAS
    return _mm256_sub_epi32(_mm256_setzero_si256(), Q8_DPBUSD(_mm256_setzero_si256(),
                                                               _mm256_set1_epi8((char)0x80), s));
#else
    (void)s;
    return _mm256_setzero_si256();
#endif
}

/* Block b8 + j of a tile's R rows × T tokens into acc. PF: 0 no prefetch, 1 one per block, 2 one
 * per line (the copy's blocks of a whole group of 8: at even j, the line that holds byte 32 of the
 * block, which is the line of blocks j and j + 1 when the row's int8 starts on a line and else the
 * line after, whose first half is block j + 1); L2: prefetch into L2 rather than L1. */
Q8_AI void q8_block(__m256 acc[4][4], const struct q8_tile *m, const int8_t *const *xq,
                    const float sc[4][4][8], int64_t b8, int j, int64_t ahead, int R, int WB,
                    int T, int PF, int L2)
{
    const int64_t qs = WB ? PP_Q8_0_BLOCK : PP_Q8_0_BYTES;
    int64_t b = b8 + j;
    __m256i xv[4], ncx[4];
    _Pragma("GCC unroll 4") for (int t = 0; t < T; t++)
    {
        xv[t] = _mm256_loadu_si256((const __m256i *)(xq[t] + b * PP_Q8_0_BLOCK));
        if (Q8_BIAS && WB)
            ncx[t] = q8_neg128sum(xv[t]);
        else if (Q8_BIAS)
            xv[t] = _mm256_xor_si256(xv[t], _mm256_set1_epi8((char)0x80));
    }
    (void)ncx;
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
    {
        const char *u = m->q[r] + b * qs;
        if (PF == 1)
            q8_prefetch(u + ahead, L2);
        else if (PF == 2 && !(j & 1))
            q8_prefetch(u + ahead + 32, L2);
        __m256i w = _mm256_loadu_si256((const __m256i *)u);
#if Q8_BIAS
        __m256i nc = WB ? _mm256_setzero_si256() : q8_neg128sum(w);
#else
        if (WB)
            w = _mm256_xor_si256(w, _mm256_set1_epi8((char)PP_Q8_GROUP_BIAS));
        __m256i aw = _mm256_abs_epi8(w);
#endif
        _Pragma("GCC unroll 4") for (int t = 0; t < T; t++)
        {
#if Q8_BIAS
            __m256i sum = WB ? Q8_DPBUSD(ncx[t], w, xv[t]) : Q8_DPBUSD(nc, xv[t], w);
#else
            __m256i sum = Q8_DOT(aw, _mm256_sign_epi8(xv[t], w));
#endif
            acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum),
                                        _mm256_broadcast_ss(&sc[r][t][j]), acc[r][t]);
        }
    }
}

/* R rows × T tokens from token t0; WB: the weights in the split rows of row groups; PF (0 or 1)
 * and L2: whether and where the tile prefetches the next tile's rows (the first token tile of
 * its rows does). */
Q8_AI void q8_run(const struct pp_mm_args *a, const struct q8_tile *m, int R, int WB, int T,
                  int64_t t0, int PF, int L2)
{
    __m256 acc[4][4];
    float sc[4][4][8];
    const int8_t *xq[4];
    const float *xd[4];
    int64_t blocks = a->cols / PP_Q8_0_BLOCK;
    _Pragma("GCC unroll 4") for (int t = 0; t < T; t++)
    {
        xq[t] = a->xq + (t0 + t) * a->cols;
        xd[t] = a->xd + (t0 + t) * blocks;
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) acc[r][t] = _mm256_setzero_ps();
    }
    const int64_t ahead = m->ahead;
    for (int64_t b8 = 0; b8 < blocks; b8 += 8) {
        int n = blocks - b8 < 8 ? (int)(blocks - b8) : 8;
        if (PF && WB) { /* the rows' scales of the next tile, beside its int8 */
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
                q8_prefetch(m->d[r] + 2 * b8 + ahead, L2);
        }
        q8_scales8(sc, m, xd, R, WB, T, b8, n);
        if (n == 8) {
            _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++)
                q8_block(acc, m, xq, sc, b8, j, ahead, R, WB, T, PF && WB ? 2 : PF, L2);
        } else {
            for (int j = 0; j < n; j++)
                q8_block(acc, m, xq, sc, b8, j, ahead, R, WB, T, PF, L2);
        }
    }
    _Pragma("GCC unroll 4") for (int t = 0; t < T; t++)
    {
        float *y = a->y + (t0 + t) * a->rows + m->row0;
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
            y[r * m->row_step] = pp__merge8_avx(acc[r][t]);
    }
}

/* A tile with its prefetch mode fixed at compile time: the first token tile of its rows
 * prefetches (into L2 or L1, as the backend picked), the others do not. */
Q8_AI void q8_run_pf(const struct pp_mm_args *a, const struct q8_tile *m, int R, int WB, int T,
                     int64_t t0)
{
    if (t0 != 0)
        q8_run(a, m, R, WB, T, t0, 0, 0);
    else if (a->prefetch_l2)
        q8_run(a, m, R, WB, T, t0, 1, 1);
    else
        q8_run(a, m, R, WB, T, t0, 1, 0);
}

/* A tile function (q8_tile_fn) named name whose body is the statement body, which sees a, m and
 * t0. */
#define Q8_TILE_FN(name, body)                                                                     \
    __attribute__((noinline)) static void name(const struct pp_mm_args *a,                         \
                                               const struct q8_tile *m, int64_t t0)                \
    {                                                                                              \
        body;                                                                                      \
    }
#define Q8_TILE(r, wb, t) Q8_TILE_FN(q8_tile_##r##_##wb##_##t, q8_run_pf(a, m, r, wb, t, t0))
#define Q8_TILES(wb)                                                                               \
    Q8_TILE(1, wb, 1) Q8_TILE(1, wb, 2) Q8_TILE(1, wb, 3) Q8_TILE(1, wb, 4)                        \
    Q8_TILE(3, wb, 1) Q8_TILE(3, wb, 2) Q8_TILE(3, wb, 3) Q8_TILE(3, wb, 4)                        \
    Q8_TILE_FN(q8_tile_one_##wb, q8_run_pf(a, m, Q8_STREAMS_ONE, wb, 1, t0))                       \
    Q8_TILE_FN(q8_tile_two_##wb, q8_run_pf(a, m, Q8_STREAMS_ONE, wb, 2, t0))                       \
    Q8_TILE_FN(q8_tile_three_##wb, q8_run_pf(a, m, Q8_STREAMS_THREE, wb, 3, t0))                   \
    Q8_TILE_FN(q8_tile_one_hw_##wb, q8_run(a, m, Q8_STREAMS_ONE, wb, 1, t0, 0, 0))
Q8_TILES(0)
Q8_TILES(1)

typedef void (*q8_tile_fn)(const struct pp_mm_args *a, const struct q8_tile *m, int64_t t0);
#define Q8_NAME(r, wb, t) q8_tile_##r##_##wb##_##t
#define Q8_ROW(r, wb)                                                                              \
    {NULL, Q8_NAME(r, wb, 1), Q8_NAME(r, wb, 2), Q8_NAME(r, wb, 3), Q8_NAME(r, wb, 4)}
/* [WB][rows: one, Q8_ROWS_MANY][T]; one or two tokens take Q8_STREAMS_ONE rows
 * (q8_tile_one_WB, q8_tile_two_WB) */
static const q8_tile_fn q8_tiles[2][2][5] = {
    {{NULL, q8_tile_1_0_1, q8_tile_1_0_2, q8_tile_1_0_3, q8_tile_1_0_4}, Q8_ROW(3, 0)},
    {{NULL, q8_tile_1_1_1, q8_tile_1_1_2, q8_tile_1_1_3, q8_tile_1_1_4}, Q8_ROW(3, 1)}};
_Static_assert(Q8_ROWS_MANY == 3, "q8_tiles names the 3-row tiles");

#if Q8_ZMM
/* Many tokens with AVX-512 VNNI on zmm: Q8Z_ROWS rows × TP token pairs, where the matmul built
 * the pairs (pp_mm_args.xpair, kernels/cpu/matmul_q8.h). A zmm holds the eight lanes of one row
 * and two tokens t, t' interleaved (int32 lane 2i is token t's lane i, lane 2i + 1 token t''s),
 * so one vpdpbusd, conversion and fused multiply-add advance sixteen canonical lanes: the pair's
 * int8 come interleaved dword by dword with their -128-sums beside them, the row's 32 weight
 * bytes are duplicated dword by dword (vpermd, once per row and block), and each block's two
 * scales d_w · d_x[t], d_w · d_x[t'] lie side by side, so that one 8-byte broadcast gives every
 * lane its own. Each lane's chain is the canonical one of kernels/cpu/matmul_q8.h. The ymm tile
 * (3 rows × 4 tokens) converted and scaled each (row, token) with its own three instructions;
 * this one does two with three. One thread, the Xeon host: a probe with its operands in L1,
 * 58-61% of the FMA peak for the ymm loop against 83-87% for 4 rows × 3 pairs; the matmul's rows
 * alone (96 × 2048, 126 tokens) 141-146 GFLOP/s with ymm tiles, 188-195 with these on 4 rows,
 * 200 on 6, 202-223 with the pairs built once per matmul instead of in each tile
 * (docs/benchmarks.md). */
#define Q8Z_ROWS 6
_Static_assert(Q8Z_ROWS <= PP_Q8_SPLIT_ROWS, "a pair tile's rows fit the split rows");
#define Q8Z_PAIRS 3
/* Up to this many tokens a chunk's whole pair tiles are spaced as the one- and two-token tiles
 * (Q8_SPACED): tile q takes rows q, q + nz, ..., q + 5 nz. pp_bench_matmul, two threads, two
 * rounds alternating spaced and adjacent rows, of the read bandwidth: 4 tokens 79.8, 80.4% →
 * 95.6, 90.1%; 6: 73.3, 70.6 → 91.0, 83.3%; 8: 58.5, 56.6 → 67.2, 63.5%; GFLOP/s at 12 tokens
 * 277.8, 286.1 → 320.4, 324.2, at 20 303.6, 312.1 → 333.4, 337.5. Beyond 20 tokens the adjacent
 * rows with q8z_rows' spread prefetch were then a dip: one thread, old and new at once on the two
 * CPUs and swapped, two rounds, GFLOP/s with spaced tiles up to 40 tokens, 21 tokens 140.2-141.6
 * → 166.1-168.5, 28 154.1-163.1 → 177.1-183.2, 36 162.7-172.0 → 177.1-183.3, 40 168.0-181.8 →
 * 174.0-186.1; spaced at every count, 48 was level and 64-128 lost 3-6% (docs/benchmarks.md). */
#define Q8Z_SPACED_MAX_TOKENS 40
/* Blocks whose scales a tile computes at once (q8z_scales8, eight at a time), before it runs
 * them. The computation needs registers that the eighteen accumulators hold, and GCC stores and
 * reloads those around it: once per 8 blocks, that cost more than the scales themselves (a
 * probe with the tile's operands in L1: 218-237 GFLOP/s without the scales, 169-193 with them
 * every 8 blocks). Once per 32: pp_bench_loops, old and new at once on the two CPUs and swapped,
 * two rounds, GB/s, 24 tokens 3.79-4.13 → 4.33-4.43, 128 tokens 0.74-0.79 → 0.80-0.86 (64 was
 * no better); pp_bench prefill, three rounds alternated, 161.3-177.0 → 174.5-190.2 tok/s
 * (docs/benchmarks.md). */
#define Q8Z_SPAN 32
_Static_assert(Q8Z_SPAN % 8 == 0, "a span is whole groups of eight blocks");
_Static_assert(Q8Z_ROWS * Q8Z_PAIRS * Q8Z_SPAN * 2 <= PP_MM_ACC_CAP,
               "the scales fit the acc scratch");

/* sc[r][p][j0 + j] = the two floats d_w · d_x of row r, tokens 2p and 2p + 1 and block b8 + j
 * for j < n (n ≤ 8), the rest 0: a double each, so that one vbroadcastsd from memory gives a
 * block its scale vector. */
Q8_AI void q8z_scales8(double sc[Q8Z_ROWS][Q8Z_PAIRS][Q8Z_SPAN], int j0, const struct q8_tile *m,
                       const float *const *xd, int WB, int TP, int64_t b8, int n)
{
    const __m512i ilv = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    __m512 dx[Q8Z_PAIRS];
    _Pragma("GCC unroll 3") for (int p = 0; p < TP; p++)
        dx[p] = _mm512_permutex2var_ps(_mm512_castps256_ps512(q8_load8(xd[2 * p] + b8, n)), ilv,
                                       _mm512_castps256_ps512(q8_load8(xd[2 * p + 1] + b8, n)));
    _Pragma("GCC unroll 6") for (int r = 0; r < Q8Z_ROWS; r++)
    {
        __m512 dw = _mm512_permutexvar_ps(
            dup, _mm512_castps256_ps512(q8_row_scales8(m, r, WB, b8, n)));
        _Pragma("GCC unroll 3") for (int p = 0; p < TP; p++)
            _mm512_storeu_ps((float *)&sc[r][p][j0], _mm512_mul_ps(dw, dx[p]));
    }
}

/* A lane's integer sum S starts from Q8Z_MAGIC, the bits of 1.5 · 2^23, whose float has a unit
 * in the last place of 1: the sum's bits are then those of the float 1.5 · 2^23 + S (|S| ≤ 4 ·
 * 128 · 128 < 2^22 keeps it in that binade), and one exact subtraction gives S as a float, the
 * value (and bits, +0 for 0) that vcvtdq2ps gives. The subtraction runs on either vector port;
 * the conversion took the port that vpdpbusd needs too (Sapphire Rapids). */
#define Q8Z_MAGIC 0x4B400000
Q8_AI __m512 q8z_float(__m512i sum)
{
    return _mm512_sub_ps(_mm512_castsi512_ps(sum), _mm512_set1_ps(12582912.0f));
}

/* Block b0 + j of the tile into acc; PF: prefetch the next tile's rows (a line per two blocks of
 * the copy, one per block of the file's), into L2 if L2. */
Q8_AI void q8z_block(__m512 acc[Q8Z_ROWS][Q8Z_PAIRS], const struct q8_tile *m,
                     const int32_t *const *xpr, const int32_t *const *xng,
                     const double sc[Q8Z_ROWS][Q8Z_PAIRS][Q8Z_SPAN], int64_t b0, int j, int WB,
                     int TP, int PF, int L2)
{
    const __m512i dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    const int64_t qs = WB ? PP_Q8_0_BLOCK : PP_Q8_0_BYTES;
    int64_t b = b0 + j;
    __m512i xp[Q8Z_PAIRS], ncx[Q8Z_PAIRS];
    _Pragma("GCC unroll 3") for (int p = 0; p < TP; p++)
    {
        xp[p] = _mm512_loadu_si512(xpr[p] + b * 16);
        if (WB) /* -128 · Σ x per lane: the copy's weights come biased by +128 */
            ncx[p] = _mm512_loadu_si512(xng[p] + b * 16);
        else /* the activations biased to unsigned, for the file's signed weights */
            xp[p] = _mm512_xor_si512(xp[p], bias);
    }
    _Pragma("GCC unroll 6") for (int r = 0; r < Q8Z_ROWS; r++)
    {
        const char *u = m->q[r] + b * qs;
        if (PF && (!WB || !(j & 1)))
            q8_prefetch(u + m->ahead + (WB ? 32 : 0), L2);
        __m512i w = _mm512_permutexvar_epi32(
            dup, _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)u)));
        /* the file's weights: Q8Z_MAGIC - 128 · Σ w per lane starts the sum */
        __m512i nc = WB ? _mm512_setzero_si512()
                        : _mm512_sub_epi32(_mm512_set1_epi32(Q8Z_MAGIC),
                                           _mm512_dpbusd_epi32(_mm512_setzero_si512(), bias, w));
        _Pragma("GCC unroll 3") for (int p = 0; p < TP; p++)
        {
            __m512i sum = WB ? _mm512_dpbusd_epi32(ncx[p], w, xp[p])
                             : _mm512_dpbusd_epi32(nc, xp[p], w);
            __m512 scale = _mm512_castpd_ps(_mm512_set1_pd(sc[r][p][j]));
            acc[r][p] = _mm512_fmadd_ps(q8z_float(sum), scale, acc[r][p]);
        }
    }
}

/* Q8Z_ROWS rows × TP token pairs from token t0, or 2 TP - 1 tokens when ODD (the last pair is
 * that token twice, and its copy's outputs are dropped); PF and L2 as q8_run's. */
Q8_AI void q8z_run(const struct pp_mm_args *a, const struct q8_tile *m, int WB, int TP, int ODD,
                   int64_t t0, int PF, int L2)
{
    __m512 acc[Q8Z_ROWS][Q8Z_PAIRS];
    double(*sc)[Q8Z_PAIRS][Q8Z_SPAN] = (double(*)[Q8Z_PAIRS][Q8Z_SPAN])m->sc;
    const int32_t *xpr[Q8Z_PAIRS], *xng[Q8Z_PAIRS];
    const float *xd[2 * Q8Z_PAIRS];
    int64_t blocks = a->cols / PP_Q8_0_BLOCK;
    _Pragma("GCC unroll 6") for (int t = 0; t < 2 * TP; t++)
    {
        int64_t tt = ODD && t == 2 * TP - 1 ? t - 1 : t;
        xd[t] = a->xd + (t0 + tt) * blocks;
    }
    _Pragma("GCC unroll 3") for (int p = 0; p < TP; p++)
    {
        xpr[p] = a->xpair + (t0 / 2 + p) * blocks * 16;
        xng[p] = a->xneg + (t0 / 2 + p) * blocks * 16;
    }
    _Pragma("GCC unroll 6") for (int r = 0; r < Q8Z_ROWS; r++)
        _Pragma("GCC unroll 3") for (int p = 0; p < TP; p++) acc[r][p] = _mm512_setzero_ps();
    for (int64_t b0 = 0; b0 < blocks; b0 += Q8Z_SPAN) {
        int n = blocks - b0 < Q8Z_SPAN ? (int)(blocks - b0) : Q8Z_SPAN;
        for (int g = 0; g < n; g += 8) {
            if (PF && WB) { /* the rows' scales of the next tile, beside its int8 */
                _Pragma("GCC unroll 6") for (int r = 0; r < Q8Z_ROWS; r++)
                    q8_prefetch(m->d[r] + 2 * (b0 + g) + m->ahead, L2);
            }
            q8z_scales8(sc, g, m, xd, WB, TP, b0 + g, n - g < 8 ? n - g : 8);
        }
        /* read them back from memory: forwarded from the products' registers, they had taken
         * an extract and a broadcast each, and spilled */
        __asm__ volatile("" ::: "memory");
        if (n == Q8Z_SPAN) {
            _Pragma("GCC unroll 8") for (int j = 0; j < Q8Z_SPAN; j++)
                q8z_block(acc, m, xpr, xng, sc, b0, j, WB, TP, PF, L2);
        } else {
            for (int j = 0; j < n; j++)
                q8z_block(acc, m, xpr, xng, sc, b0, j, WB, TP, PF, L2);
        }
    }
    /* pp__merge8 of both tokens' lanes at once, each in its order: a 128-bit chunk c holds lanes
     * 2c and 2c + 1 of both tokens, so chunks c and c + 2 added give l_i + l_i+4, then chunks 0
     * and 1 added give (l0+l4)+(l2+l6) of each token in lanes 0 and 1 beside (l1+l5)+(l3+l7) in
     * lanes 2 and 3, which the last addition joins: token 2p's sum in lane 0, 2p + 1's in lane
     * 1. Seven instructions for the two sums, where splitting the tokens apart first took
     * fourteen: pp_bench_loops, old and new at once on the two CPUs and swapped, three rounds,
     * GB/s of weights, 8 tokens 11.11-12.37 → 11.68-13.06, 128 tokens 0.76-0.83 → 0.79-0.87. */
    _Pragma("GCC unroll 6") for (int r = 0; r < Q8Z_ROWS; r++)
        _Pragma("GCC unroll 3") for (int p = 0; p < TP; p++)
    {
        __m512 v = acc[r][p];
        v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(1, 0, 3, 2)));
        v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(2, 3, 0, 1)));
        __m128 s = _mm512_castps512_ps128(v);
        s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        float *y = a->y + (t0 + 2 * p) * a->rows + m->row0 + r * m->row_step;
        y[0] = _mm_cvtss_f32(s);
        if (!ODD || p < TP - 1)
            y[a->rows] = _mm_cvtss_f32(_mm_shuffle_ps(s, s, 1));
    }
}

/* The first token tile of spaced rows (m->row_step > 1; on adjacent rows q8z_rows asks for the
 * next rows itself) prefetches the next tile's rows, into L1 whatever pp_simd_prefetch_l2 says
 * (the pair tiles were measured so, on the Xeon host, and AMD CPUs do not take them:
 * pp_simd_q8_pairs_here). The others do not. */
Q8_AI void q8z_run_pf(const struct pp_mm_args *a, const struct q8_tile *m, int WB, int TP,
                      int ODD, int64_t t0)
{
    if (t0 == 0 && m->row_step > 1)
        q8z_run(a, m, WB, TP, ODD, t0, 1, 0);
    else
        q8z_run(a, m, WB, TP, ODD, t0, 0, 0);
}

#define Q8Z_TILE(wb, tp, odd)                                                                      \
    Q8_TILE_FN(q8z_tile_##wb##_##tp##_##odd, q8z_run_pf(a, m, wb, tp, odd, t0))
#define Q8Z_TILES(wb)                                                                              \
    Q8Z_TILE(wb, 1, 0) Q8Z_TILE(wb, 2, 0) Q8Z_TILE(wb, 3, 0) Q8Z_TILE(wb, 1, 1)                    \
    Q8Z_TILE(wb, 2, 1) Q8Z_TILE(wb, 3, 1)
Q8Z_TILES(0)
Q8Z_TILES(1)
#define Q8Z_ROW(wb, odd)                                                                           \
    {NULL, q8z_tile_##wb##_1_##odd, q8z_tile_##wb##_2_##odd, q8z_tile_##wb##_3_##odd}
/* [WB][ODD][TP] */
static const q8_tile_fn q8z_tiles[2][2][Q8Z_PAIRS + 1] = {{Q8Z_ROW(0, 0), Q8Z_ROW(0, 1)},
                                                          {Q8Z_ROW(1, 0), Q8Z_ROW(1, 1)}};

/* Rows [r, r + Q8Z_ROWS) for every token: pairs in tiles of up to Q8Z_PAIRS, the last tile's
 * last pair an odd last token twice. One tile for the tokens left, not a pair tile and then one
 * for the odd token: pp_bench_matmul, two threads, two rounds, GFLOP/s, 5 tokens 233.4, 220.1 →
 * 268.1, 256.8; 9 tokens 278.1, 276.7 → 309.7, 291.3; 7, 21 and 127 level.
 *
 * next (NULL: none), adjacent rows only: the next tile's rows, next_bytes of them, asked for
 * into L2 an even share before each token tile, where the first token tile alone had asked for
 * them into L1 in a burst while the other tiles read no memory. pp_bench_matmul, one thread,
 * old and new run at once on the two CPUs and swapped, four rounds, GFLOP/s: 64 tokens
 * 157.0-165.9 → 166.6-173.1, 128 tokens 151.0-156.2 → 156.4-167.6 (docs/benchmarks.md). A
 * function of its own, where tests/unit/check_prefetch.sh finds that prefetch. */
__attribute__((noinline)) static void q8z_rows(const struct pp_mm_args *a,
                                               const struct q8_tile *m, int wb, const char *next,
                                               int64_t next_bytes)
{
    int64_t tiles = (a->n + 2 * Q8Z_PAIRS - 1) / (2 * Q8Z_PAIRS);
    int64_t lines = next ? (next_bytes + 63) / 64 : 0, per = (lines + tiles - 1) / tiles;
    const char *line = (const char *)((uintptr_t)next & ~(uintptr_t)63);
    for (int64_t t0 = 0; t0 < a->n; t0 += 2 * Q8Z_PAIRS) {
        for (int64_t i = 0; i < per && lines > 0; i++, lines--, line += 64)
            _mm_prefetch(line, _MM_HINT_T1);
        int64_t left = a->n - t0, tp = (left + 1) / 2 < Q8Z_PAIRS ? (left + 1) / 2 : Q8Z_PAIRS;
        q8z_tiles[wb][left < 2 * tp][tp](a, m, t0);
    }
}

/* One pair's xpair and xneg (kernels/cpu/matmul_q8.h, pp__q8_pairs_fill). */
static void q8z_pairs(int32_t *xpair, int32_t *xneg, const int8_t *q0, const int8_t *q1,
                      int64_t blocks)
{
    const __m512i ilv = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    for (int64_t b = 0; b < blocks; b++) {
        __m256i x0 = _mm256_loadu_si256((const __m256i *)(q0 + b * PP_Q8_0_BLOCK));
        __m256i x1 = _mm256_loadu_si256((const __m256i *)(q1 + b * PP_Q8_0_BLOCK));
        __m512i xp = _mm512_permutex2var_epi32(_mm512_castsi256_si512(x0), ilv,
                                               _mm512_castsi256_si512(x1));
        _mm512_storeu_si512(xpair + b * 16, xp);
        _mm512_storeu_si512(xneg + b * 16,
                            _mm512_sub_epi32(_mm512_set1_epi32(Q8Z_MAGIC),
                                             _mm512_dpbusd_epi32(_mm512_setzero_si512(), bias,
                                                                 xp)));
    }
}
#endif

/* m's R row-major rows rewritten into buf in the copy's split rows (pp_mm_scratch.q8_split,
 * kernels/cpu/matmul_q8.h), and m pointed there: the same integers and scales, so the same
 * bits. The tiles' own prefetches then fall on those rows (ahead 0), already in L1. */
_Static_assert(PP_Q8_SPLIT_ROWS >= Q8_ROWS_MANY, "a tile's rows fit the split rows");
static void q8_split(struct q8_tile *m, int R, int64_t cols, char *buf)
{
    const __m256i bias = _mm256_set1_epi8((char)PP_Q8_GROUP_BIAS);
    int64_t blocks = cols / PP_Q8_0_BLOCK, stride = pp__q8_split_row_bytes(cols);
    int64_t q_at = pp__q8_split_q_offset(cols);
    for (int r = 0; r < R; r++) {
        const char *src = m->d[r];
        char *d = buf + r * stride, *q = d + q_at;
        for (int64_t b = 0; b < blocks; b++) {
            const char *blk = src + b * PP_Q8_0_BYTES;
            memcpy(d + 2 * b, blk, 2);
            __m256i v = _mm256_loadu_si256((const __m256i *)(blk + 2));
            _mm256_store_si256((__m256i *)(q + b * PP_Q8_0_BLOCK), _mm256_xor_si256(v, bias));
        }
        m->d[r] = d;
        m->q[r] = q;
    }
    m->ahead = 0;
}

/* m's R rows over every token in ymm tiles: Q8_STREAMS_ONE rows take one or two tokens and
 * Q8_STREAMS_THREE rows three in one tile (one token without software prefetch where the rows are
 * spaced, m->row_step > 1), other rows (1 or Q8_ROWS_MANY) Q8_TOKENS tokens at a time. */
_Static_assert(Q8_STREAMS_ONE != 1 && Q8_STREAMS_ONE != Q8_ROWS_MANY && Q8_STREAMS_THREE != 1 &&
                   Q8_STREAMS_THREE != Q8_ROWS_MANY,
               "q8_ymm_tiles tells the tiles apart by their rows");
static void q8_ymm_tiles(const struct pp_mm_args *a, const struct q8_tile *m, int wb, int R)
{
    if (R == Q8_STREAMS_ONE && a->n == 1 && m->row_step > 1)
        (wb ? q8_tile_one_hw_1 : q8_tile_one_hw_0)(a, m, 0);
    else if (R == Q8_STREAMS_ONE && a->n == 1)
        (wb ? q8_tile_one_1 : q8_tile_one_0)(a, m, 0);
    else if (R == Q8_STREAMS_ONE && a->n == 2)
        (wb ? q8_tile_two_1 : q8_tile_two_0)(a, m, 0);
    else if (R == Q8_STREAMS_THREE && a->n == 3)
        (wb ? q8_tile_three_1 : q8_tile_three_0)(a, m, 0);
    else
        for (int64_t t0 = 0; t0 < a->n; t0 += Q8_TOKENS) {
            int64_t nt = a->n - t0 < Q8_TOKENS ? a->n - t0 : Q8_TOKENS;
            q8_tiles[wb][R == Q8_ROWS_MANY][nt](a, m, t0);
        }
}

/* m over R rows of a: first, first + step, ...; a prefetch reads the same bytes of the row after
 * each (step > 1: every row its own stream) or R rows on. With split (row-major rows over many
 * tokens, kernels/cpu/matmul_q8.h), the rows are rewritten there first (q8_split). Returns
 * whether the tiles read them as the copy's (WB). */
static int q8_place(const struct pp_mm_args *a, struct q8_tile *m, int64_t first, int64_t step,
                    int R, char *split)
{
    int64_t qs, ds;
    for (int i = 0; i < R; i++)
        pp__q8_row_at(a, first + i * step, &m->q[i], &m->d[i], &qs, &ds);
    m->row0 = first;
    m->row_step = step;
    m->ahead = (step > 1 ? 1 : R) * a->row_bytes;
    if (split)
        q8_split(m, R, a->cols, split);
    return a->grouped || split;
}

static void q8_rows(const struct pp_mm_args *a, int64_t r0, int64_t r1,
                    const struct pp_mm_scratch *scratch)
{
    int64_t r = r0;
    struct q8_tile m;
    char *split = !a->grouped && a->n >= Q8_SPLIT_MIN_TOKENS ? scratch->q8_split : NULL;
    m.sc = (double *)scratch->acc; /* the zmm tiles' scales */
    /* spaced: whole tiles first, tile q taking rows q, q + ns, q + 2 ns, ... of the chunk's
     * rs · ns, so each stream runs on into the next tile's row: one to three tokens'
     * (Q8_SPACED), the pair tiles of a few tokens (Q8Z_SPACED_MAX_TOKENS), and without pairs
     * (AVX2, AMD CPUs) the 3-row tiles of any number of tokens. pp_bench_matmul, two threads, two
     * rounds alternating adjacent and spaced, GFLOP/s: 3 tokens (3 rows × 3 adjacent → 4 rows
     * spaced) 142.1, 143.4 → 176.1, 183.0; with PP_SIMD=avx2 107.2, 111.2 → 138.7, 139.9; the VNNI
     * tiles without pairs, 4 tokens 170.3, 171.9 → 198.4, 202.4, 8: 206.0, 206.4 → 223.4, 228.5,
     * 32: 222.4, 226.3 → 234.5, 241.8, 128: 228.0, 235.0 → 233.6, 233.8 (docs/benchmarks.md). */
    int rs = !Q8_SPACED ? 0 : a->n <= 2 ? Q8_STREAMS_ONE : a->n == 3 ? Q8_STREAMS_THREE : 0;
#if Q8_ZMM
    if (a->xpair && a->n <= Q8Z_SPACED_MAX_TOKENS)
        rs = Q8Z_ROWS;
#endif
    if (!rs && !a->xpair && Q8_SPACED)
        rs = Q8_ROWS_MANY;
    int64_t ns = rs ? (r1 - r0) / rs : 0;
    if (ns >= 2) {
        for (int64_t q = 0; q < ns; q++) {
            int copy = q8_place(a, &m, r0 + q, ns, rs, split);
#if Q8_ZMM
            if (a->xpair) {
                q8z_rows(a, &m, copy, NULL, 0);
                continue;
            }
#endif
            q8_ymm_tiles(a, &m, copy, rs);
        }
        r = r0 + rs * ns;
    }
    while (r < r1) {
        int64_t left = r1 - r;
#if Q8_ZMM
        if (a->xpair && left >= Q8Z_ROWS) {
            int copy = q8_place(a, &m, r, 1, Q8Z_ROWS, split);
            int64_t nr = left - Q8Z_ROWS < Q8Z_ROWS ? left - Q8Z_ROWS : Q8Z_ROWS;
            q8z_rows(a, &m, copy, (const char *)a->w + (r + Q8Z_ROWS) * a->row_bytes,
                     nr * a->row_bytes);
            r += Q8Z_ROWS;
            continue;
        }
#endif
        int R = a->n <= 2 ? (left >= Q8_STREAMS_ONE ? Q8_STREAMS_ONE : 1)
                          : (left >= Q8_ROWS_MANY ? Q8_ROWS_MANY : 1);
        q8_ymm_tiles(a, &m, q8_place(a, &m, r, 1, R, split), R);
        r += R;
    }
}

#endif
