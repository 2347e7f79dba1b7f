/* Growable buffer. */
#include "common/buf.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"

int pp_buf_reserve(struct pp_buf *b, size_t extra)
{
    if (b->failed)
        return 0;
    if (b->cap > b->len && extra < b->cap - b->len)
        return 1;
    if (extra > SIZE_MAX / 2 - b->len) {
        b->failed = 1;
        return 0;
    }
    size_t cap = b->cap ? b->cap : 256;
    while (cap - b->len <= extra)
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

void pp_buf_put(struct pp_buf *b, const void *p, size_t n)
{
    if (!pp_buf_reserve(b, n))
        return;
    if (n)
        memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void pp_buf_puts(struct pp_buf *b, const char *s)
{
    pp_buf_put(b, s, strlen(s));
}

void pp_buf_printf(struct pp_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->failed = 1;
        return;
    }
    if (!pp_buf_reserve(b, (size_t)n))
        return;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void pp_buf_free(struct pp_buf *b)
{
    if (!b)
        return;
    pp_free(PP_MEM_MISC, b->data);
    memset(b, 0, sizeof(*b));
}
