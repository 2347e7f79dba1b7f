/* gRPC server: registered unary methods served from completion-queue threads. Each method keeps one
 * request outstanding; when a call arrives the next request is posted first, then the handler runs
 * and one batch sends the reply, the status and receives the close. A generic request catches
 * unknown methods and answers UNIMPLEMENTED at once (otherwise they would hang until their
 * deadline). */
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <stdio.h>
#include <grpc/grpc.h>
#include <grpc/support/time.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"
#include "common/rpc/rpc-impl.h"

#define MAX_METHODS 32

struct method {
    char *path;
    const ProtobufCMessageDescriptor *req_desc; /* unary */
    pp_rpc_unary_fn fn;                         /* unary */
    pp_rpc_stream_open_fn open;                 /* streaming */
    const struct pp_rpc_stream_cbs *cbs;        /* streaming */
    void *ud;
    void *registered; /* handle from grpc_server_register_method */
};

struct pp_rpc_server {
    grpc_server *server;
    grpc_completion_queue *cq;
    pthread_t threads[16];
    int n_threads;
    char listen[256];
    int max_bytes;
    struct method methods[MAX_METHODS];
    int n_methods;
    int started;
    struct pp_rpc_tag shutdown_tag;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int shutdown_done;
    _Atomic int stopping; /* set before shutdown starts: no request may be posted after it */
    int cq_closed;        /* guarded by mu: the queue takes no new batches */
};

/* One incoming call, from the request being posted to the reply being sent. */
struct call {
    struct pp_rpc_tag arrived;
    struct pp_rpc_tag finished;
    struct pp_rpc_server *srv;
    struct method *m; /* NULL: the generic request (an unknown method) */
    grpc_call *call;
    gpr_timespec deadline;
    grpc_call_details details;
    grpc_metadata_array md;
    grpc_byte_buffer *payload;
    grpc_byte_buffer *reply;
    grpc_slice status_details;
    int cancelled;
};

static void on_arrived(struct pp_rpc_tag *tag, int ok);
static void on_finished(struct pp_rpc_tag *tag, int ok);

static void call_free(struct call *c)
{
    if (c->call)
        grpc_call_unref(c->call);
    grpc_metadata_array_destroy(&c->md);
    if (!c->m)
        grpc_call_details_destroy(&c->details);
    if (c->payload)
        grpc_byte_buffer_destroy(c->payload);
    if (c->reply)
        grpc_byte_buffer_destroy(c->reply);
    grpc_slice_unref(c->status_details);
    pp_free(PP_MEM_RPC, c);
}

/* Posts the next request for m (NULL: the generic one). Returns 0 when the server refused it. */
static int post_request(struct pp_rpc_server *s, struct method *m)
{
    struct call *c = pp_calloc(PP_MEM_RPC, 1, sizeof(*c));
    if (!c) {
        PP_ERROR("rpc: no memory to accept calls on %s", m ? m->path : "(generic)");
        return 0;
    }
    c->arrived.fn = on_arrived;
    c->finished.fn = on_finished;
    c->srv = s;
    c->m = m;
    c->status_details = grpc_empty_slice();
    grpc_metadata_array_init(&c->md);
    grpc_call_error e;
    if (m) {
        e = grpc_server_request_registered_call(s->server, m->registered, &c->call, &c->deadline,
                                                &c->md, m->open ? NULL : &c->payload, s->cq,
                                                s->cq, &c->arrived);
    } else {
        grpc_call_details_init(&c->details);
        e = grpc_server_request_call(s->server, &c->call, &c->details, &c->md, s->cq, s->cq,
                                     &c->arrived);
    }
    if (e != GRPC_CALL_OK) {
        PP_ERROR("rpc: request_call failed: %s", grpc_call_error_to_string(e));
        call_free(c);
        return 0;
    }
    return 1;
}

/* Runs the handler; returns the gRPC code and leaves the reply or the message in c. */
static int handle(struct call *c)
{
    struct method *m = c->m;
    if (!m) {
        char *path = grpc_slice_to_c_string(c->details.method);
        grpc_slice_unref(c->status_details);
        char msg[512];
        snprintf(msg, sizeof(msg), "unknown method %s", path);
        c->status_details = grpc_slice_from_copied_string(msg);
        gpr_free(path);
        return GRPC_STATUS_UNIMPLEMENTED;
    }
    if (!c->payload) {
        grpc_slice_unref(c->status_details);
        c->status_details = grpc_slice_from_static_string("no request message");
        return GRPC_STATUS_INVALID_ARGUMENT;
    }
    struct pp_buf in = {0}, out = {0};
    ProtobufCMessage *req = NULL;
    pp_error_clear();
    pp_status st = pp__rpc_buffer_read(c->payload, &in);
    if (st == PP_OK)
        st = pp_rpc_unpack(m->req_desc, (const uint8_t *)in.data, in.len, &req);
    if (st == PP_OK)
        st = m->fn(m->ud, req, &out);
    if (req)
        protobuf_c_message_free_unpacked(req, NULL);
    int code = pp_rpc_code_from_status(st);
    if (st == PP_OK) {
        c->reply = pp__rpc_buffer_from(out.data ? out.data : "", out.len);
    } else {
        const char *d = pp_error_detail();
        grpc_slice_unref(c->status_details);
        c->status_details = grpc_slice_from_copied_string(d[0] ? d : pp_strerror(st));
    }
    pp_buf_free(&in);
    pp_buf_free(&out);
    return code;
}

