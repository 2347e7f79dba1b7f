/* The executor's determinism and validation contracts: a token's logits are bit-identical whatever
 * the thread count, the other sequences in its batch, the window size, how its prompt was chunked,
 * and where the layer range is split; a bad batch changes nothing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/executor.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "testutil.h"

static char *dir;
static char gguf_path[600];
static char hf_path[600];

static int setup(void **state)
{
    (void)state;
    dir = pp_test_tmpdir();
    struct pp_synth_spec s;
    pp_test_small_spec(&s);
    s.dtype = PP_DTYPE_F16;
    s.seed = 42;
    snprintf(gguf_path, sizeof(gguf_path), "%s/m.gguf", dir);
    snprintf(hf_path, sizeof(hf_path), "%s/hf", dir);
    if (pp_synth_write_gguf(&s, gguf_path) != PP_OK || pp_synth_write_hf(&s, hf_path) != PP_OK)
        return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    pp_test_rmdir(dir);
    return 0;
}

#define VOCAB 300
#define DIM 64

static const int32_t prompt_a[] = {1, 17, 200, 45, 99, 3, 150};
static const int32_t prompt_b[] = {1, 250, 251, 252};
static const int32_t prompt_c[] = {1, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14};

/* Sequence A alone: prefill then 3 decode steps (greedy), logits of all 4 steps into out. */
static void run_alone(struct pp_test_engine *e, float *out, int chunked)
{
    int32_t a[16];
    memcpy(a, prompt_a, sizeof(prompt_a));
    int32_t n = 7;
    if (chunked) {
        struct pp_exec_seq p1 = {1, 0, 3, 0};
        struct pp_exec_batch b1 = {1, &p1, a, NULL};
        assert_int_equal(pp_executor_forward(e->ex, &b1, NULL, out), PP_OK);
        struct pp_exec_seq p2 = {1, 3, 4, 1};
        struct pp_exec_batch b2 = {1, &p2, a + 3, NULL};
        assert_int_equal(pp_executor_forward(e->ex, &b2, NULL, out), PP_OK);
    } else {
        struct pp_exec_seq p = {1, 0, n, 1};
        struct pp_exec_batch b = {1, &p, a, NULL};
        assert_int_equal(pp_executor_forward(e->ex, &b, NULL, out), PP_OK);
    }
    for (int step = 1; step < 4; step++) {
        a[n] = (int32_t)((step * 37) % VOCAB); /* fixed continuation, independent of the logits */
        struct pp_exec_seq p = {1, n, 1, 1};
        struct pp_exec_batch b = {1, &p, &a[n], NULL};
        assert_int_equal(pp_executor_forward(e->ex, &b, NULL, out + step * VOCAB), PP_OK);
        n++;
    }
    pp_executor_release(e->ex, 1);
}

/* Sequence A inside batches with B and C at other positions and lengths. */
static void run_in_batch(struct pp_test_engine *e, float *out_a)
{
    int32_t a[16];
    memcpy(a, prompt_a, sizeof(prompt_a));
    float *logits = malloc(sizeof(float) * VOCAB * 3);
    /* step 0: C prefills alone first, so its positions differ from A's */
    struct pp_exec_seq pc = {3, 0, 11, 1};
    struct pp_exec_batch bc = {1, &pc, prompt_c, NULL};
    assert_int_equal(pp_executor_forward(e->ex, &bc, NULL, logits), PP_OK);
    /* step 1: B prefill, A prefill, C decode, in that order */
    int32_t toks[16];
    memcpy(toks, prompt_b, sizeof(prompt_b));
    memcpy(toks + 4, prompt_a, sizeof(prompt_a));
    toks[11] = 33;
    struct pp_exec_seq parts[3] = {{2, 0, 4, 1}, {1, 0, 7, 1}, {3, 11, 1, 1}};
    struct pp_exec_batch b = {3, parts, toks, NULL};
    assert_int_equal(pp_executor_forward(e->ex, &b, NULL, logits), PP_OK);
    memcpy(out_a, logits + VOCAB, sizeof(float) * VOCAB);
    int32_t n = 7;
    for (int step = 1; step < 4; step++) {
        a[n] = (int32_t)((step * 37) % VOCAB);
        int32_t t[3] = {a[n], 40, 41};
        struct pp_exec_seq p[3] = {{1, n, 1, 1}, {3, 11 + step, 1, 1}, {2, 3 + step, 1, 0}};
        struct pp_exec_batch bb = {3, p, t, NULL};
        assert_int_equal(pp_executor_forward(e->ex, &bb, NULL, logits), PP_OK);
        memcpy(out_a + step * VOCAB, logits, sizeof(float) * VOCAB);
        n++;
    }
    pp_executor_release(e->ex, 1);
    pp_executor_release(e->ex, 2);
    pp_executor_release(e->ex, 3);
    free(logits);
}

