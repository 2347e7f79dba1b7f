/* Continuous batching over the pipeline (everything here runs with co->mu held).
 *
 * A sequence holds a prompt and the tokens generated so far; n_fed of them have been sent into the
 * pipeline. Prefill chunks of one sequence may follow each other in consecutive microbatches,
 * because every stage computes microbatches in the order they arrive; a decode step needs the token
 * the previous step sampled, so it waits for that step's results. The scheduler keeps up to
 * max_in_flight (>= P) microbatches in the pipeline and spreads the waiting tokens over the free
 * slots (each microbatch up to max_batch_tokens), so that P stages always have work. Admission
 * reserves a sequence's whole KV (prompt + max_tokens) on every stage up front, so a stage never
 * runs out of blocks mid-generation.
 *
 * Failover: when the pipeline goes down, the requests it had accepted wait for the next one (up to
 * failover_wait_ms). A request that was running is then prefilled again with its prompt and the
 * tokens it has generated (prefill_end), and its last position samples the next token with the
 * same (seed, step) and history as before, so the client's stream goes on with the tokens of an
 * undisturbed run: none lost, none repeated. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/rpc/hop.h"
#include "coordinator/coordinator.h"

static void list_remove(struct co_request *r)
{
    r->prev->next = r->next;
    r->next->prev = r->prev;
    r->prev = r->next = r;
}

static void list_push_front(struct co_request *head, struct co_request *r)
{
    r->prev = head;
    r->next = head->next;
    head->next->prev = r;
    head->next = r;
}

static void list_push_back(struct co_request *head, struct co_request *r)
{
    r->prev = head->prev;
    r->next = head;
    head->prev->next = r;
    head->prev = r;
}

/* Frees a finished request once nothing refers to it any more, after queueing its KV release. */
static void maybe_retire(struct coordinator *co, struct co_request *req)
{
    if (req->state != CO_REQ_DONE || req->in_flight > 0)
        return;
    if (!req->released) {
        if (req->kv_reserved && req->n_fed > 0)
            co_release_queue(co, req->seq_id, req->kv_blocks);
        else if (req->kv_reserved)
            co->kv_blocks_reserved -= req->kv_blocks; /* the stages never saw it */
        req->kv_reserved = 0;
    }
    req->released = 1;
    if (req->client_gone)
        co_request_free(req);
}

/* Ends a request: st != PP_OK sends that status (unless the client is gone). */
static void request_done(struct coordinator *co, struct co_request *req, pp_status st,
                         const char *why)
{
    if (req->state == CO_REQ_DONE)
        return;
    if (req->state == CO_REQ_RUNNING) {
        co->n_running--; /* its KV stays reserved until the stages have released it */
    } else {
        co->n_queued--;
    }
    list_remove(req);
    req->state = CO_REQ_DONE;
    if (st != PP_OK && !req->client_gone) {
        PP_DEBUG("request failed seq=%llu code=%s: %s", (unsigned long long)req->seq_id,
                 pp_rpc_code_name(pp_rpc_code_from_status(st)), why);
        pp_rpc_stream_finish(req->client, st, why);
    }
}

void co_request_enqueue(struct coordinator *co, struct co_request *req)
{
    req->seq_id = ++co->next_seq_id;
    req->prefill_end = req->n_prompt;
    req->state = CO_REQ_QUEUED;
    req->t_arrival = pp_clock_mono();
    req->deadline = req->t_arrival + (double)co->cfg.request_timeout_ms / 1000.0;
    list_push_back(&co->queued, req);
    co->n_queued++;
    co_schedule(co);
}

void co_request_client_gone(struct coordinator *co, struct co_request *req)
{
    req->client_gone = 1;
    if (req->state != CO_REQ_DONE) {
        PP_INFO("request cancelled seq=%llu generated=%d (the client went away)",
                (unsigned long long)req->seq_id, req->n_gen);
        request_done(co, req, PP_ERR_CANCELLED, "cancelled");
    }
    maybe_retire(co, req);
    co_schedule(co);
}

/* A request against the pipeline it is about to join. One accepted by this pipeline always fits
 * (Generate checked it); one held through a failover may not: the pipeline formed since may hold
 * less KV or a shorter context. Fails the request when it does not fit. */
