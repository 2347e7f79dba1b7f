/* ppserve.v1.Ppserve, the client API: Generate (validated here, then handed to the scheduler),
 * Tokenize, Status and Trace. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "coordinator/coordinator.h"
#include "model/sampler.h"
#include "pipeline/wire_sampling.h"

struct gen_call {
    struct coordinator *co;
    struct co_request *req; /* once the request was accepted */
    int got_request;
};

/* Everything a request needs checked before it may queue; fills req (mu NOT held: tokenizing). */
static pp_status build_request(struct coordinator *co, const Ppserve__V1__GenerateRequest *g,
                               struct co_request *req, int32_t max_context)
{
    int has_text = g->prompt && g->prompt[0];
    if (has_text == (g->n_prompt_ids > 0))
        return pp_error(PP_ERR_INVALID_ARG, "expected exactly one of prompt (text) and prompt_ids, "
                        "got %s", has_text ? "both" : "neither");
    struct pp_sampling smp;
    pp_status st = pp_sampling_from_wire(g->sampling, &smp);
    if (st != PP_OK)
        return pp_error(st, "sampling: %s", pp_error_detail());
    if (has_text && !co->tok)
        return pp_error(PP_ERR_INVALID_ARG, "prompt: this model has no tokenizer; send prompt_ids");
    if (g->n_stop > 0 && !co->tok)
        return pp_error(PP_ERR_INVALID_ARG,
                        "stop strings need a tokenizer, and this model has none");
    int32_t *ids = NULL, n = 0;
    if (has_text) {
        if ((st = pp_tokenizer_encode(co->tok, g->prompt, strlen(g->prompt),
                                      pp_tokenizer_add_bos(co->tok), &ids, &n)) != PP_OK)
            return st;
    } else {
        if (g->n_prompt_ids > (size_t)INT32_MAX / 2)
            return pp_error(PP_ERR_OUT_OF_RANGE, "prompt_ids: %zu tokens", g->n_prompt_ids);
        n = (int32_t)g->n_prompt_ids;
    }
    if (n >= max_context) {
        pp_free(PP_MEM_MISC, ids);
        return pp_error(PP_ERR_OUT_OF_RANGE, "prompt of %d tokens does not fit the context of %d "
                        "tokens (it must leave room for at least one generated token)", n,
                        max_context);
    }
    int32_t max_tokens = g->max_tokens ? (int32_t)(g->max_tokens > (uint32_t)INT32_MAX
                                                       ? INT32_MAX : g->max_tokens)
                                       : (int32_t)co->cfg.default_max_tokens;
    if (max_tokens > max_context - n)
        max_tokens = max_context - n;
    req->tokens = pp_alloc(PP_MEM_MISC, (size_t)(n + max_tokens + 1) * sizeof(int32_t));
    if (!req->tokens) {
        pp_free(PP_MEM_MISC, ids);
        return PP_ERR_NOMEM;
    }
    int32_t vocab = co->mcfg.vocab_size;
    for (int32_t i = 0; i < n; i++) {
        int32_t id = has_text ? ids[i] : g->prompt_ids[i];
        if (id < 0 || id >= vocab) {
            pp_free(PP_MEM_MISC, ids);
            return pp_error(PP_ERR_INVALID_ARG, "prompt_ids[%d]: expected a token id in [0, %d), "
                            "got %d", i, vocab, id);
        }
        req->tokens[i] = id;
    }
    pp_free(PP_MEM_MISC, ids);
    req->n_prompt = n;
    req->max_tokens = max_tokens;
    Ppserve__V1__Sampling w = PPSERVE__V1__SAMPLING__INIT;
    if (g->sampling) {
        w.temperature = g->sampling->temperature;
        w.top_k = g->sampling->top_k;
        w.top_p = g->sampling->top_p;
        w.min_p = g->sampling->min_p;
        w.repeat_penalty = g->sampling->repeat_penalty;
        w.seed = g->sampling->seed;
    }
    req->sampling = w;
    req->ignore_eos = g->ignore_eos;
    req->return_logits = g->return_logits;
    if (g->n_stop > 0) {
        if (g->n_stop > 16)
            return pp_error(PP_ERR_INVALID_ARG, "stop: expected at most 16 strings, got %zu",
                            g->n_stop);
        req->stops = pp_calloc(PP_MEM_MISC, g->n_stop, sizeof(char *));
        if (!req->stops)
            return PP_ERR_NOMEM;
        req->n_stops = (int)g->n_stop;
        for (size_t i = 0; i < g->n_stop; i++)
            if (!(req->stops[i] = pp_strdup(PP_MEM_MISC, g->stop[i])))
                return PP_ERR_NOMEM;
    }
    pp_textstream_init(&req->ts, (const char *const *)req->stops, req->n_stops);
    return PP_OK;
}

