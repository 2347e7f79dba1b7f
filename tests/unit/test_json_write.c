/* Unit tests of common/json_write. The writer promises valid JSON whatever bytes it is given, so
 * every output here is parsed back with jansson, an independent parser, and compared. */
#include "testutil.h"

#include <float.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common/alloc.h"
#include "common/json_write.h"

/* Parses j's text as any JSON value; fails the test with the parser's message when it is invalid.
 */
static json_t *parse(const struct pp_json *j)
{
    assert_false(j->out.failed);
    assert_non_null(j->out.data);
    assert_int_equal(strlen(j->out.data), j->out.len);
    json_error_t err;
    json_t *v = json_loads(j->out.data, JSON_DECODE_ANY | JSON_ALLOW_NUL, &err);
    if (!v)
        fail_msg("invalid JSON %s: %s at %d", j->out.data, err.text, err.position);
    return v;
}

/* The JSON text of writing one string value. */
static void string_json(const char *s, size_t n, struct pp_json *j)
{
    pp_json_init(j);
    pp_json_string(j, s, n);
}

static void test_empty_containers(void **state)
{
    (void)state;
    struct pp_json j;
    pp_json_init(&j);
    pp_json_begin_object(&j);
    pp_json_end_object(&j);
    assert_string_equal(j.out.data, "{}");
    pp_json_free(&j);

    pp_json_init(&j);
    pp_json_begin_array(&j);
    pp_json_end_array(&j);
    assert_string_equal(j.out.data, "[]");
    pp_json_free(&j);
    pp_json_free(&j); /* freeing twice is harmless: free clears the struct */
}

/* Commas go between values at each level and never after a key or an opening bracket. */
static void test_nesting_and_commas(void **state)
{
    (void)state;
    struct pp_json j;
    pp_json_init(&j);
    pp_json_begin_object(&j);
    pp_json_key(&j, "a");
    pp_json_begin_array(&j);
    pp_json_int(&j, 1);
    pp_json_begin_array(&j);
    pp_json_int(&j, 2);
    pp_json_int(&j, 3);
    pp_json_end_array(&j);
    pp_json_begin_object(&j);
    pp_json_end_object(&j);
    pp_json_begin_array(&j);
    pp_json_end_array(&j);
    pp_json_end_array(&j);
    pp_json_key(&j, "b");
    pp_json_begin_object(&j);
    pp_json_key(&j, "c");
    pp_json_null(&j);
    pp_json_key(&j, "d");
    pp_json_bool(&j, 1);
    pp_json_key(&j, "e");
    pp_json_bool(&j, 0);
    pp_json_end_object(&j);
    pp_json_key(&j, "f");
    pp_json_cstring(&j, "g");
    pp_json_end_object(&j);
    assert_string_equal(
        j.out.data,
        "{\"a\":[1,[2,3],{},[]],\"b\":{\"c\":null,\"d\":true,\"e\":false},\"f\":\"g\"}");

    json_t *v = parse(&j);
    assert_int_equal(json_array_size(json_object_get(v, "a")), 4);
    assert_true(json_is_true(json_object_get(json_object_get(v, "b"), "d")));
    json_decref(v);
    pp_json_free(&j);
}

static void test_escaping(void **state)
{
    (void)state;
    /* every byte below 0x20 plus quote, backslash, slash and DEL */
    char in[40];
    size_t n = 0;
    for (int c = 1; c < 0x20; c++)
        in[n++] = (char)c;
    in[n++] = '"';
    in[n++] = '\\';
    in[n++] = '/';
    in[n++] = 0x7f;
    struct pp_json j;
    string_json(in, n, &j);
    /* no raw control byte may appear in the output */
    for (size_t i = 0; i < j.out.len; i++)
        assert_true((unsigned char)j.out.data[i] >= 0x20);
    assert_non_null(strstr(j.out.data, "\\n"));
    assert_non_null(strstr(j.out.data, "\\t"));
    assert_non_null(strstr(j.out.data, "\\u0001"));
    assert_non_null(strstr(j.out.data, "\\\""));
    json_t *v = parse(&j);
    assert_true(json_is_string(v));
    assert_int_equal(json_string_length(v), n);
    assert_memory_equal(json_string_value(v), in, n);
    json_decref(v);
    pp_json_free(&j);

    /* an embedded NUL (the length, not strlen, bounds the string) */
    string_json("a\0b", 3, &j);
    assert_string_equal(j.out.data, "\"a\\u0000b\"");
    pp_json_free(&j);

    /* keys are escaped too */
    pp_json_init(&j);
    pp_json_begin_object(&j);
    pp_json_key(&j, "q\"k\n");
    pp_json_int(&j, 1);
    pp_json_end_object(&j);
    v = parse(&j);
    assert_non_null(json_object_get(v, "q\"k\n"));
    json_decref(v);
    pp_json_free(&j);
}

