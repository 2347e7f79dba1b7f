/* The CPU backend's inner loops, in three implementations chosen once at run time from the CPU's
 * features: AVX-512 (kernels/cpu/simd_avx512.c), AVX2 + FMA + F16C (kernels/cpu/simd_avx2.c) and
 * portable C (kernels/cpu/simd.c). All follow the one canonical reduction order of pp__dot
 * (kernels/cpu/cpu-impl.h): eight lanes of fused multiply-adds in increasing index, then a fixed
 * merge. Weight conversions are exact. So an output element's bits never depend on which path a
 * machine takes, how many tokens share the call, or which rows a thread was given. */
#ifndef PP_SIMD_H
#define PP_SIMD_H

#include <stdint.h>

#include "common/status.h"
#include "kernels/dtype.h"

/* Cache blocking of the many-token matmul path (kernels/cpu/simd_avx2.c). The reduction is cut
 * into KC-element chunks whose eight-lane partial sums are kept in memory between chunks, which
 * continues each lane's chain exactly: blocking never changes a bit. A micro-tile's 12 partial
 * sums go to memory and back once per chunk, so chunks are long: with KC = 512 (64 steps) the
 * micro-kernel runs at 89% of the FMA peak from L1 on Zen 3, against 84% with 256; the panel
 * (MC × KC f32) and one token group's chunk (4 × KC f32) then share L1. */
#ifndef PP_MM_KC
#define PP_MM_KC 512 /* reduction elements per chunk (a multiple of 32) */
#endif
#ifndef PP_MM_MC_MAX
#define PP_MM_MC_MAX 9 /* weight rows per packed AVX2 panel (with KC: 18 KiB of L1's 32) */
#endif
#ifndef PP_MM_MC_AVX512
#define PP_MM_MC_AVX512 12 /* weight rows per packed AVX-512 panel (24 KiB of L1's 48) */
#endif
/* Rows the panel scratch holds: the larger of the two. */
#define PP_MM_PANEL_ROWS (PP_MM_MC_MAX > PP_MM_MC_AVX512 ? PP_MM_MC_MAX : PP_MM_MC_AVX512)
#ifndef PP_MM_ACC_CAP
#define PP_MM_ACC_CAP 49152 /* floats of per-thread partial sums: rows × tokens × 8 */
#endif
/* Tokens per pass over the weights: each pass packs the weights again, but its activation chunks
 * (NC × KC f32) and partial sums stay in L2 (on two threads at 128 tokens, 64 is 3-4% faster than
 * one pass of all 128 with AVX2 on Zen 3's 512 KiB L2; the AVX-512 nest, on a 2 MiB L2, took 128
 * tokens per pass 10% faster than 64). */
#ifndef PP_MM_NC_MAX
#define PP_MM_NC_MAX 64
#endif
#ifndef PP_MM_NC_AVX512
#define PP_MM_NC_AVX512 128
#endif

/* Rows ahead whose keys (dots) and values (wsum) attention's first queries ask for as they pass
 * over a chunk's rows: at decode the rows come from memory, and demand loads alone kept too few
 * lines in flight (AVX-512, a batch of 8 sequences at 2048 positions on 2 threads read K and V at
 * 13.5 GB/s without, 16.9 with; docs/benchmarks.md). The later queries find them in L1 or L2. */
#define PP_ATTN_KEYS_AHEAD 32
#define PP_ATTN_VALUES_AHEAD 16

/* Up to this many tokens the vector matmul reads weights directly (decode nest); more go through
 * packed panels. Below it, converting the weights in registers once per token tile beats packing
 * them (pp_bench_matmul, 1 thread, f16 and Q8_0: the direct nest 1.2-1.6x faster at 13-20 tokens,
 * even at 24, mixed at 32). Since the AVX-512 tiles take up to 8 tokens (kernels/cpu/simd_avx512.c)
 * the direct nest leads up to 32: pp_bench_loops, one thread, the packed nest against the direct
 * one at once on the two CPUs and swapped, GB/s, f16 21 tokens 5.68-5.72 → 6.67-6.69, 28
 * 4.46-4.48 → 5.02, 32 4.05-4.18 → 4.29-4.54, 40 level, 48 2% and 64 6% behind (f32 40 tokens 5-8%
 * ahead, 48-64 level); with PP_SIMD=avx2, f16 21 tokens 3.78-3.84 → 4.10-4.15, 32 level;
 * pp_bench_matmul, two threads, f16 GFLOP/s at 21 tokens 180.8-182.7 → 211.3-211.6, at 32
 * 223.0-223.6 → 230.2-230.4 (docs/benchmarks.md). */
