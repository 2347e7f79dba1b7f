/* Causal attention over the paged KV cache, read in place through each sequence's block table.
 *
 * One query (token, head) attends over positions [first, p] cut into chunks of ATTN_CHUNK positions
 * at fixed absolute boundaries (chunk c covers [c·ATTN_CHUNK, (c+1)·ATTN_CHUNK)), so the cut
 * depends only on the query's position, never on the thread count or the batch. Each chunk gives a
 * partial softmax (its max m, its sum l of exp(s - m), its weighted sum o of values, all over
 * positions in increasing order); the partials merge in increasing chunk order (merge_chunk).
 *
 * The query heads of one token that share a KV head see the same keys at the same positions, so
 * they go together, up to ATTN_GROUP at a time (a query block); so do up to ATTN_ROWS consecutive
 * tokens of one sequence (a tile), which see the same keys up to the earliest one's position.
 * One pass over a chunk's keys gives all their scores and one pass over its values all their
 * weighted sums, each still computed in the one query's order. A work item takes a tile's chunk
 * for every KV head in turn, so that one thread reads each position's whole K and V rows (all
 * heads side by side in the cache) at once: a head's slice alone is a quarter of a row or less,
 * and the lines around it, which the hardware prefetcher brings in as well, would be gone by
 * the time the head owning them came. Normally one thread runs all of a tile's chunks, threads
 * taking tiles from a shared counter (a prompt's later tokens cost more); when a batch has too
 * few tiles to keep the threads busy (decode of a few sequences), a tile's (chunk, KV head)
 * pairs become the work items and a second pass merges them — the same arithmetic in the same
 * order, so the same bits. */
#include <assert.h>
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu-impl.h"

#define ATTN_CHUNK 256 /* positions per chunk (a split point every ATTN_CHUNK positions) */
#define ATTN_GROUP 8   /* query heads of one KV head that share a pass over a chunk, at most */
#define ATTN_ROWS 8    /* rows (consecutive positions of one sequence) that share it, at most */
#define ATTN_GRAIN 4   /* batch rows (tile mode's work items) a thread takes at a time, at most */
#define SPLIT_BELOW 4  /* split chunks across threads when tiles < SPLIT_BELOW × threads */

static inline float *kv_row(const struct pp_kv_view *kv, int32_t layer, int kv_sel,
                            const int32_t *block_table, int64_t pos)
{
    int64_t b = block_table[pos / kv->block_size];
    int64_t slot = pos % kv->block_size;
    return kv->pool + ((b * kv->n_layers + layer) * 2 + kv_sel) * kv->block_elems +
           slot * kv->kv_dim;
}

void pp__cpu_kv_store(struct pp_backend *be, const struct pp_kv_view *kv, int32_t layer,
                      const struct pp_attn_seq *seqs, int32_t n_seqs, const float *k,
                      const float *v)
{
    (void)be;
    for (int32_t s = 0; s < n_seqs; s++) {
        const struct pp_attn_seq *sq = &seqs[s];
        for (int32_t t = 0; t < sq->n_tokens; t++) {
            int64_t row = sq->row + t;
            int64_t pos = sq->pos + t;
            memcpy(kv_row(kv, layer, 0, sq->block_table, pos), k + row * kv->kv_dim,
                   (size_t)kv->kv_dim * sizeof(float));
            memcpy(kv_row(kv, layer, 1, sq->block_table, pos), v + row * kv->kv_dim,
                   (size_t)kv->kv_dim * sizeof(float));
        }
    }
}

struct attn_job {
    struct pp_cpu *cpu;
    float *out;
    const float *q;
    const struct pp_kv_view *kv;
    int32_t layer;
    const struct pp_attn_seq *seqs;
    int32_t n_seqs;
    const struct pp_attn_shape *shape;
    int32_t group;      /* query heads per KV head */
    int32_t blocks;     /* query blocks per KV head: ceil(group / ATTN_GROUP) */
    int64_t n_rows;     /* batch rows */
    int64_t max_chunks; /* chunks per query at most (split mode) */
    float *parts;       /* split mode: [query][chunk] of (m, l, o[head_dim]) */
};

