/* Status codes used across ppserve: one table, one message per code (status.c). Functions return a
 * pp_status and hand results out through pointers; the detail of an error is logged where it starts
 * and kept in a thread-local message (pp_error_detail) that callers may show to a user. */
#ifndef PP_STATUS_H
#define PP_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

enum pp_status {
    PP_OK = 0,
    PP_ERR_INVALID_ARG,   /* a value outside what the function accepts */
    PP_ERR_NOMEM,         /* an allocation failed (or a test made it fail) */
    PP_ERR_IO,            /* open/read/mmap of a file failed */
    PP_ERR_FORMAT,        /* a file or message is malformed, truncated or inconsistent */
    PP_ERR_UNSUPPORTED,   /* valid input that this build or version does not handle */
    PP_ERR_NOT_FOUND,     /* a named thing (tensor, key, sequence) does not exist */
    PP_ERR_OUT_OF_RANGE,  /* a position, length or index beyond a limit (e.g. the context) */
    PP_ERR_EXHAUSTED,     /* a pool (KV blocks, sequence slots) has no room */
    PP_ERR_INTERNAL,      /* a broken invariant of our own */
    PP_ERR_PRECONDITION,  /* not in the state the operation needs (unassigned, another model) */
    PP_ERR_UNAVAILABLE,   /* a peer (stage, coordinator) is down, unreachable or went away */
    PP_ERR_TIMEOUT,       /* a deadline passed */
    PP_ERR_CANCELLED,     /* the caller gave up */
    PP_STATUS_COUNT
};

typedef enum pp_status pp_status;

/* Short fixed message for a code; never NULL. */
const char *pp_strerror(pp_status st);

/* Records a detailed message for the current thread and returns st, so call sites can write
 * `return pp_error(PP_ERR_FORMAT, "tensor %s: expected %d dims, got %d", ...)`. Thread-safe. */
pp_status pp_error(pp_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The last detailed message recorded on this thread ("" when none). Valid until the next pp_error
 * on the same thread. */
const char *pp_error_detail(void);

/* Clears the thread's detail message. */
void pp_error_clear(void);

#ifdef __cplusplus
}
#endif

#endif
