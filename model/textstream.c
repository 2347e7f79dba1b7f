/* Hold-back and repair rules of the text stream. Stop strings are matched on the raw bytes. */
#include "model/textstream.h"

#include <string.h>

#include "common/utf8.h"

void pp_textstream_init(struct pp_textstream *ts, const char *const *stops, int n_stops)
{
    memset(ts, 0, sizeof(*ts));
    ts->stops = stops;
    ts->n_stops = n_stops;
}

void pp_textstream_free(struct pp_textstream *ts)
{
    pp_buf_free(&ts->raw);
    pp_buf_free(&ts->text);
    memset(ts, 0, sizeof(*ts));
}

static size_t max_stop_len(const struct pp_textstream *ts)
{
    size_t m = 0;
    for (int i = 0; i < ts->n_stops; i++)
        if (strlen(ts->stops[i]) > m)
            m = strlen(ts->stops[i]);
    return m;
}

int pp_textstream_push(struct pp_textstream *ts, const char *bytes, size_t n)
{
    if (ts->stopped)
        return 1;
    if (ts->text.failed)
        return -1;
    size_t old = ts->raw.len;
    pp_buf_put(&ts->raw, bytes, n);
    if (ts->raw.failed) {
        ts->text.failed = 1;
        return -1;
    }
    /* a new match ends inside the new bytes, so it starts at most max_len-1 bytes before them */
    size_t ml = max_stop_len(ts);
    size_t from = old + 1 > ml ? old + 1 - ml : 0;
    size_t cut = ts->raw.len + 1;
    for (int i = 0; i < ts->n_stops; i++) {
        size_t sl = strlen(ts->stops[i]);
        for (size_t p = from; sl > 0 && p + sl <= ts->raw.len && p < cut; p++)
            if (memcmp(ts->raw.data + p, ts->stops[i], sl) == 0) {
                cut = p;
                break;
            }
    }
    if (cut <= ts->raw.len) {
        ts->raw.len = cut < ts->raw_done ? ts->raw_done : cut;
        ts->stopped = 1;
        return 1;
    }
    return 0;
}

/* Raw bytes that may still be held: the longest suffix that is a proper prefix of a stop string. */
static size_t stop_prefix_hold(const struct pp_textstream *ts)
{
    size_t hold = 0;
    for (int i = 0; i < ts->n_stops; i++) {
        size_t sl = strlen(ts->stops[i]);
        for (size_t k = sl > 0 ? sl - 1 : 0; k > hold; k--)
            if (k <= ts->raw.len && memcmp(ts->raw.data + ts->raw.len - k, ts->stops[i], k) == 0) {
                hold = k;
                break;
            }
    }
    return hold;
}

size_t pp_textstream_take(struct pp_textstream *ts, int final, const char **out)
{
    size_t start = ts->text.len;
    int flush = final || ts->stopped;
    size_t end = ts->raw.len - (flush ? 0 : stop_prefix_hold(ts));
    if (end < ts->raw_done)
        end = ts->raw_done;
    /* every raw byte becomes at most 3 text bytes (U+FFFD) */
    if (!pp_buf_reserve(&ts->text, 3 * (end - ts->raw_done))) {
        *out = "";
        return 0;
    }
    const unsigned char *r = (const unsigned char *)ts->raw.data;
    size_t i = ts->raw_done;
    while (i < end) {
        size_t k = pp_utf8_char_len(r + i, end - i);
        if (k > 0) {
            memcpy(ts->text.data + ts->text.len, r + i, k);
            ts->text.len += k;
            i += k;
        } else if (!flush && pp_utf8_is_prefix(r + i, end - i)) {
            break; /* the character may complete with the next token */
        } else {
            memcpy(ts->text.data + ts->text.len, "\xef\xbf\xbd", 3);
            ts->text.len += 3;
            i += pp_utf8_invalid_len(r + i, end - i);
        }
    }
    ts->raw_done = i;
    *out = ts->text.data ? ts->text.data + start : "";
    return ts->text.len - start;
}
