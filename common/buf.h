/* A growable byte buffer with sticky failure: after an allocation fails every later append is
 * dropped and `failed` stays set, so builders append freely and check once at the end. The JSON
 * writer, the text stream and the model writers all build on it. */
#ifndef PP_BUF_H
#define PP_BUF_H

#include <stddef.h>

struct pp_buf {
    char *data; /* pp_alloc(PP_MEM_MISC); NUL-terminated after every append */
    size_t len;
    size_t cap;
    int failed;
};

/* Room for `extra` more bytes plus a terminating NUL; 0 when that failed (failed is then set). */
int pp_buf_reserve(struct pp_buf *b, size_t extra);
void pp_buf_put(struct pp_buf *b, const void *p, size_t n);
void pp_buf_puts(struct pp_buf *b, const char *s);
void pp_buf_printf(struct pp_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* NULL-safe; leaves b empty and reusable. */
void pp_buf_free(struct pp_buf *b);

#endif
