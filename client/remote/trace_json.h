/* A cluster's pipeline timeline (a TraceResponse) as Chrome-trace JSON, the format chrome://tracing
 * and https://ui.perfetto.dev load: one row per stage with each microbatch's receive and compute,
 * and a coordinator row from "sent to stage 0" to "results delivered". A pure function of the
 * messages, so it is tested without a cluster (tests/unit/daemon/test_trace_json.c). */
#ifndef PP_TRACE_JSON_H
#define PP_TRACE_JSON_H

#include <stddef.h>

#include "common/buf.h"
#include "common/status.h"
#include "ppserve/v1/client.pb-c.h"

/* The coordinator's row: a tid no stage has (stages are 0..63), named "coordinator" and sorted
 * first. Stage rows use the stage index as tid. Everything is in pid 1. */
#define PP_TRACE_COORDINATOR_TID 1000

struct pp_trace_summary {
    size_t microbatches; /* in the trace */
    int stages;          /* stage rows written */
    size_t events;       /* complete ("X") events written */
    double span_s;       /* latest minus earliest timestamp (0 when none) */
};

/* Appends the whole JSON document to out (emptied first): {"traceEvents":[...]} with
 *   - metadata events ("ph":"M"): the process name, each row's name ("stage 0 [0,4)" when status
 *     gives its layer range, else "stage 0"; "coordinator"), and their order;
 *   - per microbatch, complete events ("ph":"X"): "mb <id>" on the coordinator row (sent →
 *     delivered), and per stage span "mb <id> recv" (recv_start → recv_end) and "mb <id> compute"
 *     (compute_start → compute_end) on the stage's row, with args n_seqs and n_tokens.
 * ts and dur are microseconds relative to the earliest timestamp of the trace; a span whose start
 * or end is 0 (not recorded, or still in flight) is left out, and an end before its start (clocks
 * of different hosts) gives dur 0. status may be NULL. sum (optional) receives the counts.
 * Returns PP_ERR_NOMEM when out could not grow, else PP_OK. */
pp_status pp_trace_json_write(const Ppserve__V1__TraceResponse *tr,
                              const Ppserve__V1__StatusResponse *status, struct pp_buf *out,
                              struct pp_trace_summary *sum);

#endif
