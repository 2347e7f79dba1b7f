/* Device selection (kernels/devices.h): the "auto" | "cpu" | "cuda:N[,N...]" grammar with its
 * errors, formatting, and what a choice resolves to on this host. The resolution tests ask the
 * CUDA runtime first, so they hold on a host with GPUs as well as on one without (and in a build
 * without CUDA). */
#include "testutil.h"

#include <stdio.h>
#include <string.h>

#include "kernels/devices.h"
#ifdef PP_HAVE_CUDA
#include "kernels/cuda/device.h"
#endif

static void expect_bad(const char *text, const char *phrase)
{
    struct pp_device_spec s;
    assert_int_equal(pp_device_spec_parse(text, &s), PP_ERR_INVALID_ARG);
    if (!strstr(pp_error_detail(), phrase))
        fail_msg("'%s': expected a message with \"%s\", got \"%s\"", text, phrase,
                 pp_error_detail());
    assert_int_equal(pp_device_spec_check(text), PP_ERR_INVALID_ARG);
}

static void test_parse_valid(void **state)
{
    (void)state;
    struct pp_device_spec s;
    assert_int_equal(pp_device_spec_parse("auto", &s), PP_OK);
    assert_int_equal(s.kind, PP_DEVICE_AUTO);
    assert_int_equal(pp_device_spec_parse("cpu", &s), PP_OK);
    assert_int_equal(s.kind, PP_DEVICE_CPU);
    assert_int_equal(pp_device_spec_parse("cuda:0", &s), PP_OK);
    assert_int_equal(s.kind, PP_DEVICE_CUDA);
    assert_int_equal(s.n, 1);
    assert_int_equal(s.ids[0], 0);
    assert_int_equal(pp_device_spec_parse("cuda:3,1,2", &s), PP_OK);
    assert_int_equal(s.n, 3);
    assert_int_equal(s.ids[0], 3); /* the order given: worker r takes ids[r] */
    assert_int_equal(s.ids[1], 1);
    assert_int_equal(s.ids[2], 2);
    assert_int_equal(pp_device_spec_check("cuda:7"), PP_OK);
}

static void test_parse_errors(void **state)
{
    (void)state;
    expect_bad("", "got an empty value");
    expect_bad(NULL, "expected \"auto\", \"cpu\" or \"cuda:N[,N...]\"");
    expect_bad("gpu",
               "expected \"auto\", \"cpu\" or \"cuda:N[,N...]\" (N a CUDA device id), got 'gpu'");
    expect_bad("CPU", "got 'CPU'");
    expect_bad("cuda", "expected device ids after \"cuda:\"");
    expect_bad("cuda:", "got 'cuda:'");
    expect_bad("cuda:x", "separated by commas after \"cuda:\", got 'cuda:x'");
    expect_bad("cuda:-1", "got 'cuda:-1'");
    expect_bad("cuda: 0", "got 'cuda: 0'");
    expect_bad("cuda:0,", "got 'cuda:0,'");
    expect_bad("cuda:,0", "got 'cuda:,0'");
    expect_bad("cuda:0;1", "got 'cuda:0;1'");
    expect_bad("cuda:1x", "got 'cuda:1x'");
    expect_bad("cuda:0,0", "expected distinct device ids, got 'cuda:0,0' (cuda:0 twice)");
    expect_bad("cuda:2,1,2", "(cuda:2 twice)");
    expect_bad("cuda:1024", "expected device ids 0..1023, got 'cuda:1024'");
    expect_bad("cuda:99999999999999999999", "expected device ids 0..1023");
    char many[512] = "cuda:";
    for (int i = 0; i <= PP_DEVICES_MAX; i++)
        snprintf(many + strlen(many), sizeof(many) - strlen(many), "%s%d", i ? "," : "", i);
    expect_bad(many, "expected at most 64 device ids");
    /* a failed parse leaves no half-filled list behind */
    struct pp_device_spec s;
    assert_int_not_equal(pp_device_spec_parse("cuda:1,1", &s), PP_OK);
    assert_int_equal(s.n, 0);
}

static void test_format(void **state)
{
    (void)state;
    const char *texts[] = {"auto", "cpu", "cuda:0", "cuda:5,0,63"};
    for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
        struct pp_device_spec s;
        char buf[64];
        assert_int_equal(pp_device_spec_parse(texts[i], &s), PP_OK);
        pp_device_spec_format(&s, buf, sizeof(buf));
        assert_string_equal(buf, texts[i]);
    }
    struct pp_device_spec s;
    char small[8];
    assert_int_equal(pp_device_spec_parse("cuda:100,200,300", &s), PP_OK);
    pp_device_spec_format(&s, small, sizeof(small));
    assert_string_equal(small, "cuda:10"); /* truncated, still terminated */
}

