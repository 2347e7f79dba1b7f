// Metadata uploads through rings of pinned buffers, and the batch description of the KV and
// attention ops (cuda-impl.cuh).
#include <string.h>

#include "common/alloc.h"
#include "kernels/cuda/cuda-impl.cuh"

static const int ring_entries[PP_CUDA_SLOT_COUNT] = {4, 4, 4, 4, PP_CUDA_RING_MAX};

pp_status pp__cuda_rings_init(struct pp_cuda *c)
{
    for (int s = 0; s < PP_CUDA_SLOT_COUNT; s++) {
        struct pp_cuda_ring *r = &c->rings[s];
        memset(r, 0, sizeof(*r));
        r->n = ring_entries[s];
        r->newest = -1;
        for (int i = 0; i < r->n; i++)
            CUDA_TRY(cudaEventCreateWithFlags(&r->e[i].done, cudaEventDisableTiming));
    }
    return PP_OK;
}

void pp__cuda_rings_free(struct pp_cuda *c)
{
    for (int s = 0; s < PP_CUDA_SLOT_COUNT; s++) {
        struct pp_cuda_ring *r = &c->rings[s];
        for (int i = 0; i < r->n; i++) {
            struct pp_cuda_ring_entry *e = &r->e[i];
            if (e->host)
                CUDA_OK(c, cudaFreeHost(e->host));
            if (e->dev)
                CUDA_OK(c, cudaFree(e->dev));
            if (e->done)
                CUDA_OK(c, cudaEventDestroy(e->done));
            memset(e, 0, sizeof(*e));
        }
    }
    pp_free(PP_MEM_MISC, c->blob);
    c->blob = NULL;
    c->blob_cap = 0;
}

// Makes entry e hold at least bytes (its old buffers are dropped: the caller has waited for every
// queued use of them).
static int entry_grow(struct pp_cuda *c, struct pp_cuda_ring_entry *e, int64_t bytes)
{
    if (e->dev && !CUDA_OK(c, cudaStreamSynchronize(c->stream)))
        return 0; /* kernels queued earlier may still read the device buffer */
    if (e->host && !CUDA_OK(c, cudaFreeHost(e->host)))
        return 0;
    e->host = NULL;
    if (e->dev && !CUDA_OK(c, cudaFree(e->dev)))
        return 0;
    e->dev = NULL;
    e->cap = 0;
    int64_t cap = 4096;
    while (cap < bytes)
        cap *= 2;
    if (!CUDA_OK(c, cudaHostAlloc(&e->host, (size_t)cap, cudaHostAllocDefault)) ||
        !CUDA_OK(c, cudaMalloc(&e->dev, (size_t)cap)))
        return 0;
    e->cap = cap;
    return 1;
}

const void *pp__cuda_upload(struct pp_cuda *c, enum pp_cuda_slot slot, const void *src,
                            int64_t bytes)
{
    struct pp_cuda_ring *r = &c->rings[slot];
    if (bytes <= 0)
        return c->scratch; /* nothing to read: any valid device pointer */
    if (r->newest >= 0) {
        struct pp_cuda_ring_entry *e = &r->e[r->newest];
        if (e->bytes == bytes && memcmp(e->host, src, (size_t)bytes) == 0)
            return e->dev;
    }
    struct pp_cuda_ring_entry *e = &r->e[r->next];
    if (e->used && !CUDA_OK(c, cudaEventSynchronize(e->done)))
        return NULL; /* the host buffer is rewritten below: its last copy must have read it */
    if (bytes > e->cap && !entry_grow(c, e, bytes))
        return NULL;
    memcpy(e->host, src, (size_t)bytes);
    if (!CUDA_OK(c, cudaMemcpyAsync(e->dev, e->host, (size_t)bytes, cudaMemcpyHostToDevice,
                                    c->stream)) ||
        !CUDA_OK(c, cudaEventRecord(e->done, c->stream)))
        return NULL;
    e->used = 1;
    e->bytes = bytes;
    r->newest = r->next;
    r->next = (r->next + 1) % r->n;
    return e->dev;
}

void *pp__cuda_blob(struct pp_cuda *c, int64_t bytes)
{
    if (bytes <= c->blob_cap)
        return c->blob;
    int64_t cap = c->blob_cap > 0 ? c->blob_cap : 4096;
    while (cap < bytes)
        cap *= 2;
    void *p = pp_alloc(PP_MEM_MISC, (size_t)cap);
    if (!p) {
        pp__cuda_fail(c, "no host memory for %lld bytes of metadata", (long long)bytes);
        return NULL;
    }
    pp_free(PP_MEM_MISC, c->blob);
    c->blob = p;
    c->blob_cap = cap;
    return p;
}

