/* Unit tests of model/textstream: what a client sees while tokens stream in. A UTF-8 character
 * split across tokens is held back until complete, bytes that can never form one become U+FFFD,
 * text that may begin a stop string is held back until it diverges, and a stop string ends the
 * stream and is never shown. Every output is checked to be valid UTF-8 with jansson. */
#include "testutil.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "model/textstream.h"

/* Collects everything a stream hands out. */
struct sink {
    char text[4096];
    size_t len;
};

#define FFFD "\xef\xbf\xbd"

/* 1 when s[0..n) is valid UTF-8, by jansson's independent check. */
static int valid_utf8(const char *s, size_t n)
{
    json_t *j = json_stringn(s, n);
    json_decref(j);
    return j != NULL;
}

/* Takes what is safe now and appends it to the sink; returns the number of bytes taken. Each take
 * on its own must be valid UTF-8: a client may send every chunk as a separate JSON string. */
static size_t take(struct pp_textstream *ts, struct sink *k, int final)
{
    const char *out = NULL;
    size_t n = pp_textstream_take(ts, final, &out);
    assert_non_null(out);
    if (!valid_utf8(out, n))
        fail_msg("a take of %zu bytes is not valid UTF-8", n);
    assert_true(k->len + n < sizeof(k->text));
    memcpy(k->text + k->len, out, n);
    k->len += n;
    k->text[k->len] = '\0';
    return n;
}

static int push(struct pp_textstream *ts, const char *s)
{
    return pp_textstream_push(ts, s, strlen(s));
}

static void test_plain_text(void **state)
{
    (void)state;
    struct pp_textstream ts;
    struct sink k = {0};
    pp_textstream_init(&ts, NULL, 0);
    assert_int_equal(take(&ts, &k, 0), 0); /* nothing pushed yet */
    assert_int_equal(push(&ts, "hello"), 0);
    assert_int_equal(take(&ts, &k, 0), 5);
    assert_int_equal(take(&ts, &k, 0), 0); /* taken once only */
    assert_int_equal(push(&ts, ", world"), 0);
    assert_int_equal(push(&ts, ""), 0);
    take(&ts, &k, 0);
    take(&ts, &k, 1);
    assert_string_equal(k.text, "hello, world");
    pp_textstream_free(&ts);
}

static void test_utf8_split_across_pushes(void **state)
{
    (void)state;
    struct pp_textstream ts;
    struct sink k = {0};
    pp_textstream_init(&ts, NULL, 0);
    /* € = e2 82 ac, one byte per push */
    assert_int_equal(push(&ts, "a\xe2"), 0);
    assert_int_equal(take(&ts, &k, 0), 1);
    push(&ts, "\x82");
    assert_int_equal(take(&ts, &k, 0), 0);
    push(&ts, "\xac");
    assert_int_equal(take(&ts, &k, 0), 3);
    assert_string_equal(k.text, "a\xe2\x82\xac");

    /* a 4-byte character over four pushes, then a 2-byte one over two */
    const char *parts[] = {"\xf0", "\x9f", "\x98", "\x80", "\xc3", "\xa9"};
    const size_t expect[] = {0, 0, 0, 4, 0, 2};
    for (int i = 0; i < 6; i++) {
        push(&ts, parts[i]);
        assert_int_equal(take(&ts, &k, 0), expect[i]);
    }
    assert_string_equal(k.text, "a\xe2\x82\xac\xf0\x9f\x98\x80\xc3\xa9");
    pp_textstream_free(&ts);
}

/* At the end of generation an unfinished character cannot complete any more: it is released as
 * U+FFFD, so the final text is valid UTF-8 too. */
