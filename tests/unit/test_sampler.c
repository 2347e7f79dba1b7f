/* Unit tests of model/sampler: parameter validation, greedy ties, reproducibility keyed by
 * (seed, step), the truncations (top-k, top-p, min-p), the repetition penalty, and that the draws
 * follow the softmax they claim to. */
#include "testutil.h"

#include <math.h>
#include <string.h>

#include "common/alloc.h"
#include "model/sampler.h"

static struct pp_sampler *sampler(int32_t vocab)
{
    struct pp_sampler *s = NULL;
    assert_int_equal(pp_sampler_new(vocab, &s), PP_OK);
    return s;
}

/* pp_sample on a copy, so the caller's logits stay as written. */
static int32_t sample(struct pp_sampler *s, const struct pp_sampling *p, const float *logits,
                      int32_t vocab, const int32_t *hist, int32_t n_hist, uint64_t step)
{
    float tmp[256];
    assert_true(vocab <= 256);
    memcpy(tmp, logits, (size_t)vocab * sizeof(float));
    return pp_sample(s, p, tmp, hist, n_hist, step);
}

static void expect_invalid(const struct pp_sampling *p, const char *field)
{
    pp_error_clear();
    assert_int_equal(pp_sampling_validate(p), PP_ERR_INVALID_ARG);
    if (!strstr(pp_error_detail(), field))
        fail_msg("message \"%s\" does not name %s", pp_error_detail(), field);
}

static void test_validate(void **state)
{
    (void)state;
    struct pp_sampling d, p;
    pp_sampling_defaults(&d);
    assert_true(d.temperature == 0.0f && d.top_k == 0 && d.top_p == 1.0f && d.min_p == 0.0f &&
                d.repeat_penalty == 1.0f && d.seed == 0);
    assert_int_equal(pp_sampling_validate(&d), PP_OK);

    const float bad_temp[] = {-0.5f, NAN, INFINITY, 100.5f};
    for (int i = 0; i < 4; i++) {
        p = d;
        p.temperature = bad_temp[i];
        expect_invalid(&p, "temperature");
    }
    p = d;
    p.top_k = -1;
    expect_invalid(&p, "top_k");
    const float bad_top_p[] = {0.0f, -0.1f, 1.01f, NAN};
    for (int i = 0; i < 4; i++) {
        p = d;
        p.top_p = bad_top_p[i];
        expect_invalid(&p, "top_p");
    }
    const float bad_min_p[] = {-0.01f, 1.0f, NAN};
    for (int i = 0; i < 3; i++) {
        p = d;
        p.min_p = bad_min_p[i];
        expect_invalid(&p, "min_p");
    }
    const float bad_rep[] = {0.0f, -1.0f, NAN, INFINITY, 101.0f};
    for (int i = 0; i < 5; i++) {
        p = d;
        p.repeat_penalty = bad_rep[i];
        expect_invalid(&p, "repeat_penalty");
    }
    /* the message also says what arrived */
    p = d;
    p.top_k = -7;
    expect_invalid(&p, "-7");

    /* the edges of each range are accepted */
    p = d;
    p.temperature = 100.0f;
    p.top_k = 1000000;
    p.top_p = 1e-9f;
    p.min_p = 0.999f;
    p.repeat_penalty = 100.0f;
    assert_int_equal(pp_sampling_validate(&p), PP_OK);
}

