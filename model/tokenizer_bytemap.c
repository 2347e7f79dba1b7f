/* The printable alphabet of byte-level BPE (GPT-2's bytes_to_unicode): bytes that are printable
 * Latin-1 characters stand for themselves; the other 68 bytes take the code points 256, 257, ...
 * in byte order: 0x00-0x20 (33 of them), 0x7F-0xA0 (34), 0xAD. Every character is below U+0800,
 * so at most 2 bytes of UTF-8. */
#include "model/tokenizer-impl.h"

static uint32_t code_point(unsigned b)
{
    if (b <= 0x20)
        return 256 + b;
    if (b >= 0x7f && b <= 0xa0)
        return 256 + 33 + (b - 0x7f);
    if (b == 0xad)
        return 256 + 67;
    return b;
}

size_t pp__tok_byte_to_char(uint8_t b, char out[2])
{
    uint32_t cp = code_point(b);
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xc0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3f));
    return 2;
}

int pp__tok_char_to_byte(uint32_t cp)
{
    if (cp < 256)
        return code_point(cp) == cp ? (int)cp : -1;
    uint32_t k = cp - 256;
    if (k < 33)
        return (int)k;
    if (k < 67)
        return (int)(0x7f + k - 33);
    return k == 67 ? 0xad : -1;
}
