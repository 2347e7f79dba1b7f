/* A stage's orderly exit. A stopping stage (SIGTERM) calls Leave and calls again until it is told
 * done. While the pipeline serves, the first call starts a drain: health NOT_SERVING, new requests
 * refused with UNAVAILABLE, the accepted ones (running and queued) go on. The tick ends the drain
 * when they are all done, or when the stage's time is nearly over (the rest then wait for the next
 * pipeline, as after a failure; or fail with UNAVAILABLE without failover): the pipeline goes
 * down, the stage is marked gone and dropped by the main thread, and its next call is answered
 * done. A stage outside a serving pipeline is let go at once. Leave
 * calls count as heartbeats, so a stage that dies while it drains is still noticed. */
#include <stdio.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "coordinator/coordinator.h"

/* The drain ends this much before the stage's own deadline (a fifth of its time, at most a
 * second): the done answer waits for the stage's next call, and the stage still closes its hops. */
#define LEAVE_MARGIN_MAX_S 1.0

int co_leaving(const struct coordinator *co)
{
    if (co->state != CO_SERVING)
        return -1;
    int first = -1;
    for (int i = 0; i < co->n_stages; i++) {
        const struct co_stage *s = &co->stages[i];
        if (s->alive && s->leave_by > 0 && (first < 0 || s->leave_by < co->stages[first].leave_by))
            first = i;
    }
    return first;
}

/* A stage outside a serving pipeline goes at once (mu held): forgotten while the coordinator waits
 * for stages; otherwise marked gone, for the main thread to drop (only it changes the list
 * then). */
static void let_go(struct coordinator *co, int i, const char *reason)
{
    struct co_stage *s = &co->stages[i];
    PP_INFO("stage left index=%d address=%s reason=\"%s\"", i, s->address, reason);
    if (co->state == CO_WAITING) {
        co_stage_drop(co, i);
    } else {
        s->alive = 0;
        co->stages_gen++;
        if (co->state == CO_STARTING)
            co_pipeline_retire(co, "stage %d (%s) left (%s) while the pipeline formed", i,
                               s->address, reason);
    }
    pthread_cond_broadcast(&co->cond);
}

static void start_drain(struct coordinator *co, int i, double within_s, const char *reason)
{
    struct co_stage *s = &co->stages[i];
    double margin = within_s / 5 < LEAVE_MARGIN_MAX_S ? within_s / 5 : LEAVE_MARGIN_MAX_S;
    s->leave_by = pp_clock_mono() + within_s - margin;
    snprintf(s->leave_reason, sizeof(s->leave_reason), "%s", reason);
    pp_rpc_health_set(co->health, "", PP_HEALTH_NOT_SERVING);
    pp_rpc_health_set(co->health, "ppserve.v1.Ppserve", PP_HEALTH_NOT_SERVING);
    PP_INFO("stage leaving index=%d address=%s reason=\"%s\" within_s=%.1f running=%d queued=%d: "
            "no new requests; the pipeline finishes those it has, then goes down", i, s->address,
            s->leave_reason, within_s - margin, co->n_running, co->n_queued);
}

static pp_status on_leave(void *ud, const ProtobufCMessage *msg, struct pp_buf *resp)
{
    struct coordinator *co = ud;
    const Ppserve__V1__LeaveRequest *req = (const Ppserve__V1__LeaveRequest *)msg;
    Ppserve__V1__LeaveResponse out = PPSERVE__V1__LEAVE_RESPONSE__INIT;
    const char *reason = req->reason && req->reason[0] ? req->reason : "no reason given";
    pthread_mutex_lock(&co->mu);
    struct co_stage *s = co_stage_find(co, req->stage_id);
    if (!s || !s->alive) {
        out.done = 1; /* unknown here, or already gone: nothing will reach it */
    } else if (co->state == CO_SERVING) {
        s->last_seen = pp_clock_mono();
        if (s->leave_by == 0)
            start_drain(co, (int)(s - co->stages), (double)req->within_ms / 1000.0, reason);
    } else {
        let_go(co, (int)(s - co->stages), reason);
        out.done = 1;
    }
    pthread_mutex_unlock(&co->mu);
    return pp_rpc_pack(&out.base, resp);
}

void co_check_leaving(struct coordinator *co)
{
    int i = co_leaving(co);
    if (i < 0)
        return;
    int left = co->n_running + co->n_queued;
    if (left > 0 && pp_clock_mono() < co->stages[i].leave_by)
        return;
    /* every stage that asked goes with this pipeline, and is named */
    char who[512];
    int n = 0, gone = 0;
    for (int k = 0; k < co->n_stages; k++) {
        struct co_stage *s = &co->stages[k];
        if (s->leave_by == 0 || !s->alive)
            continue;
        if (n < (int)sizeof(who))
            n += snprintf(who + n, sizeof(who) - (size_t)n, "%s%d (%s)", gone ? ", " : "", k,
                          s->address);
        s->alive = 0;
        co->stages_gen++;
        gone++;
    }
    if (n < (int)sizeof(who))
        snprintf(who + n, sizeof(who) - (size_t)n, " left (%s)", co->stages[i].leave_reason);
    const char *stage = gone > 1 ? "stages" : "stage";
    if (left == 0)
        co_pipeline_retire(co, "%s %s after the pipeline's requests finished", stage, who);
    else
        co_pipeline_down(co, "%s %s: %s grace period ended with %d requests unfinished", stage, who,
                         gone > 1 ? "the first" : "its", left);
}

pp_status co_leave_add(struct coordinator *co)
{
    return pp_rpc_server_add_unary(co->server, "/ppserve.v1.Coordinator/Leave",
                                   &ppserve__v1__leave_request__descriptor, on_leave, co);
}
