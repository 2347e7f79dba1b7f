/* The gRPC layer of the daemons and the CLI, over gRPC C core and protobuf-c. Everything
 * gRPC-specific stays behind this header: servers with handlers that run on completion-queue
 * threads, client channels, deadlines, explicit message-size limits, and the one mapping between
 * pp_status and gRPC status codes.
 *
 * This first part covers unary methods (control plane, Tokenize, Status, health checks); the
 * streaming data plane builds on the same server loop. */
#ifndef PP_RPC_H
#define PP_RPC_H

#include <protobuf-c/protobuf-c.h>
#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "common/status.h"

/* Message limits: activations travel in chunks of at most PP_RPC_CHUNK_BYTES, and every receive
 * limit is set explicitly above that (gRPC's default of 4 MiB counts framing too). */
#define PP_RPC_CHUNK_BYTES (1 << 20)
#define PP_RPC_MAX_MESSAGE_BYTES (8 << 20)

/* Reference-counted gRPC library start/stop; every server and channel holds one reference. */
void pp_rpc_init(void);
void pp_rpc_shutdown(void);

/* The gRPC status code for a pp_status, and back. The one place they are mapped. */
int pp_rpc_code_from_status(pp_status st);
pp_status pp_rpc_status_from_code(int grpc_code);
/* "OK", "INVALID_ARGUMENT", ... */
const char *pp_rpc_code_name(int grpc_code);

/* Packs msg into out (replacing its contents). */
pp_status pp_rpc_pack(const ProtobufCMessage *msg, struct pp_buf *out);
/* Unpacks bytes as desc; a malformed message is PP_ERR_FORMAT with a message naming the type.
 * Free *out with protobuf_c_message_free_unpacked(*out, NULL). */
pp_status pp_rpc_unpack(const ProtobufCMessageDescriptor *desc, const uint8_t *data, size_t len,
                        ProtobufCMessage **out);

/* A message packed once, straight into gRPC's own buffer, so that a stream sends it without
 * another copy (activations are megabytes a microbatch). Owned by the caller until handed to
 * pp_rpc_stream_send_msg. */
struct pp_rpc_msg;
pp_status pp_rpc_msg_pack(const ProtobufCMessage *msg, struct pp_rpc_msg **out);
/* A message holding a copy of data[len]. */
pp_status pp_rpc_msg_copy(const void *data, size_t len, struct pp_rpc_msg **out);
void pp_rpc_msg_free(struct pp_rpc_msg *m);

/* ---- servers ------------------------------------------------------------------------------- */

struct pp_rpc_server;

/* A unary handler: req is the unpacked request; the handler packs its response into resp (e.g.
 * with pp_rpc_pack of a message on its stack) and returns PP_OK, or returns an error whose
 * pp_error_detail() becomes the status message. Runs on a completion-queue thread: keep it short.
 */
typedef pp_status (*pp_rpc_unary_fn)(void *ud, const ProtobufCMessage *req, struct pp_buf *resp);

struct pp_rpc_server_opts {
    const char *listen;     /* "host:port"; port 0 picks a free port */
    int threads;            /* completion-queue threads (default 1) */
    int max_message_bytes;  /* receive and send limit (default PP_RPC_MAX_MESSAGE_BYTES) */
};

pp_status pp_rpc_server_new(const struct pp_rpc_server_opts *opts, struct pp_rpc_server **out);
/* Registers "/package.Service/Method" with its request type. Before pp_rpc_server_start. */
pp_status pp_rpc_server_add_unary(struct pp_rpc_server *s, const char *path,
                                  const ProtobufCMessageDescriptor *req_desc, pp_rpc_unary_fn fn,
                                  void *ud);
/* Binds and starts serving; *port receives the bound port. */
pp_status pp_rpc_server_start(struct pp_rpc_server *s, int *port);
/* Stops accepting, lets calls in flight finish for up to grace_ms, cancels the rest, frees. */
void pp_rpc_server_free(struct pp_rpc_server *s, int grace_ms);

/* ---- clients ------------------------------------------------------------------------------- */

struct pp_rpc_channel;

/* A channel to "host:port" (insecure for now), with the message limit on both directions. */
pp_status pp_rpc_channel_new(const char *target, struct pp_rpc_channel **out);
void pp_rpc_channel_free(struct pp_rpc_channel *ch);

