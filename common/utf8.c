/* UTF-8 validation by code point range. */
#include "common/utf8.h"

#include <stdint.h>

/* Expected length from the lead byte and the allowed range of the second byte. */
static size_t lead_info(unsigned char c, unsigned char *lo, unsigned char *hi)
{
    *lo = 0x80;
    *hi = 0xbf;
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf)
        return 2;
    if (c == 0xe0) {
        *lo = 0xa0; /* no overlong 3-byte forms */
        return 3;
    }
    if (c == 0xed) {
        *hi = 0x9f; /* no surrogates */
        return 3;
    }
    if (c >= 0xe1 && c <= 0xef)
        return 3;
    if (c == 0xf0) {
        *lo = 0x90;
        return 4;
    }
    if (c == 0xf4) {
        *hi = 0x8f; /* nothing above U+10FFFF */
        return 4;
    }
    if (c >= 0xf1 && c <= 0xf3)
        return 4;
    return 0;
}

/* How many bytes of s[0..avail) match a valid character's pattern (up to its length n). */
static size_t matched(const unsigned char *s, size_t avail, size_t *n)
{
    unsigned char lo, hi;
    *n = lead_info(s[0], &lo, &hi);
    if (*n == 0)
        return 0;
    size_t k = 1;
    for (; k < *n && k < avail; k++) {
        unsigned char c = s[k];
        if (k == 1 ? (c < lo || c > hi) : (c & 0xc0) != 0x80)
            break;
    }
    return k;
}

size_t pp_utf8_char_len(const unsigned char *s, size_t avail)
{
    if (avail == 0)
        return 0;
    size_t n, k = matched(s, avail, &n);
    return n > 0 && k == n ? n : 0;
}

int pp_utf8_is_prefix(const unsigned char *s, size_t avail)
{
    if (avail == 0)
        return 1;
    size_t n, k = matched(s, avail, &n);
    return n > avail && k == avail;
}

size_t pp_utf8_invalid_len(const unsigned char *s, size_t avail)
{
    if (avail == 0)
        return 0;
    size_t n, k = matched(s, avail, &n);
    return k > 0 ? k : 1;
}

size_t pp_utf8_step(const unsigned char *s, size_t avail)
{
    size_t n = s[0] < 0xc0 ? 1 : s[0] < 0xe0 ? 2 : s[0] < 0xf0 ? 3 : 4;
    if (n > avail)
        return 1;
    for (size_t i = 1; i < n; i++)
        if ((s[i] & 0xc0) != 0x80)
            return 1;
    return n;
}
