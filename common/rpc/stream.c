/* Streaming calls, both sides. A stream keeps at most one receive and one send in flight (gRPC's
 * rule), a queue of messages waiting to be sent, and a reference count: one for the application and
 * one per batch in flight. on_end is delivered once the call is over and the receive loop has
 * stopped, so it is always the last callback. */
#include <grpc/grpc.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"
#include "common/rpc/rpc-impl.h"

struct qmsg {
    struct qmsg *next;
    grpc_byte_buffer *bb;
};

struct pp_rpc_stream {
    pthread_mutex_t mu;    /* guards everything below except the callbacks' own work */
    pthread_mutex_t cb_mu; /* one callback at a time */
    int refs;
    int is_server;
    grpc_call *call;
    const struct pp_rpc_stream_cbs *cbs;
    void *ud;
    struct pp_rpc_tag t_meta, t_recv, t_send, t_close, t_final;
    /* receiving */
    grpc_byte_buffer *recv_buf;
    struct pp_buf recv_bytes; /* the message being delivered, kept for the next one */
    grpc_metadata_array initial_md;
    int recv_running;
    int paused;          /* the application holds further receives (pp_rpc_stream_pause) */
    /* sending */
    struct qmsg *q_head, *q_tail;
    size_t q_len;
    grpc_byte_buffer *sending;
    int send_busy;
    int close_requested; /* client: close_send; server: finish */
    int final_started;
    grpc_status_code finish_code;
    grpc_slice finish_msg;
    /* the end */
    int call_over;
    int end_delivered;
    int cancelled; /* server: RECV_CLOSE_ON_SERVER's flag */
    grpc_metadata_array trailing_md;
    grpc_status_code status;
    grpc_slice status_details;
    const char *error_string;
};

static void stream_unref_locked(struct pp_rpc_stream *st, int *free_it)
{
    *free_it = --st->refs == 0;
}

static void stream_free(struct pp_rpc_stream *st)
{
    for (struct qmsg *m = st->q_head, *n; m; m = n) {
        n = m->next;
        grpc_byte_buffer_destroy(m->bb);
        pp_free(PP_MEM_RPC, m);
    }
    if (st->sending)
        grpc_byte_buffer_destroy(st->sending);
    if (st->recv_buf)
        grpc_byte_buffer_destroy(st->recv_buf);
    pp_buf_free(&st->recv_bytes);
    grpc_metadata_array_destroy(&st->initial_md);
    grpc_metadata_array_destroy(&st->trailing_md);
    grpc_slice_unref(st->finish_msg);
    grpc_slice_unref(st->status_details);
    if (st->error_string)
        gpr_free((void *)st->error_string);
    if (st->call)
        grpc_call_unref(st->call);
    pthread_mutex_destroy(&st->mu);
    pthread_mutex_destroy(&st->cb_mu);
    pp_free(PP_MEM_RPC, st);
}

static void unref(struct pp_rpc_stream *st)
{
    int free_it;
    pthread_mutex_lock(&st->mu);
    stream_unref_locked(st, &free_it);
    pthread_mutex_unlock(&st->mu);
    if (free_it)
        stream_free(st);
}

/* Starts a batch holding a reference for it; with mu held. */
static int start_locked(struct pp_rpc_stream *st, grpc_op *ops, size_t n, struct pp_rpc_tag *tag)
{
    grpc_call_error e = grpc_call_start_batch(st->call, ops, n, tag, NULL);
    if (e != GRPC_CALL_OK) {
        PP_ERROR("rpc stream: batch refused: %s", grpc_call_error_to_string(e));
        return 0;
    }
    st->refs++;
    return 1;
}

static void start_recv_locked(struct pp_rpc_stream *st, int with_initial_md)
{
    grpc_op ops[2];
    memset(ops, 0, sizeof(ops));
    size_t n = 0;
    if (with_initial_md) {
        ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
        ops[n++].data.recv_initial_metadata.recv_initial_metadata = &st->initial_md;
    }
    ops[n].op = GRPC_OP_RECV_MESSAGE;
    ops[n++].data.recv_message.recv_message = &st->recv_buf;
    st->recv_running = start_locked(st, ops, n, &st->t_recv);
}