#ifndef PP_MM_DIRECT_MAX_TOKENS
#define PP_MM_DIRECT_MAX_TOKENS 32
#endif
/* The same for row-major weights (mapped from the file, cpu_weights = "map"; a table's
 * direct_max_rows). The AVX-512 table reads them with the AVX2 tiles, and past 12 tokens its
 * packed nest is faster (pp_bench_matmul --layout rows, two threads, two rounds alternated, f16
 * GFLOP/s, the direct nest → the packed one: 8 tokens 127.1, 128.3 → 110.7, 109.2; 12: 138.4,
 * 136.1 → 137.2, 139.6; 16: 142.6, 142.4 → 160.2, 157.6; 20: 144.3, 146.3 → 172.1, 177.3; 24:
 * 148.8, 145.7 → 189.9, 191.3; 32: 152.6, 152.5 → 207.3, 206.8). The AVX2 table keeps 20 (with
 * PP_SIMD=avx2, 13 tokens 129.2, 131.7 direct against 119.2, 120.9 packed; 16-20 level). */
#ifndef PP_MM_DIRECT_ROWS_MAX_TOKENS
#define PP_MM_DIRECT_ROWS_MAX_TOKENS 20
#endif
#ifndef PP_MM_DIRECT_ROWS_MAX_TOKENS_AVX512
#define PP_MM_DIRECT_ROWS_MAX_TOKENS_AVX512 12
#endif
/* The AVX2 table where its AMD tiles run (pp_simd_amd_tiles): row-major rows go in spaced tiles
 * (kernels/cpu/simd_x86_direct.h, dtile_spaced_rows), which keep ahead of the packed nest up to
 * 32 tokens. Zen 3, pp_bench_matmul --threads 2 --layout both, the copy's rate (row groups, read
 * directly) over the rows', two rounds, the packed nest → the direct one: f16 21 tokens 1.24, 1.28
 * → 1.08, 1.08; 24: 1.24, 1.31 → 1.08, 1.08; 32: 1.18, 1.25 → 1.09, 1.11; bf16 21: 1.12, 1.18 →
 * 1.04, 1.02; 32: 1.07, 1.13 → 1.06, 1.07; 16 (direct in both) level (docs/benchmarks.md). */
#ifndef PP_MM_DIRECT_ROWS_MAX_TOKENS_AMD
#define PP_MM_DIRECT_ROWS_MAX_TOKENS_AMD 32
#endif

/* Up to this many tokens the AVX-512 few-token nest reads four row groups (12 rows) per tile
 * instead of two (kernels/cpu/simd_avx512.c). */
#ifndef PP_MM_FOUR_GROUPS_MAX_TOKENS
#define PP_MM_FOUR_GROUPS_MAX_TOKENS 4
#endif

/* Reduction blocking of the few-token nest (kernels/cpu/simd_x86_direct.h): a block holds at most
 * this many activation floats (n tokens × block length: 256 KiB, in L2), and block lengths are a
 * multiple of ALIGN (whole Q8_0 blocks, whole 8-lane steps). Each block after the first reads a row
 * group's weights in another piece, which restarts the stream: with 64 KiB blocks the tinyllama
 * down projection (5632 columns) in two blocks streamed 8.3 GB/s at 4 tokens on one thread of the
 * Xeon host against 12.0 in one block (pp_bench_matmul), and 10.0 against 15.8 at 2 tokens with 32
 * KiB blocks. Blocks whose activations fit L1 (16 KiB) were slower on Zen 3 for the same reason.
 * Blocking never changes a bit. */
#ifndef PP_MM_DIRECT_KB_FLOATS
#define PP_MM_DIRECT_KB_FLOATS 65536
#endif
#define PP_MM_DIRECT_KB_ALIGN 32

