/* Expert parallelism on MoE models (Mixtral, Qwen2-MoE with a shared expert): every layout of W
 * workers in E expert groups (pure TP in the experts, pure EP, hybrid) gives the logits of one
 * worker within 1e-5 (f32) and the same greedy tokens; the expert token counts are the routing
 * actually done (k per token, the same whatever the layout) and the workers' expert ranges tile the
 * experts; each layout stays bit-identical to itself alone or batched; bad degrees are refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/executor.h"
#include "model/model.h"
#include "model/shard.h"
#include "testutil.h"

#define VOCAB 300
#define STEPS 5
#define LAYERS 2
#define EXPERTS 8
#define USED 2

static char *dir;
static char mixtral[600], qwen[600], qwen_q8[600];

static const int32_t prompt[] = {1, 17, 200, 45, 99, 3, 150};

static void greedy(struct pp_test_engine *e, float *out, int32_t *ids, int batched)
{
    float logits[2 * VOCAB];
    int32_t toks[16];
    memcpy(toks, prompt, sizeof(prompt));
    toks[7] = 5;
    toks[8] = 6;
    struct pp_exec_seq p[2] = {{1, 0, 7, 1}, {2, 0, 2, 1}};
    struct pp_exec_batch b = {batched ? 2 : 1, p, toks, NULL};
    assert_int_equal(pp_executor_forward(e->ex, &b, NULL, logits), PP_OK);
    memcpy(out, logits, sizeof(float) * VOCAB);
    for (int s = 1; s < STEPS; s++) {
        ids[s - 1] = pp_test_argmax(out + (s - 1) * VOCAB, VOCAB);
        int32_t t[2] = {77, ids[s - 1]};
        struct pp_exec_seq d[2] = {{2, 1 + s, 1, 1}, {1, 6 + s, 1, 1}};
        struct pp_exec_batch bd = {batched ? 2 : 1, batched ? d : d + 1, batched ? t : t + 1,
                                   NULL};
        assert_int_equal(pp_executor_forward(e->ex, &bd, NULL, logits), PP_OK);
        memcpy(out + s * VOCAB, logits + (batched ? VOCAB : 0), sizeof(float) * VOCAB);
    }
    ids[STEPS - 1] = pp_test_argmax(out + (STEPS - 1) * VOCAB, VOCAB);
    pp_executor_release(e->ex, 1);
    pp_executor_release(e->ex, 2);
}

/* Expert counts of every layer: k per token, copied out. */
static void counts(struct pp_test_engine *e, int64_t *out, int64_t tokens)
{
    for (int32_t l = 0; l < LAYERS; l++) {
        const int64_t *c = pp_executor_expert_tokens(e->ex, l);
        assert_non_null(c);
        int64_t sum = 0;
        for (int32_t x = 0; x < EXPERTS; x++)
            sum += c[x];
        assert_int_equal(sum, tokens * USED);
        memcpy(out + l * EXPERTS, c, sizeof(int64_t) * EXPERTS);
    }
    assert_null(pp_executor_expert_tokens(e->ex, LAYERS));
}

/* {tp, ep} pairs: pure TP in the experts, hybrid, pure EP */
static const int32_t all_layouts[][2] = {{2, 1}, {2, 2}, {4, 1}, {4, 2}, {4, 4}, {8, 8}};
/* Q8_0 (4 heads of 32, expert FFN 64): only splits on whole 32-value blocks */
static const int32_t q8_layouts[][2] = {{2, 1}, {2, 2}, {4, 2}, {4, 4}};

static void check_layouts(const char *path, double tol, const int32_t (*layouts)[2],
                          size_t n_layouts)
{
    float ref[STEPS * VOCAB], got[STEPS * VOCAB];
    int32_t ref_ids[STEPS], ids[STEPS];
    int64_t ref_counts[LAYERS * EXPERTS], got_counts[LAYERS * EXPERTS];
    struct pp_test_engine e;
    pp_test_engine_open(&e, path, 0, -1, 1, 1, 2, 256);
    greedy(&e, ref, ref_ids, 0);
    counts(&e, ref_counts, 7 + STEPS - 1);
    pp_test_engine_close(&e);
    for (size_t i = 0; i < n_layouts; i++) {
        int32_t tp = layouts[i][0], ep = layouts[i][1];
        pp_test_engine_open(&e, path, 0, -1, tp, ep, 2, 256);
        greedy(&e, got, ids, 0);
        double err = pp_test_rel_err(got, ref, STEPS, VOCAB);
        if (err > tol)
            fail_msg("%s tp %d ep %d: rel err %g > %g", path, tp, ep, err, tol);
        assert_memory_equal(ids, ref_ids, sizeof(ids));
        /* the routing is the same: same counts as one worker */
        counts(&e, got_counts, 7 + STEPS - 1);
        assert_memory_equal(got_counts, ref_counts, sizeof(ref_counts));
        /* the workers' experts: E equal groups tiling [0, EXPERTS), W / E workers per group */
        for (int32_t r = 0; r < tp; r++) {
            int32_t first, n;
            pp_executor_worker_experts(e.ex, r, &first, &n);
            assert_int_equal(n, EXPERTS / ep);
            assert_int_equal(first, (r / (tp / ep)) * (EXPERTS / ep));
        }
        /* the layout's own determinism: alone == batched, bit for bit */
        float alone[STEPS * VOCAB];
        memcpy(alone, got, sizeof(alone));
        greedy(&e, got, ids, 1);
        assert_memory_equal(alone, got, sizeof(alone));
        pp_test_engine_close(&e);
    }
}

