/* The compute-backend interface: one table of function pointers that the CPU backend (the
 * reference) and the CUDA backend fill. The executor calls only these. kernels/ knows no model file
 * and no network: a weight is a pointer, a dtype and a shape; the KV cache is a paged view
 * described by struct pp_kv_view.
 *
 * Memory. Every tensor an op reads or writes (activations, the KV pool, loaded weights) lives in
 * the backend's memory: plain host memory for the CPU backend, device memory for CUDA. Buffers come
 * from buf_alloc; data crosses with copy_in / copy_out; weights and 1-D vectors of a model are made
 * usable with weight_load / vec_load (the CPU copies weights into huge-page host memory, or maps
 * them in place when told to, and uses vectors in place). Small metadata stays in host
 * memory on every backend: positions, sequence descriptions and their block tables, token ids, row
 * lists and routing weights given to gather/scatter; a device backend uploads what it needs.
 *
 * Ordering and errors. Ops are queued in call order and may run asynchronously; the ops that return
 * void cannot report a failure at once, so a backend keeps the first error and returns it from the
 * next sync or copy_out (which wait for everything queued before them). After an error the backend
 * stays failed: later ops do nothing and every sync returns the error.
 *
 * Determinism contract (CPU): every output element is reduced in one fixed order that depends only
 * on the shapes of the operands of that element, never on the thread count, the batch size or which
 * other tokens share the batch. The CUDA backend does not promise this; it is compared with the CPU
 * within tolerances. */
#ifndef PP_BACKEND_H
#define PP_BACKEND_H

#include <stdint.h>

#include "common/alloc.h"
#include "common/status.h"
#include "kernels/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How a weight's rows are stored. */
enum pp_weight_layout {
    PP_WEIGHT_ROWS = 0,   /* row-major [rows, cols], as in model files */
    PP_WEIGHT_ROW_GROUPS, /* the CPU backend's copy: rows in groups of 3, a group's rows
                           * interleaved 8 elements (or one Q8_0 block) at a time
                           * (kernels/cpu/row_groups.h) */
};

/* A 2-D weight [rows, cols] in its file's dtype (host memory), or as loaded by a backend's
 * weight_load (the backend's memory, possibly another dtype or layout). */
struct pp_weight {
    const void *data;
    enum pp_dtype dtype;
    int64_t rows;
    int64_t cols;
    enum pp_weight_layout layout;
};

enum pp_rope_layout {
    PP_ROPE_NEOX = 0,    /* pairs (i, i + d/2): HF checkpoints, GGUF qwen2 */
    PP_ROPE_INTERLEAVED, /* pairs (2i, 2i + 1): GGUF llama (rows permuted by the converter) */
};

/* A paged KV cache as the kernels see it. Block b, local layer l holds K then V, each
 * [block_size, n_kv_heads * head_dim] f32, at pool + ((b * n_layers + l) * 2 + {0,1}) *
 * block_elems. */
struct pp_kv_view {
    float *pool;
    int32_t n_layers;   /* layers held by this cache (the executor's range) */
    int32_t block_size; /* tokens per block */
    int32_t kv_dim;     /* n_kv_heads * head_dim */
    int64_t block_elems; /* block_size * kv_dim */
};

/* One sequence's slice of a batch: its tokens occupy rows [row, row + n_tokens) of the batch and
 * sit at positions [pos, pos + n_tokens) of the sequence. */
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

/* How moe_route turns a token's router logits into k experts and weights. */
enum pp_route_mode {
    PP_ROUTE_TOPK_SOFTMAX = 0, /* Mixtral: top-k of the logits, softmax over those k */
    PP_ROUTE_SOFTMAX_TOPK,     /* Qwen2-MoE: softmax over all experts, then top-k (renormalised to
                                  sum 1 only when asked) */
};

struct pp_backend;

/* The most weights one matmul_many call takes (q, k and v). */
#define PP_MATMUL_MANY_MAX 3

struct pp_backend_ops {
    /* Sizes scratch for matmuls up to max_cols input features and attention of up to max_cols
     * query features (n_heads · head_dim) over up to max_context positions. The executor calls it
     * once before any op; ops assume it succeeded. */
    pp_status (*reserve)(struct pp_backend *be, int64_t max_cols, int64_t max_context);