static int fits_again(struct coordinator *co, struct co_request *req)
{
    char why[256];
    pp_status st = PP_OK;
    if (req->kv_blocks > co->kv_blocks_cap) {
        snprintf(why, sizeof(why), "the pipeline formed again with room for %d KV blocks per "
                 "sequence; this request needs %d", co->kv_blocks_cap, req->kv_blocks);
        st = PP_ERR_EXHAUSTED;
    } else if (req->prefill_end >= co->max_context) {
        snprintf(why, sizeof(why), "the pipeline formed again with a context of %d tokens; this "
                 "request holds %d already", co->max_context, req->prefill_end);
        st = PP_ERR_OUT_OF_RANGE;
    }
    if (st == PP_OK)
        return 1;
    request_done(co, req, st, why);
    maybe_retire(co, req);
    return 0;
}

static void admit(struct coordinator *co)
{
    while (co->queued.next != &co->queued) {
        struct co_request *req = co->queued.next;
        if (!fits_again(co, req))
            continue; /* failed: the next one */
        if (co->n_running >= co->max_seqs ||
            co->kv_blocks_reserved + req->kv_blocks > co->kv_blocks_cap)
            return;
        list_remove(req);
        co->n_queued--;
        list_push_back(&co->running, req);
        co->n_running++;
        co->kv_blocks_reserved += req->kv_blocks;
        req->kv_reserved = 1;
        req->state = CO_REQ_RUNNING;
        if (req->t_admit == 0) /* the first admission (usage's prefill rate counts from it) */
            req->t_admit = pp_clock_mono();
        if (req->max_tokens == 0) {
            /* nothing to generate: done without touching the stages */
            req->t_first_token = req->t_last_token = req->t_admit;
            co_request_respond(co, req, 0, NULL, 0, 1, 0);
            request_done(co, req, PP_OK, NULL);
            maybe_retire(co, req);
        }
    }
}

static int32_t pending(const struct co_request *req)
{
    return req->n_prompt + req->n_gen - req->n_fed;
}

static pp_status emit_chunk(void *ud, const ProtobufCMessage *msg)
{
    return pp_rpc_stream_send_packed(ud, msg);
}

/* Packs and sends one microbatch to stage 0. */
static pp_status send_microbatch(struct coordinator *co, struct co_microbatch *mb,
                                 const int32_t *counts)
{
    Ppserve__V1__SeqPart *parts = pp_calloc(PP_MEM_RPC, (size_t)mb->n_parts, sizeof(*parts));
    Ppserve__V1__SeqPart **pp = pp_calloc(PP_MEM_RPC, (size_t)mb->n_parts, sizeof(*pp));
    int32_t *ids = pp_alloc(PP_MEM_RPC, (size_t)mb->n_tokens * sizeof(int32_t));
    pp_status st = PP_ERR_NOMEM;
    if (parts && pp && ids) {
        int32_t at = 0;
        for (int i = 0; i < mb->n_parts; i++) {
            struct co_request *req = mb->parts[i].req;
            Ppserve__V1__SeqPart *p = &parts[i];
            ppserve__v1__seq_part__init(p);
            pp[i] = p;
            p->seq_id = req->seq_id;
            p->pos = req->n_fed;
            p->n_tokens = counts[i];
            p->want_logits = mb->parts[i].want_logits;
            p->return_logits = req->return_logits && p->want_logits;
            p->sampling = &req->sampling;
            p->step = (uint32_t)req->n_gen;
            p->n_token_ids = (size_t)counts[i];
            p->token_ids = &req->tokens[req->n_fed];
            memcpy(ids + at, &req->tokens[req->n_fed], (size_t)counts[i] * sizeof(int32_t));
            at += counts[i];
        }
        Ppserve__V1__MicrobatchHeader hdr = PPSERVE__V1__MICROBATCH_HEADER__INIT;
        hdr.microbatch_id = mb->id;
        hdr.n_parts = (size_t)mb->n_parts;
        hdr.parts = pp;
        hdr.dtype = PPSERVE__V1__DTYPE__DTYPE_TOKEN_IDS;
        int64_t shape[1] = {mb->n_tokens};
        hdr.n_shape = 1;
        hdr.shape = shape;
        mb->sent = pp_clock_real();
        st = pp_hop_encode(&hdr, ids, (size_t)mb->n_tokens * sizeof(int32_t), emit_chunk,
                           co->first_hop);
    }
    pp_free(PP_MEM_RPC, parts);
    pp_free(PP_MEM_RPC, pp);
    pp_free(PP_MEM_RPC, ids);
    return st;
}

/* Forms one microbatch from the running sequences in list order and sends it: first up to
 * decode_cap decode steps, then prefill chunks up to prefill_budget tokens, the whole within
 * max_batch_tokens. Returns 0 when nothing was waiting. */