static void on_arrived(struct pp_rpc_tag *tag, int ok)
{
    struct call *c = PP_CONTAINER_OF(tag, struct call, arrived);
    struct pp_rpc_server *s = c->srv;
    if (!ok) { /* the server is shutting down: no call came with this tag */
        call_free(c);
        return;
    }
    if (!atomic_load(&s->stopping))
        post_request(s, c->m); /* keep accepting while this one runs */
    if (c->m && c->m->open) {
        pp__rpc_stream_serve(c->call, c->m->open, c->m->cbs, c->m->ud);
        c->call = NULL; /* the stream owns it now */
        call_free(c);
        return;
    }
    int code = handle(c);
    grpc_op ops[4];
    memset(ops, 0, sizeof(ops));
    int n = 0;
    ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    if (c->reply) {
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n++].data.send_message.send_message = c->reply;
    }
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = (grpc_status_code)code;
    ops[n++].data.send_status_from_server.status_details = &c->status_details;
    ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    ops[n++].data.recv_close_on_server.cancelled = &c->cancelled;
    /* a call can still surface after shutdown completed; its queue then takes no batch */
    pthread_mutex_lock(&s->mu);
    grpc_call_error e = GRPC_CALL_ERROR;
    if (!s->cq_closed)
        e = grpc_call_start_batch(c->call, ops, (size_t)n, &c->finished, NULL);
    pthread_mutex_unlock(&s->mu);
    if (e != GRPC_CALL_OK) {
        if (!s->cq_closed)
            PP_ERROR("rpc: reply batch refused: %s", grpc_call_error_to_string(e));
        grpc_call_cancel(c->call, NULL);
        call_free(c);
    }
}

static void on_finished(struct pp_rpc_tag *tag, int ok)
{
    (void)ok; /* the reply could not be sent when the client went away: nothing to do */
    call_free(PP_CONTAINER_OF(tag, struct call, finished));
}

static void on_shutdown(struct pp_rpc_tag *tag, int ok)
{
    (void)ok;
    struct pp_rpc_server *s = PP_CONTAINER_OF(tag, struct pp_rpc_server, shutdown_tag);
    pthread_mutex_lock(&s->mu);
    s->shutdown_done = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static void *cq_loop(void *arg)
{
    struct pp_rpc_server *s = arg;
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
        if (ev.type == GRPC_OP_COMPLETE)
            ((struct pp_rpc_tag *)ev.tag)->fn(ev.tag, ev.success);
    }
    return NULL;
}

int pp__rpc_channel_args(grpc_arg *args, int max_bytes, int server)
{
    struct {
        const char *key;
        int value;
        int server_only;
    } kv[] = {
        {GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, max_bytes, 0},
        {GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, max_bytes, 0},
        {GRPC_ARG_KEEPALIVE_TIME_MS, 10000, 0},
        {GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000, 0},
        {GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1, 0},
        {GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0, 0},
        {GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000, 1},
        /* gRPC binds with SO_REUSEPORT unless told not to: a second daemon on a port in use
         * would then start without error and the kernel would split the connections between
         * the two (a restarted coordinator whose old process still runs serves half the
         * clients from a different cluster) */
        {GRPC_ARG_ALLOW_REUSEPORT, 0, 1},
    };
    _Static_assert(sizeof(kv) / sizeof(kv[0]) <= PP_RPC_N_ARGS, "args holds every entry");
    int n = 0;
    for (size_t i = 0; i < sizeof(kv) / sizeof(kv[0]); i++) {
        if (!server && kv[i].server_only)
            continue;
        args[n].type = GRPC_ARG_INTEGER;
        args[n].key = (char *)kv[i].key;
        args[n].value.integer = kv[i].value;
        n++;
    }
    return n;
}

