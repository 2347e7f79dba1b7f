/* Causal attention over the paged KV cache, read in place through each sequence's block table.
 * One (token, head) pair is one work item: its scores, softmax and weighted sum run over positions
 * in increasing order, so its bits do not depend on the batch or the thread count. */
#include <assert.h>
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu-impl.h"

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

static void attend_one(struct attn_job *j, int64_t row, int32_t h, float *scores)
{
    const struct pp_attn_shape *sh = j->shape;
    const struct pp_attn_seq *sq = seq_of_row(j, row);
    int32_t hd = sh->head_dim;
    int32_t kvh = h / (sh->n_heads / sh->n_kv_heads);
    int64_t q_dim = (int64_t)sh->n_heads * hd;
    const float *q = j->q + row * q_dim + (int64_t)h * hd;
    float *out = j->out + row * q_dim + (int64_t)h * hd;
    int64_t p = sq->pos + (row - sq->row);
    int64_t first = 0;
    if (sh->sliding_window > 0 && p - sh->sliding_window + 1 > 0)
        first = p - sh->sliding_window + 1;

    float max = -INFINITY;
    for (int64_t i = first; i <= p; i++) {
        const float *k = kv_row(j->kv, j->layer, 0, sq->block_table, i) + (int64_t)kvh * hd;
        float s = pp__dot(q, k, hd) * sh->scale;
        scores[i - first] = s;
        if (s > max)
            max = s;
    }
    float sum = 0.0f;
    for (int64_t i = first; i <= p; i++) {
        float e = expf(scores[i - first] - max);
        scores[i - first] = e;
        sum += e;
    }
    memset(out, 0, (size_t)hd * sizeof(float));
    for (int64_t i = first; i <= p; i++) {
        const float *v = kv_row(j->kv, j->layer, 1, sq->block_table, i) + (int64_t)kvh * hd;
        float w = scores[i - first];
        for (int32_t d = 0; d < hd; d++)
            out[d] += w * v[d];
    }
    float inv = 1.0f / sum;
    for (int32_t d = 0; d < hd; d++)
        out[d] *= inv;
}

static void attn_items(void *ctx, int64_t begin, int64_t end, int thread)
{
    struct attn_job *j = ctx;
    float *scores = pp__cpu_scratch(j->cpu, PP_CPU_SCRATCH_SCORES, thread);
    for (int64_t it = begin; it < end; it++)
        attend_one(j, it / j->shape->n_heads, (int32_t)(it % j->shape->n_heads), scores);
}

void pp__cpu_attention(struct pp_backend *be, float *out, const float *q,
                       const struct pp_kv_view *kv, int32_t layer, const struct pp_attn_seq *seqs,
                       int32_t n_seqs, const struct pp_attn_shape *shape)
{
    struct pp_cpu *c = pp__cpu(be);
    int64_t n_rows = 0;
    for (int32_t s = 0; s < n_seqs; s++) {
        assert(s == 0 || seqs[s].row >= seqs[s - 1].row + seqs[s - 1].n_tokens);
        assert(seqs[s].pos + seqs[s].n_tokens <= c->cap[PP_CPU_SCRATCH_SCORES]);
        n_rows = seqs[s].row + seqs[s].n_tokens;
    }
    struct attn_job j = {c, out, q, kv, layer, seqs, n_seqs, shape};
    pp_threadpool_run(c->pool, attn_items, &j, n_rows * shape->n_heads, 1);
}
