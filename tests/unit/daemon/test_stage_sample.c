/* The last stage's sampling (stage/sample.c): each sequence's history is built from its parts'
 * token ids (prefill chunks and decode tokens alike), checked against the position before a forward
 * pass, and the tokens it samples are exactly those of model/generate.c's loop for the same logits,
 * chunked prefill and other sequences in the batch notwithstanding. The daemon's files are not a
 * library, so the two this needs are compiled into the test. */
#include "stage/error.c"
#include "stage/sample.c"

#include <string.h>

#include "testutil.h"

#define VOCAB 64
#define STEPS 24

/* Logits that depend on every token of the sequence so far, as a model's do. */
static void fake_logits(const int32_t *ids, int32_t n, float *out)
{
    uint32_t h = 2166136261u;
    for (int32_t i = 0; i < n; i++)
        h = (h ^ (uint32_t)ids[i]) * 16777619u;
    for (uint32_t v = 0; v < VOCAB; v++) {
        uint32_t x = h ^ (v * 2654435761u);
        x ^= x >> 15;
        x *= 0x2c1b3c6du;
        x ^= x >> 12;
        out[v] = (float)(x % 2000u) / 250.0f - 4.0f;
    }
}

/* model/generate.c's order: sample from the history, then append the token. */
static void reference(const int32_t *prompt, int32_t n_prompt, const struct pp_sampling *sp,
                      int32_t *tokens, float *raw)
{
    struct pp_sampler *smp;
    assert_int_equal(pp_sampler_new(VOCAB, &smp), PP_OK);
    int32_t hist[256], n = n_prompt;
    memcpy(hist, prompt, (size_t)n_prompt * sizeof(int32_t));
    float logits[VOCAB];
    for (int k = 0; k < STEPS; k++) {
        fake_logits(hist, n, logits);
        memcpy(raw + k * VOCAB, logits, sizeof(logits));
        tokens[k] = pp_sample(smp, sp, logits, hist, n, (uint64_t)k);
        hist[n++] = tokens[k];
    }
    pp_sampler_free(smp);
}

struct seq {
    uint64_t id;
    const int32_t *prompt;
    int32_t n_prompt;
    Ppserve__V1__Sampling wire;
    int32_t all[256]; /* what the "model" has seen: the prompt, then the sampled tokens */
    int32_t n_all;
    int32_t tokens[STEPS];
    float raw[STEPS * VOCAB];
    int n_tokens;
};

static void set_part(Ppserve__V1__SeqPart *p, struct seq *s, int32_t pos, const int32_t *ids,
                     int32_t n, int want)
{
    ppserve__v1__seq_part__init(p);
    p->seq_id = s->id;
    p->pos = pos;
    p->n_tokens = n;
    p->want_logits = want;
    p->sampling = &s->wire;
    p->step = (uint32_t)s->n_tokens;
    p->n_token_ids = (size_t)n;
    p->token_ids = (int32_t *)ids;
    p->return_logits = 1;
}

/* One microbatch through prepare, the "forward pass" and sample. */
static void run_mb(struct pp_stage_history *h, struct pp_sampler *smp, Ppserve__V1__SeqPart **parts,
                   size_t n_parts, struct seq **owners)
{
    Ppserve__V1__MicrobatchHeader hdr = PPSERVE__V1__MICROBATCH_HEADER__INIT;
    hdr.n_parts = n_parts;
    hdr.parts = parts;
    assert_int_equal(pp_stage_sample_prepare(h, &hdr), PP_OK);
    float logits[8 * VOCAB];
    size_t row = 0;
    for (size_t i = 0; i < n_parts; i++) {
        struct seq *s = owners[i];
        memcpy(s->all + s->n_all, parts[i]->token_ids, parts[i]->n_token_ids * sizeof(int32_t));
        s->n_all += (int32_t)parts[i]->n_token_ids;
        if (parts[i]->want_logits)
            fake_logits(s->all, s->n_all, logits + VOCAB * row++);
    }
    struct pp_stage_sampled out;
    assert_int_equal(pp_stage_sample(h, smp, VOCAB, &hdr, logits, &out), PP_OK);
    assert_int_equal(out.n, row);
    row = 0;
    for (size_t i = 0; i < n_parts; i++) {
        if (!parts[i]->want_logits)
            continue;
        struct seq *s = owners[i];
        const Ppserve__V1__SampledToken *t = out.ptrs[row++];
        assert_int_equal(t->seq_id, s->id);
        assert_int_equal(t->logits.len, VOCAB * sizeof(float));
        memcpy(s->raw + s->n_tokens * VOCAB, t->logits.data, t->logits.len);
        s->tokens[s->n_tokens++] = t->token;
    }
    pp_stage_sampled_free(&out);
}

