/* The status table and the thread-local detail message behind pp_error. */
#include "common/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const char *const status_messages[PP_STATUS_COUNT] = {
    [PP_OK] = "ok",
    [PP_ERR_INVALID_ARG] = "invalid argument",
    [PP_ERR_NOMEM] = "out of memory",
    [PP_ERR_IO] = "i/o error",
    [PP_ERR_FORMAT] = "malformed input",
    [PP_ERR_UNSUPPORTED] = "unsupported",
    [PP_ERR_NOT_FOUND] = "not found",
    [PP_ERR_OUT_OF_RANGE] = "out of range",
    [PP_ERR_EXHAUSTED] = "resource exhausted",
    [PP_ERR_INTERNAL] = "internal error",
    [PP_ERR_PRECONDITION] = "failed precondition",
    [PP_ERR_UNAVAILABLE] = "unavailable",
    [PP_ERR_TIMEOUT] = "deadline exceeded",
    [PP_ERR_CANCELLED] = "cancelled",
};

static _Thread_local char detail[1024];

const char *pp_strerror(pp_status st)
{
    if ((unsigned)st >= PP_STATUS_COUNT)
        return "unknown status";
    return status_messages[st];
}

pp_status pp_error(pp_status st, const char *fmt, ...)
{
    /* callers often wrap the previous detail ("...: %s", pp_error_detail()): format into a copy,
     * since vsnprintf's output must not overlap its arguments */
    char msg[sizeof(detail)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    memcpy(detail, msg, sizeof(detail));
    return st;
}

const char *pp_error_detail(void)
{
    return detail;
}

void pp_error_clear(void)
{
    detail[0] = '\0';
}