/* Up to ATTN_GROUP query heads of one token that share a KV head: the same keys, the same
 * positions, so one pass over a chunk's keys and values serves them all. */
struct qblock {
    const struct pp_attn_seq *sq;
    int64_t row;     /* the token's batch row */
    int32_t h0, nq;  /* query heads [h0, h0 + nq) */
    const float *q;  /* [nq][head_dim] */
    float *out;      /* [nq][head_dim] */
    int32_t kvh;
    int64_t first, last; /* positions [first, last] */
};

/* The sequence owning a batch row; sequences are given in increasing row order. */
static const struct pp_attn_seq *seq_of_row(const struct attn_job *j, int64_t row)
{
    int32_t lo = 0, hi = j->n_seqs - 1;
    while (lo < hi) {
        int32_t mid = (lo + hi + 1) / 2;
        if (j->seqs[mid].row <= row)
            lo = mid;
        else
            hi = mid - 1;
    }
    return &j->seqs[lo];
}

/* Query block b of the job: row b / (KV heads · blocks), then KV head, then block. */
static struct qblock qblock_of(const struct attn_job *j, int64_t b)
{
    const struct pp_attn_shape *sh = j->shape;
    struct qblock qb;
    int64_t per_row = (int64_t)sh->n_kv_heads * j->blocks;
    int64_t q_dim = (int64_t)sh->n_heads * sh->head_dim;
    int32_t in_row = (int32_t)(b % per_row);
    qb.row = b / per_row;
    qb.kvh = in_row / j->blocks;
    qb.h0 = qb.kvh * j->group + in_row % j->blocks * ATTN_GROUP;
    qb.nq = j->group - (qb.h0 - qb.kvh * j->group);
    if (qb.nq > ATTN_GROUP)
        qb.nq = ATTN_GROUP;
    qb.sq = seq_of_row(j, qb.row);
    qb.q = j->q + qb.row * q_dim + (int64_t)qb.h0 * sh->head_dim;
    qb.out = j->out + qb.row * q_dim + (int64_t)qb.h0 * sh->head_dim;
    qb.last = qb.sq->pos + (qb.row - qb.sq->row);
    qb.first = 0;
    if (sh->sliding_window > 0 && qb.last - sh->sliding_window + 1 > 0)
        qb.first = qb.last - sh->sliding_window + 1;
    return qb;
}

/* Where the K rows of positions [c0, c0 + n) of the block's KV head are: one division per cache
 * block, not per position. */
static void key_rows(const struct attn_job *j, const struct qblock *qb, int64_t c0, int64_t n,
                     const float **rows)
{
    const struct pp_kv_view *kv = j->kv;
    int64_t off = (int64_t)qb->kvh * j->shape->head_dim;
    for (int64_t i = 0; i < n;) {
        int64_t pos = c0 + i, slot = pos % kv->block_size;
        const float *r = kv_row(kv, j->layer, 0, qb->sq->block_table, pos) + off;
        for (; i < n && slot < kv->block_size; i++, slot++, r += kv->kv_dim)
            rows[i] = r;
    }
}

/* The softmax parts of nq queries' n scores (ATTN_CHUNK apart): each score times scale and each
 * query's max m[q] (pp_simd.scale_max: a zero max as +0), its numerators pp__expf(s - m[q])
 * (pp_simd.exp_shift) and their sum l[q]. The sum is one chain per query in position order, the
 * queries' chains side by side (a chain waits on its last step; eight at once keep the core busy).
 * Inlined with a constant nq, the chains stay in registers. */
static inline __attribute__((always_inline)) void softmax_parts(const struct pp_simd *simd,
                                                                float *scores, int64_t n,
                                                                float scale, float *m, float *l,
                                                                int32_t nq)
{
    float sum[ATTN_GROUP];
    for (int32_t q = 0; q < nq; q++) {
        m[q] = simd->scale_max(scores + q * ATTN_CHUNK, scale, n);
        simd->exp_shift(scores + q * ATTN_CHUNK, m[q], n);
        sum[q] = 0.0f;
    }
    for (int64_t i = 0; i < n; i++)
        _Pragma("GCC unroll 8")
        for (int32_t q = 0; q < nq; q++)
            sum[q] += scores[q * ATTN_CHUNK + i];
    for (int32_t q = 0; q < nq; q++)
        l[q] = sum[q];
}

