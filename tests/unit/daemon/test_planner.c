/* The partition planner: even splits for equal stages, more layers for faster stages, fewer for the
 * stage that also runs the LM head, memory limits respected, and clear errors when nothing fits. */
#include <string.h>

#include "coordinator/planner.h"
#include "testutil.h"

#define GB ((int64_t)1 << 30)

static struct pp_plan_model tinyllama(void)
{
    /* dim 2048, ffn 5632, f16: 4·2048² (attention, GQA shrinks k/v) + 3·2048·5632 per layer */
    struct pp_plan_model m = {22, 88 << 20, 2 << 20, 131 << 20, 131 << 20, 0.0};
    return m;
}

static void test_equal_stages(void **state)
{
    (void)state;
    struct pp_plan_model m = tinyllama();
    struct pp_plan_stage s[4] = {{1e-3, 8 * GB}, {1e-3, 8 * GB}, {1e-3, 8 * GB}, {1e-3, 8 * GB}};
    int32_t c[4];
    assert_int_equal(pp_plan_partition(&m, s, 2, c), PP_OK);
    assert_int_equal(c[0], 11);
    assert_int_equal(c[1], 11);
    assert_int_equal(pp_plan_partition(&m, s, 3, c), PP_OK);
    assert_int_equal(c[0], 8); /* earlier stages take the extra layers */
    assert_int_equal(c[1], 7);
    assert_int_equal(c[2], 7);
    assert_int_equal(pp_plan_partition(&m, s, 4, c), PP_OK);
    assert_int_equal(c[0] + c[1] + c[2] + c[3], 22);
    assert_int_equal(c[3], 5);
}

static void test_speed_and_head(void **state)
{
    (void)state;
    struct pp_plan_model m = tinyllama();
    /* stage 1 is twice as fast: 22 layers split 7/15 (max 7 vs 15·0.5 = 7.5) */
    struct pp_plan_stage s[2] = {{1e-3, 8 * GB}, {0.5e-3, 8 * GB}};
    int32_t c[2];
    assert_int_equal(pp_plan_partition(&m, s, 2, c), PP_OK);
    assert_int_equal(c[0], 7);
    assert_int_equal(c[1], 15);
    /* the LM head costs 1.5 layers on the last stage: equal stages split 12/10 */
    m.last_extra_layers = 1.5;
    struct pp_plan_stage e[2] = {{1e-3, 8 * GB}, {1e-3, 8 * GB}};
    assert_int_equal(pp_plan_partition(&m, e, 2, c), PP_OK);
    assert_int_equal(c[0], 12);
    assert_int_equal(c[1], 10);
}

static void test_memory_limits(void **state)
{
    (void)state;
    struct pp_plan_model m = tinyllama();
    /* stage 0 can hold only 5 layers plus the embedding */
    int64_t five = 5 * (m.layer_bytes + m.kv_layer_bytes) + m.first_bytes;
    struct pp_plan_stage s[2] = {{1e-3, five}, {1e-3, 8 * GB}};
    int32_t c[2];
    assert_int_equal(pp_plan_partition(&m, s, 2, c), PP_OK);
    assert_int_equal(c[0], 5);
    assert_int_equal(c[1], 17);
    assert_int_equal(pp_plan_check(&m, s, 2, c), PP_OK);
    int32_t over[2] = {6, 16};
    assert_int_equal(pp_plan_check(&m, s, 2, over), PP_ERR_EXHAUSTED);
    assert_non_null(strstr(pp_error_detail(), "stage 0 needs"));
    struct pp_plan_stage tiny[2] = {{1e-3, 100 << 20}, {1e-3, 100 << 20}};
    assert_int_equal(pp_plan_partition(&m, tiny, 2, c), PP_ERR_EXHAUSTED);
    assert_non_null(strstr(pp_error_detail(), "no partition of 22 layers fits"));
}

/* A stage with tp workers: each holds 1/tp of every layer and of its KV heads (whole heads, so a
 * KV head is replicated when tp > n_kv_heads), 1/tp of the LM head, the whole embedding; and its
 * memory is per worker. */
