/* A small JSON writer into a growable buffer, for CLI output and results files. It needs no
 * library, so the engine-only build has it too. Strings are escaped and invalid UTF-8 becomes
 * U+FFFD, so the output is always valid JSON. */
#ifndef PP_JSON_WRITE_H
#define PP_JSON_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"

struct pp_json {
    struct pp_buf out; /* the text; out.failed means it is incomplete */
    int need_comma;    /* a value was written at the current nesting level */
};

/* Appends n bytes of s as a quoted, escaped JSON string (invalid UTF-8 → U+FFFD). */
void pp_buf_json_string(struct pp_buf *b, const char *s, size_t n);

void pp_json_init(struct pp_json *j);
void pp_json_free(struct pp_json *j);

void pp_json_begin_object(struct pp_json *j);
void pp_json_end_object(struct pp_json *j);
void pp_json_begin_array(struct pp_json *j);
void pp_json_end_array(struct pp_json *j);
/* Writes "key": and leaves the writer expecting the value. */
void pp_json_key(struct pp_json *j, const char *key);
void pp_json_string(struct pp_json *j, const char *s, size_t n);
void pp_json_cstring(struct pp_json *j, const char *s);
void pp_json_int(struct pp_json *j, int64_t v);
/* Finite values print with enough digits to round-trip; NaN/inf print as null. */
void pp_json_double(struct pp_json *j, double v);
void pp_json_null(struct pp_json *j);
void pp_json_bool(struct pp_json *j, int v);

#endif
