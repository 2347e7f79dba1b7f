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

/* Channel args that set both message limits. args must hold 2 entries. */
void pp__rpc_limit_args(grpc_arg *args, int max_bytes);

#endif
