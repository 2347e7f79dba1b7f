/* The Mixture-of-Experts FFN of one layer on one worker: the router over every expert, top-k with
 * the architecture's gating, then the experts this worker holds, each run once over the tokens
 * routed to it, and the shared expert. Called by the executor in place of the dense FFN.
 *
 * Determinism: a token's output depends only on the token itself (never on the batch, the thread
 * count, or where other tokens are routed): its sum runs over its experts in increasing expert id,
 * then the shared expert, and a backend matmul's rows do not depend on how many rows share the
 * call. Not thread-safe on one scratch; separate scratches may be used from separate threads. */
#ifndef PP_MOE_FFN_H
#define PP_MOE_FFN_H

#include <stdint.h>

#include "common/status.h"
#include "kernels/backend.h"
#include "model/model.h"
#include "model/model_config.h"

struct pp_moe_scratch; /* sized for max_rows tokens of a config */

/* Scratch in be's memory (the backend pp_moe_ffn will run on) for up to max_rows tokens of config
 * c, whose experts (and shared expert) have at most max_ffn_rows gate/up rows each (<= 0: the
 * larger of c's expert_ffn_dim and shared_ffn_dim, the unsharded sizes). *out is freed with
 * pp_moe_scratch_free. */
pp_status pp_moe_scratch_new(struct pp_backend *be, const struct pp_model_config *c,
                             int64_t max_rows, int32_t max_ffn_rows, struct pp_moe_scratch **out);
void pp_moe_scratch_free(struct pp_moe_scratch *s); /* NULL-safe */

/* out[T, dim] = this worker's part of the MoE FFN of x[T, dim] (already normalised): the router
 * over ALL experts (identical on every worker), top-k and weights per token (ties break towards the
 * lower expert id), then, for only the experts held in mw ([expert_base, expert_base + n_experts)),
 * the weighted expert outputs of the tokens routed to them, plus the shared expert (if mw has one)
 * times its sigmoid gate. out is overwritten and must not alias x. T <= the scratch's max_rows.
 * expert_tokens[n_experts_total], when not NULL, is incremented by the number of tokens routed to
 * each expert (counted for ALL experts, held or not). x, out and mw's weights are in be's memory
 * (mw as the backend loaded it). Returns the backend's first error when the routing results could
 * not be read back (device backends), PP_OK otherwise. */
pp_status pp_moe_ffn(struct pp_backend *be, const struct pp_model_config *c,
                     const struct pp_moe_weights *mw, const float *x, int64_t T, float *out,
                     struct pp_moe_scratch *s, int64_t *expert_tokens);

#endif