/* Folds chunk partial (m, l, o) into the running (M, L, O), in increasing chunk order: with
 * nm = max(M, m), a = pp__expf(M - nm) and b = pp__expf(m - nm) (pp_simd.exp_shift by 0, which
 * leaves its arguments' bits), L = L·a + l·b and O = O·a + o·b (pp_simd.scale_add). */
static void merge_chunk(const struct pp_simd *simd, float *M, float *L, float *O, float m, float l,
                        const float *o, int32_t hd)
{
    float nm = fmaxf(*M, m);
    float e[2] = {*M - nm, m - nm};
    simd->exp_shift(e, 0.0f, 2);
    *L = *L * e[0] + l * e[1];
    simd->scale_add(O, e[0], o, e[1], hd);
    *M = nm;
}

static void finish(float *out, float L, const float *O, int32_t hd)
{
    float inv = 1.0f / L;
    for (int32_t d = 0; d < hd; d++)
        out[d] = O[d] * inv;
}

/* The chunk c of a block's positions: [*c0, *c1]. */
static void chunk_span(const struct qblock *qb, int64_t c, int64_t *c0, int64_t *c1)
{
    *c0 = c * ATTN_CHUNK > qb->first ? c * ATTN_CHUNK : qb->first;
    *c1 = (c + 1) * ATTN_CHUNK - 1 < qb->last ? (c + 1) * ATTN_CHUNK - 1 : qb->last;
}

/* Up to ATTN_ROWS consecutive rows of one sequence, with one query block's heads each: every chunk
 * that several of them see is read once for all of them (keys and values then come from L1 and
 * L2, not from further out, at long contexts). Row t sits at position qb.last + t. */
struct qtile {
    struct qblock qb; /* row 0's block */
    int32_t nt;
};

/* The chunk c of row t of a tile: [*c0, *c1], empty (*c1 < *c0) when the row does not reach it. A
 * tile of several rows has no sliding window, so all its rows start their chunks together. */
static void tile_chunk_span(const struct qtile *tl, int32_t t, int64_t c, int64_t *c0, int64_t *c1)
{
    struct qblock qb = tl->qb;
    qb.last += t;
    chunk_span(&qb, c, c0, c1);
}

/* The partial softmax of chunk c for each (row t, query q) of the tile whose row reaches it, rows
 * t0 onwards (returned; they are the last ones, as positions grow with t): m and l at t · nq + q,
 * o at (t · nq + q) · head_dim, over the row's positions in the chunk, each as the one query
 * alone would compute it: its scores from pp_simd.dots (whose bits do not depend on the other
 * queries or rows in the call), its softmax parts over its own positions, and its weighted sum
 * over its own rows in order (the rows all reaching rows see in one wsum, then each row's further
 * ones). qp: the tile's queries, row after row (nq · head_dim each); scores:
 * [nt · nq][ATTN_CHUNK]. */
