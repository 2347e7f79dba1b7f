/* What the commands that talk to a cluster share: the client API's method paths, connecting to a
 * coordinator, printing a gRPC error the same way everywhere, polling Status until the cluster
 * serves, and showing a StatusResponse as a table or as JSON. Internal to client/remote/. */
#ifndef PP_REMOTE_H
#define PP_REMOTE_H

#include <stdint.h>
#include <stdio.h>

#include "common/rpc/rpc.h"
#include "common/clock.h"
#include "common/status.h"
#include "ppserve/v1/client.pb-c.h"

#define PP_REMOTE_GENERATE "/ppserve.v1.Ppserve/Generate"
#define PP_REMOTE_STATUS "/ppserve.v1.Ppserve/Status"
#define PP_REMOTE_TRACE "/ppserve.v1.Ppserve/Trace"

/* The default deadline of one unary call (Status, Trace). */
#define PP_REMOTE_CALL_TIMEOUT_MS 5000

/* Opens a channel to addr ("host:port"). On error prints "ppserve CMD: error: ..." and returns
 * NULL. The caller frees the channel with pp_rpc_channel_free. */
struct pp_rpc_channel *pp_remote_connect(const char *cmd, const char *addr);

/* The current thread's error detail without the method prefix that unary calls add, so every
 * command reads "<CODE>: <server message>"; the status text when there is no detail. The pointer
 * is valid until the next pp_error on this thread. */
const char *pp_remote_error_text(pp_status st);

/* Prints "ppserve CMD: error: <pp_remote_error_text>" to stderr; returns 1. */
int pp_remote_fail(const char *cmd, pp_status st);

/* Calls Status once. *out is freed with protobuf_c_message_free_unpacked(&(*out)->base, NULL). */
pp_status pp_remote_status_get(struct pp_rpc_channel *ch, int64_t timeout_ms,
                               Ppserve__V1__StatusResponse **out);

/* 1 when the response says the cluster serves. */
int pp_remote_status_serving(const Ppserve__V1__StatusResponse *s);

/* Why the last poll did not see a serving cluster: a gRPC error or the state string. */
struct pp_remote_wait {
    int got_response;  /* the coordinator answered (state below), else a call failed (error) */
    int stopped;       /* keep_going said stop */
    int blocked;       /* the coordinator said its stages cannot form a pipeline as they are */
    char reason[1024];
};

/* Returns 1 to go on polling, 0 to give up (e.g. a supervised process died). */
typedef int (*pp_remote_keep_going_fn)(void *ud);

/* Polls Status on addr every 200 ms until state == "serving" (PP_OK, *out holds that response), or
 * timeout_s passes (PP_ERR_IO; why in *why), or keep_going (optional) says stop (PP_ERR_IO,
 * why->stopped set), or, with stop_when_blocked, the response says `blocked` (PP_ERR_PRECONDITION,
 * why->blocked set, the state in why->reason: waiting longer cannot help). A malformed addr fails
 * at once (PP_ERR_INVALID_ARG, detail set). Each poll
 * uses a fresh channel, so a coordinator that starts late is not hidden behind gRPC's reconnect
 * backoff; each call's deadline is call_timeout_ms, capped by the time left. The caller holds a
 * pp_rpc_init reference across this call (so gRPC is not restarted for every poll). */
pp_status pp_remote_wait_serving(const char *addr, double timeout_s, int64_t call_timeout_ms,
                                 pp_remote_keep_going_fn keep_going, void *ud,
                                 int stop_when_blocked, Ppserve__V1__StatusResponse **out,
                                 struct pp_remote_wait *why);

/* Writes "512 B", "1.5 KiB", "12.0 MiB", ... into out[cap]; returns out. */
char *pp_remote_human_bytes(uint64_t n, char *out, size_t cap);

/* The status table (cluster summary, then one row per stage) on f. */
void pp_remote_status_print(FILE *f, const Ppserve__V1__StatusResponse *s);
/* The response as one JSON object on one line, fields named as in client.proto. */
void pp_remote_status_print_json(FILE *f, const Ppserve__V1__StatusResponse *s);

#endif
