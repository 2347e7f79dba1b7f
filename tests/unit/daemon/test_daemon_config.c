/* The shipped deploy/config files parse with the daemons' tables and pass their checks; flags
 * override them; the cross-key checks refuse what one key alone cannot. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* Loading text as a stage configuration file fails with "FILE:line: " followed by key_phrase, and
 * the message has got in it. */
static void expect_stage_file_error(const char *text, int line, const char *key_phrase,
                                    const char *got)
{
    char path[] = "/tmp/pp_test_stage_cfg_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
    struct pp_stage_config c;
    pp_stage_config_defaults(&c);
    assert_int_equal(pp_config_load_file(pp_stage_config_keys, pp_stage_config_n_keys, &c, path),
                     PP_ERR_INVALID_ARG);
    unlink(path);
    char where[PATH_MAX + 256];
    snprintf(where, sizeof(where), "%s:%d: %s", path, line, key_phrase);
    if (!strstr(pp_error_detail(), where) || !strstr(pp_error_detail(), got))
        fail_msg("expected \"%s\" and \"%s\" in \"%s\"", where, got, pp_error_detail());
}

/* tp and ep: defaults, the file, flags over the file, ep alone setting tp, and errors that name
 * the file and line or the flag, the key, what is allowed and what arrived. */
static void test_stage_degrees(void **state)
{
    (void)state;
    struct pp_stage_config c;
    int32_t tp, ep;
    pp_stage_config_defaults(&c);
    char *base[] = {"--config", PP_SOURCE_DIR "/deploy/config/stage.cfg", "--model_root", "/tmp"};
    assert_int_equal(pp_config_from_args(pp_stage_config_keys, pp_stage_config_n_keys, &c, 4, base),
                     PP_OK);
    pp_stage_config_degrees(&c, &tp, &ep);
    assert_int_equal(tp, 1); /* stage.cfg documents the defaults: one worker, one group */
    assert_int_equal(ep, 1);
    assert_int_equal(pp_stage_config_check(&c), PP_OK);

    char *flags[] = {"--config", PP_SOURCE_DIR "/deploy/config/stage.cfg", "--tp", "4", "--ep",
                     "2", "--model_root", "/tmp"};
    pp_stage_config_defaults(&c);
    assert_int_equal(
        pp_config_from_args(pp_stage_config_keys, pp_stage_config_n_keys, &c, 8, flags), PP_OK);
    pp_stage_config_degrees(&c, &tp, &ep);
    assert_int_equal(tp, 4);
    assert_int_equal(ep, 2);
    assert_int_equal(pp_stage_config_check(&c), PP_OK);

    /* ep alone: pure expert parallelism over ep workers, as `ppserve run --ep` */
    pp_stage_config_defaults(&c);
    char *ep_only[] = {"--ep", "2"};
    assert_int_equal(pp_config_from_args(pp_stage_config_keys, pp_stage_config_n_keys, &c, 2,
                                         ep_only), PP_OK);
    pp_stage_config_degrees(&c, &tp, &ep);
    assert_int_equal(tp, 2);
    assert_int_equal(ep, 2);

    /* ep must divide tp */
    pp_stage_config_defaults(&c);
    snprintf(c.coordinator, sizeof(c.coordinator), "127.0.0.1:7000");
    snprintf(c.model_root, sizeof(c.model_root), "/tmp");
    c.tp = 4;
    c.ep = 3;
    assert_int_equal(pp_stage_config_check(&c), PP_ERR_INVALID_ARG);
    assert_non_null(strstr(pp_error_detail(), "key 'ep': expected a divisor of tp (4), got 3"));

    /* out of range, from a flag and from a file line */
    pp_stage_config_defaults(&c);
    char *big[] = {"--tp", "65"};
    assert_int_equal(pp_config_from_args(pp_stage_config_keys, pp_stage_config_n_keys, &c, 2, big),
                     PP_ERR_INVALID_ARG);
    assert_non_null(strstr(pp_error_detail(), "--tp"));
    assert_non_null(strstr(pp_error_detail(), "key 'tp'"));
    assert_non_null(strstr(pp_error_detail(), "got '65'"));
    expect_stage_file_error("coordinator = \"127.0.0.1:7000\";\n\nep = -1;\n", 3, "key 'ep'",
                            "got -1");
    expect_stage_file_error("tp = \"two\";\n", 1, "key 'tp'", "got a value of another type");
}

/* devices: the documented default, a GPU list setting tp, and errors naming the file and line or
 * the flag, the key, what is allowed and what arrived. */