    /* --- memory ---------------------------------------------------------------------------- */
    /* *out = bytes of uninitialised backend memory (64-byte aligned at least), counted under cat;
     * released with buf_free (NULL-safe) with the same cat. */
    pp_status (*buf_alloc)(struct pp_backend *be, enum pp_mem_category cat, int64_t bytes,
                           void **out);
    void (*buf_free)(struct pp_backend *be, enum pp_mem_category cat, void *p);
    /* dst (backend memory) = src (host memory); src may be reused as soon as this returns. */
    void (*copy_in)(struct pp_backend *be, void *dst, const void *src, int64_t bytes);
    /* p[bytes] (backend memory) = 0. */
    void (*zero)(struct pp_backend *be, void *p, int64_t bytes);
    /* dst = src, both backend memory, in queue order. */
    void (*copy)(struct pp_backend *be, void *dst, const void *src, int64_t bytes);
    /* dst (host memory) = src (backend memory), once everything queued before it has run. Returns
     * the backend's first error (dst is then undefined). */
    pp_status (*copy_out)(struct pp_backend *be, void *dst, const void *src, int64_t bytes);
    /* Waits for every queued op; returns the backend's first error since it was made. */
    pp_status (*sync)(struct pp_backend *be);
    /* Makes weight w (row-major) usable by matmul and embed: *out describes it in the backend's
     * memory (the CPU copies it into huge-page host memory in PP_WEIGHT_ROW_GROUPS, or uses w
     * itself after pp_backend_cpu_map_weights; CUDA uploads it, keeping f16 and bf16 and
     * converting f32 and Q8_0 to bf16). resident: w->data is already in this backend's memory
     * (used in place, nothing copied). A loaded weight with out->data != w->data is released
     * with weight_free. */
    pp_status (*weight_load)(struct pp_backend *be, const struct pp_weight *w, int resident,
                             struct pp_weight *out);
    void (*weight_free)(struct pp_backend *be, struct pp_weight *w);
    /* The same for an f32 vector v[n] (norm gains, biases, RoPE frequencies): *out stays f32;
     * released with vec_free when *out != v. */
    pp_status (*vec_load)(struct pp_backend *be, const float *v, int64_t n, int resident,
                          const float **out);
    void (*vec_free)(struct pp_backend *be, const float *v);