static void test_valid_utf8_passes_through(void **state)
{
    (void)state;
    const char *s = "a\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xef\xbf\xbf \xf4\x8f\xbf\xbf z";
    struct pp_json j;
    pp_json_init(&j);
    pp_json_cstring(&j, s);
    /* written as is, not as \u escapes */
    assert_int_equal(j.out.len, strlen(s) + 2);
    json_t *v = parse(&j);
    assert_string_equal(json_string_value(v), s);
    json_decref(v);
    pp_json_free(&j);
}

/* A string with one bad sequence: the output has U+FFFD where it was and the text around it intact.
 */
static void check_replaced(const char *in, size_t n, const char *expect)
{
    struct pp_json j;
    string_json(in, n, &j);
    json_t *v = parse(&j);
    if (expect)
        assert_string_equal(json_string_value(v), expect);
    else
        assert_non_null(strstr(json_string_value(v), "\xef\xbf\xbd"));
    const char *t = json_string_value(v);
    assert_int_equal(t[0], 'a');
    assert_int_equal(t[strlen(t) - 1], 'b');
    json_decref(v);
    pp_json_free(&j);
}

#define FFFD "\xef\xbf\xbd"

static void test_invalid_utf8_replaced(void **state)
{
    (void)state;
    check_replaced("a\x80" "b", 3, "a" FFFD "b");             /* lone continuation byte */
    check_replaced("a\xff" "b", 3, "a" FFFD "b");             /* never valid in UTF-8 */
    check_replaced("a\xc0\xaf" "b", 4, NULL);                 /* overlong '/' */
    check_replaced("a\xe0\x80\xaf" "b", 5, NULL);             /* overlong 3-byte */
    check_replaced("a\xed\xa0\x80" "b", 5, NULL);             /* UTF-16 surrogate D800 */
    check_replaced("a\xf4\x90\x80\x80" "b", 6, NULL);         /* above U+10FFFF */
    check_replaced("a\xf5\x80\x80\x80" "b", 6, NULL);         /* lead byte out of range */
    check_replaced("a\xe2\x82" "b", 4, NULL);                 /* truncated 3-byte char */
    check_replaced("a\xf0\x9f\x98" "b", 5, NULL);             /* truncated 4-byte char */
    check_replaced("a\xe2\x82\xac\xe2" "b", 6, NULL);         /* good char then a cut one */

    /* cut at the very end of the input: the writer must not read past n */
    struct pp_json j;
    char buf[3] = {'a', (char)0xe2, (char)0x82};
    string_json(buf, 3, &j);
    json_t *v = parse(&j);
    assert_int_equal(json_string_value(v)[0], 'a');
    assert_non_null(strstr(json_string_value(v), FFFD));
    json_decref(v);
    pp_json_free(&j);
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Random bytes (biased toward UTF-8 lead and continuation bytes) always give valid JSON, and input
 * that was already valid UTF-8 comes back unchanged. */
static void test_random_bytes_always_valid(void **state)
{
    (void)state;
    uint64_t seed = 42;
    const unsigned char pick[] = {0x00, 0x0a, 0x22, 0x5c, 0x41, 0x7f, 0x80, 0xbf, 0xc2, 0xc0,
                                  0xdf, 0xe0, 0xe2, 0xed, 0xef, 0xf0, 0xf4, 0xf5, 0xff, 0x9f};
    for (int iter = 0; iter < 3000; iter++) {
        unsigned char s[48];
        size_t n = rng_next(&seed) % sizeof(s);
        for (size_t i = 0; i < n; i++) {
            uint64_t r = rng_next(&seed);
            s[i] = r % 3 ? pick[(r >> 8) % sizeof(pick)] : (unsigned char)(r >> 16);
        }
        struct pp_json j;
        string_json((const char *)s, n, &j);
        json_t *v = parse(&j);
        assert_true(json_is_string(v));
        /* json_stringn accepts only valid UTF-8: when it does, the writer must not alter a byte */
        json_t *ref = json_stringn((const char *)s, n);
        if (ref) {
            assert_int_equal(json_string_length(v), n);
            assert_memory_equal(json_string_value(v), s, n);
            json_decref(ref);
        }
        json_decref(v);
        pp_json_free(&j);
    }
}

static void test_integers(void **state)
{
    (void)state;
    const int64_t vals[] = {0, 1, -1, 42, INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN};
    struct pp_json j;
    pp_json_init(&j);
    pp_json_begin_array(&j);
    for (size_t i = 0; i < sizeof(vals) / sizeof(vals[0]); i++)
        pp_json_int(&j, vals[i]);
    pp_json_end_array(&j);
    json_t *v = parse(&j);
    for (size_t i = 0; i < sizeof(vals) / sizeof(vals[0]); i++)
        assert_true(json_integer_value(json_array_get(v, i)) == vals[i]);
    json_decref(v);
    pp_json_free(&j);
}

/* Doubles must round-trip bit for bit (metrics, logprobs), and non-finite values, which JSON cannot
 * express, become null. */
static void test_doubles(void **state)
{
    (void)state;
    const double vals[] = {0.0, -0.0, 1.0, -2.5, 0.1, 1.0 / 3.0, 1e-300, 5e-324, DBL_MIN,
                           DBL_MAX, -DBL_MAX, 123456789.0, 1e17, 6.02214076e23, M_PI};
    const size_t n = sizeof(vals) / sizeof(vals[0]);
    struct pp_json j;
    pp_json_init(&j);
    pp_json_begin_array(&j);
    for (size_t i = 0; i < n; i++)
        pp_json_double(&j, vals[i]);
    pp_json_double(&j, NAN);
    pp_json_double(&j, INFINITY);
    pp_json_double(&j, -INFINITY);
    pp_json_end_array(&j);
    json_t *v = parse(&j);
    assert_int_equal(json_array_size(v), n + 3);
    for (size_t i = 0; i < n; i++) {
        double got = json_number_value(json_array_get(v, i));
        assert_true(got == vals[i]);
    }
    for (size_t i = n; i < n + 3; i++)
        assert_true(json_is_null(json_array_get(v, i)));
    json_decref(v);
    pp_json_free(&j);
}

/* Many reallocations: the buffer keeps its content as it grows. */
static void test_large_document(void **state)
{
    (void)state;
    struct pp_json j;
    pp_json_init(&j);
    pp_json_begin_array(&j);
    for (int i = 0; i < 5000; i++) {
        pp_json_begin_object(&j);
        pp_json_key(&j, "i");
        pp_json_int(&j, i);
        pp_json_key(&j, "s");
        pp_json_cstring(&j, "x\"y");
        pp_json_end_object(&j);
    }
    pp_json_end_array(&j);
    json_t *v = parse(&j);
    assert_int_equal(json_array_size(v), 5000);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(v, 4999), "i")), 4999);
    json_decref(v);
    pp_json_free(&j);
}