static inline __attribute__((always_inline)) int32_t tile_chunk(const struct attn_job *j,
                                                                 const struct qtile *tl, int64_t c,
                                                                 const float *qp, float *scores,
                                                                 float *m, float *l, float *o)
{
    const struct pp_simd *simd = j->cpu->simd;
    const struct pp_attn_shape *sh = j->shape;
    int32_t hd = sh->head_dim, nq = tl->qb.nq, nt = tl->nt, t0 = nt;
    int64_t qs = (int64_t)nq * hd, c0 = 0, n[ATTN_ROWS];
    for (int32_t t = nt - 1; t >= 0; t--) {
        int64_t a0, a1;
        tile_chunk_span(tl, t, c, &a0, &a1);
        if (a1 < a0)
            break;
        assert((t0 == nt || a0 == c0) && a1 - a0 + 1 <= ATTN_CHUNK);
        c0 = a0;
        n[t] = a1 - a0 + 1;
        t0 = t;
    }
    assert(t0 < nt);
    const float *rows[ATTN_CHUNK];
    int64_t g = (int64_t)(nt - t0) * nq;
    key_rows(j, &tl->qb, c0, n[nt - 1], rows);
    simd->dots(scores + t0 * nq * ATTN_CHUNK, ATTN_CHUNK, qp + t0 * qs, g, rows, n[nt - 1], hd);
    for (int32_t t = t0; t < nt; t++) {
        float *sc = scores + t * nq * ATTN_CHUNK;
        if (nq == ATTN_GROUP) /* the queries' chains in registers */
            softmax_parts(simd, sc, n[t], sh->scale, m + t * nq, l + t * nq, ATTN_GROUP);
        else
            softmax_parts(simd, sc, n[t], sh->scale, m + t * nq, l + t * nq, nq);
    }
    for (int64_t i = 0; i < n[nt - 1]; i++)
        rows[i] += j->kv->block_elems; /* a position's V row follows its K row by one K block */
    memset(o + t0 * qs, 0, (size_t)(g * hd) * sizeof(float));
    simd->wsum(o + t0 * qs, scores + t0 * nq * ATTN_CHUNK, ATTN_CHUNK, g, rows, n[t0], hd);
    for (int32_t t = t0 + 1; t < nt; t++)
        if (n[t] > n[t0])
            simd->wsum(o + t * qs, scores + t * nq * ATTN_CHUNK + n[t0], ATTN_CHUNK, nq,
                       rows + n[t0], n[t] - n[t0], hd);
    return t0;
}

/* Where a tile of nt rows starting at batch row `row` keeps its state in a thread's scratch: the
 * running max M and sum L of (row t, head h) at t · n_heads + h; a chunk's scores
 * [ATTN_ROWS · ATTN_GROUP][ATTN_CHUNK] and weighted sums o [ATTN_ROWS · ATTN_GROUP][head_dim] for
 * one query block; and the tile's queries, query block after query block, each block's rows one
 * after another (nq · head_dim each), as tile_chunk takes them. */
struct tile_scratch {
    float *M, *L, *scores, *o, *qp;
};

static struct tile_scratch tile_scratch(const struct attn_job *j, float *scratch)
{
    const struct pp_attn_shape *sh = j->shape;
    struct tile_scratch ts;
    ts.M = scratch;
    ts.L = ts.M + ATTN_ROWS * sh->n_heads;
    ts.scores = ts.L + ATTN_ROWS * sh->n_heads;
    ts.o = ts.scores + ATTN_ROWS * ATTN_GROUP * ATTN_CHUNK;
    ts.qp = ts.o + (int64_t)ATTN_ROWS * ATTN_GROUP * sh->head_dim;
    return ts;
}

/* The tile of nt rows from batch row `row` for query block bl (KV head, then block) of its row. */
static struct qtile tile_of(const struct attn_job *j, int64_t row, int32_t nt, int64_t bl)
{
    struct qtile tl;
    tl.qb = qblock_of(j, row * j->shape->n_kv_heads * j->blocks + bl);
    tl.nt = nt;
    return tl;
}

/* The tile's queries for query block tl: in place for one row, else packed from ts.qp (filled by
 * pack_tile). */
static const float *tile_queries(const struct attn_job *j, const struct qtile *tl,
                                 const struct tile_scratch *ts)
{
    if (tl->nt == 1)
        return tl->qb.q;
    return ts->qp + (int64_t)tl->nt * tl->qb.h0 * j->shape->head_dim;
}

/* Packs the queries of a tile of nt rows from batch row `row` into ts.qp, block by block. */
static void pack_tile(const struct attn_job *j, int64_t row, int32_t nt,
                      const struct tile_scratch *ts)
{
    const struct pp_attn_shape *sh = j->shape;
    int64_t q_dim = (int64_t)sh->n_heads * sh->head_dim;
    if (nt == 1)
        return;
    for (int64_t bl = 0; bl < (int64_t)sh->n_kv_heads * j->blocks; bl++) {
        struct qtile tl = tile_of(j, row, nt, bl);
        int64_t qs = (int64_t)tl.qb.nq * sh->head_dim;
        float *qp = ts->qp + (int64_t)nt * tl.qb.h0 * sh->head_dim;
        for (int32_t t = 0; t < nt; t++)
            memcpy(qp + t * qs, tl.qb.q + t * q_dim, (size_t)qs * sizeof(float));
    }
}