/* Writes the next queued message, or the close/status once the queue is empty; with mu held. */
static void pump_locked(struct pp_rpc_stream *st)
{
    if (st->send_busy || st->call_over)
        return;
    grpc_op op;
    memset(&op, 0, sizeof(op));
    if (st->q_head) {
        struct qmsg *m = st->q_head;
        st->q_head = m->next;
        if (!st->q_head)
            st->q_tail = NULL;
        st->q_len--;
        st->sending = m->bb;
        pp_free(PP_MEM_RPC, m);
        op.op = GRPC_OP_SEND_MESSAGE;
        op.data.send_message.send_message = st->sending;
        st->send_busy = start_locked(st, &op, 1, &st->t_send);
        return;
    }
    if (!st->close_requested || st->final_started)
        return;
    st->final_started = 1;
    if (st->is_server) {
        op.op = GRPC_OP_SEND_STATUS_FROM_SERVER;
        op.data.send_status_from_server.status = st->finish_code;
        op.data.send_status_from_server.status_details = &st->finish_msg;
    } else {
        op.op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    }
    st->send_busy = start_locked(st, &op, 1, &st->t_final);
}

/* Delivers on_end when the call is over and no receive is pending; with mu NOT held. */
static void maybe_end(struct pp_rpc_stream *st)
{
    pthread_mutex_lock(&st->mu);
    int deliver = st->call_over && !st->recv_running && !st->end_delivered;
    if (deliver)
        st->end_delivered = 1;
    pp_status end = PP_OK;
    char detail[512] = "";
    if (deliver) {
        if (st->is_server) {
            if (st->cancelled) {
                end = PP_ERR_CANCELLED;
                snprintf(detail, sizeof(detail), "the client cancelled or went away");
            }
        } else if (st->status != GRPC_STATUS_OK) {
            end = pp_rpc_status_from_code(st->status);
            char *d = grpc_slice_to_c_string(st->status_details);
            snprintf(detail, sizeof(detail), "%s: %s", pp_rpc_code_name(st->status),
                     d[0] ? d : (st->error_string ? st->error_string : ""));
            gpr_free(d);
        }
    }
    pthread_mutex_unlock(&st->mu);
    if (!deliver)
        return;
    pthread_mutex_lock(&st->cb_mu);
    if (end != PP_OK)
        pp_error(end, "%s", detail);
    if (st->cbs->on_end)
        st->cbs->on_end(st->ud, st, end);
    pthread_mutex_unlock(&st->cb_mu);
}

static void on_recv(struct pp_rpc_tag *tag, int ok)
{
    struct pp_rpc_stream *st = PP_CONTAINER_OF(tag, struct pp_rpc_stream, t_recv);
    grpc_byte_buffer *bb = st->recv_buf;
    st->recv_buf = NULL;
    if (ok && bb) {
        /* one receive at a time per stream, so its buffer is this callback's alone */
        struct pp_buf *msg = &st->recv_bytes;
        pp_status s = pp__rpc_buffer_read(bb, msg);
        grpc_byte_buffer_destroy(bb);
        if (s == PP_OK) {
            pthread_mutex_lock(&st->cb_mu);
            st->cbs->on_message(st->ud, st, (const uint8_t *)(msg->data ? msg->data : ""),
                                msg->len);
            pthread_mutex_unlock(&st->cb_mu);
        }
        msg->failed = 0;
        pthread_mutex_lock(&st->mu);
        if (s != PP_OK)
            grpc_call_cancel(st->call, NULL);
        int paused = st->paused && s == PP_OK;
        if (paused)
            st->recv_running = 0;
        else
            start_recv_locked(st, 0);
        pthread_mutex_unlock(&st->mu);
        if (paused)
            maybe_end(st);
    } else {
        if (bb)
            grpc_byte_buffer_destroy(bb);
        /* no message: the peer half-closed (or the call failed; the close/status tells which) */
        int half_close = ok && !(st->is_server && grpc_call_failed_before_recv_message(st->call));
        if (half_close && st->cbs->on_half_close) {
            pthread_mutex_lock(&st->cb_mu);
            st->cbs->on_half_close(st->ud, st);
            pthread_mutex_unlock(&st->cb_mu);
        }
        pthread_mutex_lock(&st->mu);
        st->recv_running = 0;
        pthread_mutex_unlock(&st->mu);
        maybe_end(st);
    }
    unref(st);
}

static void on_send(struct pp_rpc_tag *tag, int ok)
{
    struct pp_rpc_stream *st = PP_CONTAINER_OF(tag, struct pp_rpc_stream, t_send);
    pthread_mutex_lock(&st->mu);
    grpc_byte_buffer_destroy(st->sending);
    st->sending = NULL;
    st->send_busy = 0;
    if (ok)
        pump_locked(st);
    /* a failed send means the call is broken; the close/status completion reports it */
    pthread_mutex_unlock(&st->mu);
    unref(st);
}

static void on_final(struct pp_rpc_tag *tag, int ok)
{
    (void)ok;
    struct pp_rpc_stream *st = PP_CONTAINER_OF(tag, struct pp_rpc_stream, t_final);
    pthread_mutex_lock(&st->mu);
    st->send_busy = 0;
    pthread_mutex_unlock(&st->mu);
    unref(st);
}

