/* AVX2 + FMA + F16C inner loops of the CPU backend. Each reproduces the canonical order of pp__dot
 * (kernels/cpu/cpu-impl.h) exactly: a ymm register holds the eight lanes of one output element,
 * every step is one fused multiply-add of eight consecutive elements, a ragged tail is one more
 * step with both operands zero-padded, and merge8 is the fixed lane merge.
 *
 * Matmul of f32, f16 and bf16 weights runs one of two loop nests over the same arithmetic (Q8_0
 * runs in integers, kernels/cpu/matmul_q8.h):
 *  - up to pp_mm_direct_max_tokens tokens (decode, small microbatches; 32 over row groups, 20 over
 *    row-major rows, 32 with the AMD tiles, kernels/cpu/simd.h): weights are read straight
 *    from where the backend keeps them (row groups, kernels/cpu/row_groups.h, or row-major rows)
 *    and converted in registers (F16C, bf16 shift); the
 *    reduction is cut into blocks of PP_MM_DIRECT_KB_FLOATS / n elements, and in each block every
 *    tile of rows (row-major: 4 rows × tiles of up to 3 tokens, or 3 rows × up to 4; row groups: 3
 *    rows × up to 4, or 6 rows for up to four tokens) covers all n tokens before the next, with
 *    lane sums in scratch between blocks, so each weight byte comes from memory once per call and
 *    the block's activations stay in cache (kernels/cpu/simd_x86_direct.h, which the AVX-512
 *    table builds again with its 32 registers and wider tiles);
 *  - more tokens (prefill, large microbatches): a panel of PP_MM_MC_MAX rows × PP_MM_KC elements
 *    is converted once into f32 scratch, then a register-blocked micro-kernel (3 rows × 4 tokens
 *    of accumulators) sweeps every token over it; partial lane sums live in scratch between
 *    reduction chunks. The nest takes its micro-kernel as a parameter: the AVX-512 table
 *    (kernels/cpu/simd_avx512.c) runs it with a wider one.
 * The two nests differ only in where operands come from, never in the order of the arithmetic,
 * so a token's result is the same alone or in any batch. */
#include "kernels/cpu/simd.h"

#if defined(__x86_64__) && defined(__GNUC__)

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu-impl.h"
#include "kernels/cpu/matmul_q8.h"
#include "kernels/cpu/row_groups.h"
#include "kernels/cpu/simd_x86.h"
#include "kernels/cpu/simd_x86_direct.h"

/* The many-token nest prefetches the weights of the panel it packs next while it computes with the
 * current one (a compile-time knob for experiments). */
#ifndef PP_MM_PANEL_PREFETCH
#define PP_MM_PANEL_PREFETCH 1
#endif

/* The few-token tiles (kernels/cpu/simd_x86_direct.h) that fit the 16 ymm registers: MR·NT <= 12
 * and MR·NT + MR + 1 <= 16 or nearly (the accumulators, MR weights and one activation; tiles past
 * 16 take their weights one row at a time, dtile_step_rows). Weights in row groups take up to four
 * tokens two groups at a time (6 rows, two streams of weights): one or two tokens in registers, 3
 * and 4 tokens by sub-blocks read from one group and then the other (dtile_run_alt). One token on
 * Zen 3 (pp_bench_matmul --layout both, f16, three rounds): 1.03-1.13 times row-major rows on 1
 * thread against 1.00-1.01 with 3 rows. On the Xeon host (PP_SIMD=avx2, 1 thread) against one
 * group at a time, f16 / bf16 / f32: 2 tokens 16.0-16.2 / 16.2-16.5 / 17.0-17.2 GB/s against
 * 12.6-13.7 / 12.3-12.6 / 14.5-14.8 (two rounds); as fractions of the read bandwidth (three
 * rounds), 3 tokens 92.8-94.4% / 90.9-91.7% / 102.1-104.2% against 80.6-81.9% / 79.8-81.5% /
 * 81.9-86.7%, 4 tokens 87.9-89.9% / 85.8-86.3% / 100.4-102.2% against 79.0-80.7% / 78.5-81.1% /
 * 79.2-82.0% (docs/benchmarks.md). */
