/* Tensor parallelism in the executor: W = 2 and 4 workers give the logits of W = 1 within 1e-5
 * (max|Δ| / max|ref|, f32 weights) and the same greedy tokens, with KV heads split (W <= KV heads)
 * and replicated (W > KV heads), biases, 16-bit and Q8_0 weights; a W-worker executor is still
 * bit-identical to itself whatever the batch, the window, the threads per worker and the layer
 * split; degrees the model cannot split are refused with a message that says why. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/executor.h"
#include "model/model.h"
#include "model/shard.h"
#include "testutil.h"

#define VOCAB 300
#define STEPS 5

static const int32_t prompt[] = {1, 17, 200, 45, 99, 3, 150};
static const int32_t other[] = {1, 250, 251, 252, 9, 9};

/* Prefill then greedy decode; logits of every step into out[STEPS * VOCAB], tokens into ids. */
static void greedy(struct pp_test_engine *e, uint64_t id, float *out, int32_t *ids)
{
    struct pp_exec_seq p = {id, 0, 7, 1};
    struct pp_exec_batch b = {1, &p, prompt, NULL};
    assert_int_equal(pp_executor_forward(e->ex, &b, NULL, out), PP_OK);
    for (int s = 1; s < STEPS; s++) {
        ids[s - 1] = pp_test_argmax(out + (s - 1) * VOCAB, VOCAB);
        struct pp_exec_seq d = {id, 6 + s, 1, 1};
        struct pp_exec_batch bd = {1, &d, &ids[s - 1], NULL};
        assert_int_equal(pp_executor_forward(e->ex, &bd, NULL, out + s * VOCAB), PP_OK);
    }
    ids[STEPS - 1] = pp_test_argmax(out + (STEPS - 1) * VOCAB, VOCAB);
    pp_executor_release(e->ex, id);
}

/* The same sequence decoded while another one shares every batch. */
static void greedy_in_batch(struct pp_test_engine *e, float *out)
{
    float logits[2 * VOCAB];
    int32_t toks[16], ids[STEPS];
    memcpy(toks, other, sizeof(other));
    memcpy(toks + 6, prompt, sizeof(prompt));
    struct pp_exec_seq parts[2] = {{9, 0, 6, 1}, {1, 0, 7, 1}};
    struct pp_exec_batch b = {2, parts, toks, NULL};
    assert_int_equal(pp_executor_forward(e->ex, &b, NULL, logits), PP_OK);
    memcpy(out, logits + VOCAB, sizeof(float) * VOCAB);
    for (int s = 1; s < STEPS; s++) {
        ids[s - 1] = pp_test_argmax(out + (s - 1) * VOCAB, VOCAB);
        int32_t t[2] = {ids[s - 1], 77};
        struct pp_exec_seq d[2] = {{1, 6 + s, 1, 1}, {9, 5 + s, 1, 1}};
        struct pp_exec_batch bd = {2, d, t, NULL};
        assert_int_equal(pp_executor_forward(e->ex, &bd, NULL, logits), PP_OK);
        memcpy(out + s * VOCAB, logits, sizeof(float) * VOCAB);
    }
    pp_executor_release(e->ex, 1);
    pp_executor_release(e->ex, 9);
}

static void write_model(const char *name, enum pp_dtype dt, const char *arch, int32_t kv_heads,
                        int32_t heads, int32_t dim, int32_t ffn, char *path, size_t cap)
{
    struct pp_synth_spec s;
    pp_test_small_spec(&s);
    snprintf(s.arch, sizeof(s.arch), "%s", arch);
    s.dtype = dt;
    s.n_kv_heads = kv_heads;
    s.n_heads = heads;
    s.dim = dim;
    s.ffn_dim = ffn;
    s.seed = 5;
    snprintf(path, cap, "%s/%s.gguf", pp_test_dir, name);
    assert_int_equal(pp_synth_write_gguf(&s, path), PP_OK);
}

/* W workers against one: tolerance tol (0 = only the tokens), same greedy tokens. */
static void check_tp(const char *path, double tol)
{
    float ref[STEPS * VOCAB], got[STEPS * VOCAB];
    int32_t ref_ids[STEPS], ids[STEPS];
    struct pp_test_engine e;
    pp_test_engine_open(&e, path, 0, -1, 1, 0, 1, 256);
    greedy(&e, 1, ref, ref_ids);
    pp_test_engine_close(&e);
    for (int32_t tp = 2; tp <= 4; tp *= 2) {
        pp_test_engine_open(&e, path, 0, -1, tp, 0, 2, 256);
        greedy(&e, 1, got, ids);
        pp_test_engine_close(&e);
        double err = pp_test_rel_err(got, ref, STEPS, VOCAB);
        if (tol > 0 && err > tol)
            fail_msg("%s tp %d: rel err %g > %g", path, tp, err, tol);
        assert_memory_equal(ids, ref_ids, sizeof(ids));
    }
}

