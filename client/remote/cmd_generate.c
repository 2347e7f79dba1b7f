/* ppserve generate: one request through a cluster's Generate stream, with the flags, defaults and
 * output of `ppserve run` (streamed text, or one --json line, and --dump-logits rows).
 *
 * Responses are handled on the gRPC completion-queue thread (one at a time); the main thread waits
 * for the end of the call and turns Ctrl-C into a cancel, so the coordinator frees the request.
 *
 * Whether the model has a tokenizer is not on the wire: a model without one sends ids and no text.
 * So text streams as it arrives, and when no response carried any text, the prompt was given as ids
 * and tokens were generated, the ids are printed instead (and "text" is null in --json). */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "client/args.h"
#include "client/sampling_args.h"
#include "client/commands.h"
#include "client/remote/remote.h"
#include "common/alloc.h"
#include "common/buf.h"
#include "common/json_write.h"
#include "model/sampler.h"

struct gen_opts {
    const char *addr;
    const char *prompt;
    struct pp_id_list prompt_ids;
    int32_t max_tokens;
    struct pp_sampling sampling;
    struct pp_str_list stops;
    const char *dump_logits;
    int32_t timeout_ms;
    int json;
    int ignore_eos;
    int help;
};

/* What the stream delivered; written by the callbacks, read by the main thread after on_end. */
struct gen_state {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int ended;
    pp_status end_status;
    char end_detail[1024];
    char bad[256]; /* a response we could not use (malformed, inconsistent logits, write error) */

    int stream_text;     /* print text as it arrives */
    int got_first;
    struct pp_buf prompt_ids; /* int32_t[] from the first response */
    struct pp_buf ids;        /* int32_t[] generated */
    struct pp_buf text;
    int saw_text;
    Ppserve__V1__FinishReason finish;
    int have_usage;
    Ppserve__V1__Usage usage;
    FILE *logits;
    size_t logits_row_bytes; /* vocab * 4, from the first row */
};

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig)
{
    (void)sig;
    interrupted = 1;
}

/* Remembers the first unusable response and ends the call. */
static void mark_bad(struct gen_state *g, struct pp_rpc_stream *st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void mark_bad(struct gen_state *g, struct pp_rpc_stream *st, const char *fmt, ...)
{
    if (!g->bad[0]) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(g->bad, sizeof(g->bad), fmt, ap);
        va_end(ap);
    }
    pp_rpc_stream_cancel(st);
}

static void write_logits(struct gen_state *g, struct pp_rpc_stream *st,
                         const Ppserve__V1__GenerateResponse *r)
{
    size_t len = r->logits.len, n = r->n_ids;
    if (n == 0 && len == 0)
        return;
    if (n == 0 || len == 0 || len % (n * sizeof(float)) != 0) {
        mark_bad(g, st, "a response with %zu ids carried %zu bytes of logits", n, len);
        return;
    }
    size_t row = len / n;
    if (g->logits_row_bytes && row != g->logits_row_bytes) {
        mark_bad(g, st, "logits rows changed size from %zu to %zu bytes", g->logits_row_bytes, row);
        return;
    }
    g->logits_row_bytes = row;
    /* the wire holds little-endian f32 rows, the layout `ppserve run --dump-logits` writes */
    if (fwrite(r->logits.data, 1, len, g->logits) != len)
        mark_bad(g, st, "writing the logits file failed: %s", strerror(errno));
}