static int form_one(struct coordinator *co, int decode_cap, int32_t prefill_budget)
{
    int cap = co->n_running;
    struct co_mb_part *parts = pp_calloc(PP_MEM_MISC, (size_t)cap, sizeof(*parts));
    int32_t *counts = pp_calloc(PP_MEM_MISC, (size_t)cap, sizeof(*counts));
    if (!parts || !counts) {
        pp_free(PP_MEM_MISC, parts);
        pp_free(PP_MEM_MISC, counts);
        return 0;
    }
    int n = 0, n_decode = 0;
    int32_t used = 0, max = (int32_t)co->cfg.max_batch_tokens;
    for (struct co_request *r = co->running.next; r != &co->running && used < max; r = r->next) {
        if (r->n_fed < r->prefill_end || pending(r) <= 0 || n_decode >= decode_cap)
            continue;
        parts[n].req = r;
        parts[n].want_logits = 1;
        counts[n++] = 1;
        n_decode++;
        used++;
    }
    int32_t limit = used + prefill_budget < max ? used + prefill_budget : max;
    for (struct co_request *r = co->running.next; r != &co->running && used < limit; r = r->next) {
        if (r->n_fed >= r->prefill_end || n >= cap)
            continue;
        int32_t k = pending(r) < limit - used ? pending(r) : limit - used;
        parts[n].req = r;
        parts[n].want_logits = r->n_fed + k == r->n_prompt + r->n_gen;
        counts[n++] = k;
        used += k;
    }
    int sent = 0;
    if (n > 0) {
        struct co_microbatch *mb = &co->in_flight[co->n_in_flight];
        memset(mb, 0, sizeof(*mb));
        mb->id = ++co->next_mb_id;
        mb->n_parts = n;
        mb->parts = parts;
        mb->n_tokens = used;
        mb->has_decode = n_decode > 0;
        pp_status st = send_microbatch(co, mb, counts);
        if (st != PP_OK) {
            pp_free(PP_MEM_MISC, parts);
            pp_free(PP_MEM_MISC, counts);
            co_pipeline_down(co, "sending to stage 0 failed: %s", pp_error_detail());
            return 0;
        }
        co->n_in_flight++;
        for (int i = 0; i < n; i++) {
            struct co_request *r = parts[i].req;
            r->n_fed += counts[i];
            r->in_flight++;
            /* to the back of the line: the next microbatch starts with someone else */
            list_remove(r);
            list_push_back(&co->running, r);
        }
        sent = 1;
        parts = NULL;
    }
    pp_free(PP_MEM_MISC, parts);
    pp_free(PP_MEM_MISC, counts);
    return sent;
}

void co_schedule(struct coordinator *co)
{
    if (co->state != CO_SERVING)
        return;
    admit(co);
    while (co->n_in_flight < co->max_in_flight) {
        int64_t prefill = 0;
        int decoding = 0, decode_ready = 0;
        for (struct co_request *r = co->running.next; r != &co->running; r = r->next) {
            if (r->n_fed < r->prefill_end) {
                prefill += pending(r);
            } else {
                decoding++;
                decode_ready += pending(r) > 0;
            }
        }
        /* decoding sequences spread evenly over P microbatches: a group that once got most of
         * them would otherwise keep them (a step waits for its group's results), and the pipeline
         * would run at the pace of its largest group. P groups, not max_in_flight: a decode step
         * reads every weight once, so fewer, fuller microbatches read less per token; the slots
         * beyond P serve prefill chunks, which need not wait for results. And no more than P
         * decode groups in flight: a small group waits to merge with the next one that returns. */
        int groups = co->max_in_flight < co->n_stages ? co->max_in_flight : co->n_stages;
        if (groups < 1)
            groups = 1;
        int decode_cap = (decoding + groups - 1) / groups;
        int decode_groups = 0;
        for (int i = 0; i < co->n_in_flight; i++)
            decode_groups += co->in_flight[i].has_decode;
        if (decode_groups >= groups)
            decode_cap = 0;
        if (decode_cap > decode_ready)
            decode_cap = decode_ready;
        if (prefill == 0 && decode_cap == 0)
            return;
        /* prompt tokens spread over the free slots, so that every stage gets work at once */
        int64_t free_slots = co->max_in_flight - co->n_in_flight;
        int64_t prefill_budget = (prefill + free_slots - 1) / free_slots;
        if (prefill_budget > co->cfg.max_batch_tokens)
            prefill_budget = co->cfg.max_batch_tokens;
        if (!form_one(co, decode_cap, (int32_t)prefill_budget))
            return;
    }
}

/* One sampled token for req; mirrors model/generate.c so the pipeline stops where `ppserve run`
 * stops. */
