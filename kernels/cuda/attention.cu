// Causal attention over the paged KV cache with the CPU's masks: a query at position p sees keys
// [first, p], first = p - window + 1 with a sliding window (else 0). f32 except the tensor-core
// prefill below.
//
// Decode (parts of at most DEC_MAX_TOKENS tokens): flash-decoding. A block takes one query row,
// one KV head with its G query heads, and one split of the row's keys; it walks the split in tiles
// of DEC_TK keys with a running max and sum. With one split it writes the output; with more,
// partials (max, sum, unnormalised output) go to the workspace and a second kernel merges each
// row's splits in split order. The split count is chosen so the grid fills the GPU.
//
// Prefill (longer parts): a block takes a tile of consecutive rows of one part and one KV head,
// its query vectors being the rows × the G heads sharing the KV head. Head dims 64 and 128 run on
// the tensor cores (attn_prefill_tc_kernel, mma.sync m16n8k16, 128 query vectors per block):
// queries (pre-scaled), keys, values and probabilities rounded to f16, products accumulated in
// f32, the online softmax in f32 on the fragments; each warp owns 16 query vectors, keys and
// values come in tiles of 64 through shared memory as f16. Other head dims take the f32 kernel (64
// query vectors per block): keys and values in tiles of 32 through shared memory, each warp
// holding RPW query vectors' running state and outputs in registers (lane l owns head dimensions
// l, l + 32, ...).
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/cuda-impl.cuh"
#include "kernels/cuda/reduce.cuh"

#define DEC_MAX_TOKENS PP_CUDA_ATTN_DECODE_TOKENS /* parts up to this many take the decode kernel */
#define DEC_THREADS 128
#define DEC_TK 32        /* keys per tile of the decode kernel: one per 4 threads */
#define DEC_MAXG PP_CUDA_ATTN_DECODE_MAX_G /* query heads per KV head the decode kernel holds */
#define DEC_MIN_SPLIT 32 /* keys per split at least */
#define MAX_HEAD_DIM 256
#define PRE_THREADS 128  /* 4 warps */

/* The geometry every attention kernel needs, passed by value. */
struct attn_args {
    const float *pool;
    const struct pp_cuda_seq *seqs;
    const int32_t *bt;
    const int32_t *row_seq;
    const int32_t *row_pos;
    int32_t layer;
    int32_t n_layers;
    int32_t block_size;
    int32_t kv_dim;
    int64_t block_elems;
    int32_t n_heads;
    int32_t n_kv_heads;
    int32_t head_dim;
    int32_t window;
    float scale;
};

/* Element offset of position p's K row (V is block_elems further) for KV head kvh. Positions fit
 * 32 bits (contexts are int32), so the division is a 32-bit one. */
__device__ __forceinline__ int64_t key_offset(const struct attn_args &a, const int32_t *btab,
                                              int64_t p, int32_t kvh)
{
    int32_t p32 = (int32_t)p, blk = p32 / a.block_size, slot = p32 - blk * a.block_size;
    int64_t b = btab[blk];
    return (b * a.n_layers + a.layer) * 2 * a.block_elems + (int64_t)slot * a.kv_dim +
           (int64_t)kvh * a.head_dim;
}

__device__ __forceinline__ int64_t first_key(int64_t qpos, int32_t window)
{
    return window > 0 && qpos - window + 1 > 0 ? qpos - window + 1 : 0;
}

/* ---- decode ---------------------------------------------------------------------------------- */

/* grid (decode rows, KV heads, splits), DEC_THREADS threads; GM >= G (the query heads beyond G are
 * zero and never written). Shared: the tile's key offsets [DEC_TK] (int64), q [GM][hd], the tile's
 * values [DEC_TK][hd], scores [GM][DEC_TK], running max, sum and this tile's rescale [GM].
 * Scores: four threads per key, each a quarter of the head dims (interleaved float4 words when
 * head_dim % 16 == 0), loads in batches of 8; values go to shared memory in batches of 8 float4
 * per thread, and thread t accumulates dims t and t + DEC_THREADS of every head. */