static void *gen_open(void *ud, struct pp_rpc_stream *st)
{
    (void)st;
    struct gen_call *c = pp_calloc(PP_MEM_RPC, 1, sizeof(*c));
    if (c)
        c->co = ud;
    return c;
}

static void gen_message(void *ud, struct pp_rpc_stream *st, const uint8_t *data, size_t len)
{
    struct gen_call *c = ud;
    struct coordinator *co = c->co;
    if (c->got_request)
        return; /* a server-streaming call has one request */
    c->got_request = 1;
    ProtobufCMessage *m;
    pp_status s = pp_rpc_unpack(&ppserve__v1__generate_request__descriptor, data, len, &m);
    if (s != PP_OK) {
        pp_rpc_stream_finish(st, s, pp_error_detail());
        return;
    }
    pthread_mutex_lock(&co->mu);
    enum co_state state = co->state;
    char reason[sizeof(co->state_reason)];
    snprintf(reason, sizeof(reason), "%s", co->state_reason);
    int32_t max_context = co->max_context;
    pthread_mutex_unlock(&co->mu);
    if (state != CO_SERVING) {
        protobuf_c_message_free_unpacked(m, NULL);
        pp_rpc_stream_finish(st, PP_ERR_UNAVAILABLE, reason);
        return;
    }
    struct co_request *req = pp_calloc(PP_MEM_MISC, 1, sizeof(*req));
    if (!req) {
        protobuf_c_message_free_unpacked(m, NULL);
        pp_rpc_stream_finish(st, PP_ERR_NOMEM, "out of memory");
        return;
    }
    pp_error_clear();
    s = build_request(co, (const Ppserve__V1__GenerateRequest *)m, req, max_context);
    protobuf_c_message_free_unpacked(m, NULL);
    if (s != PP_OK) {
        const char *d = pp_error_detail();
        pp_rpc_stream_finish(st, s, d[0] ? d : pp_strerror(s));
        co_request_free(req);
        return;
    }
    pthread_mutex_lock(&co->mu);
    int32_t need = (req->n_prompt + req->max_tokens + co->kv_block_tokens - 1) /
                   (co->kv_block_tokens > 0 ? co->kv_block_tokens : 1);
    int leaving = co_leaving(co);
    if (co->state != CO_SERVING || co->draining) {
        s = pp_error(PP_ERR_UNAVAILABLE, "%s", co->draining ? "the coordinator is stopping"
                                                            : co->state_reason);
    } else if (leaving >= 0) {
        s = pp_error(PP_ERR_UNAVAILABLE, "stage %d (%s) is leaving (%s): the pipeline finishes "
                     "the requests it has and takes no new ones until a stage takes its place",
                     leaving, co->stages[leaving].address, co->stages[leaving].leave_reason);
    } else if (need > co->kv_blocks_cap) {
        s = pp_error(PP_ERR_EXHAUSTED, "the request needs %d KV blocks (%d prompt + %d new "
                     "tokens); a stage holds at most %d", need, req->n_prompt, req->max_tokens,
                     co->kv_blocks_cap);
    } else if (co->n_queued >= co->cfg.queue_max) {
        s = pp_error(PP_ERR_EXHAUSTED, "the admission queue is full (%d requests waiting)",
                     co->n_queued);
    }
    if (s != PP_OK) {
        pthread_mutex_unlock(&co->mu);
        pp_rpc_stream_finish(st, s, pp_error_detail());
        co_request_free(req);
        return;
    }
    req->kv_blocks = need;
    req->client = st;
    c->req = req;
    co_request_enqueue(co, req);
    pthread_mutex_unlock(&co->mu);
}

static void gen_half_close(void *ud, struct pp_rpc_stream *st)
{
    struct gen_call *c = ud;
    if (!c->got_request) {
        c->got_request = 1;
        pp_rpc_stream_finish(st, PP_ERR_INVALID_ARG, "expected one GenerateRequest, got none");
    }
}

static void gen_end(void *ud, struct pp_rpc_stream *st, pp_status status)
{
    (void)status;
    struct gen_call *c = ud;
    struct coordinator *co = c->co;
    pthread_mutex_lock(&co->mu);
    if (c->req)
        co_request_client_gone(co, c->req); /* frees it when it is done */
    pthread_mutex_unlock(&co->mu);
    pp_free(PP_MEM_RPC, c);
    pp_rpc_stream_release(st);
}

static const struct pp_rpc_stream_cbs gen_cbs = {
    .on_message = gen_message,
    .on_half_close = gen_half_close,
    .on_end = gen_end,
};

