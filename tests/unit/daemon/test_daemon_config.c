/* The shipped deploy/config files parse with the daemons' tables and pass their checks; flags
 * override them; the cross-key checks refuse what one key alone cannot. */
#include <stdio.h>
#include <string.h>

#include "coordinator/coordinator_config.h"
#include "stage/stage_config.h"
#include "testutil.h"

#ifndef PP_SOURCE_DIR
#error "PP_SOURCE_DIR must name the repository root"
#endif

static void test_stage_cfg(void **state)
{
    (void)state;
    struct pp_stage_config c;
    pp_stage_config_defaults(&c);
    char *argv[] = {"--config", PP_SOURCE_DIR "/deploy/config/stage.cfg", "--threads", "3",
                    "--model_root", "/tmp"};
    assert_int_equal(pp_config_from_args(pp_stage_config_keys, pp_stage_config_n_keys, &c, 6, argv),
                     PP_OK);
    assert_string_equal(c.coordinator, "coordinator:7000");
    assert_int_equal(c.threads, 3);
    assert_int_equal(c.kv_mb, 1024);
    assert_int_equal(pp_stage_config_check(&c), PP_OK);
    snprintf(c.model_root, sizeof(c.model_root), "/nonexistent");
    assert_int_equal(pp_stage_config_check(&c), PP_ERR_INVALID_ARG);
    assert_non_null(strstr(pp_error_detail(), "'/nonexistent' is not a folder"));
    snprintf(c.log_level, sizeof(c.log_level), "loud");
    snprintf(c.model_root, sizeof(c.model_root), "/tmp");
    assert_int_equal(pp_stage_config_check(&c), PP_ERR_INVALID_ARG);
    assert_non_null(strstr(pp_error_detail(), "got 'loud'"));
}

static void test_coordinator_cfg(void **state)
{
    (void)state;
    struct pp_coordinator_config c;
    pp_coordinator_config_defaults(&c);
    char *argv[] = {"--config", PP_SOURCE_DIR "/deploy/config/coordinator.cfg", "--layers", "10,12"};
    assert_int_equal(pp_config_from_args(pp_coordinator_config_keys, pp_coordinator_config_n_keys,
                                         &c, 4, argv),
                     PP_OK);
    assert_string_equal(c.model, "tinyllama/model.gguf");
    assert_int_equal(c.layers.n, 2);
    assert_int_equal(pp_coordinator_config_check(&c), PP_OK);
    c.stages = 3;
    assert_int_equal(pp_coordinator_config_check(&c), PP_ERR_INVALID_ARG);
    assert_non_null(strstr(pp_error_detail(), "expected one count per stage (3), got 2"));
    c.stages = 2;
    snprintf(c.model, sizeof(c.model), "../etc/passwd");
    assert_int_equal(pp_coordinator_config_check(&c), PP_ERR_INVALID_ARG);
    assert_non_null(strstr(pp_error_detail(), "no '..'"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stage_cfg),
        cmocka_unit_test(test_coordinator_cfg),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