template <int GM>
__global__ void __launch_bounds__(DEC_THREADS)
    attn_decode_kernel(float *out, float *part, const float *q, struct attn_args a,
                       const int32_t *drows, int32_t n_split)
{
    extern __shared__ float sm[];
    int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    int32_t r = drows[blockIdx.x], kvh = blockIdx.y, split = blockIdx.z;
    int32_t s = a.row_seq[r];
    int32_t hd = a.head_dim, G = a.n_heads / a.n_kv_heads;
    int64_t *koff = (int64_t *)sm;
    float *qs = (float *)(koff + DEC_TK), *vs = qs + GM * hd, *sc = vs + DEC_TK * hd;
    float *ms = sc + GM * DEC_TK, *ls = ms + GM, *al = ls + GM;
    int64_t qpos = a.row_pos[r], first = first_key(qpos, a.window);
    int64_t span = qpos - first + 1, chunk = (span + n_split - 1) / n_split;
    int64_t k0 = first + (int64_t)split * chunk, k1 = k0 + chunk - 1 < qpos ? k0 + chunk - 1 : qpos;
    const float *qr = q + (int64_t)r * a.n_heads * hd + (int64_t)kvh * G * hd;
    for (int i = tid; i < GM * hd; i += DEC_THREADS)
        qs[i] = i < G * hd ? qr[i] : 0.0f;
    for (int i = tid; i < GM * DEC_TK; i += DEC_THREADS)
        sc[i] = 0.0f;
    if (tid < GM) {
        ms[tid] = -INFINITY;
        ls[tid] = 0.0f;
        al[tid] = 1.0f;
    }
    float acc[GM][2];
#pragma unroll
    for (int g = 0; g < GM; g++)
        acc[g][0] = acc[g][1] = 0.0f;
    __syncthreads();
    const int32_t *btab = a.bt + a.seqs[s < 0 ? 0 : s].bt_off;
    bool vec = hd % 16 == 0 && (uintptr_t)a.pool % 16 == 0;
    int key = tid >> 2, quarter = tid & 3;
    for (int64_t kt = k0; s >= 0 && kt <= k1; kt += DEC_TK) {
        int nk = k1 - kt + 1 < DEC_TK ? (int)(k1 - kt + 1) : DEC_TK;
        if (tid < nk)
            koff[tid] = key_offset(a, btab, kt + tid, kvh);
        __syncthreads();
        /* the tile's values (a row past nk reads row 0 and is never used) */
        if (vec) {
            int w = hd / 4;
            for (int i0 = tid; i0 < DEC_TK * w; i0 += 8 * DEC_THREADS) {
                float4 v[8];
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    int i = i0 + u * DEC_THREADS, j = i / w;
                    j = i < DEC_TK * w && j < nk ? j : 0;
                    v[u] = ((const float4 *)(a.pool + koff[j] + a.block_elems))[i % w];
                }
#pragma unroll
                for (int u = 0; u < 8; u++)
                    if (i0 + u * DEC_THREADS < DEC_TK * w)
                        ((float4 *)vs)[i0 + u * DEC_THREADS] = v[u];
            }
        } else {
            for (int i = tid; i < DEC_TK * hd; i += DEC_THREADS) {
                int j = i / hd;
                vs[i] = j < nk ? a.pool[koff[j] + a.block_elems + i % hd] : 0.0f;
            }
        }
        /* scores of key `key` (quarter of its dims per thread) */
        float dot[GM];
#pragma unroll
        for (int g = 0; g < GM; g++)
            dot[g] = 0.0f;
        const float *krow = a.pool + koff[key < nk ? key : 0];
        if (vec) {
            int w4 = hd / 16; /* float4 words per quarter: word i * 4 + quarter */
            const float4 *k4 = (const float4 *)krow, *q4 = (const float4 *)qs;
            for (int i0 = 0; i0 < w4; i0 += 8) {
                float4 kk[8];
#pragma unroll
                for (int u = 0; u < 8; u++)
                    kk[u] = k4[(i0 + u < w4 ? i0 + u : 0) * 4 + quarter];
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    if (i0 + u >= w4)
                        break;
#pragma unroll
                    for (int g = 0; g < GM; g++) {
                        float4 qq = q4[g * (hd / 4) + (i0 + u) * 4 + quarter];
                        dot[g] += qq.x * kk[u].x + qq.y * kk[u].y + qq.z * kk[u].z +
                                  qq.w * kk[u].w;
                    }
                }
            }
        } else {
            for (int d = quarter; d < hd; d += 4) {
                float kd = krow[d];
#pragma unroll
                for (int g = 0; g < GM; g++)
                    dot[g] += qs[g * hd + d] * kd;
            }
        }
#pragma unroll
        for (int g = 0; g < GM; g++) {
            dot[g] += __shfl_xor_sync(0xffffffffu, dot[g], 1);
            dot[g] += __shfl_xor_sync(0xffffffffu, dot[g], 2);
        }
        if (quarter == 0 && key < nk)
#pragma unroll
            for (int g = 0; g < GM; g++)
                sc[g * DEC_TK + key] = dot[g] * a.scale;
        __syncthreads();
        /* running max and sum per head; scores become probabilities */
        for (int g = warp; g < G; g += DEC_THREADS / 32) {
            float *row = sc + g * DEC_TK;
            float x0 = lane < nk ? row[lane] : -INFINITY;
            float m_old = ms[g], m_new = fmaxf(m_old, pp_warp_max(x0));
            float p0 = lane < nk ? expf(x0 - m_new) : 0.0f;
            if (lane < nk)
                row[lane] = p0;
            float sum = pp_warp_sum(p0);
            if (lane == 0) {
                float alpha = expf(m_old - m_new); /* 0 on the first tile (m_old = -inf) */
                ms[g] = m_new;
                ls[g] = ls[g] * alpha + sum;
                al[g] = alpha;
            }
        }
        __syncthreads();
#pragma unroll
        for (int g = 0; g < GM; g++) {
            acc[g][0] *= al[g];
            acc[g][1] *= al[g];
        }
        int d0 = tid < hd ? tid : 0, d1 = tid + DEC_THREADS < hd ? tid + DEC_THREADS : 0;
#pragma unroll 4
        for (int j = 0; j < nk; j++) {
            float v0 = tid < hd ? vs[j * hd + d0] : 0.0f;
            float v1 = tid + DEC_THREADS < hd ? vs[j * hd + d1] : 0.0f;
#pragma unroll
            for (int g = 0; g < GM; g++) {
                float pj = sc[g * DEC_TK + j];
                acc[g][0] += pj * v0;
                acc[g][1] += pj * v1;
            }
        }
        __syncthreads(); /* koff, the values and sc are rewritten by the next tile */
    }
    if (s < 0)
        return;
