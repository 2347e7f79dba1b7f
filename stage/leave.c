/* The orderly exit (SIGTERM, SIGINT). Before it stops taking microbatches, a stage that is part of
 * a pipeline asks the coordinator to let it leave (Leave) and goes on computing while the
 * coordinator finishes the requests it has; it asks again every LEAVE_POLL_MS until the answer is
 * done. Then main.c's shutdown runs: no new microbatches, the queue drains, the hops close in
 * order.
 * Without a coordinator (it does not answer, or does not know Leave) the stage stops at once, as
 * it did before Leave existed; the stage's grace_ms bounds the whole wait either way. */
#include <signal.h>
#include <stdio.h>
#include <time.h>

#include "common/clock.h"
#include "common/log.h"
#include "stage/stage.h"

#define LEAVE_POLL_MS 50
#define LEAVE_DEADLINE_MS 1000

static const char *const LEAVE_METHOD = "/ppserve.v1.Coordinator/Leave";

const char *pp_stage_signal_name(int sig)
{
    return sig == SIGTERM ? "SIGTERM" : "SIGINT";
}

void pp_stage_leave_loop(struct pp_stage *s, struct pp_rpc_channel *ch)
{
    pthread_mutex_lock(&s->ctl_mu);
    double deadline = s->leave_deadline;
    char reason[sizeof(s->leave_reason)];
    snprintf(reason, sizeof(reason), "%s", s->leave_reason);
    pthread_mutex_unlock(&s->ctl_mu);
    double t0 = pp_clock_mono();
    for (int calls = 1; ch; calls++) {
        double left_s = deadline - pp_clock_mono();
        Ppserve__V1__LeaveRequest req = PPSERVE__V1__LEAVE_REQUEST__INIT;
        req.stage_id = s->stage_id;
        req.within_ms = left_s > 0 ? (uint32_t)(left_s * 1000.0) : 0;
        req.reason = reason;
        ProtobufCMessage *resp = NULL;
        pp_status st = pp_rpc_call(ch, LEAVE_METHOD, &req.base,
                                   &ppserve__v1__leave_response__descriptor, LEAVE_DEADLINE_MS,
                                   &resp, NULL);
        if (st != PP_OK) {
            /* info: `ppserve cluster` stops the coordinator first, on purpose */
            PP_INFO("leave: the coordinator did not answer (%s): stopping without it",
                    pp_error_detail());
            return;
        }
        int done = ((Ppserve__V1__LeaveResponse *)resp)->done;
        protobuf_c_message_free_unpacked(resp, NULL);
        if (done) {
            PP_INFO("left: coordinator=%s seconds=%.2f calls=%d", s->cfg.coordinator,
                    pp_clock_mono() - t0, calls);
            return;
        }
        if (calls == 1)
            PP_INFO("leaving: the coordinator finishes the pipeline's requests first (at most "
                    "%.1f s)", left_s);
        if (!pp_stage_ctl_sleep(s, LEAVE_POLL_MS, 0))
            return;
    }
}

void pp_stage_leave(struct pp_stage *s, double deadline, const char *reason,
                    const sigset_t *sigs)
{
    if (!s->control_started)
        return;
    pthread_mutex_lock(&s->ctl_mu);
    s->leave_deadline = deadline;
    snprintf(s->leave_reason, sizeof(s->leave_reason), "%s", reason);
    atomic_store(&s->leaving, 1);
    pthread_cond_broadcast(&s->ctl_cv);
    while (!s->left && pp_clock_mono() < deadline) {
        double until = pp_clock_mono() + 0.1;
        pp_stage_cond_wait_until(&s->ctl_cv, &s->ctl_mu, until < deadline ? until : deadline);
        const struct timespec zero = {0, 0};
        int sig = sigtimedwait(sigs, NULL, &zero);
        if (sig > 0) {
            PP_WARN("leave: signal %s again: stopping without waiting for the pipeline",
                    pp_stage_signal_name(sig));
            break;
        }
    }
    if (!s->left && pp_clock_mono() >= deadline)
        PP_WARN("leave: grace_ms is over before the coordinator let this stage go");
    pthread_mutex_unlock(&s->ctl_mu);
}
