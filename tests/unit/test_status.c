/* Unit tests of common/status: the one table of status messages and the thread-local detail
 * message behind pp_error. */
#include "testutil.h"

#include <pthread.h>
#include <string.h>

#include "common/status.h"

/* Every code has its own non-empty message, so a log line always says which error it was. */
static void test_strerror_table(void **state)
{
    (void)state;
    assert_string_equal(pp_strerror(PP_OK), "ok");
    for (int a = 0; a < PP_STATUS_COUNT; a++) {
        const char *ma = pp_strerror((pp_status)a);
        assert_non_null(ma);
        assert_true(ma[0] != '\0');
        assert_string_not_equal(ma, "unknown status");
        for (int b = a + 1; b < PP_STATUS_COUNT; b++)
            assert_string_not_equal(ma, pp_strerror((pp_status)b));
    }
}

/* A code from a newer peer or a corrupt message must not index past the table. */
static void test_strerror_out_of_range(void **state)
{
    (void)state;
    assert_string_equal(pp_strerror(PP_STATUS_COUNT), "unknown status");
    assert_string_equal(pp_strerror((pp_status)1000), "unknown status");
    assert_string_equal(pp_strerror((pp_status)-1), "unknown status");
}

static void test_error_records_detail(void **state)
{
    (void)state;
    pp_error_clear();
    assert_string_equal(pp_error_detail(), "");
    pp_status st = pp_error(PP_ERR_FORMAT, "tensor %s: expected %d dims, got %d", "wq", 2, 3);
    assert_int_equal(st, PP_ERR_FORMAT);
    assert_string_equal(pp_error_detail(), "tensor wq: expected 2 dims, got 3");
    /* the latest message replaces the previous one */
    assert_int_equal(pp_error(PP_ERR_IO, "second"), PP_ERR_IO);
    assert_string_equal(pp_error_detail(), "second");
    pp_error_clear();
    assert_string_equal(pp_error_detail(), "");
}

/* A message longer than the buffer is cut, not written past its end (ASan watches this). */
static void test_error_long_message_truncated(void **state)
{
    (void)state;
    char big[4000];
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    pp_error(PP_ERR_INVALID_ARG, "%s", big);
    size_t n = strlen(pp_error_detail());
    assert_true(n > 100 && n < sizeof(big) - 1);
    assert_int_equal(pp_error_detail()[0], 'x');
}

static void *other_thread(void *arg)
{
    char *seen = arg;
    /* a fresh thread starts with no message, whatever the main thread recorded */
    strcpy(seen, pp_error_detail());
    pp_error(PP_ERR_NOMEM, "from the worker");
    return NULL;
}

/* Details are per thread: a worker's error must not overwrite what the caller is about to show. */
static void test_error_detail_is_thread_local(void **state)
{
    (void)state;
    pp_error(PP_ERR_NOT_FOUND, "main thread message");
    char seen[1024] = "unset";
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, other_thread, seen), 0);
    pthread_join(t, NULL);
    assert_string_equal(seen, "");
    assert_string_equal(pp_error_detail(), "main thread message");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_strerror_table),
        cmocka_unit_test(test_strerror_out_of_range),
        cmocka_unit_test(test_error_records_detail),
        cmocka_unit_test(test_error_long_message_truncated),
        cmocka_unit_test(test_error_detail_is_thread_local),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
