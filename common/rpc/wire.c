/* protobuf-c messages ⇄ bytes, and gRPC byte buffers ⇄ pp_buf. */
#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/support/time.h>
#include <string.h>

#include "common/log.h"

#include "common/rpc/rpc-impl.h"

static pthread_mutex_t init_mu = PTHREAD_MUTEX_INITIALIZER;
static int init_refs;
static grpc_completion_queue *client_cq;
static pthread_t client_thread;

static void *client_loop(void *arg)
{
    grpc_completion_queue *cq = arg;
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
        if (ev.type == GRPC_OP_COMPLETE)
            ((struct pp_rpc_tag *)ev.tag)->fn(ev.tag, ev.success);
    }
    return NULL;
}

void pp_rpc_init(void)
{
    pthread_mutex_lock(&init_mu);
    if (init_refs++ == 0) {
        grpc_init();
        client_cq = grpc_completion_queue_create_for_next(NULL);
        if (pthread_create(&client_thread, NULL, client_loop, client_cq) != 0)
            PP_ERROR("rpc: cannot start the client completion-queue thread");
    }
    pthread_mutex_unlock(&init_mu);
}

void pp_rpc_shutdown(void)
{
    pthread_mutex_lock(&init_mu);
    int last = --init_refs == 0;
    pthread_mutex_unlock(&init_mu);
    if (!last)
        return;
    /* streams hold references, so no client call is left on the queue */
    grpc_completion_queue_shutdown(client_cq);
    if (!pthread_equal(pthread_self(), client_thread))
        pthread_join(client_thread, NULL);
    else
        pthread_detach(client_thread);
    grpc_completion_queue_destroy(client_cq);
    client_cq = NULL;
    grpc_shutdown();
}

grpc_completion_queue *pp__rpc_client_cq(void)
{
    return client_cq;
}

pp_status pp_rpc_pack(const ProtobufCMessage *msg, struct pp_buf *out)
{
    size_t n = protobuf_c_message_get_packed_size(msg);
    out->len = 0;
    if (!pp_buf_reserve(out, n))
        return pp_error(PP_ERR_NOMEM, "no memory for a %zu-byte %s", n, msg->descriptor->name);
    protobuf_c_message_pack(msg, (uint8_t *)out->data);
    out->len = n;
    return PP_OK;
}

pp_status pp_rpc_unpack(const ProtobufCMessageDescriptor *desc, const uint8_t *data, size_t len,
                        ProtobufCMessage **out)
{
    *out = protobuf_c_message_unpack(desc, NULL, len, data);
    if (!*out)
        return pp_error(PP_ERR_FORMAT, "malformed %s message (%zu bytes)", desc->name, len);
    return PP_OK;
}

/* A pp_rpc_msg is a gRPC byte buffer under another name, so that rpc.h needs no gRPC header. */
pp_status pp_rpc_msg_pack(const ProtobufCMessage *msg, struct pp_rpc_msg **out)
{
    size_t n = protobuf_c_message_get_packed_size(msg);
    grpc_slice s = grpc_slice_malloc(n);
    protobuf_c_message_pack(msg, GRPC_SLICE_START_PTR(s));
    *out = (struct pp_rpc_msg *)grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return PP_OK;
}

pp_status pp_rpc_msg_copy(const void *data, size_t len, struct pp_rpc_msg **out)
{
    *out = (struct pp_rpc_msg *)pp__rpc_buffer_from(len ? data : "", len);
    return PP_OK;
}

void pp_rpc_msg_free(struct pp_rpc_msg *m)
{
    if (m)
        grpc_byte_buffer_destroy((grpc_byte_buffer *)m);
}

grpc_byte_buffer *pp__rpc_buffer_from(const void *data, size_t len)
{
    grpc_slice s = grpc_slice_from_copied_buffer(data, len);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return bb;
}

pp_status pp__rpc_buffer_read(grpc_byte_buffer *bb, struct pp_buf *out)
{
    out->len = 0;
    /* one reservation for the whole message, not a doubling per slice */
    if (!pp_buf_reserve(out, grpc_byte_buffer_length(bb)))
        return pp_error(PP_ERR_NOMEM, "no memory for an incoming %zu-byte message",
                        grpc_byte_buffer_length(bb));
    grpc_byte_buffer_reader r;
    if (!grpc_byte_buffer_reader_init(&r, bb))
        return pp_error(PP_ERR_FORMAT, "unreadable message (bad compression?)");
    grpc_slice s;
    pp_status st = PP_OK;
    while (grpc_byte_buffer_reader_next(&r, &s)) {
        pp_buf_put(out, GRPC_SLICE_START_PTR(s), GRPC_SLICE_LENGTH(s));
        grpc_slice_unref(s);
    }
    grpc_byte_buffer_reader_destroy(&r);
    if (out->failed)
        st = pp_error(PP_ERR_NOMEM, "no memory for an incoming message");
    return st;
}