    /* --- compute: every float pointer below is backend memory unless it says host --------------
     */
    /* y[n, w.rows] = x[n, w.cols] · wᵀ (w as loaded by weight_load). */
    void (*matmul)(struct pp_backend *be, float *y, const float *x, const struct pp_weight *w,
                   int64_t n);
    /* y[i][n, w[i].rows] = x[n, cols] · w[i]ᵀ for i < count (1..PP_MATMUL_MANY_MAX), all w[i] of
     * the same cols: the same bits as count matmul calls, in one pass where the backend can (the
     * CPU backend's threads split the rows of all of them in one job and prepare x once). */
    void (*matmul_many)(struct pp_backend *be, int count, float *const y[], const float *x,
                        const struct pp_weight *const w[], int64_t n);
    /* y[n, dim] = x / sqrt(mean(x²) + eps) * g[dim]; y may alias x. */
    void (*rmsnorm)(struct pp_backend *be, float *y, const float *x, const float *g, int64_t n,
                    int64_t dim, float eps);
    /* In place on x[n, n_heads, head_dim] at positions pos[n] (host), with inv_freq[head_dim/2]. */
    void (*rope)(struct pp_backend *be, float *x, const int32_t *pos, int64_t n, int32_t n_heads,
                 int32_t head_dim, const float *inv_freq, enum pp_rope_layout layout);
    /* Writes k, v [n, kv_dim] rows of each sequence into the cache at its positions (layer l).
     * seqs (and their block tables) are host memory. */
    void (*kv_store)(struct pp_backend *be, const struct pp_kv_view *kv, int32_t layer,
                     const struct pp_attn_seq *seqs, int32_t n_seqs, const float *k,
                     const float *v);
    /* Causal attention of q[n, n_heads*head_dim] over the cache (which already holds this batch's
     * keys), out[n, n_heads*head_dim]. seqs (and their block tables) are host memory. */
    void (*attention)(struct pp_backend *be, float *out, const float *q,
                      const struct pp_kv_view *kv, int32_t layer, const struct pp_attn_seq *seqs,
                      int32_t n_seqs, const struct pp_attn_shape *shape);
    /* out[n, f] = silu(gate) * up. */
    void (*swiglu)(struct pp_backend *be, float *out, const float *gate, const float *up,
                   int64_t n);
    /* y[n] += x[n]. */
    void (*add)(struct pp_backend *be, float *y, const float *x, int64_t n);
    /* y[n, cols] += b[cols] for each of n rows. */
    void (*add_bias)(struct pp_backend *be, float *y, const float *b, int64_t n, int64_t cols);
    /* y[n, cols] += sigmoid(g[r]) * x[r, cols] for each row r < n (the shared expert's gate). */
    void (*add_gated)(struct pp_backend *be, float *y, const float *x, const float *g, int64_t n,
                      int64_t cols);
    /* out[n, w.cols] = rows ids[n] (host) of the embedding w, converted to f32. */
    void (*embed)(struct pp_backend *be, float *out, const struct pp_weight *w, const int32_t *ids,
                  int64_t n);
    /* dst[r, cols] = src[rows[r], cols] for r < n; rows[n] host. */
    void (*gather_rows)(struct pp_backend *be, float *dst, const float *src, const int32_t *rows,
                        int64_t n, int64_t cols);
    /* dst[rows[r], cols] += w[r] * src[r, cols] for r = 0, 1, ..., n-1 in that order; rows[n] and
     * w[n] host. */
    void (*scatter_add_rows)(struct pp_backend *be, float *dst, const float *src,
                             const int32_t *rows, const float *w, int64_t n, int64_t cols);
    /* For each of n tokens, its k experts of n_experts from router logits[n, n_experts] (which may
     * be overwritten): pick[n, k] in increasing expert id with their weights[n, k]. Top-k takes the
     * largest values, ties to the lower id. Softmax is over exp(v - max) in index order. */
    void (*moe_route)(struct pp_backend *be, int32_t *pick, float *weight, float *logits,
                      int64_t n, int32_t n_experts, int32_t k, enum pp_route_mode mode,
                      int renormalise);
    /* The k largest logits of each of n rows of logits[n, vocab]: ids[n, k] and vals[n, k] (host
     * memory), largest first, ties to the lower id (k = 1: argmax, as greedy sampling takes it).
     * Waits for the result; returns the backend's first error. */
    pp_status (*topk)(struct pp_backend *be, int32_t *ids, float *vals, const float *logits,
                      int64_t n, int64_t vocab, int32_t k);
    void (*free)(struct pp_backend *be);
};

struct pp_backend {
    const struct pp_backend_ops *ops;
    const char *name;  /* "cpu" or "cuda" */
    int n_threads;     /* CPU threads (1 for a device backend) */
    int device;        /* the CUDA device id; -1 for the CPU */
    int host_memory;   /* 1 when backend memory is host memory (the CPU backend) */
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

/* CPU backend: on = 1 makes weight_load use weights in place, from wherever the model keeps them
 * (the mapped model file: no copy, the page cache shared with other processes, but 4 KiB pages
 * that made decode 5-9% slower here); on = 0 (the default) copies each weight into huge-page
 * memory. Applies to weights loaded afterwards; does nothing on another backend. */
void pp_backend_cpu_map_weights(struct pp_backend *be, int on);
/* The `cpu_weights` setting: "copy" (*map = 0) or "map" (*map = 1); otherwise PP_ERR_INVALID_ARG
 * saying what was expected and what arrived (callers name the key or flag). */
pp_status pp_cpu_weights_parse(const char *text, int *map);
/* pp_cpu_weights_parse as a configuration check (common/config.h's pp_cfg_key.check). */
pp_status pp_cpu_weights_check(const char *text);

#ifdef __cplusplus
}
#endif

#endif