static void on_message(void *ud, struct pp_rpc_stream *st, const uint8_t *data, size_t len)
{
    struct gen_state *g = ud;
    if (g->bad[0])
        return; /* cancelled: the rest is not used */
    ProtobufCMessage *m = NULL;
    if (pp_rpc_unpack(&ppserve__v1__generate_response__descriptor, data, len, &m) != PP_OK) {
        mark_bad(g, st, "a malformed GenerateResponse (%zu bytes)", len);
        return;
    }
    const Ppserve__V1__GenerateResponse *r = (const Ppserve__V1__GenerateResponse *)m;
    if (!g->got_first) {
        g->got_first = 1;
        pp_buf_put(&g->prompt_ids, r->prompt_ids, r->n_prompt_ids * sizeof(int32_t));
    }
    pp_buf_put(&g->ids, r->ids, r->n_ids * sizeof(int32_t));
    size_t tn = r->text ? strlen(r->text) : 0;
    if (tn > 0) {
        g->saw_text = 1;
        pp_buf_put(&g->text, r->text, tn);
        if (g->stream_text) {
            fwrite(r->text, 1, tn, stdout);
            fflush(stdout);
        }
    }
    if (g->logits)
        write_logits(g, st, r);
    if (r->finish_reason != PPSERVE__V1__FINISH_REASON__FINISH_REASON_UNSPECIFIED)
        g->finish = r->finish_reason;
    if (r->usage) {
        g->have_usage = 1;
        g->usage = *r->usage;
    }
    protobuf_c_message_free_unpacked(m, NULL);
}

static void on_end(void *ud, struct pp_rpc_stream *st, pp_status status)
{
    (void)st;
    struct gen_state *g = ud;
    pthread_mutex_lock(&g->mu);
    g->ended = 1;
    g->end_status = status;
    if (status != PP_OK)
        snprintf(g->end_detail, sizeof(g->end_detail), "%s", pp_remote_error_text(status));
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static const struct pp_rpc_stream_cbs gen_cbs = {on_message, NULL, on_end};

static const char *finish_name(Ppserve__V1__FinishReason f)
{
    return f == PPSERVE__V1__FINISH_REASON__FINISH_REASON_STOP ? "stop" : "length";
}

static void print_json(const struct gen_state *g, int has_text)
{
    const int32_t *p = (const int32_t *)g->prompt_ids.data, *ids = (const int32_t *)g->ids.data;
    size_t np = g->prompt_ids.len / sizeof(int32_t), ni = g->ids.len / sizeof(int32_t);
    struct pp_json j;
    pp_json_init(&j);
    pp_json_begin_object(&j);
    pp_json_key(&j, "prompt_ids");
    pp_json_begin_array(&j);
    for (size_t i = 0; i < np; i++)
        pp_json_int(&j, p[i]);
    pp_json_end_array(&j);
    pp_json_key(&j, "ids");
    pp_json_begin_array(&j);
    for (size_t i = 0; i < ni; i++)
        pp_json_int(&j, ids[i]);
    pp_json_end_array(&j);
    pp_json_key(&j, "text");
    if (has_text)
        pp_json_string(&j, g->text.data ? g->text.data : "", g->text.len);
    else
        pp_json_null(&j);
    pp_json_key(&j, "finish_reason");
    pp_json_cstring(&j, finish_name(g->finish));
    pp_json_key(&j, "prefill_tokens_per_s");
    pp_json_double(&j, g->usage.prefill_tokens_per_s);
    pp_json_key(&j, "decode_tokens_per_s");
    pp_json_double(&j, g->usage.decode_tokens_per_s);
    pp_json_end_object(&j);
    printf("%s\n", j.out.data && !j.out.failed ? j.out.data : "{}");
    pp_json_free(&j);
}

/* The request as the wire wants it: every "off" is a zero (client.proto). */
static void fill_request(const struct gen_opts *o, Ppserve__V1__GenerateRequest *req,
                         Ppserve__V1__Sampling *s)
{
    s->temperature = o->sampling.temperature;
    s->top_k = o->sampling.top_k;
    s->top_p = o->sampling.top_p >= 1.0f ? 0.0f : o->sampling.top_p;
    s->min_p = o->sampling.min_p;
    s->repeat_penalty = o->sampling.repeat_penalty == 1.0f ? 0.0f : o->sampling.repeat_penalty;
    s->seed = o->sampling.seed;
    req->sampling = s;
    if (o->prompt) {
        req->prompt = (char *)o->prompt;
    } else {
        req->n_prompt_ids = (size_t)o->prompt_ids.n;
        req->prompt_ids = o->prompt_ids.ids;
    }
    req->max_tokens = (uint32_t)o->max_tokens;
    req->n_stop = (size_t)o->stops.n;
    req->stop = (char **)o->stops.items;
    req->ignore_eos = o->ignore_eos;
    req->return_logits = o->dump_logits != NULL;
}

/* Waits for on_end; the first Ctrl-C cancels the call, a second one kills the process. */
static void wait_end(struct gen_state *g, struct pp_rpc_stream *st)
{
    int cancelled = 0;
    pthread_mutex_lock(&g->mu);
    while (!g->ended) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&g->cv, &g->mu, &ts);
        if (interrupted && !cancelled) {
            cancelled = 1;
            signal(SIGINT, SIG_DFL);
            pp_rpc_stream_cancel(st);
        }
    }
    pthread_mutex_unlock(&g->mu);
}

