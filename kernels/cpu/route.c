/* Token routing and selection on the CPU: MoE routing (kernels/route_impl.h: softmax with expf in
 * index order, top-k by repeated maximum with ties to the lower index) and the top-k of logit rows.
 * Plain f32 C on the calling thread: both are small next to the matmuls around them. */
#include <math.h>

#include "kernels/cpu/cpu-impl.h"
#include "kernels/route_impl.h"

void pp__cpu_moe_route(struct pp_backend *be, int32_t *pick, float *weight, float *logits,
                       int64_t n, int32_t n_experts, int32_t k, enum pp_route_mode mode,
                       int renormalise)
{
    (void)be;
    for (int64_t t = 0; t < n; t++)
        pp__route_token(logits + t * n_experts, n_experts, k, mode, renormalise, pick + t * k,
                        weight + t * k);
}

/* NaN ranks below every number (a NaN logit is never picked ahead of one). */
static inline float rank_key(float v)
{
    return isnan(v) ? -INFINITY : v;
}

pp_status pp__cpu_topk(struct pp_backend *be, int32_t *ids, float *vals, const float *logits,
                       int64_t n, int64_t vocab, int32_t k)
{
    (void)be;
    if (k < 1 || k > vocab)
        return pp_error(PP_ERR_INVALID_ARG, "topk: expected 1 <= k <= vocab (%lld), got %d",
                        (long long)vocab, k);
    for (int64_t r = 0; r < n; r++) {
        const float *row = logits + r * vocab;
        int32_t *id = ids + r * k;
        float *val = vals + r * k;
        int32_t have = 0;
        /* a sorted list of the best so far; ids arrive in increasing order, so an equal value
         * never displaces an earlier (lower) id */
        for (int64_t i = 0; i < vocab; i++) {
            float v = rank_key(row[i]);
            if (have == k && !(v > rank_key(val[k - 1])))
                continue;
            int32_t at = have < k ? have++ : k - 1;
            while (at > 0 && v > rank_key(val[at - 1])) {
                id[at] = id[at - 1];
                val[at] = val[at - 1];
                at--;
            }
            id[at] = (int32_t)i;
            val[at] = row[i];
        }
    }
    return PP_OK;
}
