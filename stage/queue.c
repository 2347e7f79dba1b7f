/* The bounded FIFO between the inbound streams and the compute thread, and the lifetime of inbound
 * streams. All inbound streams share one queue of queue_depth microbatches: a stream whose push
 * fills it stops reading (pp_rpc_stream_pause), so HTTP/2 flow control stalls its sender, and the
 * compute thread resumes it once an item has left. A stream can push at most one item after the
 * queue is full, so the queue never holds more than queue_depth + (streams - 1) items.
 *
 * An inbound stream is freed when its call is over (on_end) and no queued or computing microbatch
 * refers to it any more; a stream the sender half-closed is finished with OK after its last ack. */
#include "common/alloc.h"
#include "common/log.h"
#include "stage/stage.h"

void pp_stage_mb_free(struct pp_stage_mb *mb)
{
    if (!mb)
        return;
    if (mb->hdr)
        protobuf_c_message_free_unpacked(&mb->hdr->base, NULL);
    pp_buf_free(&mb->payload);
    pp_free(PP_MEM_RPC, mb);
}

int pp_stage_inbound_unref_locked(struct pp_stage_inbound *in)
{
    if (--in->refs > 0)
        return 0;
    struct pp_stage *s = in->s;
    if (in->prev)
        in->prev->next = in->next;
    else
        s->inbound = in->next;
    if (in->next)
        in->next->prev = in->prev;
    in->prev = in->next = NULL;
    return 1;
}

void pp_stage_inbound_free(struct pp_stage_inbound *in)
{
    pp_hop_assembler_reset(&in->assembler);
    pp_buf_free(&in->assembler.payload);
    pp_rpc_stream_release(in->st);
    pp_free(PP_MEM_RPC, in);
}

void pp_stage_queue_push(struct pp_stage *s, struct pp_stage_mb *mb)
{
    struct pp_stage_inbound *in = mb->in;
    mb->next = NULL;
    pthread_mutex_lock(&s->q_mu);
    in->refs++;
    in->pending++;
    if (s->q_tail)
        s->q_tail->next = mb;
    else
        s->q_head = mb;
    s->q_tail = mb;
    s->q_len++;
    if (s->q_len >= s->cfg.queue_depth && !in->paused && !in->ended) {
        in->paused = 1;
        pp_rpc_stream_pause(in->st);
        PP_DEBUG("queue full: depth=%d, pausing a stream", s->q_len);
    }
    pthread_cond_signal(&s->q_cv);
    pthread_mutex_unlock(&s->q_mu);
}

struct pp_stage_mb *pp_stage_queue_pop(struct pp_stage *s)
{
    pthread_mutex_lock(&s->q_mu);
    while (!s->q_head && !s->q_stop)
        pthread_cond_wait(&s->q_cv, &s->q_mu);
    struct pp_stage_mb *mb = NULL;
    if (!s->q_stop) {
        mb = s->q_head;
        s->q_head = mb->next;
        if (!s->q_head)
            s->q_tail = NULL;
        s->q_len--;
        mb->next = NULL;
        s->busy = 1;
        if (s->q_len < s->cfg.queue_depth)
            for (struct pp_stage_inbound *in = s->inbound; in; in = in->next)
                if (in->paused) {
                    in->paused = 0;
                    pp_rpc_stream_resume(in->st);
                }
    }
    pthread_mutex_unlock(&s->q_mu);
    return mb;
}

/* Drops mb's hold on its stream; with q_mu held. Returns the stream to finish with OK (half-closed
 * and now without work) in *finish, and whether it must be freed. */
static int release_mb_locked(struct pp_stage_mb *mb, struct pp_stage_inbound **finish)
{
    struct pp_stage_inbound *in = mb->in;
    in->pending--;
    *finish = NULL;
    if (in->half_closed && in->pending == 0 && !in->ended && !atomic_load(&in->finished)) {
        atomic_store(&in->finished, 1);
        *finish = in;
    }
    return pp_stage_inbound_unref_locked(in);
}

void pp_stage_queue_done(struct pp_stage *s, struct pp_stage_mb *mb)
{
    struct pp_stage_inbound *in = mb->in, *finish;
    pthread_mutex_lock(&s->q_mu);
    s->busy = 0;
    int free_it = release_mb_locked(mb, &finish);
    if (finish)
        pp_rpc_stream_finish(finish->st, PP_OK, NULL); /* after the acks already queued */
    pthread_cond_broadcast(&s->idle_cv);
    pthread_mutex_unlock(&s->q_mu);
    if (free_it)
        pp_stage_inbound_free(in);
    pp_stage_mb_free(mb);
}

void pp_stage_queue_stop(struct pp_stage *s)
{
    pthread_mutex_lock(&s->q_mu);
    s->q_stop = 1;
    pthread_cond_broadcast(&s->q_cv);
    pthread_mutex_unlock(&s->q_mu);
}

int pp_stage_queue_wait_idle(struct pp_stage *s, double deadline)
{
    pthread_mutex_lock(&s->q_mu);
    while ((s->q_head || s->busy) && pp_stage_cond_wait_until(&s->idle_cv, &s->q_mu, deadline))
        ;
    int idle = !s->q_head && !s->busy;
    pthread_mutex_unlock(&s->q_mu);
    return idle;
}

void pp_stage_queue_flush(struct pp_stage *s, pp_status status, const char *message)
{
    for (;;) {
        pthread_mutex_lock(&s->q_mu);
        struct pp_stage_mb *mb = s->q_head;
        if (mb) {
            s->q_head = mb->next;
            if (!s->q_head)
                s->q_tail = NULL;
            s->q_len--;
        }
        pthread_mutex_unlock(&s->q_mu);
        if (!mb)
            return;
        pp_stage_ack(mb->in, mb->hdr->microbatch_id, status, message);
        struct pp_stage_inbound *in = mb->in, *finish;
        pthread_mutex_lock(&s->q_mu);
        int free_it = release_mb_locked(mb, &finish);
        if (finish)
            pp_rpc_stream_finish(finish->st, PP_OK, NULL);
        pthread_mutex_unlock(&s->q_mu);
        if (free_it)
            pp_stage_inbound_free(in);
        pp_stage_mb_free(mb);
    }
}

size_t pp_stage_queue_len(struct pp_stage *s)
{
    pthread_mutex_lock(&s->q_mu);
    size_t n = (size_t)s->q_len;
    pthread_mutex_unlock(&s->q_mu);
    return n;
}
