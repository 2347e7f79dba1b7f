/* The MoE FFN (model/moe_ffn.c) and the executor on MoE models: a MoE sequence's logits are
 * bit-identical whatever the thread count, the window, the other sequences in its batch and where
 * the layer range is split; the expert token counts are the routed (token, expert) pairs, as
 * recomputed from the router; each row's bits do not depend on the other rows; experts split across
 * two workers (expert_base) add up to the whole. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "kernels/cpu/matmul_q8.h"
#include "model/executor.h"
#include "model/model.h"
#include "model/moe_ffn.h"
#include "testutil.h"

#define VOCAB 300
#define DIM 64

static char *dir;
static char mix_gguf[600], qwen_gguf[600], qwen_hf[600], dense_gguf[600];

static int setup(void **state)
{
    (void)state;
    dir = pp_test_tmpdir();
    struct pp_synth_spec s;
    snprintf(mix_gguf, sizeof(mix_gguf), "%s/mix.gguf", dir);
    snprintf(qwen_gguf, sizeof(qwen_gguf), "%s/qwen.gguf", dir);
    snprintf(qwen_hf, sizeof(qwen_hf), "%s/qwen_hf", dir);
    snprintf(dense_gguf, sizeof(dense_gguf), "%s/dense.gguf", dir);
    pp_test_moe_spec(&s, "mixtral", 6, 2);
    s.dtype = PP_DTYPE_F16;
    s.seed = 5;
    if (pp_synth_write_gguf(&s, mix_gguf) != PP_OK)
        return -1;
    pp_test_moe_spec(&s, "qwen2moe", 8, 3);
    s.dtype = PP_DTYPE_Q8_0;
    s.expert_ffn_dim = 32;
    s.shared_ffn_dim = 64;
    s.norm_topk_prob = 1;
    s.seed = 9;
    if (pp_synth_write_gguf(&s, qwen_gguf) != PP_OK)
        return -1;
    s.dtype = PP_DTYPE_F32;
    s.norm_topk_prob = 0;
    if (pp_synth_write_hf(&s, qwen_hf) != PP_OK)
        return -1;
    pp_test_small_spec(&s);
    return pp_synth_write_gguf(&s, dense_gguf) == PP_OK ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    pp_test_rmdir(dir);
    return 0;
}

static const int32_t prompt_a[] = {1, 17, 200, 45, 99, 3, 150};
static const int32_t prompt_b[] = {1, 250, 251, 252};
static const int32_t prompt_c[] = {1, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14};

/* Sequence A alone: prefill then 3 decode steps of a fixed continuation; 4 logit rows. */
static void run_alone(struct pp_test_engine *e, float *out)
{
    int32_t a[16];
    memcpy(a, prompt_a, sizeof(prompt_a));
    int32_t n = 7;
    struct pp_exec_seq p = {1, 0, n, 1};
    struct pp_exec_batch b = {1, &p, a, NULL};
    assert_int_equal(pp_executor_forward(e->ex, &b, NULL, out), PP_OK);
    for (int step = 1; step < 4; step++, n++) {
        a[n] = (int32_t)((step * 37) % VOCAB);
        struct pp_exec_seq d = {1, n, 1, 1};
        struct pp_exec_batch bd = {1, &d, &a[n], NULL};
        assert_int_equal(pp_executor_forward(e->ex, &bd, NULL, out + step * VOCAB), PP_OK);
    }
    pp_executor_release(e->ex, 1);
}

/* Sequence A's same steps inside batches with B and C, which route their tokens elsewhere. */
static void run_in_batch(struct pp_test_engine *e, float *out_a)
{
    int32_t a[16], toks[16];
    memcpy(a, prompt_a, sizeof(prompt_a));
    float *logits = malloc(sizeof(float) * VOCAB * 3);
    struct pp_exec_seq pc = {3, 0, 11, 1};
    struct pp_exec_batch bc = {1, &pc, prompt_c, NULL};
    assert_int_equal(pp_executor_forward(e->ex, &bc, NULL, logits), PP_OK);
    memcpy(toks, prompt_b, sizeof(prompt_b));
    memcpy(toks + 4, prompt_a, sizeof(prompt_a));
    toks[11] = 33;
    struct pp_exec_seq parts[3] = {{2, 0, 4, 1}, {1, 0, 7, 1}, {3, 11, 1, 1}};
    struct pp_exec_batch b = {3, parts, toks, NULL};
    assert_int_equal(pp_executor_forward(e->ex, &b, NULL, logits), PP_OK);
    memcpy(out_a, logits + VOCAB, sizeof(float) * VOCAB);
    int32_t n = 7;
    for (int step = 1; step < 4; step++, n++) {
        a[n] = (int32_t)((step * 37) % VOCAB);
        int32_t t[3] = {40, a[n], 41};
        struct pp_exec_seq p[3] = {{3, 11 + step, 1, 1}, {1, n, 1, 1}, {2, 3 + step, 1, 0}};
        struct pp_exec_batch bb = {3, p, t, NULL};
        assert_int_equal(pp_executor_forward(e->ex, &bb, NULL, logits), PP_OK);
        memcpy(out_a + step * VOCAB, logits + VOCAB, sizeof(float) * VOCAB);
    }
    for (uint64_t id = 1; id <= 3; id++)
        pp_executor_release(e->ex, id);
    free(logits);
}