/* One matmul y[n, rows] = x[n, cols] · wᵀ as the inner loops see it. */
struct pp_mm_args {
    float *y;          /* [n, rows] */
    const float *x;    /* [n, cols], token t's row at x + t * ldx */
    int64_t ldx;       /* floats from one token's activations to the next's, >= cols */
    const void *w;     /* [rows, cols] stored as dtype */
    enum pp_dtype dtype;
    int64_t rows;
    int64_t cols;
    int64_t n;
    int64_t row_bytes; /* bytes of one stored weight row */
    int grouped;       /* w in row groups (kernels/cpu/row_groups.h): then r0 (and r1 unless it is
                        * rows) of matmul_rows are multiples of PP_ROW_GROUP */
    int prefetch_l2;   /* the few-token nest's software prefetch goes to L2, not L1
                        * (pp_simd_prefetch_l2); never changes a bit */
    const int8_t *xq;  /* Q8_0 weights: the activations in int8, [n, cols] */
    const float *xd;   /* and their block scales, [n, cols / 32] (kernels/cpu/matmul_q8.h) */
    const int32_t *xpair; /* and, where the table has q8_pairs, the tokens in pairs (NULL when not
                           * built), with */
    const int32_t *xneg;  /* their -128-sums (kernels/cpu/matmul_q8.h, pp__q8_pairs_fill) */
    int amd_tiles;        /* the AVX2 table's few-token tiles over f32/f16/bf16 row groups as
                           * tuned on AMD CPUs (pp_simd_amd_tiles); never changes a bit */
};

/* Per-thread scratch of one matmul call. */
struct pp_mm_scratch {
    float *row;   /* [cols] one weight row in f32 (portable path) */
    float *panel; /* [PP_MM_PANEL_ROWS * PP_MM_KC] packed f32 weight panel */
    float *acc;   /* [PP_MM_ACC_CAP] eight-lane partial sums */
    char *q8_split; /* [pp__q8_split_bytes(cols)] Q8_0 rows of the file rewritten in the copy's
                     * layout (kernels/cpu/matmul_q8.h); NULL: none, the file's rows read in
                     * place */
};

/* Computes y for weight rows [r0, r1) and every token. */
typedef void (*pp_mm_rows_fn)(const struct pp_mm_args *a, int64_t r0, int64_t r1,
                              const struct pp_mm_scratch *s);
/* The canonical dot product pp__dot. */
typedef float (*pp_dot_fn)(const float *a, const float *b, int64_t n);
/* out[q * ldo + i] = pp__dot(a + q * n, b[i], n) for q in [0, g) and i in [0, m): g vectors, one
 * after another, against m rows found anywhere (the queries of one KV head against the keys of an
 * attention chunk in the paged cache, each key read once for all of them). */
typedef void (*pp_dots_fn)(float *out, int64_t ldo, const float *a, int64_t g,
                           const float *const *b, int64_t m, int64_t n);
/* For q in [0, g) and i = 0, 1, ..., m-1 in that order, y[q * n + j] = fmaf(w[q * ldw + i],
 * x[i][j], y[q * n + j]) for j in [0, n): g weighted sums of the same m rows found anywhere (the
 * values of an attention chunk, read once for a KV head's queries), one fused multiply-add per
 * element and row. */
typedef void (*pp_wsum_fn)(float *y, const float *w, int64_t ldw, int64_t g,
                           const float *const *x, int64_t m, int64_t n);
/* x[i] = pp__expf(x[i] - shift) for i in [0, n) (kernels/cpu/cpu-impl.h): attention's softmax. */
typedef void (*pp_exp_shift_fn)(float *x, float shift, int64_t n);
/* x[i] *= scale for i in [0, n), and returns the largest x[i] after it: NaNs are passed over (-inf
 * when all are NaN) and a zero maximum comes back as +0, so that every table and every order of
 * comparison give the same bits (attention's scaled scores and their max). */
typedef float (*pp_scale_max_fn)(float *x, float scale, int64_t n);
/* y[i] = y[i] * a + x[i] * b for i in [0, n), each product and the sum rounded (no fused
 * multiply-add): attention's merge of a chunk's weighted sums into the running ones. */
typedef void (*pp_scale_add_fn)(float *y, float a, const float *x, float b, int64_t n);
/* out[i] = pp__swiglu1(gate[i], up[i]) for i in [0, n) (kernels/cpu/cpu-impl.h). */
typedef void (*pp_swiglu_fn)(float *out, const float *gate, const float *up, int64_t n);
/* pp_row_to_f32 for f16/bf16 (other dtypes use the portable function). */
typedef void (*pp_convert_fn)(float *dst, const void *src, int64_t n);
/* Quantizes one row of cols floats (a multiple of 32) to int8 in 32-element blocks: q[cols] and
 * d[cols / 32] block scales (the canonical rule of kernels/cpu/matmul_q8.h). */
typedef void (*pp_q8_act_fn)(int8_t *q, float *d, const float *x, int64_t cols);
/* Interleaves the int8 activations of tokens t0 and t1 (t1 may be t0) for the Q8_0 pair tiles:
 * xpair and xneg of one pair, blocks · 16 int32 each (kernels/cpu/matmul_q8.h). */
typedef void (*pp_q8_pairs_fn)(int32_t *xpair, int32_t *xneg, const int8_t *q0, const int8_t *q1,
                               int64_t blocks);

