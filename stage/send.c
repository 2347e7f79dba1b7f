/* The outgoing hop of a stage: one long-lived stream opened by Assign. To the next stage it is
 * Stage/Forward, opened with a Handshake and carrying microbatch chunks (the HopAcks that come back
 * are counted); on the last stage it is Coordinator/Deliver carrying Results. Sends are queued by
 * the rpc layer and written while the next microbatch computes (the overlap); a send first waits
 * while too many messages are unwritten, so a slow next hop slows this stage down instead of
 * filling its memory. */
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"
#include "stage/stage.h"

static void out_message(void *ud, struct pp_rpc_stream *st, const uint8_t *data, size_t len)
{
    (void)st;
    struct pp_stage_out *o = ud;
    if (o->deliver)
        return; /* ResultsAck: empty */
    ProtobufCMessage *m = NULL;
    if (pp_rpc_unpack(&ppserve__v1__hop_ack__descriptor, data, len, &m) != PP_OK) {
        PP_WARN("hop ack malformed: next=%s bytes=%zu", o->target, len);
        return;
    }
    const Ppserve__V1__HopAck *a = (const Ppserve__V1__HopAck *)m;
    pthread_mutex_lock(&o->mu);
    o->acks++;
    o->ack_errors += a->code != 0;
    pthread_mutex_unlock(&o->mu);
    if (a->code != 0)
        PP_WARN("hop ack error: next=%s microbatch=%llu code=%s message=\"%s\"", o->target,
                (unsigned long long)a->microbatch_id, pp_rpc_code_name((int)a->code),
                a->message ? a->message : "");
    protobuf_c_message_free_unpacked(m, NULL);
}

static void out_end(void *ud, struct pp_rpc_stream *st, pp_status status)
{
    (void)st;
    struct pp_stage_out *o = ud;
    struct pp_stage *s = o->s;
    char detail[400], target[PP_CFG_STR_MAX];
    snprintf(detail, sizeof(detail), "%s",
             status != PP_OK ? pp_error_detail()
                             : "it is stopping (it ended the stream in order)");
    snprintf(target, sizeof(target), "%s", o->target);
    pthread_mutex_lock(&o->mu);
    int broken = !o->closing;
    if (broken) {
        o->broken = 1;
        snprintf(o->why, sizeof(o->why), "next hop %s: %s", target, detail);
    }
    o->ended = 1;
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
    /* from here on the closer may free o: only locals */
    if (broken) {
        /* the coordinator reports the pipeline failure; here it is one fact among several. A peer
         * that ended the stream with OK stopped in order (a coordinator that is stopping): news,
         * not trouble */
        if (status == PP_OK)
            PP_INFO("hop ended: next=%s detail=\"%s\"", target, detail);
        else
            PP_WARN("hop broken: next=%s detail=\"%s\"", target, detail);
        pthread_mutex_lock(&s->stats_mu);
        snprintf(s->hop_error, sizeof(s->hop_error), "next hop %s: %s", target, detail);
        pthread_mutex_unlock(&s->stats_mu);
    } else if (status != PP_OK) {
        PP_DEBUG("hop closed with status: next=%s detail=\"%s\"", target, detail);
    }
}

static const struct pp_rpc_stream_cbs out_cbs = {out_message, NULL, out_end};

static void out_free(struct pp_stage_out *o)
{
    pthread_mutex_destroy(&o->mu);
    pthread_cond_destroy(&o->cv);
    pp_free(PP_MEM_MISC, o);
}

pp_status pp_stage_out_open(struct pp_stage *s, const char *target, int deliver,
                            const char *model_id, int32_t next_layer, size_t max_queued,
                            struct pp_stage_out **out)
{
    struct pp_stage_out *o = pp_calloc(PP_MEM_MISC, 1, sizeof(*o));
    if (!o)
        return pp_error(PP_ERR_NOMEM, "no memory for the outgoing hop");
    o->s = s;
    o->refs = 1;
    o->deliver = deliver;
    o->max_queued = max_queued;
    snprintf(o->target, sizeof(o->target), "%s", target);
    pthread_mutex_init(&o->mu, NULL);
    pp_stage_cond_init(&o->cv);
    const char *method = deliver ? "/ppserve.v1.Coordinator/Deliver" : "/ppserve.v1.Stage/Forward";
    pp_status st = pp_rpc_channel_new(target, &o->ch);
    if (st != PP_OK) {
        out_free(o);
        return pp_stage_error_wrap(st, "next hop %s", target);
    }
    if ((st = pp_rpc_stream_open(o->ch, method, 0, &out_cbs, o, &o->st)) != PP_OK) {
        pp_rpc_channel_free(o->ch);
        out_free(o);
        return pp_stage_error_wrap(st, "next hop %s", target);
    }
    if (!deliver) {
        struct pp_buf hs = {0};
        st = pp_hop_handshake_pack(PP_STAGE_PROTOCOL, model_id, next_layer, &hs);
        if (st == PP_OK)
            st = pp_rpc_stream_send(o->st, hs.data, hs.len);
        pp_buf_free(&hs);
        if (st != PP_OK) {
            char why[400];
            snprintf(why, sizeof(why), "%s", pp_error_detail());
            pp_stage_out_close(o, 1000);
            return pp_error(PP_ERR_UNAVAILABLE, "next hop %s: handshake not sent: %s", target,
                            why);
        }
    }
    *out = o;
    return PP_OK;
}

