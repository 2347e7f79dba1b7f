/* JSON writer. Commas are placed by tracking whether the current level already holds a value. */
#include "common/json_write.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/utf8.h"

void pp_json_init(struct pp_json *j)
{
    memset(j, 0, sizeof(*j));
}

void pp_json_free(struct pp_json *j)
{
    pp_buf_free(&j->out);
    j->need_comma = 0;
}

static void put(struct pp_json *j, const char *s, size_t n)
{
    pp_buf_put(&j->out, s, n);
}

static void value_start(struct pp_json *j)
{
    if (j->need_comma)
        put(j, ",", 1);
    j->need_comma = 1;
}

void pp_json_begin_object(struct pp_json *j)
{
    value_start(j);
    put(j, "{", 1);
    j->need_comma = 0;
}

void pp_json_end_object(struct pp_json *j)
{
    put(j, "}", 1);
    j->need_comma = 1;
}

void pp_json_begin_array(struct pp_json *j)
{
    value_start(j);
    put(j, "[", 1);
    j->need_comma = 0;
}

void pp_json_end_array(struct pp_json *j)
{
    put(j, "]", 1);
    j->need_comma = 1;
}

void pp_json_key(struct pp_json *j, const char *key)
{
    pp_json_cstring(j, key);
    put(j, ":", 1);
    j->need_comma = 0;
}

void pp_buf_json_string(struct pp_buf *b, const char *s, size_t n)
{
    pp_buf_put(b, "\"", 1);
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned char c = u[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            pp_buf_put(b, e, 2);
            i++;
        } else if (c < 0x20) {
            const char *named = c == '\n' ? "\\n" : c == '\t' ? "\\t" : c == '\r' ? "\\r" : NULL;
            if (named)
                pp_buf_put(b, named, 2);
            else
                pp_buf_printf(b, "\\u%04x", c);
            i++;
        } else {
            size_t k = pp_utf8_char_len(u + i, n - i);
            if (k == 0) {
                pp_buf_put(b, "\xef\xbf\xbd", 3);
                i += pp_utf8_invalid_len(u + i, n - i);
            } else {
                pp_buf_put(b, s + i, k);
                i += k;
            }
        }
    }
    pp_buf_put(b, "\"", 1);
}

void pp_json_string(struct pp_json *j, const char *s, size_t n)
{
    value_start(j);
    pp_buf_json_string(&j->out, s, n);
}

void pp_json_cstring(struct pp_json *j, const char *s)
{
    pp_json_string(j, s, strlen(s));
}

void pp_json_int(struct pp_json *j, int64_t v)
{
    char b[32];
    value_start(j);
    put(j, b, (size_t)snprintf(b, sizeof(b), "%lld", (long long)v));
}

void pp_json_double(struct pp_json *j, double v)
{
    if (!isfinite(v)) {
        pp_json_null(j);
        return;
    }
    char b[40];
    value_start(j);
    put(j, b, (size_t)snprintf(b, sizeof(b), "%.17g", v));
}

void pp_json_null(struct pp_json *j)
{
    value_start(j);
    put(j, "null", 4);
}

void pp_json_bool(struct pp_json *j, int v)
{
    value_start(j);
    put(j, v ? "true" : "false", v ? 4 : 5);
}
