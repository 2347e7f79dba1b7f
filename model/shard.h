/* One worker's share of a model's layer range under tensor parallelism (Megatron layout): query
 * heads and their KV heads, FFN rows, and LM-head vocabulary rows are split across W workers; the
 * attention output and FFN down projections are split by input columns, so each worker's product is
 * a partial sum that one all-reduce completes. Row slices point into the model's mapped weights;
 * column slices are repacked at load into owned huge-page memory of the same dtype. The embedding
 * is used whole by every worker (a gather reads only the looked-up rows, and mapped pages are
 * shared).
 *
 * MoE layers (expert parallelism): the router is whole on every worker; the experts are split
 * into E groups (ep), each group's experts tensor-split W / E ways as above (gate/up rows in place,
 * down columns repacked); the shared expert is split W ways. Each worker's MoE output is then a
 * partial sum, completed by the same all-reduce as a dense FFN.
 *
 * KV heads: with W <= n_kv_heads each worker holds n_kv_heads / W of them; with W > n_kv_heads each
 * holds the one KV head its query heads read (replicated across W / n_kv_heads workers). */
#ifndef PP_SHARD_H
#define PP_SHARD_H

#include <stdint.h>

#include "common/status.h"
#include "model/model.h"

/* Memory a shard owns: a repacked weight slice (huge-page memory, huge_bytes long) or a table of
 * slices (pp_alloc_aligned, huge_bytes 0). */
struct pp_shard_block {
    void *p;
    size_t huge_bytes;
};

struct pp_shard {
    int32_t rank;       /* 0..n_ranks-1 */
    int32_t n_ranks;    /* W, the TP degree */
    int32_t head0;      /* query heads held: [head0, head0 + n_heads) */
    int32_t n_heads;
    int32_t kv_head0;   /* KV heads held: [kv_head0, kv_head0 + n_kv_heads) */
    int32_t n_kv_heads;
    int32_t ffn0;       /* dense FFN rows held: [ffn0, ffn0 + ffn_dim); 0 rows on MoE models */
    int32_t ffn_dim;
    /* MoE: E expert groups of W / E workers; this worker's group holds experts
     * [expert0, expert0 + n_experts) and splits each one's FFN rows W / E ways; the shared expert's
     * rows are split over all W workers */
    int32_t expert0;
    int32_t n_experts;
    int32_t moe_ffn_rows; /* the most gate/up rows of any expert or shared expert held */
    int32_t vocab0;     /* LM head rows held: [vocab0, vocab0 + n_vocab); when the range has it */
    int32_t n_vocab;
    struct pp_layer_weights *layers; /* [last_layer - first_layer] this worker's weights */
    struct pp_weight lm_head;        /* [n_vocab, dim] */
    struct pp_shard_block *owned;    /* repacked slices and tables, freed with the shard */
    int32_t n_owned;
    int32_t cap_owned;
};

/* Checks that a model with configuration c can run with tp workers in ep expert groups; the
 * message names the degree, what it must divide and the valid choices. source names the model. */
pp_status pp_shard_check(const struct pp_model_config *c, int32_t tp, int32_t ep,
                         const char *source);

/* Builds rank's share of m (which must outlive it) for tp workers and ep expert groups. With tp ==
 * 1 the shard is the model's own weights (nothing copied). *out is freed with pp_shard_free. */
pp_status pp_shard_new(const struct pp_model *m, int32_t tp, int32_t ep, int32_t rank,
                       struct pp_shard **out);
void pp_shard_free(struct pp_shard *s);

/* 1 when p points into a weight slice this shard repacked (memory of this process, which a
 * host-memory backend can compute from in place), else 0. */
int pp_shard_owns(const struct pp_shard *s, const void *p);

/* Bytes of weights this shard reads per forward of its layers (repacked slices included). */
int64_t pp_shard_weight_bytes(const struct pp_shard *s, const struct pp_model *m);

/* [*begin, *end): rank's part of n items split across n_ranks in whole units of `unit` items
 * where n is a multiple of unit with at least one unit per rank (otherwise in single items). */
void pp_shard_split(int64_t n, int32_t n_ranks, int32_t rank, int64_t unit, int64_t *begin,
                    int64_t *end);

#endif
