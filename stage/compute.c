/* The compute thread: the one thread that drives the executor. It pops microbatches in arrival
 * order, runs the layer range over them, sends the result on (activations to the next stage, or
 * sampled tokens to the coordinator from the last stage) with this stage's span appended, and
 * acks each microbatch on the stream it came from. A failed microbatch travels on as its header
 * with `error` set, so the coordinator learns about it where it learns about every result.
 *
 * The executor work happens under mu; the outgoing messages are packed there too, and sent after
 * mu is released, so a slow next hop holds back this thread but never an Assign or a Release. */
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"
#include "stage/stage.h"

/* Packed messages for the outgoing hop, in order (sent ones are NULL: the hop took them). */
struct outbox {
    struct pp_rpc_msg **msgs; /* [n] */
    size_t n, cap;
    uint64_t payload_bytes; /* activation bytes among them (bytes_out) */
};

/* Packs msg straight into the buffer it will be sent from. */
static pp_status outbox_add(void *ud, const ProtobufCMessage *msg)
{
    struct outbox *o = ud;
    if (o->n == o->cap) {
        size_t cap = o->cap ? 2 * o->cap : 8;
        struct pp_rpc_msg **m = pp_calloc(PP_MEM_RPC, cap, sizeof(*m));
        if (!m)
            return pp_error(PP_ERR_NOMEM, "no memory for %zu outgoing messages", cap);
        if (o->n)
            memcpy(m, o->msgs, o->n * sizeof(*m));
        pp_free(PP_MEM_RPC, o->msgs);
        o->msgs = m;
        o->cap = cap;
    }
    pp_status st = pp_rpc_msg_pack(msg, &o->msgs[o->n]);
    if (st == PP_OK)
        o->n++;
    return st;
}

static void outbox_free(struct outbox *o)
{
    for (size_t i = 0; i < o->n; i++)
        pp_rpc_msg_free(o->msgs[i]);
    pp_free(PP_MEM_RPC, o->msgs);
    memset(o, 0, sizeof(*o));
}

/* Grows a scratch buffer to hold n elements of size elem. */
static int grow(void **buf, size_t *cap, size_t n, size_t elem, enum pp_mem_category cat)
{
    if (n <= *cap)
        return 1;
    void *p = pp_alloc_aligned(cat, n * elem);
    if (!p)
        return 0;
    pp_free(cat, *buf);
    *buf = p;
    *cap = n;
    return 1;
}

/* The microbatch's spans followed by this stage's own, for the outgoing message. */
struct spans {
    Ppserve__V1__StageSpan own;
    Ppserve__V1__StageSpan **list; /* [n] */
    size_t n;
};

static pp_status spans_make(struct spans *sp, const Ppserve__V1__MicrobatchHeader *h)
{
    sp->n = h->n_spans + 1;
    sp->list = pp_alloc(PP_MEM_MISC, sp->n * sizeof(*sp->list));
    if (!sp->list)
        return pp_error(PP_ERR_NOMEM, "no memory for the spans of microbatch %llu",
                        (unsigned long long)h->microbatch_id);
    for (size_t i = 0; i < h->n_spans; i++)
        sp->list[i] = h->spans[i];
    sp->list[h->n_spans] = &sp->own;
    return PP_OK;
}

/* Packs the result of a first or middle stage: activations [n, dim] (error NULL), or the header
 * alone with the error. */
static pp_status pack_hidden(struct pp_stage_assignment *a, const Ppserve__V1__MicrobatchHeader *in,
                             struct spans *sp, int64_t n_rows, const char *error,
                             uint32_t error_code, struct outbox *box)
{
    Ppserve__V1__MicrobatchHeader h = PPSERVE__V1__MICROBATCH_HEADER__INIT;
    int64_t shape[2] = {n_rows, a->dim};
    h.microbatch_id = in->microbatch_id;
    h.n_parts = in->n_parts;
    h.parts = in->parts;
    h.dtype = PPSERVE__V1__DTYPE__DTYPE_F32;
    h.n_shape = 2;
    h.shape = shape;
    h.n_spans = sp->n;
    h.spans = sp->list;
    h.error = (char *)(error ? error : "");
    h.error_code = error_code;
    size_t bytes = error ? 0 : (size_t)n_rows * (size_t)a->dim * sizeof(float);
    box->payload_bytes = bytes;
    return pp_hop_encode(&h, error ? NULL : a->hidden, bytes, outbox_add, box);
}