/* The tile's rows through their chunks in order, each chunk for every query block in turn
 * (tile_chunk), its partials merged into that block's running state in order. */
static void attend_tile(const struct attn_job *j, int64_t row, int32_t nt, float *scratch)
{
    const struct pp_attn_shape *sh = j->shape;
    int32_t hd = sh->head_dim;
    int64_t q_dim = (int64_t)sh->n_heads * hd, n_bl = (int64_t)sh->n_kv_heads * j->blocks;
    struct tile_scratch ts = tile_scratch(j, scratch);
    float m[ATTN_ROWS * ATTN_GROUP], l[ATTN_ROWS * ATTN_GROUP];
    pack_tile(j, row, nt, &ts);
    struct qtile t0l = tile_of(j, row, nt, 0);
    assert(nt >= 1 && nt <= ATTN_ROWS && (nt == 1 || t0l.qb.first == 0));
    /* every block of a row sees the same positions */
    int64_t c_first = t0l.qb.first / ATTN_CHUNK, c_last = (t0l.qb.last + nt - 1) / ATTN_CHUNK;
    for (int64_t c = c_first; c <= c_last; c++)
        for (int64_t bl = 0; bl < n_bl; bl++) {
            struct qtile tl = tile_of(j, row, nt, bl);
            const struct qblock *qb = &tl.qb;
            int32_t nq = qb->nq;
            int32_t t0 = tile_chunk(j, &tl, c, tile_queries(j, &tl, &ts), ts.scores, m, l, ts.o);
            for (int32_t t = t0; t < nt; t++)
                for (int32_t q = 0; q < nq; q++) {
                    int32_t k = t * nq + q;
                    int64_t s = (int64_t)t * sh->n_heads + qb->h0 + q;
                    float *out = qb->out + t * q_dim + q * hd;
                    if (c == c_first) { /* the first chunk is the running state */
                        ts.M[s] = m[k];
                        ts.L[s] = l[k];
                        memcpy(out, ts.o + k * hd, (size_t)hd * sizeof(float));
                    } else {
                        merge_chunk(j->cpu->simd, &ts.M[s], &ts.L[s], out, m[k], l[k],
                                    ts.o + k * hd, hd);
                    }
                }
        }
    for (int32_t t = 0; t < nt; t++)
        for (int32_t h = 0; h < sh->n_heads; h++) {
            float *out = j->out + (row + t) * q_dim + (int64_t)h * hd;
            finish(out, ts.L[t * sh->n_heads + h], out, hd);
        }
}

/* The tile that starts at batch row `row`: its rows (0 when the row starts none). A sequence's
 * rows go in tiles of ATTN_ROWS from its first (one row each under a sliding window, whose rows
 * start their chunks apart). */
static int32_t tile_at(const struct attn_job *j, int64_t row)
{
    const struct pp_attn_seq *sq = seq_of_row(j, row);
    int64_t in = row - sq->row, left = sq->n_tokens - in;
    if (in < 0 || left <= 0) /* a row no sequence holds: nothing to attend */
        return 0;
    if (j->shape->sliding_window > 0)
        return 1;
    if (in % ATTN_ROWS)
        return 0;
    return left < ATTN_ROWS ? (int32_t)left : ATTN_ROWS;
}

/* Items: batch rows, the last first; a row that starts a tile runs it. A sequence's later tiles
 * see more positions, and taking them first leaves the cheap ones to even out the threads' ends. */
static void attn_items(void *ctx, int64_t begin, int64_t end, int thread)
{
    struct attn_job *j = ctx;
    float *scratch = pp__cpu_scratch(j->cpu, PP_CPU_SCRATCH_SCORES, thread);
    for (int64_t it = begin; it < end; it++) {
        int64_t row = j->n_rows - 1 - it;
        int32_t nt = tile_at(j, row);
        if (nt > 0)
            attend_tile(j, row, nt, scratch);
    }
}