#pragma unroll
    for (int g = 0; g < GM; g++) {
        if (g >= G)
            break;
        int32_t h = kvh * G + g;
        if (n_split == 1) {
            float *o = out + (int64_t)r * a.n_heads * hd + (int64_t)h * hd;
            float inv = 1.0f / ls[g];
            if (tid < hd)
                o[tid] = acc[g][0] * inv;
            if (tid + DEC_THREADS < hd)
                o[tid + DEC_THREADS] = acc[g][1] * inv;
        } else {
            float *p = part + (((int64_t)blockIdx.x * a.n_heads + h) * n_split + split) * (hd + 2);
            if (tid == 0) {
                p[0] = ms[g];
                p[1] = ls[g];
            }
            if (tid < hd)
                p[2 + tid] = acc[g][0];
            if (tid + DEC_THREADS < hd)
                p[2 + tid + DEC_THREADS] = acc[g][1];
        }
    }
}

/* The decode kernel for GM = 1 << i, and the index for G query heads per KV head. */
typedef void (*decode_kernel_fn)(float *, float *, const float *, struct attn_args,
                                 const int32_t *, int32_t);
static const decode_kernel_fn decode_kernels[] = {attn_decode_kernel<1>, attn_decode_kernel<2>,
                                                  attn_decode_kernel<4>, attn_decode_kernel<8>,
                                                  attn_decode_kernel<16>};
static int decode_index(int32_t G)
{
    return G <= 1 ? 0 : G <= 2 ? 1 : G <= 4 ? 2 : G <= 8 ? 3 : 4;
}

/* Shared memory of the decode kernel for GM heads of head_dim hd. */
static size_t decode_smem(int GM, int32_t hd)
{
    return sizeof(int64_t) * DEC_TK +
           sizeof(float) * ((size_t)GM * hd + (size_t)DEC_TK * hd + (size_t)GM * DEC_TK + 3 * GM);
}

/* grid (decode rows, heads), DEC_THREADS threads: merges a row's splits in split order. Splits that
 * saw no key (sum 0) are skipped. Shared: each split's weight exp(max - M) and sum. */
__global__ void attn_merge_kernel(float *out, const float *part, struct attn_args a,
                                  const int32_t *drows, int32_t n_split)
{
    extern __shared__ float wt[];
    __shared__ float red[32];
    int32_t r = drows[blockIdx.x], h = blockIdx.y, hd = a.head_dim;
    int tid = threadIdx.x;
    if (a.row_seq[r] < 0)
        return; /* uniform across the block */
    const float *p0 = part + ((int64_t)blockIdx.x * a.n_heads + h) * n_split * (hd + 2);
    /* the splits' maxima and sums in parallel; M and L in split order by thread 0 */
    float *sums = wt + n_split;
    for (int32_t s = tid; s < n_split; s += DEC_THREADS) {
        sums[s] = p0[s * (hd + 2) + 1];
        wt[s] = sums[s] > 0.0f ? p0[s * (hd + 2)] : -INFINITY;
    }
    __syncthreads();
    float M = -INFINITY;
    for (int32_t s = tid; s < n_split; s += DEC_THREADS)
        M = fmaxf(M, wt[s]);
    M = pp_block_max(M, red);
    for (int32_t s = tid; s < n_split; s += DEC_THREADS)
        wt[s] = wt[s] == -INFINITY ? 0.0f : expf(wt[s] - M);
    __syncthreads();
    if (tid == 0) {
        float L = 0.0f;
        for (int32_t s = 0; s < n_split; s++)
            L += sums[s] * wt[s];
        red[0] = 1.0f / L;
    }
    __syncthreads();
    float inv = red[0];
    float *o = out + (int64_t)r * a.n_heads * hd + (int64_t)h * hd;
    for (int d = tid; d < hd; d += DEC_THREADS) {
        float O = 0.0f;
#pragma unroll 8
        for (int32_t s = 0; s < n_split; s++)
            O += p0[s * (hd + 2) + 2 + d] * wt[s];
        o[d] = O * inv;
    }
}

/* ---- prefill --------------------------------------------------------------------------------- */

/* One prefill tile: part `seq`, rows [row0, row0 + n_rows). */
struct attn_tile {
    int32_t seq;
    int32_t row0;
    int32_t n_rows;
    int32_t pad;
};

/* HDC: head dimensions per lane (head_dim <= 32 * HDC); RPW: query vectors per warp. */
template <int HDC, int RPW> struct prefill_cfg {
    static constexpr int HP = HDC * 32; /* padded head dim */
    static constexpr int QT = 4 * RPW;  /* query vectors per block */
    static constexpr size_t smem = sizeof(float) * ((size_t)QT * HP + 32 * (HP + 1) + 32 * HP) +
                                   32 * sizeof(int64_t);
};