struct pp_simd {
    const char *name; /* "avx512", "avx2" or "portable" */
    pp_mm_rows_fn matmul_rows;
    pp_dot_fn dot;
    pp_dots_fn dots;
    pp_wsum_fn wsum;
    pp_exp_shift_fn exp_shift;
    pp_scale_max_fn scale_max;
    pp_scale_add_fn scale_add;
    pp_swiglu_fn swiglu;
    pp_convert_fn f16_to_f32;
    pp_convert_fn bf16_to_f32;
    pp_q8_act_fn q8_act;
    /* matmul_rows takes f32, f16 and bf16 weights; matmul_q8 Q8_0 ones, in integers, reading
     * pp_mm_args.xq and xd (kernels/cpu/matmul_q8.h), and xpair and xneg where set */
    pp_mm_rows_fn matmul_q8;
    /* NULL where matmul_q8 has no pair tiles */
    pp_q8_pairs_fn q8_pairs;
    /* the most tokens matmul_rows reads row-major weights directly (in row groups:
     * PP_MM_DIRECT_MAX_TOKENS), without and with pp_mm_args.amd_tiles; more go through packed
     * panels */
    int64_t direct_max_rows, direct_max_rows_amd;
};

/* The most tokens table s's matmul_rows reads directly, in row groups or row-major, with
 * pp_mm_args.amd_tiles = amd_tiles. */
static inline int64_t pp_mm_direct_max_tokens(const struct pp_simd *s, int grouped, int amd_tiles)
{
    return grouped ? PP_MM_DIRECT_MAX_TOKENS
                   : amd_tiles ? s->direct_max_rows_amd : s->direct_max_rows;
}

/* The best implementation for this CPU. PP_SIMD in the environment caps it: "portable", "avx2" or
 * "avx512" (tests and benchmarks use it to run the paths side by side; a path the CPU lacks gives
 * the best one below it; another value is ignored here, and pp_simd_check_env refuses it).
 * Thread-safe; the tables are immutable once returned. */
const struct pp_simd *pp_simd_get(void);
/* PP_OK, or PP_ERR_INVALID_ARG with a message when PP_SIMD or PP_PREFETCH is set to an unknown
 * value. */
pp_status pp_simd_check_env(void);
/* Where the few-token matmul nest prefetches the weights it streams: 1 for L2, 0 for L1.
 * PP_PREFETCH=l1|l2 in the environment decides; otherwise it is L2 on AMD CPUs with AVX-512
 * (Zen 4 and later, where prefetching into L2 streamed one token's weights 10% faster) and L1
 * elsewhere (Zen 3 and the Xeon hosts measured L2 level or slower). Read when a backend is
 * created, as PP_SIMD is. */
int pp_simd_prefetch_l2(void);

/* Whether the AVX2 table's few-token nest over f32, f16 and bf16 weights in row groups takes the
 * tiles measured on Zen 3 (kernels/cpu/simd_avx2.c): one token four spaced groups at a time,
 * three and four tokens one group at a time. 1 on AMD CPUs; elsewhere the tiles measured on the
 * Xeon host under PP_SIMD=avx2 (two adjacent groups for one to four tokens). Never changes a
 * bit. */
int pp_simd_amd_tiles(void);

/* Whether Q8_0 matmuls of PP_Q8_PAIRS_MIN_TOKENS or more tokens may take the zmm pair tiles, where
 * the table has them (pp_simd.q8_pairs): 1 except on AMD CPUs, whose Zen 4 tuning keeps the ymm
 * tiles (the pair tiles were measured on the Xeon host only). PP_PREFETCH does not change it. */
int pp_simd_q8_pairs_here(void);
/* The pair builder Q8_0 matmuls on table s use on this CPU: s->q8_pairs where
 * pp_simd_q8_pairs_here, else NULL (no pair tiles). */
pp_q8_pairs_fn pp_simd_q8_pairs(const struct pp_simd *s);
const struct pp_simd *pp_simd_portable(void);
/* The table named "portable", "avx2" or "avx512", or NULL when the name is unknown or this CPU or
 * build cannot run it. */
const struct pp_simd *pp_simd_named(const char *name);

/* The AVX2/FMA/F16C table, and the AVX-512 one (AVX-512F and DQ besides), or NULL when this
 * build has none (not x86-64 GCC/Clang). Callers must check the CPU's features first;
 * pp_simd_get does. */
const struct pp_simd *pp__simd_avx2(void);
const struct pp_simd *pp__simd_avx512(void);

#endif