static void test_final_flush_replaces_incomplete_utf8(void **state)
{
    (void)state;
    struct pp_textstream ts;
    struct sink k = {0};
    pp_textstream_init(&ts, NULL, 0);
    push(&ts, "x\xe2\x82");
    assert_int_equal(take(&ts, &k, 0), 1);
    /* one U+FFFD for the whole unfinished character (Unicode's maximal-subpart practice, as
     * Python's errors="replace" does) */
    assert_int_equal(take(&ts, &k, 1), 3);
    assert_string_equal(k.text, "x" FFFD);
    assert_int_equal(take(&ts, &k, 1), 0);
    pp_textstream_free(&ts);

    /* a lead byte followed by a non-continuation: one U+FFFD for the lead, then the next char */
    struct sink k2 = {0};
    pp_textstream_init(&ts, NULL, 0);
    push(&ts, "\xe2\x82" "A\xf0\x9f\x98\x80\xff");
    take(&ts, &k2, 1);
    assert_string_equal(k2.text, FFFD "A" "\xf0\x9f\x98\x80" FFFD);
    pp_textstream_free(&ts);
}

/* Bytes that can never become a character are replaced at once, not held back: holding them would
 * stall the stream for nothing. */
static void test_invalid_bytes_replaced(void **state)
{
    (void)state;
    struct pp_textstream ts;
    struct sink k = {0};
    pp_textstream_init(&ts, NULL, 0);
    push(&ts, "a\xff" "b");
    take(&ts, &k, 0);
    assert_string_equal(k.text, "a" FFFD "b");

    /* a lone continuation byte, and an invalid byte as the last one pushed */
    memset(&k, 0, sizeof(k));
    push(&ts, "\x80");
    take(&ts, &k, 0);
    assert_string_equal(k.text, FFFD);
    /* a surrogate's first two bytes can never complete: not held */
    memset(&k, 0, sizeof(k));
    push(&ts, "\xed\xa0");
    assert_true(take(&ts, &k, 0) > 0);
    assert_non_null(strstr(k.text, FFFD));
    /* a started character broken by an ASCII byte: replaced, and the ASCII byte kept */
    memset(&k, 0, sizeof(k));
    push(&ts, "\xe2\x82");
    assert_int_equal(take(&ts, &k, 0), 0); /* could still complete */
    push(&ts, "A");
    take(&ts, &k, 0);
    assert_true(k.len >= 4);
    assert_memory_equal(k.text, FFFD, 3);
    assert_int_equal(k.text[k.len - 1], 'A');
    pp_textstream_free(&ts);
}

static void test_stop_spanning_pushes(void **state)
{
    (void)state;
    const char *stops[] = {"</s>"};
    struct pp_textstream ts;
    struct sink k = {0};
    pp_textstream_init(&ts, stops, 1);
    assert_int_equal(push(&ts, "Hello <"), 0);
    take(&ts, &k, 0);
    assert_string_equal(k.text, "Hello "); /* "<" might start the stop string */
    assert_int_equal(push(&ts, "/"), 0);
    assert_int_equal(take(&ts, &k, 0), 0);
    assert_int_equal(push(&ts, "s> and more"), 1);
    take(&ts, &k, 0);
    take(&ts, &k, 1);
    assert_string_equal(k.text, "Hello "); /* the stop and what follows are dropped */
    /* once stopped, pushes are ignored */
    assert_int_equal(push(&ts, "ignored"), 1);
    assert_int_equal(take(&ts, &k, 1), 0);
    pp_textstream_free(&ts);
}

static void test_stop_inside_one_push(void **state)
{
    (void)state;
    const char *stops[] = {"STOP"};
    struct pp_textstream ts;
    struct sink k = {0};
    pp_textstream_init(&ts, stops, 1);
    assert_int_equal(push(&ts, "abc STOP def"), 1);
    take(&ts, &k, 0);
    assert_string_equal(k.text, "abc ");
    pp_textstream_free(&ts);

    /* a stop at the very start: nothing is shown */
    memset(&k, 0, sizeof(k));
    pp_textstream_init(&ts, stops, 1);
    assert_int_equal(push(&ts, "STOP"), 1);
    assert_int_equal(take(&ts, &k, 1), 0);
    pp_textstream_free(&ts);
}