template <int HDC, int RPW>
__global__ void __launch_bounds__(PRE_THREADS)
    attn_prefill_kernel(float *out, const float *q, struct attn_args a,
                        const struct attn_tile *tiles)
{
    using C = prefill_cfg<HDC, RPW>;
    extern __shared__ float sm[];
    int64_t *kb = (int64_t *)sm;           /* [32] offsets of the tile's keys, -1 past the end */
    float *Qs = (float *)(kb + 32);        /* [QT][HP] */
    float *Ks = Qs + C::QT * C::HP;        /* [32][HP + 1] */
    float *Vs = Ks + 32 * (C::HP + 1);     /* [32][HP] */
    int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    struct attn_tile tile = tiles[blockIdx.x];
    int32_t kvh = blockIdx.y, hd = a.head_dim, G = a.n_heads / a.n_kv_heads;
    struct pp_cuda_seq sq = a.seqs[tile.seq];
    const int32_t *btab = a.bt + sq.bt_off;
    int64_t pos0 = (int64_t)sq.pos + (tile.row0 - sq.row);
    int64_t klast = pos0 + tile.n_rows - 1, kfirst = first_key(pos0, a.window);

    /* query vector qi = token (qi / G) of the tile, head kvh * G + qi % G */
#pragma unroll 8
    for (int idx = tid; idx < C::QT * C::HP; idx += PRE_THREADS) {
        int qi = idx / C::HP, d = idx % C::HP, t = qi / G;
        float v = 0.0f;
        if (t < tile.n_rows && d < hd)
            v = q[(int64_t)(tile.row0 + t) * a.n_heads * hd +
                  (int64_t)(kvh * G + qi % G) * hd + d];
        Qs[idx] = v;
    }
    /* the warp's query vectors: qi = warp * RPW + i, token (qi / G) at position pos0 + qi / G */
    float m[RPW], l[RPW], o[RPW][HDC];
#pragma unroll
    for (int i = 0; i < RPW; i++) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
#pragma unroll
        for (int c = 0; c < HDC; c++)
            o[i][c] = 0.0f;
    }
    for (int64_t k0 = kfirst; k0 <= klast; k0 += 32) {
        if (tid < 32)
            kb[tid] = k0 + tid <= klast ? key_offset(a, btab, k0 + tid, kvh) : -1;
        __syncthreads();
#pragma unroll 8
        for (int idx = tid; idx < 32 * C::HP; idx += PRE_THREADS) {
            int j = idx / C::HP, d = idx % C::HP;
            int64_t base = kb[j];
            float kv_k = 0.0f, kv_v = 0.0f;
            if (base >= 0 && d < hd) {
                kv_k = a.pool[base + d];
                kv_v = a.pool[base + a.block_elems + d];
            }
            Ks[j * (C::HP + 1) + d] = kv_k;
            Vs[j * C::HP + d] = kv_v;
        }
        __syncthreads();
        /* lane j scores key k0 + j against the warp's query vectors */
        int64_t p = k0 + lane;
        float s[RPW];
#pragma unroll
        for (int i = 0; i < RPW; i++)
            s[i] = 0.0f;
        for (int d = 0; d < hd; d++) {
            float kd = Ks[lane * (C::HP + 1) + d];
#pragma unroll
            for (int i = 0; i < RPW; i++)
                s[i] += Qs[(warp * RPW + i) * C::HP + d] * kd;
        }
#pragma unroll
        for (int i = 0; i < RPW; i++) {
            int t = (warp * RPW + i) / G;
            int64_t qp = pos0 + t;
            bool seen = t < tile.n_rows && p <= qp && p >= first_key(qp, a.window);
            float x = seen ? s[i] * a.scale : -INFINITY;
            float m_new = fmaxf(m[i], pp_warp_max(x));
            float pr = 0.0f, alpha = 1.0f;
            if (m_new != -INFINITY) {
                pr = seen ? expf(x - m_new) : 0.0f;
                alpha = expf(m[i] - m_new);
            }
            l[i] = l[i] * alpha + pp_warp_sum(pr);
            m[i] = m_new;
#pragma unroll
            for (int c = 0; c < HDC; c++)
                o[i][c] *= alpha;
            s[i] = pr;
        }
        for (int j = 0; j < 32; j++) {
            float vd[HDC];
#pragma unroll
            for (int c = 0; c < HDC; c++)
                vd[c] = Vs[j * C::HP + lane + 32 * c];
#pragma unroll
            for (int i = 0; i < RPW; i++) {
                float pj = __shfl_sync(0xffffffffu, s[i], j);
#pragma unroll
                for (int c = 0; c < HDC; c++)
                    o[i][c] += pj * vd[c];
            }
        }
        __syncthreads(); /* the tiles are rewritten next */
    }
#pragma unroll
    for (int i = 0; i < RPW; i++) {
        int qi = warp * RPW + i;
        if (qi / G >= tile.n_rows)
            continue;
        float *orow = out + (int64_t)(tile.row0 + qi / G) * a.n_heads * hd +
                      (int64_t)(kvh * G + qi % G) * hd;
        float inv = 1.0f / l[i];
#pragma unroll
        for (int c = 0; c < HDC; c++)
            if (lane + 32 * c < hd)
                orow[lane + 32 * c] = o[i][c] * inv;
    }
}

/* ---- prefill on the tensor cores (head dims 64 and 128) -------------------------------------- */

#define TC_KT 64 /* keys per tile */
#define TC_QT 128     /* query vectors per block: 16 per warp */
#define TC_THREADS 256 /* 8 warps: a key tile serves 128 query vectors */

/* Shared memory (f16 rows of HDP halves, a pitch that is 16 bytes past a multiple of 128, so the
 * eight rows an ldmatrix reads fall in distinct banks): key offsets [TC_KT] (int64), Q [TC_QT],
 * K [TC_KT], V [TC_KT]. */
