/* ppserve trace: fetch a cluster's recent microbatch timeline and write it as Chrome-trace JSON
 * (open it in https://ui.perfetto.dev or chrome://tracing) to see the pipeline's bubbles. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "client/args.h"
#include "client/commands.h"
#include "client/remote/remote.h"
#include "client/remote/trace_json.h"

struct trace_opts {
    const char *addr;
    const char *out;
    int32_t max;
    int32_t timeout_ms;
    int help;
};

static int write_file(const char *path, const struct pp_buf *b)
{
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "ppserve trace: error: cannot write %s: %s\n", path, strerror(errno));
        return 1;
    }
    int bad = fwrite(b->data, 1, b->len, f) != b->len;
    bad = fclose(f) != 0 || bad;
    if (bad) {
        fprintf(stderr, "ppserve trace: error: writing %s failed: %s\n", path, strerror(errno));
        return 1;
    }
    return 0;
}

static int trace(const struct trace_opts *o, struct pp_rpc_channel *ch)
{
    Ppserve__V1__TraceRequest req = PPSERVE__V1__TRACE_REQUEST__INIT;
    req.max_microbatches = (uint32_t)o->max;
    ProtobufCMessage *m = NULL;
    pp_status st = pp_rpc_call(ch, PP_REMOTE_TRACE, &req.base,
                               &ppserve__v1__trace_response__descriptor, o->timeout_ms, &m, NULL);
    if (st != PP_OK)
        return pp_remote_fail("trace", st);
    Ppserve__V1__TraceResponse *tr = (Ppserve__V1__TraceResponse *)m;
    /* the layer ranges name the rows; without them the rows are just "stage N" */
    Ppserve__V1__StatusResponse *status = NULL;
    if (pp_remote_status_get(ch, o->timeout_ms, &status) != PP_OK)
        status = NULL;
    struct pp_buf json = {0};
    struct pp_trace_summary sum;
    int rc;
    if ((st = pp_trace_json_write(tr, status, &json, &sum)) != PP_OK)
        rc = pp_remote_fail("trace", st);
    else
        rc = write_file(o->out, &json);
    if (rc == 0)
        printf("ppserve trace: wrote %s: %zu microbatches, %d stages, %.3f s%s\n", o->out,
               sum.microbatches, sum.stages, sum.span_s,
               sum.microbatches ? " (open it in https://ui.perfetto.dev)"
                                : " (the cluster has not run any microbatch yet)");
    pp_buf_free(&json);
    if (status)
        protobuf_c_message_free_unpacked(&status->base, NULL);
    protobuf_c_message_free_unpacked(m, NULL);
    return rc;
}

int pp_cmd_trace(int argc, char **argv)
{
    struct trace_opts o = {0};
    o.timeout_ms = 2 * PP_REMOTE_CALL_TIMEOUT_MS;
    struct pp_arg args[] = {
        {"addr", PP_ARG_STRING, &o.addr, 0, 0, "the coordinator's HOST:PORT (required)"},
        {"out", PP_ARG_STRING, &o.out, 0, 0, "Chrome-trace JSON file to write (required)"},
        {"max", PP_ARG_INT, &o.max, 0, 1 << 30,
         "the most recent N microbatches (default 0 = all kept)"},
        {"timeout-ms", PP_ARG_INT, &o.timeout_ms, 1, 3600000,
         "deadline of one call (default 10000)"},
        {"help", PP_ARG_FLAG, &o.help, 0, 0, "show this help"},
    };
    int n = (int)(sizeof(args) / sizeof(args[0]));
    int rc = pp_args_parse("trace", args, n, argc, argv, NULL);
    if (rc != 0 || o.help) {
        if (o.help)
            pp_args_usage("trace", "--addr HOST:PORT --out FILE [--max N]", args, n);
        return rc;
    }
    if (!o.addr || !o.addr[0] || !o.out || !o.out[0]) {
        fprintf(stderr, "ppserve trace: %s is required\n",
                !o.addr || !o.addr[0] ? "--addr (the coordinator's HOST:PORT)" : "--out FILE");
        return 2;
    }
    struct pp_rpc_channel *ch = pp_remote_connect("trace", o.addr);
    if (!ch)
        return 1;
    rc = trace(&o, ch);
    pp_rpc_channel_free(ch);
    return rc;
}
