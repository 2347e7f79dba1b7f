/* ppserve status: ask a coordinator how its cluster is doing. Exit 0 only when it serves, so
 * scripts can wait for a cluster with `ppserve status --addr HOST:PORT --wait 120`. */
#include <stdio.h>

#include "client/args.h"
#include "client/commands.h"
#include "client/remote/remote.h"

struct status_opts {
    const char *addr;
    int32_t wait_s;
    int32_t timeout_ms;
    int json;
    int help;
};

static void show(const struct status_opts *o, const Ppserve__V1__StatusResponse *s)
{
    if (o->json)
        pp_remote_status_print_json(stdout, s);
    else
        pp_remote_status_print(stdout, s);
}

/* One call: print what came back; exit 1 unless it serves. */
static int status_once(const struct status_opts *o)
{
    struct pp_rpc_channel *ch = pp_remote_connect("status", o->addr);
    if (!ch)
        return 1;
    Ppserve__V1__StatusResponse *s = NULL;
    pp_status st = pp_remote_status_get(ch, o->timeout_ms, &s);
    int rc;
    if (st != PP_OK) {
        rc = pp_remote_fail("status", st);
    } else {
        show(o, s);
        rc = pp_remote_status_serving(s) ? 0 : 1;
        if (rc)
            fprintf(stderr, "ppserve status: not serving: %s\n",
                    s->state && s->state[0] ? s->state : "(no state given)");
        protobuf_c_message_free_unpacked(&s->base, NULL);
    }
    pp_rpc_channel_free(ch);
    return rc;
}

static int status_wait(const struct status_opts *o)
{
    Ppserve__V1__StatusResponse *s = NULL;
    struct pp_remote_wait why;
    pp_status st = pp_remote_wait_serving(o->addr, o->wait_s, o->timeout_ms, NULL, NULL, 0, &s,
                                          &why);
    if (st == PP_ERR_INVALID_ARG)
        return pp_remote_fail("status", st);
    if (st != PP_OK) {
        fprintf(stderr, "ppserve status: error: not serving after %d s: %s\n", o->wait_s,
                why.reason);
        return 1;
    }
    show(o, s);
    protobuf_c_message_free_unpacked(&s->base, NULL);
    return 0;
}

int pp_cmd_status(int argc, char **argv)
{
    struct status_opts o = {0};
    o.timeout_ms = PP_REMOTE_CALL_TIMEOUT_MS;
    struct pp_arg args[] = {
        {"addr", PP_ARG_STRING, &o.addr, 0, 0, "the coordinator's HOST:PORT (required)"},
        {"json", PP_ARG_FLAG, &o.json, 0, 0, "print the response as one JSON object"},
        {"wait", PP_ARG_INT, &o.wait_s, 0, 86400, "poll until serving, for up to N seconds"},
        {"timeout-ms", PP_ARG_INT, &o.timeout_ms, 1, 3600000,
         "deadline of one call (default 5000)"},
        {"help", PP_ARG_FLAG, &o.help, 0, 0, "show this help"},
    };
    int n = (int)(sizeof(args) / sizeof(args[0]));
    int rc = pp_args_parse("status", args, n, argc, argv, NULL);
    if (rc != 0 || o.help) {
        if (o.help)
            pp_args_usage("status", "--addr HOST:PORT [--json] [--wait SECONDS]", args, n);
        return rc;
    }
    if (!o.addr || !o.addr[0]) {
        fprintf(stderr, "ppserve status: --addr is required (the coordinator's HOST:PORT)\n");
        return 2;
    }
    pp_rpc_init();
    rc = pp_args_seen(args, n, "wait") ? status_wait(&o) : status_once(&o);
    pp_rpc_shutdown();
    return rc;
}
