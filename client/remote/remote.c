/* Connecting to a coordinator, gRPC errors as the CLI prints them, and polling Status. */
#include "client/remote/remote.h"

#include <string.h>
#include <time.h>

struct pp_rpc_channel *pp_remote_connect(const char *cmd, const char *addr)
{
    struct pp_rpc_channel *ch = NULL;
    pp_status st = pp_rpc_channel_new(addr, &ch);
    if (st != PP_OK) {
        pp_remote_fail(cmd, st);
        return NULL;
    }
    return ch;
}

const char *pp_remote_error_text(pp_status st)
{
    const char *d = pp_error_detail();
    if (!d[0])
        return pp_strerror(st);
    /* unary calls say "/pkg.Service/Method: CODE: message"; the command already names the call */
    if (d[0] == '/') {
        const char *colon = strstr(d, ": ");
        if (colon && colon[2])
            return colon + 2;
    }
    return d;
}

int pp_remote_fail(const char *cmd, pp_status st)
{
    fprintf(stderr, "ppserve %s: error: %s\n", cmd, pp_remote_error_text(st));
    return 1;
}

pp_status pp_remote_status_get(struct pp_rpc_channel *ch, int64_t timeout_ms,
                               Ppserve__V1__StatusResponse **out)
{
    Ppserve__V1__StatusRequest req = PPSERVE__V1__STATUS_REQUEST__INIT;
    ProtobufCMessage *resp = NULL;
    pp_status st = pp_rpc_call(ch, PP_REMOTE_STATUS, &req.base,
                               &ppserve__v1__status_response__descriptor, timeout_ms, &resp, NULL);
    if (st != PP_OK)
        return st;
    *out = (Ppserve__V1__StatusResponse *)resp;
    return PP_OK;
}

int pp_remote_status_serving(const Ppserve__V1__StatusResponse *s)
{
    return s && s->state && strcmp(s->state, "serving") == 0;
}

static void sleep_seconds(double s)
{
    if (s <= 0)
        return;
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

pp_status pp_remote_wait_serving(const char *addr, double timeout_s, int64_t call_timeout_ms,
                                 pp_remote_keep_going_fn keep_going, void *ud,
                                 int stop_when_blocked, Ppserve__V1__StatusResponse **out,
                                 struct pp_remote_wait *why)
{
    double deadline = pp_clock_mono() + timeout_s;
    memset(why, 0, sizeof(*why));
    snprintf(why->reason, sizeof(why->reason), "no answer yet");
    for (;;) {
        double poll_start = pp_clock_mono();
        double left_ms = (deadline - poll_start) * 1000.0;
        int64_t t = call_timeout_ms;
        if (left_ms < (double)t)
            t = left_ms > 100.0 ? (int64_t)left_ms : 100;
        struct pp_rpc_channel *ch = NULL;
        Ppserve__V1__StatusResponse *s = NULL;
        pp_status st = pp_rpc_channel_new(addr, &ch);
        if (st != PP_OK)
            return st; /* a malformed address never gets better */
        st = pp_remote_status_get(ch, t, &s);
        pp_rpc_channel_free(ch);
        if (st == PP_OK && pp_remote_status_serving(s)) {
            *out = s;
            return PP_OK;
        }
        if (st == PP_OK) {
            why->got_response = 1;
            why->blocked = s->blocked;
            snprintf(why->reason, sizeof(why->reason), "%s", s->state && s->state[0] ? s->state
                                                                 : "(no state given)");
            protobuf_c_message_free_unpacked(&s->base, NULL);
            if (why->blocked && stop_when_blocked)
                return PP_ERR_PRECONDITION;
        } else {
            why->got_response = 0;
            snprintf(why->reason, sizeof(why->reason), "%s", pp_remote_error_text(st));
        }
        if (keep_going && !keep_going(ud)) {
            why->stopped = 1;
            return PP_ERR_IO;
        }
        double now = pp_clock_mono();
        if (now >= deadline)
            return PP_ERR_IO;
        double next = poll_start + 0.2;
        sleep_seconds((next < deadline ? next : deadline) - now);
    }
}
