/* UTF-8 validity checks shared by the JSON writer and the text stream. Valid means what RFC 3629
 * allows: no overlong forms, no surrogates, nothing above U+10FFFF. */
#ifndef PP_UTF8_H
#define PP_UTF8_H

#include <stddef.h>

/* Length (1-4) of the valid character at s[0..avail), or 0 when the bytes there are not one (an
 * invalid byte, or a character cut short by avail). */
size_t pp_utf8_char_len(const unsigned char *s, size_t avail);

/* 1 when s[0..avail) is a proper prefix of some valid character: more bytes may complete it. */
int pp_utf8_is_prefix(const unsigned char *s, size_t avail);

/* Bytes to replace with one U+FFFD at an invalid position: the maximal subpart (the longest prefix
 * of a valid character present there), at least 1; Unicode's recommended practice. */
size_t pp_utf8_invalid_len(const unsigned char *s, size_t avail);

/* Bytes to step over at s: the length its lead byte announces when the continuation bytes are
 * there, else 1. Lenient (overlong forms and surrogates count as characters): for walking text
 * character by character, not for validating it. */
size_t pp_utf8_step(const unsigned char *s, size_t avail);

#endif