static void test_tp_matches_tp1_f32(void **state)
{
    (void)state;
    char path[600];
    write_model("gqa", PP_DTYPE_F32, "llama", 2, 4, 64, 96, path, sizeof(path));
    check_tp(path, 1e-5); /* tp 2 splits the 2 KV heads, tp 4 replicates them */
    write_model("mha_bias", PP_DTYPE_F32, "qwen2", 4, 4, 64, 96, path, sizeof(path));
    check_tp(path, 1e-5);
    write_model("mqa", PP_DTYPE_F32, "llama", 1, 8, 64, 100, path, sizeof(path));
    check_tp(path, 1e-5); /* one KV head for every worker; FFN rows not a multiple of 32 */
}

static void test_tp_16bit_and_q8_0(void **state)
{
    (void)state;
    char path[600];
    write_model("f16", PP_DTYPE_F16, "llama", 2, 4, 64, 96, path, sizeof(path));
    check_tp(path, 1e-5);
    write_model("bf16", PP_DTYPE_BF16, "llama", 2, 4, 64, 96, path, sizeof(path));
    check_tp(path, 1e-5);
    /* Q8_0: column slices must be whole 32-value blocks: 4 heads of 32, FFN 128 */
    write_model("q8", PP_DTYPE_Q8_0, "llama", 2, 4, 128, 128, path, sizeof(path));
    check_tp(path, 1e-5);
}

/* A TP executor keeps the determinism contract among its own runs. */
static void test_tp_bit_identical_across_batches_threads_windows(void **state)
{
    (void)state;
    char path[600];
    write_model("det", PP_DTYPE_F16, "llama", 2, 4, 64, 96, path, sizeof(path));
    float ref[STEPS * VOCAB], got[STEPS * VOCAB];
    int32_t ids[STEPS];
    struct pp_test_engine e;
    pp_test_engine_open(&e, path, 0, -1, 2, 0, 2, 256);
    greedy(&e, 1, ref, ids);
    greedy_in_batch(&e, got);
    assert_memory_equal(ref, got, sizeof(ref));
    pp_test_engine_close(&e);
    for (int threads = 2; threads <= 4; threads++)
        for (int32_t window = 2; window <= 256; window *= 8) {
            pp_test_engine_open(&e, path, 0, -1, 2, 0, threads, window);
            greedy(&e, 1, got, ids);
            assert_memory_equal(ref, got, sizeof(ref));
            greedy_in_batch(&e, got);
            assert_memory_equal(ref, got, sizeof(ref));
            pp_test_engine_close(&e);
        }
}

/* Layers [0, 2) then [2, 3), each with 2 workers, give the 2-worker full range's bits. */
static void test_tp_layer_split(void **state)
{
    (void)state;
    char path[600];
    write_model("split", PP_DTYPE_F32, "llama", 2, 4, 64, 96, path, sizeof(path));
    float ref[VOCAB], got[VOCAB], hidden[7 * 64];
    struct pp_test_engine full, a, b;
    pp_test_engine_open(&full, path, 0, -1, 2, 0, 2, 256);
    struct pp_exec_seq p = {1, 0, 7, 1};
    struct pp_exec_batch batch = {1, &p, prompt, NULL};
    assert_int_equal(pp_executor_forward(full.ex, &batch, NULL, ref), PP_OK);
    pp_test_engine_close(&full);
    pp_test_engine_open(&a, path, 0, 2, 2, 0, 2, 256);
    pp_test_engine_open(&b, path, 2, -1, 2, 0, 2, 256);
    assert_int_equal(pp_executor_forward(a.ex, &batch, hidden, NULL), PP_OK);
    struct pp_exec_batch hb = {1, &p, NULL, hidden};
    assert_int_equal(pp_executor_forward(b.ex, &hb, NULL, got), PP_OK);
    assert_memory_equal(ref, got, sizeof(ref));
    pp_test_engine_close(&a);
    pp_test_engine_close(&b);
}

/* Each worker all-reduces [tokens, dim] twice per layer. */
static void test_bytes_reduced(void **state)
{
    (void)state;
    char path[600];
    write_model("bytes", PP_DTYPE_F32, "llama", 2, 4, 64, 96, path, sizeof(path));
    float out[STEPS * VOCAB];
    int32_t ids[STEPS];
    struct pp_test_engine e;
    pp_test_engine_open(&e, path, 0, -1, 2, 0, 2, 256);
    greedy(&e, 1, out, ids);
    int64_t tokens = 7 + (STEPS - 1);
    assert_int_equal(pp_executor_bytes_reduced(e.ex), tokens * 3 * 2 * 64 * 4);
    pp_test_engine_close(&e);
}

/* Weight memory: the CPU workers copy every layer and LM-head tensor once in all (a column slice
 * the shard repacked is computed from where it is, not copied again; the embedding, read by a
 * gather, stays mapped unless it is the head), and give it all back. */
