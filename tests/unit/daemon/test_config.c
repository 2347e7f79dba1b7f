/* The typed configuration: files and flags fill a struct, flags override the file, and every bad
 * value, type, key or syntax error names the file and line (or the flag), the key, what is allowed
 * and what arrived. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "common/config.h"
#include "testutil.h"

struct demo_cfg {
    int64_t port;
    double busy;
    int verbose;
    char model_root[PP_CFG_STR_MAX];
    struct pp_cfg_ints layers;
};

static const struct pp_cfg_key keys[] = {
    {"port", PP_CFG_INT, offsetof(struct demo_cfg, port), 1, 65535, "port"},
    {"busy", PP_CFG_FLOAT, offsetof(struct demo_cfg, busy), 0, 1, "a fraction"},
    {"verbose", PP_CFG_BOOL, offsetof(struct demo_cfg, verbose), 0, 1, "chatty"},
    {"model_root", PP_CFG_STRING, offsetof(struct demo_cfg, model_root), 0, 0, "models"},
    {"layers", PP_CFG_INTS, offsetof(struct demo_cfg, layers), 1, 1024, "per stage"},
};
#define N_KEYS ((int)(sizeof(keys) / sizeof(keys[0])))

static char *dir;

static const char *write_file(const char *name, const char *text)
{
    static char path[600];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

static void defaults(struct demo_cfg *c)
{
    memset(c, 0, sizeof(*c));
    c->port = 7000;
    c->busy = 0.5;
    snprintf(c->model_root, sizeof(c->model_root), "/models");
}

static void test_file_then_flags(void **state)
{
    (void)state;
    struct demo_cfg c;
    defaults(&c);
    const char *path = write_file("ok.cfg", "# comment\nport = 7100;\nverbose = true;\n"
                                            "layers = [2, 3, 3];\nmodel_root = \"/srv/m\";\n");
    char *argv[] = {"--busy", "0.25", "--config", (char *)path, "--port=7200", "--layers", "4,4"};
    assert_int_equal(pp_config_from_args(keys, N_KEYS, &c, 7, argv), PP_OK);
    assert_int_equal(c.port, 7200); /* the flag beats the file */
    assert_true(c.busy == 0.25);
    assert_int_equal(c.verbose, 1);
    assert_string_equal(c.model_root, "/srv/m");
    assert_int_equal(c.layers.n, 2);
    assert_int_equal(c.layers.v[1], 4);
}

static void expect_file_error(const char *text, const char *needle)
{
    struct demo_cfg c;
    defaults(&c);
    const char *path = write_file("bad.cfg", text);
    assert_int_not_equal(pp_config_load_file(keys, N_KEYS, &c, path), PP_OK);
    if (!strstr(pp_error_detail(), needle))
        fail_msg("'%s' not in '%s'", needle, pp_error_detail());
}

static void test_file_errors_name_file_line_key(void **state)
{
    (void)state;
    expect_file_error("port = 7100;\n\nport2 = 1;\n", "bad.cfg:3: unknown key 'port2'");
    expect_file_error("\nport = 70000;\n",
                      "bad.cfg:2: key 'port': expected an integer in [1, 65535], got 70000");
    expect_file_error("busy = \"high\";\n", "key 'busy': expected a number in [0, 1]");
    expect_file_error("verbose = 1;\n", "key 'verbose': expected true or false");
    expect_file_error("layers = [2, 0];\n", "key 'layers'");
    expect_file_error("port = ;\n", "bad.cfg:1: syntax error");
    struct demo_cfg c;
    defaults(&c);
    assert_int_equal(pp_config_load_file(keys, N_KEYS, &c, "/nonexistent.cfg"), PP_ERR_IO);
    assert_non_null(strstr(pp_error_detail(), "/nonexistent.cfg"));
}

static void test_flag_errors(void **state)
{
    (void)state;
    struct demo_cfg c;
    defaults(&c);
    char *a1[] = {"--port", "abc"};
    assert_int_not_equal(pp_config_from_args(keys, N_KEYS, &c, 2, a1), PP_OK);
    assert_non_null(strstr(pp_error_detail(),
                           "--port: key 'port': expected an integer in [1, 65535], got 'abc'"));
    char *a2[] = {"--prot", "1"};
    assert_int_not_equal(pp_config_from_args(keys, N_KEYS, &c, 2, a2), PP_OK);
    assert_non_null(strstr(pp_error_detail(), "unknown key 'prot'"));
    char *a3[] = {"--port"};
    assert_int_not_equal(pp_config_from_args(keys, N_KEYS, &c, 1, a3), PP_OK);
    assert_non_null(strstr(pp_error_detail(), "--port needs a value"));
    char *a4[] = {"--verbose", "--port", "9"};
    assert_int_equal(pp_config_from_args(keys, N_KEYS, &c, 3, a4), PP_OK);
    assert_int_equal(c.verbose, 1);
    assert_int_equal(c.port, 9);
    assert_int_equal(c.busy, 0.5); /* untouched keys keep their defaults */
}

int main(void)
{
    dir = pp_test_tmpdir();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_file_then_flags),
        cmocka_unit_test(test_file_errors_name_file_line_key),
        cmocka_unit_test(test_flag_errors),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    pp_test_rmdir(dir);
    return rc;
}