template <int HD> struct tc_cfg {
    static constexpr int HDP = HD + 8;
    static constexpr size_t off_q = TC_KT * sizeof(int64_t);
    static constexpr size_t off_k = off_q + (size_t)TC_QT * HDP * 2;
    static constexpr size_t off_v = off_k + (size_t)TC_KT * HDP * 2;
    static constexpr size_t smem = off_v + (size_t)TC_KT * HDP * 2;
    static_assert((HDP * 2) % 16 == 0 && off_q % 16 == 0 && off_k % 16 == 0 && off_v % 16 == 0,
                  "ldmatrix needs 16-byte aligned rows");
};

/* d += a (16x16, row-major f16) * b (16x8, column-major f16), f32 accumulation. Fragments as the
 * PTX ISA lays them out for m16n8k16: with g = lane / 4 and t = lane % 4, a holds rows g and g + 8
 * at columns 2t, 2t + 1 (regs 0, 1) and 2t + 8, 2t + 9 (regs 2, 3); b holds column g at rows 2t,
 * 2t + 1 and 2t + 8, 2t + 9; d holds rows g (d[0], d[1]) and g + 8 (d[2], d[3]) at columns 2t,
 * 2t + 1. */
__device__ __forceinline__ void mma_16816(float *d, const uint32_t *a, uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Four 8x8 f16 matrices from shared memory: lanes 8i..8i+7 give the row addresses of matrix i;
 * r[i] gets row lane / 4, columns 2 (lane % 4), +1 of matrix i (of its transpose with TRANS). */
template <bool TRANS> __device__ __forceinline__ void ldsm_x4(uint32_t *r, const __half *p)
{
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    if (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
}

/* Four floats times z as four f16 at dst (8-byte aligned). */
__device__ __forceinline__ void store4_f16(__half *dst, float4 v, float z)
{
    __half2 *d = (__half2 *)dst;
    d[0] = __floats2half2_rn(v.x * z, v.y * z);
    d[1] = __floats2half2_rn(v.z * z, v.w * z);
}

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi)
{
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&h);
}

/* grid (tiles, KV heads), TC_THREADS (8 warps). Query vector qi = token qi / G of the tile, head
 * kvh * G + qi % G; warp w owns qi in [16w, 16w + 16). Scores, probabilities and outputs stay in
 * mma fragments (FlashAttention-2's layout): lane (g, t) holds rows g and g + 8 of its warp, and
 * keeps a partial sum of each row that the row's four lanes add at the end. Needs head_dim == HD
 * and a pool whose K and V rows are 16-byte aligned. */
template <int HD>
__global__ void __launch_bounds__(TC_THREADS)
    attn_prefill_tc_kernel(float *out, const float *q, struct attn_args a,
                           const struct attn_tile *tiles)
{
    using C = tc_cfg<HD>;
    extern __shared__ __align__(128) unsigned char tsm[];
    int64_t *kb = (int64_t *)tsm;
    __half *Qs = (__half *)(tsm + C::off_q), *Ks = (__half *)(tsm + C::off_k);
    __half *Vs = (__half *)(tsm + C::off_v);
    int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    struct attn_tile tile = tiles[blockIdx.x];
    int32_t kvh = blockIdx.y, G = a.n_heads / a.n_kv_heads;
    struct pp_cuda_seq sq = a.seqs[tile.seq];
    const int32_t *btab = a.bt + sq.bt_off;
    int64_t pos0 = (int64_t)sq.pos + (tile.row0 - sq.row);
    int64_t klast = pos0 + tile.n_rows - 1, kfirst = first_key(pos0, a.window);

    /* Loads go out in batches of 8 per thread, unconditionally (rows past the tile's end read a
     * real row, and the value is replaced by zero after): a load behind a branch waits for the
     * one before it, and the block would pay the memory latency once per element. */
    static_assert((TC_QT * HD / 4) % (8 * TC_THREADS) == 0, "whole batches of query words");
#pragma unroll
    for (int b = 0; b < TC_QT * HD / 4 / TC_THREADS; b += 8) {
        float4 v[8];
#pragma unroll
        for (int u = 0; u < 8; u++) {
            int idx = tid + (b + u) * TC_THREADS, qi = idx / (HD / 4), t = qi / G;
            int tr = t < tile.n_rows ? t : tile.n_rows - 1;
            v[u] = *(const float4 *)(q + (int64_t)(tile.row0 + tr) * a.n_heads * HD +
                                     (int64_t)(kvh * G + qi % G) * HD + idx % (HD / 4) * 4);
        }
#pragma unroll
        for (int u = 0; u < 8; u++) {
            int idx = tid + (b + u) * TC_THREADS, qi = idx / (HD / 4), d = idx % (HD / 4) * 4;
            /* log2(e) folded in: the softmax runs in base 2 (exp2f) */
            float sc = qi / G < tile.n_rows ? a.scale * 1.44269504088896341f : 0.0f;
            store4_f16(Qs + qi * C::HDP + d, v[u], sc);
        }
    }
    __syncthreads();
    /* this warp's queries as A fragments, one per 16 head dims */
    uint32_t qa[HD / 16][4];
#pragma unroll
    for (int k = 0; k < HD / 16; k++)
        ldsm_x4<false>(qa[k], Qs + (warp * 16 + (lane & 15)) * C::HDP + k * 16 + (lane >> 4) * 8);

    int g = lane >> 2, t4 = lane & 3;
    int32_t qp[2], qf[2];
    bool live[2];
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int qi = warp * 16 + g + 8 * h, tk = qi / G;
        live[h] = tk < tile.n_rows;
        qp[h] = (int32_t)pos0 + tk; /* positions fit 32 bits (contexts are int32) */
        qf[h] = (int32_t)first_key(qp[h], a.window);
    }
    float o[HD / 8][4];
