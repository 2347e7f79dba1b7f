/* Q8_0 matmul in integers. Each token's activations are quantized to int8 in 32-element blocks
 * first, as Q8_0 weights are, and a block's products are summed exactly in int32 before one f32
 * multiply-add applies both scales: int8 dot products (AVX-512 VNNI vpdpbusd, or AVX2
 * vpmaddubsw + vpmaddwd) do 32 multiply-adds where the f32 form converted and scaled each weight
 * first, which bounded a core at about 19 GB/s of Q8_0 weights on the Zen 4 host
 * (docs/benchmarks.md).
 *
 * The canonical arithmetic, which every path (portable, AVX2, AVX-512) gives bit for bit:
 *  - activations: per block of 32 floats x, amax = max |x|; a block holding an inf or NaN gets
 *    d = NaN and q = 0 (so its outputs are NaN); otherwise d = amax / 127 (f32 division), and when
 *    d < FLT_MIN (a block of zeros, or of magnitudes all below 127 · FLT_MIN) d = 0 and q = 0, else
 *    q = rint(x · (1 / d)) (round half to even), which lies in [-127, 127];
 *  - y = merge8(lanes) (pp__merge8, the same fixed merge as pp__dot) where, for each block b in
 *    increasing order and each lane j in 0-7, s = Σ_{e<4} w_q[32b + 4j + e] · x_q[32b + 4j + e]
 *    (int32, exact) and lane_j = fmaf((float)s, d_w[b] · d_x[b], lane_j), the scale product
 *    rounded to f32 once.
 * Only integers are summed before the scales, so a thread count, a batch composition, a row layout
 * or an instruction set never changes a bit. */
#ifndef PP_CPU_MATMUL_Q8_H
#define PP_CPU_MATMUL_Q8_H

#include <stdint.h>

#include "kernels/cpu/simd.h"

/* Bytes of activations in int8 for n tokens of cols. */
static inline int64_t pp__q8_act_bytes(int64_t n, int64_t cols)
{
    return n * cols + n * (cols / PP_Q8_0_BLOCK) * (int64_t)sizeof(float);
}

/* Points a->xq and a->xd into buf (pp__q8_act_bytes(a->n, a->cols) bytes). */
void pp__q8_act_bind(struct pp_mm_args *a, void *buf);
/* Quantizes tokens [t0, t1) of a->x into the buffer bound to a. */
void pp__q8_act_fill(const struct pp_mm_args *a, pp_q8_act_fn act, int64_t t0, int64_t t1);

/* The pair tiles of AVX-512 VNNI (Q8_ZMM in kernels/cpu/matmul_q8_x86.h) run from this many
 * tokens (three went as a pair and a token alone, slower than the ymm tile: pp_bench_matmul, two
 * threads, 131 against 150 GFLOP/s), where pp_simd_q8_pairs_here allows, reading the activations
 * as pairs built once per matmul. Pair p holds tokens 2p and 2p + 1 (an odd last token twice),
 * per block 16 int32: xpair's lane 2i is token 2p's four bytes 4i..4i+3 of the block and lane
 * 2i + 1 token 2p + 1's, and xneg's lane is Q8Z_MAGIC (kernels/cpu/matmul_q8_x86.h) minus 128
 * times the sum of that lane's four bytes (a lane's sum starts there, taking back what the copy's
 * weights, stored biased by 128, add, and ending as the bits of a float). Only a layout: no bit
 * of a result depends on it. */
#define PP_Q8_PAIRS_MIN_TOKENS 4
/* Whether a matmul of n tokens reads pairs, built by fn (pp_simd_q8_pairs; NULL: none). */
static inline int pp__q8_pairs_wanted(pp_q8_pairs_fn fn, int64_t n)
{
    return fn && n >= PP_Q8_PAIRS_MIN_TOKENS;
}
/* Where the pairs of n tokens of cols go in a buffer that holds their int8 first (bound by
 * pp__q8_act_bind): the next line after the int8. */
static inline int64_t pp__q8_pairs_offset(int64_t n, int64_t cols)
{
    return (pp__q8_act_bytes(n, cols) + 63) / 64 * 64;
}
/* Bytes of the pairs of n tokens of cols, 64-byte aligned. */
static inline int64_t pp__q8_pairs_bytes(int64_t n, int64_t cols)
{
    return 2 * ((n + 1) / 2) * (cols / PP_Q8_0_BLOCK) * 64;
}
/* Points a->xpair and a->xneg into buf (pp__q8_pairs_bytes(a->n, a->cols) bytes, 64-byte
 * aligned), or to NULL when buf is NULL. */
void pp__q8_pairs_bind(struct pp_mm_args *a, void *buf);
/* Builds the pairs whose first token is in [t0, t1) (t0 even) from a->xq, once a->xq holds
 * both tokens of each. */
void pp__q8_pairs_fill(const struct pp_mm_args *a, pp_q8_pairs_fn fn, int64_t t0, int64_t t1);

