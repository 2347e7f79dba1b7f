/* The pipeline's recent timeline: for each microbatch, when the coordinator sent it, when each
 * stage received and computed it (the stages append their spans as it passes), and when its
 * results came back. Kept in a ring for Trace and `ppserve trace`. */
#include <string.h>

#include "common/clock.h"
#include "coordinator/coordinator.h"

void co_trace_record(struct coordinator *co, const struct co_microbatch *mb,
                     const Ppserve__V1__Results *r)
{
    struct co_trace_entry *e = &co->trace[co->n_trace % CO_TRACE_KEEP];
    e->id = mb->id;
    e->n_seqs = (uint32_t)mb->n_parts;
    e->n_tokens = (uint32_t)mb->n_tokens;
    e->sent = mb->sent;
    e->delivered = pp_clock_real();
    e->n_spans = 0;
    for (size_t i = 0; i < r->n_spans && e->n_spans < CO_MAX_STAGES; i++) {
        Ppserve__V1__StageSpan s = PPSERVE__V1__STAGE_SPAN__INIT;
        s.stage = r->spans[i]->stage;
        s.recv_start = r->spans[i]->recv_start;
        s.recv_end = r->spans[i]->recv_end;
        s.compute_start = r->spans[i]->compute_start;
        s.compute_end = r->spans[i]->compute_end;
        e->spans[e->n_spans++] = s;
    }
    co->n_trace++;
}