/* Packs the last stage's Results: the sampled tokens (out non-NULL) or the error. */
static pp_status pack_results(const struct pp_stage_assignment *a,
                              const Ppserve__V1__MicrobatchHeader *in, struct spans *sp,
                              const struct pp_stage_sampled *out, const char *error,
                              uint32_t error_code, struct outbox *box)
{
    Ppserve__V1__Results r = PPSERVE__V1__RESULTS__INIT;
    r.microbatch_id = in->microbatch_id;
    r.stage_id = a->stage_id;
    if (out) {
        r.n_tokens = out->n;
        r.tokens = out->ptrs;
    }
    r.n_spans = sp->n;
    r.spans = sp->list;
    r.error = (char *)(error ? error : "");
    r.error_code = error_code;
    return outbox_add(box, &r.base);
}

/* Runs the executor over mb; on error msg holds the detail. Fills the span's compute times. */
static pp_status compute(struct pp_stage *s, struct pp_stage_assignment *a, struct pp_stage_mb *mb,
                         Ppserve__V1__StageSpan *span, struct pp_stage_sampled *sampled,
                         int64_t *n_rows, char *msg, size_t msg_len)
{
    const Ppserve__V1__MicrobatchHeader *h = mb->hdr;
    int64_t rows = h->shape[0];
    size_t n_want = 0;
    pp_status st = PP_OK;
    *n_rows = rows;
    pp_error_clear();
    if (!grow((void **)&a->seqs, &a->seqs_cap, h->n_parts, sizeof(*a->seqs), PP_MEM_MISC))
        st = pp_error(PP_ERR_NOMEM, "no memory for %zu sequences", h->n_parts);
    for (size_t i = 0; st == PP_OK && i < h->n_parts; i++) {
        const Ppserve__V1__SeqPart *p = h->parts[i];
        a->seqs[i] = (struct pp_exec_seq){p->seq_id, p->pos, p->n_tokens,
                                          a->last && p->want_logits};
        n_want += a->last && p->want_logits;
    }
    if (st == PP_OK && a->last && !grow((void **)&a->logits, &a->logits_cap,
                                        (n_want ? n_want : 1) * (size_t)a->vocab, sizeof(float),
                                        PP_MEM_ACTIVATIONS))
        st = pp_error(PP_ERR_NOMEM, "no memory for %zu rows of logits", n_want);
    if (st == PP_OK && !a->last && !grow((void **)&a->hidden, &a->hidden_cap,
                                         (size_t)rows * (size_t)a->dim, sizeof(float),
                                         PP_MEM_ACTIVATIONS))
        st = pp_error(PP_ERR_NOMEM, "no memory for %lld rows of activations", (long long)rows);
    if (st == PP_OK && a->last)
        st = pp_stage_sample_prepare(a->history, h);
    span->compute_start = pp_clock_real();
    double t0 = pp_clock_mono();
    if (st == PP_OK) {
        struct pp_exec_batch b = {(int32_t)h->n_parts, a->seqs, NULL, NULL};
        if (a->first)
            b.tokens = (const int32_t *)mb->payload.data;
        else
            b.hidden = (const float *)mb->payload.data;
        st = pp_executor_forward(a->ex, &b, a->last ? NULL : a->hidden, a->last ? a->logits : NULL);
    }
    if (st == PP_OK && a->last)
        st = pp_stage_sample(a->history, a->sampler, a->vocab, h, a->logits, sampled);
    span->compute_end = pp_clock_real();
    double dt = pp_clock_mono() - t0;
    if (st != PP_OK)
        snprintf(msg, msg_len, "stage %u (layers %d..%d): %s", a->index, a->first_layer,
                 a->last_layer, pp_error_detail()[0] ? pp_error_detail() : pp_strerror(st));
    int64_t reduced = pp_executor_bytes_reduced(a->ex);
    uint64_t reduced_new = (uint64_t)(reduced - a->reduced_seen);
    a->reduced_seen = reduced;
    pthread_mutex_lock(&s->stats_mu);
    s->busy_seconds += dt;
    if (st == PP_OK)
        s->tokens += (uint64_t)rows;
    s->bytes_reduced += reduced_new;
    pthread_mutex_unlock(&s->stats_mu);
    return st;
}

/* Computes one microbatch under mu and packs what goes on; *out receives the hop to send it on
 * (with a reference) when there is something to send. Returns the status its ack carries. */
