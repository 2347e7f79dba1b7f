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
    pp_free(PP_MEM_MISC, j->buf);
    memset(j, 0, sizeof(*j));
}

static void put(struct pp_json *j, const char *s, size_t n)
{
    if (j->oom)
        return;
    if (j->len + n + 1 > j->cap) {
        size_t cap = j->cap ? j->cap : 256;
        while (cap < j->len + n + 1)
            cap *= 2;
        char *nb = pp_alloc(PP_MEM_MISC, cap);
        if (!nb) {
            j->oom = 1;
            return;
        }
        if (j->buf)
            memcpy(nb, j->buf, j->len);
        pp_free(PP_MEM_MISC, j->buf);
        j->buf = nb;
        j->cap = cap;
    }
    memcpy(j->buf + j->len, s, n);
    j->len += n;
    j->buf[j->len] = '\0';
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

void pp_json_string(struct pp_json *j, const char *s, size_t n)
{
    value_start(j);
    put(j, "\"", 1);
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned char c = u[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            put(j, e, 2);
            i++;
        } else if (c < 0x20) {
            char e[8];
            const char *named = c == '\n' ? "\\n" : c == '\t' ? "\\t" : c == '\r' ? "\\r" : NULL;
            if (named)
                put(j, named, 2);
            else
                put(j, e, (size_t)snprintf(e, sizeof(e), "\\u%04x", c));
            i++;
        } else {
            size_t k = pp_utf8_char_len(u + i, n - i);
            if (k == 0) {
                put(j, "\xef\xbf\xbd", 3);
                i += pp_utf8_invalid_len(u + i, n - i);
            } else {
                put(j, s + i, k);
                i += k;
            }
        }
    }
    put(j, "\"", 1);
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
