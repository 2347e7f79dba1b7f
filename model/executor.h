/* The layer-range executor: runs the layers [first, last) of an opened model over a batch of
 * sequences, keeping their KV in its own paged cache. The first range turns token ids into hidden
 * states; the last range turns hidden states into logits; a middle range maps hidden states to
 * hidden states. This is what a pipeline stage calls per microbatch and what `ppserve run` calls
 * per step.
 *
 * Determinism: a token's outputs depend only on its own sequence (ids and positions), never on the
 * other sequences in the batch, the thread count or how the batch is split internally.
 *
 * Not thread-safe: one thread drives an executor (the backend may use more internally). */
#ifndef PP_EXECUTOR_H
#define PP_EXECUTOR_H

#include <stdint.h>

#include "common/status.h"
#include "kernels/backend.h"
#include "model/model.h"

struct pp_executor_opts {
    int32_t
        max_batch_tokens; /* rows computed together; larger batches run in windows (default 256) */
    int64_t kv_budget_bytes; /* KV cache size (default: room for max_seqs × the context, capped at 1
                                GiB) */
    int32_t kv_block_size;    /* tokens per KV block (default 16) */
    int32_t max_seqs;         /* sequences alive at once (default 64) */
    int32_t max_context;      /* 0: the model's context length */
    int32_t ep;               /* expert groups among the workers (MoE models); 0 or 1: one */
};

/* One sequence's part of a batch. Its tokens follow those of the previous part in the batch. */
struct pp_exec_seq {
    uint64_t id;
    int32_t pos;      /* tokens the executor already holds for id; 0 starts a new sequence */
    int32_t n_tokens; /* >= 1 */
    int want_logits;  /* last range only: produce the logits of this part's last token */
};

struct pp_exec_batch {
    int32_t n_seqs;
    const struct pp_exec_seq *seqs; /* [n_seqs], distinct ids */
    const int32_t *tokens;          /* [n_tokens] ids; when the range starts at layer 0 */
    const float *hidden;            /* [n_tokens, dim]; otherwise */
};

struct pp_executor;

/* Builds an executor over m and be (neither owned; both must outlive it). */
pp_status pp_executor_new(const struct pp_model *m, struct pp_backend *be,
                          const struct pp_executor_opts *opts, struct pp_executor **out);

/* Builds a tensor-parallel executor: n_workers (W, the TP degree) workers, worker r computing on
 * bes[r] (not owned; a CPU backend per worker with its share of the cores, or one per GPU), each
 * holding its share of the weights (model/shard.h) and of the KV heads, joined by a communicator.
 * W = 1 is exactly pp_executor_new. Refuses degrees the model cannot split (pp_shard_check).
 *
 * With W > 1 a token's logits agree with W = 1 to rounding (the all-reduce adds W partial sums) and
 * are still bit-identical run to run, whatever the batch and the thread counts. */
pp_status pp_executor_new_workers(const struct pp_model *m, struct pp_backend *const *bes,
                                  int32_t n_workers, const struct pp_executor_opts *opts,
                                  struct pp_executor **out);
void pp_executor_free(struct pp_executor *ex);

/* The KV cache bytes an executor made from opts for m on n_workers workers holds (the budget, or
 * its default: room for max_seqs × the context, capped at 1 GiB). */
int64_t pp_executor_kv_budget(const struct pp_model *m, int32_t n_workers,
                              const struct pp_executor_opts *opts);

/* Runs the batch. On a middle or first range, hidden_out receives [n_tokens, dim]; on the last
 * range, logits_out receives [number of parts with want_logits, vocab] in part order. The batch is
 * validated before anything changes: unknown or mismatched positions, duplicate ids, token ids
 * outside the vocabulary, contexts beyond max_context, or too few free KV blocks return an error
 * and leave every sequence as it was. */
pp_status pp_executor_forward(struct pp_executor *ex, const struct pp_exec_batch *b,
                              float *hidden_out, float *logits_out);

/* Frees a sequence's KV; returns 1 if it existed. */
int pp_executor_release(struct pp_executor *ex, uint64_t id);

/* Tokens stored for id, or -1 when unknown. */
int32_t pp_executor_seq_len(struct pp_executor *ex, uint64_t id);

/* The executor's KV cache (read-only use: free blocks, active sequences). */
const struct pp_kv_cache *pp_executor_kv(const struct pp_executor *ex);
int32_t pp_executor_max_context(const struct pp_executor *ex);
const struct pp_model *pp_executor_model(const struct pp_executor *ex);
int32_t pp_executor_workers(const struct pp_executor *ex);

/* Bytes each worker has contributed to all-reduces since creation (0 with one worker). Safe to call
 * from another thread while a forward runs. */
int64_t pp_executor_bytes_reduced(const struct pp_executor *ex);

/* Tokens routed to each expert of a MoE layer ([n_experts], counted over every forward since the
 * executor was made, for every expert whether held here or not); layer is relative to the range
 * (0 = first_layer). NULL for a dense layer or a layer outside the range. Valid until
 * pp_executor_free; changed by pp_executor_forward. */
const int64_t *pp_executor_expert_tokens(const struct pp_executor *ex, int32_t layer);

/* The experts worker rank (0..W-1) holds: [*first, *first + *n) (0 experts on a dense model). With
 * expert parallelism the tokens a worker computes in a layer are the sum of expert_tokens over its
 * experts. */
void pp_executor_worker_experts(const struct pp_executor *ex, int32_t rank, int32_t *first,
                                int32_t *n);

#endif
