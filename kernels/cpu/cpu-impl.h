/* Internals shared by the CPU backend's op files. */
#ifndef PP_CPU_IMPL_H
#define PP_CPU_IMPL_H

#include <math.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/threadpool.h"

enum pp_cpu_scratch_slot {
    PP_CPU_SCRATCH_ROW = 0, /* a weight row converted to f32 */
    PP_CPU_SCRATCH_SCORES,  /* attention: one chunk's scores and one partial output */
    PP_CPU_SCRATCH_PARTS,   /* attention split across threads: chunk partials (shared) */
    PP_CPU_SCRATCH_PANEL,   /* packed f32 weight panel of the many-token matmul */
    PP_CPU_SCRATCH_ACC,     /* eight-lane partial sums of the many-token matmul */
    PP_CPU_SCRATCH_Q8_SPLIT, /* a Q8_0 tile's rows of the file in the copy's layout */
    PP_CPU_SCRATCH_COUNT
};

struct pp_cpu {
    struct pp_threadpool *pool;
    const struct pp_simd *simd; /* inner loops for this CPU */
    int prefetch_l2;            /* pp_simd_prefetch_l2, chosen with simd */
    int amd_tiles;              /* pp_simd_amd_tiles */
    pp_q8_pairs_fn q8_pairs;    /* pp_simd_q8_pairs(simd), chosen with it */
    int n_threads;
    int map_weights;     /* weight_load uses weights in place instead of copying them */
    int64_t max_cols;    /* as reserved */
    int64_t max_context; /* as reserved */
    float *scratch[PP_CPU_SCRATCH_COUNT]; /* [n_threads, cap[slot]] */
    int64_t cap[PP_CPU_SCRATCH_COUNT];
    float *x_padded;      /* many-token matmul activations, rows padded (kernels/cpu/matmul.c) */
    int64_t x_padded_cap; /* floats */
};

/* Tokens per slice of a many-token matmul whose activation rows are copied to a padded stride
 * (kernels/cpu/matmul.c), the floats added to each row, and the floats its buffer needs for rows
 * of up to max_cols. */
#define PP_MM_X_PADDED_TOKENS 128
#define PP_MM_X_PAD 16
static inline int64_t pp__cpu_x_padded_floats(int64_t max_cols)
{
    return PP_MM_X_PADDED_TOKENS * (max_cols + PP_MM_X_PAD);
}

/* exp(x) in float, one fixed sequence of correctly rounded operations, which the AVX2 loops
 * (kernels/cpu/simd_avx2.c, exp8) repeat lane by lane, so both paths give the same bits: x is
 * clamped to [-104, 89] (NaN passes), k = rint(x·log2 e), r = x − k·ln 2 in two steps (ln 2 split
 * as 0.693359375 − 2.12194440e-4), exp(r) ≈ ((P(r)·r² + r) + 1) with the degree-5 minimax P of
 * Cephes' expf, then scaled by 2^(k>>1) and 2^(k−(k>>1)) (each a normal float, so exp overflows to
 * inf above 88.72 and goes through the denormals below −87.3). About 1 ulp from exp. */
#define PP_EXP_LO (-104.0f)
#define PP_EXP_HI 89.0f
#define PP_EXP_LOG2E 1.44269504088896341f
#define PP_EXP_LN2_HI 0.693359375f
#define PP_EXP_LN2_LO (-2.12194440e-4f)
#define PP_EXP_P0 1.9875691500e-4f
#define PP_EXP_P1 1.3981999507e-3f
#define PP_EXP_P2 8.3334519073e-3f
#define PP_EXP_P3 4.1665795894e-2f
#define PP_EXP_P4 1.6666665459e-1f
#define PP_EXP_P5 5.0000001201e-1f

static inline float pp__pow2i(int32_t e)
{
    uint32_t b = (uint32_t)(e + 127) << 23;
    float f;
    memcpy(&f, &b, sizeof(f));
    return f;
}

static inline float pp__expf(float x)
{
    float xc = PP_EXP_LO > x ? PP_EXP_LO : x; /* as maxps(lo, x): a NaN x stays */
    xc = PP_EXP_HI < xc ? PP_EXP_HI : xc;     /* as minps(hi, x) */
    float kf = rintf(xc * PP_EXP_LOG2E);
    float r = fmaf(kf, -PP_EXP_LN2_HI, xc);
    r = fmaf(kf, -PP_EXP_LN2_LO, r);
    float p = PP_EXP_P0;
    p = fmaf(p, r, PP_EXP_P1);
    p = fmaf(p, r, PP_EXP_P2);
    p = fmaf(p, r, PP_EXP_P3);
    p = fmaf(p, r, PP_EXP_P4);
    p = fmaf(p, r, PP_EXP_P5);
    float y = fmaf(p, r * r, r) + 1.0f;
    int32_t k = kf == kf ? (int32_t)kf : 0;
    int32_t k1 = k >> 1;
    y = y * pp__pow2i(k1) * pp__pow2i(k - k1);
    return x != x ? x : y;
}

/* silu(g)·u = g / (1 + exp(−g)) · u with pp__expf. */
static inline float pp__swiglu1(float g, float u)
{
    return g / (1.0f + pp__expf(-g)) * u;
}

/* The end of pp_simd.scale_max (kernels/cpu/simd.h) in every table: folds the vector loop's
 * lanes[n_lanes] into a max from -inf, then scales x[i..n) and folds them, each step keeping the
 * max unless a value is greater (so NaNs are passed over); a zero max comes back as +0. */