static int64_t align8(int64_t n)
{
    return (n + 7) & ~(int64_t)7;
}

int pp__cuda_batch(struct pp_cuda *c, const struct pp_kv_view *kv, const struct pp_attn_seq *seqs,
                   int32_t n_seqs, struct pp_cuda_batch *out)
{
    memset(out, 0, sizeof(*out));
    if (n_seqs < 1)
        return pp__cuda_fail(c, "batch: expected at least one sequence, got %d", n_seqs);
    int64_t n_rows = 0, n_bt = 0, max_len = 0;
    for (int32_t s = 0; s < n_seqs; s++) {
        const struct pp_attn_seq *sq = &seqs[s];
        if (sq->row < n_rows || sq->n_tokens < 1 || sq->pos < 0)
            return pp__cuda_fail(c, "batch: sequence %d (row %d, %d tokens at %d) overlaps the "
                                 "previous one or is empty", s, sq->row, sq->n_tokens, sq->pos);
        n_rows = (int64_t)sq->row + sq->n_tokens;
        int64_t len = (int64_t)sq->pos + sq->n_tokens;
        n_bt += (len + kv->block_size - 1) / kv->block_size;
        if (len > max_len)
            max_len = len;
    }
    /* [geometry: 4 x int64][row_base][seqs][bt][row_seq][row_pos]: the geometry is part of the
     * bytes compared, so a cache of another shape never reuses the device copy */
    int64_t off_base = 32, off_seqs = off_base + align8(n_rows * 8);
    int64_t off_bt = off_seqs + align8(n_seqs * (int64_t)sizeof(struct pp_cuda_seq));
    int64_t off_rseq = off_bt + align8(n_bt * 4), off_rpos = off_rseq + align8(n_rows * 4);
    int64_t size = off_rpos + align8(n_rows * 4);
    char *b = (char *)pp__cuda_blob(c, size);
    if (!b)
        return 0;
    memset(b, 0, (size_t)size);
    int64_t *geo = (int64_t *)b;
    geo[0] = kv->n_layers;
    geo[1] = kv->block_size;
    geo[2] = kv->kv_dim;
    geo[3] = kv->block_elems;
    int64_t *row_base = (int64_t *)(b + off_base);
    struct pp_cuda_seq *ds = (struct pp_cuda_seq *)(b + off_seqs);
    int32_t *bt = (int32_t *)(b + off_bt), *row_seq = (int32_t *)(b + off_rseq);
    int32_t *row_pos = (int32_t *)(b + off_rpos);
    for (int64_t r = 0; r < n_rows; r++)
        row_seq[r] = -1; /* rows no sequence covers are skipped by the kernels */
    int32_t at = 0;
    for (int32_t s = 0; s < n_seqs; s++) {
        const struct pp_attn_seq *sq = &seqs[s];
        int32_t nb = (sq->pos + sq->n_tokens + kv->block_size - 1) / kv->block_size;
        ds[s].row = sq->row;
        ds[s].n_tokens = sq->n_tokens;
        ds[s].pos = sq->pos;
        ds[s].bt_off = at;
        memcpy(bt + at, sq->block_table, (size_t)nb * sizeof(int32_t));
        for (int32_t t = 0; t < sq->n_tokens; t++) {
            int64_t row = sq->row + t, pos = (int64_t)sq->pos + t;
            int64_t block = sq->block_table[pos / kv->block_size];
            row_base[row] = block * kv->n_layers * 2 * kv->block_elems +
                            (pos % kv->block_size) * kv->kv_dim;
            row_seq[row] = s;
            row_pos[row] = (int32_t)pos;
        }
        at += nb;
    }
    const char *dev = (const char *)pp__cuda_upload(c, PP_CUDA_SLOT_BATCH, b, size);
    if (!dev)
        return 0;
    out->n_seqs = n_seqs;
    out->n_rows = (int32_t)n_rows;
    out->max_len = (int32_t)max_len;
    out->row_base = (const int64_t *)(dev + off_base);
    out->seqs = (const struct pp_cuda_seq *)(dev + off_seqs);
    out->bt = (const int32_t *)(dev + off_bt);
    out->row_seq = (const int32_t *)(dev + off_rseq);
    out->row_pos = (const int32_t *)(dev + off_rpos);
    return 1;
}