static void on_meta(struct pp_rpc_tag *tag, int ok)
{
    (void)ok;
    unref(PP_CONTAINER_OF(tag, struct pp_rpc_stream, t_meta));
}

/* The call is over: RECV_CLOSE_ON_SERVER or RECV_STATUS_ON_CLIENT completed. */
static void on_close(struct pp_rpc_tag *tag, int ok)
{
    (void)ok;
    struct pp_rpc_stream *st = PP_CONTAINER_OF(tag, struct pp_rpc_stream, t_close);
    pthread_mutex_lock(&st->mu);
    st->call_over = 1;
    pthread_mutex_unlock(&st->mu);
    maybe_end(st);
    unref(st);
}

static struct pp_rpc_stream *stream_new(int is_server)
{
    struct pp_rpc_stream *st = pp_calloc(PP_MEM_RPC, 1, sizeof(*st));
    if (!st)
        return NULL;
    pthread_mutex_init(&st->mu, NULL);
    pthread_mutex_init(&st->cb_mu, NULL);
    st->is_server = is_server;
    st->refs = 1; /* the application's */
    st->t_meta.fn = on_meta;
    st->t_recv.fn = on_recv;
    st->t_send.fn = on_send;
    st->t_close.fn = on_close;
    st->t_final.fn = on_final;
    st->finish_msg = grpc_empty_slice();
    st->status_details = grpc_empty_slice();
    grpc_metadata_array_init(&st->initial_md);
    grpc_metadata_array_init(&st->trailing_md);
    return st;
}

int pp__rpc_stream_serve(grpc_call *call, pp_rpc_stream_open_fn open,
                         const struct pp_rpc_stream_cbs *cbs, void *ud)
{
    struct pp_rpc_stream *st = stream_new(1);
    if (!st) {
        grpc_call_cancel(call, NULL);
        grpc_call_unref(call);
        return 0;
    }
    st->call = call;
    st->cbs = cbs;
    pthread_mutex_lock(&st->mu);
    grpc_op ops[1];
    memset(ops, 0, sizeof(ops));
    ops[0].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    ops[0].data.recv_close_on_server.cancelled = &st->cancelled;
    start_locked(st, ops, 1, &st->t_close);
    memset(ops, 0, sizeof(ops));
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    start_locked(st, ops, 1, &st->t_meta);
    /* open may finish the call itself, and the call may then be over before open returns: hold
     * on_end back (it waits for the receive loop) until the application's user data is set */
    st->recv_running = 1;
    pthread_mutex_unlock(&st->mu);

    static const struct pp_rpc_stream_cbs none = {0};
    pp_error_clear();
    void *app = open(ud, st);
    pthread_mutex_lock(&st->mu);
    st->recv_running = 0;
    if (!app) {
        const char *d = pp_error_detail();
        st->cbs = &none; /* the application never saw the stream: nothing to call back */
        if (!st->close_requested) {
            st->close_requested = 1;
            st->finish_code = GRPC_STATUS_UNAVAILABLE;
            grpc_slice_unref(st->finish_msg);
            st->finish_msg = grpc_slice_from_copied_string(d[0] ? d : "refused");
        }
        pump_locked(st);
    } else {
        st->ud = app;
        if (!st->call_over)
            start_recv_locked(st, 0);
        st->refs++; /* for the maybe_end below: on_end may run and the application let go */
    }
    pthread_mutex_unlock(&st->mu);
    if (app)
        maybe_end(st); /* the call ended while open ran */
    unref(st); /* the application's reference (refused), or the one taken above */
    return 1;
}