int pp_stage_out_broken(struct pp_stage_out *o, char *why, size_t n)
{
    pthread_mutex_lock(&o->mu);
    int broken = o->broken;
    if (broken && why)
        snprintf(why, n, "%s", o->why);
    pthread_mutex_unlock(&o->mu);
    return broken;
}

void pp_stage_out_ref(struct pp_stage_out *o)
{
    pthread_mutex_lock(&o->mu);
    o->refs++;
    pthread_mutex_unlock(&o->mu);
}

/* The last reference is gone: the stream, the channel and o itself go, once the call is over. */
static void out_destroy(struct pp_stage_out *o)
{
    pthread_mutex_lock(&o->mu);
    int ended = o->ended;
    pthread_mutex_unlock(&o->mu);
    pp_rpc_stream_release(o->st);
    if (!ended) {
        /* its callbacks may still come: keep what they touch rather than free it under them */
        PP_ERROR("hop did not end after cancel: next=%s (its memory is kept)", o->target);
        return;
    }
    pp_rpc_channel_free(o->ch);
    out_free(o);
}

void pp_stage_out_unref(struct pp_stage_out *o)
{
    if (!o)
        return;
    pthread_mutex_lock(&o->mu);
    int last = --o->refs == 0;
    pthread_mutex_unlock(&o->mu);
    if (last)
        out_destroy(o);
}

pp_status pp_stage_out_send(struct pp_stage_out *o, struct pp_rpc_msg *msg)
{
    long us = 100;
    while (pp_rpc_stream_queued(o->st) > o->max_queued) {
        pthread_mutex_lock(&o->mu);
        int stop = o->ended || o->closing;
        pthread_mutex_unlock(&o->mu);
        if (stop || atomic_load(&o->s->abandon))
            break;
        pp_stage_sleep_us(us);
        if (us < 1000)
            us *= 2;
    }
    char why[768];
    if (pp_stage_out_broken(o, why, sizeof(why))) {
        pp_rpc_msg_free(msg);
        return pp_error(PP_ERR_UNAVAILABLE, "%s", why);
    }
    if (pp_rpc_stream_send_msg(o->st, msg) != PP_OK)
        return pp_error(PP_ERR_UNAVAILABLE, "next hop %s: the stream is closed", o->target);
    return PP_OK;
}

/* Waits for on_end until deadline (monotonic); returns whether it came. */
static int wait_end(struct pp_stage_out *o, double deadline)
{
    pthread_mutex_lock(&o->mu);
    while (!o->ended && pp_stage_cond_wait_until(&o->cv, &o->mu, deadline))
        ;
    int ended = o->ended;
    pthread_mutex_unlock(&o->mu);
    return ended;
}

void pp_stage_out_close(struct pp_stage_out *o, int timeout_ms)
{
    if (!o)
        return;
    pthread_mutex_lock(&o->mu);
    o->closing = 1;
    pthread_mutex_unlock(&o->mu);
    pp_rpc_stream_close_send(o->st);
    if (!wait_end(o, pp_clock_mono() + timeout_ms / 1000.0)) {
        PP_WARN("hop close timed out: next=%s waited_ms=%d: cancelling", o->target, timeout_ms);
        pp_rpc_stream_cancel(o->st);
        wait_end(o, pp_clock_mono() + 2.0);
    }
    pthread_mutex_lock(&o->mu);
    uint64_t acks = o->acks, errors = o->ack_errors;
    pthread_mutex_unlock(&o->mu);
    PP_INFO("hop closed: next=%s acks=%llu ack_errors=%llu", o->target,
            (unsigned long long)acks, (unsigned long long)errors);
    pp_stage_out_unref(o);
}