/* A held prefix of a stop string is released once the text diverges from it. */
static void test_prefix_held_then_released(void **state)
{
    (void)state;
    const char *stops[] = {"STOP"};
    struct pp_textstream ts;
    struct sink k = {0};
    pp_textstream_init(&ts, stops, 1);
    push(&ts, "xST");
    take(&ts, &k, 0);
    assert_string_equal(k.text, "x");
    push(&ts, "O");
    assert_int_equal(take(&ts, &k, 0), 0);
    assert_int_equal(push(&ts, "Px"), 1); /* it did become the stop: the held bytes never show */
    take(&ts, &k, 1);
    assert_string_equal(k.text, "x");
    pp_textstream_free(&ts);

    memset(&k, 0, sizeof(k));
    pp_textstream_init(&ts, stops, 1);
    push(&ts, "xSTO");
    take(&ts, &k, 0);
    assert_string_equal(k.text, "x");
    assert_int_equal(push(&ts, "RM"), 0); /* diverged: "STORM" */
    take(&ts, &k, 0);
    assert_string_equal(k.text, "xSTORM");
    /* a prefix still pending at the end is released by the final take */
    push(&ts, " S");
    take(&ts, &k, 0);
    assert_string_equal(k.text, "xSTORM ");
    take(&ts, &k, 1);
    assert_string_equal(k.text, "xSTORM S");
    pp_textstream_free(&ts);

    /* a self-overlapping stop: "aab" inside "aaab" */
    const char *st2[] = {"aab"};
    memset(&k, 0, sizeof(k));
    pp_textstream_init(&ts, st2, 1);
    push(&ts, "a");
    push(&ts, "a");
    push(&ts, "a");
    take(&ts, &k, 0);
    assert_string_equal(k.text, "a");
    assert_int_equal(push(&ts, "b"), 1);
    take(&ts, &k, 1);
    assert_string_equal(k.text, "a");
    pp_textstream_free(&ts);
}