static void accept_token(struct coordinator *co, struct co_request *req, int32_t id,
                         const float *logits)
{
    double now = pp_clock_mono();
    if (req->n_gen == 0)
        req->t_first_token = now;
    req->t_last_token = now;
    req->tokens[req->n_prompt + req->n_gen++] = id;
    co->tokens_generated++;
    int finish = 0, stop = 0;
    if (co->tok) {
        char piece[1024];
        int n = pp_tokenizer_piece(co->tok, id, piece, sizeof(piece));
        if (n > (int)sizeof(piece))
            n = (int)sizeof(piece);
        if (n > 0 && pp_textstream_push(&req->ts, piece, (size_t)n) == 1)
            finish = stop = 1;
    }
    if (!finish && !req->ignore_eos && pp_model_config_is_eos(&co->mcfg, id))
        finish = stop = 1;
    if (!finish && (req->n_gen >= req->max_tokens || req->n_prompt + req->n_gen >= co->max_context))
        finish = 1;
    co_request_respond(co, req, req->n_gen - 1, logits, logits ? 1 : 0, finish, stop);
    if (finish)
        request_done(co, req, PP_OK, NULL);
}

static void finish_microbatch(struct coordinator *co, struct co_microbatch *mb)
{
    for (int i = 0; i < mb->n_parts; i++) {
        mb->parts[i].req->in_flight--;
        maybe_retire(co, mb->parts[i].req);
    }
    pp_free(PP_MEM_MISC, mb->parts);
    mb->parts = NULL;
}

void co_handle_results(struct coordinator *co, const Ppserve__V1__Results *r)
{
    int at = -1;
    for (int i = 0; i < co->n_in_flight; i++)
        if (co->in_flight[i].id == r->microbatch_id)
            at = i;
    if (at < 0) {
        PP_WARN("results for an unknown microbatch=%llu (ignored)",
                (unsigned long long)r->microbatch_id);
        return;
    }
    struct co_microbatch mb = co->in_flight[at];
    memmove(&co->in_flight[at], &co->in_flight[at + 1],
            (size_t)(co->n_in_flight - at - 1) * sizeof(mb));
    co->n_in_flight--;
    co_trace_record(co, &mb, r);

    if (r->error && r->error[0]) {
        pp_status st =
            r->error_code ? pp_rpc_status_from_code((int)r->error_code) : PP_ERR_INTERNAL;
        PP_WARN("microbatch failed id=%llu: %s", (unsigned long long)mb.id, r->error);
        for (int i = 0; i < mb.n_parts; i++)
            request_done(co, mb.parts[i].req, st, r->error);
    } else {
        size_t t = 0;
        int32_t vocab = co->mcfg.vocab_size;
        for (int i = 0; i < mb.n_parts; i++) {
            struct co_request *req = mb.parts[i].req;
            if (!mb.parts[i].want_logits)
                continue;
            if (t >= r->n_tokens || r->tokens[t]->seq_id != req->seq_id) {
                request_done(co, req, PP_ERR_INTERNAL, "the last stage's results do not match "
                             "the microbatch it was sent");
                continue;
            }
            const Ppserve__V1__SampledToken *s = r->tokens[t++];
            if (req->state != CO_REQ_RUNNING)
                continue; /* cancelled or failed meanwhile */
            if (s->token < 0 || s->token >= vocab) {
                request_done(co, req, PP_ERR_INTERNAL, "the last stage sampled a token outside "
                             "the vocabulary");
                continue;
            }
            const float *logits = NULL;
            if (req->return_logits && s->logits.len == (size_t)vocab * sizeof(float))
                logits = (const float *)s->logits.data;
            accept_token(co, req, s->token, logits);
        }
    }
    finish_microbatch(co, &mb);
    co_schedule(co);
}

void co_fail_all(struct coordinator *co, pp_status st, const char *why)
{
    for (int i = 0; i < co->n_in_flight; i++)
        for (int k = 0; k < co->in_flight[i].n_parts; k++)
            request_done(co, co->in_flight[i].parts[k].req, st, why);
    struct co_request *heads[2] = {&co->running, &co->queued};
    for (int h = 0; h < 2; h++)
        while (heads[h]->next != heads[h]) {
            struct co_request *r = heads[h]->next;
            request_done(co, r, st, why);
            maybe_retire(co, r);
        }
    for (int i = 0; i < co->n_in_flight; i++)
        finish_microbatch(co, &co->in_flight[i]);
    co->n_in_flight = 0;
}