/* A failed allocation sets oom and later writes are ignored: no crash, no leak, no partial
 * overwrite of the text written before. */
static void test_oom(void **state)
{
    (void)state;
    int64_t before = pp_mem_live(PP_MEM_MISC);
    struct pp_json j;
    pp_json_init(&j);
    pp_alloc_fail_at(1);
    pp_json_begin_array(&j);
    assert_true(j.out.failed);
    pp_json_int(&j, 1);
    pp_json_end_array(&j);
    assert_true(j.out.failed);
    assert_int_equal(j.out.len, 0);
    pp_json_free(&j);

    /* failure while growing past the first buffer */
    pp_json_init(&j);
    pp_json_begin_array(&j);
    assert_false(j.out.failed);
    pp_alloc_fail_at(1);
    char big[600];
    memset(big, 'z', sizeof(big));
    pp_json_string(&j, big, sizeof(big));
    assert_true(j.out.failed);
    assert_non_null(j.out.data);
    assert_int_equal(j.out.data[0], '[');
    pp_json_free(&j);
    assert_int_equal(pp_mem_live(PP_MEM_MISC), before);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty_containers),
        cmocka_unit_test(test_nesting_and_commas),
        cmocka_unit_test(test_escaping),
        cmocka_unit_test(test_valid_utf8_passes_through),
        cmocka_unit_test(test_invalid_utf8_replaced),
        cmocka_unit_test(test_random_bytes_always_valid),
        cmocka_unit_test(test_integers),
        cmocka_unit_test(test_doubles),
        cmocka_unit_test(test_large_document),
        cmocka_unit_test(test_oom),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
