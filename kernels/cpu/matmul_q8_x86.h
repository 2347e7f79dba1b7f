/* The Q8_0 integer matmul nest on x86 (kernels/cpu/matmul_q8.h), built twice: with AVX2 dot
 * products (kernels/cpu/matmul_q8_avx2.c) and with AVX-512 VNNI ones
 * (kernels/cpu/matmul_q8_vnni.c). Include it after the file's target pragma, with defined:
 *  - Q8_BIAS 0: Q8_DOT(w, x) sums, per int32 lane, four products of signed bytes w and x by
 *    making |w| the unsigned operand and x negated where w < 0 the signed one (vpsignb), so each
 *    product is w · x and a pair of them stays within int16 (2 · 128 · 127 < 2^15), as vpmaddubsw
 *    needs (grouped weights, stored w + 128, are XORed back first); Q8_BIAS 1:
 *    Q8_DPBUSD(acc, u, s) adds to acc the products of unsigned u and signed s (vpdpbusd): grouped
 *    weights go in as stored (w + 128) with the activations x, and the token's block sum
 *    128 · Σ x, counted once per block, starts the sum negated; row-major weights go in as they
 *    are with x + 128, and the row block's 128 · Σ w starts it;
 *  - Q8_STREAMS_ONE: row streams per tile for one token; Q8_TOKENS: tokens per tile beyond one.
 *
 * A ymm register holds one output element's eight lanes, as in the f32 kernels. Row groups
 * (kernels/cpu/row_groups.h) are streams of three rows whose block-b units sit one stride apart:
 * the three f16 scales first, then the rows' 32 int8 each; row-major rows are streams of one. One
 * token takes Q8_STREAMS_ONE streams together (four row groups: 12 rows), more tokens one stream ×
 * Q8_TOKENS tokens, the stream's weights read again from L1 for each token tile. */
#ifndef PP_CPU_MATMUL_Q8_X86_H
#define PP_CPU_MATMUL_Q8_X86_H

#include <immintrin.h>
#include <string.h>

#include "kernels/cpu/matmul_q8.h"
#include "kernels/cpu/row_groups.h"
#include "kernels/cpu/simd_x86.h"

#define Q8_AI static inline __attribute__((always_inline))

/* Bytes ahead of a stream that one-token tiles prefetch: two threads, one token, from memory
 * (pp_bench_matmul), 4096 streamed 76-83% of the read bandwidth and 16384 87-91% (three rounds in
 * alternation, in the host's slower moments); 8192 and 1024 were between. */
#define Q8_PREFETCH 16384
#define Q8_GROUP_Q 6 /* from a full group's unit to its row 0's int8 */

/* A tile: stream s starts at p[s] (G = 3: its group's unit of block 0; G = 1: its row's scale of
 * block 0, the int8 qoff bytes on), each block stride bytes after the previous; its rows' outputs
 * go to y columns row[s], row[s] + 1, .... */
struct q8_tile {
    const char *p[4];
    int64_t row[4];
    int64_t stride, qoff;
};

Q8_AI void q8_prefetch(const char *p, int l2)
{
    if (l2) {
        _mm_prefetch(p, _MM_HINT_T1);
        _mm_prefetch(p + 64, _MM_HINT_T1);
    } else {
        _mm_prefetch(p, _MM_HINT_T0);
        _mm_prefetch(p + 64, _MM_HINT_T0);
    }
}

/* The scales of a stream's G rows at block offset off, times token scale dx: lane i for row i. */
Q8_AI __m128 q8_scales(const char *p, int G, __m128 dx)
{
    __m128i h;
    if (G == 3)
        h = _mm_loadl_epi64((const __m128i *)p);
    else {
        uint16_t v;
        memcpy(&v, p, sizeof(v));
        h = _mm_cvtsi32_si128(v);
    }
    return _mm_mul_ps(_mm_cvtph_ps(h), dx);
}

/* Lane i of v in all eight lanes. */
Q8_AI __m256 q8_lane(__m128 v, int i)
{
    if (i == 0)
        return _mm256_broadcastss_ps(v);
    return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(v), _mm256_set1_epi32(i));
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