static void test_tensor_parallel_memory(void **state)
{
    (void)state;
    struct pp_plan_model m = tinyllama();
    const int64_t MIB = 1 << 20;
    /* a middle stage: 4 layers of 88 MiB weights + 2 MiB KV, halved */
    assert_int_equal(pp_plan_worker_bytes(&m, 1, 3, 1, 4), 4 * 90 * MIB);
    assert_int_equal(pp_plan_worker_bytes(&m, 1, 3, 2, 4), 4 * 45 * MIB);
    assert_int_equal(pp_plan_worker_bytes(&m, 1, 3, 0, 4), 4 * 90 * MIB); /* 0 = 1 worker */
    /* the embedding whole on every worker of the first stage, the LM head split on the last */
    assert_int_equal(pp_plan_worker_bytes(&m, 0, 3, 2, 1), 45 * MIB + 131 * MIB);
    assert_int_equal(pp_plan_worker_bytes(&m, 2, 3, 2, 1), 45 * MIB + (131 * MIB + 1) / 2);
    /* KV by heads: 2 KV heads over 4 workers leave one whole head (half the KV) on each */
    m.n_kv_heads = 2;
    assert_int_equal(pp_plan_worker_bytes(&m, 1, 3, 4, 1), 22 * MIB + 1 * MIB);
    assert_int_equal(pp_plan_worker_bytes(&m, 1, 3, 2, 1), 44 * MIB + 1 * MIB);
    m.n_kv_heads = 0;

    /* stage 0's workers each have room for 5 whole layers plus the embedding: alone it takes 5
     * layers, with tp 2 it takes 10 (45 MiB per layer per worker), the speed being equal */
    int64_t five = 5 * (m.layer_bytes + m.kv_layer_bytes) + m.first_bytes;
    struct pp_plan_stage s[2] = {{1e-3, five, 1}, {1e-3, 8 * GB, 1}};
    int32_t c[2];
    assert_int_equal(pp_plan_partition(&m, s, 2, c), PP_OK);
    assert_int_equal(c[0], 5);
    assert_int_equal(c[1], 17);
    s[0].tp = 2;
    assert_int_equal(pp_plan_partition(&m, s, 2, c), PP_OK);
    assert_int_equal(c[0], 10);
    assert_int_equal(c[1], 12);
    assert_int_equal(pp_plan_check(&m, s, 2, c), PP_OK);
    int32_t over[2] = {11, 11};
    assert_int_equal(pp_plan_check(&m, s, 2, over), PP_ERR_EXHAUSTED);
    assert_non_null(strstr(pp_error_detail(), "stage 0 needs"));
    assert_non_null(strstr(pp_error_detail(), "per worker for 11 layers (tp 2;"));

    /* the speed a stage measured with its workers is its speed: a tp-2 stage that measured twice
     * the rate takes twice the layers, as any faster stage would */
    struct pp_plan_stage f[2] = {{1e-3, 8 * GB, 1}, {0.5e-3, 8 * GB, 2}};
    assert_int_equal(pp_plan_partition(&m, f, 2, c), PP_OK);
    assert_int_equal(c[0], 7);
    assert_int_equal(c[1], 15);
}

/* Every worker keeps worker_reserve_bytes free beside its weights and KV reserve: it counts in
 * what a worker needs, in which partitions fit, and in the messages when none does. */
static void test_worker_reserve(void **state)
{
    (void)state;
    struct pp_plan_model m = tinyllama();
    const int64_t MIB = 1 << 20;
    m.worker_reserve_bytes = 64 * MIB;
    assert_int_equal(pp_plan_worker_bytes(&m, 1, 3, 1, 4), 4 * 90 * MIB + 64 * MIB);
    assert_int_equal(pp_plan_worker_bytes(&m, 1, 3, 2, 4), 4 * 45 * MIB + 64 * MIB);
    /* room for exactly five layers, the embedding and the reserve: five; a byte less: four */
    int64_t five = 5 * (m.layer_bytes + m.kv_layer_bytes) + m.first_bytes + 64 * MIB;
    struct pp_plan_stage s[2] = {{1e-3, five, 1}, {1e-3, 8 * GB, 1}};
    int32_t c[2];
    assert_int_equal(pp_plan_partition(&m, s, 2, c), PP_OK);
    assert_int_equal(c[0], 5);
    s[0].memory_bytes = five - 1;
    assert_int_equal(pp_plan_partition(&m, s, 2, c), PP_OK);
    assert_int_equal(c[0], 4);
    int32_t over[2] = {5, 17};
    assert_int_equal(pp_plan_check(&m, s, 2, over), PP_ERR_EXHAUSTED);
    assert_non_null(strstr(pp_error_detail(), "67108864 for the process"));
    /* the model's bytes alone fit the two stages; with a reserve on each worker they do not */
    int64_t all = m.first_bytes + m.last_bytes + 22 * (m.layer_bytes + m.kv_layer_bytes);
    struct pp_plan_stage half[2] = {{1e-3, all / 2 + 100 * MIB, 1}, {1e-3, all / 2 + 100 * MIB, 1}};
    m.worker_reserve_bytes = 0;
    assert_int_equal(pp_plan_partition(&m, half, 2, c), PP_OK);
    m.worker_reserve_bytes = 128 * MIB;
    assert_int_equal(pp_plan_partition(&m, half, 2, c), PP_ERR_EXHAUSTED);
    assert_non_null(strstr(pp_error_detail(), "plus 134217728 per worker for the process: "));
}

static void test_bad_inputs(void **state)
{
    (void)state;
    struct pp_plan_model m = tinyllama();
    m.n_layers = 2;
    struct pp_plan_stage s[3] = {{1e-3, 8 * GB}, {1e-3, 8 * GB}, {1e-3, 8 * GB}};
    int32_t c[3];
    assert_int_equal(pp_plan_partition(&m, s, 3, c), PP_ERR_INVALID_ARG);
    assert_non_null(strstr(pp_error_detail(), "3 stages for 2 layers"));
    m.n_layers = 22;
    s[1].seconds_per_layer = 0;
    assert_int_equal(pp_plan_partition(&m, s, 3, c), PP_ERR_INVALID_ARG);
    assert_non_null(strstr(pp_error_detail(), "stage 1 reported a per-layer time of 0"));
    s[1].seconds_per_layer = 1e-3;
    int32_t bad[3] = {10, 10, 1};
    assert_int_equal(pp_plan_check(&m, s, 3, bad), PP_ERR_INVALID_ARG);
    assert_non_null(strstr(pp_error_detail(), "add up to 21, the model has 22"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_equal_stages),
        cmocka_unit_test(test_speed_and_head),
        cmocka_unit_test(test_memory_limits),
        cmocka_unit_test(test_tensor_parallel_memory),
        cmocka_unit_test(test_worker_reserve),
        cmocka_unit_test(test_bad_inputs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