void co_hold_all(struct coordinator *co)
{
    for (int i = 0; i < co->n_in_flight; i++)
        finish_microbatch(co, &co->in_flight[i]);
    co->n_in_flight = 0;
    /* the running ones go first, in their order, ahead of those that were waiting */
    int held = 0;
    while (co->running.prev != &co->running) {
        struct co_request *r = co->running.prev;
        list_remove(r);
        co->n_running--;
        /* the stages' copies of its KV go with the old pipeline (a new assignment starts empty),
         * and so does its reservation; a new sequence id keeps a late Release of the old one from
         * touching it */
        r->kv_reserved = 0;
        r->seq_id = ++co->next_seq_id;
        r->n_fed = 0;
        r->in_flight = 0;
        r->prefill_end = r->n_prompt + r->n_gen;
        r->state = CO_REQ_QUEUED;
        list_push_front(&co->queued, r);
        co->n_queued++;
        held++;
    }
    if (co->n_queued > 0 && co->hold_until == 0) {
        co->hold_until = pp_clock_mono() + (double)co->cfg.failover_wait_ms / 1000.0;
        PP_INFO("failover: %d requests (%d of them running) wait up to %.1f s for the pipeline to "
                "form again", co->n_queued, held, (double)co->cfg.failover_wait_ms / 1000.0);
    }
}

void co_check_deadlines(struct coordinator *co)
{
    double now = pp_clock_mono();
    if (co->hold_until > 0 && co->state != CO_SERVING && now > co->hold_until) {
        co->hold_until = 0;
        if (co->n_queued > 0) { /* those that waited may all have been cancelled meanwhile */
            char why[sizeof(co->down_cause) + sizeof(co->last_failure) + 128];
            if (co->last_failure[0] && strcmp(co->down_cause, co->last_failure) != 0)
                snprintf(why, sizeof(why), "pipeline down: %s (it did not form again within "
                         "failover_wait_ms=%lld; the last attempt: %s)", co->down_cause,
                         (long long)co->cfg.failover_wait_ms, co->last_failure);
            else
                snprintf(why, sizeof(why), "pipeline down: %s (it did not form again within "
                         "failover_wait_ms=%lld)", co->down_cause,
                         (long long)co->cfg.failover_wait_ms);
            PP_WARN("failover: %d requests waited %.1f s for a new pipeline: they fail",
                    co->n_queued, (double)co->cfg.failover_wait_ms / 1000.0);
            co_fail_all(co, PP_ERR_UNAVAILABLE, why);
        }
    }
    struct co_request *heads[2] = {&co->running, &co->queued};
    for (int h = 0; h < 2; h++)
        for (struct co_request *r = heads[h]->next, *nx; r != heads[h]; r = nx) {
            nx = r->next;
            if (now <= r->deadline)
                continue;
            char why[160];
            snprintf(why, sizeof(why), "the request ran longer than request_timeout_ms=%lld",
                     (long long)co->cfg.request_timeout_ms);
            request_done(co, r, PP_ERR_TIMEOUT, why);
            maybe_retire(co, r);
        }
}

static void pipeline_down(struct coordinator *co, enum pp_log_level level, const char *fmt,
                          va_list ap)
{
    if (co->state == CO_DOWN || co->state == CO_STOPPING)
        return;
    vsnprintf(co->state_reason, sizeof(co->state_reason), fmt, ap);
    if (co->state == CO_SERVING) /* not a pipeline still forming: the cause Status keeps */
        snprintf(co->down_cause, sizeof(co->down_cause), "%.*s",
                 (int)sizeof(co->down_cause) - 1, co->state_reason);
    co->state = CO_DOWN;
    snprintf(co->last_failure, sizeof(co->last_failure), "%.*s", (int)sizeof(co->last_failure) - 1,
             co->state_reason);
    PP_LOG(level, "pipeline down: %s", co->state_reason);
    pp_rpc_health_set(co->health, "", PP_HEALTH_NOT_SERVING);
    pp_rpc_health_set(co->health, "ppserve.v1.Ppserve", PP_HEALTH_NOT_SERVING);
    if (co->cfg.failover_wait_ms > 0 && !co->draining) {
        co_hold_all(co);
    } else {
        char why[sizeof(co->state_reason) + 32];
        snprintf(why, sizeof(why), "pipeline down: %s", co->state_reason);
        co_fail_all(co, PP_ERR_UNAVAILABLE, why);
    }
    pthread_cond_broadcast(&co->cond);
}

void co_pipeline_down(struct coordinator *co, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pipeline_down(co, PP_LOG_ERROR, fmt, ap);
    va_end(ap);
}

void co_pipeline_retire(struct coordinator *co, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pipeline_down(co, PP_LOG_INFO, fmt, ap);
    va_end(ap);
}