static void test_greedy_argmax_lowest_id_on_ties(void **state)
{
    (void)state;
    struct pp_sampler *s = sampler(6);
    struct pp_sampling p;
    pp_sampling_defaults(&p);
    const float a[6] = {0.1f, 2.0f, -1.0f, 2.0f, 1.9f, 2.0f};
    assert_int_equal(sample(s, &p, a, 6, NULL, 0, 0), 1);
    const float flat[6] = {0, 0, 0, 0, 0, 0};
    assert_int_equal(sample(s, &p, flat, 6, NULL, 0, 0), 0);
    const float last[6] = {-5, -4, -3, -2, -1, 0};
    assert_int_equal(sample(s, &p, last, 6, NULL, 0, 0), 5);
    const float neg[6] = {-INFINITY, -3.0f, -INFINITY, -3.0f, -7.0f, -INFINITY};
    assert_int_equal(sample(s, &p, neg, 6, NULL, 0, 0), 1);
    /* the seed and step do not matter at temperature 0 */
    p.seed = 99;
    assert_int_equal(sample(s, &p, a, 6, NULL, 0, 12345), 1);
    pp_sampler_free(s);
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void rand_logits(uint64_t *seed, float *l, int32_t n, float spread)
{
    for (int32_t i = 0; i < n; i++)
        l[i] = spread * ((float)((rng_next(seed) >> 40) * (1.0 / 16777216.0)) - 0.5f);
}

/* A draw is a pure function of (logits, parameters, seed, step): the same on a fresh sampler, and
 * different seeds (or steps) give different tokens. */
static void test_reproducible_by_seed_and_step(void **state)
{
    (void)state;
    enum { V = 50 };
    struct pp_sampler *s1 = sampler(V), *s2 = sampler(V);
    struct pp_sampling p;
    pp_sampling_defaults(&p);
    p.temperature = 1.0f;
    uint64_t g = 1;
    float l[V];
    rand_logits(&g, l, V, 2.0f);
    for (uint64_t step = 0; step < 200; step++) {
        p.seed = step % 7;
        assert_int_equal(sample(s1, &p, l, V, NULL, 0, step), sample(s2, &p, l, V, NULL, 0, step));
    }
    int distinct_seeds = 0, distinct_steps = 0;
    p.seed = 0;
    int32_t ref = sample(s1, &p, l, V, NULL, 0, 5);
    for (uint64_t seed = 1; seed <= 20; seed++) {
        p.seed = seed;
        distinct_seeds += sample(s1, &p, l, V, NULL, 0, 5) != ref;
    }
    p.seed = 0;
    for (uint64_t step = 6; step <= 25; step++)
        distinct_steps += sample(s1, &p, l, V, NULL, 0, step) != ref;
    /* flat-ish logits over 50 tokens: a repeat is possible, twenty in a row is not */
    assert_true(distinct_seeds >= 10);
    assert_true(distinct_steps >= 10);
    pp_sampler_free(s1);
    pp_sampler_free(s2);
}

/* top_k = 1 and a tiny top_p both leave only the argmax, with greedy's tie rule. */
static void test_truncations_to_argmax(void **state)
{
    (void)state;
    enum { V = 40 };
    struct pp_sampler *s = sampler(V);
    struct pp_sampling greedy, k1, p0;
    pp_sampling_defaults(&greedy);
    uint64_t g = 2;
    for (int it = 0; it < 300; it++) {
        float l[V];
        rand_logits(&g, l, V, 6.0f);
        if (it % 3 == 0)
            l[17] = l[4] = 10.0f; /* a tie at the top */
        pp_sampling_defaults(&k1);
        k1.temperature = 0.8f + (float)(it % 5);
        k1.top_k = 1;
        k1.seed = (uint64_t)it;
        p0 = k1;
        p0.top_k = 0;
        p0.top_p = 1e-6f;
        int32_t want = sample(s, &greedy, l, V, NULL, 0, 0);
        assert_int_equal(sample(s, &k1, l, V, NULL, 0, (uint64_t)it), want);
        assert_int_equal(sample(s, &p0, l, V, NULL, 0, (uint64_t)it), want);
        if (it % 3 == 0)
            assert_int_equal(want, 4);
    }
    pp_sampler_free(s);
}

/* Counts of n_steps draws. */
static void histogram(struct pp_sampler *s, const struct pp_sampling *p, const float *l, int32_t v,
                      int n_steps, int *counts)
{
    memset(counts, 0, (size_t)v * sizeof(int));
    for (int step = 0; step < n_steps; step++) {
        int32_t t = sample(s, p, l, v, NULL, 0, (uint64_t)step);
        assert_in_range(t, 0, v - 1);
        counts[t]++;
    }
}

/* Pearson's chi-square of counts against probabilities (tokens with probability 0 must not
 * appear at all). */
static double chi_square(const int *counts, const double *prob, int32_t v, int n)
{
    double chi = 0.0;
    for (int32_t i = 0; i < v; i++) {
        if (prob[i] == 0.0) {
            if (counts[i] != 0)
                fail_msg("token %d drawn %d times but has probability 0", i, counts[i]);
            continue;
        }
        double e = prob[i] * n;
        chi += (counts[i] - e) * (counts[i] - e) / e;
    }
    return chi;
}

/* softmax(l / temperature) over the `keep` highest logits (all distinct here). */
static void softmax_top(const float *l, int32_t v, double temperature, int32_t keep, double *prob)
{
    double sum = 0.0;
    for (int32_t i = 0; i < v; i++) {
        int32_t rank = 0;
        for (int32_t j = 0; j < v; j++)
            rank += l[j] > l[i];
        prob[i] = rank < keep ? exp(l[i] / temperature) : 0.0;
        sum += prob[i];
    }
    for (int32_t i = 0; i < v; i++)
        prob[i] /= sum;
}

/* Over many steps the draws follow the softmax at the temperature. df = 7; a chi-square above 40
 * has probability ~1e-6 under the right distribution, while a wrong temperature or an off-by-one
 * in the cumulative walk lands far above it. */
static void test_empirical_distribution(void **state)
{
    (void)state;
    enum { V = 8, N = 20000 };
    struct pp_sampler *s = sampler(V);
    const float l[V] = {0.3f, -1.0f, 1.2f, 0.0f, 2.0f, -0.4f, 0.9f, 1.5f};
    double prob[V];
    int counts[V];
    const float temps[] = {1.0f, 0.6f, 2.5f};
    for (int ti = 0; ti < 3; ti++) {
        struct pp_sampling p;
        pp_sampling_defaults(&p);
        p.temperature = temps[ti];
        p.seed = 1234 + (uint64_t)ti;
        softmax_top(l, V, temps[ti], V, prob);
        histogram(s, &p, l, V, N, counts);
        double chi = chi_square(counts, prob, V, N);
        if (chi > 40.0)
            fail_msg("temperature %g: chi-square %.1f", (double)temps[ti], chi);
    }
    /* top_k = 3: the three best, renormalised */
    struct pp_sampling p;
    pp_sampling_defaults(&p);
    p.temperature = 1.0f;
    p.top_k = 3;
    p.seed = 77;
    softmax_top(l, V, 1.0, 3, prob);
    histogram(s, &p, l, V, N, counts);
    assert_true(chi_square(counts, prob, V, N) < 40.0);
    pp_sampler_free(s);
}

/* top_p keeps the smallest set of best tokens whose mass reaches p; min_p drops tokens below
 * min_p × the best token's probability. */
static void test_top_p_and_min_p_sets(void **state)
{
    (void)state;
    enum { V = 5, N = 4000 };
    struct pp_sampler *s = sampler(V);
    /* probabilities 0.5, 0.3, 0.15, 0.05 (and ~0) at temperature 1 */
    const float l[V] = {logf(0.15f), logf(0.5f), -30.0f, logf(0.05f), logf(0.3f)};
    int counts[V];
    struct pp_sampling p;
    pp_sampling_defaults(&p);
    p.temperature = 1.0f;
    p.seed = 3;

    p.top_p = 0.75f; /* 0.5 < 0.75 <= 0.5 + 0.3: tokens 1 and 4 */
    histogram(s, &p, l, V, N, counts);
    assert_true(counts[1] > 0 && counts[4] > 0);
    assert_int_equal(counts[0] + counts[2] + counts[3], 0);
    /* and in the ratio 5:3 (expected 2500:1500) */
    assert_in_range(counts[1], 2350, 2650);

    p.top_p = 0.9f; /* needs the third: tokens 1, 4, 0 */
    histogram(s, &p, l, V, N, counts);
    assert_true(counts[0] > 0 && counts[1] > 0 && counts[4] > 0);
    assert_int_equal(counts[2] + counts[3], 0);

    p.top_p = 1.0f;
    p.min_p = 0.5f; /* floor 0.25: 0.5 and 0.3 survive */
    histogram(s, &p, l, V, N, counts);
    assert_true(counts[1] > 0 && counts[4] > 0);
    assert_int_equal(counts[0] + counts[2] + counts[3], 0);

    p.min_p = 0.2f; /* floor 0.1: 0.15 survives too, 0.05 does not */
    histogram(s, &p, l, V, N, counts);
    assert_true(counts[0] > 0 && counts[1] > 0 && counts[4] > 0);
    assert_int_equal(counts[2] + counts[3], 0);

    p.min_p = 0.999f; /* only the best is left */
    histogram(s, &p, l, V, N, counts);
    assert_int_equal(counts[1], N);
    pp_sampler_free(s);
}

/* The penalty divides a positive logit and multiplies a negative one by r, once per distinct
 * token however often it occurs, and leaves the rest alone. */
static void test_repetition_penalty(void **state)
{
    (void)state;
    enum { V = 6 };
    struct pp_sampler *s = sampler(V);
    struct pp_sampling p;
    pp_sampling_defaults(&p);
    p.repeat_penalty = 2.0f;
    float l[V] = {3.0f, -2.0f, 2.5f, 0.5f, 0.0f, -1.0f};
    const int32_t hist[] = {0, 1, 0, 0, 1, 4, -1, V, 1 << 30}; /* out-of-range ids are ignored */
    int32_t t = pp_sample(s, &p, l, hist, 9, 0);
    assert_true(l[0] == 1.5f);  /* 3 / 2, once */
    assert_true(l[1] == -4.0f); /* -2 × 2, once */
    assert_true(l[2] == 2.5f);
    assert_true(l[3] == 0.5f);
    assert_true(l[4] == 0.0f);
    assert_true(l[5] == -1.0f);
    assert_int_equal(t, 2); /* the penalised former favourite lost */

    /* the marks are cleared between calls: a second call penalises from scratch, once */
    float l2[V] = {3.0f, -2.0f, 2.5f, 0.5f, 0.0f, -1.0f};
    pp_sample(s, &p, l2, hist, 9, 1);
    assert_true(l2[0] == 1.5f && l2[1] == -4.0f);
    /* and with no history nothing moves */
    float l3[V] = {3.0f, -2.0f, 2.5f, 0.5f, 0.0f, -1.0f};
    assert_int_equal(pp_sample(s, &p, l3, NULL, 0, 2), 0);
    assert_true(l3[0] == 3.0f);
    /* penalty 1 is off: history leaves the logits untouched */
    p.repeat_penalty = 1.0f;
    float l4[V] = {3.0f, -2.0f, 2.5f, 0.5f, 0.0f, -1.0f};
    assert_int_equal(pp_sample(s, &p, l4, hist, 9, 3), 0);
    assert_true(l4[0] == 3.0f && l4[1] == -2.0f);
    pp_sampler_free(s);
}

static void test_alloc_failures(void **state)
{
    (void)state;
    int64_t before = pp_mem_live(PP_MEM_MISC);
    for (int nth = 1; nth <= 4; nth++) {
        struct pp_sampler *s = NULL;
        pp_alloc_fail_at(nth);
        assert_int_equal(pp_sampler_new(100, &s), PP_ERR_NOMEM);
        pp_alloc_fail_at(0);
        assert_int_equal(pp_mem_live(PP_MEM_MISC), before);
    }
    pp_sampler_free(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_validate),
        cmocka_unit_test(test_greedy_argmax_lowest_id_on_ties),
        cmocka_unit_test(test_reproducible_by_seed_and_step),
        cmocka_unit_test(test_truncations_to_argmax),
        cmocka_unit_test(test_empirical_distribution),
        cmocka_unit_test(test_top_p_and_min_p_sets),
        cmocka_unit_test(test_repetition_penalty),
        cmocka_unit_test(test_alloc_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