/* S streams of G rows × T tokens from token t0; WB: the weights stored biased (row groups). */
Q8_AI void q8_run(const struct pp_mm_args *a, const struct q8_tile *m, int S, int G, int WB, int T,
                  int64_t t0)
{
    __m256 acc[12][4];
    const int8_t *xq[4];
    const float *xd[4];
    int64_t blocks = a->cols / PP_Q8_0_BLOCK;
    _Pragma("GCC unroll 4") for (int t = 0; t < T; t++)
    {
        xq[t] = a->xq + (t0 + t) * a->cols;
        xd[t] = a->xd + (t0 + t) * blocks;
        _Pragma("GCC unroll 12") for (int r = 0; r < S * G; r++) acc[r][t] = _mm256_setzero_ps();
    }
    const int l2 = a->prefetch_l2;
    const int64_t qo = G == 3 ? Q8_GROUP_Q : m->qoff;
    for (int64_t b = 0; b < blocks; b++) {
        int64_t off = b * m->stride;
        __m256i xv[4], ncx[4];
        __m128 dx[4];
        _Pragma("GCC unroll 4") for (int t = 0; t < T; t++)
        {
            xv[t] = _mm256_loadu_si256((const __m256i *)(xq[t] + b * PP_Q8_0_BLOCK));
            if (Q8_BIAS && WB)
                ncx[t] = q8_neg128sum(xv[t]);
            else if (Q8_BIAS)
                xv[t] = _mm256_xor_si256(xv[t], _mm256_set1_epi8((char)0x80));
            dx[t] = _mm_broadcast_ss(xd[t] + b);
        }
        (void)ncx;
        if (T == 1) {
            _Pragma("GCC unroll 4") for (int s = 0; s < S; s++)
                q8_prefetch(m->p[s] + off + Q8_PREFETCH, l2);
        }
        _Pragma("GCC unroll 4") for (int s = 0; s < S; s++)
        {
            const char *u = m->p[s] + off;
            __m128 sc[4];
            _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) sc[t] = q8_scales(u, G, dx[t]);
            _Pragma("GCC unroll 3") for (int i = 0; i < G; i++)
            {
                __m256i w = _mm256_loadu_si256((const __m256i *)(u + qo + i * PP_Q8_0_BLOCK));
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
                    __m256 *c = &acc[s * G + i][t];
                    *c = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), q8_lane(sc[t], i), *c);
                }
            }
        }
    }
    _Pragma("GCC unroll 4") for (int t = 0; t < T; t++)
    {
        float *y = a->y + (t0 + t) * a->rows;
        _Pragma("GCC unroll 4") for (int s = 0; s < S; s++)
        {
            _Pragma("GCC unroll 3") for (int i = 0; i < G; i++) y[m->row[s] + i] =
                pp__merge8_avx(acc[s * G + i][t]);
        }
    }
}

#define Q8_TILE(s, g, wb, t)                                                                       \
    __attribute__((noinline)) static void q8_tile_##s##_##g##_##wb##_##t(                          \
        const struct pp_mm_args *a, const struct q8_tile *m, int64_t t0)                           \
    {                                                                                              \
        q8_run(a, m, s, g, wb, t, t0);                                                             \
    }
#define Q8_TILES(g, wb)                                                                            \
    Q8_TILE(1, g, wb, 1) Q8_TILE(1, g, wb, 2) Q8_TILE(1, g, wb, 3) Q8_TILE(1, g, wb, 4)             \
        __attribute__((noinline)) static void q8_tile_streams_##g##_##wb(                          \
            const struct pp_mm_args *a, const struct q8_tile *m, int64_t t0)                       \
    {                                                                                              \
        q8_run(a, m, Q8_STREAMS_ONE, g, wb, 1, t0);                                                \
    }
Q8_TILES(1, 0)
Q8_TILES(1, 1)
Q8_TILES(3, 1)

typedef void (*q8_tile_fn)(const struct pp_mm_args *a, const struct q8_tile *m, int64_t t0);
/* [layout][T]: rows row-major (signed), rows of a short last group (biased), whole groups;
 * [.][0]: Q8_STREAMS_ONE streams, one token; [.][T]: one stream, T tokens */
static const q8_tile_fn q8_tiles[3][5] = {
    {q8_tile_streams_1_0, q8_tile_1_1_0_1, q8_tile_1_1_0_2, q8_tile_1_1_0_3, q8_tile_1_1_0_4},
    {q8_tile_streams_1_1, q8_tile_1_1_1_1, q8_tile_1_1_1_2, q8_tile_1_1_1_3, q8_tile_1_1_1_4},
    {q8_tile_streams_3_1, q8_tile_1_3_1_1, q8_tile_1_3_1_2, q8_tile_1_3_1_3, q8_tile_1_3_1_4}};

static void q8_rows(const struct pp_mm_args *a, int64_t r0, int64_t r1,
                    const struct pp_mm_scratch *scratch)
{
    (void)scratch;
    /* rows in whole groups are streams of three; the short last group goes row by row */
    const int G = a->grouped ? PP_ROW_GROUP : 1;
    int64_t whole = a->rows / G * G;
    int64_t r = r0;
    while (r < r1) {
        int64_t left = (r1 < whole ? r1 : whole) - r;
        struct q8_tile m;
        const char *q, *d;
        int S = a->n == 1 && left >= Q8_STREAMS_ONE * G ? Q8_STREAMS_ONE : 1;
        int g = left >= G ? G : 1;
        for (int s = 0; s < S; s++) {
            pp__q8_row_at(a, r + s * g, &q, &d, &m.stride);
            m.p[s] = d;
            m.qoff = q - d;
            m.row[s] = r + s * g;
        }
        const q8_tile_fn *fn = q8_tiles[g == 3 ? 2 : a->grouped];
        if (S > 1)
            fn[0](a, &m, 0);
        else
            for (int64_t t0 = 0; t0 < a->n; t0 += Q8_TOKENS) {
                int64_t nt = a->n - t0 < Q8_TOKENS ? a->n - t0 : Q8_TOKENS;
                fn[nt](a, &m, t0);
            }
        r += S * g;
    }
}

#endif
