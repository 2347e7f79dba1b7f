/* Chrome-trace JSON of a TraceResponse. Written with pp_buf_printf rather than the JSON writer so
 * that times print as fixed-point microseconds ("12.345") instead of 17 significant digits. */
#include "client/remote/trace_json.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common/json_write.h"

#define MAX_STAGE_ROWS 4096 /* stage indices beyond this are not a real pipeline: no row name */

struct writer {
    struct pp_buf *b;
    int first; /* no event written yet: no comma */
    double t0;
    size_t events;
};

static void event_start(struct writer *w)
{
    pp_buf_puts(w->b, w->first ? "\n" : ",\n");
    w->first = 0;
}

static void meta(struct writer *w, const char *what, int64_t tid, const char *key, const char *s,
                 int64_t v)
{
    event_start(w);
    pp_buf_printf(w->b, "{\"name\":\"%s\",\"ph\":\"M\",\"pid\":1", what);
    if (tid != INT64_MIN)
        pp_buf_printf(w->b, ",\"tid\":%" PRId64, tid);
    pp_buf_printf(w->b, ",\"args\":{\"%s\":", key);
    if (s)
        pp_buf_json_string(w->b, s, strlen(s));
    else
        pp_buf_printf(w->b, "%" PRId64, v);
    pp_buf_puts(w->b, "}}");
}

static void complete(struct writer *w, const Ppserve__V1__MicrobatchTrace *mb, const char *what,
                     int64_t tid, double start, double end)
{
    if (start <= 0.0 || end <= 0.0)
        return; /* not recorded (yet) */
    double ts = (start - w->t0) * 1e6, dur = end > start ? (end - start) * 1e6 : 0.0;
    event_start(w);
    pp_buf_printf(w->b,
                  "{\"name\":\"mb %" PRIu64 "%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":1,"
                  "\"tid\":%" PRId64 ",\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"microbatch\":%" PRIu64
                  ",\"n_seqs\":%u,\"n_tokens\":%u}}",
                  mb->microbatch_id, what, what[0] ? what + 1 : "pipeline", tid, ts, dur,
                  mb->microbatch_id, mb->n_seqs, mb->n_tokens);
    w->events++;
}

static void widen(double t, double *lo, double *hi)
{
    if (t <= 0.0)
        return;
    *lo = t < *lo ? t : *lo;
    *hi = t > *hi ? t : *hi;
}

/* The earliest and latest recorded timestamps; 0 and 0 when there are none. */
static void time_range(const Ppserve__V1__TraceResponse *tr, double *t0, double *t1)
{
    double lo = 1e300, hi = 0.0;
    for (size_t i = 0; i < tr->n_microbatches; i++) {
        const Ppserve__V1__MicrobatchTrace *mb = tr->microbatches[i];
        widen(mb->sent, &lo, &hi);
        widen(mb->delivered, &lo, &hi);
        for (size_t k = 0; k < mb->n_spans; k++) {
            const Ppserve__V1__StageSpan *sp = mb->spans[k];
            widen(sp->recv_start, &lo, &hi);
            widen(sp->recv_end, &lo, &hi);
            widen(sp->compute_start, &lo, &hi);
            widen(sp->compute_end, &lo, &hi);
        }
    }
    *t0 = hi > 0.0 ? lo : 0.0;
    *t1 = hi;
}

/* One past the highest stage index in the trace or the status (capped at MAX_STAGE_ROWS). */
static int stage_rows(const Ppserve__V1__TraceResponse *tr, const Ppserve__V1__StatusResponse *st)
{
    uint32_t n = 0;
    for (size_t i = 0; i < tr->n_microbatches; i++)
        for (size_t k = 0; k < tr->microbatches[i]->n_spans; k++)
            if (tr->microbatches[i]->spans[k]->stage + 1 > n)
                n = tr->microbatches[i]->spans[k]->stage + 1;
    for (size_t i = 0; st && i < st->n_stages; i++)
        if (st->stages[i]->index + 1 > n)
            n = st->stages[i]->index + 1;
    return n > MAX_STAGE_ROWS ? MAX_STAGE_ROWS : (int)n;
}

static void stage_name(const Ppserve__V1__StatusResponse *st, int index, char *out, size_t cap)
{
    for (size_t i = 0; st && i < st->n_stages; i++) {
        const Ppserve__V1__StageStatus *g = st->stages[i];
        if ((int)g->index == index && g->last_layer > g->first_layer) {
            snprintf(out, cap, "stage %d [%d,%d)", index, g->first_layer, g->last_layer);
            return;
        }
    }
    snprintf(out, cap, "stage %d", index);
}

pp_status pp_trace_json_write(const Ppserve__V1__TraceResponse *tr,
                              const Ppserve__V1__StatusResponse *status, struct pp_buf *out,
                              struct pp_trace_summary *sum)
{
    double t1;
    struct writer w = {out, 1, 0.0, 0};
    out->len = 0;
    if (out->data)
        out->data[0] = '\0';
    time_range(tr, &w.t0, &t1);
    int rows = stage_rows(tr, status);

    pp_buf_puts(out, "{\"traceEvents\":[");
    meta(&w, "process_name", INT64_MIN, "name", "ppserve pipeline", 0);
    meta(&w, "thread_name", PP_TRACE_COORDINATOR_TID, "name", "coordinator", 0);
    meta(&w, "thread_sort_index", PP_TRACE_COORDINATOR_TID, "sort_index", NULL, -1);
    for (int s = 0; s < rows; s++) {
        char name[64];
        stage_name(status, s, name, sizeof(name));
        meta(&w, "thread_name", s, "name", name, 0);
        meta(&w, "thread_sort_index", s, "sort_index", NULL, s);
    }
    for (size_t i = 0; i < tr->n_microbatches; i++) {
        const Ppserve__V1__MicrobatchTrace *mb = tr->microbatches[i];
        complete(&w, mb, "", PP_TRACE_COORDINATOR_TID, mb->sent, mb->delivered);
        for (size_t k = 0; k < mb->n_spans; k++) {
            const Ppserve__V1__StageSpan *sp = mb->spans[k];
            complete(&w, mb, " recv", sp->stage, sp->recv_start, sp->recv_end);
            complete(&w, mb, " compute", sp->stage, sp->compute_start, sp->compute_end);
        }
    }
    /* where ts 0 is, for whoever wants wall-clock times back */
    pp_buf_printf(out, "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"origin_unix_s\":%.6f}}\n",
                  w.t0);
    if (sum) {
        sum->microbatches = tr->n_microbatches;
        sum->stages = rows;
        sum->events = w.events;
        sum->span_s = t1 > w.t0 ? t1 - w.t0 : 0.0;
    }
    return out->failed ? pp_error(PP_ERR_NOMEM, "trace: no memory for the JSON text") : PP_OK;
}
