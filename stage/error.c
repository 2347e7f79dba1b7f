/* Error messages that add context to the detail of an error from a lower layer. pp_error formats
 * into the thread's detail buffer, so the detail must be copied out before it is reused. */
#include <stdarg.h>
#include <stdio.h>

#include "stage/stage.h"

pp_status pp_stage_error_wrap(pp_status st, const char *fmt, ...)
{
    char detail[1024], prefix[512];
    snprintf(detail, sizeof(detail), "%s",
             pp_error_detail()[0] ? pp_error_detail() : pp_strerror(st));
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof(prefix), fmt, ap);
    va_end(ap);
    return pp_error(st, "%s: %s", prefix, detail);
}