/* Split mode: a query's partials by query index (row · heads + head) and chunk. */
static float *part_of(const struct attn_job *j, int64_t row, int32_t h, int64_t ci)
{
    int64_t qi = row * j->shape->n_heads + h;
    return j->parts + (qi * j->max_chunks + ci) * (j->shape->head_dim + 2);
}

/* Split mode, pass 1: item = (batch row, chunk, query block) → when the row starts a tile, the
 * partials of the block's queries of the tile in that chunk, in j->parts. A chunk's blocks are
 * consecutive items, so a thread taking several at once reads whole K and V rows; one chunk (a
 * short context) still goes to every thread. */
static void attn_chunk_items(void *ctx, int64_t begin, int64_t end, int thread)
{
    struct attn_job *j = ctx;
    const struct pp_attn_shape *sh = j->shape;
    int32_t hd = sh->head_dim;
    int64_t n_bl = (int64_t)sh->n_kv_heads * j->blocks;
    float *scratch = pp__cpu_scratch(j->cpu, PP_CPU_SCRATCH_SCORES, thread);
    struct tile_scratch ts = tile_scratch(j, scratch);
    float m[ATTN_ROWS * ATTN_GROUP], l[ATTN_ROWS * ATTN_GROUP];
    int64_t packed = -1; /* the row whose tile ts.qp holds */
    for (int64_t it = begin; it < end; it++) {
        int64_t row = it / (j->max_chunks * n_bl), ci = it / n_bl % j->max_chunks, bl = it % n_bl;
        int32_t nt = tile_at(j, row);
        if (nt == 0)
            continue;
        /* every block of a row sees the same positions */
        struct qtile tl = tile_of(j, row, nt, bl);
        int64_t c = tl.qb.first / ATTN_CHUNK + ci;
        if (c > (tl.qb.last + nt - 1) / ATTN_CHUNK)
            continue;
        if (packed != row) {
            pack_tile(j, row, nt, &ts);
            packed = row;
        }
        int32_t nq = tl.qb.nq;
        int32_t t0 = tile_chunk(j, &tl, c, tile_queries(j, &tl, &ts), ts.scores, m, l, ts.o);
        for (int32_t t = t0; t < nt; t++)
            for (int32_t q = 0; q < nq; q++) {
                int32_t k = t * nq + q;
                float *part = part_of(j, row + t, tl.qb.h0 + q, ci);
                part[0] = m[k];
                part[1] = l[k];
                memcpy(part + 2, ts.o + k * hd, (size_t)hd * sizeof(float));
            }
    }
}

/* Split mode, pass 2: item = query → merge its chunks in order. */
static void attn_merge_items(void *ctx, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    struct attn_job *j = ctx;
    const struct pp_attn_shape *sh = j->shape;
    int32_t hd = sh->head_dim;
    for (int64_t qi = begin; qi < end; qi++) {
        int64_t row = qi / sh->n_heads;
        int32_t h = (int32_t)(qi % sh->n_heads);
        /* the block holding head h gives the query's positions */
        int64_t b = (row * sh->n_kv_heads + h / j->group) * j->blocks + h % j->group / ATTN_GROUP;
        struct qblock qb = qblock_of(j, b);
        if (qb.row < qb.sq->row || qb.row >= qb.sq->row + qb.sq->n_tokens)
            continue; /* a row no sequence holds */
        float *out = qb.out + (int64_t)(h - qb.h0) * hd;
        int64_t n_chunks = qb.last / ATTN_CHUNK - qb.first / ATTN_CHUNK + 1;
        const float *p0 = part_of(j, row, h, 0);
        float M = p0[0], L = p0[1];
        memcpy(out, p0 + 2, (size_t)hd * sizeof(float));
        for (int64_t ci = 1; ci < n_chunks; ci++) {
            const float *p = part_of(j, row, h, ci);
            merge_chunk(j->cpu->simd, &M, &L, out, p[0], p[1], p + 2, hd);
        }
        finish(out, L, out, hd);
    }
}

