/* Token sampling from one row of logits: repetition penalty, temperature, top-k, top-p, min-p, and
 * a draw keyed by (seed, step). Temperature 0 is greedy (argmax, lowest id on ties). */
#ifndef PP_SAMPLER_H
#define PP_SAMPLER_H

#include <stdint.h>

#include "common/status.h"

struct pp_sampling {
    float temperature;    /* 0 = greedy; otherwise > 0 */
    int32_t top_k;        /* 0 = off */
    float top_p;          /* 1 = off; in (0, 1] */
    float min_p;          /* 0 = off; in [0, 1) */
    float repeat_penalty; /* 1 = off; > 0 */
    uint64_t seed;
};

/* Greedy defaults: temperature 0, top_k 0, top_p 1, min_p 0, repeat_penalty 1, seed 0. */
void pp_sampling_defaults(struct pp_sampling *s);

/* A message naming the bad field, what is allowed and what arrived. */
pp_status pp_sampling_validate(const struct pp_sampling *s);

struct pp_sampler;

pp_status pp_sampler_new(int32_t vocab_size, struct pp_sampler **out);
void pp_sampler_free(struct pp_sampler *s);

/* Picks a token from logits[vocab] (modified in place). history[n_history] are the tokens the
 * penalty applies to (prompt and generated so far, each penalised once). step is the index of the
 * token being generated (0 for the first), the RNG counter. */
int32_t pp_sample(struct pp_sampler *s, const struct pp_sampling *p, float *logits,
                  const int32_t *history, int32_t n_history, uint64_t step);

#endif