/* After the stream: the outcome, the output and the exit status. */
static int finish(const struct gen_opts *o, struct gen_state *g)
{
    size_t ni = g->ids.len / sizeof(int32_t);
    if (interrupted && g->end_status != PP_OK) {
        if (g->stream_text && g->saw_text)
            printf("\n");
        fprintf(stderr, "ppserve generate: cancelled\n");
        return 130;
    }
    if (g->bad[0]) {
        fprintf(stderr, "ppserve generate: error: %s\n", g->bad);
        return 1;
    }
    if (g->end_status != PP_OK) {
        if (g->stream_text && g->saw_text)
            printf("\n");
        fprintf(stderr, "ppserve generate: error: %s\n", g->end_detail);
        return 1;
    }
    if (g->prompt_ids.failed || g->ids.failed || g->text.failed) {
        fprintf(stderr, "ppserve generate: error: out of memory holding the results\n");
        return 1;
    }
    if (g->finish == PPSERVE__V1__FINISH_REASON__FINISH_REASON_UNSPECIFIED) {
        fprintf(stderr, "ppserve generate: error: the stream ended without a finish reason "
                "(%zu tokens received)\n", ni);
        return 1;
    }
    if (o->dump_logits && ni > 0 && g->logits_row_bytes == 0) {
        fprintf(stderr, "ppserve generate: error: the server sent no logits for %s\n",
                o->dump_logits);
        return 1;
    }
    /* a prompt given as text, or stop strings, mean the model has a tokenizer */
    int has_text = g->saw_text || o->prompt || o->stops.n > 0 || ni == 0;
    if (o->json) {
        print_json(g, has_text);
        return 0;
    }
    if (!has_text) {
        const int32_t *ids = (const int32_t *)g->ids.data;
        for (size_t i = 0; i < ni; i++)
            printf("%d ", ids[i]);
    }
    printf("\n");
    fflush(stdout);
    fprintf(stderr, "ppserve generate: %u prompt tokens at %.1f tok/s, %zu generated at %.1f "
            "tok/s, finish=%s\n", g->usage.prompt_tokens, g->usage.prefill_tokens_per_s, ni,
            g->usage.decode_tokens_per_s, finish_name(g->finish));
    return 0;
}

