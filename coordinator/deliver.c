/* Coordinator.Deliver: the last stage streams the sampled tokens of every microbatch here. A
 * Deliver stream that breaks while the pipeline serves means the last stage is gone. */
#include "common/log.h"
#include "coordinator/coordinator.h"

static void *deliver_open(void *ud, struct pp_rpc_stream *st)
{
    (void)st;
    return ud;
}

static void deliver_message(void *ud, struct pp_rpc_stream *st, const uint8_t *data, size_t len)
{
    struct coordinator *co = ud;
    ProtobufCMessage *m;
    pp_status s = pp_rpc_unpack(&ppserve__v1__results__descriptor, data, len, &m);
    if (s != PP_OK) {
        PP_WARN("malformed results from the last stage: %s", pp_error_detail());
        pp_rpc_stream_finish(st, s, pp_error_detail());
        return;
    }
    const Ppserve__V1__Results *r = (const Ppserve__V1__Results *)m;
    pthread_mutex_lock(&co->mu);
    /* only the current pipeline's last stage delivers; its stream is the one whose end matters */
    int ours = (co->state == CO_SERVING || co->state == CO_STARTING) && co->n_stages > 0 &&
               r->stage_id == co->stages[co->n_stages - 1].id;
    if (ours) {
        co->deliver = st;
        if (r->microbatch_id != 0) /* 0: the stage's hello */
            co_handle_results(co, r);
    } else {
        PP_DEBUG("results from stage_id=%llu ignored (not this pipeline's last stage)",
                 (unsigned long long)r->stage_id);
    }
    pthread_mutex_unlock(&co->mu);
    protobuf_c_message_free_unpacked(m, NULL);
}

static void deliver_half_close(void *ud, struct pp_rpc_stream *st)
{
    (void)ud;
    pp_rpc_stream_send(st, "", 0); /* the (empty) ResultsAck of a client-streaming call */
    pp_rpc_stream_finish(st, PP_OK, NULL);
}

static void deliver_end(void *ud, struct pp_rpc_stream *st, pp_status status)
{
    struct coordinator *co = ud;
    pthread_mutex_lock(&co->mu);
    if (co->deliver == st) {
        co->deliver = NULL;
        if (co->state == CO_SERVING && status != PP_OK && co->n_stages > 0)
            /* cancelled, on the server's side of a stream: the stage ended the call or vanished
             * (the generic text would call the stage "the client") */
            co_pipeline_down(co, "the result stream from the last stage (%s) broke: %s",
                             co->stages[co->n_stages - 1].address,
                             status == PP_ERR_CANCELLED ? "the stage ended it or went away (its "
                             "process stopped, or the connection broke)" : pp_error_detail());
    }
    pthread_mutex_unlock(&co->mu);
    pp_rpc_stream_release(st);
}

static const struct pp_rpc_stream_cbs deliver_cbs = {
    .on_message = deliver_message,
    .on_half_close = deliver_half_close,
    .on_end = deliver_end,
};

pp_status co_deliver_add(struct coordinator *co)
{
    return pp_rpc_server_add_stream(co->server, "/ppserve.v1.Coordinator/Deliver", deliver_open,
                                    &deliver_cbs, co);
}