static inline float pp__scale_max_finish(const float *lanes, int n_lanes, float *x, float scale,
                                         int64_t i, int64_t n)
{
    float m = -INFINITY;
    for (int l = 0; l < n_lanes; l++)
        m = lanes[l] > m ? lanes[l] : m;
    for (; i < n; i++) {
        float v = x[i] * scale;
        x[i] = v;
        m = v > m ? v : m;
    }
    return m + 0.0f;
}

/* The fixed merge of the eight lanes of a canonical dot product. */
static inline float pp__merge8(const float l[8])
{
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

static inline struct pp_cpu *pp__cpu(struct pp_backend *be)
{
    return be->impl;
}

/* Makes each thread's scratch of `slot` hold at least n floats. Call before pp_threadpool_run.
 * Returns 0 on success, -1 when the allocation failed (the op then cannot run). */
int pp__cpu_scratch_reserve(struct pp_cpu *c, enum pp_cpu_scratch_slot slot, int64_t n);

static inline float *pp__cpu_scratch(struct pp_cpu *c, enum pp_cpu_scratch_slot slot, int thread)
{
    return c->scratch[slot] + (int64_t)thread * c->cap[slot];
}

/* The one dot product of the CPU backend, the canonical reduction order every path follows:
 * eight lanes, lane j accumulates elements i ≡ j (mod 8) in increasing i with a fused multiply-add
 * (one rounding per element), then the fixed merge ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)). Padding
 * both vectors with zeros to a multiple of 8 changes nothing (a lane is never -0, so
 * fma(0,0,l) = l), which is what lets the vector kernels run a ragged tail as one more zero-padded
 * step. An output element's bits depend only on its operands. fmaf is correctly rounded by
 * definition, so this portable form and the AVX2/FMA kernels give the same bits. */
static inline float pp__dot(const float *a, const float *b, int64_t n)
{
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            acc[j] = fmaf(a[i + j], b[i + j], acc[j]);
    for (int j = 0; i + j < n; j++)
        acc[j] = fmaf(a[i + j], b[i + j], acc[j]);
    return pp__merge8(acc);
}

/* Per-thread attention scratch (floats) for head dims up to max_cols, and per-thread share of the
 * split-mode chunk partials for contexts up to max_context (kernels/cpu/attention.c). */
int64_t pp__cpu_attn_scratch(int64_t max_cols);
int64_t pp__cpu_attn_parts(int64_t max_cols, int64_t max_context);

void pp__cpu_matmul(struct pp_backend *be, float *y, const float *x, const struct pp_weight *w,
                    int64_t n);
void pp__cpu_matmul_many(struct pp_backend *be, int count, float *const y[], const float *x,
                         const struct pp_weight *const w[], int64_t n);
void pp__cpu_rmsnorm(struct pp_backend *be, float *y, const float *x, const float *g, int64_t n,
                     int64_t dim, float eps);
void pp__cpu_rope(struct pp_backend *be, float *x, const int32_t *pos, int64_t n, int32_t n_heads,
                  int32_t head_dim, const float *inv_freq, enum pp_rope_layout layout);
void pp__cpu_kv_store(struct pp_backend *be, const struct pp_kv_view *kv, int32_t layer,
                      const struct pp_attn_seq *seqs, int32_t n_seqs, const float *k,
                      const float *v);
void pp__cpu_attention(struct pp_backend *be, float *out, const float *q,
                       const struct pp_kv_view *kv, int32_t layer, const struct pp_attn_seq *seqs,
                       int32_t n_seqs, const struct pp_attn_shape *shape);
void pp__cpu_swiglu(struct pp_backend *be, float *out, const float *gate, const float *up,
                    int64_t n);
void pp__cpu_add(struct pp_backend *be, float *y, const float *x, int64_t n);
void pp__cpu_add_bias(struct pp_backend *be, float *y, const float *b, int64_t n, int64_t cols);
void pp__cpu_embed(struct pp_backend *be, float *out, const struct pp_weight *w, const int32_t *ids,
                   int64_t n);
void pp__cpu_add_gated(struct pp_backend *be, float *y, const float *x, const float *g, int64_t n,
                       int64_t cols);
void pp__cpu_gather_rows(struct pp_backend *be, float *dst, const float *src, const int32_t *rows,
                         int64_t n, int64_t cols);
void pp__cpu_scatter_add_rows(struct pp_backend *be, float *dst, const float *src,
                              const int32_t *rows, const float *w, int64_t n, int64_t cols);
void pp__cpu_moe_route(struct pp_backend *be, int32_t *pick, float *weight, float *logits,
                       int64_t n, int32_t n_experts, int32_t k, enum pp_route_mode mode,
                       int renormalise);
pp_status pp__cpu_topk(struct pp_backend *be, int32_t *ids, float *vals, const float *logits,
                       int64_t n, int64_t vocab, int32_t k);

/* memory.c: host memory is the CPU backend's memory */
pp_status pp__cpu_buf_alloc(struct pp_backend *be, enum pp_mem_category cat, int64_t bytes,
                            void **out);
void pp__cpu_buf_free(struct pp_backend *be, enum pp_mem_category cat, void *p);
void pp__cpu_copy(struct pp_backend *be, void *dst, const void *src, int64_t bytes);
void pp__cpu_zero(struct pp_backend *be, void *p, int64_t bytes);
pp_status pp__cpu_copy_out(struct pp_backend *be, void *dst, const void *src, int64_t bytes);
pp_status pp__cpu_sync(struct pp_backend *be);
pp_status pp__cpu_weight_load(struct pp_backend *be, const struct pp_weight *w, int resident,
                              struct pp_weight *out);
void pp__cpu_weight_free(struct pp_backend *be, struct pp_weight *w);
pp_status pp__cpu_vec_load(struct pp_backend *be, const float *v, int64_t n, int resident,
                           const float **out);
void pp__cpu_vec_free(struct pp_backend *be, const float *v);

#endif
