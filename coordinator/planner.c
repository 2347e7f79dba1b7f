/* Dynamic programming over (stages used, layers assigned): best[i][j] is the smallest possible
 * slowest-stage time when stages 0..i-1 hold layers 0..j-1. O(P·L²) with P stages and L layers,
 * which is nothing at the sizes of real models. */
#include "coordinator/planner.h"

#include <math.h>
#include <stdlib.h>

static int64_t ceil_div(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

int64_t pp_plan_worker_bytes(const struct pp_plan_model *m, int32_t stage, int32_t n_stages,
                             int32_t tp, int32_t layers)
{
    if (tp < 1)
        tp = 1;
    /* KV: n_kv_heads / tp heads each, or the one head a worker's query heads read */
    int64_t kv = m->n_kv_heads > 0
                     ? ceil_div(m->kv_layer_bytes * (tp <= m->n_kv_heads ? m->n_kv_heads / tp : 1),
                                m->n_kv_heads)
                     : ceil_div(m->kv_layer_bytes, tp);
    int64_t b = (int64_t)layers * (ceil_div(m->layer_bytes, tp) + kv) + m->worker_reserve_bytes;
    if (stage == 0)
        b += m->first_bytes; /* the embedding, whole on every worker */
    if (stage == n_stages - 1)
        b += ceil_div(m->last_bytes, tp);
    return b;
}

static int64_t need_bytes(const struct pp_plan_model *m, const struct pp_plan_stage *s,
                          int32_t stage, int32_t n_stages, int32_t layers)
{
    return pp_plan_worker_bytes(m, stage, n_stages, s->tp, layers);
}

static pp_status check_inputs(const struct pp_plan_model *m, const struct pp_plan_stage *s,
                              int32_t n)
{
    if (n < 1 || m->n_layers < 1)
        return pp_error(PP_ERR_INVALID_ARG, "planner: need at least one stage and one layer");
    if (n > m->n_layers)
        return pp_error(PP_ERR_INVALID_ARG, "planner: %d stages for %d layers (each stage needs a "
                        "layer)", n, m->n_layers);
    for (int32_t i = 0; i < n; i++)
        if (!(s[i].seconds_per_layer > 0) || !isfinite(s[i].seconds_per_layer))
            return pp_error(PP_ERR_INVALID_ARG, "planner: stage %d reported a per-layer time of %g "
                            "(expected > 0)", i, s[i].seconds_per_layer);
    return PP_OK;
}

pp_status pp_plan_check(const struct pp_plan_model *m, const struct pp_plan_stage *stages,
                        int32_t n_stages, const int32_t *counts)
{
    pp_status st = check_inputs(m, stages, n_stages);
    if (st != PP_OK)
        return st;
    int64_t total = 0;
    for (int32_t i = 0; i < n_stages; i++) {
        if (counts[i] < 1)
            return pp_error(PP_ERR_INVALID_ARG, "layers: stage %d gets %d layers (expected >= 1)",
                            i, counts[i]);
        total += counts[i];
    }
    if (total != m->n_layers)
        return pp_error(PP_ERR_INVALID_ARG, "layers: the counts add up to %lld, the model has %d",
                        (long long)total, m->n_layers);
    for (int32_t i = 0; i < n_stages; i++) {
        int64_t need = need_bytes(m, &stages[i], i, n_stages, counts[i]);
        if (need > stages[i].memory_bytes)
            return pp_error(PP_ERR_EXHAUSTED, "layers: stage %d needs %lld bytes per worker for %d "
                            "layers (tp %d; weights, KV reserve and %lld for the process), a "
                            "worker has %lld", i, (long long)need, counts[i],
                            stages[i].tp > 0 ? stages[i].tp : 1,
                            (long long)m->worker_reserve_bytes,
                            (long long)stages[i].memory_bytes);
    }
    return PP_OK;
}

pp_status pp_plan_partition(const struct pp_plan_model *m, const struct pp_plan_stage *stages,
                            int32_t n_stages, int32_t *counts)
{
    pp_status st = check_inputs(m, stages, n_stages);
    if (st != PP_OK)
        return st;
    int32_t L = m->n_layers, P = n_stages;
    /* best[i][j] and the layer count of stage i-1 that achieves it */
    size_t cells = (size_t)(P + 1) * (size_t)(L + 1);
    double *best = malloc(sizeof(double) * cells);
    double *even = malloc(sizeof(double) * cells); /* sum of squared stage times: lower = evener */
    int32_t *take = malloc(sizeof(int32_t) * cells);
    if (!best || !even || !take) {
        free(best);
        free(even);
        free(take);
        return PP_ERR_NOMEM;
    }
#define BEST(i, j) best[(size_t)(i) * (size_t)(L + 1) + (size_t)(j)]
#define TAKE(i, j) take[(size_t)(i) * (size_t)(L + 1) + (size_t)(j)]
#define EVEN(i, j) even[(size_t)(i) * (size_t)(L + 1) + (size_t)(j)]
    for (int32_t i = 0; i <= P; i++)
        for (int32_t j = 0; j <= L; j++) {
            BEST(i, j) = INFINITY;
            EVEN(i, j) = INFINITY;
        }
    BEST(0, 0) = 0.0;
    EVEN(0, 0) = 0.0;
    for (int32_t i = 1; i <= P; i++) {
        for (int32_t j = i; j <= L - (P - i); j++) {
            /* stage i-1 takes k layers: j-k .. j-1. Trying small k first and keeping only strict
             * improvements leaves later stages the fewest layers among fully equal candidates, so
             * earlier stages take the extra ones. */
            for (int32_t k = 1; k <= j - (i - 1); k++) {
                double prev = BEST(i - 1, j - k);
                if (prev == INFINITY)
                    continue;
                if (need_bytes(m, &stages[i - 1], i - 1, P, k) > stages[i - 1].memory_bytes)
                    continue;
                double work = k + (i == P ? m->last_extra_layers : 0.0);
                double t = work * stages[i - 1].seconds_per_layer;
                double v = prev > t ? prev : t, e = EVEN(i - 1, j - k) + t * t;
                /* the slowest stage first; among equal slowest stages, the evener split */
                int better = v < BEST(i, j) * (1.0 - 1e-12) ||
                             (v <= BEST(i, j) * (1.0 + 1e-12) && e < EVEN(i, j) * (1.0 - 1e-12));
                if (better) {
                    BEST(i, j) = v;
                    EVEN(i, j) = e;
                    TAKE(i, j) = k;
                }
            }
        }
    }
    if (BEST(P, L) == INFINITY) {
        /* what one worker of each stage could hold at most, against the model's layers */
        int64_t total = 0, model = m->first_bytes + m->last_bytes +
                                   (int64_t)L * (m->layer_bytes + m->kv_layer_bytes);
        int64_t need = model;
        for (int32_t i = 0; i < P; i++) {
            int64_t w = stages[i].tp > 1 ? stages[i].tp : 1;
            total += stages[i].memory_bytes * w;
            need += m->worker_reserve_bytes * w;
        }
        free(best);
        free(even);
        free(take);
        return pp_error(PP_ERR_EXHAUSTED,
                        "planner: no partition of %d layers fits the stages' memory (the model "
                        "needs %lld bytes with its KV reserve, plus %lld per worker for the "
                        "process: %lld on the %d stages' workers, which have %lld in all)",
                        L, (long long)model, (long long)m->worker_reserve_bytes,
                        (long long)need, P, (long long)total);
    }
    for (int32_t i = P, j = L; i >= 1; i--) {
        counts[i - 1] = TAKE(i, j);
        j -= counts[i - 1];
    }
#undef BEST
#undef TAKE
#undef EVEN
    free(best);
    free(even);
    free(take);
    return PP_OK;
}
