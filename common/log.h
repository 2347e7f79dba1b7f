/* Level-gated logging: one line per event on stderr, key=value fields, the process role in the
 * prefix. PP_LOG_JSON=1 in the environment switches to JSON lines. */
#ifndef PP_LOG_H
#define PP_LOG_H

#ifdef __cplusplus
extern "C" {
#endif

enum pp_log_level { PP_LOG_DEBUG = 0, PP_LOG_INFO, PP_LOG_WARN, PP_LOG_ERROR, PP_LOG_OFF };

/* Set once at start-up, before threads exist. role appears in every line ("run", "stage1"). */
void pp_log_init(const char *role, enum pp_log_level level);
/* Parses "debug|info|warn|error|off"; returns -1 when unknown. */
int pp_log_level_parse(const char *s);
enum pp_log_level pp_log_level_get(void);

void pp_log_write(enum pp_log_level level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define PP_LOG(level, ...)                                                                         \
    do {                                                                                           \
        if ((level) >= pp_log_level_get())                                                         \
            pp_log_write((level), __FILE__, __LINE__, __VA_ARGS__);                                \
    } while (0)
#define PP_DEBUG(...) PP_LOG(PP_LOG_DEBUG, __VA_ARGS__)
#define PP_INFO(...) PP_LOG(PP_LOG_INFO, __VA_ARGS__)
#define PP_WARN(...) PP_LOG(PP_LOG_WARN, __VA_ARGS__)
#define PP_ERROR(...) PP_LOG(PP_LOG_ERROR, __VA_ARGS__)

#ifdef __cplusplus
}
#endif

#endif
