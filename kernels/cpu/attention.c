/* Causal attention over the paged KV cache, read in place through each sequence's block table.
 *
 * One query (token, head) attends over positions [first, p] cut into chunks of ATTN_CHUNK positions
 * at fixed absolute boundaries (chunk c covers [c·ATTN_CHUNK, (c+1)·ATTN_CHUNK)), so the cut
 * depends only on the query's position, never on the thread count or the batch. Each chunk gives a
 * partial softmax (its max m, its sum l of exp(s - m), its weighted sum o of values, all over
 * positions in increasing order); the partials merge in increasing chunk order (merge_chunk).
 * Normally one thread runs all of a query's chunks; when a batch has too few queries to keep the
 * threads busy (decode of one sequence with few heads over a long context), chunks become the work
 * items and a second pass merges them — the same arithmetic in the same order, so the same bits. */
#include <assert.h>
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu-impl.h"

#define ATTN_CHUNK 256 /* positions per chunk (a split point every ATTN_CHUNK positions) */
#define SPLIT_BELOW 4  /* split chunks across threads when queries < SPLIT_BELOW × threads */

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
    int64_t max_chunks; /* chunks per query at most (split mode) */
    float *parts;       /* split mode: [query][chunk] of (m, l, o[head_dim]) */
};

/* One query: where its inputs and output are and the positions it sees. */
struct query {
    const struct pp_attn_seq *sq;
    const float *q;  /* [head_dim] */
    float *out;      /* [head_dim] */
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

static struct query query_of(const struct attn_job *j, int64_t row, int32_t h)
{
    const struct pp_attn_shape *sh = j->shape;
    struct query qr;
    int64_t q_dim = (int64_t)sh->n_heads * sh->head_dim;
    qr.sq = seq_of_row(j, row);
    qr.q = j->q + row * q_dim + (int64_t)h * sh->head_dim;
    qr.out = j->out + row * q_dim + (int64_t)h * sh->head_dim;
    qr.kvh = h / (sh->n_heads / sh->n_kv_heads);
    qr.last = qr.sq->pos + (row - qr.sq->row);
    qr.first = 0;
    if (sh->sliding_window > 0 && qr.last - sh->sliding_window + 1 > 0)
        qr.first = qr.last - sh->sliding_window + 1;
    return qr;
}

/* The partial softmax of one chunk: *m, *l and o[head_dim] over positions [c0, c1] (at most
 * ATTN_CHUNK of them). The keys' dot products run four at a time, the exps (pp__expf) eight at a
 * time, and the values' weighted sum keeps o in registers; each score, the sum and each element
 * of o still take their one order. */
static void attend_chunk(const struct attn_job *j, const struct query *qr, int64_t c0, int64_t c1,
                         float *scores, float *m, float *l, float *o)
{
    const struct pp_simd *simd = j->cpu->simd;
    const struct pp_attn_shape *sh = j->shape;
    int32_t hd = sh->head_dim;
    int64_t n = c1 - c0 + 1, off = (int64_t)qr->kvh * hd;
    const float *rows[ATTN_CHUNK];
    assert(n >= 1 && n <= ATTN_CHUNK);
    rows[0] = kv_row(j->kv, j->layer, 0, qr->sq->block_table, c0) + off;
    for (int64_t i = 1; i < n; i++)
        rows[i] = kv_row(j->kv, j->layer, 0, qr->sq->block_table, c0 + i) + off;
    simd->dots(scores, qr->q, rows, n, hd);
    float max = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        float s = scores[i] * sh->scale;
        scores[i] = s;
        if (s > max)
            max = s;
    }
    simd->exp_shift(scores, max, n);
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        sum += scores[i];
        rows[i] += j->kv->block_elems; /* a position's V row follows its K row by one K block */
    }
    memset(o, 0, (size_t)hd * sizeof(float));
    simd->wsum(o, scores, rows, n, hd);
    *m = max;
    *l = sum;
}

/* Folds chunk partial (m, l, o) into the running (M, L, O), in increasing chunk order. */
static void merge_chunk(float *M, float *L, float *O, float m, float l, const float *o, int32_t hd)
{
    float nm = fmaxf(*M, m);
    float a = pp__expf(*M - nm), b = pp__expf(m - nm);
    *L = *L * a + l * b;
    for (int32_t d = 0; d < hd; d++)
        O[d] = O[d] * a + o[d] * b;
    *M = nm;
}

static void finish(const struct query *qr, float L, const float *O, int32_t hd)
{
    float inv = 1.0f / L;
    for (int32_t d = 0; d < hd; d++)
        qr->out[d] = O[d] * inv;
}

/* Scratch of one thread: scores [ATTN_CHUNK], then o [head_dim]. */
static void attend_query(const struct attn_job *j, int64_t row, int32_t h, float *scratch)
{
    struct query qr = query_of(j, row, h);
    int32_t hd = j->shape->head_dim;
    float *scores = scratch, *o = scratch + ATTN_CHUNK;
    float M = 0.0f, L = 0.0f;
    for (int64_t c = qr.first / ATTN_CHUNK; c <= qr.last / ATTN_CHUNK; c++) {
        int64_t c0 = c * ATTN_CHUNK > qr.first ? c * ATTN_CHUNK : qr.first;
        int64_t c1 = (c + 1) * ATTN_CHUNK - 1 < qr.last ? (c + 1) * ATTN_CHUNK - 1 : qr.last;
        if (c == qr.first / ATTN_CHUNK) {
            /* the first chunk writes the running state directly */
            attend_chunk(j, &qr, c0, c1, scores, &M, &L, qr.out);
        } else {
            float m, l;
            attend_chunk(j, &qr, c0, c1, scores, &m, &l, o);
            merge_chunk(&M, &L, qr.out, m, l, o, hd);
        }
    }
    finish(&qr, L, qr.out, hd);
}