/* Row-major rows (a->grouped 0: the mapped file, or a tensor-parallel worker's slices, used in
 * place) over a table's threshold of tokens or more: a thread rewrites each tile's rows once into
 * its scratch (pp_mm_scratch.q8_split) in the copy's split-row layout (kernels/cpu/row_groups.h:
 * a row's scales, then its int8 stored q + 128), and the tile's token tiles read them there as
 * the copy's, where each token tile had taken the rows' -128-sums, biased its activations and
 * loaded 34-byte blocks across cache lines again, block by block.
 * Only addresses change, never a bit. pp_bench_matmul --layout both (the copy's rows against the
 * file's, passes alternating), two threads, two rounds, groups / rows: 128 tokens 1.71 →
 * 1.01-1.02, 64 1.68 → 1.03-1.05, 24 1.67 → 1.27-1.35, 8 1.78-1.89 → 1.62-1.69; with
 * PP_SIMD=avx2 128 tokens 1.36-1.48 → 0.97-1.01, 8 1.34-1.35 → 1.23-1.25. Below 8 tokens, where
 * the rows are read by fewer token tiles, the rewrite cost more than it saved (4 and 6 tokens
 * 1.50-1.61 → 1.84-2.06; with PP_SIMD=avx2, 3 and 4 tokens 1.14-1.39 → 1.46-1.62), so the VNNI
 * table splits from 8 tokens. Those figures predate the file's scales gathered in registers
 * (q8_row_scales8, kernels/cpu/matmul_q8_x86.h), which made the unsplit rows faster: on Zen 3
 * (AVX2 table), two threads, two rounds, groups / rows with the split from 8 tokens against
 * without it, 8 tokens 1.34-1.40 against 1.10-1.17, 16 1.19 against 1.11-1.12, 24 1.12-1.15
 * against 1.13-1.14, 32 1.10-1.11 against 1.13, 64 1.03-1.04 against 1.13-1.18, 128 1.00-1.02
 * against 1.11-1.14, so the AVX2 table splits from 24. Rows rewritten at once, one row's bytes
 * there (scales and int8 each starting a cache line) and all of them. */
#define PP_Q8_SPLIT_ROWS 6
#define PP_Q8_SPLIT_MIN_TOKENS_VNNI 8
#define PP_Q8_SPLIT_MIN_TOKENS_AVX2 24
static inline int64_t pp__q8_split_q_offset(int64_t cols) /* where a row's int8 start */
{
    return (2 * (cols / PP_Q8_0_BLOCK) + 63) / 64 * 64;
}
static inline int64_t pp__q8_split_row_bytes(int64_t cols)
{
    return pp__q8_split_q_offset(cols) + (cols + 63) / 64 * 64;
}
static inline int64_t pp__q8_split_bytes(int64_t cols)
{
    return PP_Q8_SPLIT_ROWS * pp__q8_split_row_bytes(cols);
}

/* The canonical quantization of one block of 32 floats; returns its scale. */
float pp__q8_act_block(int8_t *q, const float *x);
void pp__q8_act_portable(int8_t *q, float *d, const float *x, int64_t cols);

/* Rows [r0, r1) of a Q8_0 matmul whose a->xq, a->xd hold the activations in int8. */
void pp__mm_q8_portable(const struct pp_mm_args *a, int64_t r0, int64_t r1,
                        const struct pp_mm_scratch *s);
#if defined(__x86_64__) && defined(__GNUC__)
/* The same with AVX2 (vpmaddubsw) and with AVX-512 VNNI (vpdpbusd on ymm), and the AVX2
 * quantization. Callers check the CPU's features. */
void pp__mm_q8_avx2(const struct pp_mm_args *a, int64_t r0, int64_t r1,
                    const struct pp_mm_scratch *s);
void pp__mm_q8_vnni(const struct pp_mm_args *a, int64_t r0, int64_t r1,
                    const struct pp_mm_scratch *s);
void pp__q8_act_avx2(int8_t *q, float *d, const float *x, int64_t cols);
void pp__q8_pairs_vnni(int32_t *xpair, int32_t *xneg, const int8_t *q0, const int8_t *q1,
                       int64_t blocks);
#endif

/* Where row r of a Q8_0 weight keeps block 0: its int8 at *q and its f16 scale at *d, block b's
 * at b · *q_stride and b · *d_stride further: 34 and 34 in the file's row-major blocks, 32 and 2
 * in the split rows of a->grouped, whose int8 are stored XOR PP_Q8_GROUP_BIAS
 * (kernels/cpu/row_groups.h). Inline: the tiles call it for every row. */
static inline void pp__q8_row_at(const struct pp_mm_args *a, int64_t r, const char **q,
                                 const char **d, int64_t *q_stride, int64_t *d_stride)
{
    int64_t blocks = a->cols / PP_Q8_0_BLOCK;
    const char *row = (const char *)a->w + r * a->row_bytes;
    *d = row;
    *q = a->grouped ? row + 2 * blocks : row + 2;
    *q_stride = a->grouped ? PP_Q8_0_BLOCK : PP_Q8_0_BYTES;
    *d_stride = a->grouped ? 2 : PP_Q8_0_BYTES;
}

#endif