static int generate(const struct gen_opts *o)
{
    struct gen_state g;
    memset(&g, 0, sizeof(g));
    pthread_mutex_init(&g.mu, NULL);
    pthread_cond_init(&g.cv, NULL);
    g.stream_text = !o->json;
    int rc = 1;
    struct pp_rpc_channel *ch = NULL;
    struct pp_rpc_stream *st = NULL;
    struct pp_buf req_bytes = {0};
    struct sigaction sa, old_sa;
    int handler_set = 0;
    if (o->dump_logits && !(g.logits = fopen(o->dump_logits, "wb"))) {
        fprintf(stderr, "ppserve generate: error: cannot write %s\n", o->dump_logits);
        goto done;
    }
    if (!(ch = pp_remote_connect("generate", o->addr)))
        goto done;

    Ppserve__V1__GenerateRequest req = PPSERVE__V1__GENERATE_REQUEST__INIT;
    Ppserve__V1__Sampling sampling = PPSERVE__V1__SAMPLING__INIT;
    fill_request(o, &req, &sampling);
    pp_status s = pp_rpc_pack(&req.base, &req_bytes);
    if (s != PP_OK) {
        rc = pp_remote_fail("generate", s);
        goto done;
    }

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_sigint;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    interrupted = 0;
    handler_set = sigaction(SIGINT, &sa, &old_sa) == 0;

    if ((s = pp_rpc_stream_open(ch, PP_REMOTE_GENERATE, o->timeout_ms, &gen_cbs, &g, &st)) !=
        PP_OK) {
        rc = pp_remote_fail("generate", s);
        goto done;
    }
    /* a refused send means the call already ended: on_end says why */
    if (pp_rpc_stream_send(st, req_bytes.data, req_bytes.len) == PP_OK)
        pp_rpc_stream_close_send(st);
    wait_end(&g, st);
    rc = finish(o, &g);
done:
    if (handler_set)
        sigaction(SIGINT, &old_sa, NULL);
    pp_rpc_stream_release(st);
    pp_rpc_channel_free(ch);
    if (g.logits && fclose(g.logits) != 0 && rc == 0) {
        fprintf(stderr, "ppserve generate: error: closing %s failed\n", o->dump_logits);
        rc = 1;
    }
    pp_buf_free(&req_bytes);
    pp_buf_free(&g.prompt_ids);
    pp_buf_free(&g.ids);
    pp_buf_free(&g.text);
    pthread_cond_destroy(&g.cv);
    pthread_mutex_destroy(&g.mu);
    return rc;
}

int pp_cmd_generate(int argc, char **argv)
{
    struct gen_opts o = {0};
    o.max_tokens = 64;
    pp_sampling_defaults(&o.sampling);
    /* the sampling flags, ranges and defaults of `ppserve run` */
    struct pp_arg args[] = {
        {"addr", PP_ARG_STRING, &o.addr, 0, 0, "the coordinator's HOST:PORT (required)"},
        {"prompt", PP_ARG_STRING, &o.prompt, 0, 0, "prompt text (needs the model's tokenizer)"},
        {"prompt-ids", PP_ARG_IDS, &o.prompt_ids, 0, 0, "prompt token ids, used exactly as given"},
        {"max-tokens", PP_ARG_INT, &o.max_tokens, 0, 1 << 24,
         "tokens to generate (default 64; 0 = the coordinator's default)"},
        PP_SAMPLING_ARGS(&o.sampling, &o.stops, &o.ignore_eos),
        {"dump-logits", PP_ARG_STRING, &o.dump_logits, 0, 0,
         "write f32 logits per generated token"},
        {"json", PP_ARG_FLAG, &o.json, 0, 0, "print one JSON line instead of streaming text"},
        {"timeout-ms", PP_ARG_INT, &o.timeout_ms, 0, 86400000,
         "deadline of the whole request (default 0 = none)"},
        {"help", PP_ARG_FLAG, &o.help, 0, 0, "show this help"},
    };
    int n = (int)(sizeof(args) / sizeof(args[0]));
    int rc = pp_args_parse("generate", args, n, argc, argv, NULL);
    if (rc != 0 || o.help) {
        if (o.help)
            pp_args_usage("generate",
                          "--addr HOST:PORT (--prompt TEXT | --prompt-ids 1,2,3) [flags]", args, n);
        pp_id_list_free(&o.prompt_ids);
        return rc;
    }
    if (!o.addr || !o.addr[0] || !o.prompt == !o.prompt_ids.ids) {
        fprintf(stderr, "ppserve generate: %s\n",
                !o.addr || !o.addr[0] ? "--addr is required (the coordinator's HOST:PORT)"
                                      : "give exactly one of --prompt and --prompt-ids");
        pp_id_list_free(&o.prompt_ids);
        return 2;
    }
    rc = generate(&o);
    pp_id_list_free(&o.prompt_ids);
    return rc;
}