static void test_threads_and_batches_bit_identical(void **state)
{
    (void)state;
    float ref[4 * VOCAB], got[4 * VOCAB];
    struct pp_test_engine e;
    pp_test_engine_open(&e, gguf_path, 0, -1, 1, 0, 1, 256);
    run_alone(&e, ref, 0);
    pp_test_engine_close(&e);
    for (int threads = 1; threads <= 4; threads++) {
        for (int32_t window = 1; window <= 256; window *= 4) {
            pp_test_engine_open(&e, gguf_path, 0, -1, 1, 0, threads, window);
            run_alone(&e, got, 0);
            assert_memory_equal(ref, got, sizeof(ref));
            run_alone(&e, got, 1);
            assert_memory_equal(ref, got, sizeof(ref));
            run_in_batch(&e, got);
            assert_memory_equal(ref, got, sizeof(ref));
            pp_test_engine_close(&e);
        }
    }
}

/* Layers [0, k) then [k, L) through a hidden-state hand-off give [0, L)'s bits. */
static void check_layer_split(const char *path)
{
    float ref[VOCAB], got[VOCAB];
    struct pp_test_engine full;
    pp_test_engine_open(&full, path, 0, -1, 1, 0, 2, 256);
    struct pp_exec_seq p = {9, 0, 7, 1};
    struct pp_exec_batch b = {1, &p, prompt_a, NULL};
    assert_int_equal(pp_executor_forward(full.ex, &b, NULL, ref), PP_OK);
    pp_test_engine_close(&full);
    for (int32_t k = 1; k < 3; k++) {
        struct pp_test_engine s0, s1, s2;
        float hidden[7 * DIM], hidden2[7 * DIM];
        pp_test_engine_open(&s0, path, 0, k, 1, 0, 1, 256);
        pp_test_engine_open(&s1, path, k, -1, 1, 0, 3, 256);
        assert_int_equal(pp_executor_forward(s0.ex, &b, hidden, NULL), PP_OK);
        struct pp_exec_batch bh = {1, &p, NULL, hidden};
        assert_int_equal(pp_executor_forward(s1.ex, &bh, NULL, got), PP_OK);
        assert_memory_equal(ref, got, sizeof(ref));
        pp_test_engine_close(&s1);
        /* three stages: [0,k) [k,3) is already covered; add a middle range [k, k+1) when possible
         */
        if (k + 1 < 3) {
            pp_test_engine_open(&s1, path, k, k + 1, 1, 0, 2, 256);
            pp_test_engine_open(&s2, path, k + 1, -1, 1, 0, 1, 256);
            struct pp_exec_seq p2 = {10, 0, 7, 1};
            struct pp_exec_batch b2 = {1, &p2, prompt_a, NULL};
            assert_int_equal(pp_executor_forward(s0.ex, &b2, hidden, NULL), PP_OK);
            struct pp_exec_batch bh1 = {1, &p2, NULL, hidden};
            assert_int_equal(pp_executor_forward(s1.ex, &bh1, hidden2, NULL), PP_OK);
            struct pp_exec_batch bh2 = {1, &p2, NULL, hidden2};
            assert_int_equal(pp_executor_forward(s2.ex, &bh2, NULL, got), PP_OK);
            assert_memory_equal(ref, got, sizeof(ref));
            pp_test_engine_close(&s1);
            pp_test_engine_close(&s2);
        }
        pp_test_engine_close(&s0);
    }
}

static void test_layer_split_bit_identical(void **state)
{
    (void)state;
    check_layer_split(gguf_path);
    check_layer_split(hf_path);
}

/* GGUF and HF copies of one model agree closely (the RoPE layouts differ in reduction order). */
static void test_formats_agree(void **state)
{
    (void)state;
    float a[VOCAB], b[VOCAB];
    struct pp_test_engine g, h;
    pp_test_engine_open(&g, gguf_path, 0, -1, 1, 0, 2, 256);
    pp_test_engine_open(&h, hf_path, 0, -1, 1, 0, 2, 256);
    struct pp_exec_seq p = {1, 0, 7, 1};
    struct pp_exec_batch bt = {1, &p, prompt_a, NULL};
    assert_int_equal(pp_executor_forward(g.ex, &bt, NULL, a), PP_OK);
    assert_int_equal(pp_executor_forward(h.ex, &bt, NULL, b), PP_OK);
    float maxd = 0, maxr = 0;
    for (int i = 0; i < VOCAB; i++) {
        float d = a[i] > b[i] ? a[i] - b[i] : b[i] - a[i];
        maxd = d > maxd ? d : maxd;
        maxr = (b[i] > 0 ? b[i] : -b[i]) > maxr ? (b[i] > 0 ? b[i] : -b[i]) : maxr;
    }
    assert_true(maxd / maxr < 1e-5);
    pp_test_engine_close(&g);
    pp_test_engine_close(&h);
}

