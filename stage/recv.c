/* Inbound Stage/Forward streams: the previous hop (or a test) sends a Handshake, then microbatches
 * as chunks. Each stream reassembles its own microbatches and validates them whole before any byte
 * reaches the model; a complete one goes on the shared queue (queue.c) with the times its first and
 * last chunk arrived. Anything malformed ends that stream alone with a status that says what was
 * expected and what arrived; the stage keeps serving the others. Acks go back on the stream a
 * microbatch came from. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"
#include "stage/stage.h"

/* Ends the stream with status and a message; later messages are ignored. */
static void fail(struct pp_stage_inbound *in, pp_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void fail(struct pp_stage_inbound *in, pp_status status, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (atomic_exchange(&in->finished, 1))
        return;
    PP_WARN("inbound hop refused: code=%s detail=\"%s\"",
            pp_rpc_code_name(pp_rpc_code_from_status(status)), msg);
    pp_hop_assembler_reset(&in->assembler);
    pp_rpc_stream_finish(in->st, status, msg);
}

void pp_stage_ack(struct pp_stage_inbound *in, uint64_t microbatch_id, pp_status status,
                  const char *message)
{
    Ppserve__V1__HopAck ack = PPSERVE__V1__HOP_ACK__INIT;
    ack.microbatch_id = microbatch_id;
    ack.code = (uint32_t)pp_rpc_code_from_status(status);
    ack.message = (char *)(status != PP_OK && message ? message : "");
    struct pp_buf b = {0};
    if (pp_rpc_pack(&ack.base, &b) == PP_OK)
        pp_rpc_stream_send(in->st, b.data,
                           b.len); /* fails only once the stream ended: no one to tell */
    pp_buf_free(&b);
}

void pp_stage_inbound_finish_all(struct pp_stage *s, int all, uint64_t gen, pp_status status,
                                 const char *message)
{
    pthread_mutex_lock(&s->q_mu);
    for (struct pp_stage_inbound *in = s->inbound; in; in = in->next)
        if (!in->ended && (all || (in->handshaken && in->gen == gen)) &&
            !atomic_exchange(&in->finished, 1))
            pp_rpc_stream_finish(in->st, status, message);
    pthread_mutex_unlock(&s->q_mu);
}

static const char *dtype_name(int d)
{
    switch (d) {
    case PPSERVE__V1__DTYPE__DTYPE_F32: return "DTYPE_F32";
    case PPSERVE__V1__DTYPE__DTYPE_TOKEN_IDS: return "DTYPE_TOKEN_IDS";
    default: return "DTYPE_UNSPECIFIED";
    }
}

/* What the assembler cannot know: the dtype this stage takes and each part's token ids. */
static pp_status check_microbatch(const struct pp_stage_inbound *in,
                                  const Ppserve__V1__MicrobatchHeader *h,
                                  const struct pp_buf *payload)
{
    unsigned long long id = (unsigned long long)h->microbatch_id;
    int want =
        in->first_stage ? PPSERVE__V1__DTYPE__DTYPE_TOKEN_IDS : PPSERVE__V1__DTYPE__DTYPE_F32;
    if ((int)h->dtype != want) {
        char shape[64];
        if (h->n_shape >= 2)
            snprintf(shape, sizeof(shape), "[%lld, %lld]", (long long)h->shape[0],
                     (long long)h->shape[1]);
        else
            snprintf(shape, sizeof(shape), "[%lld]", h->n_shape ? (long long)h->shape[0] : 0LL);
        if (in->first_stage)
            return pp_error(PP_ERR_INVALID_ARG, "microbatch %llu: this stage starts at layer 0 and "
                            "takes token ids (DTYPE_TOKEN_IDS, shape [n]), got %s %s", id,
                            dtype_name(h->dtype), shape);
        return pp_error(PP_ERR_INVALID_ARG, "microbatch %llu: this stage takes activations "
                        "(DTYPE_F32, shape [n, %lld]), got %s %s", id, (long long)in->dim,
                        dtype_name(h->dtype), shape);
    }
    const int32_t *tokens = (const int32_t *)payload->data;
    int64_t row = 0;
    for (size_t i = 0; i < h->n_parts; i++) {
        const Ppserve__V1__SeqPart *p = h->parts[i];
        if (p->n_token_ids != (size_t)p->n_tokens)
            return pp_error(PP_ERR_INVALID_ARG, "microbatch %llu, sequence %llu: %zu token ids "
                            "for %d tokens (expected one id per token)", id,
                            (unsigned long long)p->seq_id, p->n_token_ids, p->n_tokens);
        /* the last stage keeps token_ids as the history: they must be what stage 0 computed */
        if (in->first_stage)
            for (size_t t = 0; t < p->n_token_ids; t++, row++)
                if (p->token_ids[t] != tokens[row])
                    return pp_error(PP_ERR_INVALID_ARG, "microbatch %llu, sequence %llu: token id "
                                    "%zu is %d in the part, %d in the payload (row %lld)", id,
                                    (unsigned long long)p->seq_id, t, p->token_ids[t], tokens[row],
                                    (long long)row);
    }
    return PP_OK;
}

static void on_handshake(struct pp_stage_inbound *in, const Ppserve__V1__Handshake *hs)
{
    struct pp_stage *s = in->s;
    if (in->handshaken) {
        fail(in, PP_ERR_INVALID_ARG,
             "a second handshake arrived (expected chunks after the first)");
        return;
    }
    pthread_mutex_lock(&s->info_mu);
    struct pp_stage_info info = s->info;
    pthread_mutex_unlock(&s->info_mu);
    if (!info.assigned) {
        fail(in, PP_ERR_PRECONDITION, "this stage has no assignment yet (expected an Assign from "
             "the coordinator before the hop opens)");
        return;
    }
    if (pp_hop_handshake_check(hs, PP_STAGE_PROTOCOL, info.model_id, info.first_layer) != PP_OK) {
        fail(in, PP_ERR_PRECONDITION, "%s", pp_error_detail());
        return;
    }
    pp_hop_assembler_init(&in->assembler, info.max_bytes, info.dim);
    in->first_stage = info.first_layer == 0;
    in->dim = info.dim;
    pthread_mutex_lock(&s->q_mu);
    in->gen = info.gen;
    in->handshaken = 1;
    pthread_mutex_unlock(&s->q_mu);
    PP_INFO("inbound hop open: model=%s first_layer=%d", info.model_id, info.first_layer);
}

static void on_chunk(struct pp_stage_inbound *in, const Ppserve__V1__Chunk *c)
{
    struct pp_stage *s = in->s;
    if (!in->handshaken) {
        fail(in, PP_ERR_INVALID_ARG, "a chunk of microbatch %llu arrived before the handshake "
             "(expected a Handshake first)", (unsigned long long)c->microbatch_id);
        return;
    }
    pthread_mutex_lock(&s->info_mu);
    int current = s->info.assigned && s->info.gen == in->gen;
    pthread_mutex_unlock(&s->info_mu);
    if (!current) {
        fail(in, PP_ERR_PRECONDITION, "this stage was reassigned after the handshake (expected a "
             "new stream with a new handshake)");
        return;
    }
    if (in->assembler.next_index == 0)
        in->recv_start = pp_clock_real();
    pthread_mutex_lock(&s->stats_mu);
    s->bytes_in += c->data.len;
    pthread_mutex_unlock(&s->stats_mu);
    int done = 0;
    if (pp_hop_assembler_push(&in->assembler, c, &done) != PP_OK) {
        fail(in, PP_ERR_INVALID_ARG, "%s", pp_error_detail());
        return;
    }
    if (!done)
        return;
    double recv_end = pp_clock_real();
    const Ppserve__V1__MicrobatchHeader *h = in->assembler.hdr;
    int failed =
        !(h->error && h->error[0]) && check_microbatch(in, h, &in->assembler.payload) != PP_OK;
    if (failed) {
        fail(in, PP_ERR_INVALID_ARG, "%s", pp_error_detail());
        return;
    }
    struct pp_stage_mb *mb = pp_calloc(PP_MEM_RPC, 1, sizeof(*mb));
    if (!mb) {
        fail(in, PP_ERR_NOMEM, "no memory to queue microbatch %llu",
             (unsigned long long)h->microbatch_id);
        return;
    }
    /* the microbatch takes the assembler's header and payload; the assembler starts afresh */
    mb->hdr = in->assembler.hdr;
    mb->payload = in->assembler.payload;
    in->assembler.hdr = NULL;
    memset(&in->assembler.payload, 0, sizeof(in->assembler.payload));
    pp_hop_assembler_reset(&in->assembler);
    mb->in = in;
    mb->gen = in->gen;
    mb->recv_start = in->recv_start;
    mb->recv_end = recv_end;
    pp_stage_queue_push(s, mb);
}

static void fwd_message(void *ud, struct pp_rpc_stream *st, const uint8_t *data, size_t len)
{
    (void)st;
    struct pp_stage_inbound *in = ud;
    if (atomic_load(&in->finished))
        return;
    if (atomic_load(&in->s->draining)) {
        fail(in, PP_ERR_UNAVAILABLE, "this stage is shutting down and takes no more microbatches");
        return;
    }
    ProtobufCMessage *m = NULL;
    if (pp_rpc_unpack(&ppserve__v1__hop_message__descriptor, data, len, &m) != PP_OK) {
        fail(in, PP_ERR_INVALID_ARG, "expected a ppserve.v1.HopMessage, got %zu bytes that do not "
             "parse as one", len);
        return;
    }
    const Ppserve__V1__HopMessage *msg = (const Ppserve__V1__HopMessage *)m;
    switch (msg->body_case) {
    case PPSERVE__V1__HOP_MESSAGE__BODY_HANDSHAKE:
        on_handshake(in, msg->handshake);
        break;
    case PPSERVE__V1__HOP_MESSAGE__BODY_CHUNK:
        on_chunk(in, msg->chunk);
        break;
    default:
        fail(in, PP_ERR_INVALID_ARG, "expected a HopMessage with a handshake or a chunk, got an "
             "empty one");
        break;
    }
    protobuf_c_message_free_unpacked(m, NULL);
}

static void fwd_half_close(void *ud, struct pp_rpc_stream *st)
{
    struct pp_stage_inbound *in = ud;
    struct pp_stage *s = in->s;
    if (in->assembler.hdr)
        PP_WARN("inbound hop closed inside microbatch %llu (chunk %u expected): it is dropped",
                (unsigned long long)in->assembler.hdr->microbatch_id, in->assembler.next_index);
    pthread_mutex_lock(&s->q_mu);
    in->half_closed = 1;
    int finish_now = in->pending == 0 && !atomic_exchange(&in->finished, 1);
    pthread_mutex_unlock(&s->q_mu);
    if (finish_now)
        pp_rpc_stream_finish(st, PP_OK, NULL);
}

static void fwd_end(void *ud, struct pp_rpc_stream *st, pp_status status)
{
    (void)st;
    struct pp_stage_inbound *in = ud;
    struct pp_stage *s = in->s;
    if (status != PP_OK)
        PP_INFO("inbound hop ended: detail=\"%s\"", pp_error_detail());
    pthread_mutex_lock(&s->q_mu);
    in->ended = 1;
    in->paused = 0;
    int free_it = pp_stage_inbound_unref_locked(in);
    pthread_mutex_unlock(&s->q_mu);
    if (free_it)
        pp_stage_inbound_free(in);
}

const struct pp_rpc_stream_cbs pp_stage_forward_cbs = {fwd_message, fwd_half_close, fwd_end};

void *pp_stage_forward_open(void *ud, struct pp_rpc_stream *st)
{
    struct pp_stage *s = ud;
    struct pp_stage_inbound *in = pp_calloc(PP_MEM_RPC, 1, sizeof(*in));
    if (!in) {
        pp_error(PP_ERR_NOMEM, "no memory for a new stream");
        return NULL;
    }
    in->s = s;
    in->st = st;
    in->refs = 1;
    pp_hop_assembler_init(&in->assembler, 0, 0);
    pthread_mutex_lock(&s->q_mu);
    in->next = s->inbound;
    if (s->inbound)
        s->inbound->prev = in;
    s->inbound = in;
    pthread_mutex_unlock(&s->q_mu);
    pthread_mutex_lock(&s->info_mu);
    int assigned = s->info.assigned;
    pthread_mutex_unlock(&s->info_mu);
    if (atomic_load(&s->draining))
        fail(in, PP_ERR_UNAVAILABLE, "this stage is shutting down");
    else if (!assigned)
        fail(in, PP_ERR_PRECONDITION, "this stage has no assignment yet (expected an Assign from "
             "the coordinator before the hop opens)");
    return in;
}