#pragma unroll
    for (int n = 0; n < HD / 8; n++)
        o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

    for (int64_t k0 = kfirst; k0 <= klast; k0 += TC_KT) {
        if (tid < TC_KT)
            kb[tid] = k0 + tid <= klast ? key_offset(a, btab, k0 + tid, kvh) : -1;
        __syncthreads();
        constexpr int KN = TC_KT * HD / 4 / TC_THREADS, KB = KN < 8 ? KN : 8; /* words, batch */
        static_assert(KN % KB == 0, "whole batches of key words");
#pragma unroll
        for (int b = 0; b < KN; b += KB) {
            float4 kk[KB], vv[KB];
#pragma unroll
            for (int u = 0; u < KB; u++) {
                int idx = tid + (b + u) * TC_THREADS;
                int64_t base = kb[idx / (HD / 4)];
                base = (base >= 0 ? base : kb[0]) + idx % (HD / 4) * 4; /* kb[0]: a real key */
                kk[u] = *(const float4 *)(a.pool + base);
                vv[u] = *(const float4 *)(a.pool + base + a.block_elems);
            }
#pragma unroll
            for (int u = 0; u < KB; u++) {
                int idx = tid + (b + u) * TC_THREADS, j = idx / (HD / 4), d = idx % (HD / 4) * 4;
                float z = kb[j] >= 0 ? 1.0f : 0.0f;
                store4_f16(Ks + j * C::HDP + d, kk[u], z);
                store4_f16(Vs + j * C::HDP + d, vv[u], z);
            }
        }
        __syncthreads();
        /* scores s[n]: keys 8n..8n+7 of the tile (columns 2 t4, +1), rows g and g + 8 */
        float s[TC_KT / 8][4];
#pragma unroll
        for (int n = 0; n < TC_KT / 8; n++)
            s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
        for (int k = 0; k < HD / 16; k++)
#pragma unroll
            for (int n = 0; n < TC_KT / 8; n += 2) {
                uint32_t b[4]; /* keys 8n.. and 8n + 8.., dims 16k.. and 16k + 8.. */
                ldsm_x4<false>(b, Ks + (n * 8 + (lane & 7) + (lane >> 4) * 8) * C::HDP + k * 16 +
                                      ((lane >> 3) & 1) * 8);
                mma_16816(s[n], qa[k], b[0], b[1]);
                mma_16816(s[n + 1], qa[k], b[2], b[3]);
            }
        /* masks, running maxima (the row's four lanes agree), probabilities, rescaling */
        int32_t kt0 = (int32_t)k0;
        float alpha[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int lo = qf[h] - kt0 > 0 ? qf[h] - kt0 : 0;
            int hi = !live[h] ? -1 : qp[h] - kt0 < TC_KT - 1 ? qp[h] - kt0 : TC_KT - 1;
            float mx = -INFINITY;
#pragma unroll
            for (int n = 0; n < TC_KT / 8; n++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    int c = n * 8 + 2 * t4 + e;
                    float x = c >= lo && c <= hi ? s[n][2 * h + e] : -INFINITY;
                    s[n][2 * h + e] = x;
                    mx = fmaxf(mx, x);
                }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            float m_new = fmaxf(m[h], mx);
            alpha[h] = m_new == -INFINITY ? 1.0f : exp2f(m[h] - m_new); /* 0 while m is -inf */
            float sum = 0.0f;
#pragma unroll
            for (int n = 0; n < TC_KT / 8; n++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    float x = s[n][2 * h + e];
                    float pr = x == -INFINITY ? 0.0f : exp2f(x - m_new);
                    s[n][2 * h + e] = pr;
                    sum += pr;
                }
            l[h] = l[h] * alpha[h] + sum;
            m[h] = m_new;
        }
#pragma unroll
        for (int n = 0; n < HD / 8; n++) {
            o[n][0] *= alpha[0];
            o[n][1] *= alpha[0];
            o[n][2] *= alpha[1];
            o[n][3] *= alpha[1];
        }
        /* outputs += probabilities (A fragments straight from the score fragments) x values */
#pragma unroll
        for (int j = 0; j < TC_KT / 16; j++) {
            uint32_t pa[4] = {pack_half2(s[2 * j][0], s[2 * j][1]),
                              pack_half2(s[2 * j][2], s[2 * j][3]),
                              pack_half2(s[2 * j + 1][0], s[2 * j + 1][1]),
                              pack_half2(s[2 * j + 1][2], s[2 * j + 1][3])};
#pragma unroll
            for (int n = 0; n < HD / 8; n += 2) {
                uint32_t b[4]; /* keys 16j.. and 16j + 8.., dims 8n.. and 8n + 8.. */
                ldsm_x4<true>(b, Vs + (j * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * C::HDP +
                                     n * 8 + (lane >> 4) * 8);
                mma_16816(o[n], pa, b[0], b[1]);
                mma_16816(o[n + 1], pa, b[2], b[3]);
            }
        }
        __syncthreads(); /* the key tiles are rewritten next */
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float lsum = l[h];
        lsum += __shfl_xor_sync(0xffffffffu, lsum, 1);
        lsum += __shfl_xor_sync(0xffffffffu, lsum, 2);
        int qi = warp * 16 + g + 8 * h;
        if (!live[h])
            continue;
        float inv = 1.0f / lsum;
        float *dst = out + (int64_t)(tile.row0 + qi / G) * a.n_heads * HD +
                     (int64_t)(kvh * G + qi % G) * HD + 2 * t4;
#pragma unroll
        for (int n = 0; n < HD / 8; n++)
            *(float2 *)(dst + n * 8) = make_float2(o[n][2 * h] * inv, o[n][2 * h + 1] * inv);
    }
}