static void test_weights_copied_once(void **state)
{
    (void)state;
    char path[600];
    write_model("mem", PP_DTYPE_F16, "llama", 4, 4, 64, 128, path,
                sizeof(path)); /* no KV head replicated */
    struct pp_model *m;
    int64_t before = pp_mem_live(PP_MEM_WEIGHTS);
    assert_int_equal(pp_model_open(path, 0, -1, &m), PP_OK);
    /* the model's own copies (vectors realigned out of the file) come with the engine's model */
    int64_t want = pp_mem_live(PP_MEM_WEIGHTS) - before + pp_weight_bytes(&m->lm_head);
    for (int32_t l = m->first_layer; l < m->last_layer; l++)
        want += pp_model_layer_bytes(m, l);
    pp_model_free(m);
    for (int32_t tp = 1; tp <= 4; tp *= 2) {
        int64_t w0 = pp_mem_live(PP_MEM_WEIGHTS);
        struct pp_test_engine e;
        pp_test_engine_open(&e, path, 0, -1, tp, 0, 2, 256);
        int64_t got = pp_mem_live(PP_MEM_WEIGHTS) - w0;
        pp_test_engine_close(&e);
        if (got != want)
            fail_msg("tp %d: %lld bytes of weights in memory, expected %lld", tp, (long long)got,
                     (long long)want);
        assert_int_equal(pp_mem_live(PP_MEM_WEIGHTS), w0);
    }
}

static void test_bad_degrees_refused(void **state)
{
    (void)state;
    char path[600];
    write_model("bad", PP_DTYPE_F32, "llama", 2, 4, 64, 96, path, sizeof(path));
    struct pp_model *m;
    assert_int_equal(pp_model_open(path, 0, -1, &m), PP_OK);
    struct pp_backend *bes[8];
    assert_int_equal(pp_backend_cpu_new_workers(3, 3, bes), PP_OK);
    struct pp_executor_opts o = {0};
    struct pp_executor *ex = NULL;
    assert_int_equal(pp_executor_new_workers(m, bes, 3, &o, &ex), PP_ERR_INVALID_ARG);
    assert_non_null(strstr(pp_error_detail(), "tp 3 does not divide the 4 attention heads"));
    assert_non_null(strstr(pp_error_detail(), "valid tp: 1, 2, 4"));
    pp_backend_free_all(bes, 3);
    o.ep = 2;
    assert_int_equal(pp_shard_check(&m->cfg, 2, 2, "x.gguf"), PP_ERR_INVALID_ARG);
    assert_non_null(strstr(pp_error_detail(), "needs a mixture-of-experts model"));
    assert_int_equal(pp_shard_check(&m->cfg, 4, 3, "x.gguf"), PP_ERR_INVALID_ARG);
    assert_non_null(strstr(pp_error_detail(), "ep: expected a divisor of tp (4), got 3"));
    assert_int_equal(pp_shard_check(&m->cfg, 0, 1, "x.gguf"), PP_ERR_INVALID_ARG);
    pp_model_free(m);
    /* 6 heads, 4 KV heads... not a valid GQA; use 8 heads over 4 KV heads with tp 8? no: 8 heads
     * with 2 KV heads and tp 8 replicates; 12 heads with 4 KV heads and tp 6 splits neither */
    struct pp_model_config c = {0};
    c.n_heads = 12;
    c.n_kv_heads = 4;
    c.ffn_dim = 96;
    c.vocab_size = 300;
    assert_int_equal(pp_shard_check(&c, 6, 1, "y.gguf"), PP_ERR_INVALID_ARG);
    assert_non_null(strstr(pp_error_detail(), "KV heads"));
    /* Q8_0 attention output split inside a block: 4 heads of 16 values, tp 4 */
    write_model("q8bad", PP_DTYPE_Q8_0, "llama", 2, 4, 64, 128, path, sizeof(path));
    assert_int_equal(pp_model_open(path, 0, -1, &m), PP_OK);
    assert_int_equal(pp_backend_cpu_new_workers(4, 4, bes), PP_OK);
    o.ep = 0;
    assert_int_equal(pp_executor_new_workers(m, bes, 4, &o, &ex), PP_ERR_UNSUPPORTED);
    assert_non_null(strstr(pp_error_detail(), "not whole 32-value blocks"));
    pp_backend_free_all(bes, 4);
    pp_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tp_matches_tp1_f32),
        cmocka_unit_test(test_tp_16bit_and_q8_0),
        cmocka_unit_test(test_tp_bit_identical_across_batches_threads_windows),
        cmocka_unit_test(test_tp_layer_split),
        cmocka_unit_test(test_bytes_reduced),
        cmocka_unit_test(test_weights_copied_once),
        cmocka_unit_test(test_bad_degrees_refused),
    };
    return cmocka_run_group_tests(tests, pp_test_dir_setup, pp_test_dir_teardown);
}