static void check_invariance(const char *path)
{
    float ref[4 * VOCAB], got[4 * VOCAB];
    struct pp_test_engine e;
    pp_test_engine_open(&e, path, 0, -1, 1, 0, 1, 256);
    run_alone(&e, ref);
    pp_test_engine_close(&e);
    for (int threads = 1; threads <= 4; threads++) {
        for (int32_t window = 1; window <= 256; window *= 16) {
            pp_test_engine_open(&e, path, 0, -1, 1, 0, threads, window);
            run_alone(&e, got);
            assert_memory_equal(ref, got, sizeof(ref));
            run_in_batch(&e, got);
            assert_memory_equal(ref, got, sizeof(ref));
            pp_test_engine_close(&e);
        }
    }
}

static void test_batch_and_threads_bit_identical(void **state)
{
    (void)state;
    check_invariance(mix_gguf);
    check_invariance(qwen_gguf);
    check_invariance(qwen_hf);
}

/* Every forward adds n_tokens × k routed pairs per layer; a later range counts its own layers, and
 * [0, 1) then [1, 3) gives the logits of [0, 3) bit for bit. */
static void test_expert_token_counts(void **state)
{
    (void)state;
    struct pp_test_engine e, tail;
    pp_test_engine_open(&e, mix_gguf, 0, -1, 1, 0, 2, 4);
    pp_test_engine_open(&tail, mix_gguf, 1, -1, 1, 0, 1, 256);
    float logits[VOCAB], hidden[7 * DIM];
    struct pp_exec_seq p = {1, 0, 7, 1};
    struct pp_exec_batch b = {1, &p, prompt_a, NULL};
    assert_int_equal(pp_executor_forward(e.ex, &b, NULL, logits), PP_OK);
    int32_t next = 5;
    struct pp_exec_seq d = {1, 7, 1, 1};
    struct pp_exec_batch bd = {1, &d, &next, NULL};
    assert_int_equal(pp_executor_forward(e.ex, &bd, NULL, logits), PP_OK);
    for (int32_t l = 0; l < 3; l++) {
        const int64_t *c = pp_executor_expert_tokens(e.ex, l);
        assert_non_null(c);
        int64_t sum = 0;
        for (int32_t x = 0; x < 6; x++)
            sum += c[x];
        assert_int_equal(sum, 8 * 2);
    }
    assert_null(pp_executor_expert_tokens(e.ex, 3));
    assert_null(pp_executor_expert_tokens(e.ex, -1));
    /* the range [1, 3) fed layer 0's output counts what the full range counted for layers 1, 2 */
    struct pp_test_engine head;
    pp_test_engine_open(&head, mix_gguf, 0, 1, 1, 0, 1, 256);
    struct pp_exec_seq ph = {2, 0, 7, 1};
    struct pp_exec_batch bh = {1, &ph, prompt_a, NULL};
    assert_int_equal(pp_executor_forward(head.ex, &bh, hidden, NULL), PP_OK);
    struct pp_exec_batch bt = {1, &ph, NULL, hidden};
    float split[VOCAB];
    assert_int_equal(pp_executor_forward(tail.ex, &bt, NULL, split), PP_OK);
    struct pp_test_engine once;
    pp_test_engine_open(&once, mix_gguf, 0, -1, 1, 0, 3, 256);
    assert_int_equal(pp_executor_forward(once.ex, &b, NULL, logits), PP_OK);
    assert_memory_equal(split, logits, sizeof(logits)); /* a split range gives the same bits */
    const int64_t *whole1 = pp_executor_expert_tokens(once.ex, 1);
    const int64_t *whole0 = pp_executor_expert_tokens(once.ex, 0);
    assert_memory_equal(whole1, pp_executor_expert_tokens(tail.ex, 0), 6 * sizeof(int64_t));
    assert_memory_equal(whole0, pp_executor_expert_tokens(head.ex, 0), 6 * sizeof(int64_t));
    pp_test_engine_close(&once);
    pp_test_engine_close(&head);
    pp_test_engine_close(&tail);
    pp_test_engine_close(&e);
    /* a dense model has no counts */
    pp_test_engine_open(&e, dense_gguf, 0, -1, 1, 0, 1, 256);
    assert_null(pp_executor_expert_tokens(e.ex, 0));
    pp_test_engine_close(&e);
}