/* The prefill instantiations: head dims up to 64, 128 and 256. */
#define PRE_SMALL 2, 16
#define PRE_MID 4, 16
#define PRE_LARGE 8, 8

int pp__cuda_attention_setup(struct pp_cuda *c)
{
    size_t need[] = {prefill_cfg<PRE_SMALL>::smem, prefill_cfg<PRE_MID>::smem,
                     prefill_cfg<PRE_LARGE>::smem, tc_cfg<64>::smem, tc_cfg<128>::smem};
    const void *fns[] = {(const void *)attn_prefill_kernel<PRE_SMALL>,
                         (const void *)attn_prefill_kernel<PRE_MID>,
                         (const void *)attn_prefill_kernel<PRE_LARGE>,
                         (const void *)attn_prefill_tc_kernel<64>,
                         (const void *)attn_prefill_tc_kernel<128>};
    for (int i = 0; i < 5; i++) {
        if ((int64_t)need[i] > c->smem_optin)
            continue; /* that head size is refused at launch with a message */
        if (!CUDA_OK(c, cudaFuncSetAttribute(fns[i], cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)need[i])))
            return 0;
    }
    for (int i = 0; i < 5; i++) {
        size_t most = decode_smem(1 << i, MAX_HEAD_DIM);
        if ((int64_t)most > c->smem_optin)
            most = (size_t)c->smem_optin;
        if (!CUDA_OK(c, cudaFuncSetAttribute((const void *)decode_kernels[i],
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)most)))
            return 0;
    }
    return 1;
}

/* Query vectors per prefill block for head_dim hd. */
static int prefill_qt(int32_t hd)
{
    return hd <= 64 ? prefill_cfg<PRE_SMALL>::QT
           : hd <= 128 ? prefill_cfg<PRE_MID>::QT : prefill_cfg<PRE_LARGE>::QT;
}

template <int HDC, int RPW>
static void launch_prefill(struct pp_cuda *c, float *out, const float *q, const struct attn_args &a,
                           const struct attn_tile *tiles, int32_t n_tiles)
{
    size_t smem = prefill_cfg<HDC, RPW>::smem;
    if ((int64_t)smem > c->smem_optin) {
        pp__cuda_fail(c, "attention: head_dim %d needs %zu bytes of shared memory per block, the "
                      "device allows %d", a.head_dim, smem, c->smem_optin);
        return;
    }
    dim3 grid((unsigned)n_tiles, (unsigned)a.n_kv_heads);
    attn_prefill_kernel<HDC, RPW><<<grid, PRE_THREADS, smem, c->stream>>>(out, q, a, tiles);
    LAUNCH_OK(c, "attn_prefill_kernel");
}

static void launch_prefill_tc(struct pp_cuda *c, float *out, const float *q,
                              const struct attn_args &a, const struct attn_tile *tiles,
                              int32_t n_tiles)
{
    size_t smem = a.head_dim == 64 ? tc_cfg<64>::smem : tc_cfg<128>::smem;
    if ((int64_t)smem > c->smem_optin) {
        pp__cuda_fail(c, "attention: head_dim %d needs %zu bytes of shared memory per block on the "
                      "tensor cores, the device allows %d", a.head_dim, smem, c->smem_optin);
        return;
    }
    dim3 grid((unsigned)n_tiles, (unsigned)a.n_kv_heads);
    if (a.head_dim == 64)
        attn_prefill_tc_kernel<64><<<grid, TC_THREADS, smem, c->stream>>>(out, q, a, tiles);
    else
        attn_prefill_tc_kernel<128><<<grid, TC_THREADS, smem, c->stream>>>(out, q, a, tiles);
    LAUNCH_OK(c, "attn_prefill_tc_kernel");
}

