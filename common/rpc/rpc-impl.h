/* Internals shared by the files of common/rpc. */
#ifndef PP_RPC_IMPL_H
#define PP_RPC_IMPL_H

#include <grpc/grpc.h>
#include <pthread.h>

#include "common/rpc/rpc.h"

/* Every completion-queue tag is one of these; the loop calls fn with the event's success flag. */
struct pp_rpc_tag {
    void (*fn)(struct pp_rpc_tag *tag, int ok);
};

#define PP_CONTAINER_OF(ptr, type, member) ((type *)((char *)(ptr) - offsetof(type, member)))

/* A byte buffer holding a copy of data. */
grpc_byte_buffer *pp__rpc_buffer_from(const void *data, size_t len);
/* Appends all of bb to out (emptied first). */
pp_status pp__rpc_buffer_read(grpc_byte_buffer *bb, struct pp_buf *out);

/* Channel args: both message limits and keepalive (pings every 10 s, 5 s to answer, also without
 * calls) so that a dead or hung peer is noticed within seconds on long-lived streams. Servers also
 * accept pings that often, and bind without SO_REUSEPORT (a port in use fails). args must hold
 * PP_RPC_N_ARGS entries; returns how many were set. */
#define PP_RPC_N_ARGS 8
int pp__rpc_channel_args(grpc_arg *args, int max_bytes, int server);

/* The process-wide completion queue (and its thread) that client streams use. */
grpc_completion_queue *pp__rpc_client_cq(void);
grpc_channel *pp__rpc_channel_handle(struct pp_rpc_channel *ch);

/* Serves a new streaming call (server.c hands it over); takes the call's reference. */
int pp__rpc_stream_serve(grpc_call *call, pp_rpc_stream_open_fn open,
                         const struct pp_rpc_stream_cbs *cbs, void *ud);

#endif