static void test_bad_batches_change_nothing(void **state)
{
    (void)state;
    struct pp_test_engine e;
    pp_test_engine_open(&e, gguf_path, 0, -1, 1, 0, 1, 256);
    float logits[2 * VOCAB];
    struct pp_exec_seq p = {5, 0, 3, 1};
    struct pp_exec_batch b = {1, &p, prompt_a, NULL};
    assert_int_equal(pp_executor_forward(e.ex, &b, NULL, logits), PP_OK);
    int32_t free_before = pp_kv_cache_free_blocks(pp_executor_kv(e.ex));

    /* wrong position for a known sequence */
    struct pp_exec_seq bad = {5, 2, 1, 1};
    struct pp_exec_batch bb = {1, &bad, prompt_a, NULL};
    assert_int_equal(pp_executor_forward(e.ex, &bb, NULL, logits), PP_ERR_INVALID_ARG);
    assert_non_null(strstr(pp_error_detail(), "expected pos 3"));
    /* unknown sequence at a non-zero position */
    struct pp_exec_seq unk = {77, 4, 1, 1};
    bb.seqs = &unk;
    assert_int_equal(pp_executor_forward(e.ex, &bb, NULL, logits), PP_ERR_NOT_FOUND);
    /* token outside the vocabulary, with a valid part before it: nothing may change */
    int32_t toks[2] = {3, VOCAB};
    struct pp_exec_seq two[2] = {{5, 3, 1, 1}, {6, 0, 1, 1}};
    struct pp_exec_batch b2 = {2, two, toks, NULL};
    assert_int_equal(pp_executor_forward(e.ex, &b2, NULL, logits), PP_ERR_INVALID_ARG);
    assert_non_null(strstr(pp_error_detail(), "vocabulary"));
    /* duplicate ids */
    struct pp_exec_seq dup[2] = {{5, 3, 1, 1}, {5, 3, 1, 1}};
    b2.seqs = dup;
    toks[1] = 4;
    assert_int_equal(pp_executor_forward(e.ex, &b2, NULL, logits), PP_ERR_INVALID_ARG);
    /* beyond the context */
    struct pp_exec_seq far = {8, 0, 129, 1};
    int32_t many[129] = {0};
    struct pp_exec_batch bf = {1, &far, many, NULL};
    assert_int_equal(pp_executor_forward(e.ex, &bf, NULL, logits), PP_ERR_OUT_OF_RANGE);

    assert_int_equal(pp_executor_seq_len(e.ex, 5), 3);
    assert_int_equal(pp_executor_seq_len(e.ex, 6), -1);
    assert_int_equal(pp_kv_cache_free_blocks(pp_executor_kv(e.ex)), free_before);
    /* the sequence still continues normally */
    struct pp_exec_seq ok = {5, 3, 1, 1};
    struct pp_exec_batch bo = {1, &ok, &prompt_a[3], NULL};
    assert_int_equal(pp_executor_forward(e.ex, &bo, NULL, logits), PP_OK);
    assert_int_equal(pp_executor_release(e.ex, 5), 1);
    assert_int_equal(pp_executor_release(e.ex, 5), 0);
    pp_test_engine_close(&e);
}

/* A KV budget too small for a batch is refused up front, and freeing makes room again. */
static void test_kv_exhaustion_and_reuse(void **state)
{
    (void)state;
    struct pp_test_engine e = {0};
    e.tp = 1;
    assert_int_equal(pp_model_open(gguf_path, 0, -1, &e.m), PP_OK);
    assert_int_equal(pp_backend_cpu_new(1, &e.bes[0]), PP_OK);
    struct pp_executor_opts o = {0};
    o.kv_block_size = 4;
    o.kv_budget_bytes = 3 * pp_kv_block_bytes(3, 2 * 16, 4); /* three blocks: 12 tokens */
    assert_int_equal(pp_executor_new(e.m, e.bes[0], &o, &e.ex), PP_OK);
    float logits[VOCAB];
    int32_t toks[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13};
    struct pp_exec_seq p = {1, 0, 13, 1};
    struct pp_exec_batch b = {1, &p, toks, NULL};
    assert_int_equal(pp_executor_forward(e.ex, &b, NULL, logits), PP_ERR_EXHAUSTED);
    p.n_tokens = 12;
    assert_int_equal(pp_executor_forward(e.ex, &b, NULL, logits), PP_OK);
    assert_int_equal(pp_kv_cache_free_blocks(pp_executor_kv(e.ex)), 0);
    struct pp_exec_seq q = {2, 0, 1, 1};
    b.seqs = &q;
    assert_int_equal(pp_executor_forward(e.ex, &b, NULL, logits), PP_ERR_EXHAUSTED);
    pp_executor_release(e.ex, 1);
    assert_int_equal(pp_executor_forward(e.ex, &b, NULL, logits), PP_OK);
    pp_test_engine_close(&e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_threads_and_batches_bit_identical),
        cmocka_unit_test(test_layer_split_bit_identical),
        cmocka_unit_test(test_formats_agree),
        cmocka_unit_test(test_bad_batches_change_nothing),
        cmocka_unit_test(test_kv_exhaustion_and_reuse),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