static pp_status process(struct pp_stage *s, struct pp_stage_mb *mb, struct outbox *box,
                         struct pp_stage_out **out, char *msg, size_t msg_len)
{
    struct pp_stage_assignment *a = s->asg;
    const Ppserve__V1__MicrobatchHeader *h = mb->hdr;
    *out = NULL;
    if (!a || a->gen != mb->gen) {
        snprintf(msg, msg_len, "microbatch %llu: this stage was reassigned after it arrived",
                 (unsigned long long)h->microbatch_id);
        return PP_ERR_PRECONDITION;
    }
    /* with the hop down there is no one to pass a result to: leave the KV as it was */
    if (pp_stage_out_broken(a->out, msg, msg_len))
        return PP_ERR_UNAVAILABLE;
    struct spans sp = {0};
    pp_status st = spans_make(&sp, h);
    if (st != PP_OK) {
        snprintf(msg, msg_len, "%s", pp_error_detail());
        return st;
    }
    sp.own = (Ppserve__V1__StageSpan)PPSERVE__V1__STAGE_SPAN__INIT;
    sp.own.stage = a->index;
    sp.own.recv_start = mb->recv_start;
    sp.own.recv_end = mb->recv_end;

    pp_status ack = PP_OK;
    char err[1024] = "";
    const char *error = NULL;
    uint32_t error_code = 0;
    struct pp_stage_sampled sampled = {0};
    int64_t rows = h->n_shape ? h->shape[0] : 0;
    if (h->error && h->error[0]) { /* failed upstream: pass it on untouched */
        sp.own.compute_start = sp.own.compute_end = pp_clock_real();
        error = h->error;
        error_code = h->error_code;
    } else {
        pp_status cst = compute(s, a, mb, &sp.own, &sampled, &rows, err, sizeof(err));
        if (cst != PP_OK) {
            ack = cst;
            error = err;
            error_code = (uint32_t)pp_rpc_code_from_status(cst);
            PP_WARN("microbatch failed: id=%llu code=%s detail=\"%s\"",
                    (unsigned long long)h->microbatch_id, pp_rpc_code_name((int)error_code), err);
        }
    }
    pp_status packed =
        a->last ? pack_results(a, h, &sp, error ? NULL : &sampled, error, error_code, box)
                : pack_hidden(a, h, &sp, rows, error, error_code, box);
    if (packed != PP_OK) {
        if (ack == PP_OK) {
            ack = packed;
            snprintf(err, sizeof(err), "%s", pp_error_detail());
        }
        outbox_free(box);
    } else {
        *out = a->out;
        pp_stage_out_ref(a->out);
    }
    if (ack != PP_OK)
        snprintf(msg, msg_len, "%s", err);
    pp_stage_sampled_free(&sampled);
    pp_free(PP_MEM_MISC, sp.list);
    return ack;
}

static void *compute_main(void *arg)
{
    struct pp_stage *s = arg;
    char msg[1024];
    struct pp_stage_mb *mb;
    while ((mb = pp_stage_queue_pop(s)) != NULL) {
        msg[0] = '\0';
        struct outbox box = {0};
        struct pp_stage_out *out = NULL;
        pthread_mutex_lock(&s->mu);
        pp_status st = process(s, mb, &box, &out, msg, sizeof(msg));
        pp_stage_update_stats(s);
        pthread_mutex_unlock(&s->mu);
        pp_status sent = PP_OK;
        for (size_t i = 0; out && i < box.n && sent == PP_OK; i++) {
            sent = pp_stage_out_send(out, box.msgs[i]);
            box.msgs[i] = NULL; /* the hop's now, sent or not */
        }
        if (out && sent == PP_OK) {
            pthread_mutex_lock(&s->stats_mu);
            s->bytes_out += box.payload_bytes;
            pthread_mutex_unlock(&s->stats_mu);
        } else if (out && st == PP_OK) {
            st = PP_ERR_UNAVAILABLE;
            snprintf(msg, sizeof(msg), "%s", pp_error_detail());
        }
        pp_stage_out_unref(out);
        outbox_free(&box);
        pp_stage_ack(mb->in, mb->hdr->microbatch_id, st, msg);
        pp_stage_queue_done(s, mb);
    }
    return NULL;
}

pp_status pp_stage_compute_start(struct pp_stage *s)
{
    if (pthread_create(&s->compute_thread, NULL, compute_main, s) != 0)
        return pp_error(PP_ERR_NOMEM, "cannot start the compute thread");
    pthread_setname_np(s->compute_thread, "compute");
    s->compute_started = 1;
    return PP_OK;
}

void pp_stage_compute_stop(struct pp_stage *s)
{
    pp_stage_queue_stop(s);
    if (s->compute_started)
        pthread_join(s->compute_thread, NULL);
    s->compute_started = 0;
}
