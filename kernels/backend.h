/* The compute-backend interface: one table of function pointers that the CPU backend (the reference)
 * and the CUDA backend fill. The executor calls only these. kernels/ knows no model file and no
 * network: a weight is a pointer, a dtype and a shape; the KV cache is a paged view described by
 * struct pp_kv_view.
 *
 * Determinism contract (CPU): every output element is reduced in one fixed order that depends only
 * on the shapes of the operands of that element, never on the thread count, the batch size or which
 * other tokens share the batch. */
#ifndef PP_BACKEND_H
#define PP_BACKEND_H

#include <stdint.h>

#include "common/status.h"
#include "kernels/dtype.h"

/* A 2-D weight stored row-major as [rows, cols] in its file's dtype. */
struct pp_weight {
    const void *data;
    enum pp_dtype dtype;
    int64_t rows;
    int64_t cols;
};

enum pp_rope_layout {
    PP_ROPE_NEOX = 0,    /* pairs (i, i + d/2): HF checkpoints, GGUF qwen2 */
    PP_ROPE_INTERLEAVED, /* pairs (2i, 2i + 1): GGUF llama (rows permuted by the converter) */
};

/* A paged KV cache as the kernels see it. Block b, local layer l holds K then V, each
 * [block_size, n_kv_heads * head_dim] f32, at pool + ((b * n_layers + l) * 2 + {0,1}) * block_elems. */
struct pp_kv_view {
    float *pool;
    int32_t n_layers;   /* layers held by this cache (the executor's range) */
    int32_t block_size; /* tokens per block */
    int32_t kv_dim;     /* n_kv_heads * head_dim */
    int64_t block_elems; /* block_size * kv_dim */
};

/* One sequence's slice of a batch: its tokens occupy rows [row, row + n_tokens) of the batch and sit
 * at positions [pos, pos + n_tokens) of the sequence. */
struct pp_attn_seq {
    int32_t row;
    int32_t n_tokens;
    int32_t pos;
    const int32_t *block_table; /* [ceil((pos + n_tokens) / block_size)] block ids */
};

struct pp_attn_shape {
    int32_t n_heads;
    int32_t n_kv_heads;
    int32_t head_dim;
    int32_t sliding_window; /* 0: none; else a query at p sees keys at positions > p - window */
    float scale;            /* usually 1/sqrt(head_dim) */
};

struct pp_backend;

struct pp_backend_ops {
    /* Sizes scratch for matmuls up to max_cols input features and attention over up to max_context
     * positions. The executor calls it once before any op; ops assume it succeeded. */
    pp_status (*reserve)(struct pp_backend *be, int64_t max_cols, int64_t max_context);
    /* y[n, w.rows] = x[n, w.cols] · wᵀ. */
    void (*matmul)(struct pp_backend *be, float *y, const float *x, const struct pp_weight *w,
                   int64_t n);
    /* y[n, dim] = x / sqrt(mean(x²) + eps) * g[dim]; y may alias x. */
    void (*rmsnorm)(struct pp_backend *be, float *y, const float *x, const float *g, int64_t n,
                    int64_t dim, float eps);
    /* In place on x[n, n_heads, head_dim] at positions pos[n], with inv_freq[head_dim/2]. */
    void (*rope)(struct pp_backend *be, float *x, const int32_t *pos, int64_t n, int32_t n_heads,
                 int32_t head_dim, const float *inv_freq, enum pp_rope_layout layout);
    /* Writes k, v [n, kv_dim] rows of each sequence into the cache at its positions (layer l). */
    void (*kv_store)(struct pp_backend *be, const struct pp_kv_view *kv, int32_t layer,
                     const struct pp_attn_seq *seqs, int32_t n_seqs, const float *k,
                     const float *v);
    /* Causal attention of q[n, n_heads*head_dim] over the cache (which already holds this batch's
     * keys), out[n, n_heads*head_dim]. */
    void (*attention)(struct pp_backend *be, float *out, const float *q,
                      const struct pp_kv_view *kv, int32_t layer, const struct pp_attn_seq *seqs,
                      int32_t n_seqs, const struct pp_attn_shape *shape);
    /* out[n, f] = silu(gate) * up. */
    void (*swiglu)(struct pp_backend *be, float *out, const float *gate, const float *up, int64_t n);
    /* y[n] += x[n]. */
    void (*add)(struct pp_backend *be, float *y, const float *x, int64_t n);
    /* y[n, cols] += b[cols] for each of n rows. */
    void (*add_bias)(struct pp_backend *be, float *y, const float *b, int64_t n, int64_t cols);
    /* out[n, w.cols] = rows ids[n] of the embedding w, converted to f32. */
    void (*embed)(struct pp_backend *be, float *out, const struct pp_weight *w, const int32_t *ids,
                  int64_t n);
    void (*free)(struct pp_backend *be);
};

struct pp_backend {
    const struct pp_backend_ops *ops;
    const char *name;
    int n_threads;
    void *impl;
};

/* The CPU backend with n_threads worker threads (>= 1). *out is freed with be->ops->free(be). */
pp_status pp_backend_cpu_new(int n_threads, struct pp_backend **out);

/* n_workers CPU backends (the shards of a tensor-parallel executor) sharing n_threads threads:
 * worker r gets n_threads / n_workers threads, one more for r < n_threads % n_workers, and at least
 * one (more workers than threads oversubscribe the cores). out[n_workers] is freed with
 * pp_backend_free_all; on error nothing is left allocated. */
pp_status pp_backend_cpu_new_workers(int n_threads, int n_workers, struct pp_backend **out);
void pp_backend_free_all(struct pp_backend **bes, int n);

#endif