/* Deterministic inputs in [-2, 2). */
static void fill(float *x, int64_t n, uint32_t seed)
{
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = (float)(seed >> 8) / (float)(1u << 24) * 4.0f - 2.0f;
    }
}

/* The routed pairs counted from the router's rows in double precision, softmax then top-k; a Q8_0
 * router multiplies the activations in int8 (kernels/cpu/matmul_q8.h), so these do too. */
static void recount(const struct pp_model_config *c, const struct pp_weight *router,
                    const float *x, int64_t T, int64_t *counts)
{
    float row[DIM];
    double xv[DIM];
    int64_t row_bytes = pp_dtype_row_bytes(router->dtype, router->cols);
    for (int64_t t = 0; t < T; t++) {
        double logit[16];
        for (int i = 0; i < DIM; i += PP_Q8_0_BLOCK) {
            int8_t q[PP_Q8_0_BLOCK];
            float d = pp__q8_act_block(q, x + t * DIM + i);
            for (int e = 0; e < PP_Q8_0_BLOCK; e++)
                xv[i + e] = router->dtype == PP_DTYPE_Q8_0 ? (double)q[e] * d : x[t * DIM + i + e];
        }
        for (int32_t e = 0; e < c->n_experts; e++) {
            pp_row_to_f32(row, (const uint8_t *)router->data + e * row_bytes, router->dtype, DIM);
            logit[e] = 0;
            for (int i = 0; i < DIM; i++)
                logit[e] += (double)row[i] * xv[i];
        }
        int taken[16] = {0};
        for (int32_t j = 0; j < c->n_experts_used; j++) {
            int32_t best = -1;
            for (int32_t e = 0; e < c->n_experts; e++)
                if (!taken[e] && (best < 0 || logit[e] > logit[best]))
                    best = e;
            taken[best] = 1;
            counts[best]++;
        }
    }
}

static void test_moe_ffn_rows_counts_and_expert_split(void **state)
{
    (void)state;
    struct pp_model *m;
    struct pp_backend *be;
    assert_int_equal(pp_model_open(qwen_gguf, 0, -1, &m), PP_OK);
    assert_int_equal(pp_backend_cpu_new(3, &be), PP_OK);
    const struct pp_model_config *c = &m->cfg;
    assert_int_equal(c->arch, PP_ARCH_QWEN2MOE);
    assert_int_equal(c->n_experts, 8);
    assert_int_equal(c->shared_ffn_dim, 64);
    assert_int_equal(be->ops->reserve(be, 96, 128), PP_OK);
    enum { T = 13 };
    float x[T * DIM], full[T * DIM], one[DIM], a[T * DIM], b[T * DIM];
    fill(x, T * DIM, 7);
    struct pp_moe_scratch *s;
    assert_int_equal(pp_moe_scratch_new(be, c, T, 0, &s), PP_OK);
    for (int32_t l = 0; l < 3; l++) {
        const struct pp_moe_weights *mw = m->layers[l].moe;
        assert_non_null(mw);
        assert_null(m->layers[l].w_gate.data);
        int64_t counts[8] = {0}, want[8] = {0}, ca[8] = {0}, cb[8] = {0};
        assert_int_equal(pp_moe_ffn(be, c, mw, x, T, full, s, counts), PP_OK);
        recount(c, &mw->router, x, T, want);
        assert_memory_equal(counts, want, sizeof(counts));
        /* each row alone gives the same bits */
        for (int64_t t = 0; t < T; t++) {
            assert_int_equal(pp_moe_ffn(be, c, mw, x + t * DIM, 1, one, s, NULL), PP_OK);
            assert_memory_equal(one, full + t * DIM, sizeof(one));
        }
        /* two workers: experts [0, 4) with the shared expert, [4, 8) without */
        struct pp_moe_weights wa = *mw, wb = *mw;
        wa.n_experts = 4;
        wb.n_experts = 4;
        wb.expert_base = 4;
        wb.gate = mw->gate + 4;
        wb.up = mw->up + 4;
        wb.down = mw->down + 4;
        wb.shared_gate.data = NULL;
        assert_int_equal(pp_moe_ffn(be, c, &wa, x, T, a, s, ca), PP_OK);
        assert_int_equal(pp_moe_ffn(be, c, &wb, x, T, b, s, cb), PP_OK);
        assert_memory_equal(ca, counts, sizeof(counts));
        assert_memory_equal(cb, counts, sizeof(counts));
        for (int64_t i = 0; i < T * DIM; i++)
            assert_true(fabsf(a[i] + b[i] - full[i]) <= 1e-5f * (1.0f + fabsf(full[i])));
    }
    pp_moe_scratch_free(s);
    be->ops->free(be);
    pp_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_and_threads_bit_identical),
        cmocka_unit_test(test_expert_token_counts),
        cmocka_unit_test(test_moe_ffn_rows_counts_and_expert_split),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
