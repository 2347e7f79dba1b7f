/* A growable byte buffer with JSON helpers, used to build GGUF metadata, safetensors headers and
 * the HF side files in memory before they are written. Allocation failures are sticky (see
 * synth-impl.h) so the builders stay free of per-append checks. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "model/synth-impl.h"

static int reserve(struct pp__sbuf *b, size_t extra)
{
    if (b->failed)
        return 0;
    if (extra <= b->cap - b->len)
        return 1;
    if (extra > SIZE_MAX / 2 - b->len) {
        b->failed = 1;
        return 0;
    }
    size_t cap = b->cap ? b->cap : 256;
    while (cap - b->len < extra)
        cap *= 2;
    char *p = pp_alloc(PP_MEM_MISC, cap);
    if (!p) {
        b->failed = 1;
        return 0;
    }
    if (b->len)
        memcpy(p, b->data, b->len);
    pp_free(PP_MEM_MISC, b->data);
    b->data = p;
    b->cap = cap;
    return 1;
}

void pp__sbuf_put(struct pp__sbuf *b, const void *p, size_t n)
{
    if (!reserve(b, n))
        return;
    if (n)
        memcpy(b->data + b->len, p, n);
    b->len += n;
}

void pp__sbuf_puts(struct pp__sbuf *b, const char *s)
{
    pp__sbuf_put(b, s, strlen(s));
}

void pp__sbuf_printf(struct pp__sbuf *b, const char *fmt, ...)
{
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof(small), fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->failed = 1;
        return;
    }
    if ((size_t)n < sizeof(small)) {
        pp__sbuf_put(b, small, (size_t)n);
        return;
    }
    if (!reserve(b, (size_t)n + 1))
        return;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void pp__sbuf_json_str(struct pp__sbuf *b, const char *s)
{
    pp__sbuf_put(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"':
            pp__sbuf_put(b, "\\\"", 2);
            break;
        case '\\':
            pp__sbuf_put(b, "\\\\", 2);
            break;
        case '\n':
            pp__sbuf_put(b, "\\n", 2);
            break;
        case '\r':
            pp__sbuf_put(b, "\\r", 2);
            break;
        case '\t':
            pp__sbuf_put(b, "\\t", 2);
            break;
        case '\b':
            pp__sbuf_put(b, "\\b", 2);
            break;
        case '\f':
            pp__sbuf_put(b, "\\f", 2);
            break;
        default:
            if (*p < 0x20 || *p == 0x7f)
                pp__sbuf_printf(b, "\\u%04x", *p);
            else
                pp__sbuf_put(b, p, 1); /* UTF-8 goes through raw */
        }
    }
    pp__sbuf_put(b, "\"", 1);
}

void pp__sbuf_json_float(struct pp__sbuf *b, float v)
{
    char s[48];
    if (v > -1e15f && v < 1e15f && v == (float)(int64_t)v) {
        /* integral: "500000.0" rather than "5e+05", so readers see a float */
        snprintf(s, sizeof(s), "%.1f", (double)v);
    } else {
        /* the shortest decimal that reads back as v (the C locale's '.' is assumed) */
        for (int prec = 1; prec <= 9; prec++) {
            snprintf(s, sizeof(s), "%.*g", prec, (double)v);
            if (strtof(s, NULL) == v)
                break;
        }
    }
    pp__sbuf_puts(b, s);
}

void pp__sbuf_free(struct pp__sbuf *b)
{
    if (!b)
        return;
    pp_free(PP_MEM_MISC, b->data);
    memset(b, 0, sizeof(*b));
}
