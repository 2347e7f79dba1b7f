/* The initial partition of a model's layers over a pipeline's stages: contiguous ranges that
 * minimise the slowest stage's time per token, within each stage's memory. Pure computation, no
 * I/O: the coordinator feeds it what the stages measured and reported when they registered.
 *
 * Tensor parallelism: a stage with tp workers is one pipeline position whose speed was measured
 * with its workers (so seconds_per_layer already includes TP) and whose memory is per worker: each
 * worker holds 1/tp of every layer's weights and of its KV heads (whole heads; a KV head is
 * replicated when tp > n_kv_heads), 1/tp of the LM head (split by vocabulary) and the whole
 * embedding (every worker looks tokens up in it). */
#ifndef PP_PLANNER_H
#define PP_PLANNER_H

#include <stdint.h>

#include "common/status.h"

struct pp_plan_stage {
    double seconds_per_layer; /* measured decode time of one (average) layer, all workers at once */
    int64_t memory_bytes;     /* what one worker may use for its weights + KV */
    int32_t tp;               /* workers sharing each layer (0 = 1) */
};

struct pp_plan_model {
    int32_t n_layers;
    int64_t layer_bytes;     /* weights of one layer */
    int64_t kv_layer_bytes;  /* KV reserve per layer the stage must keep room for (all heads) */
    int64_t first_bytes;     /* extra on the first stage (embedding) */
    int64_t last_bytes;      /* extra on the last stage (final norm, LM head) */
    double
        last_extra_layers; /* the LM head's cost in layer-equivalents (its weights / a layer's) */
    int32_t n_kv_heads;       /* how kv_layer_bytes splits over workers (0: evenly) */
    int64_t worker_reserve_bytes; /* kept free on every worker beside its weights and KV: the
                                   * process's own code, buffers and activations */
};

/* The KV every stage keeps room for at least, per layer: one sequence of this many positions, or
 * of the model's context where that is shorter (coordinator/setup.c). What memory is left beside
 * the weights goes to the KV cache, up to what the stage asks for (its kv_mb). */
#define PP_PLAN_KV_FLOOR_POSITIONS 2048

/* Fills counts[n_stages] (layers per stage, each >= 1, summing to n_layers) minimising the slowest
 * stage's time per token, counts[i] * seconds_per_layer[i] (plus the LM head on the last stage);
 * among equal optima the evenest split (least sum of squared stage times), then earlier stages
 * taking the extra layers. PP_ERR_EXHAUSTED with the stage and the bytes needed vs available when
 * no partition fits in memory; PP_ERR_INVALID_ARG for more stages than layers or a bad input. */
pp_status pp_plan_partition(const struct pp_plan_model *m, const struct pp_plan_stage *stages,
                            int32_t n_stages, int32_t *counts);

/* What one worker of stage `stage` (of n_stages, with tp workers) needs for `layers` layers: their
 * weights and KV reserve, and the worker's reserve. */
int64_t pp_plan_worker_bytes(const struct pp_plan_model *m, int32_t stage, int32_t n_stages,
                             int32_t tp, int32_t layers);

/* Checks a given partition (the `layers` override) against the model and the stages' memory. */
pp_status pp_plan_check(const struct pp_plan_model *m, const struct pp_plan_stage *stages,
                        int32_t n_stages, const int32_t *counts);

#endif
