/* gRPC client channels and unary calls. A unary call is one batch on its own pluck queue: send
 * metadata, message and close, receive metadata, message and status; the call's deadline bounds it.
 */
#include <grpc/grpc_security.h>
#include <stdio.h>
#include <grpc/grpc.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <string.h>

#include "common/alloc.h"
#include "common/rpc/rpc-impl.h"

struct pp_rpc_channel {
    grpc_channel *ch;
    char target[256];
};

pp_status pp_rpc_channel_new(const char *target, struct pp_rpc_channel **out)
{
    if (!target || !target[0] || strlen(target) >= 256)
        return pp_error(PP_ERR_INVALID_ARG, "rpc: expected a target host:port, got '%s'",
                        target ? target : "");
    struct pp_rpc_channel *c = pp_calloc(PP_MEM_RPC, 1, sizeof(*c));
    if (!c)
        return PP_ERR_NOMEM;
    snprintf(c->target, sizeof(c->target), "%s", target);
    pp_rpc_init();
    grpc_arg args[PP_RPC_N_ARGS];
    grpc_channel_args ca = {(size_t)pp__rpc_channel_args(args, PP_RPC_MAX_MESSAGE_BYTES, 0), args};
    grpc_channel_credentials *creds = grpc_insecure_credentials_create();
    c->ch = grpc_channel_create(target, creds, &ca);
    grpc_channel_credentials_release(creds);
    if (!c->ch) {
        pp_free(PP_MEM_RPC, c);
        pp_rpc_shutdown();
        return pp_error(PP_ERR_INVALID_ARG, "rpc: cannot create a channel to %s", target);
    }
    *out = c;
    return PP_OK;
}

void pp_rpc_channel_free(struct pp_rpc_channel *c)
{
    if (!c)
        return;
    grpc_channel_destroy(c->ch);
    pp_free(PP_MEM_RPC, c);
    pp_rpc_shutdown();
}

pp_status pp_rpc_call_raw(struct pp_rpc_channel *c, const char *method, const uint8_t *req,
                          size_t req_len, int64_t timeout_ms, struct pp_buf *resp, int *code_out)
{
    grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
    gpr_timespec deadline = gpr_time_add(gpr_now(GPR_CLOCK_REALTIME),
                                         gpr_time_from_millis(timeout_ms, GPR_TIMESPAN));
    grpc_slice m = grpc_slice_from_copied_string(method);
    grpc_call *call = grpc_channel_create_call(c->ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, m, NULL,
                                               deadline, NULL);
    grpc_slice_unref(m);
    grpc_byte_buffer *send = pp__rpc_buffer_from(req_len ? (const void *)req : "", req_len);
    grpc_byte_buffer *recv = NULL;
    grpc_metadata_array initial_md, trailing_md;
    grpc_metadata_array_init(&initial_md);
    grpc_metadata_array_init(&trailing_md);
    grpc_status_code status = GRPC_STATUS_UNKNOWN;
    grpc_slice details = grpc_empty_slice();
    const char *error_string = NULL;

    grpc_op ops[6];
    memset(ops, 0, sizeof(ops));
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &initial_md;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &recv;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &trailing_md;
    ops[5].data.recv_status_on_client.status = &status;
    ops[5].data.recv_status_on_client.status_details = &details;
    ops[5].data.recv_status_on_client.error_string = &error_string;
    int tag;
    pp_status st = PP_OK;
    grpc_call_error e = grpc_call_start_batch(call, ops, 6, &tag, NULL);
    if (e != GRPC_CALL_OK) {
        st =
            pp_error(PP_ERR_INTERNAL, "%s: call refused: %s", method, grpc_call_error_to_string(e));
    } else {
        grpc_completion_queue_pluck(cq, &tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (code_out)
            *code_out = (int)status;
        if (status == GRPC_STATUS_OK) {
            st = recv ? pp__rpc_buffer_read(recv, resp)
                      : pp_error(PP_ERR_FORMAT, "%s: the server sent no message", method);
        } else {
            char *d = grpc_slice_to_c_string(details);
            st = pp_error(pp_rpc_status_from_code(status), "%s: %s: %s", method,
                          pp_rpc_code_name(status), d[0] ? d : (error_string ? error_string : ""));
            gpr_free(d);
        }
    }
    if (recv)
        grpc_byte_buffer_destroy(recv);
    grpc_byte_buffer_destroy(send);
    grpc_slice_unref(details);
    if (error_string)
        gpr_free((void *)error_string);
    grpc_metadata_array_destroy(&initial_md);
    grpc_metadata_array_destroy(&trailing_md);
    grpc_call_unref(call);
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN)
        ;
    grpc_completion_queue_destroy(cq);
    return st;
}

pp_status pp_rpc_call(struct pp_rpc_channel *c, const char *method, const ProtobufCMessage *req,
                      const ProtobufCMessageDescriptor *resp_desc, int64_t timeout_ms,
                      ProtobufCMessage **resp, int *code)
{
    struct pp_buf in = {0}, out = {0};
    pp_status st = pp_rpc_pack(req, &out);
    if (st == PP_OK)
        st = pp_rpc_call_raw(c, method, (const uint8_t *)out.data, out.len, timeout_ms, &in, code);
    if (st == PP_OK)
        st = pp_rpc_unpack(resp_desc, (const uint8_t *)in.data, in.len, resp);
    pp_buf_free(&in);
    pp_buf_free(&out);
    return st;
}

grpc_channel *pp__rpc_channel_handle(struct pp_rpc_channel *ch)
{
    return ch->ch;
}