/* A unary call with raw bytes. On a non-OK gRPC status returns the mapped pp_status with the
 * detail "<method>: <CODE>: <server message>" and sets *code (when non-NULL). Thread-safe. */
pp_status pp_rpc_call_raw(struct pp_rpc_channel *ch, const char *method, const uint8_t *req,
                          size_t req_len, int64_t timeout_ms, struct pp_buf *resp, int *code);

/* A unary call with protobuf-c messages; *resp is freed with protobuf_c_message_free_unpacked. */
pp_status pp_rpc_call(struct pp_rpc_channel *ch, const char *method, const ProtobufCMessage *req,
                      const ProtobufCMessageDescriptor *resp_desc, int64_t timeout_ms,
                      ProtobufCMessage **resp, int *code);

/* ---- streams ------------------------------------------------------------------------------ */

/* One side of a streaming call, server or client. Messages are raw bytes (pack with pp_rpc_pack).
 * Sends may come from any thread: they are queued and written one at a time in order. Callbacks
 * run on completion-queue threads, one at a time per stream; keep them short. */
struct pp_rpc_stream;

struct pp_rpc_stream_cbs {
    /* A message from the peer. */
    void (*on_message)(void *ud, struct pp_rpc_stream *st, const uint8_t *data, size_t len);
    /* The peer will send nothing more (its half-close); the stream may still send. Optional. */
    void (*on_half_close)(void *ud, struct pp_rpc_stream *st);
    /* The call is over: PP_OK, or why (the peer cancelled or went away, a deadline, a status the
     * server sent, with the detail in pp_error_detail()). The last callback of a stream. */
    void (*on_end)(void *ud, struct pp_rpc_stream *st, pp_status status);
};

/* A server-streaming or bidirectional method. on_open runs when a call arrives and returns the
 * callbacks' user data (NULL refuses the call with the detail of pp_error_detail()); the stream
 * holds a reference for the application until pp_rpc_stream_release. */
typedef void *(*pp_rpc_stream_open_fn)(void *ud, struct pp_rpc_stream *st);
pp_status pp_rpc_server_add_stream(struct pp_rpc_server *s, const char *path,
                                   pp_rpc_stream_open_fn open, const struct pp_rpc_stream_cbs *cbs,
                                   void *ud);

/* Opens a client stream on ch; timeout_ms <= 0 means no deadline (long-lived hops, which rely on
 * keepalive). The caller holds a reference until pp_rpc_stream_release. Free the channel only after
 * its streams have ended (on_end). */
pp_status pp_rpc_stream_open(struct pp_rpc_channel *ch, const char *method, int64_t timeout_ms,
                             const struct pp_rpc_stream_cbs *cbs, void *ud,
                             struct pp_rpc_stream **out);

/* Queues a message (copied). PP_ERR_IO once the stream has ended or was finished. */
pp_status pp_rpc_stream_send(struct pp_rpc_stream *st, const void *data, size_t len);
/* Queues m without copying it; the stream owns m from here on, whatever the result. */
pp_status pp_rpc_stream_send_msg(struct pp_rpc_stream *st, struct pp_rpc_msg *m);
/* Packs msg straight into gRPC's buffer (pp_rpc_msg_pack) and queues it. */
pp_status pp_rpc_stream_send_packed(struct pp_rpc_stream *st, const ProtobufCMessage *msg);
/* Client: no more messages from this side, after the queued ones. */
void pp_rpc_stream_close_send(struct pp_rpc_stream *st);
/* Server: ends the call with a status after the queued messages (message: NULL for none). */
void pp_rpc_stream_finish(struct pp_rpc_stream *st, pp_status status, const char *message);
/* Either side: abandon the call now; the peer sees CANCELLED. */
void pp_rpc_stream_cancel(struct pp_rpc_stream *st);
/* Backpressure on receiving: after pause (typically from on_message), no further message is read
 * until resume, so HTTP/2 flow control stalls the peer. on_end still arrives if the call ends. */
void pp_rpc_stream_pause(struct pp_rpc_stream *st);
void pp_rpc_stream_resume(struct pp_rpc_stream *st);
/* Messages queued but not yet written (for backpressure). */
size_t pp_rpc_stream_queued(struct pp_rpc_stream *st);
/* Drops the application's reference; the stream is freed once the call is over too. */
void pp_rpc_stream_release(struct pp_rpc_stream *st);

#endif