#define TWO_GROUPS_MAX_TOKENS 4
/* On AMD CPUs (pp_simd_amd_tiles) three and four tokens go one group at a time instead (3-row
 * tiles of 12 accumulators, no sub-blocks). Zen 3, the builds before and after in turn, two
 * rounds: pp_bench_loops (one thread, in cache) f16 GB/s at 3 tokens 24.7, 24.7 → 28.9, 28.1, at
 * 4 tokens 19.0, 19.6 → 23.1, 23.2, bf16 at 4 tokens 17.8, 17.4 → 20.7, 20.7; pp_bench_matmul
 * --beside 24, two threads, of the bound beside each pass (about 37 GB/s both times), f16 at 3
 * tokens 82.7, 82.1 → 84.8, 87.1%, at 4 tokens 78.9, 75.8 → 83.6, 85.0%, bf16 at 4 tokens 76.4,
 * 76.1 → 82.8, 84.2% (docs/benchmarks.md). Two tokens take the two-group tiles spaced
 * (pp__mm_direct's spaced_more, dtile_spaced_groups): pp_bench_matmul --threads 2 --tokens 2
 * --layout groups --beside 16, the builds before and after in turn, three rounds, of the bound
 * beside each pass, f16 91.7, 80.1, 90.5% (bounds 35.0, 52.5, 34.9 GB/s) → 87.6, 92.1, 88.3%
 * (52.3, 48.1, 50.9), bf16 90.9, 83.0, 92.5% → 96.2, 95.9, 95.2%, f32 level; pp_bench
 * --decode-batch 2, two rounds, f16 31.6, 34.8 → 33.4, 35.8 tok/s, bf16 34.3, 37.9 → 41.8, 42.4
 * (docs/benchmarks.md). */
#define TWO_GROUPS_MAX_TOKENS_AMD 2
#define DTILE_ALT(name, dt, nt)                                                                    \
    __attribute__((noinline)) static void dtile_##name##_6x##nt(const struct dtile *m)          \
    {                                                                                              \
        dtile_run_alt(m, dt, nt);                                                                  \
    }
#define DTILE_DT(name, dt)                                                                         \
    DTILE_MR(name, dt, 1) DTILE_MR(name, dt, 2) DTILE_MR(name, dt, 3) DTILE(name, dt, 4, 1)       \
    DTILE(name, dt, 4, 2) DTILE(name, dt, 4, 3)
/* the two-group tiles */
#define DTILE_TWO(name, dt)                                                                        \
    DTILE(name, dt, 6, 1) DTILE(name, dt, 6, 2) DTILE_ALT(name, dt, 3) DTILE_ALT(name, dt, 4)