static void test_mixtral_layouts(void **state)
{
    (void)state;
    check_layouts(mixtral, 1e-5, all_layouts, sizeof(all_layouts) / sizeof(all_layouts[0]));
}

static void test_qwen2moe_shared_expert_layouts(void **state)
{
    (void)state;
    check_layouts(qwen, 1e-5, all_layouts, sizeof(all_layouts) / sizeof(all_layouts[0]));
}

static void test_q8_0_experts(void **state)
{
    (void)state;
    check_layouts(qwen_q8, 1e-5, q8_layouts, sizeof(q8_layouts) / sizeof(q8_layouts[0]));
    /* 4 workers splitting each expert's 64 rows 4 ways: 16-value Q8_0 slices, refused */
    struct pp_model *m;
    struct pp_backend *bes[4];
    struct pp_executor *ex = NULL;
    struct pp_executor_opts o = {0};
    assert_int_equal(pp_model_open(qwen_q8, 0, -1, &m), PP_OK);
    assert_int_equal(pp_backend_cpu_new_workers(4, 4, bes), PP_OK);
    assert_int_equal(pp_executor_new_workers(m, bes, 4, &o, &ex), PP_ERR_UNSUPPORTED);
    assert_non_null(strstr(pp_error_detail(), "expert down is Q8_0"));
    pp_backend_free_all(bes, 4);
    pp_model_free(m);
}

static void test_bad_degrees(void **state)
{
    (void)state;
    struct pp_model_config c;
    assert_int_equal(pp_model_read_config(mixtral, &c), PP_OK);
    assert_int_equal(pp_shard_check(&c, 3, 3, mixtral), PP_ERR_INVALID_ARG); /* 8 heads */
    assert_int_equal(pp_shard_check(&c, 4, 3, mixtral), PP_ERR_INVALID_ARG);
    assert_non_null(strstr(pp_error_detail(), "ep: expected a divisor of tp (4), got 3"));
    c.n_experts = 6;
    assert_int_equal(pp_shard_check(&c, 4, 4, "m"), PP_ERR_INVALID_ARG);
    assert_non_null(strstr(pp_error_detail(), "ep 4 does not divide the 6 experts"));
    c.n_experts = 8;
    c.expert_ffn_dim = 1;
    assert_int_equal(pp_shard_check(&c, 4, 2, "m"), PP_ERR_INVALID_ARG);
    assert_non_null(strstr(pp_error_detail(), "splits each expert 2 ways"));
    assert_int_equal(pp_shard_check(&c, 4, 4, "m"), PP_OK); /* pure EP: experts stay whole */
}

static void write_moe(const char *arch, enum pp_dtype dt, int32_t dim, int32_t heads,
                      int32_t shared, int norm, char *path)
{
    struct pp_synth_spec s;
    pp_test_moe_spec(&s, arch, EXPERTS, USED);
    s.dtype = dt;
    s.dim = dim;
    s.n_heads = heads;
    s.n_layers = LAYERS;
    s.ffn_dim = 64;
    s.shared_ffn_dim = shared;
    s.norm_topk_prob = norm;
    s.seed = 9;
    snprintf(path, 600, "%s/%s_%s.gguf", dir, arch, pp_dtype_name(dt));
    assert_int_equal(pp_synth_write_gguf(&s, path), PP_OK);
}

static int setup(void **state)
{
    (void)state;
    dir = pp_test_tmpdir();
    write_moe("mixtral", PP_DTYPE_F32, 64, 8, 0, 0, mixtral);
    write_moe("qwen2moe", PP_DTYPE_F32, 64, 8, 128, 1, qwen);
    /* Q8_0 rows of 128 values; expert FFN 64 splits into two 32-value blocks */
    write_moe("qwen2moe", PP_DTYPE_Q8_0, 128, 4, 128, 0, qwen_q8);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    pp_test_rmdir(dir);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mixtral_layouts),
        cmocka_unit_test(test_qwen2moe_shared_expert_layouts),
        cmocka_unit_test(test_q8_0_experts),
        cmocka_unit_test(test_bad_degrees),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
