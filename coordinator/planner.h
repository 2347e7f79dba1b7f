/* The initial partition of a model's layers over a pipeline's stages: contiguous ranges that
 * minimise the slowest stage's time per token, within each stage's memory. Pure computation, no I/O:
 * the coordinator feeds it what the stages measured and reported when they registered. */
#ifndef PP_PLANNER_H
#define PP_PLANNER_H

#include <stdint.h>

#include "common/status.h"

struct pp_plan_stage {
    double seconds_per_layer; /* measured decode time of one (average) layer on this stage */
    int64_t memory_bytes;     /* what the stage may use for weights + KV */
};

struct pp_plan_model {
    int32_t n_layers;
    int64_t layer_bytes;     /* weights of one layer */
    int64_t kv_layer_bytes;  /* KV reserve per layer the stage must keep room for */
    int64_t first_bytes;     /* extra on the first stage (embedding) */
    int64_t last_bytes;      /* extra on the last stage (final norm, LM head) */
    double last_extra_layers; /* the LM head's cost in layer-equivalents (its weights / a layer's) */
};

/* Fills counts[n_stages] (layers per stage, each >= 1, summing to n_layers) minimising the slowest
 * stage's time per token, counts[i] * seconds_per_layer[i] (plus the LM head on the last stage);
 * among equal optima the evenest split (least sum of squared stage times), then earlier stages
 * taking the extra layers. PP_ERR_EXHAUSTED with the stage and the bytes needed vs available when no
 * partition fits in memory; PP_ERR_INVALID_ARG for more stages than layers or a bad input. */
pp_status pp_plan_partition(const struct pp_plan_model *m, const struct pp_plan_stage *stages,
                            int32_t n_stages, int32_t *counts);

/* Checks a given partition (the `layers` override) against the model and the stages' memory. */
pp_status pp_plan_check(const struct pp_plan_model *m, const struct pp_plan_stage *stages,
                        int32_t n_stages, const int32_t *counts);

#endif