DTILE_DT(f32, PP_DTYPE_F32)
DTILE_DT(f16, PP_DTYPE_F16)
DTILE_DT(bf16, PP_DTYPE_BF16)
DTILE_TWO(f32, PP_DTYPE_F32)
DTILE_TWO(f16, PP_DTYPE_F16)
DTILE_TWO(bf16, PP_DTYPE_BF16)
#define TWO_ROW(name)                                                                              \
    {NULL, dtile_##name##_6x1, dtile_##name##_6x2, dtile_##name##_6x3, dtile_##name##_6x4}
#define DTILE_TABLE(name, six)                                                                     \
    {{NULL, NULL, NULL, NULL, NULL}, DTILE_ROW(name, 1), DTILE_ROW(name, 2), DTILE_ROW(name, 3),  \
     {NULL, dtile_##name##_4x1, dtile_##name##_4x2, dtile_##name##_4x3, NULL},                    \
     {NULL, NULL, NULL, NULL, NULL}, six(name)}

/* [dtype][MR][NT]; Q8_0 runs in integers (kernels/cpu/matmul_q8.h) */
static const dtile_fn dtiles[4][7][DTILE_NT_MAX + 1] = {
    DTILE_TABLE(f32, TWO_ROW), DTILE_TABLE(f16, TWO_ROW), DTILE_TABLE(bf16, TWO_ROW)};

#define DQUAD(name, dt)                                                                            \
    __attribute__((noinline)) static void dquad_##name##_1(const struct dtile *m)                 \
    {                                                                                              \
        dquad_run(m, dt);                                                                          \
    }
DQUAD(f32, PP_DTYPE_F32)
DQUAD(f16, PP_DTYPE_F16)
DQUAD(bf16, PP_DTYPE_BF16)
/* [dtype][NT]: four row groups for one token, spaced (dtile_spaced_groups), where
 * pp_simd_amd_tiles says (AMD CPUs): the Zen 4 tuning of the AVX-512 table's zquads, which the
 * AVX2 table lacked. pp_bench --threads 2 --dtypes f16,bf16 --prompt 8 --decode 24 on Zen 3, the
 * builds before and after in turn, five rounds, decode beside the bandwidth, f16 87.1, 76.3, 86.4,
 * 87.7, 76.6% → 96.1, 96.5, 96.9, 97.5, 97.6%; bf16 89.3, 81.5, 89.8, 81.7, 81.8% → 97.1, 95.3,
 * 97.9, 96.4, 96.9%; the old tiles' worst rounds were those where the bound was fast (51-53 GB/s).
 * With its weights in cache (pp_bench_loops, one thread) f16 ran 47.5-47.8 GB/s against 49.3-50.9
 * and f32 75.0 against 68.0-70.9, far above what a core needs from memory (docs/benchmarks.md). */
static const dtile_fn dquads[4][5] = {{NULL, dquad_f32_1, NULL, NULL, NULL},
                                      {NULL, dquad_f16_1, NULL, NULL, NULL},
                                      {NULL, dquad_bf16_1, NULL, NULL, NULL},
                                      {NULL, NULL, NULL, NULL, NULL}};

void pp__mm_direct_avx2(const struct pp_mm_args *a, int64_t r0, int64_t r1,
                        const struct pp_mm_scratch *s)
{
    if (a->amd_tiles)
        pp__mm_direct(a, r0, r1, s, dtiles, TWO_GROUPS_MAX_TOKENS_AMD, dquads, 1, 1, 1);
    else
        pp__mm_direct(a, r0, r1, s, dtiles, TWO_GROUPS_MAX_TOKENS, NULL, 0, 0, 0);
}

/* --- many tokens: packed panels and the register-blocked micro-kernel ------------------------- */

/* Converts rows [r, r+mc) × elements [k0, k0+kl) into f32 micro-panels of mr rows (a multiple of
 * PP_ROW_GROUP, read one row group at a time): the eight weights of row i, step s of micro-panel
 * p sit at panel[(p * steps + s) * mr * 8 + i * 8]. Rows past mc in the last micro-panel are
 * zero. r is a multiple of PP_ROW_GROUP when the weights are in row groups. */
AI void pack(float *panel, const struct pp_mm_args *a, enum pp_dtype dt, int64_t r, int64_t mc,
             int64_t k0, int64_t kl, int mr)
{
    int64_t full = kl & ~(int64_t)7, steps = (kl + 7) / 8;
    for (int64_t p = 0; p < mc; p += mr) {
        for (int g = 0; g < mr; g += PP_ROW_GROUP) {
            float *pp = panel + (p / mr) * steps * mr * 8 + g * 8;
            int64_t left = mc - p - g;
            int nr = left < PP_ROW_GROUP ? (left > 0 ? (int)left : 0) : PP_ROW_GROUP;
            const char *gb = (const char *)a->w + (r + p + g) * a->row_bytes;
            struct pp_row_group q = pp__row_group(dt, a->cols, a->grouped, nr ? nr : 1);
            /* the group's rows side by side, so that the panel is written in order (2-6% faster
             * at 128 tokens than one row after another) */
            int64_t s = 0;
            if (nr == PP_ROW_GROUP && a->grouped) {
                /* a step's three units are adjacent, as they are in the panel: one pointer walks
                 * the run (k0 is a multiple of 8) */
                const char *u = gb + k0 / 8 * q.unit_stride;
                float *d = pp;
                for (; s * 8 < full; s++, u += q.unit_stride, d += mr * 8)
                    _Pragma("GCC unroll 3")
                    for (int i = 0; i < PP_ROW_GROUP; i++)
                        _mm256_storeu_ps(d + i * 8, ld_unit(u + i * q.row_off, dt));
            } else if (nr == PP_ROW_GROUP) {
                for (; s * 8 < full; s++)
                    _Pragma("GCC unroll 3")
                    for (int i = 0; i < PP_ROW_GROUP; i++)
                        _mm256_storeu_ps(pp + s * mr * 8 + i * 8, ld_w(gb, &q, i, dt, k0 + s * 8));
            } else {
                for (; s * 8 < full; s++)
                    for (int i = 0; i < PP_ROW_GROUP; i++)
                        _mm256_storeu_ps(pp + s * mr * 8 + i * 8,
                                         i < nr ? ld_w(gb, &q, i, dt, k0 + s * 8)
                                                : _mm256_setzero_ps());
            }
            if (full < kl)
                for (int i = 0; i < PP_ROW_GROUP; i++)
                    _mm256_storeu_ps(pp + s * mr * 8 + i * 8,
                                     i < nr ? ld_w_tail(gb + (k0 + full) / 8 * q.unit_stride +
                                                            i * q.tail_off,
                                                        dt, kl - full)
                                            : _mm256_setzero_ps());
        }
    }
}

void pp__mm_pack_avx2(float *panel, const struct pp_mm_args *a, int64_t r, int64_t mc, int64_t k0,
                      int64_t kl, int mr)
{
    /* f32, f16 and bf16: Q8_0 runs in integers (kernels/cpu/matmul_q8.h) */
    if (a->dtype == PP_DTYPE_F32)
        pack(panel, a, PP_DTYPE_F32, r, mc, k0, kl, mr);
    else if (a->dtype == PP_DTYPE_F16)
        pack(panel, a, PP_DTYPE_F16, r, mc, k0, kl, mr);
    else
        pack(panel, a, PP_DTYPE_BF16, r, mc, k0, kl, mr);
}

/* The AVX2 micro-tile: MR rows × NR tokens of accumulators (12) + MR weight registers + one
 * activation register fill the 16 ymm registers; each step loads MR + NR vectors for MR·NR FMAs. */
#define MR 3
#define NR 4
_Static_assert(MR == PP_ROW_GROUP, "a micro-panel is one row group");

/* MR rows × NT tokens over one chunk. */
AI void micro(const struct pp_mm_tile *m, int NT)
{
    __m256 acc[MR][NR];
    _Pragma("GCC unroll 6")
    for (int i = 0; i < MR; i++)
        _Pragma("GCC unroll 4")
        for (int j = 0; j < NT; j++)
            acc[i][j] = m->first ? _mm256_setzero_ps()
                                 : _mm256_loadu_ps(m->acc + j * m->lda + i * 8);
    const float *pp = m->pp;
    const float *xs[NR];
    _Pragma("GCC unroll 4")
    for (int j = 0; j < NR; j++)
        xs[j] = m->x + (j < NT ? j : 0) * m->ldx;
    for (int64_t k = 0; k < m->full; k += 8, pp += MR * 8) {
        __m256 w[MR];
        _Pragma("GCC unroll 4")
        for (int i = 0; i < MR; i++)
            w[i] = _mm256_loadu_ps(pp + i * 8);
        _Pragma("GCC unroll 4")
        for (int j = 0; j < NT; j++) {
            __m256 xv = _mm256_loadu_ps(xs[j] + k);
            _Pragma("GCC unroll 6")
            for (int i = 0; i < MR; i++)
                acc[i][j] = _mm256_fmadd_ps(w[i], xv, acc[i][j]);
        }
    }
    if (m->rem) {
        __m256i mk = pp__tail_mask_avx(m->rem);
        _Pragma("GCC unroll 4")
        for (int j = 0; j < NT; j++) {
            __m256 xv = _mm256_maskload_ps(xs[j] + m->full, mk);
            _Pragma("GCC unroll 6")
            for (int i = 0; i < MR; i++)
                acc[i][j] = _mm256_fmadd_ps(_mm256_loadu_ps(pp + i * 8), xv, acc[i][j]);
        }
    }
    if (m->last) {
        /* constant indices only: a variable one would put the accumulators in memory */
        _Pragma("GCC unroll 4")
        for (int i = 0; i < MR; i++)
            if (i < m->rows)
                _Pragma("GCC unroll 4")
                for (int j = 0; j < NT; j++)
                    m->y[j * m->ldy + i] = pp__merge8_avx(acc[i][j]);
    } else {
        _Pragma("GCC unroll 4")
        for (int i = 0; i < MR; i++)
            _Pragma("GCC unroll 4")
            for (int j = 0; j < NT; j++)
                _mm256_storeu_ps(m->acc + j * m->lda + i * 8, acc[i][j]);
    }
}

__attribute__((noinline)) static void micro1(const struct pp_mm_tile *m)
{
    micro(m, 1);
}

__attribute__((noinline)) static void micro2(const struct pp_mm_tile *m)
{
    micro(m, 2);
}

__attribute__((noinline)) static void micro3(const struct pp_mm_tile *m)
{
    micro(m, 3);
}

__attribute__((noinline)) static void micro4(const struct pp_mm_tile *m)
{
    micro(m, 4);
}

static const struct pp_mm_micro micro_avx2 = {
    MR, NR, PP_MM_MC_MAX / MR * MR, PP_MM_NC_MAX, {NULL, micro1, micro2, micro3, micro4}, 1, NULL};
_Static_assert(PP_MM_MC_MAX / MR * MR <= PP_MM_PANEL_ROWS, "the panel scratch holds a panel");

/* The cache lines a panel of rows [r, r + mc) × elements [k0, k0 + kl) is packed from, one run
 * per row group (row groups) or per row (row-major), at most PP_MM_PANEL_ROWS; and a cursor that
 * walks them in order, a few lines per micro-tile. */
struct panel_src {
    const char *line[PP_MM_PANEL_ROWS]; /* each run's first line */
    const char *end[PP_MM_PANEL_ROWS];  /* and its end */
    int n, run;                         /* runs; the run the cursor is in */
    const char *at;                     /* the cursor's line */
};

static void panel_src(struct panel_src *ps, const struct pp_mm_args *a, int64_t r, int64_t mc,
                      int64_t k0, int64_t kl)
{
    enum pp_dtype dt = a->dtype;
    int64_t ue = pp__unit_elems(dt), ub = pp__unit_bytes(dt);
    ps->n = 0;
    for (int64_t g = 0; g < mc; g += PP_ROW_GROUP) {
        int64_t nr = mc - g < PP_ROW_GROUP ? mc - g : PP_ROW_GROUP;
        struct pp_row_group q = pp__row_group(dt, a->cols, a->grouped, nr);
        const char *gb = (const char *)a->w + (r + g) * a->row_bytes;
        /* the units that [k0, k0 + kl) touches, a short last unit included */
        int64_t u0 = k0 / ue, u1 = (k0 + kl + ue - 1) / ue;
        for (int64_t i = 0; i < (a->grouped ? 1 : nr); i++) {
            const char *p = a->grouped ? gb + u0 * q.unit_stride : gb + i * q.row_off + u0 * ub;
            ps->line[ps->n] = (const char *)((uintptr_t)p & ~(uintptr_t)63);
            ps->end[ps->n++] = p + (u1 - u0) * (a->grouped ? q.unit_stride : ub);
        }
    }
    ps->run = 0;
    ps->at = ps->n ? ps->line[0] : NULL;
}

/* The lines of all the runs. */
static int64_t panel_src_lines(const struct panel_src *ps)
{
    int64_t lines = 0;
    for (int i = 0; i < ps->n; i++)
        lines += (ps->end[i] - ps->line[i] + 63) / 64;
    return lines;
}

/* Asks for the cursor's next count lines into L2: the next panel's weights arrive while the
 * micro-kernel sweeps this one, a few lines per micro-tile, and packing it then reads L2, not
 * memory (0.3 µs to pack a 12-row f16 panel from L2 against 1.1 µs from memory on the Xeon
 * host). Always inlined: GCC 12 takes a function whose only effects are prefetches for one
 * without side effects and deletes the calls to it. */
AI void panel_src_prefetch(struct panel_src *ps, int64_t count)
{
    for (; count > 0 && ps->run < ps->n; count--) {
        _mm_prefetch(ps->at, _MM_HINT_T1);
        ps->at += 64;
        if (ps->at >= ps->end[ps->run] && ++ps->run < ps->n)
            ps->at = ps->line[ps->run];
    }
}

/* The lane sums of a (row, token) pair live in acc scratch token by token: token j's rows of the
 * super-block side by side, so that a micro-tile's rows of one token are one run of memory. */
void pp__mm_packed_avx2(const struct pp_mm_args *a, int64_t r0, int64_t r1,
                        const struct pp_mm_scratch *s, const struct pp_mm_micro *k)
{
    pp_mm_pack_fn packer = k->pack ? k->pack : pp__mm_pack_avx2;
    int64_t cols = a->cols, mr = k->mr, nr = k->nr, mc = k->mc;
    for (int64_t t0 = 0; t0 < a->n; t0 += k->nc) {
        int64_t nc = a->n - t0 < k->nc ? a->n - t0 : k->nc;
        /* a super-block of rows whose partial sums (sb × nc × 8 floats) fit the acc scratch: each
         * chunk of x then serves all its panels while it is in L2 */
        int64_t sb = PP_MM_ACC_CAP / (nc * 8) / mr * mr;
        for (int64_t rs = r0; rs < r1; rs += sb) {
            int64_t rs1 = r1 - rs < sb ? r1 : rs + sb;
            for (int64_t k0 = 0; k0 < cols; k0 += PP_MM_KC) {
                int64_t kl = cols - k0 < PP_MM_KC ? cols - k0 : PP_MM_KC;
                int64_t steps = (kl + 7) / 8;
                struct pp_mm_tile m;
                m.ldx = a->ldx;
                m.full = kl & ~(int64_t)7;
                m.rem = kl - m.full;
                m.lda = sb * 8;
                m.first = k0 == 0;
                m.last = k0 + kl == cols;
                m.ldy = a->rows;
                for (int64_t rb = rs; rb < rs1; rb += mc) {
                    int64_t mcl = rs1 - rb < mc ? rs1 - rb : mc;
                    packer(s->panel, a, rb, mcl, k0, kl, (int)mr);
                    /* the panel packed next: the next rows of this chunk, or the super-block's
                     * first rows in the next chunk */
                    struct panel_src next;
                    next.n = 0;
                    if (rb + mc < rs1)
                        panel_src(&next, a, rb + mc, rs1 - rb - mc < mc ? rs1 - rb - mc : mc, k0,
                                  kl);
                    else if (k0 + kl < cols)
                        panel_src(&next, a, rs, rs1 - rs < mc ? rs1 - rs : mc, k0 + kl,
                                  cols - k0 - kl < PP_MM_KC ? cols - k0 - kl : PP_MM_KC);
                    int64_t mps = (mcl + mr - 1) / mr, tiles = (nc + nr - 1) / nr * mps;
                    int64_t per = (panel_src_lines(&next) + tiles - 1) / tiles;
                    /* a token group's chunk stays in L1 while it sweeps the panel, also in L1 */
                    for (int64_t t = 0; t < nc; t += nr) {
                        int64_t left = nc - t < nr ? nc - t : nr;
                        m.x = a->x + (t0 + t) * a->ldx + k0;
                        for (int64_t p = 0; p < mcl; p += mr) {
                            m.pp = s->panel + (p / mr) * steps * mr * 8;
                            m.rows = mcl - p < mr ? (int)(mcl - p) : (int)mr;
                            m.acc = s->acc + (t * sb + rb - rs + p) * 8;
                            m.y = a->y + (t0 + t) * a->rows + rb + p;
                            if (k->acc_prefetch && !m.first && (p + mr < mcl || t + nr < nc)) {
                                /* the next tile's partial sums (the next rows of these tokens,
                                 * or the first rows of the next tokens) are in L2: asking for
                                 * them now hides the wait at that tile's start (AVX2: 3%
                                 * faster at 128 tokens on Zen 3; the AVX-512 tile, 32
                                 * prefetches for 8 tokens, does without) */
                                const float *na = p + mr < mcl
                                                      ? m.acc + mr * 8
                                                      : s->acc + ((t + nr) * sb + rb - rs) * 8;
                                for (int64_t j = 0; j < nr; j++) {
                                    const char *c = (const char *)(na + j * m.lda);
                                    for (int64_t off = 0; off < mr * 32; off += 64)
                                        _mm_prefetch(c + off, _MM_HINT_T0);
                                    _mm_prefetch(c + mr * 32 - 1, _MM_HINT_T0);
                                }
                            }
                            if (PP_MM_PANEL_PREFETCH && next.n)
                                panel_src_prefetch(&next, per);
                            k->fn[left](&m);
                        }
                    }
                }
            }
        }
    }
}

static const struct pp_simd avx2; /* this file's table, defined below */

static void matmul_rows_avx2(const struct pp_mm_args *a, int64_t r0, int64_t r1,
                             const struct pp_mm_scratch *s)
{
    /* the table's own limits, as the backend reads them (pp_mm_direct_max_tokens) */
    if (a->n <= pp_mm_direct_max_tokens(&avx2, a->grouped, a->amd_tiles))
        pp__mm_direct_avx2(a, r0, r1, s);
    else
        pp__mm_packed_avx2(a, r0, r1, s, &micro_avx2);
}

static float dot_avx2(const float *a, const float *b, int64_t n)
{
    __m256 acc = _mm256_setzero_ps();
    int64_t full = n & ~(int64_t)7;
    for (int64_t i = 0; i < full; i += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    if (full < n) {
        __m256i m = pp__tail_mask_avx(n - full);
        __m256 av = _mm256_maskload_ps(a + full, m), bv = _mm256_maskload_ps(b + full, m);
        acc = _mm256_fmadd_ps(av, bv, acc);
    }
    return pp__merge8_avx(acc);
}

/* One query against rows [0, m) of b, four rows at a time: four independent chains, each
 * pp__dot's order, so the FMA latency is hidden (one dot alone waits on its single chain). */
static void dots1_avx2(float *out, const float *a, const float *const *b, int64_t m, int64_t n)
{
    int64_t full = n & ~(int64_t)7, i = 0;
    __m256i mk = pp__tail_mask_avx(n - full);
    for (; i + 4 <= m; i += 4) {
        __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
        const float *b0 = b[i], *b1 = b[i + 1], *b2 = b[i + 2], *b3 = b[i + 3];
        for (int64_t k = 0; k < full; k += 8) {
            __m256 av = _mm256_loadu_ps(a + k);
            c0 = _mm256_fmadd_ps(av, _mm256_loadu_ps(b0 + k), c0);
            c1 = _mm256_fmadd_ps(av, _mm256_loadu_ps(b1 + k), c1);
            c2 = _mm256_fmadd_ps(av, _mm256_loadu_ps(b2 + k), c2);
            c3 = _mm256_fmadd_ps(av, _mm256_loadu_ps(b3 + k), c3);
        }
        if (full < n) {
            __m256 av = _mm256_maskload_ps(a + full, mk);
            c0 = _mm256_fmadd_ps(av, _mm256_maskload_ps(b0 + full, mk), c0);
            c1 = _mm256_fmadd_ps(av, _mm256_maskload_ps(b1 + full, mk), c1);
            c2 = _mm256_fmadd_ps(av, _mm256_maskload_ps(b2 + full, mk), c2);
            c3 = _mm256_fmadd_ps(av, _mm256_maskload_ps(b3 + full, mk), c3);
        }
        out[i] = pp__merge8_avx(c0);
        out[i + 1] = pp__merge8_avx(c1);
        out[i + 2] = pp__merge8_avx(c2);
        out[i + 3] = pp__merge8_avx(c3);
    }
    for (; i < m; i++)
        out[i] = dot_avx2(a, b[i], n);
}

/* Two queries (at a and a + n) × four rows of b: eight chains, each pp__dot's order, merged
 * together (pp__merge8x8_avx); out[q * ldo + r] for query q and row r. */
AI void dots_2x4(float *out, int64_t ldo, const float *a, const float *const *b, int64_t n,
                 __m256i mk, const float *const *pf)
{
    __m256 acc[8]; /* query q, row r at 4q + r */
    _Pragma("GCC unroll 8")
    for (int c = 0; c < 8; c++)
        acc[c] = _mm256_setzero_ps();
    const float *rows[4] = {b[0], b[1], b[2], b[3]};
    int64_t full = n & ~(int64_t)7;
    for (int64_t k = 0; k < full; k += 8) {
        __m256 q0 = _mm256_loadu_ps(a + k), q1 = _mm256_loadu_ps(a + n + k);
        if (pf && (k & 15) == 0) { /* a line of each of the rows pf every other step */
            _Pragma("GCC unroll 4")
            for (int r = 0; r < 4; r++)
                _mm_prefetch((const char *)(pf[r] + k), _MM_HINT_T0);
        }
        _Pragma("GCC unroll 4")
        for (int r = 0; r < 4; r++) {
            __m256 kv = _mm256_loadu_ps(rows[r] + k);
            acc[r] = _mm256_fmadd_ps(q0, kv, acc[r]);
            acc[4 + r] = _mm256_fmadd_ps(q1, kv, acc[4 + r]);
        }
    }
    if (full < n) {
        __m256 q0 = _mm256_maskload_ps(a + full, mk), q1 = _mm256_maskload_ps(a + n + full, mk);
        _Pragma("GCC unroll 4")
        for (int r = 0; r < 4; r++) {
            __m256 kv = _mm256_maskload_ps(rows[r] + full, mk);
            acc[r] = _mm256_fmadd_ps(q0, kv, acc[r]);
            acc[4 + r] = _mm256_fmadd_ps(q1, kv, acc[4 + r]);
        }
    }
    __m256 sums = pp__merge8x8_avx(acc);
    _mm_storeu_ps(out, _mm256_castps256_ps128(sums));
    _mm_storeu_ps(out + ldo, _mm256_extractf128_ps(sums, 1));
}

/* Queries in pairs against rows in fours (dots_2x4), each row read once per pair, the first pair
 * asking for the rows PP_ATTN_KEYS_AHEAD ahead; the rows and query left over one dot at a time. */
static void dots_avx2(float *out, int64_t ldo, const float *a, int64_t g, const float *const *b,
                      int64_t m, int64_t n)
{
    __m256i mk = pp__tail_mask_avx(n & 7);
    int64_t q = 0;
    for (; q + 2 <= g; q += 2) {
        int64_t i = 0;
        for (; i + 4 <= m; i += 4) {
            int ahead = q == 0 && i + PP_ATTN_KEYS_AHEAD + 4 <= m;
            dots_2x4(out + q * ldo + i, ldo, a + q * n, b + i, n, mk,
                     ahead ? b + i + PP_ATTN_KEYS_AHEAD : NULL);
        }
        for (; i < m; i++) {
            out[q * ldo + i] = dot_avx2(a + q * n, b[i], n);
            out[(q + 1) * ldo + i] = dot_avx2(a + (q + 1) * n, b[i], n);
        }
    }
    if (q < g)
        dots1_avx2(out + q * ldo, a + q * n, b, m, n);
}

/* NQ queries × 16 elements of y from j, every row passing once: 2 NQ chains in registers. */
AI void wsum_tile(float *y, const float *w, int64_t ldw, const float *const *x, int64_t m,
                  int64_t n, int64_t j, int64_t pf, int NQ)
{
    __m256 acc[4][2];
    _Pragma("GCC unroll 4")
    for (int q = 0; q < NQ; q++) {
        acc[q][0] = _mm256_loadu_ps(y + q * n + j);
        acc[q][1] = _mm256_loadu_ps(y + q * n + j + 8);
    }
    for (int64_t i = 0; i < m; i++) {
        const float *xi = x[i] + j;
        if (pf && i + pf < m) /* the elements of row i + pf */
            _mm_prefetch((const char *)(x[i + pf] + j), _MM_HINT_T0);
        __m256 v0 = _mm256_loadu_ps(xi), v1 = _mm256_loadu_ps(xi + 8);
        _Pragma("GCC unroll 4")
        for (int q = 0; q < NQ; q++) {
            __m256 wv = _mm256_broadcast_ss(w + q * ldw + i);
            acc[q][0] = _mm256_fmadd_ps(wv, v0, acc[q][0]);
            acc[q][1] = _mm256_fmadd_ps(wv, v1, acc[q][1]);
        }
    }
    _Pragma("GCC unroll 4")
    for (int q = 0; q < NQ; q++) {
        _mm256_storeu_ps(y + q * n + j, acc[q][0]);
        _mm256_storeu_ps(y + q * n + j + 8, acc[q][1]);
    }
}

/* Queries in fours × 16 elements (wsum_tile), each row's elements read once per four queries, the
 * first four asking for the row PP_ATTN_VALUES_AHEAD ahead; an element tail of fewer than 16 one
 * query and 8 or 1 elements at a time. */
static void wsum_avx2(float *y, const float *w, int64_t ldw, int64_t g, const float *const *x,
                      int64_t m, int64_t n)
{
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        int64_t q = 0;
        for (; q + 4 <= g; q += 4)
            wsum_tile(y + q * n, w + q * ldw, ldw, x, m, n, j, q ? 0 : PP_ATTN_VALUES_AHEAD, 4);
        int64_t pf = q ? 0 : PP_ATTN_VALUES_AHEAD;
        if (g - q == 3)
            wsum_tile(y + q * n, w + q * ldw, ldw, x, m, n, j, pf, 3);
        else if (g - q == 2)
            wsum_tile(y + q * n, w + q * ldw, ldw, x, m, n, j, pf, 2);
        else if (g - q == 1)
            wsum_tile(y + q * n, w + q * ldw, ldw, x, m, n, j, pf, 1);
    }
    for (int64_t q = 0; q < g; q++) {
        float *yq = y + q * n;
        const float *wq = w + q * ldw;
        int64_t e = j;
        for (; e + 8 <= n; e += 8) {
            __m256 r = _mm256_loadu_ps(yq + e);
            for (int64_t i = 0; i < m; i++)
                r = _mm256_fmadd_ps(_mm256_set1_ps(wq[i]), _mm256_loadu_ps(x[i] + e), r);
            _mm256_storeu_ps(yq + e, r);
        }
        for (; e < n; e++)
            for (int64_t i = 0; i < m; i++)
                yq[e] = fmaf(wq[i], x[i][e], yq[e]);
    }
}

/* pp__expf on eight lanes, operation for operation (kernels/cpu/cpu-impl.h). */
AI __m256 exp8(__m256 x)
{
    __m256 xc = _mm256_max_ps(_mm256_set1_ps(PP_EXP_LO), x); /* NaN: maxps returns x */
    xc = _mm256_min_ps(_mm256_set1_ps(PP_EXP_HI), xc);
    __m256 kf = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(PP_EXP_LOG2E)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fmadd_ps(kf, _mm256_set1_ps(-PP_EXP_LN2_HI), xc);
    r = _mm256_fmadd_ps(kf, _mm256_set1_ps(-PP_EXP_LN2_LO), r);
    __m256 p = _mm256_set1_ps(PP_EXP_P0);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(PP_EXP_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(PP_EXP_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(PP_EXP_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(PP_EXP_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(PP_EXP_P5));
    __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    __m256i k = _mm256_cvtps_epi32(kf); /* kf is integral: exact (a NaN lane is replaced below) */
    __m256i k1 = _mm256_srai_epi32(k, 1), k2 = _mm256_sub_epi32(k, k1);
    const __m256i bias = _mm256_set1_epi32(127);
    __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k1, bias), 23));
    __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k2, bias), 23));
    y = _mm256_mul_ps(_mm256_mul_ps(y, s1), s2);
    return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

