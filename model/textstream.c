/* Hold-back rules of the text stream. */
#include "model/textstream.h"

#include <string.h>

#include "common/alloc.h"

void pp_textstream_init(struct pp_textstream *ts, const char *const *stops, int n_stops)
{
    memset(ts, 0, sizeof(*ts));
    ts->stops = stops;
    ts->n_stops = n_stops;
}

void pp_textstream_free(struct pp_textstream *ts)
{
    pp_free(PP_MEM_MISC, ts->buf);
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
    if (ts->len + n + 1 > ts->cap) {
        size_t cap = ts->cap ? ts->cap : 256;
        while (cap < ts->len + n + 1)
            cap *= 2;
        char *nb = pp_alloc(PP_MEM_MISC, cap);
        if (!nb)
            return -1;
        if (ts->buf)
            memcpy(nb, ts->buf, ts->len);
        pp_free(PP_MEM_MISC, ts->buf);
        ts->buf = nb;
        ts->cap = cap;
    }
    memcpy(ts->buf + ts->len, bytes, n);
    size_t old = ts->len;
    ts->len += n;
    /* a new match must end inside the new bytes, so it starts at most max_len-1 bytes before them */
    size_t ml = max_stop_len(ts);
    size_t from = old > ml ? old - ml : 0;
    size_t cut = ts->len + 1;
    for (int i = 0; i < ts->n_stops; i++) {
        size_t sl = strlen(ts->stops[i]);
        if (sl == 0 || sl > ts->len)
            continue;
        for (size_t p = from; p + sl <= ts->len; p++)
            if (memcmp(ts->buf + p, ts->stops[i], sl) == 0) {
                if (p < cut)
                    cut = p;
                break;
            }
    }
    if (cut <= ts->len) {
        ts->len = cut < ts->emitted ? ts->emitted : cut;
        ts->stopped = 1;
        return 1;
    }
    return 0;
}

/* Bytes at the end of buf[0..len) that begin an unfinished UTF-8 character. */
static size_t incomplete_utf8_tail(const char *s, size_t len)
{
    for (size_t back = 1; back <= 3 && back <= len; back++) {
        unsigned char c = (unsigned char)s[len - back];
        if ((c & 0xc0) == 0x80)
            continue; /* continuation byte: look further back for the lead */
        size_t need = c >= 0xf0 && c < 0xf8 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
        return need > back ? back : 0;
    }
    return 0;
}

size_t pp_textstream_take(struct pp_textstream *ts, int final, const char **out)
{
    if (!ts->buf) {
        *out = "";
        return 0;
    }
    size_t safe = ts->len;
    if (!final && !ts->stopped) {
        /* hold back the longest suffix that is a proper prefix of a stop string */
        for (int i = 0; i < ts->n_stops; i++) {
            size_t sl = strlen(ts->stops[i]);
            for (size_t k = sl > 0 ? sl - 1 : 0; k > 0; k--)
                if (k <= ts->len && memcmp(ts->buf + ts->len - k, ts->stops[i], k) == 0) {
                    if (ts->len - k < safe)
                        safe = ts->len - k;
                    break;
                }
        }
        size_t tail = incomplete_utf8_tail(ts->buf, safe);
        safe -= tail;
    }
    if (safe < ts->emitted)
        safe = ts->emitted;
    *out = ts->buf + ts->emitted;
    size_t n = safe - ts->emitted;
    ts->emitted = safe;
    return n;
}