pp_status pp_rpc_stream_open(struct pp_rpc_channel *ch, const char *method, int64_t timeout_ms,
                             const struct pp_rpc_stream_cbs *cbs, void *ud,
                             struct pp_rpc_stream **out)
{
    struct pp_rpc_stream *st = stream_new(0);
    if (!st)
        return PP_ERR_NOMEM;
    st->cbs = cbs;
    st->ud = ud;
    gpr_timespec deadline =
        timeout_ms > 0 ? gpr_time_add(gpr_now(GPR_CLOCK_REALTIME),
                                      gpr_time_from_millis(timeout_ms, GPR_TIMESPAN))
                       : gpr_inf_future(GPR_CLOCK_REALTIME);
    grpc_slice m = grpc_slice_from_copied_string(method);
    st->call = grpc_channel_create_call(pp__rpc_channel_handle(ch), NULL, GRPC_PROPAGATE_DEFAULTS,
                                        pp__rpc_client_cq(), m, NULL, deadline, NULL);
    grpc_slice_unref(m);
    pthread_mutex_lock(&st->mu);
    grpc_op ops[1];
    memset(ops, 0, sizeof(ops));
    ops[0].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[0].data.recv_status_on_client.trailing_metadata = &st->trailing_md;
    ops[0].data.recv_status_on_client.status = &st->status;
    ops[0].data.recv_status_on_client.status_details = &st->status_details;
    ops[0].data.recv_status_on_client.error_string = &st->error_string;
    int ok = start_locked(st, ops, 1, &st->t_close);
    memset(ops, 0, sizeof(ops));
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ok = ok && start_locked(st, ops, 1, &st->t_meta);
    if (ok)
        start_recv_locked(st, 1);
    pthread_mutex_unlock(&st->mu);
    if (!ok) {
        grpc_call_cancel(st->call, NULL);
        pp_rpc_stream_release(st);
        return pp_error(PP_ERR_INTERNAL, "%s: could not start the stream", method);
    }
    *out = st;
    return PP_OK;
}

pp_status pp_rpc_stream_send(struct pp_rpc_stream *st, const void *data, size_t len)
{
    struct pp_rpc_msg *msg;
    pp_status s = pp_rpc_msg_copy(data, len, &msg);
    return s == PP_OK ? pp_rpc_stream_send_msg(st, msg) : s;
}

pp_status pp_rpc_stream_send_packed(struct pp_rpc_stream *st, const ProtobufCMessage *msg)
{
    struct pp_rpc_msg *m;
    pp_status s = pp_rpc_msg_pack(msg, &m);
    return s == PP_OK ? pp_rpc_stream_send_msg(st, m) : s;
}

pp_status pp_rpc_stream_send_msg(struct pp_rpc_stream *st, struct pp_rpc_msg *msg)
{
    struct qmsg *m = pp_alloc(PP_MEM_RPC, sizeof(*m));
    if (!m) {
        pp_rpc_msg_free(msg);
        return pp_error(PP_ERR_NOMEM, "no memory to queue a message");
    }
    m->next = NULL;
    m->bb = (grpc_byte_buffer *)msg;
    pthread_mutex_lock(&st->mu);
    if (st->call_over || st->close_requested) {
        pthread_mutex_unlock(&st->mu);
        grpc_byte_buffer_destroy(m->bb);
        pp_free(PP_MEM_RPC, m);
        return pp_error(PP_ERR_IO, "stream already %s", st->call_over ? "ended" : "closed");
    }
    if (st->q_tail)
        st->q_tail->next = m;
    else
        st->q_head = m;
    st->q_tail = m;
    st->q_len++;
    pump_locked(st);
    pthread_mutex_unlock(&st->mu);
    return PP_OK;
}

void pp_rpc_stream_close_send(struct pp_rpc_stream *st)
{
    pthread_mutex_lock(&st->mu);
    st->close_requested = 1;
    pump_locked(st);
    pthread_mutex_unlock(&st->mu);
}

void pp_rpc_stream_finish(struct pp_rpc_stream *st, pp_status status, const char *message)
{
    pthread_mutex_lock(&st->mu);
    if (!st->close_requested) {
        st->close_requested = 1;
        st->finish_code = (grpc_status_code)pp_rpc_code_from_status(status);
        grpc_slice_unref(st->finish_msg);
        st->finish_msg = message ? grpc_slice_from_copied_string(message) : grpc_empty_slice();
        pump_locked(st);
    }
    pthread_mutex_unlock(&st->mu);
}

void pp_rpc_stream_cancel(struct pp_rpc_stream *st)
{
    grpc_call_cancel(st->call, NULL); /* thread-safe in gRPC core */
}

void pp_rpc_stream_pause(struct pp_rpc_stream *st)
{
    pthread_mutex_lock(&st->mu);
    st->paused = 1;
    pthread_mutex_unlock(&st->mu);
}

void pp_rpc_stream_resume(struct pp_rpc_stream *st)
{
    pthread_mutex_lock(&st->mu);
    int was = st->paused;
    st->paused = 0;
    if (was && !st->recv_running && !st->call_over && !st->end_delivered)
        start_recv_locked(st, 0);
    pthread_mutex_unlock(&st->mu);
}

size_t pp_rpc_stream_queued(struct pp_rpc_stream *st)
{
    pthread_mutex_lock(&st->mu);
    size_t n = st->q_len + (st->send_busy ? 1 : 0);
    pthread_mutex_unlock(&st->mu);
    return n;
}

void pp_rpc_stream_release(struct pp_rpc_stream *st)
{
    if (st)
        unref(st);
}