static void attn_items(void *ctx, int64_t begin, int64_t end, int thread)
{
    struct attn_job *j = ctx;
    float *scratch = pp__cpu_scratch(j->cpu, PP_CPU_SCRATCH_SCORES, thread);
    for (int64_t it = begin; it < end; it++)
        attend_query(j, it / j->shape->n_heads, (int32_t)(it % j->shape->n_heads), scratch);
}

/* Split mode, pass 1: item = (query, chunk) → its partial in j->parts. */
static void attn_chunk_items(void *ctx, int64_t begin, int64_t end, int thread)
{
    struct attn_job *j = ctx;
    int32_t hd = j->shape->head_dim;
    float *scores = pp__cpu_scratch(j->cpu, PP_CPU_SCRATCH_SCORES, thread);
    for (int64_t it = begin; it < end; it++) {
        int64_t qi = it / j->max_chunks, ci = it % j->max_chunks;
        struct query qr = query_of(j, qi / j->shape->n_heads, (int32_t)(qi % j->shape->n_heads));
        int64_t c = qr.first / ATTN_CHUNK + ci;
        if (c > qr.last / ATTN_CHUNK)
            continue;
        int64_t c0 = c * ATTN_CHUNK > qr.first ? c * ATTN_CHUNK : qr.first;
        int64_t c1 = (c + 1) * ATTN_CHUNK - 1 < qr.last ? (c + 1) * ATTN_CHUNK - 1 : qr.last;
        float *part = j->parts + it * (hd + 2);
        attend_chunk(j, &qr, c0, c1, scores, &part[0], &part[1], part + 2);
    }
}

/* Split mode, pass 2: item = query → merge its chunks in order. */
static void attn_merge_items(void *ctx, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    struct attn_job *j = ctx;
    int32_t hd = j->shape->head_dim;
    for (int64_t qi = begin; qi < end; qi++) {
        struct query qr = query_of(j, qi / j->shape->n_heads, (int32_t)(qi % j->shape->n_heads));
        int64_t n_chunks = qr.last / ATTN_CHUNK - qr.first / ATTN_CHUNK + 1;
        const float *p0 = j->parts + qi * j->max_chunks * (hd + 2);
        float M = p0[0], L = p0[1];
        memcpy(qr.out, p0 + 2, (size_t)hd * sizeof(float));
        for (int64_t ci = 1; ci < n_chunks; ci++) {
            const float *p = p0 + ci * (hd + 2);
            merge_chunk(&M, &L, qr.out, p[0], p[1], p + 2, hd);
        }
        finish(&qr, L, qr.out, hd);
    }
}

int64_t pp__cpu_attn_scratch(int64_t max_cols)
{
    return ATTN_CHUNK + max_cols;
}

int64_t pp__cpu_attn_parts(int64_t max_cols, int64_t max_context)
{
    int64_t chunks = (max_context + ATTN_CHUNK - 2) / ATTN_CHUNK + 1;
    return (int64_t)SPLIT_BELOW * chunks * (max_cols + 2);
}

void pp__cpu_attention(struct pp_backend *be, float *out, const float *q,
                       const struct pp_kv_view *kv, int32_t layer, const struct pp_attn_seq *seqs,
                       int32_t n_seqs, const struct pp_attn_shape *shape)
{
    struct pp_cpu *c = pp__cpu(be);
    int64_t n_rows = 0, max_len = 0;
    for (int32_t s = 0; s < n_seqs; s++) {
        assert(s == 0 || seqs[s].row >= seqs[s - 1].row + seqs[s - 1].n_tokens);
        assert(seqs[s].pos + seqs[s].n_tokens <= c->max_context);
        n_rows = seqs[s].row + seqs[s].n_tokens;
        if (seqs[s].pos + seqs[s].n_tokens > max_len)
            max_len = seqs[s].pos + seqs[s].n_tokens;
    }
    assert(shape->head_dim <= c->max_cols);
    struct attn_job j = {c, out, q, kv, layer, seqs, n_seqs, shape, 0, NULL};
    int64_t n_queries = n_rows * shape->n_heads;
    int64_t span = shape->sliding_window > 0 && shape->sliding_window < max_len
                       ? shape->sliding_window : max_len;
    j.max_chunks = (span + ATTN_CHUNK - 2) / ATTN_CHUNK + 1; /* a window may straddle one more */
    if (c->n_threads > 1 && n_queries < (int64_t)SPLIT_BELOW * c->n_threads && j.max_chunks > 1) {
        j.parts = c->scratch[PP_CPU_SCRATCH_PARTS];
        assert(n_queries * j.max_chunks * (shape->head_dim + 2) <=
               c->n_threads * c->cap[PP_CPU_SCRATCH_PARTS]);
        pp_threadpool_run(c->pool, attn_chunk_items, &j, n_queries * j.max_chunks, 1);
        pp_threadpool_run(c->pool, attn_merge_items, &j, n_queries, 1);
        return;
    }
    pp_threadpool_run(c->pool, attn_items, &j, n_queries, 1);
}