static void test_matches_generate(void **state)
{
    (void)state;
    static const int32_t pa[] = {1, 17, 17, 5, 40, 2, 9, 9, 9, 33};
    static const int32_t pb[] = {7, 7, 3};
    struct seq a = {.id = 41, .prompt = pa, .n_prompt = 10},
               b = {.id = 42, .prompt = pb, .n_prompt = 3};
    ppserve__v1__sampling__init(&a.wire);
    a.wire.temperature = 0.9f, a.wire.top_k = 20, a.wire.repeat_penalty = 1.3f, a.wire.seed = 11;
    ppserve__v1__sampling__init(&b.wire);
    b.wire.repeat_penalty = 1.2f; /* greedy with a penalty: the history decides every token */

    struct pp_stage_history *h;
    struct pp_sampler *smp;
    assert_int_equal(pp_stage_history_new(&h), PP_OK);
    assert_int_equal(pp_sampler_new(VOCAB, &smp), PP_OK);
    Ppserve__V1__SeqPart p[2], *pp[2] = {&p[0], &p[1]};
    struct seq *own[2];

    /* a's prompt in two chunks, the first without logits; b's whole, in the second microbatch */
    set_part(&p[0], &a, 0, pa, 4, 0);
    own[0] = &a;
    run_mb(h, smp, pp, 1, own);
    assert_int_equal(pp_stage_history_len(h, 41), 4);
    set_part(&p[0], &b, 0, pb, 3, 1);
    set_part(&p[1], &a, 4, pa + 4, 6, 1);
    own[0] = &b, own[1] = &a;
    run_mb(h, smp, pp, 2, own);
    for (int k = 1; k < STEPS; k++) {
        /* each decode part carries the token sampled last */
        set_part(&p[0], &a, a.n_all, &a.tokens[a.n_tokens - 1], 1, 1);
        set_part(&p[1], &b, b.n_all, &b.tokens[b.n_tokens - 1], 1, 1);
        own[0] = &a, own[1] = &b;
        run_mb(h, smp, pp, 2, own);
    }
    struct seq *seqs[2] = {&a, &b};
    for (int i = 0; i < 2; i++) {
        struct seq *s = seqs[i];
        struct pp_sampling sp;
        assert_int_equal(pp_sampling_from_wire(&s->wire, &sp), PP_OK);
        int32_t want[STEPS];
        static float raw[STEPS * VOCAB];
        reference(s->prompt, s->n_prompt, &sp, want, raw);
        assert_memory_equal(s->tokens, want, sizeof(want));
        assert_memory_equal(s->raw, raw, sizeof(raw)); /* before the sampler touched them */
        assert_int_equal(pp_stage_history_len(h, s->id), s->n_prompt + STEPS - 1);
    }
    assert_int_equal(pp_stage_history_release(h, 41), 1);
    assert_int_equal(pp_stage_history_release(h, 41), 0);
    assert_int_equal(pp_stage_history_len(h, 41), 0);
    pp_sampler_free(smp);
    pp_stage_history_free(h);
}

static void expect(pp_status st, const char *needle)
{
    assert_int_not_equal(st, PP_OK);
    if (!strstr(pp_error_detail(), needle))
        fail_msg("'%s' not in '%s'", needle, pp_error_detail());
}

/* prepare refuses before anything changes: a position the history does not hold, a bad sampling
 * setting (named, with what arrived). */
static void test_prepare_refuses(void **state)
{
    (void)state;
    struct pp_stage_history *h;
    assert_int_equal(pp_stage_history_new(&h), PP_OK);
    static const int32_t ids[] = {1, 2, 3};
    struct seq s = {.id = 9};
    ppserve__v1__sampling__init(&s.wire);
    Ppserve__V1__SeqPart p, *pp[1] = {&p};
    Ppserve__V1__MicrobatchHeader hdr = PPSERVE__V1__MICROBATCH_HEADER__INIT;
    hdr.microbatch_id = 77;
    hdr.n_parts = 1;
    hdr.parts = pp;
    set_part(&p, &s, 5, ids, 3, 1);
    expect(pp_stage_sample_prepare(h, &hdr), "sequence 9: expected pos 0 (tokens held), got 5");
    s.wire.temperature = -1.0f;
    set_part(&p, &s, 0, ids, 3, 1);
    expect(pp_stage_sample_prepare(h, &hdr), "microbatch 77, sequence 9: temperature");
    assert_int_equal(pp_stage_history_len(h, 9), 0);
    pp_stage_history_free(h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_generate),
        cmocka_unit_test(test_prepare_refuses),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
