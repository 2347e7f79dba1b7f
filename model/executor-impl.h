/* Internals of the layer-range executor shared by executor.c (API, validation, windows, workers)
 * and executor_layer.c (one worker's pass over a window). */
#ifndef PP_EXECUTOR_IMPL_H
#define PP_EXECUTOR_IMPL_H

#include "kernels/comm/comm.h"
#include "kernels/cpu/threadpool.h"
#include "model/executor.h"
#include "model/kv_cache.h"
#include "model/moe_ffn.h"
#include "model/shard.h"

/* Rows of the LM head computed per pass on a sharded head: bounds the local logits scratch. */
#define PP_EXEC_HEAD_ROWS 32

/* A worker's weights as its backend computes with them (weight_load / vec_load): the shard's and
 * the model's own on the CPU, copies in device memory on a GPU. A loaded tensor whose pointer
 * differs from its source's is the backend's to release (executor_weights.c). */
struct pp_exec_weights {
    struct pp_layer_weights *layers; /* [range layers], mirroring shard->layers */
    struct pp_moe_weights *moe;      /* [range layers] the loaded MoE weights (MoE models) */
    struct pp_weight embedding;      /* [vocab, dim]; when the range has it */
    struct pp_weight lm_head;        /* [n_vocab, dim]; when the range has it */
    const float *final_norm;         /* [dim]; when the range has the head */
    const float *inv_freq;           /* [head_dim/2] */
};

/* One worker (one device, or one CPU shard): its backend, its share of the weights, its KV heads
 * and its scratch. Worker r's thread is the only one that touches it during a window. Every
 * buffer below is in the worker's backend memory. */
struct pp_exec_worker {
    int32_t rank;
    struct pp_backend *be;  /* not owned */
    struct pp_shard *shard;
    struct pp_exec_weights wt; /* the shard's weights as be uses them */
    struct pp_kv_view kv;   /* this worker's KV heads; the cache's block tables index it */
    float *kv_pool;         /* this worker's pool of the cache's blocks (view.pool) */
    /* scratch, T = max_rows; h = shard->n_heads, kvh = shard->n_kv_heads, f = shard->ffn_dim */
    float *x;      /* [T, dim] residual stream (every worker holds the whole of it) */
    float *xb;     /* [T, dim] normalised input / projection output */
    float *q;      /* [T, h*head_dim] */
    float *k;      /* [T, kvh*head_dim] */
    float *v;      /* [T, kvh*head_dim] */
    float *att;    /* [T, h*head_dim] */
    float *gate;   /* [T, f] */
    float *up;     /* [T, f] */
    float *logits; /* [PP_EXEC_HEAD_ROWS, shard->n_vocab]; sharded head or device memory */
    struct pp_moe_scratch *moe; /* MoE models: routing and expert buffers */
    float *moe_out;             /* [T, dim] MoE models: this worker's part of the FFN output */
    pp_status status; /* the first collective or backend error (sticky) */
};

struct pp_executor {
    const struct pp_model *m;
    struct pp_kv_cache *kv; /* block tables (the pools are the workers') */
    int32_t max_rows;
    int32_t max_context;
    int32_t n_workers;      /* W, the TP degree */
    int32_t ep;             /* expert groups */
    struct pp_exec_worker *workers; /* [n_workers] */
    struct pp_comm *comm;           /* W > 1 */
    struct pp_threadpool *pool;     /* W > 1: one thread per worker (the caller is worker 0) */
    int64_t *expert_tokens; /* [layers of the range, n_experts] MoE: tokens routed, counted by
                               worker 0 (every worker routes alike) over every forward */
    /* the window being run: written by the caller before the workers start, read-only after */
    const struct pp_exec_batch *batch;
    int64_t r0;                /* first batch row of the window */
    int64_t rows;              /* rows in the window */
    int32_t n_parts;
    int32_t n_want;
    float *hidden_out;         /* [n_tokens, dim] or NULL */
    float *logits_out;         /* [n_want in this window, vocab] or NULL */
    int32_t *pos;              /* [T] */
    struct pp_attn_seq *aseqs; /* [T] parts of the current window */
    int32_t *want_rows;        /* [T] */
};

/* Loads worker w's shard (and the model's embedding, head and RoPE frequencies) into its backend:
 * w->wt. On error what was loaded stays recorded for pp__exec_weights_free. */
pp_status pp__exec_weights_load(struct pp_executor *ex, struct pp_exec_worker *w);
/* Releases what pp__exec_weights_load made (safe on a partly loaded or empty w->wt). */
void pp__exec_weights_free(struct pp_executor *ex, struct pp_exec_worker *w);

/* Worker w's pass over the current window: embedding (first range) or the hidden input, every
 * layer of the range, then the hidden output (rank 0) or its vocabulary slice of the logits. */
void pp__exec_worker_run(struct pp_executor *ex, struct pp_exec_worker *w);

#endif
