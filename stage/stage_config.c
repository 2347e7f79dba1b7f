/* The stage daemon's configuration table. */
#include "stage/stage_config.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "kernels/devices.h"

#define KEY(name, type, field, min, max, help)                                                     \
    {name, type, offsetof(struct pp_stage_config, field), min, max, help, NULL}
#define CHECKED(name, field, check, help)                                                          \
    {name, PP_CFG_STRING, offsetof(struct pp_stage_config, field), 0, 0, help, check}

const struct pp_cfg_key pp_stage_config_keys[] = {
    KEY("coordinator", PP_CFG_STRING, coordinator, 0, 0, "host:port of the coordinator (required)"),
    KEY("listen", PP_CFG_STRING, listen, 0, 0, "host:port to serve on"),
    KEY("advertise", PP_CFG_STRING, advertise, 0, 0, "host:port others reach this stage at"),
    KEY("model_root", PP_CFG_STRING, model_root, 0, 0, "folder models are loaded from"),
    KEY("threads", PP_CFG_INT, threads, 0, 1024,
        "compute threads, shared among the tp workers (0: one per CPU this process may use)"),
    CHECKED("devices", devices, pp_device_spec_check,
            "auto | cpu | cuda:N[,N...] (auto: the GPUs when present, else the CPU)"),
    CHECKED("cpu_weights", cpu_weights, pp_cpu_weights_check,
            "copy | map: the CPU backend copies weights into huge-page memory (faster decode) or "
            "computes from the mapped model file (no copy)"),
    KEY("tp", PP_CFG_INT, tp, 0, 64,
        "tensor-parallel workers (0 = 1, or ep when ep is set, or one per listed GPU)"),
    KEY("ep", PP_CFG_INT, ep, 0, 64, "expert groups among the workers, MoE models (0 = 1)"),
    KEY("kv_mb", PP_CFG_INT, kv_mb, 1, 1 << 24, "KV cache budget in MiB"),
    KEY("memory_mb", PP_CFG_INT, memory_mb, 0, 1 << 30,
        "memory in MiB offered to the coordinator for weights and KV (0: what this process may "
        "use, the host's or its cgroup's limit; stages sharing a host each take their share)"),
    KEY("max_batch_tokens", PP_CFG_INT, max_batch_tokens, 1, 1 << 16, "rows computed together"),
    KEY("queue_depth", PP_CFG_INT, queue_depth, 1, 1024,
        "microbatches queued before reading stops"),
    KEY("heartbeat_ms", PP_CFG_INT, heartbeat_ms, 50, 60000, "heartbeat period"),
    KEY("grace_ms", PP_CFG_INT, grace_ms, 0, 600000, "drain time on SIGTERM"),
    KEY("log_level", PP_CFG_STRING, log_level, 0, 0, "debug | info | warn | error"),
};
const int pp_stage_config_n_keys =
    (int)(sizeof(pp_stage_config_keys) / sizeof(pp_stage_config_keys[0]));

void pp_stage_config_defaults(struct pp_stage_config *c)
{
    memset(c, 0, sizeof(*c));
    snprintf(c->listen, sizeof(c->listen), "0.0.0.0:7100");
    snprintf(c->model_root, sizeof(c->model_root), "/models");
    snprintf(c->log_level, sizeof(c->log_level), "info");
    snprintf(c->devices, sizeof(c->devices), "auto");
    snprintf(c->cpu_weights, sizeof(c->cpu_weights), "copy");
    c->threads = 0; /* the CPUs this process may use (common/limits.h) */
    c->kv_mb = 1024;
    c->max_batch_tokens = 512;
    c->queue_depth = 4;
    c->heartbeat_ms = 1000;
    c->grace_ms = 10000;
}

pp_status pp_stage_config_check(const struct pp_stage_config *c)
{
    if (!c->coordinator[0])
        return pp_error(PP_ERR_INVALID_ARG, "key 'coordinator': a host:port is required");
    pp_status st;
    if ((st = pp_config_check_address("listen", c->listen)) != PP_OK ||
        (st = pp_config_check_log_level("log_level", c->log_level)) != PP_OK)
        return st;
    struct stat sb;
    if (stat(c->model_root, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return pp_error(PP_ERR_INVALID_ARG, "key 'model_root': '%s' is not a folder",
                        c->model_root);
    struct pp_device_spec dev;
    if (pp_device_spec_parse(c->devices, &dev) != PP_OK)
        return pp_error(PP_ERR_INVALID_ARG, "key 'devices': %s", pp_error_detail());
    int map;
    if (pp_cpu_weights_parse(c->cpu_weights, &map) != PP_OK)
        return pp_error(PP_ERR_INVALID_ARG, "key 'cpu_weights': %s", pp_error_detail());
    int32_t tp, ep;
    pp_stage_config_degrees(c, &tp, &ep);
    if (tp % ep != 0)
        return pp_error(PP_ERR_INVALID_ARG, "key 'ep': expected a divisor of tp (%d), got %d", tp,
                        ep);
    if (dev.kind == PP_DEVICE_CUDA && dev.n != tp)
        return pp_error(PP_ERR_INVALID_ARG, "key 'devices': '%s' lists %d GPU%s, but tp is %d: "
                        "expected one GPU per tensor-parallel worker", c->devices, dev.n,
                        dev.n == 1 ? "" : "s", tp);
    return PP_OK;
}

void pp_stage_config_degrees(const struct pp_stage_config *c, int32_t *tp, int32_t *ep)
{
    struct pp_device_spec dev;
    *ep = c->ep > 0 ? (int32_t)c->ep : 1;
    if (c->tp > 0)
        *tp = (int32_t)c->tp;
    else if (c->ep > 0)
        *tp = (int32_t)c->ep;
    else if (pp_device_spec_parse(c->devices, &dev) == PP_OK && dev.kind == PP_DEVICE_CUDA)
        *tp = dev.n; /* one worker per listed GPU */
    else
        *tp = 1;
}
