/* The coordinator's configuration table. */
#include "coordinator/coordinator_config.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>


#define KEY(name, type, field, min, max, help)                                                     \
    {name, type, offsetof(struct pp_coordinator_config, field), min, max, help}

const struct pp_cfg_key pp_coordinator_config_keys[] = {
    KEY("listen", PP_CFG_STRING, listen, 0, 0, "host:port for clients and stages"),
    KEY("advertise", PP_CFG_STRING, advertise, 0, 0,
        "host:port the last stage delivers results to (\"\" = the address it registered with)"),
    KEY("model", PP_CFG_STRING, model, 0, 0, "model name under the stages' model_root (required)"),
    KEY("model_root", PP_CFG_STRING, model_root, 0, 0,
        "the coordinator's copy of the models (tokenizer, identity)"),
    KEY("stages", PP_CFG_INT, stages, 1, 64, "stages per pipeline"),
    KEY("layers", PP_CFG_INTS, layers, 1, 4096,
        "layers per stage, e.g. [2, 3, 3] (default: planned)"),
    KEY("max_batch_tokens", PP_CFG_INT, max_batch_tokens, 1, 1 << 16,
        "token budget per microbatch"),
    KEY("microbatches", PP_CFG_INT, microbatches, 0, 256,
        "microbatches in flight (0 = stages + 1; fewer than the stages idles some)"),
    KEY("queue_max", PP_CFG_INT, queue_max, 0, 1 << 20,
        "requests waiting before RESOURCE_EXHAUSTED"),
    KEY("default_max_tokens", PP_CFG_INT, default_max_tokens, 1, 1 << 20,
        "for requests that say 0"),
    KEY("request_timeout_ms", PP_CFG_INT, request_timeout_ms, 100, 86400000, "longest request"),
    KEY("stage_timeout_ms", PP_CFG_INT, stage_timeout_ms, 100, 600000,
        "silence that marks a stage dead"),
    KEY("failover_wait_ms", PP_CFG_INT, failover_wait_ms, 0, 3600000,
        "how long accepted requests wait for a failed pipeline to form again (0: they fail)"),
    KEY("grace_ms", PP_CFG_INT, grace_ms, 0, 600000, "drain time on SIGTERM"),
    KEY("log_level", PP_CFG_STRING, log_level, 0, 0, "debug | info | warn | error"),
};
const int pp_coordinator_config_n_keys =
    (int)(sizeof(pp_coordinator_config_keys) / sizeof(pp_coordinator_config_keys[0]));

void pp_coordinator_config_defaults(struct pp_coordinator_config *c)
{
    memset(c, 0, sizeof(*c));
    snprintf(c->listen, sizeof(c->listen), "0.0.0.0:7000");
    snprintf(c->log_level, sizeof(c->log_level), "info");
    snprintf(c->model_root, sizeof(c->model_root), "/models");
    c->stages = 2;
    c->max_batch_tokens = 512;
    c->queue_max = 256;
    c->default_max_tokens = 128;
    c->request_timeout_ms = 600000;
    c->stage_timeout_ms = 3000;
    c->failover_wait_ms = 30000;
    c->grace_ms = 10000;
}

pp_status pp_coordinator_config_check(const struct pp_coordinator_config *c)
{
    if (!c->model[0])
        return pp_error(PP_ERR_INVALID_ARG, "key 'model': a model name is required");
    if (c->model[0] == '/' || strstr(c->model, "..") || strchr(c->model, '\\'))
        return pp_error(PP_ERR_INVALID_ARG, "key 'model': expected a name inside the stages' "
                        "model_root (no absolute path, no '..'), got '%s'", c->model);
    if (c->layers.n != 0 && c->layers.n != c->stages)
        return pp_error(PP_ERR_INVALID_ARG, "key 'layers': expected one count per stage (%lld), "
                        "got %d", (long long)c->stages, c->layers.n);
    pp_status st;
    if (c->advertise[0] && (st = pp_config_check_address("advertise", c->advertise)) != PP_OK)
        return st;
    if ((st = pp_config_check_address("listen", c->listen)) != PP_OK ||
        (st = pp_config_check_log_level("log_level", c->log_level)) != PP_OK)
        return st;
    return PP_OK;
}