pp_status pp_rpc_server_new(const struct pp_rpc_server_opts *opts, struct pp_rpc_server **out)
{
    if (!opts->listen || strlen(opts->listen) >= 256)
        return pp_error(PP_ERR_INVALID_ARG, "rpc server: a listen address host:port is required");
    struct pp_rpc_server *s = pp_calloc(PP_MEM_RPC, 1, sizeof(*s));
    if (!s)
        return PP_ERR_NOMEM;
    snprintf(s->listen, sizeof(s->listen), "%s", opts->listen);
    s->n_threads = opts->threads > 0 ? (opts->threads < 16 ? opts->threads : 16) : 1;
    s->max_bytes = opts->max_message_bytes > 0 ? opts->max_message_bytes : PP_RPC_MAX_MESSAGE_BYTES;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->shutdown_tag.fn = on_shutdown;
    pp_rpc_init();
    grpc_arg args[PP_RPC_N_ARGS];
    grpc_channel_args ca = {(size_t)pp__rpc_channel_args(args, s->max_bytes, 1), args};
    s->server = grpc_server_create(&ca, NULL);
    s->cq = grpc_completion_queue_create_for_next(NULL);
    grpc_server_register_completion_queue(s->server, s->cq, NULL);
    *out = s;
    return PP_OK;
}

pp_status pp_rpc_server_add_unary(struct pp_rpc_server *s, const char *path,
                                  const ProtobufCMessageDescriptor *req_desc, pp_rpc_unary_fn fn,
                                  void *ud)
{
    if (s->started || s->n_methods >= MAX_METHODS)
        return pp_error(PP_ERR_INVALID_ARG, "rpc server: cannot add %s (started, or %d methods)",
                        path, MAX_METHODS);
    struct method *m = &s->methods[s->n_methods];
    if (!(m->path = pp_strdup(PP_MEM_RPC, path)))
        return PP_ERR_NOMEM;
    m->req_desc = req_desc;
    m->fn = fn;
    m->ud = ud;
    m->registered = grpc_server_register_method(s->server, m->path, NULL,
                                                fn ? GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER
                                                   : GRPC_SRM_PAYLOAD_NONE,
                                                0);
    if (!m->registered) {
        pp_free(PP_MEM_RPC, m->path);
        return pp_error(PP_ERR_INVALID_ARG, "rpc server: could not register %s", path);
    }
    s->n_methods++;
    return PP_OK;
}

pp_status pp_rpc_server_add_stream(struct pp_rpc_server *s, const char *path,
                                   pp_rpc_stream_open_fn open, const struct pp_rpc_stream_cbs *cbs,
                                   void *ud)
{
    pp_status st = pp_rpc_server_add_unary(s, path, NULL, NULL, ud);
    if (st == PP_OK) {
        s->methods[s->n_methods - 1].open = open;
        s->methods[s->n_methods - 1].cbs = cbs;
    }
    return st;
}

pp_status pp_rpc_server_start(struct pp_rpc_server *s, int *port)
{
    grpc_server_credentials *creds = grpc_insecure_server_credentials_create();
    int p = grpc_server_add_http2_port(s->server, s->listen, creds);
    grpc_server_credentials_release(creds);
    if (p == 0)
        return pp_error(PP_ERR_IO, "rpc server: cannot listen on %s (a bad address, or one in "
                        "use: another process listens there)", s->listen);
    grpc_server_start(s->server);
    s->started = 1;
    for (int i = 0; i < s->n_methods; i++)
        post_request(s, &s->methods[i]);
    post_request(s, NULL);
    for (int i = 0; i < s->n_threads; i++)
        if (pthread_create(&s->threads[i], NULL, cq_loop, s) != 0) {
            s->n_threads = i;
            return pp_error(PP_ERR_NOMEM, "rpc server: cannot start completion-queue thread");
        }
    if (port)
        *port = p;
    return PP_OK;
}

void pp_rpc_server_free(struct pp_rpc_server *s, int grace_ms)
{
    if (!s)
        return;
    atomic_store(&s->stopping, 1);
    if (s->started) {
        grpc_server_shutdown_and_notify(s->server, s->cq, &s->shutdown_tag);
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += grace_ms / 1000;
        until.tv_nsec += (long)(grace_ms % 1000) * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_mutex_lock(&s->mu);
        while (!s->shutdown_done)
            if (pthread_cond_timedwait(&s->cv, &s->mu, &until) != 0)
                break;
        int done = s->shutdown_done;
        pthread_mutex_unlock(&s->mu);
        if (!done) {
            grpc_server_cancel_all_calls(s->server); /* grace over: end what is still running */
            pthread_mutex_lock(&s->mu);
            while (!s->shutdown_done)
                pthread_cond_wait(&s->cv, &s->mu);
            pthread_mutex_unlock(&s->mu);
        }
    }
    grpc_server_destroy(s->server);
    pthread_mutex_lock(&s->mu);
    s->cq_closed = 1;
    grpc_completion_queue_shutdown(s->cq);
    pthread_mutex_unlock(&s->mu);
    if (s->started) {
        for (int i = 0; i < s->n_threads; i++)
            pthread_join(s->threads[i], NULL);
    } else {
        while (grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
               GRPC_QUEUE_SHUTDOWN)
            ;
    }
    grpc_completion_queue_destroy(s->cq);
    for (int i = 0; i < s->n_methods; i++)
        pp_free(PP_MEM_RPC, s->methods[i].path);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    pp_free(PP_MEM_RPC, s);
    pp_rpc_shutdown();
}