void pp__cuda_attention(struct pp_backend *be, float *out, const float *q,
                        const struct pp_kv_view *kv, int32_t layer, const struct pp_attn_seq *seqs,
                        int32_t n_seqs, const struct pp_attn_shape *shape)
{
    struct pp_cuda *c = pp__cuda(be);
    struct pp_cuda_batch b;
    if (n_seqs <= 0 || !pp__cuda_enter(c))
        return;
    int32_t H = shape->n_heads, KH = shape->n_kv_heads, hd = shape->head_dim;
    if (KH < 1 || H % KH != 0 || hd < 1 || hd > MAX_HEAD_DIM || (int64_t)KH * hd > kv->kv_dim)
        return (void)pp__cuda_fail(c, "attention: expected n_kv_heads dividing n_heads, head_dim "
                                   "1..%d and n_kv_heads * head_dim <= kv_dim, got %d heads, %d KV "
                                   "heads, head_dim %d, kv_dim %d", MAX_HEAD_DIM, H, KH, hd,
                                   kv->kv_dim);
    /* prefill tiles: 128 query vectors on the tensor cores, else 64 */
    int32_t G = H / KH;
    int tc_ok = PP_CUDA_ATTN_TENSOR_CORES(hd) && (uintptr_t)kv->pool % 16 == 0 && G <= TC_QT;
    int32_t qt = tc_ok ? TC_QT : prefill_qt(hd), tt = qt / G;
    if (tt < 1)
        return (void)pp__cuda_fail(c, "attention: %d query heads per KV head exceed %d", G, qt);
    if (!pp__cuda_batch(c, kv, seqs, n_seqs, &b))
        return;
    /* the work lists: decode rows, then prefill tiles (16-byte aligned) */
    int use_decode = G <= DEC_MAXG;
    int64_t n_dec = 0, n_tiles = 0, max_span = 1;
    for (int32_t s = 0; s < n_seqs; s++) {
        const struct pp_attn_seq *sq = &seqs[s];
        if (use_decode && sq->n_tokens <= DEC_MAX_TOKENS) {
            n_dec += sq->n_tokens;
            int64_t last = (int64_t)sq->pos + sq->n_tokens - 1;
            int64_t span = shape->sliding_window > 0 && shape->sliding_window < last + 1
                               ? shape->sliding_window : last + 1;
            if (span > max_span)
                max_span = span;
        } else {
            n_tiles += (sq->n_tokens + tt - 1) / tt;
        }
    }
    int64_t off_tiles = ((n_dec * 4) + 15) & ~(int64_t)15;
    int64_t bytes = off_tiles + n_tiles * (int64_t)sizeof(struct attn_tile);
    char *blob = (char *)pp__cuda_blob(c, bytes);
    if (!blob)
        return;
    memset(blob, 0, (size_t)bytes);
    int32_t *drows = (int32_t *)blob;
    struct attn_tile *tiles = (struct attn_tile *)(blob + off_tiles);
    int64_t di = 0, ti = 0;
    for (int32_t s = 0; s < n_seqs; s++) {
        const struct pp_attn_seq *sq = &seqs[s];
        if (use_decode && sq->n_tokens <= DEC_MAX_TOKENS) {
            for (int32_t t = 0; t < sq->n_tokens; t++)
                drows[di++] = sq->row + t;
            continue;
        }
        for (int32_t t0 = 0; t0 < sq->n_tokens; t0 += tt) {
            tiles[ti].seq = s;
            tiles[ti].row0 = sq->row + t0;
            tiles[ti].n_rows = sq->n_tokens - t0 < tt ? sq->n_tokens - t0 : tt;
            ti++;
        }
    }
    const char *d = (const char *)pp__cuda_upload(c, PP_CUDA_SLOT_PLAN, blob, bytes);
    if (!d)
        return;
    struct attn_args a = {kv->pool, b.seqs, b.bt, b.row_seq, b.row_pos, layer,
                          kv->n_layers, kv->block_size, kv->kv_dim, kv->block_elems, H, KH, hd,
                          shape->sliding_window, shape->scale};
    if (n_dec > 0) {
        /* enough splits to fill the GPU, none shorter than DEC_MIN_SPLIT keys, partials within
         * the workspace */
        int64_t blocks = n_dec * KH, want = 4 * (int64_t)c->sm_count;
        int64_t n_split = (max_span + DEC_MIN_SPLIT - 1) / DEC_MIN_SPLIT;
        int64_t fill = (want + blocks - 1) / blocks;
        if (n_split > fill)
            n_split = fill;
        int64_t per_split = n_dec * H * (int64_t)(hd + 2) * (int64_t)sizeof(float);
        if (n_split > c->scratch_bytes / per_split)
            n_split = c->scratch_bytes / per_split;
        if (n_split < 1)
            n_split = 1;
        if (n_split > 4096)
            n_split = 4096; /* the merge's weights and sums fit 48 KiB of shared memory */
        int gi = decode_index(G);
        size_t smem = decode_smem(1 << gi, hd);
        if ((int64_t)smem > c->smem_optin)
            return (void)pp__cuda_fail(c, "attention: decoding head_dim %d needs %zu bytes of "
                                       "shared memory per block, the device allows %d", hd, smem,
                                       c->smem_optin);
        dim3 grid((unsigned)n_dec, (unsigned)KH, (unsigned)n_split);
        decode_kernels[gi]<<<grid, DEC_THREADS, smem, c->stream>>>(
            out, (float *)c->scratch, q, a, (const int32_t *)d, (int32_t)n_split);
        if (!LAUNCH_OK(c, "attn_decode_kernel"))
            return;
        if (n_split > 1) {
            attn_merge_kernel<<<dim3((unsigned)n_dec, (unsigned)H), DEC_THREADS,
                                2 * (size_t)n_split * sizeof(float), c->stream>>>(
                out, (const float *)c->scratch, a, (const int32_t *)d, (int32_t)n_split);
            if (!LAUNCH_OK(c, "attn_merge_kernel"))
                return;
        }
    }
    if (n_tiles > 0) {
        const struct attn_tile *t = (const struct attn_tile *)(d + off_tiles);
        if (tc_ok)
            launch_prefill_tc(c, out, q, a, t, (int32_t)n_tiles);
        else if (hd <= 64)
            launch_prefill<PRE_SMALL>(c, out, q, a, t, (int32_t)n_tiles);
        else if (hd <= 128)
            launch_prefill<PRE_MID>(c, out, q, a, t, (int32_t)n_tiles);
        else
            launch_prefill<PRE_LARGE>(c, out, q, a, t, (int32_t)n_tiles);
    }
}