/* How many usable GPUs the runtime reports here (0 without CUDA, a driver or a device). */
static int gpus_here(void)
{
#ifdef PP_HAVE_CUDA
    int n = 0;
    return pp_cuda_device_count(&n) == PP_OK ? n : 0;
#else
    return 0;
#endif
}

static void test_resolve(void **state)
{
    (void)state;
    struct pp_device_spec want, use;
    char note[512];
    int gpus = gpus_here();

    assert_int_equal(pp_device_spec_parse("cpu", &want), PP_OK);
    assert_int_equal(pp_devices_resolve(&want, 2, &use, note, sizeof(note)), PP_OK);
    assert_int_equal(use.kind, PP_DEVICE_CPU);
    assert_string_equal(note, "");

    /* auto: the GPUs when there are enough, else the CPU with the reason */
    assert_int_equal(pp_device_spec_parse("auto", &want), PP_OK);
    assert_int_equal(pp_devices_resolve(&want, 1, &use, note, sizeof(note)), PP_OK);
    if (gpus >= 1) {
        assert_int_equal(use.kind, PP_DEVICE_CUDA);
        assert_int_equal(use.n, 1);
        assert_int_equal(use.ids[0], 0);
    } else {
        assert_int_equal(use.kind, PP_DEVICE_CPU);
        assert_true(strlen(note) > 0);
#ifdef PP_HAVE_CUDA
        assert_non_null(strstr(note, "CUDA"));
#else
        assert_string_equal(note, "this build has no CUDA support");
#endif
    }
    assert_int_equal(pp_devices_resolve(&want, gpus + 1, &use, note, sizeof(note)), PP_OK);
    assert_int_equal(use.kind, PP_DEVICE_CPU); /* more workers than GPUs */
    assert_true(strlen(note) > 0);

    /* an explicit list never falls back */
    assert_int_equal(pp_device_spec_parse("cuda:0", &want), PP_OK);
    pp_status st = pp_devices_resolve(&want, 1, &use, note, sizeof(note));
    if (gpus >= 1) {
        assert_int_equal(st, PP_OK);
        assert_int_equal(use.kind, PP_DEVICE_CUDA);
    } else {
        assert_int_equal(st, PP_ERR_UNSUPPORTED);
        assert_non_null(strstr(pp_error_detail(), "cuda:0: "));
#ifndef PP_HAVE_CUDA
        assert_non_null(strstr(pp_error_detail(), "this build has no CUDA support"));
#endif
    }
    char beyond[32];
    snprintf(beyond, sizeof(beyond), "cuda:%d", gpus);
    assert_int_equal(pp_device_spec_parse(beyond, &want), PP_OK);
    assert_int_not_equal(pp_devices_resolve(&want, 1, &use, note, sizeof(note)), PP_OK);
    assert_non_null(strstr(pp_error_detail(), beyond));

    /* one device per worker */
    assert_int_equal(pp_device_spec_parse("cuda:0,1", &want), PP_OK);
    assert_int_equal(pp_devices_resolve(&want, 1, &use, note, sizeof(note)), PP_ERR_INVALID_ARG);
    assert_non_null(strstr(pp_error_detail(), "cuda:0,1 lists 2 devices for 1 worker"));
    assert_int_equal(pp_devices_resolve(&want, 0, &use, note, sizeof(note)), PP_ERR_INVALID_ARG);
}

static void test_backends(void **state)
{
    (void)state;
    struct pp_device_spec use = {PP_DEVICE_CPU, 0, {0}};
    struct pp_backend *bes[3];
    assert_int_equal(pp_backends_new(&use, 4, 3, bes), PP_OK);
    for (int r = 0; r < 3; r++) {
        assert_string_equal(bes[r]->name, "cpu");
        assert_int_equal(bes[r]->device, -1);
        assert_true(bes[r]->host_memory);
    }
    assert_int_equal(bes[0]->n_threads + bes[1]->n_threads + bes[2]->n_threads, 4);
    pp_backend_free_all(bes, 3);
    /* an unresolved choice is refused */
    struct pp_device_spec autos = {PP_DEVICE_AUTO, 0, {0}};
    assert_int_equal(pp_backends_new(&autos, 1, 1, bes), PP_ERR_INVALID_ARG);
    char name[32];
    int64_t mem;
    pp_devices_describe(&use, 1, name, sizeof(name), &mem);
    assert_string_equal(name, "cpu:1");
    assert_int_equal(mem, -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_valid),
        cmocka_unit_test(test_parse_errors),
        cmocka_unit_test(test_format),
        cmocka_unit_test(test_resolve),
        cmocka_unit_test(test_backends),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
