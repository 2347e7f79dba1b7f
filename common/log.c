/* Implementation of the logging macros; writes whole lines with one fprintf so that lines from
 * different threads never interleave. */
#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static char log_role[32] = "ppserve";
static enum pp_log_level log_level = PP_LOG_INFO;
static int log_json;

static const char *const level_names[] = {"debug", "info", "warn", "error", "off"};

void pp_log_init(const char *role, enum pp_log_level level)
{
    snprintf(log_role, sizeof(log_role), "%s", role);
    log_level = level;
    const char *j = getenv("PP_LOG_JSON");
    log_json = j && strcmp(j, "1") == 0;
}

int pp_log_level_parse(const char *s)
{
    for (int i = 0; i <= PP_LOG_OFF; i++)
        if (strcmp(s, level_names[i]) == 0)
            return i;
    return -1;
}

enum pp_log_level pp_log_level_get(void)
{
    return log_level;
}

static void json_escape(char *dst, size_t cap, const char *src)
{
    size_t n = 0;
    for (; *src && n + 7 < cap; src++) {
        unsigned char c = (unsigned char)*src;
        if (c == '"' || c == '\\') {
            dst[n++] = '\\';
            dst[n++] = (char)c;
        } else if (c < 0x20) {
            n += (size_t)snprintf(dst + n, cap - n, "\\u%04x", c);
        } else {
            dst[n++] = (char)c;
        }
    }
    dst[n] = '\0';
}

void pp_log_write(enum pp_log_level level, const char *file, int line, const char *fmt, ...)
{
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);

    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char when[64];
    snprintf(when, sizeof(when), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;

    if (log_json) {
        char esc[4200];
        json_escape(esc, sizeof(esc), msg);
        fprintf(
            stderr,
            "{\"ts\":\"%s\",\"level\":\"%s\",\"role\":\"%s\",\"src\":\"%s:%d\",\"msg\":\"%s\"}\n",
            when, level_names[level], log_role, base, line, esc);
    } else {
        fprintf(stderr, "%s %-5s [%s] %s (%s:%d)\n", when, level_names[level], log_role, msg, base,
                line);
    }
}