static void exp_shift_avx2(float *x, float shift, int64_t n)
{
    const __m256 sv = _mm256_set1_ps(shift);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), sv)));
    for (; i < n; i++)
        x[i] = pp__expf(x[i] - shift);
}

/* x[i] *= scale, and the largest (kernels/cpu/simd.h, pp_scale_max_fn): maxps(s, m) is s > m ? s
 * : m, so a NaN lane keeps m, as the portable loop does. */
static float scale_max_avx2(float *x, float scale, int64_t n)
{
    const __m256 sv = _mm256_set1_ps(scale);
    __m256 mv = _mm256_set1_ps(-INFINITY);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), sv);
        _mm256_storeu_ps(x + i, v);
        mv = _mm256_max_ps(v, mv);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, mv);
    return pp__scale_max_finish(lanes, 8, x, scale, i, n);
}

static void scale_add_avx2(float *y, float a, const float *x, float b, int64_t n)
{
    const __m256 av = _mm256_set1_ps(a), bv = _mm256_set1_ps(b);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(y + i), av),
                                              _mm256_mul_ps(_mm256_loadu_ps(x + i), bv)));
    for (; i < n; i++)
        y[i] = y[i] * a + x[i] * b;
}

static void swiglu_avx2(float *out, const float *gate, const float *up, int64_t n)
{
    const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 g = _mm256_loadu_ps(gate + i);
        __m256 e = exp8(_mm256_xor_ps(g, sign));
        __m256 v = _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + i));
        _mm256_storeu_ps(out + i, v);
    }
    for (; i < n; i++)
        out[i] = pp__swiglu1(gate[i], up[i]);
}

static void f16_avx2(float *dst, const void *src, int64_t n)
{
    const uint16_t *s = src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
    for (; i < n; i++)
        dst[i] = pp_f16_to_f32(s[i]);
}

static void bf16_avx2(float *dst, const void *src, int64_t n)
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

static const struct pp_simd avx2 = {"avx2",         matmul_rows_avx2, dot_avx2,
                                    dots_avx2,      wsum_avx2,        exp_shift_avx2,
                                    scale_max_avx2, scale_add_avx2,   swiglu_avx2,
                                    f16_avx2,       bf16_avx2,        pp__q8_act_avx2,
                                    pp__mm_q8_avx2, NULL,             PP_MM_DIRECT_ROWS_MAX_TOKENS,
                                    PP_MM_DIRECT_ROWS_MAX_TOKENS_AMD};

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

const struct pp_simd *pp__simd_avx2(void)
{
    return &avx2;
}

#else

const struct pp_simd *pp__simd_avx2(void)
{
    return 0;
}

#endif