static pp_status on_tokenize(void *ud, const ProtobufCMessage *msg, struct pp_buf *resp)
{
    struct coordinator *co = ud;
    const Ppserve__V1__TokenizeRequest *req = (const Ppserve__V1__TokenizeRequest *)msg;
    if (!co->tok)
        return pp_error(PP_ERR_PRECONDITION, "this model has no tokenizer");
    int bos = req->bos == PPSERVE__V1__BOS_MODE__BOS_MODE_ADD    ? 1
              : req->bos == PPSERVE__V1__BOS_MODE__BOS_MODE_NONE ? 0
                                                                 : pp_tokenizer_add_bos(co->tok);
    int32_t *ids;
    int32_t n;
    pp_status st = pp_tokenizer_encode(co->tok, req->text ? req->text : "",
                                       req->text ? strlen(req->text) : 0, bos, &ids, &n);
    if (st != PP_OK)
        return st;
    Ppserve__V1__TokenizeResponse out = PPSERVE__V1__TOKENIZE_RESPONSE__INIT;
    out.ids = ids;
    out.n_ids = (size_t)n;
    st = pp_rpc_pack(&out.base, resp);
    pp_free(PP_MEM_MISC, ids);
    return st;
}

static double rate(double num, double den)
{
    return den > 1e-9 ? num / den : 0.0;
}

/* Status's state (mu held): "serving", what a drain waits for, or why the pipeline is down and
 * what waits for the next one. */
static const char *describe_state(const struct coordinator *co, double now, char *buf, size_t n)
{
    int leaving = co_leaving(co);
    if (co->state == CO_SERVING && leaving >= 0) {
        const struct co_stage *s = &co->stages[leaving];
        snprintf(buf, n, "draining: stage %d (%s) is leaving (%s); %d requests running, %d queued, "
                 "at most %.1f s more", leaving, s->address, s->leave_reason, co->n_running,
                 co->n_queued, s->leave_by - now);
    } else if (co->state == CO_SERVING && co->draining) {
        snprintf(buf, n, "draining: the coordinator is stopping; %d requests running, %d queued",
                 co->n_running, co->n_queued);
    } else if (co->state == CO_SERVING) {
        return "serving";
    } else if (co->hold_until > 0 && co->n_queued > 0) {
        snprintf(buf, n, "%s; %d requests wait for the next pipeline (at most %.1f s more)",
                 co->state_reason, co->n_queued, co->hold_until > now ? co->hold_until - now : 0.0);
    } else {
        return co->state_reason;
    }
    return buf;
}

static pp_status on_status(void *ud, const ProtobufCMessage *msg, struct pp_buf *resp)
{
    (void)msg;
    struct coordinator *co = ud;
    Ppserve__V1__StatusResponse out = PPSERVE__V1__STATUS_RESPONSE__INIT;
    Ppserve__V1__StageStatus ss[CO_MAX_STAGES], *sp[CO_MAX_STAGES];
    pthread_mutex_lock(&co->mu);
    out.model = co->cfg.model;
    out.model_id = co->model_id;
    char state_text[sizeof(co->state_reason) + 96];
    double now = pp_clock_mono();
    out.state = (char *)describe_state(co, now, state_text, sizeof(state_text));
    out.blocked = co->state != CO_SERVING && co->blocked;
    out.n_stages = (size_t)co->n_stages;
    out.stages = sp;
    double busy_sum = 0;
    int worked = 0;
    for (int i = 0; i < co->n_stages; i++) {
        const struct co_stage *s = &co->stages[i];
        Ppserve__V1__StageStatus *o = &ss[i];
        ppserve__v1__stage_status__init(o);
        sp[i] = o;
        o->index = (uint32_t)i;
        o->address = (char *)s->address;
        o->first_layer = s->first;
        o->last_layer = s->last;
        o->healthy = s->alive;
        o->leaving = s->alive && s->leave_by > 0;
        o->leaving_in_s = o->leaving && s->leave_by > now ? s->leave_by - now : 0.0;
        double wall = s->now.wall - s->then.wall;
        o->busy_fraction = rate(s->now.busy - s->then.busy, wall);
        if (o->busy_fraction > 1.0)
            o->busy_fraction = 1.0;
        o->tokens_per_s = rate((double)(s->now.tokens - s->then.tokens), wall);
        o->tp = (uint32_t)s->tp;
        o->ep = (uint32_t)s->ep;
        o->bytes_reduced = s->stats.bytes_reduced;
        /* over the window; while idle, over the stage's whole run (it hardly varies) */
        o->bytes_reduced_per_token =
            s->now.tokens > s->then.tokens
                ? rate((double)(s->now.bytes_reduced - s->then.bytes_reduced),
                       (double)(s->now.tokens - s->then.tokens))
                : rate((double)s->stats.bytes_reduced, (double)s->stats.tokens);
        if (s->experts) {
            o->n_expert_load = s->experts->n_expert_load;
            o->expert_load = s->experts->expert_load;
        }
        o->queue_depth = s->stats.queue_depth;
        o->bytes_in = s->stats.bytes_in;
        o->bytes_out = s->stats.bytes_out;
        o->kv_blocks_used = s->stats.kv_blocks_used;
        /* before the first heartbeat after assignment, the capacity the stage announced */
        o->kv_blocks_total = s->stats.kv_blocks_total ? s->stats.kv_blocks_total : s->kv_blocks;
        busy_sum += o->busy_fraction;
        worked |= o->busy_fraction > 0 || s->now.tokens > s->then.tokens;
    }
    out.idle = !worked; /* with no stages too: nothing computed */
    out.bubble_fraction = co->n_stages > 0 && worked ? 1.0 - busy_sum / co->n_stages : 0.0;
    out.requests_running = (uint32_t)co->n_running;
    out.requests_queued = (uint32_t)co->n_queued;
    out.tokens_per_s = co->tokens_per_s;
    out.microbatches_in_flight = (uint32_t)co->n_in_flight;
    pp_status st = pp_rpc_pack(&out.base, resp);
    pthread_mutex_unlock(&co->mu);
    return st;
}

