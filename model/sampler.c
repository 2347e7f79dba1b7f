/* Sampling. Candidates are ordered by (logit desc, id asc), a total order, so the result does not
 * depend on the sort algorithm; probabilities are computed in double. */
#include "model/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "model/rng.h"

struct cand {
    float logit;
    int32_t id;
};

struct pp_sampler {
    int32_t vocab;
    struct cand *cands; /* [vocab] */
    double *probs;      /* [vocab] */
    uint8_t *seen;      /* [vocab] repetition-penalty marks */
};

void pp_sampling_defaults(struct pp_sampling *s)
{
    s->temperature = 0.0f;
    s->top_k = 0;
    s->top_p = 1.0f;
    s->min_p = 0.0f;
    s->repeat_penalty = 1.0f;
    s->seed = 0;
}

pp_status pp_sampling_validate(const struct pp_sampling *s)
{
    if (!(s->temperature >= 0.0f) || !isfinite(s->temperature) || s->temperature > 100.0f)
        return pp_error(PP_ERR_INVALID_ARG,
                        "temperature: expected 0 (greedy) or a value in (0, 100], got %g",
                        s->temperature);
    if (s->top_k < 0)
        return pp_error(PP_ERR_INVALID_ARG, "top_k: expected 0 (off) or a positive count, got %d",
                        s->top_k);
    if (!(s->top_p > 0.0f && s->top_p <= 1.0f))
        return pp_error(PP_ERR_INVALID_ARG, "top_p: expected a value in (0, 1], got %g", s->top_p);
    if (!(s->min_p >= 0.0f && s->min_p < 1.0f))
        return pp_error(PP_ERR_INVALID_ARG, "min_p: expected a value in [0, 1), got %g", s->min_p);
    if (!(s->repeat_penalty > 0.0f) || !isfinite(s->repeat_penalty) || s->repeat_penalty > 100.0f)
        return pp_error(PP_ERR_INVALID_ARG,
                        "repeat_penalty: expected a value in (0, 100] (1 = off), got %g",
                        s->repeat_penalty);
    return PP_OK;
}

pp_status pp_sampler_new(int32_t vocab, struct pp_sampler **out)
{
    struct pp_sampler *s = pp_calloc(PP_MEM_MISC, 1, sizeof(*s));
    if (!s)
        return PP_ERR_NOMEM;
    s->vocab = vocab;
    s->cands = pp_alloc(PP_MEM_MISC, (size_t)vocab * sizeof(*s->cands));
    s->probs = pp_alloc(PP_MEM_MISC, (size_t)vocab * sizeof(*s->probs));
    s->seen = pp_calloc(PP_MEM_MISC, (size_t)vocab, 1);
    if (!s->cands || !s->probs || !s->seen) {
        pp_sampler_free(s);
        return PP_ERR_NOMEM;
    }
    *out = s;
    return PP_OK;
}

void pp_sampler_free(struct pp_sampler *s)
{
    if (!s)
        return;
    pp_free(PP_MEM_MISC, s->cands);
    pp_free(PP_MEM_MISC, s->probs);
    pp_free(PP_MEM_MISC, s->seen);
    pp_free(PP_MEM_MISC, s);
}

static int cand_cmp(const void *a, const void *b)
{
    const struct cand *x = a, *y = b;
    if (x->logit != y->logit)
        return x->logit > y->logit ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static void apply_penalty(struct pp_sampler *s, float r, float *logits, const int32_t *hist,
                          int32_t n)
{
    for (int32_t i = 0; i < n; i++) {
        int32_t t = hist[i];
        if (t < 0 || t >= s->vocab || s->seen[t])
            continue;
        s->seen[t] = 1;
        logits[t] = logits[t] > 0.0f ? logits[t] / r : logits[t] * r;
    }
    for (int32_t i = 0; i < n; i++)
        if (hist[i] >= 0 && hist[i] < s->vocab)
            s->seen[hist[i]] = 0;
}

static int32_t argmax(const float *logits, int32_t n)
{
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (logits[i] > logits[best])
            best = i;
    return best;
}

int32_t pp_sample(struct pp_sampler *s, const struct pp_sampling *p, float *logits,
                  const int32_t *history, int32_t n_history, uint64_t step)
{
    if (p->repeat_penalty != 1.0f)
        apply_penalty(s, p->repeat_penalty, logits, history, n_history);
    if (p->temperature == 0.0f)
        return argmax(logits, s->vocab);

    int32_t n = s->vocab;
    for (int32_t i = 0; i < n; i++) {
        s->cands[i].logit = logits[i];
        s->cands[i].id = i;
    }
    qsort(s->cands, (size_t)n, sizeof(*s->cands), cand_cmp);
    if (p->top_k > 0 && p->top_k < n)
        n = p->top_k;

    /* softmax at the temperature over the remaining candidates */
    double max = (double)s->cands[0].logit / p->temperature, sum = 0.0;
    for (int32_t i = 0; i < n; i++) {
        s->probs[i] = exp((double)s->cands[i].logit / p->temperature - max);
        sum += s->probs[i];
    }
    for (int32_t i = 0; i < n; i++)
        s->probs[i] /= sum;

    if (p->top_p < 1.0f) {
        double cum = 0.0;
        int32_t keep = n;
        for (int32_t i = 0; i < n; i++) {
            cum += s->probs[i];
            if (cum >= p->top_p) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
    }
    if (p->min_p > 0.0f) {
        double floor = p->min_p * s->probs[0];
        int32_t keep = 1;
        while (keep < n && s->probs[keep] >= floor)
            keep++;
        n = keep;
    }
    double total = 0.0;
    for (int32_t i = 0; i < n; i++)
        total += s->probs[i];
    double u = pp_rng_uniform(p->seed, step) * total, cum = 0.0;
    for (int32_t i = 0; i < n; i++) {
        cum += s->probs[i];
        if (u < cum)
            return s->cands[i].id;
    }
    return s->cands[n - 1].id;
}