int64_t pp__cpu_attn_scratch(int64_t max_cols)
{
    /* M and L, scores, o and the packed queries (tile_scratch); head_dim, n_heads and n_heads ·
     * head_dim are all at most max_cols */
    return (int64_t)ATTN_ROWS * (2 * max_cols + ATTN_GROUP * (ATTN_CHUNK + max_cols) + max_cols);
}

int64_t pp__cpu_attn_parts(int64_t max_cols, int64_t max_context)
{
    int64_t chunks = (max_context + ATTN_CHUNK - 2) / ATTN_CHUNK + 1;
    return (int64_t)SPLIT_BELOW * chunks * (max_cols + 2);
}

/* Work items taken at a time from the shared counter: at most max, and few enough that every
 * thread gets some (the pool runs a job of no more items than the grain on one thread). */
static int64_t grain_for(int64_t n_items, int n_threads, int64_t max)
{
    int64_t g = n_items / n_threads;
    return g < 1 ? 1 : g > max ? max : g;
}

void pp__cpu_attention(struct pp_backend *be, float *out, const float *q,
                       const struct pp_kv_view *kv, int32_t layer, const struct pp_attn_seq *seqs,
                       int32_t n_seqs, const struct pp_attn_shape *shape)
{
    struct pp_cpu *c = pp__cpu(be);
    int64_t n_rows = 0, max_len = 0, n_tiles = 0;
    for (int32_t s = 0; s < n_seqs; s++) {
        assert(s == 0 || seqs[s].row >= seqs[s - 1].row + seqs[s - 1].n_tokens);
        assert(seqs[s].pos + seqs[s].n_tokens <= c->max_context);
        n_rows = seqs[s].row + seqs[s].n_tokens;
        if (seqs[s].pos + seqs[s].n_tokens > max_len)
            max_len = seqs[s].pos + seqs[s].n_tokens;
        n_tiles += shape->sliding_window > 0 ? seqs[s].n_tokens
                                             : (seqs[s].n_tokens + ATTN_ROWS - 1) / ATTN_ROWS;
    }
    assert((int64_t)shape->n_heads * shape->head_dim <= c->max_cols);
    struct attn_job j = {c, out, q, kv, layer, seqs, n_seqs, shape, 0, 0, n_rows, 0, NULL};
    assert(shape->n_kv_heads >= 1 && shape->n_heads % shape->n_kv_heads == 0);
    j.group = shape->n_heads / shape->n_kv_heads;
    j.blocks = (j.group + ATTN_GROUP - 1) / ATTN_GROUP;
    int64_t n_queries = n_rows * shape->n_heads;
    int64_t span = shape->sliding_window > 0 && shape->sliding_window < max_len
                       ? shape->sliding_window : max_len;
    j.max_chunks = (span + ATTN_CHUNK - 2) / ATTN_CHUNK + 1; /* a window may straddle one more */
    /* either mode gives the same bits: split only where the partials fit the scratch */
    if (c->n_threads > 1 && n_tiles < (int64_t)SPLIT_BELOW * c->n_threads && j.max_chunks > 1 &&
        n_queries * j.max_chunks * (shape->head_dim + 2) <=
            c->n_threads * c->cap[PP_CPU_SCRATCH_PARTS]) {
        j.parts = c->scratch[PP_CPU_SCRATCH_PARTS];
        int64_t n_bl = (int64_t)shape->n_kv_heads * j.blocks;
        int64_t n_items = n_rows * j.max_chunks * n_bl;
        /* a chunk's blocks at a time while many are left */
        pp_threadpool_run_dynamic(c->pool, attn_chunk_items, &j, n_items,
                                  grain_for(n_items, c->n_threads, n_bl), 1);
        pp_threadpool_run(c->pool, attn_merge_items, &j, n_queries, 1);
        return;
    }
    pp_threadpool_run_dynamic(c->pool, attn_items, &j, n_rows,
                              grain_for(n_rows, c->n_threads, ATTN_GRAIN), 1);
}