static pp_status on_trace(void *ud, const ProtobufCMessage *msg, struct pp_buf *resp)
{
    struct coordinator *co = ud;
    const Ppserve__V1__TraceRequest *req = (const Ppserve__V1__TraceRequest *)msg;
    pthread_mutex_lock(&co->mu);
    uint64_t kept = co->n_trace < CO_TRACE_KEEP ? co->n_trace : CO_TRACE_KEEP;
    uint64_t n =
        req->max_microbatches && req->max_microbatches < kept ? req->max_microbatches : kept;
    Ppserve__V1__MicrobatchTrace *mt = pp_calloc(PP_MEM_RPC, n ? n : 1, sizeof(*mt));
    Ppserve__V1__MicrobatchTrace **mp = pp_calloc(PP_MEM_RPC, n ? n : 1, sizeof(*mp));
    Ppserve__V1__StageSpan **spans = pp_calloc(PP_MEM_RPC, (n ? n : 1) * CO_MAX_STAGES,
                                               sizeof(*spans));
    pp_status st = PP_OK;
    if (!mt || !mp || !spans) {
        st = PP_ERR_NOMEM;
    } else {
        Ppserve__V1__TraceResponse out = PPSERVE__V1__TRACE_RESPONSE__INIT;
        for (uint64_t i = 0; i < n; i++) {
            struct co_trace_entry *e = &co->trace[(co->n_trace - n + i) % CO_TRACE_KEEP];
            ppserve__v1__microbatch_trace__init(&mt[i]);
            mp[i] = &mt[i];
            mt[i].microbatch_id = e->id;
            mt[i].n_seqs = e->n_seqs;
            mt[i].n_tokens = e->n_tokens;
            mt[i].sent = e->sent;
            mt[i].delivered = e->delivered;
            mt[i].n_spans = (size_t)e->n_spans;
            mt[i].spans = &spans[i * CO_MAX_STAGES];
            for (int k = 0; k < e->n_spans; k++)
                mt[i].spans[k] = &e->spans[k];
        }
        out.n_microbatches = (size_t)n;
        out.microbatches = mp;
        st = pp_rpc_pack(&out.base, resp);
    }
    pthread_mutex_unlock(&co->mu);
    pp_free(PP_MEM_RPC, mt);
    pp_free(PP_MEM_RPC, mp);
    pp_free(PP_MEM_RPC, spans);
    return st;
}

pp_status co_client_api_add(struct coordinator *co)
{
    pp_status st;
    if ((st = pp_rpc_server_add_stream(co->server, "/ppserve.v1.Ppserve/Generate", gen_open,
                                       &gen_cbs, co)) != PP_OK ||
        (st = pp_rpc_server_add_unary(co->server, "/ppserve.v1.Ppserve/Tokenize",
                                      &ppserve__v1__tokenize_request__descriptor, on_tokenize,
                                      co)) != PP_OK ||
        (st = pp_rpc_server_add_unary(co->server, "/ppserve.v1.Ppserve/Status",
                                      &ppserve__v1__status_request__descriptor, on_status, co)) !=
            PP_OK)
        return st;
    return pp_rpc_server_add_unary(co->server, "/ppserve.v1.Ppserve/Trace",
                                   &ppserve__v1__trace_request__descriptor, on_trace, co);
}