static void test_several_stops(void **state)
{
    (void)state;
    const char *stops[] = {"", "END", "STOP"}; /* the empty one is ignored */
    struct pp_textstream ts;
    struct sink k = {0};
    pp_textstream_init(&ts, stops, 3);
    assert_int_equal(push(&ts, "a STOP b END"), 1);
    take(&ts, &k, 1);
    assert_string_equal(k.text, "a "); /* the earliest match wins */
    pp_textstream_free(&ts);

    /* while two stops could still start, the longer pending prefix is held */
    const char *st2[] = {"abc", "bcd"};
    memset(&k, 0, sizeof(k));
    pp_textstream_init(&ts, st2, 2);
    push(&ts, "xab");
    take(&ts, &k, 0);
    assert_string_equal(k.text, "x");
    assert_int_equal(push(&ts, "cd"), 1); /* "abc" completes first */
    take(&ts, &k, 1);
    assert_string_equal(k.text, "x");
    pp_textstream_free(&ts);

    /* only the empty stop: it never matches */
    memset(&k, 0, sizeof(k));
    pp_textstream_init(&ts, stops, 1);
    assert_int_equal(push(&ts, "abc"), 0);
    take(&ts, &k, 0);
    assert_string_equal(k.text, "abc");
    pp_textstream_free(&ts);
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Random texts of mixed-width characters and invalid bytes, a multi-byte stop string planted at
 * random, pushed in random chunks of 1-5 bytes. What comes out is valid UTF-8 at every take, stops
 * exactly where the first stop string began, and with the U+FFFDs removed equals the valid pieces
 * (so no valid character was lost or altered, and no invalid byte slipped through). */
static void test_random_chunking(void **state)
{
    (void)state;
    const char *pieces[] = {"a", "b", " ", "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80", "<",
                            "</", "\xe2\x80\xa6", "\n",
                            /* invalid: never start a character, or a start cut short (every
                             * piece that may follow begins with ASCII or a lead byte) */
                            "\xff", "\xc0", "\xe2\x82", "\xf0\x9f"};
    const int n_valid = 10, n_pieces_all = 14;
    const char *stops[] = {"</end>", "\xe2\x80\xa6\xe2\x80\xa6"}; /* "……" */
    uint64_t seed = 9;
    for (int iter = 0; iter < 400; iter++) {
        char text[512];
        char valid[512]; /* 1 where text's byte belongs to a valid piece or a stop */
        size_t len = 0;
        int with_invalid = iter % 2;
        int n_pieces = (int)(rng_next(&seed) % 60);
        for (int i = 0; i < n_pieces; i++) {
            int pick = (int)(rng_next(&seed) % (uint64_t)(with_invalid ? n_pieces_all : n_valid));
            const char *p = rng_next(&seed) % 25 == 0 ? stops[rng_next(&seed) % 2] : pieces[pick];
            size_t pl = strlen(p);
            memcpy(text + len, p, pl);
            memset(valid + len, p == pieces[pick] && pick >= n_valid ? 0 : 1, pl);
            len += pl;
        }
        /* where the output must end: the first occurrence of either stop */
        size_t want = len;
        for (int s = 0; s < 2; s++)
            for (size_t i = 0; i + strlen(stops[s]) <= len; i++)
                if (memcmp(text + i, stops[s], strlen(stops[s])) == 0) {
                    if (i < want)
                        want = i;
                    break;
                }
        char expect[512];
        size_t expect_len = 0;
        for (size_t i = 0; i < want; i++)
            if (valid[i])
                expect[expect_len++] = text[i];

        struct pp_textstream ts;
        struct sink k = {0};
        pp_textstream_init(&ts, stops, 2);
        int stopped = 0;
        for (size_t i = 0; i < len && !stopped;) {
            size_t n = 1 + rng_next(&seed) % 5;
            if (n > len - i)
                n = len - i;
            int r = pp_textstream_push(&ts, text + i, n);
            assert_true(r == 0 || r == 1);
            stopped = r;
            i += n;
            take(&ts, &k, 0); /* checks each chunk is valid UTF-8 */
        }
        take(&ts, &k, 1);
        assert_int_equal(stopped, want < len);
        /* drop the replacement characters and compare with the valid bytes before the stop */
        char got[4096];
        size_t got_len = 0;
        for (size_t i = 0; i < k.len;) {
            if (i + 3 <= k.len && memcmp(k.text + i, FFFD, 3) == 0) {
                i += 3;
                continue;
            }
            got[got_len++] = k.text[i++];
        }
        if (got_len != expect_len || memcmp(got, expect, expect_len) != 0)
            fail_msg("iteration %d: %zu valid bytes out, expected %zu", iter, got_len, expect_len);
        if (!with_invalid)
            assert_int_equal(k.len, want); /* valid input passes through unchanged */
        pp_textstream_free(&ts);
    }
}

/* An allocation failure is reported (-1 from push) and sticks: the stream hands out nothing more
 * rather than text with a silent hole in it, and frees cleanly. */
static void test_oom(void **state)
{
    (void)state;
    int64_t before = pp_mem_live(PP_MEM_MISC);
    struct pp_textstream ts;
    struct sink k = {0};
    pp_textstream_init(&ts, NULL, 0);
    assert_int_equal(push(&ts, "first "), 0);
    assert_int_equal(take(&ts, &k, 0), 6);
    pp_alloc_fail_at(1); /* the raw buffer must grow past its first 256 bytes */
    char big[300];
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    assert_int_equal(push(&ts, big), -1);
    assert_true(ts.text.failed);
    assert_int_equal(push(&ts, "more"), -1);
    assert_int_equal(take(&ts, &k, 1), 0);
    assert_string_equal(k.text, "first ");
    pp_textstream_free(&ts);
    assert_int_equal(pp_mem_live(PP_MEM_MISC), before);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plain_text),
        cmocka_unit_test(test_utf8_split_across_pushes),
        cmocka_unit_test(test_final_flush_replaces_incomplete_utf8),
        cmocka_unit_test(test_invalid_bytes_replaced),
        cmocka_unit_test(test_stop_spanning_pushes),
        cmocka_unit_test(test_stop_inside_one_push),
        cmocka_unit_test(test_prefix_held_then_released),
        cmocka_unit_test(test_several_stops),
        cmocka_unit_test(test_random_chunking),
        cmocka_unit_test(test_oom),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