static void test_stage_devices(void **state)
{
    (void)state;
    struct pp_stage_config c;
    int32_t tp, ep;
    pp_stage_config_defaults(&c);
    char *base[] = {"--config", PP_SOURCE_DIR "/deploy/config/stage.cfg", "--model_root", "/tmp"};
    assert_int_equal(pp_config_from_args(pp_stage_config_keys, pp_stage_config_n_keys, &c, 4, base),
                     PP_OK);
    assert_string_equal(c.devices, "auto");

    char *gpus[] = {"--coordinator", "h:1", "--model_root", "/tmp", "--devices", "cuda:1,0"};
    pp_stage_config_defaults(&c);
    assert_int_equal(pp_config_from_args(pp_stage_config_keys, pp_stage_config_n_keys, &c, 6, gpus),
                     PP_OK);
    pp_stage_config_degrees(&c, &tp, &ep);
    assert_int_equal(tp, 2); /* one worker per listed GPU */
    assert_int_equal(pp_stage_config_check(&c), PP_OK);
    c.tp = 4;
    assert_int_equal(pp_stage_config_check(&c), PP_ERR_INVALID_ARG);
    assert_non_null(
        strstr(pp_error_detail(), "key 'devices': 'cuda:1,0' lists 2 GPUs, but tp is 4"));

    const char *bad[] = {"gpu", "cuda:", "cuda:x", "cuda:0,0"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char *flag[] = {"--devices", (char *)bad[i]};
        pp_stage_config_defaults(&c);
        assert_int_equal(pp_config_from_args(pp_stage_config_keys, pp_stage_config_n_keys, &c, 2,
                                             flag), PP_ERR_INVALID_ARG);
        assert_non_null(strstr(pp_error_detail(), "--devices: key 'devices': expected"));
        char got[64];
        snprintf(got, sizeof(got), "got '%s'", bad[i]);
        assert_non_null(strstr(pp_error_detail(), got));
        assert_string_equal(c.devices, "auto"); /* a refused value is not stored */
    }
    expect_stage_file_error("threads = 2;\n# GPUs\ndevices = \"gpu:0\";\n", 3,
                            "key 'devices': expected \"auto\", \"cpu\" or", "got 'gpu:0'");
}

/* cpu_weights: copy by default (documented in stage.cfg), map from a flag, anything else refused
 * naming the flag or line, the key, the choices and what arrived. */
static void test_stage_cpu_weights(void **state)
{
    (void)state;
    struct pp_stage_config c;
    pp_stage_config_defaults(&c);
    assert_string_equal(c.cpu_weights, "copy");
    char *base[] = {"--config", PP_SOURCE_DIR "/deploy/config/stage.cfg", "--model_root", "/tmp",
                    "--cpu_weights", "map"};
    assert_int_equal(pp_config_from_args(pp_stage_config_keys, pp_stage_config_n_keys, &c, 4, base),
                     PP_OK);
    assert_string_equal(c.cpu_weights, "copy");
    assert_int_equal(pp_config_from_args(pp_stage_config_keys, pp_stage_config_n_keys, &c, 6, base),
                     PP_OK);
    assert_string_equal(c.cpu_weights, "map");
    assert_int_equal(pp_stage_config_check(&c), PP_OK);
    char *flag[] = {"--cpu_weights", "mmap"};
    pp_stage_config_defaults(&c);
    assert_int_equal(pp_config_from_args(pp_stage_config_keys, pp_stage_config_n_keys, &c, 2, flag),
                     PP_ERR_INVALID_ARG);
    assert_non_null(strstr(pp_error_detail(), "--cpu_weights: key 'cpu_weights': expected copy"));
    assert_non_null(strstr(pp_error_detail(), "got 'mmap'"));
    expect_stage_file_error("threads = 2;\ncpu_weights = \"huge\";\n", 2,
                            "key 'cpu_weights': expected copy", "got 'huge'");
}

static void test_coordinator_cfg(void **state)
{
    (void)state;
    struct pp_coordinator_config c;
    pp_coordinator_config_defaults(&c);
    char *argv[] = {"--config", PP_SOURCE_DIR "/deploy/config/coordinator.cfg", "--layers",
                    "10,12"};
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
        cmocka_unit_test(test_stage_degrees),
        cmocka_unit_test(test_stage_devices),
        cmocka_unit_test(test_stage_cpu_weights),
        cmocka_unit_test(test_coordinator_cfg),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
